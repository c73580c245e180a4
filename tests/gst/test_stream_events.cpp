// vaeencode and vaedecode as parts of a longer stream: serialized events keep their place behind held data, a new
// stream or segment ends the clip, the latency is a stable upper bound, and vaedecode's caps name its model.

// The C++ headers come first: check's function-like macros (fail, ...) would rewrite their members.
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <string>
#include <vector>

#include <gst/check/gstcheck.h>
#include <gst/check/gstharness.h>

#include "check_main.h"
#include "pipeline_run.h"
#include "test_models.h"

namespace {

using latent_test::cog;
using latent_test::Out;
using latent_test::wan;

// What went downstream through a pad, in order: "buffer F-E" (the source frames a latent covers), "frame" (a
// buffer without offsets), or an event's name ("segment", "tag", "eos", ...).
struct Trace {
  std::mutex mu;
  std::vector<std::string> items;
  std::vector<std::string> take() {
    std::lock_guard<std::mutex> lock(mu);
    return items;
  }
};

GstPadProbeReturn record(GstPad*, GstPadProbeInfo* info, gpointer data) {
  auto* trace = static_cast<Trace*>(data);
  std::string item;
  if (GST_PAD_PROBE_INFO_TYPE(info) & GST_PAD_PROBE_TYPE_BUFFER) {
    GstBuffer* b = GST_PAD_PROBE_INFO_BUFFER(info);
    item = GST_BUFFER_OFFSET(b) == GST_BUFFER_OFFSET_NONE
               ? "frame"
               : "buffer " + std::to_string(GST_BUFFER_OFFSET(b)) + "-" + std::to_string(GST_BUFFER_OFFSET_END(b));
  } else if (GST_PAD_PROBE_INFO_TYPE(info) & GST_PAD_PROBE_TYPE_EVENT_DOWNSTREAM) {
    GstEvent* e = GST_PAD_PROBE_INFO_EVENT(info);
    item = GST_EVENT_TYPE_NAME(e);
  } else {
    return GST_PAD_PROBE_OK;
  }
  std::lock_guard<std::mutex> lock(trace->mu);
  trace->items.push_back(item);
  return GST_PAD_PROBE_OK;
}

void trace_src(GstElement* element, Trace& trace) {
  GstPad* src = gst_element_get_static_pad(element, "src");
  gst_pad_add_probe(src, GstPadProbeType(GST_PAD_PROBE_TYPE_BUFFER | GST_PAD_PROBE_TYPE_EVENT_DOWNSTREAM), record,
                    &trace, nullptr);
  gst_object_unref(src);
}

// Source frames per run of buffers between two "segment" events: a latent counts the frames it covers, a frame 1.
std::vector<uint64_t> frames_per_segment(const std::vector<std::string>& items) {
  std::vector<uint64_t> out;
  for (const std::string& item : items) {
    if (item == "segment") out.push_back(0);
    unsigned long long first = 0, end = 0;
    if (!out.empty() && std::sscanf(item.c_str(), "buffer %llu-%llu", &first, &end) == 2) out.back() += end - first;
    if (!out.empty() && item == "frame") out.back() += 1;
  }
  return out;
}

std::string joined(const std::vector<std::string>& items) {
  std::string s;
  for (const auto& i : items) s += i + "; ";
  return s;
}

std::string rgb_caps() { return "video/x-raw,format=RGB,width=64,height=48,framerate=24/1"; }

// Two streams one after the other through concat: each is its own clip, its latents and frames go out before the
// next stream's segment, and the frame counts hold per stream (7 = 1+4+2 frames, padded; 6 = 1+4+1).
GST_START_TEST(test_concatenated_streams_are_separate_clips) {
  const std::string desc = "concat name=c ! vaeencode name=enc model=" + wan() +
                           " ! vaedecode name=dec model=" + wan() +
                           " ! fakesink name=out videotestsrc num-buffers=7 ! " + rgb_caps() +
                           " ! c. videotestsrc num-buffers=6 pattern=ball ! " + rgb_caps() + " ! c.";
  GstElement* pipeline = gst_parse_launch(desc.c_str(), nullptr);
  fail_unless(pipeline != nullptr);
  Trace enc_trace, dec_trace;
  GstElement* enc = gst_bin_get_by_name(GST_BIN(pipeline), "enc");
  GstElement* dec = gst_bin_get_by_name(GST_BIN(pipeline), "dec");
  trace_src(enc, enc_trace);
  trace_src(dec, dec_trace);
  gst_element_set_state(pipeline, GST_STATE_PLAYING);
  GstBus* bus = gst_element_get_bus(pipeline);
  GstMessage* msg =
      gst_bus_timed_pop_filtered(bus, 120 * GST_SECOND, GstMessageType(GST_MESSAGE_EOS | GST_MESSAGE_ERROR));
  fail_unless(msg && GST_MESSAGE_TYPE(msg) == GST_MESSAGE_EOS, "the pipeline did not reach EOS");
  gst_message_unref(msg);
  gst_element_set_state(pipeline, GST_STATE_NULL);

  const std::vector<std::string> latents = enc_trace.take(), frames = dec_trace.take();
  const std::vector<uint64_t> want{7, 6};
  fail_unless(frames_per_segment(latents) == want, "latents: %s", joined(latents).c_str());
  fail_unless(frames_per_segment(frames) == want, "frames: %s", joined(frames).c_str());
  fail_unless_equals_string(latents.back().c_str(), "eos");
  // Each clip's latents start a clip: the first of each covers one frame.
  std::vector<std::string> firsts;
  for (size_t i = 0; i + 1 < latents.size(); ++i)
    if (latents[i] == "segment" && latents[i + 1].rfind("buffer", 0) == 0) firsts.push_back(latents[i + 1]);
  fail_unless_equals_int(firsts.size(), 2);
  fail_unless_equals_string(firsts[0].c_str(), "buffer 0-1");
  fail_unless_equals_string(firsts[1].c_str(), "buffer 7-8");
  gst_object_unref(bus);
  gst_object_unref(enc);
  gst_object_unref(dec);
  gst_object_unref(pipeline);
}
GST_END_TEST;

GstTagList* a_tag() { return gst_tag_list_new(GST_TAG_TITLE, "held", nullptr); }

// A TAG that comes in while frames wait for their chunk goes out after the latents of those frames.
GST_START_TEST(test_encoder_holds_events_behind_frames) {
  GstHarness* h = gst_harness_new_parse(("vaeencode model=" + wan()).c_str());
  gst_harness_set_src_caps_str(h, rgb_caps().c_str());
  Trace trace;
  trace_src(h->element, trace);
  for (int i = 0; i < 3; ++i) {
    GstBuffer* b = gst_harness_create_buffer(h, 64 * 48 * 3);
    gst_buffer_memset(b, 0, guint8(40 + 9 * i), 64 * 48 * 3);
    GST_BUFFER_PTS(b) = gst_util_uint64_scale(i, GST_SECOND, 24);
    GST_BUFFER_DURATION(b) = GST_SECOND / 24;
    fail_unless_equals_int(gst_harness_push(h, b), GST_FLOW_OK);
  }
  // Frame 0 is latent 0 at once; frames 1 and 2 are held.
  fail_unless(gst_harness_push_event(h, gst_event_new_tag(a_tag())));
  fail_unless(gst_harness_push_event(h, gst_event_new_eos()));
  std::vector<std::string> got = trace.take();
  std::vector<std::string> tail(got.end() - 4, got.end());
  const std::vector<std::string> want{"buffer 0-1", "buffer 1-3", "tag", "eos"};
  fail_unless(tail == want, "got %s", joined(got).c_str());
  gst_harness_teardown(h);
}
GST_END_TEST;

// Nine frames encoded by `model` (three latents, into `latents`) and a harness around vaedecode of the same model,
// its caps set to the latents'.
GstHarness* decoder_of_encoded_clip(const std::string& model, Out& latents) {
  latent_test::run("videotestsrc num-buffers=9 ! " + rgb_caps() + " ! vaeencode model=" + model + " ! appsink name=out",
                   latents);
  fail_unless(latents.error.empty(), "%s", latents.error.c_str());
  fail_unless_equals_int(latents.buffers.size(), 3);
  GstHarness* h = gst_harness_new_parse(("vaedecode model=" + model).c_str());
  gst_harness_set_src_caps(h, gst_caps_ref(latents.caps));
  return h;
}

// The same in vaedecode: CogVideoX decodes two latents at a time, so after an odd latent one is held.
GST_START_TEST(test_decoder_holds_events_behind_latents) {
  Out latents;
  GstHarness* h = decoder_of_encoded_clip(cog(), latents);
  Trace trace;
  trace_src(h->element, trace);
  fail_unless_equals_int(gst_harness_push(h, gst_buffer_ref(latents.buffers[0])), GST_FLOW_OK);
  fail_unless(gst_harness_push_event(h, gst_event_new_tag(a_tag())));
  fail_unless(gst_harness_push_event(h, gst_event_new_eos()));
  std::vector<std::string> got = trace.take();
  fail_unless(got.size() >= 3, "got %s", joined(got).c_str());
  // CogVideoX decodes its first 3 latents together: latent 0 is held until EOS drains it.
  fail_unless_equals_string(got[got.size() - 3].c_str(), "frame");
  fail_unless_equals_string(got[got.size() - 2].c_str(), "tag");
  fail_unless_equals_string(got.back().c_str(), "eos");
  gst_harness_teardown(h);
}
GST_END_TEST;

// The latency is a bound with hysteresis: a live run of 160 chunks reposts it a handful of times, not per chunk.
GST_START_TEST(test_latency_is_reposted_rarely) {
  const std::string desc = "videotestsrc num-buffers=161 ! " + rgb_caps() +
                           " ! vaeencode chunk-frames=1 model=" + wan() + " ! vaedecode model=" + wan() + " ! fakesink";
  GstElement* pipeline = gst_parse_launch(desc.c_str(), nullptr);
  GstBus* bus = gst_element_get_bus(pipeline);
  gst_element_set_state(pipeline, GST_STATE_PLAYING);
  int latency_messages = 0;
  for (;;) {
    GstMessage* msg = gst_bus_timed_pop_filtered(
        bus, 120 * GST_SECOND, GstMessageType(GST_MESSAGE_EOS | GST_MESSAGE_ERROR | GST_MESSAGE_LATENCY));
    fail_unless(msg != nullptr, "no EOS");
    const GstMessageType type = GST_MESSAGE_TYPE(msg);
    gst_message_unref(msg);
    fail_if(type == GST_MESSAGE_ERROR);
    if (type == GST_MESSAGE_EOS) break;
    latency_messages++;
  }
  // Per element: one at negotiation, one at the first chunk, a few as the slowest chunk so far grows by more than
  // the headroom (each rise is a quarter more than the last: ten of them would take a chunk 9x slower than the
  // first, on a loaded machine). A per-chunk repost is over 40 from vaeencode alone (64 in all before the bound).
  fail_unless(latency_messages <= 24, "%d LATENCY messages", latency_messages);
  gst_element_set_state(pipeline, GST_STATE_NULL);
  gst_object_unref(bus);
  gst_object_unref(pipeline);
}
GST_END_TEST;

// From READY on, a caps query on vaedecode names the model it decodes, so a negotiating upstream can tell.
GST_START_TEST(test_decoder_caps_name_its_model) {
  GstElement* dec = gst_element_factory_make("vaedecode", nullptr);
  g_object_set(dec, "model", wan().c_str(), nullptr);
  fail_unless_equals_int(gst_element_set_state(dec, GST_STATE_READY), GST_STATE_CHANGE_SUCCESS);
  GstPad* sink = gst_element_get_static_pad(dec, "sink");
  GstCaps* caps = gst_pad_query_caps(sink, nullptr);
  const GstStructure* s = gst_caps_get_structure(caps, 0);
  fail_unless_equals_int(gst_caps_get_size(caps), 1);
  fail_unless_equals_string(gst_structure_get_string(s, "model"), "latent-tiny-wan");
  int channels = 0;
  fail_unless(gst_structure_get_int(s, "channels", &channels));
  fail_unless_equals_int(channels, 16);
  GstCaps* other = gst_caps_from_string(
      "video/x-latent,model=wan2.1,format=F32,channels=16,width=8,height=6,framerate=6/1,temporal-factor=4,"
      "spatial-factor=8");
  fail_if(gst_caps_can_intersect(caps, other));
  gst_caps_unref(other);
  gst_caps_unref(caps);
  gst_object_unref(sink);
  gst_element_set_state(dec, GST_STATE_NULL);
  gst_object_unref(dec);
}
GST_END_TEST;

// Properties read when the model loads cannot change in READY; those read at READY->PAUSED can.
GST_START_TEST(test_mutable_flags_say_when_properties_are_read) {
  for (const char* name : {"vaeencode", "vaedecode", "videogen"}) {
    GstElement* e = gst_element_factory_make(name, nullptr);
    for (const char* p : {"model", "device", "dtype"}) {
      GParamSpec* spec = g_object_class_find_property(G_OBJECT_GET_CLASS(e), p);
      fail_unless(spec != nullptr);
      fail_if(spec->flags & GST_PARAM_MUTABLE_READY, "%s::%s is read at NULL->READY", name, p);
    }
    const char* at_start = std::string(name) == "vaedecode" ? "chunk-latents" : "seed";
    GParamSpec* spec = g_object_class_find_property(G_OBJECT_GET_CLASS(e), at_start);
    fail_unless(spec && (spec->flags & GST_PARAM_MUTABLE_READY), "%s::%s", name, at_start);
    gst_object_unref(e);
  }
}
GST_END_TEST;

// Latents holding NaN or infinite values decode to black or garbage frames: vaedecode says so once a stream, with
// a WARNING naming the first such latent, and goes on (the frames still come out: a live stream keeps running).
GST_START_TEST(test_non_finite_latents_are_reported_once) {
  Out latents;
  GstHarness* h = decoder_of_encoded_clip(wan(), latents);
  GstBus* bus = gst_bus_new();
  gst_element_set_bus(h->element, bus);
  for (size_t i = 0; i < latents.buffers.size(); ++i) {
    GstBuffer* b = gst_buffer_copy_deep(latents.buffers[i]);
    if (i > 0) {  // latents 1 and 2: one NaN each
      GstMapInfo m;
      fail_unless(gst_buffer_map(b, &m, GST_MAP_WRITE));
      reinterpret_cast<float*>(m.data)[7] = std::nanf("");
      gst_buffer_unmap(b, &m);
    }
    fail_unless_equals_int(gst_harness_push(h, b), GST_FLOW_OK);
  }
  fail_unless(gst_harness_push_event(h, gst_event_new_eos()));
  fail_unless_equals_int(gst_harness_buffers_received(h), 9);
  int warnings = 0;
  std::string text;
  while (GstMessage* m = gst_bus_pop_filtered(bus, GST_MESSAGE_WARNING)) {
    GError* err = nullptr;
    gst_message_parse_warning(m, &err, nullptr);
    text = err->message;
    g_error_free(err);
    gst_message_unref(m);
    ++warnings;
  }
  fail_unless_equals_int(warnings, 1);
  fail_unless(text.find("Latent 1 ") != std::string::npos && text.find("NaN") != std::string::npos, "%s", text.c_str());
  gst_element_set_bus(h->element, nullptr);
  gst_object_unref(bus);
  gst_harness_teardown(h);
}
GST_END_TEST;

Suite* events_suite() {
  Suite* s = suite_create("stream-events");
  TCase* tc = tcase_create("events");
  tcase_set_timeout(tc, 300);
  suite_add_tcase(s, tc);
  tcase_add_test(tc, test_encoder_holds_events_behind_frames);
  tcase_add_test(tc, test_concatenated_streams_are_separate_clips);
  tcase_add_test(tc, test_latency_is_reposted_rarely);
  tcase_add_test(tc, test_decoder_caps_name_its_model);
  tcase_add_test(tc, test_mutable_flags_say_when_properties_are_read);
  tcase_add_test(tc, test_non_finite_latents_are_reported_once);
  if (latent_test::have_fixtures())
    tcase_add_test(tc, test_decoder_holds_events_behind_latents);
  else
    latent_test::skip_missing("no diffusers fixtures (LATENT_VAE_FIXTURES unset: a build without the .venv)");
  return s;
}

}  // namespace

LATENT_CHECK_MAIN(events);
