// The pieces of glue vaeencode and vaedecode share, without a model: events held behind data, the latency bound
// with its hysteresis, and the device a process takes under torchrun.

// The C++ headers come first: check's function-like macros (fail, ...) would rewrite their members.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <vector>

#include <gst/check/gstcheck.h>

#include "held_events.h"
#include "latency.h"
#include "launch_device.h"
#include "live_timeline.h"

namespace {

using latent::gst::device_for_process;
using latent::gst::HeldEvents;
using latent::gst::LatencyBound;
using latent::gst::LaunchVariables;

constexpr GstClockTime ms(double v) { return GstClockTime(v * double(GST_MSECOND)); }

GST_START_TEST(test_bound_rises_at_once_and_falls_with_hysteresis) {
  LatencyBound b(4, 1.25);
  fail_unless_equals_uint64(b.announced(), 0);
  fail_unless(b.add(ms(100)));
  fail_unless_equals_uint64(b.announced(), ms(125));
  // Wobbles below the announced bound change nothing, and faster chunks do not lower it before the window has
  // forgotten the slow one.
  for (double t : {90.0, 110.0, 120.0, 40.0}) fail_if(b.add(ms(t)), "%g ms moved the bound", t);
  fail_unless_equals_uint64(b.announced(), ms(125));
  // A chunk past the bound raises it at once: the sink must never see a latent later than announced.
  fail_unless(b.add(ms(130)));
  fail_unless_equals_uint64(b.announced(), ms(163));
  // Lowered only once the window's slowest, with headroom, is at most half of it.
  for (double t : {60.0, 60.0, 60.0}) fail_if(b.add(ms(t)));
  fail_unless(b.add(ms(60)));
  fail_unless_equals_uint64(b.announced(), ms(75));
  b.reset();
  fail_unless_equals_uint64(b.announced(), 0);
}
GST_END_TEST;

GST_START_TEST(test_jitter_is_announced_a_few_times) {
  LatencyBound b;
  int changes = 0;
  // 1000 chunks of 50 +- 10 ms: a repost per millisecond of change would be hundreds.
  for (int i = 0; i < 1000; ++i) changes += b.add(ms(50 + (i * 7919 % 21) - 10)) ? 1 : 0;
  fail_unless(changes <= 2, "%d changes", changes);
  fail_unless(b.announced() >= ms(60));
}
GST_END_TEST;

struct Sink {
  GstPad* src;
  GstPad* sink;
  std::vector<std::string> seen;
};

gboolean collect(GstPad* pad, GstObject*, GstEvent* event) {
  auto* s = static_cast<Sink*>(gst_pad_get_element_private(pad));
  s->seen.push_back(GST_EVENT_TYPE_NAME(event));
  gst_event_unref(event);
  return TRUE;
}

void linked(Sink& s) {
  s.src = gst_pad_new("src", GST_PAD_SRC);
  s.sink = gst_pad_new("sink", GST_PAD_SINK);
  gst_pad_set_element_private(s.sink, &s);
  gst_pad_set_event_function(s.sink, collect);
  fail_unless_equals_int(gst_pad_link(s.src, s.sink), GST_PAD_LINK_OK);
  gst_pad_set_active(s.src, TRUE);
  gst_pad_set_active(s.sink, TRUE);
}

GstEvent* tag() { return gst_event_new_tag(gst_tag_list_new_empty()); }
GstEvent* gap() { return gst_event_new_gap(0, GST_SECOND); }

GST_START_TEST(test_events_go_out_before_the_output_that_covers_their_input) {
  Sink s;
  linked(s);
  HeldEvents held;
  held.hold(tag(), 2);                         // came before input 2
  held.hold(gap(), 5);                         // came before input 5
  fail_unless(held.release_before(s.src, 2));  // an output of inputs 0-1
  fail_unless(s.seen.empty());
  fail_unless(held.release_before(s.src, 5));  // an output of inputs 2-4
  fail_unless_equals_int(s.seen.size(), 1);
  fail_unless_equals_string(s.seen[0].c_str(), "tag");
  fail_unless(held.release_all(s.src));
  fail_unless_equals_int(s.seen.size(), 2);
  fail_unless_equals_string(s.seen[1].c_str(), "gap");
  fail_unless(held.empty());
  gst_object_unref(s.src);
  gst_object_unref(s.sink);
}
GST_END_TEST;

GST_START_TEST(test_a_flush_keeps_sticky_events_only) {
  Sink s;
  linked(s);
  HeldEvents held;
  held.hold(gap(), 3);
  held.hold(tag(), 4);
  held.flush();
  fail_unless_equals_int(held.size(), 1);
  fail_unless(held.release_before(s.src, 1));  // the first output after the flush
  fail_unless_equals_int(s.seen.size(), 1);
  fail_unless_equals_string(s.seen[0].c_str(), "tag");
  held.hold(gap(), 1);
  held.clear();
  fail_unless(held.empty());
  gst_object_unref(s.src);
  gst_object_unref(s.sink);
}
GST_END_TEST;

GST_START_TEST(test_which_events_wait) {
  for (GstEvent* e : {tag(), gap()}) {
    fail_unless(latent::gst::waits_behind_data(e), "%s", GST_EVENT_TYPE_NAME(e));
    gst_event_unref(e);
  }
  for (GstEvent* e : {gst_event_new_eos(), gst_event_new_stream_start("s"), gst_event_new_flush_stop(TRUE),
                      gst_event_new_flush_start()}) {
    fail_if(latent::gst::waits_behind_data(e), "%s", GST_EVENT_TYPE_NAME(e));
    gst_event_unref(e);
  }
}
GST_END_TEST;

// torchrun's second process on a machine with two GPUs.
LaunchVariables second_of_two() { return {"2", "1", "1"}; }

// The message device_for_process throws, or "" when it returns.
std::string refusal(const std::string& requested, const LaunchVariables& env, int cuda_devices) {
  try {
    device_for_process(requested, env, cuda_devices);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

// A sink that shows a frame every 60 ms behind a queue, fed a frame every 40 ms: each frame of the backlog reports
// its own lateness. The timeline moves by the real deficit, not by every report again (it moved 2 to N times the
// deficit when each report counted).
GST_START_TEST(test_sink_lateness_of_a_backlog_is_taken_back_once) {
  constexpr GstClockTime frame = 40 * GST_MSECOND, shown = 60 * GST_MSECOND, max_lateness = 20 * GST_MSECOND;
  latent::gst::LiveTimeline timeline;
  struct Shown {
    GstClockTime at, pts;
  };
  std::vector<Shown> shows;  // in order: the sink reports each frame's lateness when it shows it
  size_t reported = 0;
  GstClockTime sink_free = 0, moved = 0;
  for (int i = 0; i < 200; ++i) {
    const GstClockTime now = GstClockTime(i) * frame;  // the generator keeps up: frames exist on time
    for (; reported < shows.size() && shows[reported].at <= now; ++reported)
      timeline.sink_lateness(GstClockTimeDiff(shows[reported].at) - GstClockTimeDiff(shows[reported].pts),
                             shows[reported].pts, max_lateness);
    const latent::gst::LiveTimeline::Stamp st = timeline.stamp(now, now);
    moved += st.skipped + st.late;
    const GstClockTime show = std::max(sink_free, st.pts);  // in order, when free, never before its time
    sink_free = show + shown;
    shows.push_back({show, st.pts});
  }
  // The sink needs 60 ms a frame: 200 frames take 12 s, the stream is 8 s long; what the timeline moved stands for
  // the 4 s the sink fell behind, up to a report's threshold and one frame in flight.
  const GstClockTime deficit = 200 * (shown - frame);
  fail_unless(moved <= deficit + deficit / 5, "moved %" GST_TIME_FORMAT " for a deficit of %" GST_TIME_FORMAT,
              GST_TIME_ARGS(moved), GST_TIME_ARGS(deficit));
  fail_unless(moved >= deficit / 2, "moved only %" GST_TIME_FORMAT " for a deficit of %" GST_TIME_FORMAT,
              GST_TIME_ARGS(moved), GST_TIME_ARGS(deficit));
}
GST_END_TEST;

GST_START_TEST(test_torchrun_processes_take_the_gpu_of_their_local_rank) {
  g_setenv("WORLD_SIZE", "2", TRUE);
  g_setenv("RANK", "1", TRUE);
  g_setenv("LOCAL_RANK", "1", TRUE);
  const LaunchVariables env = LaunchVariables::from_environment();
  fail_unless(env.present());
  fail_unless_equals_string(device_for_process("auto", env, 2).c_str(), "cuda:1");
  fail_unless_equals_string(device_for_process("", env, 2).c_str(), "cuda:1");
  // "cuda" names no GPU: under torchrun it means this process's, as torch.cuda.set_device(LOCAL_RANK) makes it.
  fail_unless_equals_string(device_for_process("cuda", env, 2).c_str(), "cuda:1");
  // The local rank, not the global one: the second machine's first process takes its cuda:0.
  fail_unless_equals_string(device_for_process("auto", {"4", "2", "0"}, 2).c_str(), "cuda:0");
  // A launcher that sets no LOCAL_RANK: RANK is the index on a one-machine run.
  fail_unless_equals_string(device_for_process("auto", {"2", "1", ""}, 2).c_str(), "cuda:1");
  g_unsetenv("WORLD_SIZE");
  g_unsetenv("RANK");
  g_unsetenv("LOCAL_RANK");
  fail_if(LaunchVariables::from_environment().present());
}
GST_END_TEST;

GST_START_TEST(test_a_named_device_and_runs_without_torchrun_or_cuda_are_left_alone) {
  for (const char* named : {"cpu", "cuda:0", "cuda:1"})
    fail_unless_equals_string(device_for_process(named, second_of_two(), 2).c_str(), named);
  fail_unless_equals_string(device_for_process("auto", {}, 2).c_str(), "auto");
  // Without CUDA auto stays the CPU, whatever the launcher wrote.
  fail_unless_equals_string(device_for_process("auto", second_of_two(), 0).c_str(), "auto");
  fail_unless_equals_string(device_for_process("auto", {"2", "1", "x"}, 0).c_str(), "auto");
}
GST_END_TEST;

GST_START_TEST(test_a_malformed_or_missing_local_rank_is_refused_by_name) {
  for (const char* bad : {"x", "1 ", " 1", "+1", "-1", "1.0", "0x1", "99999999999999999999"}) {
    const std::string why = refusal("auto", {"2", "1", bad}, 2);
    fail_unless(why.find(std::string("LOCAL_RANK='") + bad + "' is not a whole number") != std::string::npos,
                "LOCAL_RANK '%s': '%s'", bad, why.c_str());
  }
  fail_unless(refusal("auto", {"2", "z", ""}, 2).find("RANK='z'") != std::string::npos);
  // One GPU for the second process of two: named, never a silent cuda:0 shared with the first.
  const std::string beyond = refusal("auto", second_of_two(), 1);
  fail_unless(beyond.find("LOCAL_RANK=1, but this machine has 1 CUDA device") != std::string::npos, "%s",
              beyond.c_str());
  // A named device is not the launcher's business: its LOCAL_RANK is not even read.
  fail_unless(refusal("cuda:0", {"2", "1", "x"}, 2).empty());
}
GST_END_TEST;

Suite* glue_suite() {
  Suite* s = suite_create("glue");
  TCase* tc = tcase_create("glue");
  suite_add_tcase(s, tc);
  tcase_add_test(tc, test_bound_rises_at_once_and_falls_with_hysteresis);
  tcase_add_test(tc, test_jitter_is_announced_a_few_times);
  tcase_add_test(tc, test_events_go_out_before_the_output_that_covers_their_input);
  tcase_add_test(tc, test_a_flush_keeps_sticky_events_only);
  tcase_add_test(tc, test_which_events_wait);
  tcase_add_test(tc, test_sink_lateness_of_a_backlog_is_taken_back_once);
  tcase_add_test(tc, test_torchrun_processes_take_the_gpu_of_their_local_rank);
  tcase_add_test(tc, test_a_named_device_and_runs_without_torchrun_or_cuda_are_left_alone);
  tcase_add_test(tc, test_a_malformed_or_missing_local_rank_is_refused_by_name);
  return s;
}

}  // namespace

GST_CHECK_MAIN(glue);
