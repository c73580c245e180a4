#include "vaedecode.h"

#include <gst/video/video.h>
#include <torch/torch.h>

#include <atomic>
#include <chrono>
#include <deque>
#include <memory>

#include "buffer_map.h"
#include "elements.h"
#include "frame_convert.h"
#include "held_events.h"
#include "latent/vae/streaming.h"
#include "latent_caps.h"
#include "model_glue.h"
#include "video_pool.h"

GST_DEBUG_CATEGORY_STATIC(vae_decode_debug);
#define GST_CAT_DEFAULT vae_decode_debug

using latent::gst::Fraction;
using latent::gst::LatentCapsInfo;
using latent::gst::LatentFrameStamp;

namespace {

enum {
  PROP_CHUNK_LATENTS = latent::gst::PROP_FIRST_FREE,
  PROP_LATENTS_IN,
  PROP_FRAMES_OUT,
  PROP_MEAN_CHUNK_LATENCY,
  PROP_TILE_SIZE,
  PROP_TILE_OVERLAP,
  PROP_BAND_HEIGHT,
  PROP_MAX_MEMORY,
};

// A latent waiting for its frames: where they start and how many are real.
struct Pending {
  GstClockTime pts;
  uint64_t offset;  // source index of its first frame, GST_BUFFER_OFFSET_NONE if unknown
  int64_t frames;
  uint64_t index;  // latent number in the stream
};

struct Impl {
  latent::gst::ModelSettings settings;  // object lock
  guint chunk_latents = 1;
  guint tile_size = 0;
  double tile_overlap = 0;
  guint band_height = 0;
  gint max_memory = -1;  // MiB; -1 automatic (BandOptions::automatic)

  std::shared_ptr<const latent::Vae> model;                // the first rank's
  std::vector<std::shared_ptr<const latent::Vae>> models;  // one per rank
  std::unique_ptr<latent::DecoderStream> decoder;          // one device's, or a patch-parallel group's
  std::optional<LatentCapsInfo> in;
  GstVideoInfo out{};
  latent::gst::VideoOutputPool pool;  // where the frames of `out` are written
  std::deque<Pending> pending;
  int64_t emitted_of_front = 0;    // frames of pending.front() already pushed
  uint64_t next_latent = 0;        // stream number of the next latent in
  uint64_t done_latents = 0;       // latents of the stream whose frames have all gone out
  bool warned_non_finite = false;  // a latent with NaN or infinite values was reported this stream
  bool discont = true;
  latent::gst::HeldEvents held;  // serialized events behind latents not yet decoded

  std::atomic<guint64> frames{0}, latents{0};
  latent::gst::ChunkStats stats;
  latent::gst::LatencyBound compute;
  // Frames held before the first comes out, as time: set by the streaming thread, read by LATENCY queries.
  std::atomic<GstClockTime> hold_time{0};
};

}  // namespace

struct _GstVaeDecode {
  GstElement parent;
  GstPad* sinkpad;
  GstPad* srcpad;
  Impl* impl;
};

G_DEFINE_TYPE_WITH_CODE(GstVaeDecode, gst_vae_decode, GST_TYPE_ELEMENT,
                        GST_DEBUG_CATEGORY_INIT(vae_decode_debug, "vaedecode", 0, "video VAE decoder"));
GST_ELEMENT_REGISTER_DEFINE(vaedecode, "vaedecode", GST_RANK_NONE, GST_TYPE_VAE_DECODE);

