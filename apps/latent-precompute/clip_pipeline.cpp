#include "clip_pipeline.h"

#include <gst/gst.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <memory>

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

std::string bus_error(GstMessage* msg) {
  GError* err = nullptr;
  gchar* dbg = nullptr;
  gst_message_parse_error(msg, &err, &dbg);
  std::string text = std::string(GST_OBJECT_NAME(GST_MESSAGE_SRC(msg))) + ": " + (err ? err->message : "error");
  g_clear_error(&err);
  g_free(dbg);
  return text;
}

// Waits for EOS or ERROR; a committed file is announced by latentfilesink's element message.
bool wait(GstElement* pipeline, double timeout, ClipResult& r) {
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
        bus, GstClockTime(left.count()), GstMessageType(GST_MESSAGE_EOS | GST_MESSAGE_ERROR | GST_MESSAGE_ELEMENT));
    if (!msg) continue;
    const GstMessageType type = GST_MESSAGE_TYPE(msg);
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
  ObjectPtr pipeline(gst_parse_launch(
      "filesrc name=src ! decodebin ! videoconvert ! videorate ! capsfilter name=rate ! aspectratiocrop name=crop ! "
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

  bool ok = true;
  if (ok) ok = gst_element_set_state(pipeline.get(), GST_STATE_PLAYING) != GST_STATE_CHANGE_FAILURE;
  ok = wait(pipeline.get(), s.timeout_seconds, r) && ok;
  // A sink stopped before EOS keeps its frames as "<out_file>.partial", never under out_file, so a failure here
  // never touches a file another worker or process committed under that name.
  gst_element_set_state(pipeline.get(), GST_STATE_NULL);
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
