#include "latent_filter.h"

#include <string>

#include "buffer_map.h"
#include "model_glue.h"

GST_DEBUG_CATEGORY_STATIC(latent_filter_debug);
#define GST_CAT_DEFAULT latent_filter_debug

struct _GstLatentFilterPrivate {
  GstPad* sinkpad;
  GstPad* srcpad;
  latent::gst::FilterStream* stream;
};
typedef struct _GstLatentFilterPrivate GstLatentFilterPrivate;

// Registered by hand, as GstBaseTransform and GstVideoDecoder are: the instance init needs the class of the
// element being made (its pad templates), which G_DEFINE_TYPE's init does not get.
namespace {

gpointer parent_class = nullptr;
gint private_offset = 0;

void class_init(GstLatentFilterClass* k);
void instance_init(GTypeInstance* instance, gpointer g_class);

void class_init_trampoline(gpointer k, gpointer) {
  parent_class = g_type_class_peek_parent(k);
  g_type_class_adjust_private_offset(k, &private_offset);
  class_init(static_cast<GstLatentFilterClass*>(k));
}

}  // namespace

GType gst_latent_filter_get_type(void) {
  static gsize type = 0;
  if (g_once_init_enter(&type)) {
    const GType t = g_type_register_static_simple(GST_TYPE_ELEMENT, "GstLatentFilter", sizeof(GstLatentFilterClass),
                                                  class_init_trampoline, sizeof(GstLatentFilter), instance_init,
                                                  G_TYPE_FLAG_ABSTRACT);
    private_offset = g_type_add_instance_private(t, sizeof(GstLatentFilterPrivate));
    GST_DEBUG_CATEGORY_INIT(latent_filter_debug, "latentfilter", 0, "base of the latent transform elements");
    g_once_init_leave(&type, t);
  }
  return type;
}