namespace {

GstClockTime frame_duration(const Impl& s) {
  if (GST_VIDEO_INFO_FPS_N(&s.out) <= 0) return GST_CLOCK_TIME_NONE;
  return gst_util_uint64_scale_int(GST_SECOND, GST_VIDEO_INFO_FPS_D(&s.out), GST_VIDEO_INFO_FPS_N(&s.out));
}

// The decoder holds up to one chunk of latents (3 for CogVideoX) before frames come out, then computes for up to
// the compute bound. Read from any thread.
GstClockTime our_latency(const Impl& s) { return s.hold_time.load() + s.compute.announced(); }

// The streaming thread's part, once the caps are known.
void update_hold_time(Impl& s) {
  const GstClockTime frame = frame_duration(s);
  if (!s.model || !s.in || !GST_CLOCK_TIME_IS_VALID(frame)) {
    s.hold_time = 0;
    return;
  }
  const latent::ChunkRule& r = s.model->spec().decode_chunks;
  const int64_t held = std::max(r.first, r.step) - 1;
  s.hold_time = GstClockTime(held * s.in->temporal_factor) * frame;
}

// Whether latents are held whose frames have not all gone out (serialized events then wait behind them).
bool holding(const Impl& s) { return s.next_latent > s.done_latents || !s.held.empty(); }

bool negotiate_output(GstVaeDecode* self);

// Pushes decoded frames, stamping them from the latents they came from.
GstFlowReturn push_frames(GstVaeDecode* self, const torch::Tensor& frames) {
  Impl& s = *self->impl;
  if (!frames.defined() || frames.size(0) == 0) return GST_FLOW_OK;
  // Downstream asked for new caps or a new pool (RECONFIGURE).
  if (gst_pad_check_reconfigure(self->srcpad) && !negotiate_output(self)) {
    gst_pad_mark_reconfigure(self->srcpad);
    return GST_PAD_IS_FLUSHING(self->srcpad) ? GST_FLOW_FLUSHING : GST_FLOW_NOT_NEGOTIATED;
  }
  torch::Tensor rgb = latent::frames_to_rgb8(frames);
  const GstClockTime dur = frame_duration(s);
  for (int64_t i = 0; i < rgb.size(0); ++i) {
    while (!s.pending.empty() && s.emitted_of_front >= s.pending.front().frames) {
      s.pending.pop_front();
      s.emitted_of_front = 0;
    }
    GstClockTime pts = GST_CLOCK_TIME_NONE;
    if (!s.pending.empty() && GST_CLOCK_TIME_IS_VALID(s.pending.front().pts)) {
      const Pending& p = s.pending.front();
      pts = p.pts;
      if (s.emitted_of_front > 0 && GST_VIDEO_INFO_FPS_N(&s.out) > 0) {
        // Stepping by whole frames from the source index reproduces the source's rounding of each PTS.
        const uint64_t o = p.offset != GST_BUFFER_OFFSET_NONE ? p.offset : 0, k = uint64_t(s.emitted_of_front);
        const int n = GST_VIDEO_INFO_FPS_N(&s.out), d = GST_VIDEO_INFO_FPS_D(&s.out);
        pts += gst_util_uint64_scale(o + k, GST_SECOND * d, n) - gst_util_uint64_scale(o, GST_SECOND * d, n);
      }
    }
    s.emitted_of_front++;
    if (!s.pending.empty()) {
      // Events that came in before this frame's latent go out ahead of it.
      s.held.release_before(self->srcpad, s.pending.front().index + 1);
      if (s.emitted_of_front >= s.pending.front().frames) s.done_latents = s.pending.front().index + 1;
    }
    GstBuffer* acquired = nullptr;
    const GstFlowReturn got = s.pool.acquire(&acquired);
    if (got != GST_FLOW_OK) {
      if (got == GST_FLOW_ERROR)
        GST_ELEMENT_ERROR(self, RESOURCE, FAILED, ("Cannot get a buffer for an output frame."),
                          ("%" G_GSIZE_FORMAT " bytes", GST_VIDEO_INFO_SIZE(&s.out)));
      GST_DEBUG_OBJECT(self, "no output buffer: %s", gst_flow_get_name(got));
      return got;
    }
    latent::gst::BufferPtr buf(acquired);
    {
      latent::gst::VideoFrameMap frame(&s.out, buf.get(), GST_MAP_WRITE);
      if (!frame) {
        GST_ELEMENT_ERROR(self, RESOURCE, FAILED, ("Cannot map an output frame for writing."),
                          ("%" G_GSIZE_FORMAT " bytes", GST_VIDEO_INFO_SIZE(&s.out)));
        return GST_FLOW_ERROR;
      }
      latent::gst::rgb8_to_frame(rgb[i], frame.get());
    }
    GST_BUFFER_PTS(buf.get()) = pts;
    GST_BUFFER_DURATION(buf.get()) = dur;
    if (s.discont) {
      GST_BUFFER_FLAG_SET(buf.get(), GST_BUFFER_FLAG_DISCONT);
      s.discont = false;
    }
    s.frames++;
    GstFlowReturn ret = gst_pad_push(self->srcpad, buf.release());
    if (ret != GST_FLOW_OK) return ret;
  }
  return GST_FLOW_OK;
}

// Starts a new clip. Resetting a patch-parallel group re-forms it, which can fail: false after an ERROR message.
bool reset_clip(GstVaeDecode* self) {
  Impl& s = *self->impl;
  s.pending.clear();
  s.emitted_of_front = 0;
  s.done_latents = s.next_latent;
  s.discont = true;
  return !s.decoder || latent::gst::guarded(GST_ELEMENT(self), "starting a new clip", [&] { s.decoder->reset(); });
}

// Decodes what is held, lets the events held behind it go and starts a new clip.
GstFlowReturn drain(GstVaeDecode* self) {
  Impl& s = *self->impl;
  GstFlowReturn ret = GST_FLOW_OK;
  if (s.decoder && s.decoder->pending_latents() > 0 &&
      !latent::gst::guarded(GST_ELEMENT(self), "decoding the end of the clip",
                            [&] { ret = push_frames(self, s.decoder->finish()); }))
    ret = GST_FLOW_ERROR;
  s.done_latents = s.next_latent;
  s.held.release_all(self->srcpad);
  if (!reset_clip(self) && ret == GST_FLOW_OK) ret = GST_FLOW_ERROR;
  return ret;
}

GstFlowReturn chain(GstPad*, GstObject* parent, GstBuffer* buffer) {
  auto* self = GST_VAE_DECODE(parent);
  Impl& s = *self->impl;
  latent::gst::BufferPtr buf(buffer);
  if (!s.in || !s.decoder) {
    GST_ELEMENT_ERROR(self, CORE, NEGOTIATION, ("No caps before the first latent."), (nullptr));
    return GST_FLOW_NOT_NEGOTIATED;
  }
  GstFlowReturn ret = GST_FLOW_OK;
  if (GST_BUFFER_IS_DISCONT(buf.get()) && s.decoder->latents_in() > 0) {
    ret = drain(self);
    if (ret != GST_FLOW_OK) return ret;
  }
  latent::gst::BufferMap map(buf.get(), GST_MAP_READ);
  if (!map) {
    GST_ELEMENT_ERROR(self, STREAM, DECODE, ("Cannot read a latent buffer."), ("buffer %" GST_PTR_FORMAT, buf.get()));
    return GST_FLOW_ERROR;
  }
  try {
    // The first latent of a clip stands for 1 frame, the others for temporal-factor frames; the buffer's
    // offsets say how many of those are real (fewer at the padded end of a clip).
    torch::Tensor z = latent::gst::frame_tensor_view(*s.in, map.info()).unsqueeze(0);
    LatentFrameStamp stamp = latent::gst::read_stamp(buf.get());
    latent::gst::warn_once_if_non_finite(GST_ELEMENT(self), s.warned_non_finite, z, s.next_latent, stamp.pts,
                                         "its frames are not a picture");
    const int64_t span = s.decoder->latents_in() == 0 ? 1 : s.in->temporal_factor;
    const int64_t real = stamp.has_frame_range() ? std::min<int64_t>(int64_t(stamp.source_frames()), span) : span;
    s.pending.push_back({stamp.pts, stamp.first_frame, real, s.next_latent});
    auto t0 = std::chrono::steady_clock::now();
    torch::Tensor frames = s.decoder->push(z, {real});  // copies z, so the latent can go back upstream
    map.release();
    buf.reset();
    s.latents++;
    s.next_latent++;
    if (frames.defined())
      latent::gst::record_compute_time(GST_ELEMENT(self), s.stats, s.compute, std::chrono::steady_clock::now() - t0);
    ret = push_frames(self, frames);
  } catch (const std::exception& e) {
    latent::gst::post_exception(GST_ELEMENT(self), "decoding", e);
    ret = GST_FLOW_ERROR;
  } catch (...) {
    latent::gst::post_exception(GST_ELEMENT(self), "decoding", std::runtime_error("an exception of unknown type"));
    ret = GST_FLOW_ERROR;
  }
  return ret;
}

// Every RGB layout we write, at the size and rate the latents decode to, for downstream to pick from.
GstCaps* offered_caps(const GstVaeDecode* self) {
  const LatentCapsInfo& in = *self->impl->in;
  // The video size is the source's; latents of other grids decode to spatial_factor times their size.
  int w = in.video_width > 0 ? in.video_width : in.width * in.spatial_factor;
  int h = in.video_height > 0 ? in.video_height : in.height * in.spatial_factor;
  if (w != in.width * in.spatial_factor || h != in.height * in.spatial_factor) {
    w = in.width * in.spatial_factor;
    h = in.height * in.spatial_factor;
  }
  Fraction fps = in.video_framerate;
  if (fps.num == 0 && in.framerate.num > 0) fps = {in.framerate.num * in.temporal_factor, in.framerate.den};
  GstCaps* caps = gst_caps_make_writable(gst_pad_get_pad_template_caps(self->srcpad));
  gst_caps_set_simple(caps, "width", G_TYPE_INT, w, "height", G_TYPE_INT, h, "framerate", GST_TYPE_FRACTION, fps.num,
                      fps.den, "pixel-aspect-ratio", GST_TYPE_FRACTION, 1, 1, nullptr);
  return caps;
}

// Agrees on the output caps with downstream, sends them when they changed, and sets up the pool the frames are
// written into (ALLOCATION query). Runs when the latent caps change and when downstream asks (RECONFIGURE).
bool negotiate_output(GstVaeDecode* self) {
  Impl& s = *self->impl;
  gst_pad_check_reconfigure(self->srcpad);  // this negotiation answers a request made until now
  GstCaps* want = offered_caps(self);
  GstCaps* peer = gst_pad_peer_query_caps(self->srcpad, want);
  GstCaps* chosen = gst_caps_is_empty(peer) ? nullptr : gst_caps_fixate(gst_caps_ref(peer));
  gst_caps_unref(peer);
  gst_caps_unref(want);
  if (!chosen) {
    GST_ELEMENT_ERROR(self, CORE, NEGOTIATION, ("Downstream accepts none of the RGB formats vaedecode writes."),
                      ("put videoconvert after vaedecode"));
    return false;
  }
  GstCaps* current = gst_pad_get_current_caps(self->srcpad);
  bool ok = true;
  if (!current || !gst_caps_is_equal(current, chosen)) {
    gst_video_info_from_caps(&s.out, chosen);
    ok = gst_pad_push_event(self->srcpad, gst_event_new_caps(chosen));
  }
  if (current) gst_caps_unref(current);
  // New caps need a new pool; so may the same caps when downstream asks again (its pool or sink changed).
  if (ok) s.pool.negotiate(GST_ELEMENT(self), self->srcpad, chosen);
  gst_caps_unref(chosen);
  return ok;
}

bool set_latent_caps(GstVaeDecode* self, GstCaps* caps) {
  Impl& s = *self->impl;
  std::string why;
  auto info = LatentCapsInfo::from_caps(caps, &why);
  if (!info) {
    GST_ELEMENT_ERROR(self, CORE, NEGOTIATION, ("Invalid latent caps: %s", why.c_str()), ("%" GST_PTR_FORMAT, caps));
    return false;
  }
  // Upstream may send its caps again unchanged; only a real change may end the clip and reset the caches.
  if (s.in && *s.in == *info) {
    GST_DEBUG_OBJECT(self, "caps unchanged: %" GST_PTR_FORMAT, caps);
    return true;
  }
  const latent::VaeSpec& spec = s.model->spec();
  // A latent stream is tied to its model like a bitstream to its codec.
  if (info->model != spec.model_id || info->channels != spec.latent_channels ||
      info->spatial_factor != spec.spatial_factor || info->temporal_factor != spec.temporal_factor) {
    GST_ELEMENT_ERROR(
        self, CORE, NEGOTIATION,
        ("Latents of model '%s' (%d channels, %dx spatial, %dx temporal) cannot be decoded by model "
         "'%s' (%lld channels, %lldx, %lldx).",
         info->model.c_str(), info->channels, info->spatial_factor, info->temporal_factor, spec.model_id.c_str(),
         (long long)spec.latent_channels, (long long)spec.spatial_factor, (long long)spec.temporal_factor),
        ("set vaedecode's model to the model that encoded the stream"));
    return false;
  }
  if (!latent::gst::check_rows_for_ranks(GST_ELEMENT(self), *s.model, int64_t(info->height) * spec.spatial_factor,
                                         s.models.size()))
    return false;
  if (s.in && drain(self) != GST_FLOW_OK) return false;
  if (!reset_clip(self)) return false;
  s.in = info;
  const bool ok = negotiate_output(self);
  update_hold_time(s);
  gst_element_post_message(GST_ELEMENT(self), gst_message_new_latency(GST_OBJECT(self)));
  return ok;
}

gboolean handle_sink_event(GstVaeDecode* self, GstPad* pad, GstEvent* event) {
  Impl& s = *self->impl;
  switch (GST_EVENT_TYPE(event)) {
    case GST_EVENT_CAPS: {
      GstCaps* caps;
      gst_event_parse_caps(event, &caps);
      bool ok = set_latent_caps(self, caps);
      gst_event_unref(event);
      return ok;
    }
    // As in vaeencode: the held latents are decoded under the segment they belong to before the stream or
    // segment changes, and the next stream starts with fresh caches. Errors are posted; the event goes on.
    case GST_EVENT_EOS:
    case GST_EVENT_SEGMENT_DONE:
    case GST_EVENT_STREAM_START:
    case GST_EVENT_SEGMENT: drain(self); break;
    case GST_EVENT_FLUSH_START: s.pool.set_flushing(true); break;  // a wait for a free buffer ends
    case GST_EVENT_FLUSH_STOP:
      s.pool.set_flushing(false);
      s.held.flush();
      s.next_latent = 0;
      s.warned_non_finite = false;
      reset_clip(self);
      break;
    default:
      if (latent::gst::waits_behind_data(event) && holding(s)) {
        GST_DEBUG_OBJECT(self, "holding %" GST_PTR_FORMAT " behind %" G_GUINT64_FORMAT " latents", event,
                         s.next_latent - s.done_latents);
        s.held.hold(event, s.next_latent);
        return TRUE;
      }
      break;
  }
  return gst_pad_event_default(pad, GST_OBJECT(self), event);
}

gboolean sink_event(GstPad* pad, GstObject* parent, GstEvent* event) {
  auto* self = GST_VAE_DECODE(parent);
  return latent::gst::guarded_event(GST_ELEMENT(self), [&] { return handle_sink_event(self, pad, event); });
}

// The latents the loaded model decodes: its model id, channels and factors (any of them before READY).
GstCaps* decodable_caps(GstVaeDecode* self) {
  GST_OBJECT_LOCK(self);
  std::shared_ptr<const latent::Vae> model = self->impl->model;
  GST_OBJECT_UNLOCK(self);
  if (!model) return gst_pad_get_pad_template_caps(self->sinkpad);
  const latent::VaeSpec& spec = model->spec();
  GstCaps* caps = gst_caps_from_string(latent::gst::latent_template_caps_string(spec.model_id).c_str());
  gst_caps_set_simple(caps, "channels", G_TYPE_INT, int(spec.latent_channels), "temporal-factor", G_TYPE_INT,
                      int(spec.temporal_factor), "spatial-factor", G_TYPE_INT, int(spec.spatial_factor), nullptr);
  return caps;
}

// A CAPS query names the loaded model, so an upstream that negotiates (videogen) sees the mismatch and says so.
// ACCEPT_CAPS still takes any latent caps of the template: latents of another model then reach set_latent_caps,
// which refuses them with a message that names both models, instead of a bare not-negotiated.
gboolean sink_query(GstPad* pad, GstObject* parent, GstQuery* query) {
  auto* self = GST_VAE_DECODE(parent);
  switch (GST_QUERY_TYPE(query)) {
    case GST_QUERY_CAPS: return latent::gst::answer_caps_query(query, decodable_caps(self));
    case GST_QUERY_ACCEPT_CAPS: return latent::gst::accept_template_caps(pad, query);
    default: return gst_pad_query_default(pad, parent, query);
  }
}

gboolean src_query(GstPad* pad, GstObject* parent, GstQuery* query) {
  auto* self = GST_VAE_DECODE(parent);
  if (GST_QUERY_TYPE(query) == GST_QUERY_LATENCY)
    return latent::gst::answer_latency_query(self->sinkpad, query, our_latency(*self->impl));
  return gst_pad_query_default(pad, parent, query);
}

GstStateChangeReturn change_state(GstElement* element, GstStateChange transition) {
  auto* self = GST_VAE_DECODE(element);
  Impl& s = *self->impl;
  switch (transition) {
    case GST_STATE_CHANGE_NULL_TO_READY:
      s.models = latent::gst::acquire_models_locked(element, s.settings);
      if (s.models.empty()) return GST_STATE_CHANGE_FAILURE;
      GST_OBJECT_LOCK(self);  // caps queries read it from other threads
      s.model = s.models[0];
      GST_OBJECT_UNLOCK(self);
      break;
    case GST_STATE_CHANGE_READY_TO_PAUSED: {
      GST_OBJECT_LOCK(self);
      latent::DecoderOptions opt{int64_t(s.chunk_latents)};
      opt.tile = latent::gst::tile_options(s.tile_size, s.tile_overlap);
      opt.bands = latent::gst::band_options(s.band_height, s.max_memory);
      const latent::gst::ModelSettings settings = s.settings;
      GST_OBJECT_UNLOCK(self);
      s.decoder = latent::gst::make_decoder(element, s.models, opt, settings);
      if (!s.decoder) return GST_STATE_CHANGE_FAILURE;
      s.in.reset();
      s.frames = s.latents = 0;
      s.next_latent = s.done_latents = 0;
      s.warned_non_finite = false;
      s.stats.reset();
      s.compute.reset();
      s.hold_time = 0;
      if (!reset_clip(self)) return GST_STATE_CHANGE_FAILURE;
      break;
    }
    case GST_STATE_CHANGE_PAUSED_TO_READY:
      // A streaming thread waiting for a free buffer must return before the pads can be deactivated.
      s.pool.set_flushing(true);
      break;
    default: break;
  }
  GstStateChangeReturn ret = GST_ELEMENT_CLASS(gst_vae_decode_parent_class)->change_state(element, transition);
  switch (transition) {
    case GST_STATE_CHANGE_PAUSED_TO_READY:
      s.pool.stop();
      s.decoder.reset();
      s.pending.clear();
      s.held.clear();
      s.in.reset();
      break;
    case GST_STATE_CHANGE_READY_TO_NULL:
      GST_OBJECT_LOCK(self);
      s.model.reset();
      GST_OBJECT_UNLOCK(self);
      s.models.clear();
      break;
    default: break;
  }
  return ret;
}

void set_property(GObject* object, guint id, const GValue* value, GParamSpec* pspec) {
  auto* self = GST_VAE_DECODE(object);
  Impl& s = *self->impl;
  if (latent::gst::set_model_property(object, s.settings, id, value)) return;
  GST_OBJECT_LOCK(self);
  if (id == PROP_CHUNK_LATENTS) {
    s.chunk_latents = g_value_get_uint(value);
  } else if (id == PROP_TILE_SIZE) {
    s.tile_size = g_value_get_uint(value);
  } else if (id == PROP_TILE_OVERLAP) {
    s.tile_overlap = g_value_get_double(value);
  } else if (id == PROP_BAND_HEIGHT) {
    s.band_height = g_value_get_uint(value);
  } else if (id == PROP_MAX_MEMORY) {
    s.max_memory = g_value_get_int(value);
  } else {
    G_OBJECT_WARN_INVALID_PROPERTY_ID(object, id, pspec);
  }
  GST_OBJECT_UNLOCK(self);
}

void get_property(GObject* object, guint id, GValue* value, GParamSpec* pspec) {
  auto* self = GST_VAE_DECODE(object);
  Impl& s = *self->impl;
  if (latent::gst::get_model_property(object, s.settings, id, value)) return;
  switch (id) {
    case PROP_CHUNK_LATENTS:
    case PROP_TILE_SIZE:
    case PROP_TILE_OVERLAP:
    case PROP_BAND_HEIGHT:
    case PROP_MAX_MEMORY: {
      GST_OBJECT_LOCK(self);
      if (id == PROP_CHUNK_LATENTS) g_value_set_uint(value, s.chunk_latents);
      if (id == PROP_TILE_SIZE) g_value_set_uint(value, s.tile_size);
      if (id == PROP_TILE_OVERLAP) g_value_set_double(value, s.tile_overlap);
      if (id == PROP_BAND_HEIGHT) g_value_set_uint(value, s.band_height);
      if (id == PROP_MAX_MEMORY) g_value_set_int(value, s.max_memory);
      GST_OBJECT_UNLOCK(self);
      break;
    }
    case PROP_FRAMES_OUT: g_value_set_uint64(value, s.frames.load()); break;
    case PROP_LATENTS_IN: g_value_set_uint64(value, s.latents.load()); break;
    case PROP_MEAN_CHUNK_LATENCY: g_value_set_uint64(value, s.stats.mean()); break;
    default: G_OBJECT_WARN_INVALID_PROPERTY_ID(object, id, pspec);
  }
}

void finalize(GObject* object) {
  delete GST_VAE_DECODE(object)->impl;
  G_OBJECT_CLASS(gst_vae_decode_parent_class)->finalize(object);
}

}  // namespace

