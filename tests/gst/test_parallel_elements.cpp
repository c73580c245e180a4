// vaeencode and vaedecode with `devices`: one stream over several CPU ranks (threads) equals one device, and the
// ways a devices list can be wrong reach the bus. Also several streams on several elements (data parallel) and
// encode and decode on different devices (stages), which need no group.

// The C++ headers come first: check's function-like macros (fail, ...) would rewrite their members.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include <gst/app/gstappsink.h>
#include <gst/check/gstcheck.h>

#include "check_main.h"
#include "pipeline_run.h"
#include "test_models.h"

namespace {

namespace fs = std::filesystem;
using latent_test::Out;
using latent_test::run;

using latent_test::cog;
using latent_test::fixtures;
using latent_test::wan;

// 64x48: 6 latent rows, which 4 ranks split 2, 2, 1, 1.
std::string src(int frames, int h = 48) {
  return "videotestsrc num-buffers=" + std::to_string(frames) +
         " pattern=ball ! video/x-raw,format=RGB,width=64,height=" + std::to_string(h) + ",framerate=24/1 ! ";
}

std::vector<float> floats(const Out& out) {
  std::vector<float> v;
  for (auto* b : out.buffers) {
    GstMapInfo m;
    gst_buffer_map(b, &m, GST_MAP_READ);
    const auto* f = reinterpret_cast<const float*>(m.data);
    v.insert(v.end(), f, f + m.size / sizeof(float));
    gst_buffer_unmap(b, &m);
  }
  return v;
}

std::vector<guint8> bytes(const Out& out) {
  std::vector<guint8> v;
  for (auto* b : out.buffers) {
    GstMapInfo m;
    gst_buffer_map(b, &m, GST_MAP_READ);
    v.insert(v.end(), m.data, m.data + m.size);
    gst_buffer_unmap(b, &m);
  }
  return v;
}

// max |a - b| / max |b|, as the core tests measure it.
double rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  fail_unless_equals_int(a.size(), b.size());
  double d = 0, m = 1e-30;
  for (size_t i = 0; i < a.size(); ++i) {
    d = std::max(d, double(std::fabs(a[i] - b[i])));
    m = std::max(m, double(std::fabs(b[i])));
  }
  return d / m;
}

std::string run_error(const std::string& desc) {
  Out out;
  run(desc, out);
  return out.error;
}

}  // namespace

// fp32 on the CPU: the core's tolerance for patch parallel (tests/core/parallel), 1e-5 of the range.
GST_START_TEST(test_devices_encode_equals_one_device) {
  for (const std::string& model : {wan(), cog()}) {
    Out one;
    run(src(13) + "vaeencode model=" + model + " ! appsink name=out", one);
    fail_unless(one.error.empty(), "%s", one.error.c_str());
    for (const char* devices : {"cpu,cpu", "cpu,cpu,cpu", "cpu, cpu, cpu, cpu"}) {
      Out many;
      run(src(13) + "vaeencode model=" + model + " devices=\"" + devices + "\" ! appsink name=out", many);
      fail_unless(many.error.empty(), "%s: %s", devices, many.error.c_str());
      fail_unless_equals_int(many.buffers.size(), one.buffers.size());
      fail_unless(gst_caps_is_equal(many.caps, one.caps), "caps differ with devices=%s", devices);
      for (size_t i = 0; i < one.buffers.size(); ++i) {
        fail_unless_equals_uint64(GST_BUFFER_OFFSET_END(many.buffers[i]), GST_BUFFER_OFFSET_END(one.buffers[i]));
      }
      const double d = rel_diff(floats(many), floats(one));
      fail_unless(d <= 1e-5, "%s devices=%s: max rel diff %g", model.c_str(), devices, d);
    }
  }
}
GST_END_TEST;

// Frames are rounded to 8 bits: a difference of 1e-5 of the range can move a value across a rounding boundary, so
// a level of 1 is allowed, and it must be rare.
GST_START_TEST(test_devices_decode_equals_one_device) {
  for (const std::string& model : {wan(), cog()}) {
    const std::string encode = src(9) + "vaeencode model=" + model + " ! vaedecode model=" + model;
    Out one, many;
    run(encode + " ! appsink name=out", one);
    run(encode + " devices=cpu,cpu,cpu,cpu ! appsink name=out", many);
    fail_unless(one.error.empty() && many.error.empty(), "%s %s", one.error.c_str(), many.error.c_str());
    fail_unless_equals_int(many.buffers.size(), 9);
    const auto a = bytes(many), b = bytes(one);
    fail_unless_equals_int(a.size(), b.size());
    size_t off = 0;
    for (size_t i = 0; i < a.size(); ++i) {
      fail_unless(std::abs(int(a[i]) - int(b[i])) <= 1, "byte %zu: %d against %d", i, a[i], b[i]);
      off += a[i] != b[i];
    }
    fail_unless(off * 1000 <= a.size(), "%zu of %zu bytes differ", off, a.size());
  }
}
GST_END_TEST;