namespace {

GstLatentFilterPrivate& priv(GstLatentFilter* self) {
  return *static_cast<GstLatentFilterPrivate*>(G_STRUCT_MEMBER_P(self, private_offset));
}

GstLatentFilterClass* klass(GstLatentFilter* self) { return GST_LATENT_FILTER_GET_CLASS(self); }

GstFlowReturn chain(GstPad*, GstObject* parent, GstBuffer* buffer) {
  auto* self = GST_LATENT_FILTER(parent);
  GstLatentFilterClass* k = klass(self);
  latent::gst::BufferPtr buf(buffer);
  if (!priv(self).stream->negotiated) {
    GST_ELEMENT_ERROR(self, CORE, NEGOTIATION, ("No caps before the first %s.", k->unit), (nullptr));
    return GST_FLOW_NOT_NEGOTIATED;
  }
  priv(self).stream->in++;
  if (GST_BUFFER_IS_DISCONT(buf.get()) && priv(self).stream->clip_begun()) {
    // A gap in the input ends the clip: what was pending is finished, the caches start afresh.
    const GstFlowReturn ret = latent::gst::drain(self);
    if (ret != GST_FLOW_OK) return ret;
  }
  GstFlowReturn ret = GST_FLOW_ERROR;
  latent::gst::guarded(GST_ELEMENT(self), k->work, [&] { ret = k->handle_buffer(self, buf.release()); });
  return ret;
}

gboolean handle_sink_event(GstLatentFilter* self, GstPad* pad, GstEvent* event) {
  GstLatentFilterClass* k = klass(self);
  latent::gst::FilterStream& s = *priv(self).stream;
  switch (GST_EVENT_TYPE(event)) {
    case GST_EVENT_CAPS: {
      GstCaps* caps;
      gst_event_parse_caps(event, &caps);
      const gboolean ok = k->set_caps(self, caps);
      if (ok) s.negotiated = true;
      gst_event_unref(event);
      return ok;
    }
    // The end of a stream or segment, or the start of another, ends the clip: what is held is finished and
    // pushed under the segment it belongs to, and the next stream starts with fresh caches. Errors are posted;
    // the event still goes on, so an EOS ends the pipeline.
    case GST_EVENT_EOS:
    case GST_EVENT_SEGMENT_DONE:
    case GST_EVENT_STREAM_START:
    case GST_EVENT_SEGMENT: latent::gst::drain(self); break;
    case GST_EVENT_FLUSH_STOP:
      s.held.flush();
      s.taken = s.done = 0;
      s.discont = true;
      k->flush(self);
      latent::gst::start_clip(self);
      break;
    default:
      if (latent::gst::waits_behind_data(event) && s.holding()) {
        GST_DEBUG_OBJECT(self, "holding %" GST_PTR_FORMAT " behind %" G_GUINT64_FORMAT " %ss", event, s.taken - s.done,
                         k->unit);
        s.held.hold(event, s.taken);
        return TRUE;
      }
      break;
  }
  k->observe_event(self, event);
  return gst_pad_event_default(pad, GST_OBJECT(self), event);
}

gboolean sink_event(GstPad* pad, GstObject* parent, GstEvent* event) {
  auto* self = GST_LATENT_FILTER(parent);
  return latent::gst::guarded_event(GST_ELEMENT(self), [&] { return handle_sink_event(self, pad, event); });
}

gboolean sink_query(GstPad*, GstObject* parent, GstQuery* query) {
  auto* self = GST_LATENT_FILTER(parent);
  return klass(self)->sink_query(self, query);
}

gboolean src_query(GstPad*, GstObject* parent, GstQuery* query) {
  auto* self = GST_LATENT_FILTER(parent);
  return klass(self)->src_query(self, query);
}

gboolean default_sink_query(GstLatentFilter* self, GstQuery* query) {
  return gst_pad_query_default(priv(self).sinkpad, GST_OBJECT(self), query);
}

gboolean default_src_query(GstLatentFilter* self, GstQuery* query) {
  GstLatentFilterPrivate& p = priv(self);
  if (GST_QUERY_TYPE(query) == GST_QUERY_LATENCY)
    return latent::gst::answer_latency_query(p.sinkpad, query,
                                             klass(self)->held_latency(self) + p.stream->compute.announced());
  return gst_pad_query_default(p.srcpad, GST_OBJECT(self), query);
}

void no_flush(GstLatentFilter*) {}
void no_observe(GstLatentFilter*, GstEvent*) {}
GstClockTime nothing_held(GstLatentFilter*) { return 0; }

GstStateChangeReturn change_state(GstElement* element, GstStateChange transition) {
  auto* self = GST_LATENT_FILTER(element);
  latent::gst::FilterStream& s = *priv(self).stream;
  if (transition == GST_STATE_CHANGE_READY_TO_PAUSED) {
    s.in = s.out = 0;
    s.stats.reset();
    s.compute.reset();
  }
  const GstStateChangeReturn ret = GST_ELEMENT_CLASS(parent_class)->change_state(element, transition);
  if (transition == GST_STATE_CHANGE_PAUSED_TO_READY) {
    // The streaming thread has stopped: the next start counts from 0.
    s.held.clear();
    s.taken = s.done = s.clip_start = 0;
    s.discont = true;
    s.negotiated = false;
  }
  return ret;
}

void finalize(GObject* object) {
  delete priv(GST_LATENT_FILTER(object)).stream;
  G_OBJECT_CLASS(parent_class)->finalize(object);
}

void class_init(GstLatentFilterClass* k) {
  G_OBJECT_CLASS(k)->finalize = finalize;
  GST_ELEMENT_CLASS(k)->change_state = change_state;
  k->unit = "buffer";
  k->work = "processing";
  k->flush = no_flush;
  k->observe_event = no_observe;
  k->held_latency = nothing_held;
  k->sink_query = default_sink_query;
  k->src_query = default_src_query;
}

void instance_init(GTypeInstance* instance, gpointer g_class) {
  auto* self = GST_LATENT_FILTER(instance);
  GstLatentFilterPrivate& p = priv(self);
  p.stream = new latent::gst::FilterStream();
  auto* k = GST_ELEMENT_CLASS(g_class);  // the subclass's, with its pad templates
  p.sinkpad = gst_pad_new_from_template(gst_element_class_get_pad_template(k, "sink"), "sink");
  gst_pad_set_chain_function(p.sinkpad, chain);
  gst_pad_set_event_function(p.sinkpad, sink_event);
  gst_pad_set_query_function(p.sinkpad, sink_query);
  gst_element_add_pad(GST_ELEMENT(self), p.sinkpad);
  p.srcpad = gst_pad_new_from_template(gst_element_class_get_pad_template(k, "src"), "src");
  gst_pad_set_query_function(p.srcpad, src_query);
  gst_element_add_pad(GST_ELEMENT(self), p.srcpad);
}

}  // namespace

