#include "vaedecode.h"

#include <gst/video/video.h>
#include <torch/types.h>

#include <atomic>
#include <chrono>
#include <deque>
#include <memory>

#include "buffer_map.h"
#include "elements.h"
#include "frame_convert.h"
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
  latent::gst::MemorySettings memory;

  std::shared_ptr<const latent::Vae> model;                // the first rank's
  std::vector<std::shared_ptr<const latent::Vae>> models;  // one per rank
  std::unique_ptr<latent::DecoderStream> decoder;          // one device's, or a patch-parallel group's
  std::optional<LatentCapsInfo> in;
  GstVideoInfo out{};
  latent::gst::VideoOutputPool pool;  // where the frames of `out` are written
  std::deque<Pending> pending;        // the base counts latents in taken (the next one's number) and done
  int64_t emitted_of_front = 0;       // frames of pending.front() already pushed
  bool warned_non_finite = false;     // a latent with NaN or infinite values was reported this stream

  // Frames held before the first comes out, as time: set by the streaming thread, read by LATENCY queries.
  std::atomic<GstClockTime> hold_time{0};
};

}  // namespace

struct _GstVaeDecode {
  GstLatentFilter parent;
  Impl* impl;
};

G_DEFINE_TYPE_WITH_CODE(GstVaeDecode, gst_vae_decode, GST_TYPE_LATENT_FILTER,
                        GST_DEBUG_CATEGORY_INIT(vae_decode_debug, "vaedecode", 0, "video VAE decoder"));
GST_ELEMENT_REGISTER_DEFINE(vaedecode, "vaedecode", GST_RANK_NONE, GST_TYPE_VAE_DECODE);

