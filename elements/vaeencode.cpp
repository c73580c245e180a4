#include "vaeencode.h"

#include <gst/video/video.h>
#include <torch/types.h>

#include <atomic>
#include <chrono>
#include <deque>
#include <memory>
#include <optional>

#include "buffer_map.h"
#include "elements.h"
#include "frame_convert.h"
#include "latent/vae/streaming.h"
#include "latent_caps.h"
#include "model_glue.h"

GST_DEBUG_CATEGORY_STATIC(vae_encode_debug);
#define GST_CAT_DEFAULT vae_encode_debug

using latent::gst::LatentCapsInfo;
using latent::gst::LatentFrameStamp;

namespace {

enum {
  PROP_SAMPLE = latent::gst::PROP_FIRST_FREE,
  PROP_SEED,
  PROP_CHUNK_FRAMES,
};

struct FrameTime {
  GstClockTime pts, duration;
};

struct Impl {
  // Settings, under the object lock.
  latent::gst::ModelSettings settings;
  bool sample = false;
  guint64 seed = 0;
  guint chunk_frames = 8;
  latent::gst::MemorySettings memory;

  // READY and up.
  std::shared_ptr<const latent::Vae> model;                // the first rank's
  std::vector<std::shared_ptr<const latent::Vae>> models;  // one per rank
  // Streaming thread (and state changes, which never overlap it).
  std::unique_ptr<latent::EncoderStream> encoder;  // one device's, or a patch-parallel group's
  GstVideoInfo video{};
  bool have_video = false;
  std::deque<FrameTime> times;  // frames not yet covered by a pushed latent, from clip frame `times_first`
  int64_t times_first = 0;

  // Frames held before a latent can go out, as time: set by the streaming thread, read by LATENCY queries.
  std::atomic<GstClockTime> hold_time{0};
  // The loaded model's size rule (16 for wan2.2), read by CAPS queries from any thread.
  std::atomic<int> size_multiple{8};
};

}  // namespace

struct _GstVaeEncode {
  GstLatentFilter parent;
  Impl* impl;
};

G_DEFINE_TYPE_WITH_CODE(GstVaeEncode, gst_vae_encode, GST_TYPE_LATENT_FILTER,
                        GST_DEBUG_CATEGORY_INIT(vae_encode_debug, "vaeencode", 0, "video VAE encoder"));
GST_ELEMENT_REGISTER_DEFINE(vaeencode, "vaeencode", GST_RANK_NONE, GST_TYPE_VAE_ENCODE);

