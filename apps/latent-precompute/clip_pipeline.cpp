#include "clip_pipeline.h"

#include <gst/gst.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <memory>
#include <mutex>
#include <numeric>

namespace latent::precompute {
namespace {

struct Unref {
  void operator()(gpointer p) const { gst_object_unref(p); }
};
using ObjectPtr = std::unique_ptr<GstElement, Unref>;

// Decides which decoded frames reach the encoder: those of the clip's time range (frames before its start are
// dropped) up to max_frames. Past the end the clip ends there: the encoder gets EOS (it encodes its pending
// frames and the sink commits) and upstream is told EOS, so the decoder stops reading. Cutting by timestamp
// rather than seeking works for every container, seekable or not, and cuts at exact frames.
struct FrameGate {
  GstClockTime start = 0, end = GST_CLOCK_TIME_NONE;
  uint64_t max = 0;
  uint64_t passed = 0;  // the streaming thread only
  bool ended = false;
};

GstPadProbeReturn gate_frames(GstPad* pad, GstPadProbeInfo* info, gpointer data) {
  auto* gate = static_cast<FrameGate*>(data);
  const GstClockTime pts = GST_BUFFER_PTS(GST_PAD_PROBE_INFO_BUFFER(info));
  if (!gate->ended && GST_CLOCK_TIME_IS_VALID(pts) && pts < gate->start) return GST_PAD_PROBE_DROP;
  const bool past_end = GST_CLOCK_TIME_IS_VALID(pts) && GST_CLOCK_TIME_IS_VALID(gate->end) && pts >= gate->end;
  if (!gate->ended && (past_end || (gate->max > 0 && gate->passed >= gate->max))) {
    gate->ended = true;
    gst_pad_send_event(pad, gst_event_new_eos());
  }
  if (gate->ended) {
    // HANDLED hands the buffer to the probe, which must free it; DROP would answer upstream with OK and the
    // decoder would go on reading the whole file.
    gst_buffer_unref(GST_PAD_PROBE_INFO_BUFFER(info));
    GST_PAD_PROBE_INFO_DATA(info) = nullptr;
    GST_PAD_PROBE_INFO_FLOW_RETURN(info) = GST_FLOW_EOS;
    return GST_PAD_PROBE_HANDLED;
  }
  ++gate->passed;
  return GST_PAD_PROBE_OK;
}

// Seeking near a clip's start, so a clip late in a long video does not cost decoding the whole prefix. The gate
// above stays the exact cut; the seek only skips frames it would drop, and the frames that reach the encoder
// are the ones decoding from the start gives, bit for bit:
// - the seek is ACCURATE: the demuxer starts at the keyframe before the target and the decoder drops what lies
//   before it, so every frame after the target decodes as from the start;
// - videorate stamps its output on a grid that starts at its segment's start (start + n / rate, rounded down to
//   ns). The target is a grid point whose time is exact in ns, so the grid after the seek is the same grid;
// - it lies a margin before the clip's start, so videorate has the frames around its first slot in the clip;
// - the segment after the seek is given back the fields of the first one (its stop decides how videorate closes
//   the stream), with only its start moved to the target.
// A source that cannot seek, a variable frame rate (videorate guesses it from the first frames it sees), or a
// demuxer that lands after the target decode from the start, cut by the gate alone.
constexpr GstClockTime kSeekMargin = GST_SECOND;

enum class SeekState {
  kFirstFrame,   // waiting for the first decoded frame, which is held until the seek is decided
  kDeciding,     // the application thread decides (it alone may send a flushing seek)
  kSeeking,      // the seek is sent; its FLUSH_STOP is awaited
  kFlushed,      // the next segment is the seek's
  kBack,         // the seek landed after its target: seeking back to the start
  kBackFlushed,  // the next segment is the seek back's
  kDone,         // frames flow
  kFailed,       // not even the seek back worked: the clip fails
};

struct SeekPlan {
  std::mutex mu;
  SeekState state = SeekState::kFirstFrame;
  GstElement* pipeline = nullptr;
  GstPad* pad = nullptr;  // videoconvert's sink: the first pad after decodebin
  gulong block = 0;
  bool block_removed = false;
  GstClockTime clip_start = 0, first_pts = GST_CLOCK_TIME_NONE, target = GST_CLOCK_TIME_NONE, step = 0;
  GstSegment first{};  // the segment before any seek: the grid's origin, and what the stream is made to see again
  std::string note, failure;
  std::atomic<uint64_t> before{0};
};

constexpr const char* kSeekMessage = "latent-precompute-seek";

std::string seconds_text(GstClockTime t) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3f s", double(t) / GST_SECOND);
  return buf;
}

// Whoever claims the hold releases it: the streaming thread by returning REMOVE, the application by removing the
// probe. Called with `plan.mu` held.
bool claim_hold(SeekPlan& plan) {
  if (plan.block_removed) return false;
  plan.block_removed = true;
  return true;
}

// Wakes the application thread's on_seek_message.
void post_seek_message(SeekPlan& plan) {
  gst_element_post_message(
      plan.pipeline, gst_message_new_application(GST_OBJECT(plan.pipeline), gst_structure_new_empty(kSeekMessage)));
}

GstPadProbeReturn hold_first_frame(GstPad*, GstPadProbeInfo* info, gpointer data) {
  auto* plan = static_cast<SeekPlan*>(data);
  std::lock_guard<std::mutex> lock(plan->mu);
  if (plan->state == SeekState::kFirstFrame) {
    plan->first_pts = GST_BUFFER_PTS(GST_PAD_PROBE_INFO_BUFFER(info));
    plan->state = SeekState::kDeciding;
    post_seek_message(*plan);
  }
  if (plan->state == SeekState::kDone && claim_hold(*plan)) return GST_PAD_PROBE_REMOVE;
  return GST_PAD_PROBE_OK;  // held
}

// The segment the stream sees after the seek: the first segment with its start moved to `start`, a grid point.
GstEvent* moved_segment(const SeekPlan& plan, GstClockTime start, guint32 seqnum) {
  GstSegment seg = plan.first;
  seg.time += start - seg.start;
  seg.start = seg.position = start;
  GstEvent* e = gst_event_new_segment(&seg);
  gst_event_set_seqnum(e, seqnum);
  return e;
}

GstPadProbeReturn follow_seek(GstPad*, GstPadProbeInfo* info, gpointer data) {
  auto* plan = static_cast<SeekPlan*>(data);
  GstEvent* event = GST_PAD_PROBE_INFO_EVENT(info);
  std::lock_guard<std::mutex> lock(plan->mu);
  if (GST_EVENT_TYPE(event) == GST_EVENT_FLUSH_STOP) {
    if (plan->state == SeekState::kSeeking) plan->state = SeekState::kFlushed;
    if (plan->state == SeekState::kBack) plan->state = SeekState::kBackFlushed;
    return GST_PAD_PROBE_OK;
  }
  if (GST_EVENT_TYPE(event) != GST_EVENT_SEGMENT ||
      (plan->state != SeekState::kFlushed && plan->state != SeekState::kBackFlushed))
    return GST_PAD_PROBE_OK;
  const GstSegment* seg;
  gst_event_parse_segment(event, &seg);
  const bool plain = seg->format == GST_FORMAT_TIME && seg->rate == 1.0 && seg->applied_rate == 1.0;
  GstClockTime start = GST_CLOCK_TIME_NONE;
  if (plan->state == SeekState::kFlushed) {
    if (plain && seg->start >= plan->first.start && seg->start <= plan->target) {
      // A demuxer that snapped to a keyframe before the target lands off the grid: start at the grid point
      // before it (videorate repeats its first frame up to there, all before the clip).
      start = plan->first.start + (seg->start - plan->first.start) / plan->step * plan->step;
      plan->note = "seek to " + seconds_text(plan->target) + ", landed at " + seconds_text(seg->start);
    } else {
      plan->state = SeekState::kBack;
      plan->note = "a seek to " + seconds_text(plan->target) + " landed at " + seconds_text(seg->start) +
                   "; decoded from the start";
      post_seek_message(*plan);
      return GST_PAD_PROBE_OK;  // the frames that follow are held until the seek back flushes them
    }
  } else if (plain && seg->start == plan->first.start) {
    start = plan->first.start;
  } else {
    plan->state = SeekState::kFailed;
    plan->failure = "the source did not seek back to its start after a seek past the clip's start; try --no-seek";
    post_seek_message(*plan);
    return GST_PAD_PROBE_OK;
  }
  plan->state = SeekState::kDone;
  GST_PAD_PROBE_INFO_DATA(info) = moved_segment(*plan, start, gst_event_get_seqnum(event));
  gst_event_unref(event);
  return GST_PAD_PROBE_OK;
}

GstPadProbeReturn count_before_start(GstPad*, GstPadProbeInfo* info, gpointer data) {
  auto* plan = static_cast<SeekPlan*>(data);
  const GstClockTime pts = GST_BUFFER_PTS(GST_PAD_PROBE_INFO_BUFFER(info));
  if (GST_CLOCK_TIME_IS_VALID(pts) && pts < plan->clip_start) plan->before++;
  return GST_PAD_PROBE_OK;
}

// The exact grid step of a frame rate: the shortest whole number of frame periods that is a whole number of ns.
GstClockTime exact_step(gint num, gint den) {
  const uint64_t period = uint64_t(den) * GST_SECOND;  // num frames take `period` ns
  return period / std::gcd(uint64_t(num), period);
}

// Why the clip cannot seek, or "" with plan.target and plan.step set. Called with plan.mu held.
std::string seek_target(SeekPlan& plan, GstElement* rate_filter) {
  if (!GST_CLOCK_TIME_IS_VALID(plan.first_pts)) return "no seek: frames without timestamps";
  GstEvent* sticky = gst_pad_get_sticky_event(plan.pad, GST_EVENT_SEGMENT, 0);
  if (!sticky) return "no seek: no segment";
  gst_event_copy_segment(sticky, &plan.first);
  gst_event_unref(sticky);
  if (plan.first.format != GST_FORMAT_TIME || plan.first.rate != 1.0 || plan.first.applied_rate != 1.0)
    return "no seek: not a plain time segment";
  // The rate videorate writes, as negotiated: the --fps asked for, else the source's.
  GstPad* rate_pad = gst_element_get_static_pad(rate_filter, "sink");
  GstCaps* caps = gst_pad_get_current_caps(rate_pad);
  gst_object_unref(rate_pad);
  gint num = 0, den = 0;
  if (caps) {
    gst_structure_get_fraction(gst_caps_get_structure(caps, 0), "framerate", &num, &den);
    gst_caps_unref(caps);
  }
  if (num <= 0 || den <= 0) return "no seek: variable frame rate";
  plan.step = exact_step(num, den);
  if (plan.clip_start < plan.first.start + kSeekMargin + plan.step)
    return "no seek: the clip starts near the video's start";
  const GstClockTime target =
      plan.first.start + (plan.clip_start - kSeekMargin - plan.first.start) / plan.step * plan.step;
  if (target <= plan.first_pts)
    return "no seek: the clip starts near the first frame";
  GstQuery* q = gst_query_new_seeking(GST_FORMAT_TIME);
  gboolean seekable = FALSE;
  if (gst_pad_peer_query(plan.pad, q)) gst_query_parse_seeking(q, nullptr, &seekable, nullptr, nullptr);
  gst_query_unref(q);
  if (!seekable) return "no seek: the source cannot seek";
  plan.target = target;
  return "";
}

// A flushing ACCURATE seek, sent upstream from the application thread, to `position` in the first segment's time.
bool send_seek(SeekPlan& plan, GstClockTime position) {
  const gint64 stream_time = gst_segment_to_stream_time(&plan.first, GST_FORMAT_TIME, position);
  if (stream_time < 0) return false;
  return gst_pad_push_event(
      plan.pad, gst_event_new_seek(1.0, GST_FORMAT_TIME, GstSeekFlags(GST_SEEK_FLAG_FLUSH | GST_SEEK_FLAG_ACCURATE),
                                   GST_SEEK_TYPE_SET, stream_time, GST_SEEK_TYPE_NONE, -1));
}

// Lets the held frames go on from where they are: decoding from the start, cut by the gate alone.
void release_hold(SeekPlan& plan, std::unique_lock<std::mutex>& lock) {
  plan.state = SeekState::kDone;
  const bool mine = claim_hold(plan);
  lock.unlock();
  if (mine) gst_pad_remove_probe(plan.pad, plan.block);
}

// The application thread's part, at each seek message.
void on_seek_message(SeekPlan& plan, GstElement* rate_filter) {
  std::unique_lock<std::mutex> lock(plan.mu);
  if (plan.state == SeekState::kDeciding) {
    plan.note = seek_target(plan, rate_filter);
    if (!plan.note.empty()) return release_hold(plan, lock);
    plan.state = SeekState::kSeeking;
    const GstClockTime target = plan.target;
    lock.unlock();
    const bool sent = send_seek(plan, target);
    lock.lock();
    // A flushing seek flushes before it returns; without a flush the held frame is still the first one, and the
    // stream goes on from it.
    if (plan.state == SeekState::kSeeking) {
      plan.note = sent ? "no seek: the source took the seek without flushing" : "no seek: the source refused it";
      release_hold(plan, lock);
    }
  } else if (plan.state == SeekState::kBack) {
    lock.unlock();
    const bool sent = send_seek(plan, plan.first.start);
    lock.lock();
    if (plan.state == SeekState::kBack) {
      plan.state = SeekState::kFailed;
      plan.failure = std::string("the source ") + (sent ? "did not flush" : "refused") +
                     " when seeking back to its start after a seek past the clip's start; try --no-seek";
    }
  }
}

std::string bus_error(GstMessage* msg) {
  GError* err = nullptr;
  gchar* dbg = nullptr;
  gst_message_parse_error(msg, &err, &dbg);
  std::string text = std::string(GST_OBJECT_NAME(GST_MESSAGE_SRC(msg))) + ": " + (err ? err->message : "error");
  g_clear_error(&err);
  g_free(dbg);
  return text;
}

// Waits for EOS or ERROR; a committed file is announced by latentfilesink's element message. `on_application`
// answers the pipeline's application messages (the seek) on this thread.
bool wait(GstElement* pipeline, double timeout, ClipResult& r, const std::function<std::string()>& on_application) {
  GstBus* bus = gst_element_get_bus(pipeline);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout);
  bool ok = false;
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::nanoseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      r.reason = "timed out after " + std::to_string(int(timeout)) + " s";
      break;
    }
    GstMessage* msg = gst_bus_timed_pop_filtered(
        bus, GstClockTime(left.count()),
        GstMessageType(GST_MESSAGE_EOS | GST_MESSAGE_ERROR | GST_MESSAGE_ELEMENT | GST_MESSAGE_APPLICATION));
    if (!msg) continue;
    const GstMessageType type = GST_MESSAGE_TYPE(msg);
    if (type == GST_MESSAGE_APPLICATION) {
      gst_message_unref(msg);
      r.reason = on_application();
      if (r.reason.empty()) continue;
      break;
    }
    if (type == GST_MESSAGE_ERROR) {
      r.reason = bus_error(msg);
    } else if (type == GST_MESSAGE_ELEMENT) {
      const GstStructure* s = gst_message_get_structure(msg);
      if (s && gst_structure_has_name(s, "latentfilesink-committed")) {
        guint64 latents = 0, frames = 0;
        gst_structure_get_uint64(s, "latent-frames", &latents);
        gst_structure_get_uint64(s, "source-frames", &frames);
        r.latents += latents;
        r.frames += frames;
      }
    } else {
      ok = true;
    }
    gst_message_unref(msg);
    if (type != GST_MESSAGE_ELEMENT) break;
  }
  gst_object_unref(bus);
  return ok;
}

