// The pieces of glue vaeencode and vaedecode share, without a model: events held behind data, and the latency
// bound with its hysteresis.

// The C++ headers come first: check's function-like macros (fail, ...) would rewrite their members.
#include <string>
#include <vector>

#include <gst/check/gstcheck.h>

#include "held_events.h"
#include "latency.h"

namespace {

using latent::gst::HeldEvents;
using latent::gst::LatencyBound;

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

Suite* glue_suite() {
  Suite* s = suite_create("glue");
  TCase* tc = tcase_create("glue");
  suite_add_tcase(s, tc);
  tcase_add_test(tc, test_bound_rises_at_once_and_falls_with_hysteresis);
  tcase_add_test(tc, test_jitter_is_announced_a_few_times);
  tcase_add_test(tc, test_events_go_out_before_the_output_that_covers_their_input);
  tcase_add_test(tc, test_a_flush_keeps_sticky_events_only);
  tcase_add_test(tc, test_which_events_wait);
  return s;
}

}  // namespace

GST_CHECK_MAIN(glue);