static void gst_vae_decode_class_init(GstVaeDecodeClass* klass) {
  auto* gobject = G_OBJECT_CLASS(klass);
  auto* element = GST_ELEMENT_CLASS(klass);
  gobject->set_property = set_property;
  gobject->get_property = get_property;
  gobject->finalize = finalize;
  element->change_state = change_state;

  latent::gst::install_model_properties(gobject, "that encoded the latents, to decode");
  latent::gst::install_parallel_properties(
      gobject,
      "gst-launch-1.0 latentfilesrc location=clip.safetensors ! vaedecode devices=cuda:0,cuda:1 ! videoconvert ! "
      "x264enc ! mp4mux ! filesink location=out.mp4");
  auto rw = GParamFlags(G_PARAM_READWRITE | G_PARAM_STATIC_STRINGS | GST_PARAM_MUTABLE_READY);
  auto ro = GParamFlags(G_PARAM_READABLE | G_PARAM_STATIC_STRINGS);
  g_object_class_install_property(
      gobject, PROP_CHUNK_LATENTS,
      g_param_spec_uint("chunk-latents", "Chunk latents",
                        "Latents per model call where the model allows batching (Wan); CogVideoX always runs its "
                        "native 2-latent chunks. 1 keeps memory lowest; more can be faster on a GPU",
                        1, 256, 1, rw));
  latent::gst::install_tile_properties(gobject, PROP_TILE_SIZE, PROP_TILE_OVERLAP, rw);
  latent::gst::install_band_properties(gobject, PROP_BAND_HEIGHT, PROP_MAX_MEMORY, rw);
  g_object_class_install_property(
      gobject, PROP_LATENTS_IN,
      g_param_spec_uint64("latents-in", "Latents in", "Latent frames received since READY->PAUSED", 0, G_MAXUINT64, 0,
                          ro));
  g_object_class_install_property(
      gobject, PROP_FRAMES_OUT,
      g_param_spec_uint64("frames-out", "Frames out", "Video frames pushed since READY->PAUSED", 0, G_MAXUINT64, 0,
                          ro));
  g_object_class_install_property(
      gobject, PROP_MEAN_CHUNK_LATENCY,
      g_param_spec_uint64("mean-chunk-latency", "Mean chunk latency",
                          "Mean compute time of one model call, in nanoseconds", 0, G_MAXUINT64, 0, ro));

  gst_element_class_set_static_metadata(
      element, "Video VAE decoder", "Filter/Converter/Video",
      "Decodes the latent frames of a causal video VAE (Wan 2.1, CogVideoX) back into raw RGB video as they arrive, "
      "with carried temporal caches; frames get their source timestamps back and the padded tail of a clip is "
      "trimmed, so frames in == frames out through vaeencode ! vaedecode. Latents of another model are refused at "
      "negotiation. Example: gst-launch-1.0 latentfilesrc location=clip.safetensors ! vaedecode "
      "model=/models/Wan2.1-VAE ! videoconvert ! autovideosink",
      "gst-latent");
  std::string sink_caps = latent::gst::latent_template_caps_string();
  GstCaps* sink = gst_caps_from_string(sink_caps.c_str());
  gst_element_class_add_pad_template(element, gst_pad_template_new("sink", GST_PAD_SINK, GST_PAD_ALWAYS, sink));
  gst_caps_unref(sink);
  std::string src_caps = std::string("video/x-raw, format=(string)") + latent::gst::kDecoderFormats +
                         ", width=(int)[ 1, 2147483647 ], height=(int)[ 1, 2147483647 ], "
                         "framerate=(fraction)[ 0/1, 2147483647/1 ]";
  GstCaps* src = gst_caps_from_string(src_caps.c_str());
  gst_element_class_add_pad_template(element, gst_pad_template_new("src", GST_PAD_SRC, GST_PAD_ALWAYS, src));
  gst_caps_unref(src);
}

static void gst_vae_decode_init(GstVaeDecode* self) {
  self->impl = new Impl();
  auto* klass = GST_ELEMENT_GET_CLASS(self);
  self->sinkpad = gst_pad_new_from_template(gst_element_class_get_pad_template(klass, "sink"), "sink");
  gst_pad_set_chain_function(self->sinkpad, chain);
  gst_pad_set_event_function(self->sinkpad, sink_event);
  gst_pad_set_query_function(self->sinkpad, sink_query);
  gst_element_add_pad(GST_ELEMENT(self), self->sinkpad);
  self->srcpad = gst_pad_new_from_template(gst_element_class_get_pad_template(klass, "src"), "src");
  gst_pad_set_query_function(self->srcpad, src_query);
  gst_pad_use_fixed_caps(self->srcpad);
  gst_element_add_pad(GST_ELEMENT(self), self->srcpad);
}