namespace {

GstClockTime frame_duration(const Impl& s) {
  if (GST_VIDEO_INFO_FPS_N(&s.out) <= 0) return GST_CLOCK_TIME_NONE;
  return gst_util_uint64_scale_int(GST_SECOND, GST_VIDEO_INFO_FPS_D(&s.out), GST_VIDEO_INFO_FPS_N(&s.out));
}

// The decoder holds up to one chunk of latents (3 for CogVideoX) before frames come out. Read from any thread.
GstClockTime held_latency(GstLatentFilter* filter) { return GST_VAE_DECODE(filter)->impl->hold_time.load(); }

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

bool negotiate_output(GstVaeDecode* self);

// Pushes decoded frames, stamping them from the latents they came from.
GstFlowReturn push_frames(GstVaeDecode* self, const torch::Tensor& frames) {
  Impl& s = *self->impl;
  auto* filter = GST_LATENT_FILTER(self);
  GstPad* srcpad = latent::gst::src_pad(filter);
  if (!frames.defined() || frames.size(0) == 0) return GST_FLOW_OK;
  // Downstream asked for new caps or a new pool (RECONFIGURE).
  if (gst_pad_check_reconfigure(srcpad) && !negotiate_output(self)) {
    gst_pad_mark_reconfigure(srcpad);
    return GST_PAD_IS_FLUSHING(srcpad) ? GST_FLOW_FLUSHING : GST_FLOW_NOT_NEGOTIATED;
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
    // Events that came in before this frame's latent go out ahead of it.
    uint64_t covers_end = 0;
    if (!s.pending.empty()) {
      covers_end = s.pending.front().index + 1;
      if (s.emitted_of_front >= s.pending.front().frames) latent::gst::filter_stream(filter).done = covers_end;
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
    GstFlowReturn ret = latent::gst::push_output(filter, buf.release(), covers_end);
    if (ret != GST_FLOW_OK) return ret;
  }
  return GST_FLOW_OK;
}

// A clip may be decoded to its end and still have begun (its first latent decodes to one frame): then there is
// nothing to finish, but the next latent must start a clip.
GstFlowReturn finish(GstLatentFilter* filter) {
  auto* self = GST_VAE_DECODE(filter);
  latent::DecoderStream& decoder = *self->impl->decoder;
  return decoder.pending_latents() > 0 ? push_frames(self, decoder.finish()) : GST_FLOW_OK;
}

// Starts a new clip. Resetting a patch-parallel group re-forms it, which can fail: false after an ERROR message.
gboolean reset_clip(GstLatentFilter* filter) {
  Impl& s = *GST_VAE_DECODE(filter)->impl;
  s.pending.clear();
  s.emitted_of_front = 0;
  return !s.decoder || latent::gst::guarded(GST_ELEMENT(filter), "starting a new clip", [&] { s.decoder->reset(); });
}

GstFlowReturn handle_buffer(GstLatentFilter* filter, GstBuffer* buffer) {
  auto* self = GST_VAE_DECODE(filter);
  Impl& s = *self->impl;
  uint64_t& taken = latent::gst::filter_stream(filter).taken;
  latent::gst::BufferPtr buf(buffer);
  latent::gst::BufferMap map(buf.get(), GST_MAP_READ);
  if (!map) {
    GST_ELEMENT_ERROR(self, STREAM, DECODE, ("Cannot read a latent buffer."), ("buffer %" GST_PTR_FORMAT, buf.get()));
    return GST_FLOW_ERROR;
  }
  // The first latent of a clip stands for 1 frame, the others for temporal-factor frames; the buffer's offsets
  // say how many of those are real (fewer at the padded end of a clip).
  torch::Tensor z = latent::gst::frame_tensor_view(*s.in, map.info()).unsqueeze(0);
  LatentFrameStamp stamp = latent::gst::read_stamp(buf.get());
  latent::gst::warn_once_if_non_finite(GST_ELEMENT(self), s.warned_non_finite, z, taken, stamp.pts,
                                       "its frames are not a picture");
  const int64_t span = s.decoder->latents_in() == 0 ? 1 : s.in->temporal_factor;
  const int64_t real = stamp.has_frame_range() ? std::min<int64_t>(int64_t(stamp.source_frames()), span) : span;
  s.pending.push_back({stamp.pts, stamp.first_frame, real, taken});
  const auto t0 = std::chrono::steady_clock::now();
  torch::Tensor frames = s.decoder->push(z, {real});  // copies z, so the latent can go back upstream
  map.release();
  buf.reset();
  taken++;
  if (frames.defined()) latent::gst::record_compute(filter, std::chrono::steady_clock::now() - t0);
  return push_frames(self, frames);
}

// Every RGB layout we write, at the size and rate the latents decode to, for downstream to pick from.
GstCaps* offered_caps(GstVaeDecode* self) {
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
  GstCaps* caps = gst_caps_make_writable(gst_pad_get_pad_template_caps(latent::gst::src_pad(GST_LATENT_FILTER(self))));
  gst_caps_set_simple(caps, "width", G_TYPE_INT, w, "height", G_TYPE_INT, h, "framerate", GST_TYPE_FRACTION, fps.num,
                      fps.den, "pixel-aspect-ratio", GST_TYPE_FRACTION, 1, 1, nullptr);
  return caps;
}

// Agrees on the output caps with downstream, sends them when they changed, and sets up the pool the frames are
// written into (ALLOCATION query). Runs when the latent caps change and when downstream asks (RECONFIGURE).
bool negotiate_output(GstVaeDecode* self) {
  Impl& s = *self->impl;
  GstPad* srcpad = latent::gst::src_pad(GST_LATENT_FILTER(self));
  gst_pad_check_reconfigure(srcpad);  // this negotiation answers a request made until now
  GstCaps* want = offered_caps(self);
  GstCaps* peer = gst_pad_peer_query_caps(srcpad, want);
  GstCaps* chosen = gst_caps_is_empty(peer) ? nullptr : gst_caps_fixate(gst_caps_ref(peer));
  gst_caps_unref(peer);
  gst_caps_unref(want);
  if (!chosen) {
    GST_ELEMENT_ERROR(self, CORE, NEGOTIATION, ("Downstream accepts none of the RGB formats vaedecode writes."),
                      ("put videoconvert after vaedecode"));
    return false;
  }
  GstCaps* current = gst_pad_get_current_caps(srcpad);
  bool ok = true;
  if (!current || !gst_caps_is_equal(current, chosen)) {
    gst_video_info_from_caps(&s.out, chosen);
    ok = gst_pad_push_event(srcpad, gst_event_new_caps(chosen));
  }
  if (current) gst_caps_unref(current);
  // New caps need a new pool; so may the same caps when downstream asks again (its pool or sink changed).
  if (ok) s.pool.negotiate(GST_ELEMENT(self), srcpad, chosen);
  gst_caps_unref(chosen);
  return ok;
}

gboolean set_latent_caps(GstLatentFilter* filter, GstCaps* caps) {
  auto* self = GST_VAE_DECODE(filter);
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
  if (s.in ? latent::gst::drain(filter) != GST_FLOW_OK : !latent::gst::start_clip(filter)) return false;
  s.in = info;
  const bool ok = negotiate_output(self);
  update_hold_time(s);
  gst_element_post_message(GST_ELEMENT(self), gst_message_new_latency(GST_OBJECT(self)));
  return ok;
}

// A wait for a free output buffer ends at FLUSH_START; the pool serves again at FLUSH_STOP.
void observe_event(GstLatentFilter* filter, GstEvent* event) {
  Impl& s = *GST_VAE_DECODE(filter)->impl;
  if (GST_EVENT_TYPE(event) == GST_EVENT_FLUSH_START) s.pool.set_flushing(true);
}

void flush(GstLatentFilter* filter) {
  Impl& s = *GST_VAE_DECODE(filter)->impl;
  s.pool.set_flushing(false);
  s.warned_non_finite = false;
}

// The latents the loaded model decodes: its model id, channels and factors (any of them before READY).
GstCaps* decodable_caps(GstVaeDecode* self) {
  GST_OBJECT_LOCK(self);
  std::shared_ptr<const latent::Vae> model = self->impl->model;
  GST_OBJECT_UNLOCK(self);
  if (!model) return gst_pad_get_pad_template_caps(latent::gst::sink_pad(GST_LATENT_FILTER(self)));
  const latent::VaeSpec& spec = model->spec();
  GstCaps* caps = gst_caps_from_string(latent::gst::latent_template_caps_string(spec.model_id).c_str());
  gst_caps_set_simple(caps, "channels", G_TYPE_INT, int(spec.latent_channels), "temporal-factor", G_TYPE_INT,
                      int(spec.temporal_factor), "spatial-factor", G_TYPE_INT, int(spec.spatial_factor), nullptr);
  return caps;
}

// A CAPS query names the loaded model, so an upstream that negotiates (videogen) sees the mismatch and says so.
// ACCEPT_CAPS still takes any latent caps of the template: latents of another model then reach set_latent_caps,
// which refuses them with a message that names both models, instead of a bare not-negotiated.
gboolean sink_query(GstLatentFilter* filter, GstQuery* query) {
  switch (GST_QUERY_TYPE(query)) {
    case GST_QUERY_CAPS: return latent::gst::answer_caps_query(query, decodable_caps(GST_VAE_DECODE(filter)));
    case GST_QUERY_ACCEPT_CAPS: return latent::gst::accept_template_caps(latent::gst::sink_pad(filter), query);
    default: return GST_LATENT_FILTER_CLASS(gst_vae_decode_parent_class)->sink_query(filter, query);
  }
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
      latent::DecoderOptions opt;
      opt.max_chunk_latents = int64_t(s.chunk_latents);
      opt.tile = s.memory.tiles();
      opt.bands = s.memory.bands();
      const latent::gst::ModelSettings settings = s.settings;
      GST_OBJECT_UNLOCK(self);
      s.decoder = latent::gst::make_decoder(element, s.models, opt, settings);
      if (!s.decoder) return GST_STATE_CHANGE_FAILURE;
      s.in.reset();
      s.warned_non_finite = false;
      s.hold_time = 0;
      if (!latent::gst::start_clip(GST_LATENT_FILTER(self))) return GST_STATE_CHANGE_FAILURE;
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
  Impl& s = *GST_VAE_DECODE(object)->impl;
  if (latent::gst::set_model_property(object, s.settings, id, value)) return;
  if (latent::gst::set_memory_property(object, s.memory, id, value)) return;
  if (id != PROP_CHUNK_LATENTS) {
    G_OBJECT_WARN_INVALID_PROPERTY_ID(object, id, pspec);
    return;
  }
  GST_OBJECT_LOCK(object);
  s.chunk_latents = g_value_get_uint(value);
  GST_OBJECT_UNLOCK(object);
}

void get_property(GObject* object, guint id, GValue* value, GParamSpec* pspec) {
  auto* self = GST_VAE_DECODE(object);
  Impl& s = *self->impl;
  if (latent::gst::get_model_property(object, s.settings, id, value)) return;
  if (latent::gst::get_memory_property(object, s.memory, id, value)) return;
  if (latent::gst::get_counter_property(GST_LATENT_FILTER(self), id, value)) return;
  if (id != PROP_CHUNK_LATENTS) {
    G_OBJECT_WARN_INVALID_PROPERTY_ID(object, id, pspec);
    return;
  }
  GST_OBJECT_LOCK(self);
  g_value_set_uint(value, s.chunk_latents);
  GST_OBJECT_UNLOCK(self);
}

void finalize(GObject* object) {
  delete GST_VAE_DECODE(object)->impl;
  G_OBJECT_CLASS(gst_vae_decode_parent_class)->finalize(object);
}

}  // namespace

static void gst_vae_decode_class_init(GstVaeDecodeClass* klass) {
  auto* gobject = G_OBJECT_CLASS(klass);
  auto* element = GST_ELEMENT_CLASS(klass);
  auto* filter = GST_LATENT_FILTER_CLASS(klass);
  gobject->set_property = set_property;
  gobject->get_property = get_property;
  gobject->finalize = finalize;
  element->change_state = change_state;
  filter->unit = "latent";
  filter->work = "decoding";
  filter->set_caps = set_latent_caps;
  filter->handle_buffer = handle_buffer;
  filter->finish = finish;
  filter->reset = reset_clip;
  filter->flush = flush;
  filter->observe_event = observe_event;
  filter->held_latency = held_latency;
  filter->sink_query = sink_query;

  latent::gst::install_model_properties(gobject, "that encoded the latents, to decode");
  latent::gst::install_parallel_properties(
      gobject,
      "gst-launch-1.0 latentfilesrc location=clip.safetensors ! vaedecode devices=cuda:0,cuda:1 ! videoconvert ! "
      "x264enc ! mp4mux ! filesink location=out.mp4");
  auto rw = GParamFlags(G_PARAM_READWRITE | G_PARAM_STATIC_STRINGS | GST_PARAM_MUTABLE_READY);
  g_object_class_install_property(
      gobject, PROP_CHUNK_LATENTS,
      g_param_spec_uint("chunk-latents", "Chunk latents",
                        "Latents per model call where the model allows batching (Wan); CogVideoX always runs its "
                        "native 2-latent chunks. 1 keeps memory lowest; more can be faster on a GPU",
                        1, 256, 1, rw));
  latent::gst::install_memory_properties(gobject);
  latent::gst::install_counter_properties(
      gobject, {"latents-in", "Latents in", "Latent frames received since READY->PAUSED"},
      {"frames-out", "Frames out", "Video frames pushed since READY->PAUSED"}, true);

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
  gst_pad_use_fixed_caps(latent::gst::src_pad(GST_LATENT_FILTER(self)));
}
