#include "videogen.h"

#include <torch/types.h>

#include <atomic>
#include <chrono>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <numeric>
#include <optional>
#include <sstream>

#include "elements.h"
#include "fixed_latents.h"
#include "generation_plan.h"
#include "latent/gen/prompts.h"
#include "latent/io/safetensors.h"
#include "latent/runtime/default_model.h"
#include "latent/runtime/devices.h"
#include "latent_caps.h"
#include "live_timeline.h"
#include "model_glue.h"
#include "prompt_control.h"

GST_DEBUG_CATEGORY_STATIC(video_gen_debug);
#define GST_CAT_DEFAULT video_gen_debug

using latent::gst::Fraction;
using latent::gst::LatentCapsInfo;
using latent::gst::LatentFrameStamp;
using latent::gst::Run;
using Settings = latent::gst::VideoGenSettings;
using latent::gst::kAutoContext;
using latent::gst::kModelGuidance;
using latent::gst::kScheduleAuto;
using latent::gst::SAMPLER_DDIM;
using latent::gst::SAMPLER_DEFAULT;
using latent::gst::SAMPLER_DPM;
using latent::gst::SAMPLER_EULER;
using latent::gst::SAMPLER_UNIPC;

namespace {

enum {
  PROP_SCHEDULE = latent::gst::PROP_FIRST_FREE,
  PROP_SAMPLER,
  PROP_STEPS,
  PROP_SHIFT,
  PROP_GUIDANCE_SCALE,
  PROP_SEED,
  PROP_NUM_FRAMES,
  PROP_WIDTH,
  PROP_HEIGHT,
  PROP_FRAMERATE,
  PROP_WINDOW,
  PROP_CONTEXT,
  PROP_PROMPT_EMBEDS,
  PROP_PROMPT,
  PROP_NEGATIVE_PROMPT,
  PROP_TEXT_DEVICE,
  PROP_INITIAL_NOISE,
  PROP_GUIDANCE_SCALE_2,
  PROP_IMAGE,
  PROP_TRANSFORMER_WEIGHTS,
  PROP_LORA,
  PROP_LORA_2,
  PROP_IS_LIVE,
  PROP_PARALLEL,
  PROP_FORMAT,
  PROP_LATENTS_OUT,
  PROP_MODEL_CALLS,
  PROP_MEAN_CALL_TIME,
  PROP_CHUNK_FRAMES,
  PROP_KV_WINDOW,
  PROP_SINK_FRAMES,
  PROP_GLOBAL_SINK,
  PROP_DENOISING_STEPS,
  PROP_CONTEXT_NOISE,
  PROP_PROMPT_SCHEDULE,
  PROP_MAX_LATENESS,
  PROP_WARP_DENOISING_STEPS,
};

struct Impl {
  Settings settings;  // object lock

  std::shared_ptr<const latent::Denoiser> denoiser;  // rank 0's with devices
  // With devices: each rank's denoiser (ranks on one device share one), rank 0's first.
  std::vector<std::shared_ptr<const latent::Denoiser>> ranks;
  std::string model_path;  // what the denoiser was loaded from, where a prompt's text encoder is found
  latent::LoadOptions model_options;
  // The embeddings of the prompts last encoded and what they were encoded from, so a restart with the same
  // prompts does not run the text encoder again.
  std::string encoded_key;
  latent::PromptEmbeddings encoded;
  std::vector<torch::Tensor> scheduled;  // prompt-schedule's prompts, encoded with the prompt
  // prompt, prompt-embeds and text-device; prompts set while a causal run plays, encoded off the streaming thread.
  std::unique_ptr<latent::gst::PromptControl> prompts;
  // Set by start() and cleared by stop(), which basesrc never runs beside create(); unlock() reaches the
  // generator from another thread, so the three take run_lock where they touch it.
  std::optional<Run> run;
  std::mutex run_lock;
  GstCaps* caps = nullptr;  // what the run makes, for caps queries from any thread; object lock
  std::deque<latent::GeneratedFrame> pending;
  uint64_t emitted = 0;  // latents pushed since the start or the last seek
  bool discont = true;
  // Whether a generator step has completed since the start or the last seek: the first includes the warm-up
  // and, with fifo, the queue filling up, so only later ones bound the steady-state latency.
  bool warm = false;
  // Live: timestamps start when the first latent exists and move later when latents exist late or a sink
  // reports lateness beyond max_lateness (object lock).
  latent::gst::LiveTimeline timeline;
  GstClockTime max_lateness = 40 * GST_MSECOND;
  bool warned_late = false;
  bool warned_non_finite = false;  // a latent with NaN or infinite values was reported this run
  // Live: running time of the first request and whether the first latent's latency was posted.
  GstClockTime first_request = GST_CLOCK_TIME_NONE;

  std::atomic<guint64> latents{0}, calls{0};
  latent::gst::ChunkStats stats;
  latent::gst::LatencyBound step_time;  // generator steps that hand out latents, in steady state
};

}  // namespace

struct _GstVideoGen {
  GstPushSrc parent;
  Impl* impl;
};

G_DEFINE_TYPE_WITH_CODE(GstVideoGen, gst_video_gen, GST_TYPE_PUSH_SRC,
                        GST_DEBUG_CATEGORY_INIT(video_gen_debug, "videogen", 0, "latent video generator"));
GST_ELEMENT_REGISTER_DEFINE(videogen, "videogen", GST_RANK_NONE, GST_TYPE_VIDEO_GEN);

GType gst_video_gen_schedule_get_type(void) {
  static GType type = 0;
  static const GEnumValue values[] = {
      {kScheduleAuto, "fifo where the model takes a timestep per frame, clip where it takes one per call (CogVideoX)",
       "auto"},
      {int(latent::ScheduleKind::clip), "One clip denoised at once (at most one window of latents)", "clip"},
      {int(latent::ScheduleKind::fifo),
       "FIFO-Diffusion: a queue of frames at rising noise levels, one frame out per iteration; endless", "fifo"},
      {int(latent::ScheduleKind::rolling),
       "Windows that carry their last clean frames into the next as context; endless", "rolling"},
      {int(latent::ScheduleKind::causal),
       "Causal few-step models (Self-Forcing, CausVid, LongLive, Krea Realtime): blocks of chunk-frames made one "
       "after another over a key/value cache of kv-window frames; endless, live, prompts switched while playing",
       "causal"},
      {0, nullptr, nullptr}};
  if (g_once_init_enter(&type)) g_once_init_leave(&type, g_enum_register_static("GstVideoGenSchedule", values));
  return type;
}

GType gst_video_gen_sampler_get_type(void) {
  static GType type = 0;
  static const GEnumValue values[] = {
      {SAMPLER_DEFAULT, "The sampler the model's file recommends", "default"},
      {SAMPLER_EULER, "Flow-matching Euler with shift", "euler"},
      {SAMPLER_UNIPC, "UniPC for flow matching (order 2, Wan 2.1's)", "unipc"},
      {SAMPLER_DDIM, "DDIM for v or epsilon prediction (CogVideoX-2b's)", "ddim"},
      {SAMPLER_DPM, "Stochastic DPM-Solver++(2M) for v or epsilon prediction (CogVideoX-5b's)", "dpm"},
      {0, nullptr, nullptr}};
  if (g_once_init_enter(&type)) g_once_init_leave(&type, g_enum_register_static("GstVideoGenSampler", values));
  return type;
}