namespace {

std::string sink_caps_string(int step = 8) {
  // Sizes step by the model's multiple so videoscale can meet its constraint during negotiation.
  const std::string range = "(int)[ " + std::to_string(step) + ", 16384, " + std::to_string(step) + " ]";
  return std::string("video/x-raw, format=(string)") + latent::gst::kEncoderFormats + ", width=" + range +
         ", height=" + range + ", framerate=(fraction)[ 0/1, 2147483647/1 ]";
}

GstClockTime frame_duration(const Impl& s) {
  if (!s.have_video || GST_VIDEO_INFO_FPS_N(&s.video) <= 0) return GST_CLOCK_TIME_NONE;
  return gst_util_uint64_scale_int(GST_SECOND, GST_VIDEO_INFO_FPS_D(&s.video), GST_VIDEO_INFO_FPS_N(&s.video));
}

// Frames held back before a latent can be emitted. Read from any thread.
GstClockTime held_latency(GstLatentFilter* filter) { return GST_VAE_ENCODE(filter)->impl->hold_time.load(); }

// The streaming thread's part: what the caps and the encoder make the hold time.
void update_hold_time(Impl& s) {
  const GstClockTime frame = frame_duration(s);
  s.hold_time = s.encoder && GST_CLOCK_TIME_IS_VALID(frame) ? GstClockTime(s.encoder->max_delay_frames()) * frame : 0;
}

GstFlowReturn push_latents(GstVaeEncode* self, const latent::EncodedLatents& out) {
  Impl& s = *self->impl;
  auto* filter = GST_LATENT_FILTER(self);
  if (out.size() == 0) return GST_FLOW_OK;
  torch::Tensor cpu = out.latents.to(torch::kCPU).contiguous();
  for (int64_t i = 0; i < out.size(); ++i) {
    const int64_t first = out.first_frame[size_t(i)], real = out.real_frames[size_t(i)];
    LatentFrameStamp stamp;
    stamp.first_frame = latent::gst::filter_stream(filter).clip_start + uint64_t(first);
    stamp.end_frame = stamp.first_frame + uint64_t(real);
    const int64_t k = first - s.times_first;
    if (real > 0 && k >= 0 && k + real <= int64_t(s.times.size())) {
      const FrameTime& a = s.times[size_t(k)];
      const FrameTime& b = s.times[size_t(k + real - 1)];
      stamp.pts = a.pts;
      if (GST_CLOCK_TIME_IS_VALID(a.pts) && GST_CLOCK_TIME_IS_VALID(b.pts) && GST_CLOCK_TIME_IS_VALID(b.duration))
        stamp.duration = b.pts + b.duration - a.pts;
    } else if (!s.times.empty() && k >= int64_t(s.times.size())) {
      // A latent made only of tail padding: it sits right after the last real frame and lasts no time.
      const FrameTime& last = s.times.back();
      if (GST_CLOCK_TIME_IS_VALID(last.pts) && GST_CLOCK_TIME_IS_VALID(last.duration))
        stamp.pts = last.pts + last.duration;
      stamp.duration = 0;
    }
    GstBuffer* buf = latent::gst::buffer_wrapping_tensor(cpu[i].contiguous());
    latent::gst::apply_stamp(buf, stamp);
    // Frames covered by this latent are no longer needed for timing.
    while (!s.times.empty() && s.times_first < first + real && int64_t(s.times.size()) > 1) {
      s.times.pop_front();
      ++s.times_first;
    }
    uint64_t& done = latent::gst::filter_stream(filter).done;
    done = std::max(done, stamp.end_frame);
    // Events that came in before a frame this latent covers go out ahead of it.
    GstFlowReturn ret = latent::gst::push_output(filter, buf, std::max(stamp.end_frame, stamp.first_frame + 1));
    if (ret != GST_FLOW_OK) return ret;
  }
  return GST_FLOW_OK;
}

// Encodes what is pending, padding the tail.
GstFlowReturn finish(GstLatentFilter* filter) {
  auto* self = GST_VAE_ENCODE(filter);
  return push_latents(self, self->impl->encoder->finish());
}

// Starts a new clip. Resetting a patch-parallel group re-forms it, which can fail: false after an ERROR message.
gboolean reset_clip(GstLatentFilter* filter) {
  Impl& s = *GST_VAE_ENCODE(filter)->impl;
  s.times.clear();
  s.times_first = 0;
  return !s.encoder || latent::gst::guarded(GST_ELEMENT(filter), "starting a new clip", [&] { s.encoder->reset(); });
}

GstFlowReturn handle_buffer(GstLatentFilter* filter, GstBuffer* buffer) {
  auto* self = GST_VAE_ENCODE(filter);
  Impl& s = *self->impl;
  latent::gst::BufferPtr buf(buffer);
  latent::gst::VideoFrameMap frame(&s.video, buf.get(), GST_MAP_READ);
  if (!frame) {
    GST_ELEMENT_ERROR(self, STREAM, FORMAT, ("A buffer does not hold a whole frame of the negotiated caps."),
                      ("buffer %" GST_PTR_FORMAT, buf.get()));
    return GST_FLOW_ERROR;
  }
  torch::Tensor x = latent::gst::frame_to_tensor(frame.get(), s.model->device()).unsqueeze(0);
  // The pixels are copied: upstream gets its buffer back before the model runs.
  frame.release();
  s.times.push_back({GST_BUFFER_PTS(buf.get()), GST_BUFFER_DURATION(buf.get())});
  if (!GST_CLOCK_TIME_IS_VALID(s.times.back().duration)) s.times.back().duration = frame_duration(s);
  buf.reset();
  latent::gst::filter_stream(filter).taken++;
  const auto t0 = std::chrono::steady_clock::now();
  latent::EncodedLatents out = s.encoder->push(x);
  if (out.size() > 0) latent::gst::record_compute(filter, std::chrono::steady_clock::now() - t0);
  return push_latents(self, out);
}

gboolean set_video_caps(GstLatentFilter* filter, GstCaps* caps) {
  auto* self = GST_VAE_ENCODE(filter);
  Impl& s = *self->impl;
  GstVideoInfo info;
  if (!gst_video_info_from_caps(&info, caps)) {
    GST_ELEMENT_ERROR(self, CORE, NEGOTIATION, ("Cannot read the video caps."), ("%" GST_PTR_FORMAT, caps));
    return false;
  }
  // Upstream may send its caps again unchanged; only a real change may end the clip and reset the caches.
  if (s.have_video && gst_video_info_is_equal(&info, &s.video)) {
    GST_DEBUG_OBJECT(self, "caps unchanged: %" GST_PTR_FORMAT, caps);
    return true;
  }
  try {
    s.model->check_frame_size(GST_VIDEO_INFO_WIDTH(&info), GST_VIDEO_INFO_HEIGHT(&info));
  } catch (const std::exception& e) {
    GST_ELEMENT_ERROR(
        self, CORE, NEGOTIATION, ("%s", e.what()),
        ("put videoscale ahead of vaeencode to resize, e.g. ! videoscale ! video/x-raw,width=W,height=H"));
    return false;
  }
  if (!latent::gst::check_rows_for_ranks(GST_ELEMENT(self), *s.model, GST_VIDEO_INFO_HEIGHT(&info), s.models.size()))
    return false;
  // New caps mid-stream: what was encoded under the old caps is finished first.
  if (s.have_video ? latent::gst::drain(filter) != GST_FLOW_OK : !latent::gst::start_clip(filter)) return false;
  s.video = info;
  s.have_video = true;
  update_hold_time(s);

  const latent::VaeSpec& spec = s.model->spec();
  LatentCapsInfo out;
  out.model = spec.model_id;
  out.format = latent::gst::latent_format_for(s.model->dtype());
  out.channels = int(spec.latent_channels);
  out.width = GST_VIDEO_INFO_WIDTH(&info) / int(spec.spatial_factor);
  out.height = GST_VIDEO_INFO_HEIGHT(&info) / int(spec.spatial_factor);
  out.temporal_factor = int(spec.temporal_factor);
  out.spatial_factor = int(spec.spatial_factor);
  out.video_width = GST_VIDEO_INFO_WIDTH(&info);
  out.video_height = GST_VIDEO_INFO_HEIGHT(&info);
  out.video_framerate = {GST_VIDEO_INFO_FPS_N(&info), GST_VIDEO_INFO_FPS_D(&info)};
  out.framerate = {GST_VIDEO_INFO_FPS_N(&info), GST_VIDEO_INFO_FPS_D(&info) * int(spec.temporal_factor)};
  if (out.framerate.num == 0) out.framerate = {0, 1};
  GstCaps* latent_caps = out.to_caps();
  bool ok = gst_pad_push_event(latent::gst::src_pad(filter), gst_event_new_caps(latent_caps));
  gst_caps_unref(latent_caps);
  gst_element_post_message(GST_ELEMENT(self), gst_message_new_latency(GST_OBJECT(self)));
  return ok;
}

gboolean sink_query(GstLatentFilter* filter, GstQuery* query) {
  if (GST_QUERY_TYPE(query) == GST_QUERY_ALLOCATION) {
    // Frames are read through GstVideoFrame, which follows a GstVideoMeta's strides and plane offsets: upstream
    // can hand over padded buffers as they are instead of copying them into the default layout.
    gst_query_add_allocation_meta(query, GST_VIDEO_META_API_TYPE, nullptr);
    return TRUE;
  }
  if (GST_QUERY_TYPE(query) == GST_QUERY_CAPS) {
    // The sizes the loaded model encodes, so that a scaler upstream picks one. Where upstream can offer none of
    // them the template's are answered instead, and set_caps says which sizes the model takes rather than
    // negotiation failing without a reason.
    GstCaps* wanted = nullptr;
    gst_query_parse_caps(query, &wanted);
    const int step = GST_VAE_ENCODE(filter)->impl->size_multiple.load();
    GstCaps* caps = nullptr;
    for (int s : {step, 8}) {
      GstCaps* all = gst_caps_from_string(sink_caps_string(s).c_str());
      caps = wanted ? gst_caps_intersect_full(wanted, all, GST_CAPS_INTERSECT_FIRST) : gst_caps_ref(all);
      gst_caps_unref(all);
      if (!gst_caps_is_empty(caps) || s == 8) break;
      gst_caps_unref(caps);
    }
    gst_query_set_caps_result(query, caps);
    gst_caps_unref(caps);
    return TRUE;
  }
  return GST_LATENT_FILTER_CLASS(gst_vae_encode_parent_class)->sink_query(filter, query);
}

GstStateChangeReturn change_state(GstElement* element, GstStateChange transition) {
  auto* self = GST_VAE_ENCODE(element);
  Impl& s = *self->impl;
  switch (transition) {
    case GST_STATE_CHANGE_NULL_TO_READY:
      s.models = latent::gst::acquire_models_locked(element, s.settings);
      if (s.models.empty()) return GST_STATE_CHANGE_FAILURE;
      s.model = s.models[0];
      s.size_multiple = int(s.model->spec().size_multiple);
      break;
    case GST_STATE_CHANGE_READY_TO_PAUSED: {
      GST_OBJECT_LOCK(self);
      latent::EncoderOptions opt;
      opt.sample = s.sample;
      opt.seed = s.seed;
      opt.max_chunk_frames = int64_t(s.chunk_frames);
      opt.decodable_tail = true;  // frames in == frames out through vaedecode, TAEHV too
      opt.tile = s.memory.tiles();
      opt.bands = s.memory.bands();
      const latent::gst::ModelSettings settings = s.settings;
      GST_OBJECT_UNLOCK(self);
      s.encoder = latent::gst::make_encoder(element, s.models, opt, settings);
      if (!s.encoder) return GST_STATE_CHANGE_FAILURE;
      s.have_video = false;
      s.hold_time = 0;
      if (!latent::gst::start_clip(GST_LATENT_FILTER(self))) return GST_STATE_CHANGE_FAILURE;
      break;
    }
    default: break;
  }
  GstStateChangeReturn ret = GST_ELEMENT_CLASS(gst_vae_encode_parent_class)->change_state(element, transition);
  switch (transition) {
    case GST_STATE_CHANGE_PAUSED_TO_READY:
      s.encoder.reset();
      s.times.clear();
      s.have_video = false;
      break;
    case GST_STATE_CHANGE_READY_TO_NULL:
      s.size_multiple = 8;
      s.model.reset();
      s.models.clear();
      break;
    default: break;
  }
  return ret;
}

void set_property(GObject* object, guint id, const GValue* value, GParamSpec* pspec) {
  auto* self = GST_VAE_ENCODE(object);
  Impl& s = *self->impl;
  if (latent::gst::set_model_property(object, s.settings, id, value)) return;
  if (latent::gst::set_memory_property(object, s.memory, id, value)) return;
  GST_OBJECT_LOCK(self);
  switch (id) {
    case PROP_SAMPLE: s.sample = g_value_get_boolean(value); break;
    case PROP_SEED: s.seed = g_value_get_uint64(value); break;
    case PROP_CHUNK_FRAMES: s.chunk_frames = g_value_get_uint(value); break;
    default: G_OBJECT_WARN_INVALID_PROPERTY_ID(object, id, pspec);
  }
  GST_OBJECT_UNLOCK(self);
}

void get_property(GObject* object, guint id, GValue* value, GParamSpec* pspec) {
  auto* self = GST_VAE_ENCODE(object);
  Impl& s = *self->impl;
  if (latent::gst::get_model_property(object, s.settings, id, value)) return;
  if (latent::gst::get_memory_property(object, s.memory, id, value)) return;
  if (latent::gst::get_counter_property(GST_LATENT_FILTER(self), id, value)) return;
  GST_OBJECT_LOCK(self);
  switch (id) {
    case PROP_SAMPLE: g_value_set_boolean(value, s.sample); break;
    case PROP_SEED: g_value_set_uint64(value, s.seed); break;
    case PROP_CHUNK_FRAMES: g_value_set_uint(value, s.chunk_frames); break;
    default: G_OBJECT_WARN_INVALID_PROPERTY_ID(object, id, pspec);
  }
  GST_OBJECT_UNLOCK(self);
}

void finalize(GObject* object) {
  delete GST_VAE_ENCODE(object)->impl;
  G_OBJECT_CLASS(gst_vae_encode_parent_class)->finalize(object);
}

}  // namespace

