// Running a gst-launch description to EOS or ERROR from a check test and keeping what reached its appsink, and
// cycling a pipeline through its states while watching the process's memory.
// Include after the C++ standard headers and gst/check/gstcheck.h (check's macros rewrite names).
#pragma once

// The C++ headers come first: check's function-like macros (fail, ...) would rewrite their members.
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include <gst/app/gstappsink.h>
#include <gst/check/gstcheck.h>

namespace latent_test {

struct Out {
  std::vector<GstBuffer*> buffers;
  GstCaps* caps = nullptr;
  std::string error;  // empty when the pipeline reached EOS
  ~Out() {
    for (auto* b : buffers) gst_buffer_unref(b);
    if (caps) gst_caps_unref(caps);
  }
};

// Runs `desc` (ending in "appsink name=out") to EOS or ERROR and keeps what reached the sink. `setup` may set
// properties a launch line cannot spell (strings with quotes or runs of spaces) before the pipeline starts.
inline void run(const std::string& desc, Out& out, GstClockTime timeout = 120 * GST_SECOND,
                const std::function<void(GstElement* pipeline)>& setup = {}) {
  GError* err = nullptr;
  GstElement* pipeline = gst_parse_launch(desc.c_str(), &err);
  fail_unless(pipeline != nullptr, "cannot build %s: %s", desc.c_str(), err ? err->message : "?");
  g_clear_error(&err);
  if (setup) setup(pipeline);
  GstElement* sink = gst_bin_get_by_name(GST_BIN(pipeline), "out");
  if (sink) g_object_set(sink, "sync", FALSE, "emit-signals", FALSE, nullptr);
  GstBus* bus = gst_element_get_bus(pipeline);
  GstStateChangeReturn sret = gst_element_set_state(pipeline, GST_STATE_PLAYING);
  GstMessage* msg = nullptr;
  const GstMessageType ends = GstMessageType(GST_MESSAGE_EOS | GST_MESSAGE_ERROR);
  if (sret != GST_STATE_CHANGE_FAILURE && sink) {
    // Pull on this thread so the buffers are ours in order, until the sink's EOS. A stream that fails may never
    // send one, so the bus is looked at between pulls: once it holds an ERROR, what is still on its way gets a
    // short wait, not `timeout` (a failing run took 120 s more for nothing).
    GstAppSink* appsink = GST_APP_SINK(sink);
    const auto keep = [&](GstSample* s) {
      if (!out.caps) out.caps = gst_caps_ref(gst_sample_get_caps(s));
      out.buffers.push_back(gst_buffer_ref(gst_sample_get_buffer(s)));
      gst_sample_unref(s);
    };
    gint64 wait_us = gint64(timeout / GST_USECOND);
    gint64 deadline = g_get_monotonic_time() + wait_us;  // since the last sample, as one long pull would wait
    while (!gst_app_sink_is_eos(appsink) && g_get_monotonic_time() < deadline) {
      if (GstSample* s = gst_app_sink_try_pull_sample(appsink, 20 * GST_MSECOND)) {
        keep(s);
        deadline = g_get_monotonic_time() + wait_us;
      } else if (!msg && (msg = gst_bus_pop_filtered(bus, ends)) && GST_MESSAGE_TYPE(msg) == GST_MESSAGE_ERROR) {
        wait_us = 2 * G_USEC_PER_SEC;
        deadline = std::min(deadline, g_get_monotonic_time() + wait_us);
      }
    }
  }
  if (!msg) msg = gst_bus_timed_pop_filtered(bus, timeout, ends);
  fail_unless(msg != nullptr, "pipeline neither ended nor failed: %s", desc.c_str());
  if (GST_MESSAGE_TYPE(msg) == GST_MESSAGE_ERROR) {
    GError* e = nullptr;
    gchar* dbg = nullptr;
    gst_message_parse_error(msg, &e, &dbg);
    out.error = e->message;
    GST_INFO("error: %s (%s)", e->message, dbg ? dbg : "");
    g_clear_error(&e);
    g_free(dbg);
  }
  gst_message_unref(msg);
  gst_element_set_state(pipeline, GST_STATE_NULL);
  gst_object_unref(bus);
  if (sink) gst_object_unref(sink);
  gst_object_unref(pipeline);
}

inline long rss_kib() {
  std::ifstream statm("/proc/self/statm");
  long total = 0, resident = 0;
  statm >> total >> resident;
  return resident * (sysconf(_SC_PAGESIZE) / 1024);
}

// Takes the pipeline of `desc` NULL -> PLAYING (waiting for it to preroll) -> NULL `cycles` times and returns how
// many KiB the resident set grew from cycle 40, when allocators have settled, to the end.
inline long rss_growth_over_state_cycles(const std::string& desc, int cycles = 200) {
  GstElement* pipeline = gst_parse_launch(desc.c_str(), nullptr);
  fail_unless(pipeline != nullptr, "cannot build %s", desc.c_str());
  long warm = 0;
  for (int i = 0; i < cycles; ++i) {
    fail_unless(gst_element_set_state(pipeline, GST_STATE_PLAYING) != GST_STATE_CHANGE_FAILURE);
    gst_element_get_state(pipeline, nullptr, nullptr, 30 * GST_SECOND);
    fail_unless(gst_element_set_state(pipeline, GST_STATE_NULL) == GST_STATE_CHANGE_SUCCESS);
    if (i == 40) warm = rss_kib();
    if (i % 40 == 0) GST_INFO("cycle %d: RSS %ld KiB", i, rss_kib());
  }
  gst_object_unref(pipeline);
  return rss_kib() - warm;
}

}  // namespace latent_test
