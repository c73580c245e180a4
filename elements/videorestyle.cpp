#include "videorestyle.h"

#include <torch/types.h>

#include <chrono>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>

#include "buffer_map.h"
#include "elements.h"
#include "generation_plan.h"
#include "latent/gen/denoiser.h"
#include "latent/gen/prompts.h"
#include "latent/gen/restyler.h"
#include "latent/io/safetensors.h"
#include "latent/runtime/devices.h"
#include "latent/vae/vae.h"
#include "latent_caps.h"
#include "model_glue.h"
#include "prompt_control.h"

GST_DEBUG_CATEGORY_STATIC(video_restyle_debug);
#define GST_CAT_DEFAULT video_restyle_debug

using latent::gst::LatentCapsInfo;
using latent::gst::LatentFrameStamp;

namespace {

enum {
  PROP_TRANSFORMER_WEIGHTS = latent::gst::PROP_FIRST_FREE,
  PROP_LORA,
  PROP_PROMPT,
  PROP_PROMPT_EMBEDS,
  PROP_STRENGTH,
  PROP_DENOISING_STEPS,
  PROP_KV_WINDOW,
  PROP_SINK_FRAMES,
  PROP_SINK_THRESHOLD,
  PROP_SEED,
  PROP_RAW_INPUT,
  PROP_QOS,
  PROP_DROPPED,
  PROP_TEXT_DEVICE,
};

struct Settings {
  latent::gst::ModelSettings model;
  std::string transformer_weights, lora;
  double strength = 0.8;
  std::string denoising_steps = "700,500";
  guint kv_window = 6, sink_frames = 3;
  double sink_threshold = 0.2;
  guint64 seed = 0;
  bool raw_input = true;
};

struct Impl {
  Settings settings;  // object lock
  std::atomic<bool> qos{true};

  std::shared_ptr<const latent::Denoiser> denoiser;
  std::string model_path;
  latent::LoadOptions model_options;
  torch::Tensor text;    // the embeddings the next stream starts with
  std::string text_key;  // what they were made from
  std::unique_ptr<latent::Restyler> restyler;
  std::optional<LatentCapsInfo> in;
  torch::Tensor raw_mean, raw_std;      // [C, 1, 1] where raw-input converts, else undefined
  std::deque<LatentFrameStamp> stamps;  // of the frames in flight, from restyler index stamps_base
  int64_t stamps_base = 0;
  bool warned_non_finite = false;  // an output latent with NaN or infinite values was reported this stream
  GstSegment segment{};

  std::mutex switch_lock;  // a prompt delivered while playing, taken at the next frame
  torch::Tensor next_text;
  std::string next_label;
  std::unique_ptr<latent::gst::PromptControl> prompts;

  std::mutex qos_lock;
  GstClockTime earliest = GST_CLOCK_TIME_NONE;  // downstream's QoS: output running times before it are late

  std::atomic<guint64> dropped{0};
};

}  // namespace

struct _GstVideoRestyle {
  GstLatentFilter parent;
  Impl* impl;
};

G_DEFINE_TYPE_WITH_CODE(GstVideoRestyle, gst_video_restyle, GST_TYPE_LATENT_FILTER,
                        GST_DEBUG_CATEGORY_INIT(video_restyle_debug, "videorestyle", 0,
                                                "streaming video-to-video with a causal model"));
GST_ELEMENT_REGISTER_DEFINE(videorestyle, "videorestyle", GST_RANK_NONE, GST_TYPE_VIDEO_RESTYLE);