GstStructure* clip_metadata(const ClipEntry& clip, const EncodeSettings& s) {
  GstStructure* m = gst_structure_new("precompute", "source", G_TYPE_STRING, clip.source.c_str(), "caption",
                                      G_TYPE_STRING, clip.caption.c_str(), nullptr);
  auto put = [&](const char* key, double v) {
    char buf[32];
    g_ascii_dtostr(buf, sizeof buf, v);
    gst_structure_set(m, key, G_TYPE_STRING, buf, nullptr);
  };
  if (clip.start) put("start", *clip.start);
  if (clip.end) put("end", *clip.end);
  if (s.width > 0)
    gst_structure_set(m, "size", G_TYPE_STRING, (std::to_string(s.width) + "x" + std::to_string(s.height)).c_str(),
                      nullptr);
  return m;
}

// latentfilesink reads its location as a pattern (%05d numbers the files); a literal % is written %%.
std::string literal_location(const std::string& path) {
  std::string out;
  for (char c : path) {
    if (c == '%') out += '%';
    out += c;
  }
  return out;
}

void set_caps(GstElement* capsfilter, const std::string& caps) {
  GstCaps* c = gst_caps_from_string(caps.c_str());
  g_object_set(capsfilter, "caps", c, nullptr);
  gst_caps_unref(c);
}

}  // namespace