namespace latent::gst {

GstPad* sink_pad(GstLatentFilter* self) { return priv(self).sinkpad; }
GstPad* src_pad(GstLatentFilter* self) { return priv(self).srcpad; }
FilterStream& filter_stream(GstLatentFilter* self) { return *priv(self).stream; }

GstFlowReturn push_output(GstLatentFilter* self, GstBuffer* buffer, uint64_t covers_end) {
  GstLatentFilterPrivate& p = priv(self);
  p.stream->held.release_before(p.srcpad, covers_end);
  if (p.stream->discont) {
    buffer = gst_buffer_make_writable(buffer);
    GST_BUFFER_FLAG_SET(buffer, GST_BUFFER_FLAG_DISCONT);
    p.stream->discont = false;
  }
  p.stream->out++;
  return gst_pad_push(p.srcpad, buffer);
}

GstFlowReturn drain(GstLatentFilter* self) {
  GstLatentFilterClass* k = klass(self);
  FilterStream& s = *priv(self).stream;
  GstFlowReturn ret = GST_FLOW_OK;
  if (s.clip_begun()) {
    const std::string doing = std::string(k->work) + " the end of the clip";
    if (!guarded(GST_ELEMENT(self), doing.c_str(), [&] { ret = k->finish(self); })) ret = GST_FLOW_ERROR;
  }
  s.done = s.taken;
  s.held.release_all(priv(self).srcpad);
  s.discont = true;
  if (!start_clip(self) && ret == GST_FLOW_OK) ret = GST_FLOW_ERROR;
  return ret;
}

bool start_clip(GstLatentFilter* self) {
  priv(self).stream->clip_start = priv(self).stream->taken;
  return klass(self)->reset(self);
}

void record_compute(GstLatentFilter* self, std::chrono::steady_clock::duration d) {
  FilterStream& s = *priv(self).stream;
  record_compute_time(GST_ELEMENT(self), s.stats, s.compute, d);
}

void install_counter_properties(GObjectClass* klass, CounterNames in, CounterNames out, bool mean_latency) {
  const auto ro = GParamFlags(G_PARAM_READABLE | G_PARAM_STATIC_STRINGS);
  g_object_class_install_property(klass, PROP_UNITS_IN,
                                  g_param_spec_uint64(in.name, in.nick, in.blurb, 0, G_MAXUINT64, 0, ro));
  g_object_class_install_property(klass, PROP_UNITS_OUT,
                                  g_param_spec_uint64(out.name, out.nick, out.blurb, 0, G_MAXUINT64, 0, ro));
  if (mean_latency)
    g_object_class_install_property(
        klass, PROP_MEAN_CHUNK_LATENCY,
        g_param_spec_uint64("mean-chunk-latency", "Mean chunk latency",
                            "Mean compute time of one model call, in nanoseconds", 0, G_MAXUINT64, 0, ro));
}

bool get_counter_property(GstLatentFilter* self, guint id, GValue* value) {
  const FilterStream& s = *priv(self).stream;
  switch (id) {
    case PROP_UNITS_IN: g_value_set_uint64(value, s.in.load()); return true;
    case PROP_UNITS_OUT: g_value_set_uint64(value, s.out.load()); return true;
    case PROP_MEAN_CHUNK_LATENCY: g_value_set_uint64(value, s.stats.mean()); return true;
    default: return false;
  }
}

}  // namespace latent::gst