namespace {

std::filesystem::path no_default_model() {
  throw latent::ModelError("videorestyle has no default model: it needs a causal Wan checkpoint");
}

latent::RestyleOptions restyle_options(const Settings& s, const torch::Tensor& text) {
  latent::RestyleOptions o;
  o.strength = s.strength;
  o.denoising_steps = latent::gst::parse_denoising_steps(s.denoising_steps);
  o.kv_window = s.kv_window;
  o.sink_frames = s.sink_frames;
  o.sink_threshold = s.sink_threshold;
  o.seed = s.seed;
  o.text = text;
  return o;
}

// The embeddings of the prompt properties, made again only when they changed. Posts an ERROR and returns false.
bool make_text(GstVideoRestyle* self) {
  Impl& impl = *self->impl;
  const latent::gst::PromptControl::Choice c = impl.prompts->choice();
  if (c.prompt && !c.embeds.empty()) {
    GST_ELEMENT_ERROR(self, RESOURCE, SETTINGS, ("Set prompt or prompt-embeds, not both."), (nullptr));
    return false;
  }
  if (!c.prompt && c.embeds.empty()) {
    GST_ELEMENT_ERROR(self, RESOURCE, SETTINGS, ("No prompt: set prompt or prompt-embeds."), (nullptr));
    return false;
  }
  const std::string key = c.prompt ? "prompt\n" + *c.prompt : "file\n" + c.embeds;
  if (key == impl.text_key && impl.text.defined()) return true;
  try {
    impl.text = c.prompt ? impl.prompts->encode({*c.prompt})[0].to(torch::kFloat) : impl.prompts->read_embeds(c.embeds);
    impl.text_key = key;
    return true;
  } catch (const std::exception& e) {
    GST_ELEMENT_ERROR(self, RESOURCE, OPEN_READ, ("Cannot make the prompt's embeddings: %s", e.what()),
                      ("model %s", impl.model_path.c_str()));
    return false;
  }
}

// One latent frame takes a call; the first waits for the second, every later one leaves steps - 1 frames later.
GstClockTime held_latency(GstLatentFilter* filter) {
  auto* self = GST_VIDEO_RESTYLE(filter);
  Impl& s = *self->impl;
  GST_OBJECT_LOCK(self);
  int64_t steps = 2;
  try {
    steps = int64_t(latent::gst::parse_denoising_steps(s.settings.denoising_steps).size());
  } catch (const std::exception&) {
  }
  const std::optional<LatentCapsInfo> in = s.in;
  GST_OBJECT_UNLOCK(self);
  const GstClockTime frame = in ? in->frame_duration() : GST_CLOCK_TIME_NONE;
  return GST_CLOCK_TIME_IS_VALID(frame) ? GstClockTime(std::max<int64_t>(1, steps - 1)) * frame : 0;
}

GstFlowReturn push_frames(GstVideoRestyle* self, std::vector<latent::RestyledFrame> frames) {
  Impl& s = *self->impl;
  for (latent::RestyledFrame& f : frames) {
    LatentFrameStamp stamp;
    while (!s.stamps.empty() && s.stamps_base < f.index) {
      s.stamps.pop_front();
      ++s.stamps_base;
    }
    if (!s.stamps.empty() && s.stamps_base == f.index) stamp = s.stamps.front();
    const torch::Tensor frame =
        f.latent.reshape({s.in->channels, s.in->height, s.in->width}).to(torch::kCPU, s.in->scalar_type()).contiguous();
    latent::gst::warn_once_if_non_finite(GST_ELEMENT(self), s.warned_non_finite, frame, uint64_t(f.index), stamp.pts,
                                         "restyled values that decode to no picture (the input or the model)");
    GstBuffer* buf = latent::gst::buffer_wrapping_tensor(frame);
    latent::gst::apply_stamp(buf, stamp);
    const uint64_t covers_end = latent::gst::filter_stream(GST_LATENT_FILTER(self)).clip_start + uint64_t(f.index) + 1;
    latent::gst::filter_stream(GST_LATENT_FILTER(self)).done = covers_end;
    const GstFlowReturn ret = latent::gst::push_output(GST_LATENT_FILTER(self), buf, covers_end);
    if (ret != GST_FLOW_OK) return ret;
  }
  return GST_FLOW_OK;
}

// Sends what is in flight: the stream ended here.
GstFlowReturn finish(GstLatentFilter* filter) {
  auto* self = GST_VIDEO_RESTYLE(filter);
  return push_frames(self, self->impl->restyler->finish());
}

// Starts a new stream of the restyler (its frame numbers start again at 0).
gboolean reset_stream(GstLatentFilter* filter) {
  Impl& s = *GST_VIDEO_RESTYLE(filter)->impl;
  if (s.restyler) s.restyler->reset();
  s.stamps.clear();
  s.stamps_base = 0;
  return TRUE;
}

// Whether downstream's QoS says the output of a frame with this stamp would come too late to be shown.
bool late(Impl& s, const LatentFrameStamp& stamp) {
  if (!s.qos || !GST_CLOCK_TIME_IS_VALID(stamp.pts) || s.segment.format != GST_FORMAT_TIME) return false;
  const guint64 rt = gst_segment_to_running_time(&s.segment, GST_FORMAT_TIME, stamp.pts);
  std::lock_guard<std::mutex> lock(s.qos_lock);
  if (!GST_CLOCK_TIME_IS_VALID(rt) || !GST_CLOCK_TIME_IS_VALID(s.earliest)) return false;
  const GstClockTime end = rt + (GST_CLOCK_TIME_IS_VALID(stamp.duration) ? stamp.duration : 0);
  return end <= s.earliest;
}

void post_dropped(GstVideoRestyle* self, const LatentFrameStamp& stamp) {
  Impl& s = *self->impl;
  const guint64 rt = gst_segment_to_running_time(&s.segment, GST_FORMAT_TIME, stamp.pts);
  const guint64 st = gst_segment_to_stream_time(&s.segment, GST_FORMAT_TIME, stamp.pts);
  GstMessage* m = gst_message_new_qos(GST_OBJECT(self), FALSE, rt, st, stamp.pts, stamp.duration);
  gst_message_set_qos_stats(m, GST_FORMAT_BUFFERS, latent::gst::filter_stream(GST_LATENT_FILTER(self)).in.load(),
                            s.dropped.load());
  gst_element_post_message(GST_ELEMENT(self), m);
}

// A prompt delivered while playing: taken before the next frame, marked downstream by a tag.
void take_switched_prompt(GstVideoRestyle* self) {
  Impl& s = *self->impl;
  torch::Tensor text;
  std::string label;
  {
    std::lock_guard<std::mutex> lock(s.switch_lock);
    if (!s.next_text.defined()) return;
    std::swap(text, s.next_text);
    label = s.next_label;
  }
  s.restyler->set_text(text);
  GST_INFO_OBJECT(self, "prompt switched to '%s' from frame %" G_GINT64_FORMAT, label.c_str(), s.restyler->frames_in());
  latent::gst::FilterStream& stream = latent::gst::filter_stream(GST_LATENT_FILTER(self));
  stream.held.hold(latent::gst::PromptControl::tag_event(label), stream.taken);
}

GstFlowReturn handle_buffer(GstLatentFilter* filter, GstBuffer* buffer) {
  auto* self = GST_VIDEO_RESTYLE(filter);
  Impl& s = *self->impl;
  latent::gst::BufferPtr buf(buffer);
  const LatentFrameStamp stamp = latent::gst::read_stamp(buf.get());
  // The first two frames make the stream's start: never dropped. Later a frame whose output would be late is not
  // made at all, so a slow model skips frames instead of building a backlog.
  if (s.restyler->frames_in() >= 2 && late(s, stamp)) {
    s.dropped++;
    GST_DEBUG_OBJECT(self, "dropping a late latent at %" GST_TIME_FORMAT, GST_TIME_ARGS(stamp.pts));
    post_dropped(self, stamp);
    return GST_FLOW_OK;
  }
  latent::gst::BufferMap map(buf.get(), GST_MAP_READ);
  if (!map) {
    GST_ELEMENT_ERROR(self, STREAM, DECODE, ("Cannot read a latent buffer."), ("buffer %" GST_PTR_FORMAT, buf.get()));
    return GST_FLOW_ERROR;
  }
  take_switched_prompt(self);
  torch::Tensor z = latent::gst::frame_tensor_view(*s.in, map.info()).to(torch::kFloat);
  if (s.raw_mean.defined())
    z = z * s.raw_std + s.raw_mean;  // a copy, so the buffer can go back upstream
  else
    z = z.clone();
  map.release();
  buf.reset();
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<latent::RestyledFrame> done = s.restyler->push(z.unsqueeze(1).unsqueeze(0));
  latent::gst::filter_stream(filter).taken++;
  s.stamps.push_back(stamp);
  if (!done.empty()) latent::gst::record_compute(filter, std::chrono::steady_clock::now() - t0);
  return push_frames(self, std::move(done));
}

// The latents keep their caps: they go on as they came.
gboolean forward_caps(GstLatentFilter* filter, GstCaps* caps) {
  return gst_pad_push_event(latent::gst::src_pad(filter), gst_event_new_caps(caps));
}

gboolean set_latent_caps(GstLatentFilter* filter, GstCaps* caps) {
  auto* self = GST_VIDEO_RESTYLE(filter);
  Impl& s = *self->impl;
  std::string why;
  auto info = LatentCapsInfo::from_caps(caps, &why);
  if (!info) {
    GST_ELEMENT_ERROR(self, CORE, NEGOTIATION, ("Invalid latent caps: %s", why.c_str()), ("%" GST_PTR_FORMAT, caps));
    return false;
  }
  if (s.in && *s.in == *info) return forward_caps(filter, caps);
  const latent::DenoiserSpec& spec = s.denoiser->spec();
  if (info->model != spec.latent_space || info->channels != spec.channels) {
    GST_ELEMENT_ERROR(self, CORE, NEGOTIATION,
                      ("Latents of model '%s' (%d channels) cannot be restyled by a model of '%s' latents (%lld "
                       "channels).",
                       info->model.c_str(), info->channels, spec.latent_space.c_str(), (long long)spec.channels),
                      ("encode the video with the VAE of the model's folder"));
    return false;
  }
  if (s.in && latent::gst::drain(filter) != GST_FLOW_OK) return false;
  GST_OBJECT_LOCK(self);
  const Settings settings = s.settings;
  GST_OBJECT_UNLOCK(self);
  try {
    s.raw_mean = s.raw_std = torch::Tensor();
    if (settings.raw_input) {
      const latent::LatentStatistics stats = latent::published_latent_statistics(info->model);
      if (int64_t(stats.mean.size()) != info->channels)
        throw std::invalid_argument("raw-input: the published statistics of '" + info->model + "' have " +
                                    std::to_string(stats.mean.size()) + " channels, the latents " +
                                    std::to_string(info->channels) + " (set raw-input=false)");
      s.raw_mean = torch::tensor(stats.mean, torch::kDouble).to(torch::kFloat).view({-1, 1, 1});
      s.raw_std = torch::tensor(stats.std, torch::kDouble).to(torch::kFloat).view({-1, 1, 1});
    }
    // New caps start a new stream under the prompt the last one played (a live switch), not the first.
    const std::optional<latent::gst::PromptControl::Switched> latest = s.prompts->latest();
    s.restyler =
        std::make_unique<latent::Restyler>(s.denoiser, restyle_options(settings, latest ? latest->embeddings : s.text));
  } catch (const std::exception& e) {
    // e.g. raw-input for latents of a space without published statistics
    GST_ELEMENT_ERROR(self, RESOURCE, SETTINGS, ("Cannot restyle with these settings: %s", e.what()),
                      ("model %s", s.model_path.c_str()));
    return false;
  }
  GST_OBJECT_LOCK(self);
  s.in = info;
  GST_OBJECT_UNLOCK(self);
  latent::gst::start_clip(filter);
  gst_element_post_message(GST_ELEMENT(self), gst_message_new_latency(GST_OBJECT(self)));
  return forward_caps(filter, caps);
}

// The segment maps stamps to running time for the QoS decision (after the base drained the last one's frames).
void observe_event(GstLatentFilter* filter, GstEvent* event) {
  Impl& s = *GST_VIDEO_RESTYLE(filter)->impl;
  if (GST_EVENT_TYPE(event) != GST_EVENT_SEGMENT) return;
  const GstSegment* segment;
  gst_event_parse_segment(event, &segment);
  gst_segment_copy_into(segment, &s.segment);
}

void flush(GstLatentFilter* filter) {
  Impl& s = *GST_VIDEO_RESTYLE(filter)->impl;
  std::lock_guard<std::mutex> lock(s.qos_lock);
  s.earliest = GST_CLOCK_TIME_NONE;
}

// Downstream's QoS: the running time before which outputs are late (GstBaseTransform's reading of it).
gboolean src_event(GstPad* pad, GstObject* parent, GstEvent* event) {
  auto* self = GST_VIDEO_RESTYLE(parent);
  Impl& s = *self->impl;
  if (GST_EVENT_TYPE(event) == GST_EVENT_QOS) {
    GstQOSType type;
    gdouble proportion;
    GstClockTimeDiff diff;
    GstClockTime timestamp;
    gst_event_parse_qos(event, &type, &proportion, &diff, &timestamp);
    std::lock_guard<std::mutex> lock(s.qos_lock);
    s.earliest = GST_CLOCK_TIME_IS_VALID(timestamp)
                     ? GstClockTime(std::max<GstClockTimeDiff>(0, GstClockTimeDiff(timestamp) + diff))
                     : GST_CLOCK_TIME_NONE;
  }
  return gst_pad_event_default(pad, parent, event);
}

// Latents of the model's latent space and channels pass through unchanged in every other field: a caps query
// on either pad answers those, narrowed by what the other side's peer takes, so a mismatch fails negotiation
// instead of ending the stream.
GstCaps* restylable_caps(GstVideoRestyle* self, GstPad* pad) {
  GstCaps* ours = gst_pad_get_pad_template_caps(pad);
  if (const std::shared_ptr<const latent::Denoiser> d = self->impl->denoiser) {
    gst_caps_unref(ours);
    ours = gst_caps_from_string(latent::gst::latent_template_caps_string(d->spec().latent_space).c_str());
    gst_caps_set_simple(ours, "channels", G_TYPE_INT, int(d->spec().channels), nullptr);
  }
  auto* filter = GST_LATENT_FILTER(self);
  GstPad* other = pad == latent::gst::sink_pad(filter) ? latent::gst::src_pad(filter) : latent::gst::sink_pad(filter);
  GstCaps* peer = gst_pad_peer_query_caps(other, ours);
  GstCaps* caps = gst_caps_intersect(ours, peer);
  gst_caps_unref(ours);
  gst_caps_unref(peer);
  return caps;
}

gboolean sink_query(GstLatentFilter* filter, GstQuery* query) {
  GstPad* pad = latent::gst::sink_pad(filter);
  if (GST_QUERY_TYPE(query) == GST_QUERY_CAPS)
    return latent::gst::answer_caps_query(query, restylable_caps(GST_VIDEO_RESTYLE(filter), pad));
  if (GST_QUERY_TYPE(query) == GST_QUERY_ACCEPT_CAPS) return latent::gst::accept_template_caps(pad, query);
  return GST_LATENT_FILTER_CLASS(gst_video_restyle_parent_class)->sink_query(filter, query);
}

gboolean src_query(GstLatentFilter* filter, GstQuery* query) {
  if (GST_QUERY_TYPE(query) == GST_QUERY_CAPS)
    return latent::gst::answer_caps_query(query,
                                          restylable_caps(GST_VIDEO_RESTYLE(filter), latent::gst::src_pad(filter)));
  return GST_LATENT_FILTER_CLASS(gst_video_restyle_parent_class)->src_query(filter, query);
}

GstStateChangeReturn change_state(GstElement* element, GstStateChange transition) {
  auto* self = GST_VIDEO_RESTYLE(element);
  Impl& s = *self->impl;
  switch (transition) {
    case GST_STATE_CHANGE_NULL_TO_READY: {
      static const latent::gst::DefaultModel none{"causal model", no_default_model,
                                                  "a diffusers Wan 2.1 folder (with transformer-weights= a causal "
                                                  "checkpoint)"};
      GST_OBJECT_LOCK(self);
      const Settings settings = s.settings;
      GST_OBJECT_UNLOCK(self);
      latent::gst::VideoGenSettings files;
      files.transformer_weights = settings.transformer_weights;
      files.lora = settings.lora;
      const bool loaded = latent::gst::load_model(
          element, settings.model, none, [&](const std::string& path, const latent::LoadOptions& o) {
            s.denoiser = latent::load_denoiser(path, o, latent::gst::denoiser_files(files));
            s.model_path = path;
            s.model_options = o;
            const latent::DenoiserSpec& spec = s.denoiser->spec();
            s.prompts->attach({path, o, spec.text_tokens, spec.text_dim, true});
          });
      if (!loaded || !make_text(self)) {
        s.denoiser.reset();
        return GST_STATE_CHANGE_FAILURE;
      }
      break;
    }
    case GST_STATE_CHANGE_READY_TO_PAUSED: {
      GST_OBJECT_LOCK(self);
      const Settings settings = s.settings;
      GST_OBJECT_UNLOCK(self);
      if (!make_text(self)) return GST_STATE_CHANGE_FAILURE;
      try {
        latent::gst::parse_denoising_steps(settings.denoising_steps);
      } catch (const std::invalid_argument& e) {
        GST_ELEMENT_ERROR(self, RESOURCE, SETTINGS, ("denoising-steps: %s", e.what()), (nullptr));
        return GST_STATE_CHANGE_FAILURE;
      }
      s.dropped = 0;
      s.warned_non_finite = false;
      gst_segment_init(&s.segment, GST_FORMAT_UNDEFINED);
      std::lock_guard<std::mutex> lock(s.qos_lock);
      s.earliest = GST_CLOCK_TIME_NONE;
      // Prompts set from here on switch the stream, also before its first caps.
      s.prompts->start();
      break;
    }
    default: break;
  }
  GstStateChangeReturn ret = GST_ELEMENT_CLASS(gst_video_restyle_parent_class)->change_state(element, transition);
  switch (transition) {
    case GST_STATE_CHANGE_PAUSED_TO_READY:
      s.prompts->stop();
      s.restyler.reset();
      s.stamps.clear();
      s.stamps_base = 0;
      GST_OBJECT_LOCK(self);
      s.in.reset();
      GST_OBJECT_UNLOCK(self);
      {
        std::lock_guard<std::mutex> lock(s.switch_lock);
        s.next_text = torch::Tensor();
      }
      break;
    case GST_STATE_CHANGE_READY_TO_NULL:
      s.prompts->detach();
      s.denoiser.reset();
      s.text = torch::Tensor();
      s.text_key.clear();
      break;
    default: break;
  }
  return ret;
}

void set_property(GObject* object, guint id, const GValue* value, GParamSpec* pspec) {
  auto* self = GST_VIDEO_RESTYLE(object);
  Impl& impl = *self->impl;
  Settings& s = impl.settings;
  if (latent::gst::set_model_property(object, s.model, id, value)) return;
  if (impl.prompts->set_property(id, value, GST_STATE(self) >= GST_STATE_PAUSED)) return;
  if (id == PROP_QOS) {
    impl.qos = g_value_get_boolean(value);
    return;
  }
  GST_OBJECT_LOCK(self);
  const auto text = [&] { return g_value_get_string(value) ? std::string(g_value_get_string(value)) : std::string(); };
  switch (id) {
    case PROP_TRANSFORMER_WEIGHTS: s.transformer_weights = text(); break;
    case PROP_LORA: s.lora = text(); break;
    case PROP_STRENGTH: s.strength = g_value_get_double(value); break;
    case PROP_DENOISING_STEPS: s.denoising_steps = text(); break;
    case PROP_KV_WINDOW: s.kv_window = g_value_get_uint(value); break;
    case PROP_SINK_FRAMES: s.sink_frames = g_value_get_uint(value); break;
    case PROP_SINK_THRESHOLD: s.sink_threshold = g_value_get_double(value); break;
    case PROP_SEED: s.seed = g_value_get_uint64(value); break;
    case PROP_RAW_INPUT: s.raw_input = g_value_get_boolean(value); break;
    default: G_OBJECT_WARN_INVALID_PROPERTY_ID(object, id, pspec); break;
  }
  GST_OBJECT_UNLOCK(self);
}

void get_property(GObject* object, guint id, GValue* value, GParamSpec* pspec) {
  auto* self = GST_VIDEO_RESTYLE(object);
  Impl& impl = *self->impl;
  const Settings& s = impl.settings;
  if (latent::gst::get_model_property(object, s.model, id, value)) return;
  if (impl.prompts->get_property(id, value)) return;
  if (latent::gst::get_counter_property(GST_LATENT_FILTER(self), id, value)) return;
  GST_OBJECT_LOCK(self);
  const auto set_text = [&](const std::string& v) { g_value_set_string(value, v.empty() ? nullptr : v.c_str()); };
  switch (id) {
    case PROP_TRANSFORMER_WEIGHTS: set_text(s.transformer_weights); break;
    case PROP_LORA: set_text(s.lora); break;
    case PROP_STRENGTH: g_value_set_double(value, s.strength); break;
    case PROP_DENOISING_STEPS: g_value_set_string(value, s.denoising_steps.c_str()); break;
    case PROP_KV_WINDOW: g_value_set_uint(value, s.kv_window); break;
    case PROP_SINK_FRAMES: g_value_set_uint(value, s.sink_frames); break;
    case PROP_SINK_THRESHOLD: g_value_set_double(value, s.sink_threshold); break;
    case PROP_SEED: g_value_set_uint64(value, s.seed); break;
    case PROP_RAW_INPUT: g_value_set_boolean(value, s.raw_input); break;
    case PROP_QOS: g_value_set_boolean(value, impl.qos.load()); break;
    case PROP_DROPPED: g_value_set_uint64(value, impl.dropped.load()); break;
    default: G_OBJECT_WARN_INVALID_PROPERTY_ID(object, id, pspec); break;
  }
  GST_OBJECT_UNLOCK(self);
}

void finalize(GObject* object) {
  auto* self = GST_VIDEO_RESTYLE(object);
  self->impl->prompts.reset();  // joins its thread before the state it delivers to goes
  delete self->impl;
  G_OBJECT_CLASS(gst_video_restyle_parent_class)->finalize(object);
}

}  // namespace