ClipResult encode_clip(const ClipEntry& clip, const EncodeSettings& s, const std::filesystem::path& out_file) {
  ClipResult r;
  const auto t0 = std::chrono::steady_clock::now();
  std::error_code ec;
  if (!std::filesystem::is_regular_file(clip.path, ec)) {
    r.reason = std::filesystem::exists(clip.path, ec) ? "not a regular file" : "no such file";
    return r;
  }
  GError* err = nullptr;
  ObjectPtr pipeline(
      gst_parse_launch("filesrc name=src ! decodebin ! videoconvert name=convert ! videorate ! capsfilter name=rate ! "
                       "aspectratiocrop name=crop ! "
                       "videoscale ! capsfilter name=size ! vaeencode name=enc ! latentfilesink name=sink",
                       &err));
  // A missing element (the gst-latent plugin not found) still gives a pipeline, with `err` set.
  if (!pipeline || err) {
    r.reason = std::string("cannot build the pipeline: ") + (err ? err->message : "?");
    g_clear_error(&err);
    return r;
  }
  auto element = [&](const char* name) { return ObjectPtr(gst_bin_get_by_name(GST_BIN(pipeline.get()), name)); };
  g_object_set(element("src").get(), "location", clip.path.c_str(), nullptr);
  const double fps = clip.fps ? *clip.fps : s.fps;
  if (fps > 0) {
    gint n = 0, d = 1;
    gst_util_double_to_fraction(fps, &n, &d);
    set_caps(element("rate").get(), "video/x-raw,framerate=" + std::to_string(n) + "/" + std::to_string(d));
  }
  if (s.width > 0 && s.height > 0) {
    g_object_set(element("crop").get(), "aspect-ratio", s.width, s.height, nullptr);
    set_caps(element("size").get(),
             "video/x-raw,width=" + std::to_string(s.width) + ",height=" + std::to_string(s.height));
  }
  ObjectPtr enc = element("enc");
  g_object_set(enc.get(), "model", s.model.c_str(), "device", s.device.c_str(), "dtype", s.dtype.c_str(), nullptr);
  ObjectPtr sink = element("sink");
  GstStructure* meta = clip_metadata(clip, s);
  g_object_set(sink.get(), "location", literal_location(out_file.string()).c_str(), "metadata", meta, nullptr);
  gst_structure_free(meta);

  FrameGate gate;
  gate.max = s.max_frames;
  if (clip.start) gate.start = GstClockTime(std::llround(*clip.start * GST_SECOND));
  if (clip.end) gate.end = GstClockTime(std::llround(*clip.end * GST_SECOND));
  GstPad* enc_sink = gst_element_get_static_pad(enc.get(), "sink");
  gst_pad_add_probe(enc_sink, GST_PAD_PROBE_TYPE_BUFFER, gate_frames, &gate, nullptr);
  gst_object_unref(enc_sink);

  SeekPlan plan;
  plan.pipeline = pipeline.get();
  plan.clip_start = gate.start;
  ObjectPtr convert = element("convert"), rate = element("rate");
  plan.pad = gst_element_get_static_pad(convert.get(), "sink");
  gst_pad_add_probe(plan.pad, GST_PAD_PROBE_TYPE_BUFFER, count_before_start, &plan, nullptr);
  if (s.seek && gate.start > 0) {
    plan.block = gst_pad_add_probe(plan.pad, GstPadProbeType(GST_PAD_PROBE_TYPE_BUFFER | GST_PAD_PROBE_TYPE_BLOCK),
                                   hold_first_frame, &plan, nullptr);
    gst_pad_add_probe(plan.pad, GstPadProbeType(GST_PAD_PROBE_TYPE_EVENT_DOWNSTREAM | GST_PAD_PROBE_TYPE_EVENT_FLUSH),
                      follow_seek, &plan, nullptr);
  } else {
    plan.note = gate.start > 0 ? "no seek: --no-seek" : "";
  }
  auto on_application = [&]() -> std::string {
    on_seek_message(plan, rate.get());
    std::lock_guard<std::mutex> lock(plan.mu);
    return plan.failure;
  };

  bool ok = true;
  if (ok) ok = gst_element_set_state(pipeline.get(), GST_STATE_PLAYING) != GST_STATE_CHANGE_FAILURE;
  ok = wait(pipeline.get(), s.timeout_seconds, r, on_application) && ok;
  // A sink stopped before EOS keeps its frames as "<out_file>.partial", never under out_file, so a failure here
  // never touches a file another worker or process committed under that name.
  gst_element_set_state(pipeline.get(), GST_STATE_NULL);
  gst_object_unref(plan.pad);
  r.seek = plan.note;
  r.frames_before = plan.before;
  if (ok && r.latents == 0) {
    ok = false;
    r.reason = clip.start || clip.end ? "no frames in the clip's time range" : "no frames decoded";
  }
  r.ok = ok && std::filesystem::is_regular_file(out_file, ec);
  if (!r.ok) {
    if (r.reason.empty()) r.reason = "the pipeline stopped without an error message";
    std::filesystem::path partial = out_file;
    partial += ".partial";
    std::filesystem::remove(partial, ec);
  }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

}  // namespace latent::precompute
