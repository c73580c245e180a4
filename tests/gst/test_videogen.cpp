// videogen in pipelines and harnesses: the latent caps contract, exact frame counts through vaedecode, seeds,
// schedules, files, live latency, seeks, errors and state cycles. The model is latent-gen-small with random
// weights (tests/fixtures/gen_small_denoiser_fixtures.py), except where the shipped default generator is the subject.

// The C++ headers come first: check's function-like macros (fail, ...) would rewrite their members.
#include <sys/resource.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <string>
#include <vector>

#include <gst/app/gstappsink.h>
#include <gst/check/gstcheck.h>
#include <gst/check/gstharness.h>

#include "check_main.h"
#include "pipeline_run.h"

namespace {

namespace fs = std::filesystem;
using latent_test::Out;
using latent_test::run;

std::string generator_fixture() {
  const char* d = g_getenv("LATENT_SMALL_DENOISER_FIXTURES");
  return d ? std::string(d) + "/model.safetensors" : "";
}

// 64x48 video = 8x6 latents; 4 steps keep each run well under a second on two cores.
std::string gen(const std::string& props = "") {
  return "videogen model=" + generator_fixture() + " width=64 height=48 steps=4 " + props + " ! ";
}

constexpr size_t kLatentBytes = 16 * 6 * 8 * sizeof(float);

int caps_int(GstCaps* caps, const char* field) {
  int v = -1;
  gst_structure_get_int(gst_caps_get_structure(caps, 0), field, &v);
  return v;
}

bool same_bytes(GstBuffer* a, GstBuffer* b) {
  GstMapInfo ma, mb;
  gst_buffer_map(a, &ma, GST_MAP_READ);
  gst_buffer_map(b, &mb, GST_MAP_READ);
  const bool same = ma.size == mb.size && memcmp(ma.data, mb.data, ma.size) == 0;
  gst_buffer_unmap(a, &ma);
  gst_buffer_unmap(b, &mb);
  return same;
}

bool same_stream(const Out& a, const Out& b) {
  if (a.buffers.size() != b.buffers.size()) return false;
  for (size_t i = 0; i < a.buffers.size(); ++i)
    if (!same_bytes(a.buffers[i], b.buffers[i])) return false;
  return true;
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// A safetensors file holding one F32 tensor `name` of `shape`, zeros.
void write_embeds(const std::string& path, const char* name, std::vector<int> shape) {
  size_t n = 1;
  std::string dims;
  for (int d : shape) {
    n *= size_t(d);
    dims += (dims.empty() ? "" : ",") + std::to_string(d);
  }
  const std::string header = std::string("{\"") + name + "\":{\"dtype\":\"F32\",\"shape\":[" + dims +
                             "],\"data_offsets\":[0," + std::to_string(n * 4) + "]}}";
  std::ofstream f(path, std::ios::binary);
  const uint64_t len = header.size();
  f.write(reinterpret_cast<const char*>(&len), 8);
  f << header << std::string(n * 4, '\0');
}

// The tiny random diffusers Wan 2.1 pipeline folder (tests/fixtures/gen_wan_transformer_fixtures.py).
std::string wan_fixture() {
  const char* d = g_getenv("LATENT_WAN_TRANSFORMER_FIXTURES");
  return d && fs::exists(std::string(d) + "/stamp") ? std::string(d) + "/pipeline" : "";
}

bool all_finite(GstBuffer* b) {
  GstMapInfo m;
  gst_buffer_map(b, &m, GST_MAP_READ);
  bool ok = m.size % sizeof(float) == 0;
  for (size_t i = 0; ok && i < m.size / sizeof(float); ++i) {
    float v;
    memcpy(&v, m.data + i * sizeof(float), sizeof v);
    ok = std::isfinite(v);
  }
  gst_buffer_unmap(b, &m);
  return ok;
}

}  // namespace

GST_START_TEST(test_caps_and_stamps_follow_the_latent_contract) {
  Out out;
  run(gen("num-frames=9") + "appsink name=out", out);
  fail_unless(out.error.empty(), "%s", out.error.c_str());
  fail_unless_equals_int(out.buffers.size(), 3);  // frame 0, frames 1-4, frames 5-8
  GstStructure* s = gst_caps_get_structure(out.caps, 0);
  fail_unless_equals_string(gst_structure_get_name(s), "video/x-latent");
  fail_unless_equals_string(gst_structure_get_string(s, "model"), "latent-tiny-wan");
  fail_unless_equals_string(gst_structure_get_string(s, "format"), "F32");
  fail_unless_equals_int(caps_int(out.caps, "channels"), 16);
  fail_unless_equals_int(caps_int(out.caps, "width"), 8);
  fail_unless_equals_int(caps_int(out.caps, "height"), 6);
  fail_unless_equals_int(caps_int(out.caps, "video-width"), 64);
  fail_unless_equals_int(caps_int(out.caps, "video-height"), 48);
  fail_unless_equals_int(caps_int(out.caps, "temporal-factor"), 4);
  int n = 0, d = 0;
  fail_unless(gst_structure_get_fraction(s, "framerate", &n, &d) && n == 4 && d == 1);
  fail_unless(gst_structure_get_fraction(s, "video-framerate", &n, &d) && n == 16 && d == 1);
  const guint64 begins[] = {0, 1, 5}, ends[] = {1, 5, 9};
  for (size_t i = 0; i < 3; ++i) {
    GstBuffer* b = out.buffers[i];
    fail_unless_equals_uint64(gst_buffer_get_size(b), kLatentBytes);
    fail_unless_equals_uint64(GST_BUFFER_OFFSET(b), begins[i]);
    fail_unless_equals_uint64(GST_BUFFER_OFFSET_END(b), ends[i]);
    fail_unless_equals_uint64(GST_BUFFER_PTS(b), gst_util_uint64_scale(begins[i], GST_SECOND, 16));
    fail_unless_equals_uint64(GST_BUFFER_PTS(b) + GST_BUFFER_DURATION(b),
                              gst_util_uint64_scale(ends[i], GST_SECOND, 16));
    fail_unless_equals_int(GST_BUFFER_IS_DISCONT(b), i == 0);
  }
}
GST_END_TEST;

// num-frames counts video frames: the last latent's offsets say how many of its frames are real.
GST_START_TEST(test_num_frames_is_exact_through_vaedecode) {
  for (int frames : {1, 2, 4, 5, 6, 13}) {
    Out out;
    run(gen("num-frames=" + std::to_string(frames)) + "vaedecode ! appsink name=out", out);
    fail_unless(out.error.empty(), "%d frames: %s", frames, out.error.c_str());
    fail_unless_equals_int(out.buffers.size(), frames);
    fail_unless_equals_int(caps_int(out.caps, "width"), 64);
    for (int i = 0; i < frames; ++i)
      fail_unless_equals_uint64(GST_BUFFER_PTS(out.buffers[size_t(i)]), gst_util_uint64_scale(i, GST_SECOND, 16));
  }
}
GST_END_TEST;

// A run shows how far it is from its first step: "videogen-progress" element messages count the iterations of the
// run (3 steps of one clip here), the last one with nothing left.
GST_START_TEST(test_progress_is_posted_from_the_first_step) {
  struct Seen {
    std::mutex lock;
    std::vector<std::array<gint64, 2>> steps;
    std::vector<guint64> etas;
    std::string last_text;
  } seen;
  Out out;
  run(gen("schedule=clip num-frames=9 steps=3") + "appsink name=out", out, 120 * GST_SECOND,
      [&seen](GstElement* pipeline) {
        GstBus* bus = gst_element_get_bus(pipeline);
        gst_bus_set_sync_handler(
            bus,
            [](GstBus*, GstMessage* m, gpointer data) {
              const GstStructure* st = gst_message_get_structure(m);
              if (GST_MESSAGE_TYPE(m) == GST_MESSAGE_ELEMENT && gst_structure_has_name(st, "videogen-progress")) {
                auto* into = static_cast<Seen*>(data);
                gint64 i = 0, n = 0;
                guint64 eta = 0;
                gst_structure_get_int64(st, "iteration", &i);
                gst_structure_get_int64(st, "iterations", &n);
                gst_structure_get_uint64(st, "eta", &eta);
                const gchar* text = gst_structure_get_string(st, "text");
                std::lock_guard<std::mutex> hold(into->lock);
                into->steps.push_back({i, n});
                into->etas.push_back(eta);
                into->last_text = text ? text : "";
              }
              return GST_BUS_PASS;
            },
            &seen, nullptr);
        gst_object_unref(bus);
      });
  fail_unless(out.error.empty(), "%s", out.error.c_str());
  fail_unless(!seen.steps.empty(), "no progress message");
  fail_unless_equals_int(seen.steps.front()[0], 1);
  fail_unless_equals_int(seen.steps.back()[0], 3);
  for (const auto& s : seen.steps) fail_unless_equals_int(s[1], 3);
  fail_unless_equals_uint64(seen.etas.back(), 0);
  fail_unless_equals_uint64(seen.etas.front(), GST_CLOCK_TIME_NONE);  // one step says nothing of the rest
  fail_unless_equals_string(seen.last_text.c_str(), "step 3 of 3");
}
GST_END_TEST;

// An endless run posts its first progress message and then at most one a minute: an application that never pops
// its bus must not collect four messages a second for as long as the stream runs.
GST_START_TEST(test_an_endless_run_posts_little_progress) {
  GstElement* pipeline = gst_parse_launch((gen() + "appsink name=out sync=false max-buffers=1").c_str(), nullptr);
  fail_unless(pipeline != nullptr);
  std::atomic<int> posted{0};
  GstBus* bus = gst_element_get_bus(pipeline);
  gst_bus_set_sync_handler(
      bus,
      [](GstBus*, GstMessage* m, gpointer data) {
        if (GST_MESSAGE_TYPE(m) == GST_MESSAGE_ELEMENT &&
            gst_structure_has_name(gst_message_get_structure(m), "videogen-progress"))
          ++*static_cast<std::atomic<int>*>(data);
        return GST_BUS_PASS;
      },
      &posted, nullptr);
  GstAppSink* sink = GST_APP_SINK(gst_bin_get_by_name(GST_BIN(pipeline), "out"));
  fail_unless(gst_element_set_state(pipeline, GST_STATE_PLAYING) != GST_STATE_CHANGE_FAILURE);
  // Over 1.5 s of an endless stream: six or more messages at four a second.
  const gint64 t0 = g_get_monotonic_time();
  int latents = 0;
  while (g_get_monotonic_time() - t0 < 1500 * G_TIME_SPAN_MILLISECOND || latents < 3) {
    GstSample* sample = gst_app_sink_try_pull_sample(sink, 60 * GST_SECOND);
    fail_unless(sample != nullptr, "the endless stream stopped after %d latents", latents);
    gst_sample_unref(sample);
    ++latents;
  }
  gst_element_set_state(pipeline, GST_STATE_NULL);
  gst_object_unref(sink);
  gst_object_unref(bus);
  gst_object_unref(pipeline);
  fail_unless_equals_int(posted.load(), 1);
}
GST_END_TEST;

GST_START_TEST(test_zero_frames_is_an_empty_stream) {
  Out out;
  run(gen("num-frames=0") + "appsink name=out", out);
  fail_unless(out.error.empty(), "%s", out.error.c_str());
  fail_unless_equals_int(out.buffers.size(), 0);
}
GST_END_TEST;

GST_START_TEST(test_every_schedule_repeats_its_seed) {
  for (const char* schedule : {"clip", "fifo", "rolling"}) {
    const std::string props = std::string("schedule=") + schedule + " num-frames=21 ";
    Out a, b, c;
    run(gen(props + "seed=3") + "appsink name=out", a);
    run(gen(props + "seed=3") + "appsink name=out", b);
    run(gen(props + "seed=4") + "appsink name=out", c);
    fail_unless(a.error.empty() && c.error.empty(), "%s: %s %s", schedule, a.error.c_str(), c.error.c_str());
    fail_unless_equals_int(a.buffers.size(), 6);
    fail_unless(same_stream(a, b), "%s: the same seed gave other latents", schedule);
    fail_unless(!same_bytes(a.buffers[0], c.buffers[0]), "%s: another seed gave the same latents", schedule);
  }
}
GST_END_TEST;

GST_START_TEST(test_endless_stream_is_continuous) {
  GstHarness* h = gst_harness_new_parse(
      ("videogen model=" + generator_fixture() + " width=64 height=48 steps=3 schedule=rolling").c_str());
  gst_harness_play(h);
  guint64 expected = 0;
  for (int k = 0; k < 30; ++k) {
    GstBuffer* b = gst_harness_pull(h);
    fail_unless(b != nullptr, "latent %d", k);
    fail_unless_equals_uint64(GST_BUFFER_OFFSET(b), expected);
    expected = GST_BUFFER_OFFSET_END(b);
    fail_unless_equals_uint64(expected - GST_BUFFER_OFFSET(b), k == 0 ? 1u : 4u);
    gst_buffer_unref(b);
  }
  gst_harness_teardown(h);
}
GST_END_TEST;

GST_START_TEST(test_latent_files_replay_the_stream) {
  const std::string dir = fs::temp_directory_path() / ("videogen-files-" + std::to_string(getpid()));
  fs::create_directories(dir);
  Out direct, written, replayed;
  run(gen("num-frames=10 seed=9") + "vaedecode ! appsink name=out", direct);
  run(gen("num-frames=10 seed=9") + "latentfilesink location=" + dir + "/gen.safetensors", written);
  fail_unless(written.error.empty(), "%s", written.error.c_str());
  run("latentfilesrc location=" + dir + "/gen.safetensors ! vaedecode ! appsink name=out", replayed);
  fail_unless(replayed.error.empty(), "%s", replayed.error.c_str());
  fail_unless_equals_int(direct.buffers.size(), 10);
  fail_unless(same_stream(direct, replayed), "frames decoded from the file differ");
  fs::remove_all(dir);
}
GST_END_TEST;

GST_START_TEST(test_downstream_that_wants_other_latents_is_told) {
  Out model, size;
  run(gen("num-frames=5") + "video/x-latent,model=wan2.1 ! appsink name=out", model);
  fail_unless(contains(model.error, "makes latents of model 'latent-tiny-wan' (16 channels, 8x6 latents for 64x48"),
              "got '%s'", model.error.c_str());
  run(gen("num-frames=5") + "video/x-latent,width=20 ! appsink name=out", size);
  fail_unless(contains(size.error, "downstream accepts none of them"), "got '%s'", size.error.c_str());
  // vaedecode's caps name the model it decodes, so videogen tells at negotiation.
  const char* vae_fixtures = g_getenv("LATENT_VAE_FIXTURES");
  if (vae_fixtures && fs::exists(std::string(vae_fixtures) + "/stamp")) {
    Out decoder;
    run(gen("num-frames=5") + "vaedecode model=" + vae_fixtures + "/wan ! appsink name=out", decoder);
    fail_unless(contains(decoder.error, "makes latents of model 'latent-tiny-wan'") &&
                    contains(decoder.error, "downstream accepts none of them"),
                "got '%s'", decoder.error.c_str());
  }
}
GST_END_TEST;

GST_START_TEST(test_bad_settings_are_named) {
  const std::string dir = fs::temp_directory_path() / ("videogen-bad-" + std::to_string(getpid()));
  fs::create_directories(dir);
  write_embeds(dir + "/prompt.safetensors", "prompt_embeds", {1, 4, 8});
  write_embeds(dir + "/other.safetensors", "text", {1, 4, 8});
  const std::string fixture = generator_fixture();
  struct {
    std::string props, expect;
  } cases[] = {
      {"model=" + fixture + " width=60 height=48", "must be multiples of 16 pixels"},
      {"model=" + fixture + " width=64", "set both width and height"},
      {"model=" + fixture, "this model declares no size: set width and height"},
      {"model=" + fixture + " width=64 height=48 schedule=clip num-frames=200",
       "the clip schedule makes at most 16 (61 frames)"},
      {"model=" + fixture + " width=64 height=48 schedule=rolling context=16", "context 16"},
      {"model=" + fixture + " width=64 height=48 window=17", "window 17"},
      {"model=" + fixture + " width=64 height=48 guidance-scale=3", "takes no text conditioning"},
      {"model=" + fixture + " width=64 height=48 sampler=ddim", "ddim"},
      {"model=" + fixture + " width=64 height=48 prompt-embeds=" + dir + "/prompt.safetensors",
       "takes no text conditioning"},
      {"model=" + fixture + " width=64 height=48 prompt-embeds=" + dir + "/other.safetensors",
       "has no tensor \"prompt_embeds\""},
      {"model=" + fixture + " width=64 height=48 prompt-embeds=" + dir + "/missing.safetensors",
       "Cannot read an input of the run: " + dir + "/missing.safetensors"},
      {"model=/nonexistent/gen.safetensors", "no such file or directory"},
      {"model=" + std::string(LATENT_TEST_SOURCE_ROOT) + "/models/latent-tiny-wan.safetensors",
       "not a denoiser gst-latent knows"},
      {"model=" + fixture + " device=cuda:7", "'cuda:7' requested, but this machine has"},
      // Refused from its latents alone before anything is allocated, not after minutes of swapping.
      {"model=" + fixture + " width=65536 height=65536", "for the latents alone"},
      {"", "default generator is missing"},  // with LATENT_DEFAULT_GENERATOR pointing nowhere, below
  };
  g_setenv("LATENT_DEFAULT_GENERATOR", "/nonexistent/latent-gen-small.safetensors", TRUE);
  for (const auto& c : cases) {
    Out out;
    run("videogen num-frames=5 " + c.props + " ! appsink name=out", out);
    fail_unless(contains(out.error, c.expect), "%s: got '%s'", c.props.c_str(), out.error.c_str());
  }
  g_unsetenv("LATENT_DEFAULT_GENERATOR");
  fs::remove_all(dir);
}
GST_END_TEST;

GstPadProbeReturn keep_first_pts(GstPad*, GstPadProbeInfo* info, gpointer data) {
  auto* first = static_cast<std::atomic<GstClockTime>*>(data);
  GstClockTime none = GST_CLOCK_TIME_NONE;
  first->compare_exchange_strong(none, GST_BUFFER_PTS(GST_PAD_PROBE_INFO_BUFFER(info)));
  return GST_PAD_PROBE_OK;
}

guint64 uint64_property(GstElement* e, const char* name) {
  guint64 v = 0;
  g_object_get(e, name, &v, nullptr);
  return v;
}

// Live: READY->PAUSED does not run the model (nothing is generated before PLAYING, on the streaming thread); the
// timestamps start at the running time the first latent exists, and the latency is a bound on one steady step.
GST_START_TEST(test_live_source_starts_at_once_and_bounds_its_steps) {
  GstElement* pipeline = gst_parse_launch((gen("is-live=true") + "fakesink sync=true name=out").c_str(), nullptr);
  fail_unless(pipeline != nullptr);
  GstElement* src = gst_bin_get_by_name(GST_BIN(pipeline), "videogen0");
  std::atomic<GstClockTime> first_pts{GST_CLOCK_TIME_NONE};
  GstPad* pad = gst_element_get_static_pad(src, "src");
  gst_pad_add_probe(pad, GST_PAD_PROBE_TYPE_BUFFER, keep_first_pts, &first_pts, nullptr);
  gst_object_unref(pad);
  fail_unless_equals_int(gst_element_set_state(pipeline, GST_STATE_PAUSED), GST_STATE_CHANGE_NO_PREROLL);
  fail_unless_equals_uint64(uint64_property(src, "model-calls"), 0);
  fail_unless(gst_element_set_state(pipeline, GST_STATE_PLAYING) != GST_STATE_CHANGE_FAILURE);
  guint64 made = 0;
  for (int i = 0; i < 600 && made < 4; ++i) {
    g_usleep(G_USEC_PER_SEC / 10);
    made = uint64_property(src, "latents-out");
  }
  fail_unless(made >= 4, "a live videogen pushed %" G_GUINT64_FORMAT " latents", made);
  // The first latent needs the fifo queue filled (several model calls): it cannot be stamped at time 0.
  fail_unless(GST_CLOCK_TIME_IS_VALID(first_pts.load()) && first_pts.load() > 0);
  GstQuery* q = gst_query_new_latency();
  fail_unless(gst_element_query(pipeline, q));
  gboolean live = FALSE;
  GstClockTime min = 0, max = 0;
  gst_query_parse_latency(q, &live, &min, &max);
  gst_query_unref(q);
  fail_unless(live);
  fail_unless(min > 0 && GST_CLOCK_TIME_IS_VALID(min), "latency %" GST_TIME_FORMAT, GST_TIME_ARGS(min));
  gst_element_set_state(pipeline, GST_STATE_NULL);
  gst_object_unref(src);
  gst_object_unref(pipeline);
}
GST_END_TEST;

// A state change stops a long clip between model calls instead of waiting for all of its steps.
GST_START_TEST(test_state_change_interrupts_generation) {
  GstElement* pipeline = gst_parse_launch((gen("schedule=clip num-frames=9") + "fakesink").c_str(), nullptr);
  GstElement* src = gst_bin_get_by_name(GST_BIN(pipeline), "videogen0");
  g_object_set(src, "steps", 1000u, nullptr);
  gst_element_set_state(pipeline, GST_STATE_PLAYING);
  for (int i = 0; i < 6000 && uint64_property(src, "model-calls") < 2; ++i) g_usleep(G_USEC_PER_SEC / 100);
  fail_unless(uint64_property(src, "model-calls") >= 2);
  fail_unless_equals_int(gst_element_set_state(pipeline, GST_STATE_NULL), GST_STATE_CHANGE_SUCCESS);
  const guint64 calls = uint64_property(src, "model-calls");
  fail_unless(calls < 1000, "going to NULL waited for all %" G_GUINT64_FORMAT " model calls", calls);
  fail_unless_equals_uint64(uint64_property(src, "latents-out"), 0);
  gst_object_unref(src);
  gst_object_unref(pipeline);
}
GST_END_TEST;

// Its enums are documented as plugin API, and the model blurb warns that a .pt2 package is native code.
GST_START_TEST(test_enums_are_plugin_api_and_packages_need_trust) {
  GstElement* e = gst_element_factory_make("videogen", nullptr);
  for (const char* p : {"schedule", "sampler"}) {
    GParamSpec* spec = g_object_class_find_property(G_OBJECT_GET_CLASS(e), p);
    fail_unless(gst_type_is_plugin_api(spec->value_type, nullptr), "%s", p);
  }
  GParamSpec* model = g_object_class_find_property(G_OBJECT_GET_CLASS(e), "model");
  fail_unless(strstr(g_param_spec_get_blurb(model), "trust") != nullptr);
  gst_object_unref(e);
}
GST_END_TEST;

static std::vector<GstBuffer*> pull(GstElement* sink, int n) {
  std::vector<GstBuffer*> out;
  for (int i = 0; i < n; ++i) {
    GstSample* s = gst_app_sink_try_pull_sample(GST_APP_SINK(sink), 60 * GST_SECOND);
    fail_unless(s != nullptr, "sample %d", i);
    out.push_back(gst_buffer_ref(gst_sample_get_buffer(s)));
    gst_sample_unref(s);
  }
  return out;
}

// There is no random access into a generated stream: a flushing seek to the start replays it from its seed,
// any other position is refused and the stream goes on.
GST_START_TEST(test_seek_to_start_replays_and_others_are_refused) {
  GstElement* pipeline = gst_parse_launch(
      (gen("seed=5") + "appsink name=out sync=false max-buffers=2 emit-signals=false").c_str(), nullptr);
  GstElement* sink = gst_bin_get_by_name(GST_BIN(pipeline), "out");
  gst_element_set_state(pipeline, GST_STATE_PLAYING);
  fail_unless(gst_element_get_state(pipeline, nullptr, nullptr, 60 * GST_SECOND) == GST_STATE_CHANGE_SUCCESS);
  std::vector<GstBuffer*> before = pull(sink, 6);
  fail_unless(gst_element_seek_simple(pipeline, GST_FORMAT_TIME, GstSeekFlags(GST_SEEK_FLAG_FLUSH), 0));
  std::vector<GstBuffer*> again = pull(sink, 6);
  for (size_t i = 0; i < before.size(); ++i) {
    fail_unless(same_bytes(before[i], again[i]), "latent %zu differs after the seek", i);
    fail_unless_equals_uint64(GST_BUFFER_OFFSET(again[i]), GST_BUFFER_OFFSET(before[i]));
    fail_unless_equals_uint64(GST_BUFFER_PTS(again[i]), GST_BUFFER_PTS(before[i]));
  }
  fail_unless(GST_BUFFER_IS_DISCONT(again[0]));
  fail_if(gst_element_seek_simple(pipeline, GST_FORMAT_TIME, GstSeekFlags(GST_SEEK_FLAG_FLUSH), GST_SECOND));
  std::vector<GstBuffer*> later = pull(sink, 1);
  fail_unless_equals_uint64(GST_BUFFER_OFFSET(later[0]), GST_BUFFER_OFFSET_END(again.back()));
  for (auto* v : {&before, &again, &later})
    for (GstBuffer* b : *v) gst_buffer_unref(b);
  gst_element_set_state(pipeline, GST_STATE_NULL);
  gst_object_unref(sink);
  gst_object_unref(pipeline);
}
GST_END_TEST;

// A diffusers Wan 2.1 folder runs natively: the prompt embeddings come from prompt-embeds (with the negative ones,
// since the folder's default guidance is 5), the sampler from its scheduler config, and the latents are Wan's.
GST_START_TEST(test_native_wan_folder_generates) {
  const std::string dir = fs::temp_directory_path() / ("videogen-wan-" + std::to_string(getpid()));
  fs::create_directories(dir);
  const std::string embeds = dir + "/prompt.safetensors";
  {
    // Two zero tensors [1, 512, 24] (the fixture's text_dim) back to back.
    const size_t bytes = 512 * 24 * 4;
    const std::string header =
        "{\"negative_prompt_embeds\":{\"dtype\":\"F32\",\"shape\":[1,512,24],"
        "\"data_offsets\":[0," +
        std::to_string(bytes) +
        "]},\"prompt_embeds\":{\"dtype\":"
        "\"F32\",\"shape\":[1,512,24],\"data_offsets\":[" +
        std::to_string(bytes) + "," + std::to_string(2 * bytes) + "]}}";
    std::ofstream f(embeds, std::ios::binary);
    const uint64_t len = header.size();
    f.write(reinterpret_cast<const char*>(&len), 8);
    f << header << std::string(2 * bytes, '\0');
  }
  const std::string desc = "videogen model=" + wan_fixture() + " prompt-embeds=" + embeds +
                           " width=96 height=64 steps=2 num-frames=5 schedule=clip ! appsink name=out";
  Out a, b;
  run(desc, a);
  fail_unless(a.error.empty(), "%s", a.error.c_str());
  fail_unless_equals_int(a.buffers.size(), 2);  // frame 0, frames 1-4
  GstStructure* st = gst_caps_get_structure(a.caps, 0);
  fail_unless_equals_string(gst_structure_get_string(st, "model"), "wan2.1");
  fail_unless_equals_int(caps_int(a.caps, "channels"), 16);
  fail_unless_equals_int(caps_int(a.caps, "width"), 12);
  fail_unless_equals_int(caps_int(a.caps, "height"), 8);
  for (GstBuffer* buf : a.buffers) {
    fail_unless_equals_uint64(gst_buffer_get_size(buf), 16 * 8 * 12 * sizeof(float));
    fail_unless(all_finite(buf));
  }
  run(desc, b);
  fail_unless(same_stream(a, b), "the same seed gave another stream");
  // A bfloat16 model hands on the sampler's float32 latents unrounded (WanPipeline gives its VAE float32);
  // format=BF16 rounds them on request.
  const std::string bf16 = "videogen model=" + wan_fixture() + " prompt-embeds=" + embeds +
                           " dtype=bfloat16 width=96 height=64 steps=2 num-frames=5 schedule=clip";
  Out wide, narrow;
  run(bf16 + " ! appsink name=out", wide);
  run(bf16 + " format=BF16 ! appsink name=out", narrow);
  fail_unless(wide.error.empty() && narrow.error.empty(), "%s %s", wide.error.c_str(), narrow.error.c_str());
  fail_unless_equals_string(gst_structure_get_string(gst_caps_get_structure(wide.caps, 0), "format"), "F32");
  fail_unless_equals_string(gst_structure_get_string(gst_caps_get_structure(narrow.caps, 0), "format"), "BF16");
  fail_unless_equals_int(narrow.buffers.size(), wide.buffers.size());
  bool rounded_somewhere = false;
  for (size_t i = 0; i < wide.buffers.size(); ++i) {
    fail_unless_equals_uint64(gst_buffer_get_size(wide.buffers[i]), 16 * 8 * 12 * sizeof(float));
    GstMapInfo w, n;
    gst_buffer_map(wide.buffers[i], &w, GST_MAP_READ);
    gst_buffer_map(narrow.buffers[i], &n, GST_MAP_READ);
    for (size_t k = 0; k < 16 * 8 * 12; ++k) {
      uint32_t bits;
      uint16_t got;
      std::memcpy(&bits, w.data + 4 * k, 4);
      std::memcpy(&got, n.data + 2 * k, 2);
      // bfloat16 is float32's upper half, rounded to nearest even (the values are finite).
      const auto want = uint16_t((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
      fail_unless_equals_int(got, want);
      rounded_somewhere = rounded_somewhere || (bits & 0xffffu) != 0;
    }
    gst_buffer_unmap(wide.buffers[i], &w);
    gst_buffer_unmap(narrow.buffers[i], &n);
  }
  fail_unless(rounded_somewhere, "the float32 latents hold nothing bfloat16 would round");
  fs::remove_all(dir);
}
GST_END_TEST;

GST_START_TEST(test_enums_list_their_values) {
  GstElement* e = gst_element_factory_make("videogen", nullptr);
  fail_unless(e != nullptr);
  struct {
    const char* property;
    std::vector<const char*> nicks;
    const char* fallback;
  } enums[] = {{"schedule", {"auto", "clip", "fifo", "rolling", "causal"}, "auto"},
               {"sampler", {"default", "euler", "unipc", "ddim", "dpm"}, "default"},
               {"format", {"F32", "F16", "BF16"}, "F32"}};
  for (const auto& en : enums) {
    GParamSpec* p = g_object_class_find_property(G_OBJECT_GET_CLASS(e), en.property);
    fail_unless(p && G_IS_PARAM_SPEC_ENUM(p), "%s is not an enum", en.property);
    GEnumClass* klass = G_PARAM_SPEC_ENUM(p)->enum_class;
    fail_unless_equals_int(klass->n_values, en.nicks.size());
    for (const char* nick : en.nicks) fail_unless(g_enum_get_value_by_nick(klass, nick) != nullptr, "%s", nick);
    fail_unless_equals_string(g_enum_get_value(klass, G_PARAM_SPEC_ENUM(p)->default_value)->value_nick, en.fallback);
  }
  gst_object_unref(e);
}
GST_END_TEST;

// The shipped default generator with the shipped default VAE: no model property anywhere.
GST_START_TEST(test_default_generator_makes_video) {
  Out out;
  run("videogen num-frames=9 ! vaedecode ! appsink name=out", out);
  fail_unless(out.error.empty(), "%s", out.error.c_str());
  fail_unless_equals_int(out.buffers.size(), 9);
  fail_unless_equals_int(caps_int(out.caps, "width"), 128);
  fail_unless_equals_int(caps_int(out.caps, "height"), 128);
}
GST_END_TEST;

GST_START_TEST(test_state_cycles_do_not_leak) {
  const long grown = latent_test::rss_growth_over_state_cycles(gen("num-frames=5 steps=2") + "vaedecode ! fakesink");
  // Each cycle loads the generator (8.8 MB of weights) and the VAE: a copy left behind per cycle would add
  // over 1.4 GB in 160 cycles. Allocator noise stays within a few MiB (see gst-vae-cycles for the margin).
  fail_unless(grown < 64 * 1024, "RSS grew by %ld KiB over 160 NULL->PLAYING->NULL cycles", grown);
}
GST_END_TEST;

static Suite* videogen_suite() {
  Suite* s = suite_create("videogen");
  TCase* tc = tcase_create("videogen");
  tcase_set_timeout(tc, 600);
  suite_add_tcase(s, tc);
  tcase_add_test(tc, test_enums_list_their_values);
  tcase_add_test(tc, test_enums_are_plugin_api_and_packages_need_trust);
  tcase_add_test(tc, test_default_generator_makes_video);
  if (!wan_fixture().empty())
    tcase_add_test(tc, test_native_wan_folder_generates);
  else
    latent_test::skip_missing("no Wan transformer fixture (LATENT_WAN_TRANSFORMER_FIXTURES unset)");
  if (generator_fixture().empty() || !fs::exists(generator_fixture())) {
    latent_test::skip_missing("no generator fixture (LATENT_SMALL_DENOISER_FIXTURES unset)");
    return s;
  }
  tcase_add_test(tc, test_caps_and_stamps_follow_the_latent_contract);
  tcase_add_test(tc, test_num_frames_is_exact_through_vaedecode);
  tcase_add_test(tc, test_zero_frames_is_an_empty_stream);
  tcase_add_test(tc, test_progress_is_posted_from_the_first_step);
  tcase_add_test(tc, test_an_endless_run_posts_little_progress);
  tcase_add_test(tc, test_every_schedule_repeats_its_seed);
  tcase_add_test(tc, test_endless_stream_is_continuous);
  tcase_add_test(tc, test_latent_files_replay_the_stream);
  tcase_add_test(tc, test_downstream_that_wants_other_latents_is_told);
  tcase_add_test(tc, test_bad_settings_are_named);
  tcase_add_test(tc, test_live_source_starts_at_once_and_bounds_its_steps);
  tcase_add_test(tc, test_state_change_interrupts_generation);
  tcase_add_test(tc, test_seek_to_start_replays_and_others_are_refused);
  tcase_add_test(tc, test_state_cycles_do_not_leak);
  return s;
}

LATENT_CHECK_MAIN(videogen);