// Bands with devices (Wan): each rank computes its rows in bands from a crop of the frames, recomputing the
// halos; band heights and a budget every rank fits whole (one band per rank) equal one device's whole frames
// within one 8-bit level, rarely.
GST_START_TEST(test_devices_with_bands_equal_one_device) {
  const std::string clip = src(9, 96);
  Out one;
  run(clip + "vaeencode model=" + wan() + " ! vaedecode model=" + wan() + " ! appsink name=out", one);
  fail_unless(one.error.empty(), "%s", one.error.c_str());
  for (const std::string props :
       {" band-height=8 devices=cpu,cpu", " band-height=16 devices=cpu,cpu,cpu", " max-memory=4096 devices=cpu,cpu"}) {
    Out many;
    run(clip + "vaeencode model=" + wan() + props + " ! vaedecode model=" + wan() + props + " ! appsink name=out",
        many);
    fail_unless(many.error.empty(), "%s: %s", props.c_str(), many.error.c_str());
    const auto a = bytes(many), b = bytes(one);
    fail_unless_equals_int(a.size(), b.size());
    size_t off = 0;
    for (size_t i = 0; i < a.size(); ++i) {
      fail_unless(std::abs(int(a[i]) - int(b[i])) <= 1, "%s: byte %zu: %d against %d", props.c_str(), i, a[i], b[i]);
      off += a[i] != b[i];
    }
    fail_unless(off * 1000 <= a.size(), "%s: %zu of %zu bytes differ", props.c_str(), off, a.size());
  }
}
GST_END_TEST;

GST_START_TEST(test_bad_devices_lists_are_errors) {
  std::string e = run_error(src(5) + "vaeencode devices=cpu,,cpu ! fakesink");
  fail_unless(e.find("empty entry") != std::string::npos, "%s", e.c_str());
  e = run_error(src(5) + "vaeencode devices=cpu,cuda:7 ! fakesink");
  fail_unless(e.find("cuda:7") != std::string::npos || e.find("CUDA") != std::string::npos, "%s", e.c_str());
  // 16 rows of pixels are 2 latent rows: too few for 3 ranks, refused at negotiation with what would work.
  e = run_error(src(5, 16) + "vaeencode devices=cpu,cpu,cpu ! fakesink");
  fail_unless(e.find("3 devices need frames of at least 3 latent rows (24 pixels)") != std::string::npos, "%s",
              e.c_str());
  e = run_error(src(5, 16) + "vaeencode ! vaedecode devices=cpu,cpu,cpu ! fakesink");
  fail_unless(e.find("3 devices need") != std::string::npos, "%s", e.c_str());
}
GST_END_TEST;

GST_START_TEST(test_devices_properties) {
  GstElement* e = gst_element_factory_make("vaedecode", nullptr);
  g_object_set(e, "devices", "cpu,cpu", "rank-timeout", 5u, nullptr);
  gchar* devices = nullptr;
  guint timeout = 0;
  g_object_get(e, "devices", &devices, "rank-timeout", &timeout, nullptr);
  fail_unless_equals_string(devices, "cpu,cpu");
  fail_unless_equals_int(timeout, 5);
  g_free(devices);
  gst_object_unref(e);
}
GST_END_TEST;

// Data parallel: two streams, each on its own element (and device); stages: encode on one device, decode on
// another. Neither needs a group, and each stream equals the same stream alone.
GST_START_TEST(test_data_parallel_and_stages) {
  Out alone, both_a, staged;
  run(src(9) + "vaeencode device=cpu ! appsink name=out", alone);
  run(src(9) +
          "tee name=t ! queue ! vaeencode device=cpu ! appsink name=out "
          "t. ! queue ! vaeencode device=cpu ! fakesink",
      both_a);
  fail_unless(both_a.error.empty(), "%s", both_a.error.c_str());
  fail_unless(floats(both_a) == floats(alone), "a stream beside another differs from the stream alone");
  run(src(9) + "vaeencode device=cpu ! queue ! vaedecode devices=cpu,cpu ! appsink name=out", staged);
  fail_unless(staged.error.empty(), "%s", staged.error.c_str());
  fail_unless_equals_int(staged.buffers.size(), 9);
}
GST_END_TEST;

static int threads_now() { return int(std::distance(fs::directory_iterator("/proc/self/task"), {})); }

// Each READY->PAUSED forms a group (rank threads, a store) and PAUSED->READY ends it: nothing may pile up.
GST_START_TEST(test_state_cycles_end_their_groups) {
  GstElement* p = gst_parse_launch(
      (src(2) + "vaeencode devices=cpu,cpu,cpu ! vaedecode devices=cpu,cpu ! fakesink").c_str(), nullptr);
  fail_unless(p != nullptr);
  int before = 0;
  for (int i = 0; i < 30; ++i) {
    fail_unless(gst_element_set_state(p, GST_STATE_PAUSED) != GST_STATE_CHANGE_FAILURE);
    gst_element_get_state(p, nullptr, nullptr, GST_CLOCK_TIME_NONE);
    fail_unless(gst_element_set_state(p, GST_STATE_NULL) == GST_STATE_CHANGE_SUCCESS);
    if (i == 2) before = threads_now();
  }
  const int after = threads_now();
  fail_unless(after <= before + 2, "threads grew from %d to %d over 27 cycles", before, after);
  gst_object_unref(p);
}
GST_END_TEST;

static Suite* parallel_suite() {
  Suite* s = suite_create("parallel-elements");
  TCase* tc = tcase_create("devices");
  tcase_set_timeout(tc, 600);
  suite_add_tcase(s, tc);
  tcase_add_test(tc, test_bad_devices_lists_are_errors);
  tcase_add_test(tc, test_devices_properties);
  tcase_add_test(tc, test_data_parallel_and_stages);
  tcase_add_test(tc, test_state_cycles_end_their_groups);
  if (!latent_test::have_fixtures()) {
    latent_test::skip_missing("no diffusers fixtures (LATENT_VAE_FIXTURES unset: a build without the .venv)");
    return s;
  }
  tcase_add_test(tc, test_devices_encode_equals_one_device);
  tcase_add_test(tc, test_devices_decode_equals_one_device);
  tcase_add_test(tc, test_devices_with_bands_equal_one_device);
  return s;
}

LATENT_CHECK_MAIN(parallel);