GType gst_video_gen_format_get_type(void) {
  static GType type = 0;
  static const GEnumValue values[] = {
      {int(latent::gst::LatentFormat::F32), "float32: the sampler's own values, as diffusers' pipelines hand them on",
       "F32"},
      {int(latent::gst::LatentFormat::F16), "float16: half the bytes, rounded", "F16"},
      {int(latent::gst::LatentFormat::BF16), "bfloat16: half the bytes, rounded (~0.4%)", "BF16"},
      {0, nullptr, nullptr}};
  if (g_once_init_enter(&type)) g_once_init_leave(&type, g_enum_register_static("GstVideoGenFormat", values));
  return type;
}

namespace {

// The latent as a CPU tensor [C, h, w] in the wire format, owned by the buffer that wraps it.
GstBuffer* buffer_of(const latent::GeneratedFrame& frame, const LatentCapsInfo& caps) {
  torch::Tensor t = frame.latent[0].select(1, 0).to(torch::kCPU).to(caps.scalar_type()).contiguous();
  return latent::gst::buffer_wrapping_tensor(t);
}

void generate(GstVideoGen* self) {
  Impl& s = *self->impl;
  const int64_t calls_before = s.run->generator->model_calls();
  auto t0 = std::chrono::steady_clock::now();
  for (auto& f : s.run->generator->next()) s.pending.push_back(std::move(f));
  const auto took = std::chrono::steady_clock::now() - t0;
  const int64_t calls = s.run->generator->model_calls() - calls_before;
  s.calls += guint64(calls);
  if (calls > 0) {
    const auto per_call = took / calls;
    for (int64_t i = 0; i < calls; ++i) s.stats.add(per_call);
  }
  // A live sink must wait at most one step for a latent: the longest recent step bounds the latency.
  if (s.warm && gst_base_src_is_live(GST_BASE_SRC(self)) &&
      s.step_time.add(GstClockTime(std::chrono::duration_cast<std::chrono::nanoseconds>(took).count())))
    gst_element_post_message(GST_ELEMENT(self), gst_message_new_latency(GST_OBJECT(self)));
  s.warm = true;
}

// Running time now on the pipeline clock; 0 without one.
GstClockTime running_time_now(GstElement* element) {
  GstClock* clock = gst_element_get_clock(element);
  if (!clock) return 0;
  const GstClockTime now = gst_clock_get_time(clock), base = gst_element_get_base_time(element);
  gst_object_unref(clock);
  return now > base ? now - base : 0;
}

// Live: the latent's timestamp on the timeline of when latents exist (see LiveTimeline). A latent that exists
// after its time moves the timeline and says so: a QoS message each time, a warning once per run.
GstClockTime live_stamp(GstVideoGen* self, const LatentFrameStamp& stamp) {
  Impl& s = *self->impl;
  const GstClockTime now = running_time_now(GST_ELEMENT(self));
  if (GST_CLOCK_TIME_IS_VALID(s.first_request)) {
    const GstClockTime latency = now > s.first_request ? now - s.first_request : 0;
    GST_INFO_OBJECT(self, "first latent after %" GST_TIME_FORMAT, GST_TIME_ARGS(latency));
    gst_element_post_message(
        GST_ELEMENT(self),
        gst_message_new_element(GST_OBJECT(self), gst_structure_new("videogen-first-latent", "latency", G_TYPE_UINT64,
                                                                    guint64(latency), nullptr)));
    s.first_request = GST_CLOCK_TIME_NONE;
  }
  const latent::gst::LiveTimeline::Stamp st = s.timeline.stamp(stamp.pts, now);
  if (st.skipped > 0)
    GST_INFO_OBJECT(self, "a sink reported lateness: timestamps move %" GST_TIME_FORMAT " later",
                    GST_TIME_ARGS(st.skipped));
  if (st.late > 0) {
    GstMessage* qos = gst_message_new_qos(GST_OBJECT(self), TRUE, st.pts, stamp.pts, st.pts, stamp.duration);
    gst_message_set_qos_values(qos, GstClockTimeDiff(st.late), 1.0, 1000000);
    gst_message_set_qos_stats(qos, GST_FORMAT_BUFFERS, s.latents.load(), 0);
    gst_element_post_message(GST_ELEMENT(self), qos);
    if (!s.warned_late) {
      s.warned_late = true;
      GST_ELEMENT_WARNING(self, CORE, CLOCK,
                          ("Generation is slower than real time: a latent existed %.3f s after its time; timestamps "
                           "follow when latents exist from here on (QoS messages report each delay)",
                           double(st.late) / double(GST_SECOND)),
                          ("stream time %" GST_TIME_FORMAT, GST_TIME_ARGS(stamp.pts)));
    }
  }
  return st.pts;
}

// Tags the stream where a causal run's prompt switched, ahead of the first latent made under the new prompt.
// The first latent's prompt is the run's own: no tag (it would come before the segment).
void push_prompt_tag(GstVideoGen* self, const latent::GeneratedFrame& frame) {
  GST_INFO_OBJECT(self, "prompt %" G_GINT64_FORMAT " from latent %" G_GINT64_FORMAT ": %s", frame.prompt_index,
                  frame.index, frame.prompt_label.c_str());
  gst_pad_push_event(GST_BASE_SRC_PAD(self),
                     latent::gst::PromptControl::tag_event(frame.prompt_label, guint(frame.prompt_index)));
}

std::string doing(const Impl& s) { return s.run && s.run->generator ? s.run->generator->doing() : "generating"; }

GstFlowReturn create(GstPushSrc* push, GstBuffer** out) {
  auto* self = GST_VIDEO_GEN(push);
  Impl& s = *self->impl;
  if (!s.run) return GST_FLOW_FLUSHING;
  const bool live = gst_base_src_is_live(GST_BASE_SRC(self));
  if (live && s.emitted == 0 && !GST_CLOCK_TIME_IS_VALID(s.first_request))
    s.first_request = running_time_now(GST_ELEMENT(self));
  try {
    if (s.pending.empty()) {
      if (!s.run->generator || s.run->generator->finished()) return GST_FLOW_EOS;
      generate(self);
      if (s.pending.empty()) return GST_FLOW_EOS;
    }
    const latent::GeneratedFrame frame = std::move(s.pending.front());
    s.pending.pop_front();
    LatentFrameStamp stamp = latent::gst::stamp_for(*s.run, uint64_t(frame.index));
    if (live) stamp.pts = live_stamp(self, stamp);
    if (frame.prompt_switch && frame.index > 0) push_prompt_tag(self, frame);
    latent::gst::warn_once_if_non_finite(GST_ELEMENT(self), s.warned_non_finite, frame.latent, uint64_t(frame.index),
                                         stamp.pts,
                                         "the model (its weights, a LoRA) made values that decode to no picture");
    GstBuffer* buffer = buffer_of(frame, s.run->caps);
    latent::gst::apply_stamp(buffer, stamp);
    if (s.discont) {
      GST_BUFFER_FLAG_SET(buffer, GST_BUFFER_FLAG_DISCONT);
      s.discont = false;
    }
    s.emitted++;
    s.latents++;
    *out = buffer;
    return GST_FLOW_OK;
  } catch (const latent::Interrupted&) {
    // unlock(): a flush or a state change; the generator is as it was before the step.
    return GST_FLOW_FLUSHING;
  } catch (const std::exception& e) {
    latent::gst::post_exception(GST_ELEMENT(self), doing(s).c_str(), e);
  } catch (...) {
    latent::gst::post_exception(GST_ELEMENT(self), doing(s).c_str(),
                                std::runtime_error("an exception of unknown type"));
  }
  return GST_FLOW_ERROR;
}

// A state change or flush stops a generation in progress before its next model call, so going to READY or NULL
// waits for at most one call, never for a whole clip.
gboolean unlock(GstBaseSrc* base) {
  Impl& s = *GST_VIDEO_GEN(base)->impl;
  std::lock_guard<std::mutex> lock(s.run_lock);
  if (!s.run || !s.run->generator) return TRUE;
  // Ranks as processes step together: a rank interrupted mid-step leaves the others in an exchange it never
  // reaches. So only a stop (which ends the group's run, see stop()) cuts a step short; a live source's pause lets
  // it finish, and the group goes on when the pipeline plays again.
  if (s.run->generator->process_rank() && GST_STATE_TARGET(base) >= GST_STATE_PAUSED) return TRUE;
  s.run->generator->interrupt();
  return TRUE;
}

gboolean unlock_stop(GstBaseSrc* base) {
  Impl& s = *GST_VIDEO_GEN(base)->impl;
  std::lock_guard<std::mutex> lock(s.run_lock);
  if (s.run && s.run->generator) s.run->generator->clear_interrupt();
  return TRUE;
}

// The settings with the prompt as the properties give it now.
Settings settings_of(GstVideoGen* self) {
  Impl& s = *self->impl;
  GST_OBJECT_LOCK(self);
  Settings settings = s.settings;
  GST_OBJECT_UNLOCK(self);
  const latent::gst::PromptControl::Choice choice = s.prompts->choice();
  settings.prompt = choice.prompt;
  settings.prompt_embeds = choice.embeds;
  settings.text_device = choice.text_device;
  return settings;
}

// Runs the model folder's text encoder when the prompts (or where they are encoded) differ from those last
// encoded. Posts an ERROR message and returns false when it cannot.
bool encode_prompts(GstVideoGen* self, const Settings& s) {
  Impl& impl = *self->impl;
  if (!s.prompt || !impl.denoiser || impl.denoiser->spec().text_tokens == 0) return true;  // plan_run says why
  const std::optional<std::string> negative = latent::gst::negative_to_encode(impl.denoiser->spec(), s);
  const latent::TextEncoder::Options options = impl.prompts->encoder_options();
  std::vector<latent::gst::ScheduledPrompt> schedule;
  try {
    schedule = latent::gst::parse_prompt_schedule(s.prompt_schedule);
  } catch (const std::invalid_argument& e) {
    GST_ELEMENT_ERROR(self, RESOURCE, SETTINGS, ("%s", e.what()), (nullptr));
    return false;
  }
  const std::string key = *s.prompt + '\0' + (negative ? "+" + *negative : "-") + '\0' + options.device.str() + '\0' +
                          c10::toString(options.dtype) + '\0' + s.prompt_schedule;
  if (key == impl.encoded_key) return true;
  impl.encoded_key.clear();
  try {
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<std::string> texts{*s.prompt};
    if (negative) texts.push_back(*negative);
    for (const latent::gst::ScheduledPrompt& p : schedule) texts.push_back(p.text);
    std::vector<torch::Tensor> made = impl.prompts->encode(texts);
    impl.encoded = {made[0], negative ? made[1] : torch::Tensor()};
    impl.scheduled.assign(made.begin() + (negative ? 2 : 1), made.end());
    impl.encoded_key = key;
    GST_INFO_OBJECT(self, "encoded %s on %s as %s in %.2f s",
                    negative ? "the prompt and the negative prompt" : "the prompt", options.device.str().c_str(),
                    c10::toString(options.dtype),
                    std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    return true;
  } catch (const c10::OutOfMemoryError& e) {
    GST_ELEMENT_ERROR(self, RESOURCE, NO_SPACE_LEFT,
                      ("Out of memory encoding the prompt on %s: set text-device=cpu to encode it there",
                       options.device.str().c_str()),
                      ("%s", e.what()));
  } catch (const std::exception& e) {
    GST_ELEMENT_ERROR(self, RESOURCE, OPEN_READ, ("Cannot encode the prompt: %s", e.what()),
                      ("model %s", impl.model_path.c_str()));
  }
  return false;
}

void set_made_caps(GstVideoGen* self, GstCaps* caps) {
  GST_OBJECT_LOCK(self);
  gst_caps_replace(&self->impl->caps, caps);
  GST_OBJECT_UNLOCK(self);
}

gboolean start(GstBaseSrc* base) {
  auto* self = GST_VIDEO_GEN(base);
  Impl& s = *self->impl;
  const Settings settings = settings_of(self);
  if (!s.denoiser) {
    GST_ELEMENT_ERROR(self, CORE, STATE_CHANGE, ("No model loaded."), (nullptr));
    return FALSE;
  }
  if (!encode_prompts(self, settings)) return FALSE;
  try {
    Run run = latent::gst::plan_run(s.ranks, settings, settings.prompt ? &s.encoded : nullptr, s.model_path,
                                    GST_ELEMENT(self), settings.prompt ? s.scheduled : std::vector<torch::Tensor>{});
    if (!run.plan.empty()) GST_INFO_OBJECT(self, "%s", run.plan.c_str());
    std::lock_guard<std::mutex> lock(s.run_lock);
    s.run = std::move(run);
  } catch (const std::invalid_argument& e) {
    GST_ELEMENT_ERROR(self, RESOURCE, SETTINGS, ("Cannot generate with these settings: %s", e.what()),
                      ("model latent space %s", s.denoiser->spec().latent_space.c_str()));
    return FALSE;
  } catch (const std::exception& e) {
    GST_ELEMENT_ERROR(
        self, RESOURCE, OPEN_READ, ("Cannot read an input of the run: %s", e.what()),
        ("prompt-embeds '%s', initial-noise '%s'", settings.prompt_embeds.c_str(), settings.initial_noise.c_str()));
    return FALSE;
  }
  s.pending.clear();
  s.emitted = 0;
  s.discont = true;
  s.latents = s.calls = 0;
  s.stats.reset();
  s.step_time.reset();
  s.warm = false;
  s.timeline.reset();
  s.warned_late = false;
  s.warned_non_finite = false;
  s.first_request = GST_CLOCK_TIME_NONE;
  // Prompts set while playing switch a causal run; other runs read the properties at their next start.
  if (s.run->causal) s.prompts->start();
  GstCaps* made = s.run->caps.to_caps();
  set_made_caps(self, made);
  gst_caps_unref(made);
  // Nothing is generated here: READY->PAUSED returns at once and the model runs on the streaming thread, where
  // unlock() can stop it.
  GST_INFO_OBJECT(self, "generating %s: %" G_GUINT64_FORMAT " video frames (0: endless)",
                  s.run->caps.to_string().c_str(), s.run->video_frames);
  return TRUE;
}

gboolean stop(GstBaseSrc* base) {
  auto* self = GST_VIDEO_GEN(base);
  Impl& s = *self->impl;
  // Before run_lock: a delivery in progress takes it.
  s.prompts->stop();
  {
    std::lock_guard<std::mutex> lock(s.run_lock);
    if (s.run && s.run->generator) {
      s.calls = guint64(s.run->generator->model_calls());
      s.run->generator->leave("stopped before the end of the run (its pipeline left PAUSED)");
    }
    s.run.reset();
  }
  set_made_caps(self, nullptr);
  s.pending.clear();
  return TRUE;
}

// Everything in the caps is decided by the model and the properties; a downstream that wants something else
// gets told what this generator makes.
gboolean negotiate(GstBaseSrc* base) {
  auto* self = GST_VIDEO_GEN(base);
  Impl& s = *self->impl;
  if (!s.run) return FALSE;
  return latent::gst::negotiate_fixed_latents(base, s.run->caps, "The generator makes");
}

GstCaps* get_caps(GstBaseSrc* base, GstCaps* filter) {
  auto* self = GST_VIDEO_GEN(base);
  GST_OBJECT_LOCK(self);
  GstCaps* caps = self->impl->caps ? gst_caps_ref(self->impl->caps) : nullptr;
  GST_OBJECT_UNLOCK(self);
  if (!caps) caps = gst_pad_get_pad_template_caps(GST_BASE_SRC_PAD(base));
  if (filter) {
    GstCaps* both = gst_caps_intersect_full(filter, caps, GST_CAPS_INTERSECT_FIRST);
    gst_caps_unref(caps);
    caps = both;
  }
  return caps;
}

// Whether the run's generator is one process's rank of a group of processes (torchrun).
bool process_rank(Impl& s) {
  std::lock_guard<std::mutex> lock(s.run_lock);
  return s.run && s.run->generator && s.run->generator->process_rank();
}

gboolean is_seekable(GstBaseSrc* base) {
  return !gst_base_src_is_live(base) && !process_rank(*GST_VIDEO_GEN(base)->impl);
}

// Generation has no random access: a seek to the start replays the stream (same seed, same latents); any other
// position is refused here, before basesrc flushes, so a refused seek leaves the stream running as it was.
gboolean src_event(GstBaseSrc* base, GstEvent* event) {
  if (GST_EVENT_TYPE(event) == GST_EVENT_QOS && gst_base_src_is_live(base)) {
    Impl& s = *GST_VIDEO_GEN(base)->impl;
    GstQOSType type;
    gdouble proportion;
    GstClockTimeDiff diff;
    GstClockTime timestamp;
    gst_event_parse_qos(event, &type, &proportion, &diff, &timestamp);
    GST_OBJECT_LOCK(base);
    const GstClockTime max_lateness = s.max_lateness;
    GST_OBJECT_UNLOCK(base);
    s.timeline.sink_lateness(diff, timestamp, max_lateness);
  }
  if (GST_EVENT_TYPE(event) == GST_EVENT_SEEK) {
    GstFormat format;
    GstSeekType start_type, stop_type;
    gint64 start, stop;
    gst_event_parse_seek(event, nullptr, &format, nullptr, &start_type, &start, &stop_type, &stop);
    // A seek restarts this process's schedule alone: the others would go on, and their exchanges would no longer
    // match (fifo: other sizes; clip: other steps, silently wrong latents).
    if (process_rank(*GST_VIDEO_GEN(base)->impl)) {
      GST_ELEMENT_WARNING(base, RESOURCE, SEEK,
                          ("Seeking is not possible with ranks as processes (torchrun): the other processes would "
                           "not seek with this one. Restart the group to start over."),
                          ("refused a seek to %s %" G_GINT64_FORMAT, gst_format_get_name(format), start));
      return FALSE;
    }
    if (format != GST_FORMAT_TIME || start_type != GST_SEEK_TYPE_SET || start != 0) {
      GST_WARNING_OBJECT(base, "only a seek to the start is possible; refused one to %s %" G_GINT64_FORMAT,
                         gst_format_get_name(format), start);
      return FALSE;
    }
  }
  return GST_BASE_SRC_CLASS(gst_video_gen_parent_class)->event(base, event);
}

gboolean do_seek(GstBaseSrc* base, GstSegment* segment) {
  auto* self = GST_VIDEO_GEN(base);
  Impl& s = *self->impl;
  if (segment->format != GST_FORMAT_TIME || segment->start != 0) return FALSE;
  segment->time = 0;
  segment->position = 0;
  if (s.run && s.emitted > 0) {
    if (s.run->generator) s.run->generator->reset();
    s.pending.clear();
    s.emitted = 0;
    s.discont = true;
    s.warm = false;
  }
  return TRUE;
}

// basesrc waits on the clock until a live buffer's time, so a generator faster than real time plays in real time.
void get_times(GstBaseSrc* base, GstBuffer* buffer, GstClockTime* start, GstClockTime* end) {
  *start = *end = GST_CLOCK_TIME_NONE;
  if (!gst_base_src_is_live(base)) return;
  *start = GST_BUFFER_PTS(buffer);
  if (GST_CLOCK_TIME_IS_VALID(*start) && GST_BUFFER_DURATION_IS_VALID(buffer))
    *end = *start + GST_BUFFER_DURATION(buffer);
}

// Live: timestamps start when the first latent exists, so what a sink must allow for is one steady-state
// generator step (a bound over the recent ones), reposted when it changes.
gboolean query(GstBaseSrc* base, GstQuery* q) {
  Impl& s = *GST_VIDEO_GEN(base)->impl;
  if (GST_QUERY_TYPE(q) == GST_QUERY_LATENCY && gst_base_src_is_live(base)) {
    gst_query_set_latency(q, TRUE, s.step_time.announced(), GST_CLOCK_TIME_NONE);
    return TRUE;
  }
  return GST_BASE_SRC_CLASS(gst_video_gen_parent_class)->query(base, q);
}

GstStateChangeReturn change_state(GstElement* element, GstStateChange transition) {
  auto* self = GST_VIDEO_GEN(element);
  Impl& s = *self->impl;
  if (transition == GST_STATE_CHANGE_NULL_TO_READY) {
    static const latent::gst::DefaultModel generator{
        "generator", latent::find_default_generator,
        "a .pt2 package from tools/export_denoiser.py or latent-gen-small weights"};
    Settings settings = settings_of(self);
    // Under torchrun each process takes its own GPU, as torchrun's LOCAL_RANK says, unless a device is named: the
    // same rule as the VAE elements', so a process's transformer and VAE share its GPU.
    if (!latent::gst::place_on_local_rank(element, settings.model)) return GST_STATE_CHANGE_FAILURE;
    // One denoiser per device (ranks on one device share it), rank 0's first.
    bool loaded = true;
    std::map<std::string, std::shared_ptr<const latent::Denoiser>> by_device;
    s.ranks.clear();
    const auto per_rank = latent::gst::rank_settings(element, settings.model);
    loaded = !per_rank.empty();
    for (const latent::gst::ModelSettings& rank : per_rank) {
      auto& shared = by_device[rank.device];
      if (!shared)
        loaded = loaded && latent::gst::load_model(
                               element, rank, generator, [&](const std::string& path, const latent::LoadOptions& o) {
                                 shared = latent::load_denoiser(path, o, latent::gst::denoiser_files(settings));
                                 if (s.ranks.empty()) {
                                   s.model_path = path;
                                   s.model_options = o;
                                 }
                               });
      if (!loaded) break;
      s.ranks.push_back(shared);
    }
    if (loaded) {
      s.denoiser = s.ranks.front();
      const latent::DenoiserSpec& spec = s.denoiser->spec();
      try {
        s.prompts->attach({s.model_path, s.model_options, spec.text_tokens, spec.text_dim,
                           settings.schedule == int(latent::ScheduleKind::causal)});
      } catch (const std::exception& e) {
        GST_ELEMENT_ERROR(self, RESOURCE, NOT_FOUND, ("%s", e.what()),
                          ("text-device property: %s", settings.text_device.c_str()));
        loaded = false;
      }
    }
    // The prompt is encoded here so a missing or broken text encoder fails at READY, and again at the start of a
    // run only if the prompts changed meanwhile.
    if (!loaded || !encode_prompts(self, settings)) {
      s.denoiser.reset();
      s.ranks.clear();
      return GST_STATE_CHANGE_FAILURE;
    }
  }
  GstStateChangeReturn ret = GST_ELEMENT_CLASS(gst_video_gen_parent_class)->change_state(element, transition);
  if (transition == GST_STATE_CHANGE_READY_TO_NULL) {
    s.prompts->detach();
    s.denoiser.reset();
    s.ranks.clear();
    s.encoded = {};
    s.encoded_key.clear();
  }
  return ret;
}

// A string property where unset (NULL) differs from the empty string: an empty prompt is a prompt.
std::optional<std::string> optional_string(const GValue* value) {
  const gchar* v = g_value_get_string(value);
  return v ? std::optional<std::string>(v) : std::nullopt;
}

void set_property(GObject* object, guint id, const GValue* value, GParamSpec* pspec) {
  auto* self = GST_VIDEO_GEN(object);
  Settings& s = self->impl->settings;
  if (latent::gst::set_model_property(object, s.model, id, value)) return;
  if (self->impl->prompts->set_property(id, value, GST_STATE(self) >= GST_STATE_PAUSED)) return;
  if (id == PROP_IS_LIVE) {
    gst_base_src_set_live(GST_BASE_SRC(self), g_value_get_boolean(value));
    return;
  }
  GST_OBJECT_LOCK(self);
  switch (id) {
    case PROP_SCHEDULE: s.schedule = g_value_get_enum(value); break;
    case PROP_CHUNK_FRAMES: s.chunk_frames = g_value_get_uint(value); break;
    case PROP_KV_WINDOW: s.kv_window = g_value_get_uint(value); break;
    case PROP_SINK_FRAMES: s.sink_frames = g_value_get_uint(value); break;
    case PROP_GLOBAL_SINK: s.global_sink = g_value_get_boolean(value); break;
    case PROP_DENOISING_STEPS: s.denoising_steps = g_value_get_string(value) ? g_value_get_string(value) : ""; break;
    case PROP_CONTEXT_NOISE: s.context_noise = g_value_get_double(value); break;
    case PROP_WARP_DENOISING_STEPS: s.warp_denoising_steps = g_value_get_boolean(value); break;
    case PROP_PROMPT_SCHEDULE: s.prompt_schedule = g_value_get_string(value) ? g_value_get_string(value) : ""; break;
    case PROP_MAX_LATENESS: {
      const gint64 v = g_value_get_int64(value);
      self->impl->max_lateness = v < 0 ? GST_CLOCK_TIME_NONE : GstClockTime(v);
      break;
    }
    case PROP_SAMPLER: s.sampler = latent::gst::SamplerChoice(g_value_get_enum(value)); break;
    case PROP_STEPS: s.steps = g_value_get_uint(value); break;
    case PROP_SHIFT: s.shift = g_value_get_double(value); break;
    case PROP_GUIDANCE_SCALE: s.guidance = g_value_get_double(value); break;
    case PROP_SEED: s.seed = g_value_get_uint64(value); break;
    case PROP_NUM_FRAMES: s.num_frames = g_value_get_int64(value); break;
    case PROP_WIDTH: s.width = g_value_get_int(value); break;
    case PROP_HEIGHT: s.height = g_value_get_int(value); break;
    case PROP_FRAMERATE:
      s.framerate = {gst_value_get_fraction_numerator(value), gst_value_get_fraction_denominator(value)};
      break;
    case PROP_WINDOW: s.window = g_value_get_uint(value); break;
    case PROP_CONTEXT: s.context = g_value_get_int(value); break;
    case PROP_NEGATIVE_PROMPT: s.negative_prompt = optional_string(value); break;
    case PROP_INITIAL_NOISE: s.initial_noise = g_value_get_string(value) ? g_value_get_string(value) : ""; break;
    case PROP_GUIDANCE_SCALE_2: s.guidance_2 = g_value_get_double(value); break;
    case PROP_IMAGE: s.image = g_value_get_string(value) ? g_value_get_string(value) : ""; break;
    case PROP_TRANSFORMER_WEIGHTS:
      s.transformer_weights = g_value_get_string(value) ? g_value_get_string(value) : "";
      break;
    case PROP_LORA: s.lora = g_value_get_string(value) ? g_value_get_string(value) : ""; break;
    case PROP_LORA_2: s.lora_2 = g_value_get_string(value) ? g_value_get_string(value) : ""; break;
    case PROP_PARALLEL: s.parallel = g_value_get_string(value) ? g_value_get_string(value) : "auto"; break;
    case PROP_FORMAT: s.format = latent::gst::LatentFormat(g_value_get_enum(value)); break;
    default: G_OBJECT_WARN_INVALID_PROPERTY_ID(object, id, pspec); break;
  }
  GST_OBJECT_UNLOCK(self);
}

void get_property(GObject* object, guint id, GValue* value, GParamSpec* pspec) {
  auto* self = GST_VIDEO_GEN(object);
  Impl& impl = *self->impl;
  const Settings& s = impl.settings;
  if (latent::gst::get_model_property(object, s.model, id, value)) return;
  if (impl.prompts->get_property(id, value)) return;
  switch (id) {
    case PROP_IS_LIVE: g_value_set_boolean(value, gst_base_src_is_live(GST_BASE_SRC(self))); return;
    case PROP_LATENTS_OUT: g_value_set_uint64(value, impl.latents.load()); return;
    case PROP_MODEL_CALLS: {
      // Live during a step, so a long clip shows its progress.
      std::lock_guard<std::mutex> lock(impl.run_lock);
      const bool running = impl.run && impl.run->generator;
      g_value_set_uint64(value, running ? guint64(impl.run->generator->model_calls()) : impl.calls.load());
      return;
    }
    case PROP_MEAN_CALL_TIME: g_value_set_uint64(value, impl.stats.mean()); return;
    default: break;
  }
  GST_OBJECT_LOCK(self);
  switch (id) {
    case PROP_SCHEDULE: g_value_set_enum(value, s.schedule); break;
    case PROP_CHUNK_FRAMES: g_value_set_uint(value, s.chunk_frames); break;
    case PROP_KV_WINDOW: g_value_set_uint(value, s.kv_window); break;
    case PROP_SINK_FRAMES: g_value_set_uint(value, s.sink_frames); break;
    case PROP_GLOBAL_SINK: g_value_set_boolean(value, s.global_sink); break;
    case PROP_DENOISING_STEPS: g_value_set_string(value, s.denoising_steps.c_str()); break;
    case PROP_CONTEXT_NOISE: g_value_set_double(value, s.context_noise); break;
    case PROP_WARP_DENOISING_STEPS: g_value_set_boolean(value, s.warp_denoising_steps); break;
    case PROP_PROMPT_SCHEDULE:
      g_value_set_string(value, s.prompt_schedule.empty() ? nullptr : s.prompt_schedule.c_str());
      break;
    case PROP_MAX_LATENESS:
      g_value_set_int64(value, GST_CLOCK_TIME_IS_VALID(impl.max_lateness) ? gint64(impl.max_lateness) : -1);
      break;
    case PROP_SAMPLER: g_value_set_enum(value, s.sampler); break;
    case PROP_STEPS: g_value_set_uint(value, s.steps); break;
    case PROP_SHIFT: g_value_set_double(value, s.shift); break;
    case PROP_GUIDANCE_SCALE: g_value_set_double(value, s.guidance); break;
    case PROP_SEED: g_value_set_uint64(value, s.seed); break;
    case PROP_NUM_FRAMES: g_value_set_int64(value, s.num_frames); break;
    case PROP_WIDTH: g_value_set_int(value, s.width); break;
    case PROP_HEIGHT: g_value_set_int(value, s.height); break;
    case PROP_FRAMERATE: gst_value_set_fraction(value, s.framerate.num, s.framerate.den); break;
    case PROP_WINDOW: g_value_set_uint(value, s.window); break;
    case PROP_CONTEXT: g_value_set_int(value, s.context); break;
    case PROP_PARALLEL: g_value_set_string(value, s.parallel.c_str()); break;
    case PROP_FORMAT: g_value_set_enum(value, int(s.format)); break;
    case PROP_NEGATIVE_PROMPT:
      g_value_set_string(value, s.negative_prompt ? s.negative_prompt->c_str() : nullptr);
      break;
    case PROP_INITIAL_NOISE:
      g_value_set_string(value, s.initial_noise.empty() ? nullptr : s.initial_noise.c_str());
      break;
    case PROP_GUIDANCE_SCALE_2: g_value_set_double(value, s.guidance_2); break;
    case PROP_IMAGE: g_value_set_string(value, s.image.empty() ? nullptr : s.image.c_str()); break;
    case PROP_TRANSFORMER_WEIGHTS:
      g_value_set_string(value, s.transformer_weights.empty() ? nullptr : s.transformer_weights.c_str());
      break;
    case PROP_LORA: g_value_set_string(value, s.lora.empty() ? nullptr : s.lora.c_str()); break;
    case PROP_LORA_2: g_value_set_string(value, s.lora_2.empty() ? nullptr : s.lora_2.c_str()); break;
    case PROP_PROMPT_EMBEDS:
      g_value_set_string(value, s.prompt_embeds.empty() ? nullptr : s.prompt_embeds.c_str());
      break;
    default: G_OBJECT_WARN_INVALID_PROPERTY_ID(object, id, pspec); break;
  }
  GST_OBJECT_UNLOCK(self);
}

void finalize(GObject* object) {
  // First: its worker may still deliver to the run.
  GST_VIDEO_GEN(object)->impl->prompts.reset();
  gst_caps_replace(&GST_VIDEO_GEN(object)->impl->caps, nullptr);
  delete GST_VIDEO_GEN(object)->impl;
  G_OBJECT_CLASS(gst_video_gen_parent_class)->finalize(object);
}

void install_properties(GObjectClass* gobject) {
  latent::gst::install_model_properties(
      gobject,
      std::string("The video diffusion model (denoiser): a diffusers Wan 2.1, Wan 2.2 (TI2V-5B, A14B) or "
                  "CogVideoX pipeline folder (text encoder and transformer run natively, any size and frame count; "
                  "its transformer/ folder alone with prompt-embeds), a .pt2 package exported by "
                  "tools/export_denoiser.py, or latent-gen-small weights. A .pt2 package holds compiled "
                  "native code that runs in this process: load only packages you trust, as you would a "
                  "shared library. Unset: the embedded default generator, ") +
          latent::kDefaultGeneratorFile + " (small, unconditional, trained for demos and tests)");
  auto rw = GParamFlags(G_PARAM_READWRITE | G_PARAM_STATIC_STRINGS | GST_PARAM_MUTABLE_READY);
  auto ro = GParamFlags(G_PARAM_READABLE | G_PARAM_STATIC_STRINGS);
  g_object_class_install_property(
      gobject, PROP_SCHEDULE,
      g_param_spec_enum("schedule", "Schedule",
                        "How frames are denoised: clip (one window at once), fifo or rolling (endless, constant "
                        "memory); auto: fifo, or clip for a model with one timestep per call (CogVideoX)",
                        GST_TYPE_VIDEO_GEN_SCHEDULE, kScheduleAuto, rw));
  g_object_class_install_property(
      gobject, PROP_CHUNK_FRAMES,
      g_param_spec_uint("chunk-frames", "Chunk frames",
                        "schedule=causal: latent frames per block (3: Self-Forcing, CausVid, LongLive, Krea; 1: "
                        "StreamDiffusionV2)",
                        1, 1024, 3, rw));
  g_object_class_install_property(
      gobject, PROP_KV_WINDOW,
      g_param_spec_uint("kv-window", "KV window",
                        "schedule=causal: latent frames of keys and values a block sees, its own included "
                        "(LongLive: 12); 0: the model's trained clip (Wan: 21, Self-Forcing's whole cache). Bounds "
                        "the memory of an endless stream",
                        0, 1024, 0, rw));
  g_object_class_install_property(
      gobject, PROP_SINK_FRAMES,
      g_param_spec_uint("sink-frames", "Sink frames",
                        "schedule=causal: the stream's first latent frames, kept in the window forever (the "
                        "attention sink; LongLive: 3)",
                        0, 1023, 0, rw));
  g_object_class_install_property(
      gobject, PROP_GLOBAL_SINK,
      g_param_spec_boolean("global-sink", "Global sink",
                           "schedule=causal: a prompt switch past the window keeps the sink made under the old "
                           "prompt (LongLive's default); false makes it again under the new one",
                           TRUE, rw));
  g_object_class_install_property(
      gobject, PROP_DENOISING_STEPS,
      g_param_spec_string("denoising-steps", "Denoising steps",
                          "schedule=causal: the few steps of each block on the 1000-step grid, warped through the "
                          "flow schedule of shift 5 (set shift to change it; CausVid: shift=8)",
                          "1000,750,500,250", rw));
  g_object_class_install_property(
      gobject, PROP_WARP_DENOISING_STEPS,
      g_param_spec_boolean("warp-denoising-steps", "Warp denoising steps",
                           "schedule=causal: take denoising-steps through the shifted flow schedule (Self-Forcing, "
                           "LongLive, Krea, CausVid's 4-step model); false: the steps are the timesteps themselves "
                           "(CausVid's 3-step model: 1000,757,522 with shift=8)",
                           TRUE, rw));
  g_object_class_install_property(
      gobject, PROP_CONTEXT_NOISE,
      g_param_spec_double("context-noise", "Context noise",
                          "schedule=causal: the timestep at which each block's clean latents are cached for the "
                          "blocks after it",
                          0.0, 1000.0, 0.0, rw));
  g_object_class_install_property(
      gobject, PROP_PROMPT_SCHEDULE,
      g_param_spec_string("prompt-schedule", "Prompt schedule",
                          "schedule=causal: \"N:TEXT|N:TEXT\", the prompt from latent frame N on (a frame inside a "
                          "block takes effect at the next block); encoded with prompt at the start. \"||\" is a "
                          "'|' of a prompt",
                          nullptr, rw));
  g_object_class_install_property(
      gobject, PROP_MAX_LATENESS,
      g_param_spec_int64("max-lateness", "Max lateness",
                         "is-live: when a sink reports latents later than this (ns), the timestamps move later by "
                         "that much, so the stream skips time instead of building a backlog; -1: never",
                         -1, G_MAXINT64, gint64(40 * GST_MSECOND), rw));
  g_object_class_install_property(
      gobject, PROP_SAMPLER,
      g_param_spec_enum("sampler", "Sampler", "The sampler; default takes the one the model's file recommends",
                        GST_TYPE_VIDEO_GEN_SAMPLER, SAMPLER_DEFAULT, rw));
  g_object_class_install_property(
      gobject, PROP_STEPS,
      g_param_spec_uint("steps", "Steps",
                        "Denoising steps per frame; 0 takes the model's. With fifo also the queue length", 0, 1000, 0,
                        rw));
  g_object_class_install_property(
      gobject, PROP_SHIFT,
      g_param_spec_double("shift", "Shift", "Flow-matching timestep shift; 0 takes the model's", 0.0, 1000.0, 0.0, rw));
  g_object_class_install_property(
      gobject, PROP_GUIDANCE_SCALE,
      g_param_spec_double("guidance-scale", "Guidance scale",
                          "Classifier-free guidance: above 1, each step also runs the negative prompt (1 or less: the "
                          "prompt alone, as in diffusers); -1 takes the model's recommendation",
                          -1.0, 100.0, kModelGuidance, rw));
  g_object_class_install_property(gobject, PROP_SEED,
                                  g_param_spec_uint64("seed", "Seed",
                                                      "Seed of the noise; the same seed gives the same latents on "
                                                      "every device",
                                                      0, G_MAXUINT64, 0, rw));
  g_object_class_install_property(
      gobject, PROP_NUM_FRAMES,
      g_param_spec_int64("num-frames", "Number of frames",
                         "Video frames to generate, then EOS (the last latent's offsets say how many of its frames "
                         "are real, so vaedecode gives exactly this many); -1: endless (fifo, rolling) or one "
                         "window (clip)",
                         -1, G_MAXINT64, -1, rw));
  g_object_class_install_property(
      gobject, PROP_WIDTH,
      g_param_spec_int("width", "Width", "Video width in pixels; 0 takes the model's size", 0, 65536, 0, rw));
  g_object_class_install_property(
      gobject, PROP_HEIGHT,
      g_param_spec_int("height", "Height", "Video height in pixels; 0 takes the model's size", 0, 65536, 0, rw));
  g_object_class_install_property(
      gobject, PROP_FRAMERATE,
      gst_param_spec_fraction("framerate", "Frame rate", "Video frame rate of the generated stream", 1, 1000, 1000, 1,
                              16, 1, rw));
  g_object_class_install_property(
      gobject, PROP_WINDOW,
      g_param_spec_uint("window", "Window", "Latent frames per model call; 0 takes the model's", 0, 4096, 0, rw));
  g_object_class_install_property(
      gobject, PROP_CONTEXT,
      g_param_spec_int("context", "Context",
                       "rolling: clean latent frames carried into each window; -1: a quarter of the window (at "
                       "least 1)",
                       -1, 4095, kAutoContext, rw));
  latent::gst::PromptControl::install_properties(
      gobject, {PROP_PROMPT, PROP_PROMPT_EMBEDS, PROP_TEXT_DEVICE},
      "What to generate, for a model given as a diffusers pipeline folder: its text encoder encodes it once (then "
      "its weights are freed) and the embeddings condition every frame. schedule=causal: set while playing, it is "
      "encoded aside by the encoder kept loaded (text-device) and the stream switches to it at the next block start "
      "(LongLive's KV re-cache; a latent-prompt tag marks where); a seek to the start keeps it",
      "Instead of prompt: a safetensors file with tensor prompt_embeds [1, L, D] (and negative_prompt_embeds for "
      "guidance), e.g. from latent-prompt or for a .pt2 model. schedule=causal: tensors prompt_embeds@N switch to "
      "their prompt at latent frame N, and setting the property while playing switches at the next block (a file "
      "that cannot be read, or of the wrong shape, is a warning and the stream goes on)");
  g_object_class_install_property(
      gobject, PROP_NEGATIVE_PROMPT,
      g_param_spec_string("negative-prompt", "Negative prompt",
                          "What to steer away from with classifier-free guidance (guidance-scale above 1); unset: "
                          "the empty prompt, as diffusers' pipelines do",
                          nullptr, rw));
  g_object_class_install_property(
      gobject, PROP_INITIAL_NOISE,
      g_param_spec_string("initial-noise", "Initial noise",
                          "schedule=clip: a safetensors file with one tensor, the starting latents in the layout of "
                          "the family's diffusers pipeline latents= argument (Wan [1, C, T, h, w], CogVideoX [1, T, "
                          "C, h, w]), to reproduce another implementation's run exactly; unset: noise from seed",
                          nullptr, rw));
  g_object_class_install_property(
      gobject, PROP_GUIDANCE_SCALE_2,
      g_param_spec_double("guidance-scale-2", "Guidance scale 2",
                          "Wan 2.2 A14B: the guidance of the low-noise expert (transformer_2), which runs the steps "
                          "below the folder's boundary_ratio; -1: the same as guidance-scale. Guidance is on or off "
                          "by guidance-scale alone (> 1), as in diffusers",
                          -1.0, 100.0, -1.0, rw));
  g_object_class_install_property(
      gobject, PROP_IMAGE,
      g_param_spec_string("image", "Image",
                          "Image to video (Wan 2.2 TI2V folders): a still PNG or JPEG file (at most 16384 pixels a "
                          "side, 64 megapixels), scaled to width x height (Lanczos), encoded by the folder's VAE as "
                          "the clip's first frame, which "
                          "every step keeps clean; the clip schedule",
                          nullptr, rw));
  g_object_class_install_property(
      gobject, PROP_TRANSFORMER_WEIGHTS,
      g_param_spec_string("transformer-weights", "Transformer weights",
                          "Wan folders: weights in place of the transformer's, the folder's config describing the "
                          "network: diffusers or Wan-AI's original names, safetensors (single or sharded with its "
                          ".index.json) or a torch checkpoint (.pt/.pth: the state dict, or one under generator_ema, "
                          "generator or state_dict; read without running pickle code); read at NULL->READY",
                          nullptr, rw));
  g_object_class_install_property(
      gobject, PROP_LORA,
      g_param_spec_string("lora", "LoRA",
                          "Wan folders: LoRAs merged into the transformer at load, \"FILE:SCALE[,FILE:SCALE...]\" "
                          "(SCALE optional, 1): diffusers/PEFT files or the original Wan format (lora_down/lora_up, "
                          "alpha, diff_b), recognised by their keys; read at NULL->READY",
                          nullptr, rw));
  g_object_class_install_property(
      gobject, PROP_LORA_2,
      g_param_spec_string("lora-2", "LoRA 2",
                          "Wan 2.2 A14B: LoRAs for the second (low-noise) expert, transformer_2, as lora", nullptr,
                          rw));
  latent::gst::install_parallel_properties(
      gobject,
      "Generates one stream on several devices: a comma-separated list, one rank per entry, each with its own copy "
      "of the model; the ranks share each step's model calls as the parallel property says and every rank holds "
      "the same latents, which leave from the first device",
      "videogen model=/models/Wan2.1-T2V-14B-Diffusers prompt=\"a red fox\" devices=cuda:0,cuda:1,cuda:2,cuda:3 "
      "parallel=cfg=2,ulysses=2 schedule=clip num-frames=81 ! vaedecode devices=cuda:0,cuda:1 ! ...");
  g_object_class_install_property(
      gobject, PROP_PARALLEL,
      g_param_spec_string(
          "parallel", "Parallel plan",
          "With devices: how the ranks share the work, cfg=N,ulysses=N,partitions=N (their product = the number of "
          "devices): cfg=2 puts the prompt's and the negative prompt's model calls on different ranks, ulysses=N "
          "splits each call's tokens over N ranks (N divides the model's attention heads), partitions=N spreads "
          "fifo's per-step model calls over N ranks. Exact: the latents equal one device's. auto: cfg 2 when "
          "guidance is on, then partitions (fifo) or ulysses; the log says what was chosen",
          "auto", rw));
  g_object_class_install_property(
      gobject, PROP_FORMAT,
      g_param_spec_enum("format", "Latent format",
                        "The latents' format on the wire (the caps' format). The sampler works in float32 whatever "
                        "dtype the model computes in, and F32 hands its result on unrounded, as diffusers' "
                        "pipelines give their VAE; F16 or BF16 halve the bytes at the cost of rounding",
                        GST_TYPE_VIDEO_GEN_FORMAT, int(latent::gst::LatentFormat::F32), rw));
  g_object_class_install_property(
      gobject, PROP_IS_LIVE,
      g_param_spec_boolean("is-live", "Is live",
                           "Act as a live source: timestamps start at the running time the first latent is ready, "
                           "buffers go out at their time on the clock, and the latency is a bound on the measured "
                           "time of one generator step (reposted as it changes)",
                           FALSE, rw));
  g_object_class_install_property(
      gobject, PROP_LATENTS_OUT,
      g_param_spec_uint64("latents-out", "Latents out", "Latent frames pushed since READY->PAUSED", 0, G_MAXUINT64, 0,
                          ro));
  g_object_class_install_property(
      gobject, PROP_MODEL_CALLS,
      g_param_spec_uint64("model-calls", "Model calls", "Denoiser calls since READY->PAUSED", 0, G_MAXUINT64, 0, ro));
  g_object_class_install_property(
      gobject, PROP_MEAN_CALL_TIME,
      g_param_spec_uint64("mean-call-time", "Mean call time", "Mean time of one denoiser call, in nanoseconds", 0,
                          G_MAXUINT64, 0, ro));
}

}  // namespace

static void gst_video_gen_class_init(GstVideoGenClass* klass) {
  auto* gobject = G_OBJECT_CLASS(klass);
  auto* element = GST_ELEMENT_CLASS(klass);
  auto* base = GST_BASE_SRC_CLASS(klass);
  gobject->set_property = set_property;
  gobject->get_property = get_property;
  gobject->finalize = finalize;
  element->change_state = change_state;
  install_properties(gobject);
  latent::gst::PromptControl::register_tags();

  GstCaps* caps = gst_caps_from_string(latent::gst::latent_template_caps_string().c_str());
  gst_element_class_add_pad_template(element, gst_pad_template_new("src", GST_PAD_SRC, GST_PAD_ALWAYS, caps));
  gst_caps_unref(caps);
  gst_element_class_set_static_metadata(
      element, "Latent video generator", "Source/Video",
      "Generates video as latent frames (video/x-latent) with a video diffusion model, endless or num-frames long, "
      "in constant memory: fifo and rolling schedules hand out each latent as it becomes final. The caps name the "
      "VAE whose latents the model makes, so only the matching vaedecode accepts them. One latent per buffer with "
      "PTS, duration and OFFSET/OFFSET_END (the video frames it stands for); the same seed gives the same stream. "
      "Examples: gst-launch-1.0 videogen num-frames=81 ! vaedecode ! videoconvert ! autovideosink | "
      "gst-launch-1.0 videogen num-frames=161 seed=7 ! latentfilesink location=gen.safetensors | "
      "gst-launch-1.0 videogen model=/models/Wan2.1-T2V-1.3B-Diffusers prompt=\"a red fox running through snow\" "
      "schedule=clip num-frames=33 ! vaedecode model=/models/Wan2.1-T2V-1.3B-Diffusers/vae ! videoconvert ! x264enc ! "
      "mp4mux ! filesink location=fox.mp4",
      "gst-latent");

  base->start = GST_DEBUG_FUNCPTR(start);
  base->stop = GST_DEBUG_FUNCPTR(stop);
  base->negotiate = GST_DEBUG_FUNCPTR(negotiate);
  base->get_caps = GST_DEBUG_FUNCPTR(get_caps);
  base->is_seekable = GST_DEBUG_FUNCPTR(is_seekable);
  base->event = GST_DEBUG_FUNCPTR(src_event);
  base->do_seek = GST_DEBUG_FUNCPTR(do_seek);
  base->get_times = GST_DEBUG_FUNCPTR(get_times);
  base->query = GST_DEBUG_FUNCPTR(query);
  base->unlock = GST_DEBUG_FUNCPTR(unlock);
  base->unlock_stop = GST_DEBUG_FUNCPTR(unlock_stop);
  gst_type_mark_as_plugin_api(GST_TYPE_VIDEO_GEN_SCHEDULE, GstPluginAPIFlags(0));
  gst_type_mark_as_plugin_api(GST_TYPE_VIDEO_GEN_SAMPLER, GstPluginAPIFlags(0));
  gst_type_mark_as_plugin_api(GST_TYPE_VIDEO_GEN_FORMAT, GstPluginAPIFlags(0));
  GST_PUSH_SRC_CLASS(klass)->create = GST_DEBUG_FUNCPTR(create);
}

static void gst_video_gen_init(GstVideoGen* self) {
  self->impl = new Impl();
  Impl& impl = *self->impl;
  impl.prompts = std::make_unique<latent::gst::PromptControl>(
      GST_ELEMENT(self), latent::gst::PromptControl::PropertyIds{PROP_PROMPT, PROP_PROMPT_EMBEDS, PROP_TEXT_DEVICE},
      [self, &impl](const latent::gst::PromptControl::Switched& p) {
        try {
          std::lock_guard<std::mutex> lock(impl.run_lock);
          if (impl.run && impl.run->generator) impl.run->generator->switch_prompt(p.embeddings, p.label);
        } catch (const std::exception& e) {
          GST_ELEMENT_WARNING(self, RESOURCE, SETTINGS,
                              ("Cannot switch to the prompt \"%s\": %s", p.label.c_str(), e.what()), (nullptr));
        }
      });
  gst_base_src_set_format(GST_BASE_SRC(self), GST_FORMAT_TIME);
}