static void gst_vae_encode_class_init(GstVaeEncodeClass* klass) {
  auto* gobject = G_OBJECT_CLASS(klass);
  auto* element = GST_ELEMENT_CLASS(klass);
  auto* filter = GST_LATENT_FILTER_CLASS(klass);
  gobject->set_property = set_property;
  gobject->get_property = get_property;
  gobject->finalize = finalize;
  element->change_state = change_state;
  filter->unit = "frame";
  filter->work = "encoding";
  filter->set_caps = set_video_caps;
  filter->handle_buffer = handle_buffer;
  filter->finish = finish;
  filter->reset = reset_clip;
  filter->held_latency = held_latency;
  filter->sink_query = sink_query;

  latent::gst::install_model_properties(gobject, "to encode");
  latent::gst::install_parallel_properties(
      gobject,
      "gst-launch-1.0 filesrc location=in.mp4 ! decodebin ! videoconvert ! vaeencode devices=cuda:0,cuda:1 ! "
      "latentfilesink location=clip.safetensors");
  auto rw = GParamFlags(G_PARAM_READWRITE | G_PARAM_STATIC_STRINGS | GST_PARAM_MUTABLE_READY);
  g_object_class_install_property(
      gobject, PROP_SAMPLE,
      g_param_spec_boolean("sample", "Sample",
                           "Emit a sample of the posterior (mean + std * seeded noise) instead of its mean", FALSE,
                           rw));
  g_object_class_install_property(
      gobject, PROP_SEED,
      g_param_spec_uint64("seed", "Seed", "Seed of the noise when sample=true (the same on every device)", 0,
                          G_MAXUINT64, 0, rw));
  g_object_class_install_property(
      gobject, PROP_CHUNK_FRAMES,
      g_param_spec_uint("chunk-frames", "Chunk frames",
                        "Frames per model call where the model allows batching (Wan); more is faster and uses more "
                        "memory. CogVideoX always runs its native 8-frame chunks",
                        1, 1024, 8, rw));
  latent::gst::install_memory_properties(gobject);
  latent::gst::install_counter_properties(
      gobject, {"frames-in", "Frames in", "Video frames received since READY->PAUSED"},
      {"latents-out", "Latents out", "Latent frames pushed since READY->PAUSED"}, true);

  gst_element_class_set_static_metadata(
      element, "Video VAE encoder", "Filter/Converter/Video",
      "Encodes raw video into the latent frames of a causal video VAE (Wan 2.1, CogVideoX) as the frames arrive, "
      "with carried temporal caches, so clips of any length are encoded in bounded memory. 1 + 4k frames give "
      "1 + k latents; other counts are padded and the latents record how many frames are real. Example: "
      "gst-launch-1.0 videotestsrc num-buffers=17 ! videoconvert ! video/x-raw,width=320,height=176 ! "
      "vaeencode model=/models/Wan2.1-VAE ! latentfilesink location=clip.safetensors",
      "gst-latent");
  GstCaps* sink = gst_caps_from_string(sink_caps_string().c_str());
  gst_element_class_add_pad_template(element, gst_pad_template_new("sink", GST_PAD_SINK, GST_PAD_ALWAYS, sink));
  gst_caps_unref(sink);
  GstCaps* src = gst_caps_from_string(latent::gst::latent_template_caps_string().c_str());
  gst_element_class_add_pad_template(element, gst_pad_template_new("src", GST_PAD_SRC, GST_PAD_ALWAYS, src));
  gst_caps_unref(src);
}

static void gst_vae_encode_init(GstVaeEncode* self) {
  self->impl = new Impl();
  gst_pad_use_fixed_caps(latent::gst::src_pad(GST_LATENT_FILTER(self)));
}