static void gst_video_restyle_class_init(GstVideoRestyleClass* klass) {
  auto* gobject = G_OBJECT_CLASS(klass);
  auto* element = GST_ELEMENT_CLASS(klass);
  auto* filter = GST_LATENT_FILTER_CLASS(klass);
  gobject->set_property = set_property;
  gobject->get_property = get_property;
  gobject->finalize = finalize;
  element->change_state = change_state;
  filter->unit = "latent";
  filter->work = "restyling";
  filter->set_caps = set_latent_caps;
  filter->handle_buffer = handle_buffer;
  filter->finish = finish;
  filter->reset = reset_stream;
  filter->flush = flush;
  filter->observe_event = observe_event;
  filter->held_latency = held_latency;
  filter->sink_query = sink_query;
  filter->src_query = src_query;

  latent::gst::install_model_properties(
      gobject, std::string("A diffusers Wan 2.1 T2V folder (its transformer config, text encoder and tokenizer); "
                           "transformer-weights puts a causal checkpoint (StreamDiffusionV2's model.pt, "
                           "Self-Forcing's) in place of its transformer"));
  const auto ready = GParamFlags(G_PARAM_READWRITE | G_PARAM_STATIC_STRINGS | GST_PARAM_MUTABLE_READY);
  const auto ro = GParamFlags(G_PARAM_READABLE | G_PARAM_STATIC_STRINGS);
  g_object_class_install_property(
      gobject, PROP_TRANSFORMER_WEIGHTS,
      g_param_spec_string("transformer-weights", "Transformer weights",
                          "A causal Wan checkpoint in place of the folder's transformer: a torch .pt with "
                          "generator_ema, generator or state_dict (model. prefix), flat safetensors with the "
                          "original Wan names, or diffusers names. Read at NULL->READY",
                          nullptr, ready));
  g_object_class_install_property(
      gobject, PROP_LORA,
      g_param_spec_string("lora", "LoRA", "LoRA files merged into the transformer at load: \"FILE:SCALE,...\"", nullptr,
                          ready));
  latent::gst::PromptControl::install_properties(
      gobject, {PROP_PROMPT, PROP_PROMPT_EMBEDS, PROP_TEXT_DEVICE},
      "The style, encoded by the folder's text encoder (kept loaded: text-device). Set while playing, also before "
      "the first caps, it is encoded off the streaming thread and takes effect at the next frame (a latent-prompt "
      "tag marks where); new caps keep it",
      "Instead of prompt: a safetensors file with tensor prompt_embeds [1, L, D] (latent-prompt writes one); may be "
      "set while playing (a file that cannot be read, or of the wrong shape, is a warning and the stream goes on)");
  g_object_class_install_property(
      gobject, PROP_STRENGTH,
      g_param_spec_double("strength", "Strength",
                          "How much of each input frame is replaced by noise before it is regenerated (the input "
                          "is noise * s + latents * (1 - s); later frames tell the model t = int(1000 s) - 100, "
                          "held at 1 or more below s = 0.1). Lower keeps more of the input",
                          0.01, 1.0, 0.8, ready));
  g_object_class_install_property(
      gobject, PROP_DENOISING_STEPS,
      g_param_spec_string("denoising-steps", "Denoising steps",
                          "Timesteps on the 1000-step grid, comma-separated, not warped: one model call per step "
                          "and frame; a frame leaves steps - 1 frames after it came",
                          "700,500", ready));
  g_object_class_install_property(
      gobject, PROP_KV_WINDOW,
      g_param_spec_uint("kv-window", "KV window", "Latent frames each step's key/value cache holds", 2, 4096, 6,
                        ready));
  g_object_class_install_property(
      gobject, PROP_SINK_FRAMES,
      g_param_spec_uint("sink-frames", "Sink frames",
                        "Of kv-window, the slots of the attention sink (kept unless the adaptive sink refreshes "
                        "them)",
                        0, 4095, 3, ready));
  g_object_class_install_property(
      gobject, PROP_SINK_THRESHOLD,
      g_param_spec_double("sink-threshold", "Sink threshold",
                          "A frame whose keys and values are less alike (cosine) than this to a sink frame replaces "
                          "the least alike at the next eviction (the adaptive sink); -1 keeps the sink fixed",
                          -1.0, 1.0, 0.2, ready));
  g_object_class_install_property(
      gobject, PROP_SEED,
      g_param_spec_uint64("seed", "Seed", "Seed of every noise draw (a CPU generator: the same on every device)", 0,
                          G_MAXUINT64, 0, ready));
  g_object_class_install_property(
      gobject, PROP_RAW_INPUT,
      g_param_spec_boolean("raw-input", "Raw input",
                           "Give the model the VAE's raw posterior means (the latents de-normalised with the latent "
                           "space's published statistics), as StreamDiffusionV2 does; its output is taken as "
                           "normalised latents, as its decoder takes it. FALSE passes the latents as they come",
                           TRUE, ready));
  g_object_class_install_property(
      gobject, PROP_QOS,
      g_param_spec_boolean("qos", "QoS",
                           "Skip input frames whose output downstream's QoS says would be late, instead of queueing "
                           "them",
                           TRUE, GParamFlags(G_PARAM_READWRITE | G_PARAM_STATIC_STRINGS | GST_PARAM_MUTABLE_PLAYING)));
  latent::gst::install_counter_properties(
      gobject, {"latents-in", "Latents in", "Latent frames received since READY->PAUSED"},
      {"latents-out", "Latents out", "Latent frames pushed since READY->PAUSED"}, false);
  g_object_class_install_property(
      gobject, PROP_DROPPED,
      g_param_spec_uint64("dropped", "Dropped", "Input frames skipped because their output would be late (qos)", 0,
                          G_MAXUINT64, 0, ro));

  latent::gst::PromptControl::register_tags();

  gst_element_class_set_static_metadata(
      element, "Streaming video-to-video", "Filter/Effect/Video",
      "Regenerates incoming latent frames under a prompt with a causal few-step Wan model, one frame per model call "
      "per step, as StreamDiffusionV2's streaming video-to-video: a camera restyled live. Latency: steps - 1 latent "
      "frames and the compute; late frames are skipped (qos). Example: gst-launch-1.0 v4l2src ! videoconvert ! "
      "videoscale ! video/x-raw,width=832,height=480 ! vaeencode model=DIR/vae ! videorestyle model=DIR "
      "transformer-weights=model.pt prompt=\"oil painting\" ! vaedecode model=taew2_1.pth ! videoconvert ! "
      "autovideosink",
      "gst-latent");
  const std::string caps = latent::gst::latent_template_caps_string();
  for (const char* name : {"sink", "src"}) {
    GstCaps* c = gst_caps_from_string(caps.c_str());
    gst_element_class_add_pad_template(
        element, gst_pad_template_new(name, name[1] == 'i' ? GST_PAD_SINK : GST_PAD_SRC, GST_PAD_ALWAYS, c));
    gst_caps_unref(c);
  }
}

static void gst_video_restyle_init(GstVideoRestyle* self) {
  self->impl = new Impl();
  Impl* impl = self->impl;
  impl->prompts = std::make_unique<latent::gst::PromptControl>(
      GST_ELEMENT(self), latent::gst::PromptControl::PropertyIds{PROP_PROMPT, PROP_PROMPT_EMBEDS, PROP_TEXT_DEVICE},
      [impl](const latent::gst::PromptControl::Switched& p) {
        std::lock_guard<std::mutex> lock(impl->switch_lock);
        impl->next_text = p.embeddings;
        impl->next_label = p.label;
      });
  auto* filter = GST_LATENT_FILTER(self);
  // Caps queries proxy the other side's (narrowed to the model's latents); QoS events from downstream.
  GST_PAD_SET_PROXY_CAPS(latent::gst::sink_pad(filter));
  GST_PAD_SET_PROXY_CAPS(latent::gst::src_pad(filter));
  gst_pad_set_event_function(latent::gst::src_pad(filter), src_event);
}
