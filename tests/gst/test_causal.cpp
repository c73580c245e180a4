// videogen schedule=causal: causal few-step Wan (Self-Forcing, LongLive) as a GStreamer source, against the
// references' own inference (tests/fixtures/data/causal/, made by tests/fixtures/gen_causal_fixtures.py from their
// code), prompts switched by script and while playing, live timestamps that follow when latents exist, memory over
// an endless stream, and the errors of bad settings.

// The C++ headers come first: check's function-like macros (fail, ...) would rewrite their members.
#include <torch/types.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "latent/gen/prompts.h"
#include "latent/gen/text_encoder.h"
#include "latent/io/safetensors.h"
#include "prompt_switcher.h"

#include <gst/app/gstappsink.h>
#include <gst/check/gstcheck.h>

#include "check_main.h"
#include "generated_latents.h"
#include "pipeline_run.h"
#include "prompt_settled.h"
#include "test_restyle.h"

namespace {

namespace fs = std::filesystem;
using latent_test::Out;
using latent_test::relative_error;
using latent_test::stacked;

// The core's test holds the schedule to 1e-4 of the reference's largest value (tests/core/gen/test_causal.cpp says
// why); here the element adds nothing but the wire format (float32), so the same bound holds on the norm.
constexpr double kTolerance = 1e-4;

fs::path data() { return fs::path(LATENT_TEST_SOURCE_ROOT) / "tests" / "fixtures" / "data" / "causal"; }

fs::path pipeline_fixtures() {
  const char* d = g_getenv("LATENT_PIPELINE_FIXTURES");
  return d && fs::exists(fs::path(d) / "stamp") ? fs::path(d) : fs::path();
}

const latent::SafetensorsFile& cases() {
  static const latent::SafetensorsFile f = latent::SafetensorsFile::open(data() / "causal-cases.safetensors");
  return f;
}

// [1, T, C, h, w] -> [1, C, T, h, w]
torch::Tensor channels_first(const torch::Tensor& t) { return t.permute({0, 2, 1, 3, 4}).contiguous(); }

fs::path scratch() {
  static const fs::path dir = [] {
    fs::path p = fs::temp_directory_path() / ("latent-causal-" + std::to_string(getpid()));
    fs::create_directories(p);
    return p;
  }();
  return dir;
}

// A prompt-embeds file: prompt A, and prompt B from each latent frame in `switches`.
std::string embeds(const std::string& name, const std::vector<int64_t>& switches = {},
                   const std::string& first = "prompt.A") {
  const fs::path path = scratch() / (name + ".safetensors");
  latent::SafetensorsWriter out(path, {.durable = false});
  out.write("prompt_embeds", cases().tensor(first).clone());
  for (int64_t f : switches) out.write("prompt_embeds@" + std::to_string(f), cases().tensor("prompt.B").clone());
  out.commit();
  return path.string();
}

std::string noise_file(const std::string& name) {
  const fs::path path = scratch() / (name + "-noise.safetensors");
  latent::SafetensorsWriter out(path, {.durable = false});
  out.write("latents", cases().tensor(name + ".noise").clone());
  out.commit();
  return path.string();
}

// The fixture's model through videogen: latents of 6x8 (video 48x64), T latent frames = 1 + 4 (T - 1) video frames.
std::string causal_gen(int64_t latents, const std::string& props) {
  return "videogen name=gen model=" + (data() / "pipeline").string() +
         " transformer-weights=" + (data() / "causal-model.pt").string() +
         " schedule=causal seed=42 width=64 height=48 num-frames=" + std::to_string(1 + 4 * (latents - 1)) + " " +
         props + " ! ";
}

struct Tag {
  size_t before_buffer;  // buffers the sink had received when the tag came
  std::string prompt;
  guint index;
};

// Records the prompt tags reaching the appsink named "out" and how many buffers came before each.
struct TagProbe {
  std::mutex mu;
  std::vector<Tag> tags;
  size_t buffers = 0;
  static GstPadProbeReturn probe(GstPad*, GstPadProbeInfo* info, gpointer data) {
    auto* self = static_cast<TagProbe*>(data);
    std::lock_guard<std::mutex> lock(self->mu);
    if (GST_PAD_PROBE_INFO_TYPE(info) & GST_PAD_PROBE_TYPE_BUFFER) {
      self->buffers++;
    } else if (GstEvent* e = GST_PAD_PROBE_INFO_EVENT(info); e && GST_EVENT_TYPE(e) == GST_EVENT_TAG) {
      GstTagList* list = nullptr;
      gst_event_parse_tag(e, &list);
      gchar* prompt = nullptr;
      guint index = 0;
      if (gst_tag_list_get_string(list, "latent-prompt", &prompt) &&
          gst_tag_list_get_uint(list, "latent-prompt-index", &index))
        self->tags.push_back({self->buffers, prompt, index});
      g_free(prompt);
    }
    return GST_PAD_PROBE_OK;
  }
  void attach(GstElement* pipeline) {
    GstElement* sink = gst_bin_get_by_name(GST_BIN(pipeline), "out");
    GstPad* pad = gst_element_get_static_pad(sink, "sink");
    gst_pad_add_probe(pad, GstPadProbeType(GST_PAD_PROBE_TYPE_BUFFER | GST_PAD_PROBE_TYPE_EVENT_DOWNSTREAM), probe,
                      this, nullptr);
    gst_object_unref(pad);
    gst_object_unref(sink);
  }
};

// Plays `pipeline` (videogen "gen" ! appsink "out") to its end on this thread, calling `each` with the count so
// far (from 1), the latent and the generator; ends in NULL. Returns how many latents came.
using EachLatent = std::function<void(size_t n, GstSample* latent, GstElement* gen)>;
size_t play_to_end(GstElement* pipeline, const EachLatent& each) {
  GstElement* gen = gst_bin_get_by_name(GST_BIN(pipeline), "gen");
  GstAppSink* sink = GST_APP_SINK(gst_bin_get_by_name(GST_BIN(pipeline), "out"));
  fail_unless(gst_element_set_state(pipeline, GST_STATE_PLAYING) != GST_STATE_CHANGE_FAILURE, "the start was refused");
  size_t n = 0;
  while (GstSample* s = gst_app_sink_try_pull_sample(sink, 60 * GST_SECOND)) {
    each(++n, s, gen);
    gst_sample_unref(s);
  }
  fail_unless(gst_app_sink_is_eos(sink), "the stream did not end after %zu latents", n);
  gst_element_set_state(pipeline, GST_STATE_NULL);
  gst_object_unref(sink);
  gst_object_unref(gen);
  return n;
}

// Sets a prompt property while playing and waits until the switch is handed to the stream (the generator waits on
// the sink meanwhile, so it lands before the stream ends however slow the encoding).
void switch_and_settle(GstElement* gen, const char* name, const std::string& value,
                       latent_test::PromptsSettled& settled) {
  const size_t before = settled.count();
  g_object_set(gen, name, value.c_str(), nullptr);
  fail_unless(settled.wait_for(before + 1), "the live %s never reached the stream", name);
}

torch::Tensor run_ok(const std::string& desc, const std::function<void(GstElement*)>& setup = {}) {
  Out out;
  latent_test::run(desc + "appsink name=out", out, 120 * GST_SECOND, setup);
  fail_unless(out.error.empty(), "%s: %s", desc.c_str(), out.error.c_str());
  return stacked(out, 16, 6, 8);
}

// The error a pipeline posts on its way to PLAYING ("" when it plays).
std::string error_of(const std::string& desc) {
  Out out;
  latent_test::run(desc + "appsink name=out", out, 60 * GST_SECOND);
  return out.error;
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

void expect_case(const std::string& name, int64_t latents, const std::string& props) {
  const torch::Tensor got = run_ok(causal_gen(latents, "prompt-embeds=" + embeds("a") + " " + props));
  const double rel = relative_error(got, channels_first(cases().tensor(name + ".latents")));
  g_print("causal %s: %.2e relative to the reference\n", name.c_str(), rel);
  fail_unless(rel <= kTolerance, "%s: relative error %g", name.c_str(), rel);
}

}  // namespace

// Self-Forcing's global cache, a LongLive window evicting whole blocks with a sink, one evicting part of a block;
// initial-noise of the seed's draw ([1, T, C, h, w], as the references draw it) gives the seed's run.
GST_START_TEST(test_latents_match_the_references) {
  expect_case("self_forcing", 9, "");
  expect_case("window6_sink3", 9, "kv-window=6 sink-frames=3");
  expect_case("window5_sink1", 9, "kv-window=5 sink-frames=1");
  const std::string props = "prompt-embeds=" + embeds("a") + " kv-window=6 sink-frames=3";
  fail_unless(torch::equal(run_ok(causal_gen(9, props + " initial-noise=" + noise_file("window6_sink3"))),
                           run_ok(causal_gen(9, props))),
              "initial-noise of the seed's draw gave another run than the seed");
}
GST_END_TEST;

// prompt_embeds@12 in the embeddings file is LongLive's switch at latent frame 12, past a window of 9, with and
// without global-sink; a tag before latent 12 says which prompt the stream switched to.
GST_START_TEST(test_scripted_switch_matches_longlive) {
  for (const bool global_sink : {true, false}) {
    TagProbe tags;
    const std::string file = embeds("switch12", {12});
    const torch::Tensor got =
        run_ok(causal_gen(15, "prompt-embeds=" + file + " kv-window=9 sink-frames=3 global-sink=" +
                                  (global_sink ? "true" : "false")),
               [&](GstElement* p) { tags.attach(p); });
    const std::string name = std::string("switch12_window9_sink3") + (global_sink ? "" : "_gs0");
    const double rel = relative_error(got, channels_first(cases().tensor(name + ".latents")));
    g_print("causal %s: %.2e relative to LongLive\n", name.c_str(), rel);
    fail_unless(rel <= kTolerance, "%s: relative error %g", name.c_str(), rel);
    fail_unless_equals_int(tags.tags.size(), 1);
    fail_unless_equals_int(tags.tags[0].before_buffer, 12);
    fail_unless_equals_string(tags.tags[0].prompt.c_str(), "prompt_embeds@12");
    fail_unless_equals_int(tags.tags[0].index, 1);
  }
  // A switch at frame 3, inside the window: the re-cache starts at frame 0 and makes the sink again.
  const torch::Tensor got = run_ok(causal_gen(9, "prompt-embeds=" + embeds("switch3", {3}) + " kv-window=6 sink-frames=3"));
  fail_unless(relative_error(got, channels_first(cases().tensor("switch3_window6_sink3.latents"))) <= kTolerance,
              "switch at frame 3");
}
GST_END_TEST;

// prompt set while playing: encoded aside, switched at a block start, tagged there; the stream equals the one
// whose file scripts the switch at that frame, and its frames before it equal the run without a switch.
GST_START_TEST(test_prompt_set_while_playing_switches_at_a_block_start) {
  const std::string desc = causal_gen(15, "prompt-embeds=" + embeds("live") + " kv-window=9 sink-frames=3") +
                           "appsink name=out sync=false max-buffers=1";
  GstElement* pipeline = gst_parse_launch(desc.c_str(), nullptr);
  fail_unless(pipeline != nullptr);
  TagProbe tags;
  tags.attach(pipeline);
  Out out;
  const std::string b = embeds("b", {}, "prompt.B");
  latent_test::PromptsSettled settled;
  play_to_end(pipeline, [&](size_t n, GstSample* s, GstElement* gen) {
    out.buffers.push_back(gst_buffer_ref(gst_sample_get_buffer(s)));
    if (n == 4) switch_and_settle(gen, "prompt-embeds", b, settled);
  });
  gst_object_unref(pipeline);
  fail_unless_equals_int(out.buffers.size(), 15);
  fail_unless_equals_int(tags.tags.size(), 1);
  const size_t at = tags.tags[0].before_buffer;
  fail_unless(at % 3 == 0 && at >= 6 && at < 15, "switched at latent %zu, not at a later block start", at);
  fail_unless_equals_string(tags.tags[0].prompt.c_str(), b.c_str());
  const torch::Tensor got = stacked(out, 16, 6, 8);
  const auto base = [](const std::string& file) {
    return causal_gen(15, "kv-window=9 sink-frames=3 prompt-embeds=" + file);
  };
  const torch::Tensor scripted = run_ok(base(embeds("scripted", {int64_t(at)})));
  fail_unless(torch::equal(got, scripted), "the switch while playing differs from the scripted one at %zu", at);
  const torch::Tensor plain = run_ok(base(embeds("a")));
  fail_unless(torch::equal(got.narrow(2, 0, int64_t(at)), plain.narrow(2, 0, int64_t(at))),
              "frames before the switch changed");
  fail_unless(!torch::equal(got.narrow(2, int64_t(at), 3), plain.narrow(2, int64_t(at), 3)),
              "the switch changed nothing");
}
GST_END_TEST;

// prompt-schedule with a folder's text encoder: latents before the switch are the run's without it, those after
// differ, and the tag names the prompt.
GST_START_TEST(test_prompt_schedule_encodes_its_prompts) {
  const std::string wan = (pipeline_fixtures() / "wan").string();
  const std::string base = "videogen name=gen model=" + wan +
                           " schedule=causal width=96 height=64 num-frames=21 kv-window=6 seed=3 prompt=\"a red fox\" ";
  const auto run_text = [&](const std::string& extra, TagProbe* tags) {
    Out out;
    latent_test::run(base + extra + " ! appsink name=out", out, 120 * GST_SECOND, [&](GstElement* p) {
      if (tags) tags->attach(p);
    });
    fail_unless(out.error.empty(), "%s: %s", extra.c_str(), out.error.c_str());
    return stacked(out, 16, 8, 12);
  };
  TagProbe tags;
  const torch::Tensor plain = run_text("", nullptr);
  const torch::Tensor switched = run_text("prompt-schedule=\"3:a snowy forest at night\"", &tags);
  fail_unless(torch::equal(plain.narrow(2, 0, 3), switched.narrow(2, 0, 3)), "frames before the switch changed");
  fail_unless(relative_error(switched.narrow(2, 3, 3), plain.narrow(2, 3, 3)) > 1e-3, "the switch changed nothing");
  fail_unless_equals_int(tags.tags.size(), 1);
  fail_unless_equals_int(tags.tags[0].before_buffer, 3);
  fail_unless_equals_string(tags.tags[0].prompt.c_str(), "a snowy forest at night");
}
GST_END_TEST;

// prompt and prompt-embeds are one prompt given two ways: set while playing, either replaces the other. Started
// from prompt=, a live prompt-embeds switches to the file (the tag names it), not to the prompt again; started from
// prompt-embeds=, a live prompt leaves the element restartable (no "not both" at the next start).
GST_START_TEST(test_a_live_switch_by_the_other_property_replaces_it) {
  const std::string wan = (pipeline_fixtures() / "wan").string();
  const std::string snow = (scratch() / "snowy-forest.safetensors").string();
  {
    latent::SafetensorsWriter out(snow, {.durable = false});
    out.write("prompt_embeds", latent::encode_prompts(wan, "a snowy forest at night", std::nullopt, {}).prompt);
    out.commit();
  }
  const std::string base = "videogen name=gen model=" + wan +
                           " schedule=causal width=96 height=64 num-frames=45 kv-window=6 seed=3 ";
  // Runs to EOS, setting `name` to `value` once 2 latents are out; returns the prompt tags. The probes outlive
  // the runs: the second pipeline plays again with its probe still attached.
  std::vector<std::unique_ptr<TagProbe>> probes;
  const auto run_switch = [&](GstElement* pipeline, const char* name, const std::string& value) {
    TagProbe& tags = *probes.emplace_back(std::make_unique<TagProbe>());
    tags.attach(pipeline);
    latent_test::PromptsSettled settled;
    const size_t n = play_to_end(pipeline, [&](size_t n, GstSample*, GstElement* gen) {
      if (n == 2) switch_and_settle(gen, name, value, settled);
    });
    fail_unless_equals_int(n, 12);
    std::lock_guard<std::mutex> lock(tags.mu);
    return tags.tags;
  };

  GstElement* p = gst_parse_launch((base + "prompt=\"a red fox\" ! appsink name=out sync=false max-buffers=1").c_str(),
                                   nullptr);
  fail_unless(p != nullptr);
  std::vector<Tag> tags = run_switch(p, "prompt-embeds", snow);
  fail_unless_equals_int(tags.size(), 1);
  fail_unless_equals_string(tags[0].prompt.c_str(), snow.c_str());
  gst_element_set_state(p, GST_STATE_NULL);
  gst_object_unref(p);

  p = gst_parse_launch((base + "prompt-embeds=" + snow + " ! appsink name=out sync=false max-buffers=1").c_str(),
                       nullptr);
  fail_unless(p != nullptr);
  tags = run_switch(p, "prompt", "a red fox");
  fail_unless_equals_int(tags.size(), 1);
  fail_unless_equals_string(tags[0].prompt.c_str(), "a red fox");
  GstElement* gen = gst_bin_get_by_name(GST_BIN(p), "gen");
  gchar* embeds = nullptr;
  g_object_get(gen, "prompt-embeds", &embeds, nullptr);
  fail_unless(embeds == nullptr, "prompt-embeds still set after a live prompt: %s", embeds);
  gst_object_unref(gen);
  // The restart runs the prompt the stream ended with.
  const size_t n = play_to_end(p, [](size_t, GstSample*, GstElement*) {});
  fail_unless(n == 12, "the restart gave %zu latents", n);
  gst_object_unref(p);
}
GST_END_TEST;

// The prompt switcher hands its results over outside its lock: a callback may set another prompt or stop the
// element (an application answering from a sync bus handler) without a deadlock, and a cancel() from another
// thread still never returns before a delivery in progress ends. Its worker starts with the first prompt only:
// elements that never switch (gst-inspect makes every one) hold no thread. An alarm fails a deadlock.
GST_START_TEST(test_the_prompt_switcher_calls_back_outside_its_lock) {
  const auto threads = [] {
    size_t n = 0;
    for ([[maybe_unused]] const auto& e : fs::directory_iterator("/proc/self/task")) ++n;
    return n;
  };
  const size_t before = threads();
  std::vector<GstElement*> made;
  for (int i = 0; i < 8; ++i) made.push_back(gst_element_factory_make(i % 2 ? "videorestyle" : "videogen", nullptr));
  fail_unless_equals_int(threads(), before);
  for (GstElement* e : made) gst_object_unref(e);

  ::alarm(30);
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::string> seen;
  latent::gst::PromptSwitcher* self = nullptr;
  latent::gst::PromptSwitcher switcher(
      [&](const torch::Tensor&, const std::string& label) {
        if (label == "second") self->cancel();  // stopping from the callback
        std::lock_guard<std::mutex> lock(mu);
        seen.push_back(label);
        cv.notify_all();
      },
      [&](const std::string& label, const std::string&) {
        // Answering a failure with another prompt from the callback.
        self->submit("second", [] { return torch::zeros({1}); });
        std::lock_guard<std::mutex> lock(mu);
        seen.push_back(label + " failed");
        cv.notify_all();
      });
  self = &switcher;
  switcher.submit("first", []() -> torch::Tensor { throw std::runtime_error("no such prompt"); });
  std::unique_lock<std::mutex> lock(mu);
  fail_unless(cv.wait_for(lock, std::chrono::seconds(20), [&] { return seen.size() == 2; }),
              "the switcher delivered %zu of 2 results", seen.size());
  fail_unless_equals_string(seen[0].c_str(), "first failed");
  fail_unless_equals_string(seen[1].c_str(), "second");
  lock.unlock();
  switcher.cancel();
  ::alarm(0);
}
GST_END_TEST;

struct LiveRun {
  std::vector<GstClockTimeDiff> lag;  // per latent: running time on reaching the sink minus its PTS
  GstClockTimeDiff elapsed = 0;
  bool warned = false, qos = false, first_latency = false;
};

// Runs a live pipeline whose sink is named "out" to EOS, watching the latents reach the sink and the messages.
LiveRun run_live(const std::string& desc) {
  LiveRun r;
  GstElement* pipeline = gst_parse_launch(desc.c_str(), nullptr);
  fail_unless(pipeline != nullptr);
  GstElement* sink = gst_bin_get_by_name(GST_BIN(pipeline), "out");
  GstPad* pad = gst_element_get_static_pad(sink, "sink");
  struct Probe {
    GstElement* sink;
    LiveRun* run;
  } probe{sink, &r};
  gst_pad_add_probe(
      pad, GST_PAD_PROBE_TYPE_BUFFER,
      [](GstPad*, GstPadProbeInfo* info, gpointer data) {
        auto* p = static_cast<Probe*>(data);
        if (GstClock* clock = gst_element_get_clock(p->sink)) {
          const GstClockTime now = gst_clock_get_time(clock) - gst_element_get_base_time(p->sink);
          p->run->lag.push_back(GstClockTimeDiff(now) -
                                GstClockTimeDiff(GST_BUFFER_PTS(GST_PAD_PROBE_INFO_BUFFER(info))));
          gst_object_unref(clock);
        }
        return GST_PAD_PROBE_OK;
      },
      &probe, nullptr);
  gst_object_unref(pad);
  GstBus* bus = gst_element_get_bus(pipeline);
  const gint64 t0 = g_get_monotonic_time();
  fail_unless(gst_element_set_state(pipeline, GST_STATE_PLAYING) != GST_STATE_CHANGE_FAILURE);
  for (;;) {
    GstMessage* m = gst_bus_timed_pop(bus, 120 * GST_SECOND);
    fail_unless(m != nullptr, "the live stream neither ended nor failed");
    const bool from_gen = g_strcmp0(GST_OBJECT_NAME(GST_MESSAGE_SRC(m)), "gen") == 0;
    const GstMessageType type = GST_MESSAGE_TYPE(m);
    if (type == GST_MESSAGE_WARNING && from_gen) r.warned = true;
    if (type == GST_MESSAGE_QOS && from_gen) r.qos = true;
    if (type == GST_MESSAGE_ELEMENT && gst_message_has_name(m, "videogen-first-latent")) r.first_latency = true;
    const bool end = type == GST_MESSAGE_EOS || type == GST_MESSAGE_ERROR;
    if (type == GST_MESSAGE_ERROR) {
      GError* e = nullptr;
      gst_message_parse_error(m, &e, nullptr);
      fail("live run failed: %s", e->message);
    }
    gst_message_unref(m);
    if (end) break;
  }
  r.elapsed = (g_get_monotonic_time() - t0) * 1000;
  gst_element_set_state(pipeline, GST_STATE_NULL);
  gst_object_unref(bus);
  gst_object_unref(sink);
  gst_object_unref(pipeline);
  return r;
}

std::string live_gen(const std::string& props) {
  return "videogen name=gen model=" + (data() / "pipeline").string() +
         " transformer-weights=" + (data() / "causal-model.pt").string() + " prompt-embeds=" + embeds("a") +
         " schedule=causal is-live=true kv-window=6 " + props + " ! ";
}

// A live stream whose model is slower than real time (1000 fps asked of a CPU), no sink lateness acted on
// (max-lateness=-1): timestamps follow when latents exist, so the last latent reaches the sink about one block
// after it exists, not the whole run behind; the element says it is late (a warning, QoS messages).
GST_START_TEST(test_live_timestamps_follow_when_latents_exist) {
  const LiveRun r = run_live(live_gen("framerate=1000/1 width=384 height=384 num-frames=97 max-lateness=-1 "
                                      "denoising-steps=1000,900,800,700,600,500,400,300,200,100") +
                             "fakesink name=out sync=true");
  fail_unless_equals_int(r.lag.size(), 25);
  // Real time: 97 frames at 1000 fps are 0.1 s. The run takes far longer; stamped at the nominal rate, the last
  // latent would reach the sink nearly the whole run late.
  fail_unless(r.elapsed > 3 * GST_SECOND / 10, "the run took %" G_GINT64_FORMAT " ns: not slower than real time",
              r.elapsed);
  fail_unless(r.lag.back() < r.elapsed / 2,
              "the last latent reached the sink %" G_GINT64_FORMAT " ns after its PTS in a run of %" G_GINT64_FORMAT
              " ns",
              r.lag.back(), r.elapsed);
  fail_unless(r.warned, "no warning that generation is slower than real time");
  fail_unless(r.qos, "no QoS message for latents that existed after their time");
  fail_unless(r.first_latency, "no videogen-first-latent message");
}
GST_END_TEST;

// A model faster than real time and a sink slower than it (60 ms per 40 ms latent): the sink's QoS lateness beyond
// max-lateness moves the timestamps later, so the lag at the sink stays bounded instead of growing by 20 ms per
// latent (0.5 s at the last of 25).
GST_START_TEST(test_live_sink_lateness_skips_time) {
  const LiveRun r = run_live(live_gen("framerate=100/1 width=64 height=48 num-frames=97 max-lateness=40000000") +
                             "identity sleep-time=60000 ! fakesink name=out sync=true qos=true");
  fail_unless_equals_int(r.lag.size(), 25);
  fail_unless(r.lag.back() < r.elapsed / 6,
              "the last latent reached the sink %" G_GINT64_FORMAT " ns after its PTS in a run of %" G_GINT64_FORMAT
              " ns",
              r.lag.back(), r.elapsed);
}
GST_END_TEST;

// An endless stream keeps its key/value window and nothing else: the process grows no more over 400 latents than
// over 100. The soak (gst-causal-soak in the scale suite): 2,000 after 200, or LATENT_CAUSAL_SOAK_LATENTS (hours
// at ~150 latents/s for this model on 2 cores: 500000 is about an hour).
GST_START_TEST(test_endless_stream_memory_is_flat) {
  const bool scale = g_getenv("LATENT_SCALE_TESTS") != nullptr;
  const char* soak = g_getenv("LATENT_CAUSAL_SOAK_LATENTS");
  const int warm = scale ? 200 : 100, total = soak ? std::max(warm + 1, std::atoi(soak)) : scale ? 2000 : 400;
  const std::string desc = "videogen name=gen model=" + (data() / "pipeline").string() +
                           " transformer-weights=" + (data() / "causal-model.pt").string() + " prompt-embeds=" +
                           embeds("a") +
                           " schedule=causal width=64 height=48 kv-window=6 sink-frames=3 ! "
                           "appsink name=out sync=false max-buffers=4";
  GstElement* pipeline = gst_parse_launch(desc.c_str(), nullptr);
  GstAppSink* sink = GST_APP_SINK(gst_bin_get_by_name(GST_BIN(pipeline), "out"));
  fail_unless(gst_element_set_state(pipeline, GST_STATE_PLAYING) != GST_STATE_CHANGE_FAILURE);
  long at_warm = 0;
  for (int i = 0; i < total; ++i) {
    GstSample* s = gst_app_sink_try_pull_sample(sink, 60 * GST_SECOND);
    fail_unless(s != nullptr, "no latent %d", i);
    gst_sample_unref(s);
    if (i + 1 == warm) at_warm = latent_test::rss_kib();
  }
  const long growth = latent_test::rss_kib() - at_warm;
  gst_element_set_state(pipeline, GST_STATE_NULL);
  gst_object_unref(sink);
  gst_object_unref(pipeline);
  g_print("causal endless stream: RSS %+ld KiB from latent %d to %d\n", growth, warm, total);
  // The window of this model is a few KiB; allocator noise stays within a few MiB.
  fail_unless(growth < 8 * 1024, "RSS grew by %ld KiB from latent %d to %d", growth, warm, total);
}
GST_END_TEST;

std::vector<torch::Tensor> pull(GstAppSink* sink, int n) {
  std::vector<torch::Tensor> out;
  for (int i = 0; i < n; ++i) {
    GstSample* s = gst_app_sink_try_pull_sample(sink, 60 * GST_SECOND);
    fail_unless(s != nullptr, "latent %d", i);
    GstMapInfo m;
    GstBuffer* b = gst_sample_get_buffer(s);
    gst_buffer_map(b, &m, GST_MAP_READ);
    out.push_back(torch::from_blob(m.data, {int64_t(m.size / sizeof(float))}, torch::kFloat).clone());
    gst_buffer_unmap(b, &m);
    gst_sample_unref(s);
  }
  return out;
}

// A flushing seek to the start (which interrupts a block in the middle) and a stop and restart replay an endless
// causal stream from its seed, window, sink and all.
GST_START_TEST(test_seek_and_restart_replay_the_stream) {
  const std::string desc = "videogen name=gen model=" + (data() / "pipeline").string() +
                           " transformer-weights=" + (data() / "causal-model.pt").string() +
                           " prompt-embeds=" + embeds("a") +
                           " schedule=causal seed=9 width=64 height=48 kv-window=6 sink-frames=3 ! "
                           "appsink name=out sync=false max-buffers=2";
  GstElement* pipeline = gst_parse_launch(desc.c_str(), nullptr);
  GstAppSink* sink = GST_APP_SINK(gst_bin_get_by_name(GST_BIN(pipeline), "out"));
  gst_element_set_state(pipeline, GST_STATE_PLAYING);
  const std::vector<torch::Tensor> first = pull(sink, 12);
  fail_unless(gst_element_seek_simple(pipeline, GST_FORMAT_TIME, GstSeekFlags(GST_SEEK_FLAG_FLUSH), 0));
  const std::vector<torch::Tensor> after_seek = pull(sink, 12);
  gst_element_set_state(pipeline, GST_STATE_READY);
  gst_element_set_state(pipeline, GST_STATE_PLAYING);
  const std::vector<torch::Tensor> after_restart = pull(sink, 12);
  gst_element_set_state(pipeline, GST_STATE_NULL);
  gst_object_unref(sink);
  gst_object_unref(pipeline);
  for (size_t i = 0; i < first.size(); ++i) {
    fail_unless(torch::equal(first[i], after_seek[i]), "latent %zu differs after the seek", i);
    fail_unless(torch::equal(first[i], after_restart[i]), "latent %zu differs after the restart", i);
  }
}
GST_END_TEST;

// A seek to the start after a live switch replays the stream under the prompt it was switched to, as a restart
// with that prompt does (the generator used to rebuild from its first prompt).
GST_START_TEST(test_a_seek_keeps_the_live_prompt) {
  const auto gen = [](const std::string& file) {
    return "videogen name=gen model=" + (data() / "pipeline").string() +
           " transformer-weights=" + (data() / "causal-model.pt").string() + " prompt-embeds=" + file +
           " schedule=causal seed=9 width=64 height=48 kv-window=6 sink-frames=3 ! "
           "appsink name=out sync=false max-buffers=2";
  };
  const std::string b = embeds("b", {}, "prompt.B");
  GstElement* pipeline = gst_parse_launch(gen(embeds("a")).c_str(), nullptr);
  GstElement* g = gst_bin_get_by_name(GST_BIN(pipeline), "gen");
  GstAppSink* sink = GST_APP_SINK(gst_bin_get_by_name(GST_BIN(pipeline), "out"));
  gst_element_set_state(pipeline, GST_STATE_PLAYING);
  pull(sink, 3);
  g_object_set(g, "prompt-embeds", b.c_str(), nullptr);
  pull(sink, 9);  // the switch is read in milliseconds and taken at a block start within these
  fail_unless(gst_element_seek_simple(pipeline, GST_FORMAT_TIME, GstSeekFlags(GST_SEEK_FLAG_FLUSH), 0));
  const std::vector<torch::Tensor> after_seek = pull(sink, 9);
  gst_element_set_state(pipeline, GST_STATE_NULL);
  gst_object_unref(sink);
  gst_object_unref(g);
  gst_object_unref(pipeline);

  pipeline = gst_parse_launch(gen(b).c_str(), nullptr);
  sink = GST_APP_SINK(gst_bin_get_by_name(GST_BIN(pipeline), "out"));
  gst_element_set_state(pipeline, GST_STATE_PLAYING);
  const std::vector<torch::Tensor> started_with_b = pull(sink, 9);
  gst_element_set_state(pipeline, GST_STATE_NULL);
  gst_object_unref(sink);
  gst_object_unref(pipeline);
  for (size_t i = 0; i < after_seek.size(); ++i)
    fail_unless(torch::equal(after_seek[i], started_with_b[i]), "latent %zu after the seek is not prompt B's", i);
}
GST_END_TEST;

// A live element keeps its text encoder loaded: prompts set while playing are encoded without loading it again
// (umT5-XXL is 11 GB; it used to be loaded for every switch).
GST_START_TEST(test_live_switches_do_not_load_the_text_encoder_again) {
  const std::string wan = (pipeline_fixtures() / "wan").string();
  const std::string desc = "videogen name=gen model=" + wan +
                           " schedule=causal width=96 height=64 num-frames=45 kv-window=6 seed=3 prompt=\"a red fox\" "
                           "! appsink name=out sync=false max-buffers=1";
  GstElement* p = gst_parse_launch(desc.c_str(), nullptr);
  fail_unless(p != nullptr);
  TagProbe tags;
  tags.attach(p);
  const uint64_t before = latent::TextEncoder::loads();
  uint64_t started = 0;
  const char* prompts[] = {"a snowy forest", "a city at night", "a calm sea"};
  latent_test::PromptsSettled settled;
  const size_t n = play_to_end(p, [&](size_t n, GstSample*, GstElement* gen) {
    if (n == 1) started = latent::TextEncoder::loads();
    if (n == 2 || n == 5 || n == 8) switch_and_settle(gen, "prompt", prompts[(n - 2) / 3], settled);
  });
  fail_unless(n == 12, "the stream gave %zu latents", n);
  gst_object_unref(p);
  fail_unless_equals_int(started - before, 1);
  fail_unless(tags.tags.size() >= 1, "no prompt switched");
  fail_unless_equals_int(latent::TextEncoder::loads() - started, 0);
}
GST_END_TEST;

// Stopping never waits for an encoding in progress (a text encoder takes seconds): close() drops its result and
// returns at once, refuses prompts set after it, and prompts set continually from another thread cannot keep it
// waiting. An alarm fails a hang.
GST_START_TEST(test_the_prompt_switcher_stops_without_waiting_for_an_encoding) {
  ::alarm(30);
  std::atomic<int> delivered{0};
  latent::gst::PromptSwitcher switcher([&](const torch::Tensor&, const std::string&) { delivered++; },
                                       [](const std::string&, const std::string&) {});
  std::atomic<bool> started{false};
  switcher.submit("slow", [&] {
    started = true;
    std::this_thread::sleep_for(std::chrono::seconds(3));
    return torch::zeros({1});
  });
  while (!started) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  std::atomic<bool> spam{true};
  std::thread setter([&] {
    while (spam) switcher.submit("again", [] { return torch::zeros({1}); });
  });
  const auto t0 = std::chrono::steady_clock::now();
  switcher.close();
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  fail_unless(took < 1.0, "close() waited %.2f s for the encoding in progress", took);
  fail_unless(!switcher.submit("late", [] { return torch::zeros({1}); }), "a prompt after close() was taken");
  spam = false;
  setter.join();
  std::this_thread::sleep_for(std::chrono::milliseconds(3500));
  fail_unless_equals_int(delivered.load(), 0);
  switcher.open();
  fail_unless(switcher.submit("next stream", [] { return torch::zeros({1}); }));
  // Bounded by the alarm, not by a time a loaded machine might miss.
  ::alarm(30);
  while (delivered == 0) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  fail_unless_equals_int(delivered.load(), 1);
  ::alarm(0);
}
GST_END_TEST;

// A flushing seek that arrives while a block is being made interrupts it (not a push waiting on a full sink, which
// is what a seek mostly met with a small appsink queue): the seek is sent once a block has made its first model
// call, the calls the old stream made are then not a whole number of blocks, and the replay equals the stream.
GST_START_TEST(test_a_seek_during_a_block_interrupts_it) {
  const std::string desc = "videogen name=gen model=" + (data() / "pipeline").string() +
                           " transformer-weights=" + (data() / "causal-model.pt").string() +
                           " prompt-embeds=" + embeds("a") +
                           " schedule=causal seed=9 width=768 height=576 num-frames=45 kv-window=6 sink-frames=3 ! "
                           "appsink name=out sync=false";
  const auto model_calls = [](GstElement* gen) {
    guint64 n = 0;
    g_object_get(gen, "model-calls", &n, nullptr);
    return n;
  };
  const auto to_eos = [](GstAppSink* sink) {
    std::vector<torch::Tensor> out;
    while (GstSample* s = gst_app_sink_try_pull_sample(sink, 60 * GST_SECOND)) {
      GstMapInfo m;
      GstBuffer* b = gst_sample_get_buffer(s);
      gst_buffer_map(b, &m, GST_MAP_READ);
      out.push_back(torch::from_blob(m.data, {int64_t(m.size / sizeof(float))}, torch::kFloat).clone());
      gst_buffer_unmap(b, &m);
      gst_sample_unref(s);
    }
    fail_unless(gst_app_sink_is_eos(sink), "no EOS");
    return out;
  };
  // A plain run: its latents, and the calls of its 4 blocks.
  GstElement* pipeline = gst_parse_launch(desc.c_str(), nullptr);
  GstElement* gen = gst_bin_get_by_name(GST_BIN(pipeline), "gen");
  GstAppSink* sink = GST_APP_SINK(gst_bin_get_by_name(GST_BIN(pipeline), "out"));
  gst_element_set_state(pipeline, GST_STATE_PLAYING);
  const std::vector<torch::Tensor> plain = to_eos(sink);
  const guint64 run_calls = model_calls(gen), per_block = run_calls / 4;
  gst_element_set_state(pipeline, GST_STATE_NULL);
  fail_unless(plain.size() == 12 && run_calls % 4 == 0 && per_block >= 3, "%zu latents, %" G_GUINT64_FORMAT " calls",
              plain.size(), run_calls);

  gst_element_set_state(pipeline, GST_STATE_PLAYING);
  guint64 at_seek = 0;
  for (int i = 0; i < 200000; ++i) {  // the first call of the second block or a later one
    at_seek = model_calls(gen);
    if (at_seek > per_block && at_seek % per_block == 1) break;
    g_usleep(100);
  }
  fail_unless(at_seek % per_block == 1, "no block start seen (%" G_GUINT64_FORMAT " calls)", at_seek);
  fail_unless(gst_element_seek_simple(pipeline, GST_FORMAT_TIME, GstSeekFlags(GST_SEEK_FLAG_FLUSH), 0));
  const std::vector<torch::Tensor> after = to_eos(sink);
  const guint64 old_stream = model_calls(gen) - run_calls;
  gst_element_set_state(pipeline, GST_STATE_NULL);
  gst_object_unref(sink);
  gst_object_unref(gen);
  gst_object_unref(pipeline);
  fail_unless(old_stream % per_block != 0,
              "the old stream made %" G_GUINT64_FORMAT " calls, whole blocks of %" G_GUINT64_FORMAT
              ": the seek did not cut a block",
              old_stream, per_block);
  fail_unless_equals_int(after.size(), plain.size());
  for (size_t i = 0; i < plain.size(); ++i) fail_unless(torch::equal(after[i], plain[i]), "latent %zu differs", i);
}
GST_END_TEST;

GST_START_TEST(test_bad_settings_are_refused_by_name) {
  const std::string a = embeds("a");
  const auto said = [&](const std::string& props) { return error_of(causal_gen(9, "prompt-embeds=" + a + " " + props)); };
  std::string e = said("kv-window=4 sink-frames=3");
  fail_unless(contains(e, "kv_window"), "a window without room for a block: '%s'", e.c_str());
  e = said("guidance-scale=5");
  fail_unless(contains(e, "guidance"), "guidance: '%s'", e.c_str());
  e = said("denoising-steps=1000,x");
  fail_unless(contains(e, "denoising-steps"), "bad steps: '%s'", e.c_str());
  e = said("prompt-schedule=\"3:b\"");
  fail_unless(contains(e, "prompt-schedule"), "a schedule without a text encoder: '%s'", e.c_str());
  e = said("initial-noise=" + noise_file("window9_sink3_15f"));
  fail_unless(contains(e, "initial-noise"), "noise of another length: '%s'", e.c_str());
  const std::string file = embeds("bad-switch");
  {
    latent::SafetensorsWriter out(scratch() / "bad-switch.safetensors", {.durable = false});
    out.write("prompt_embeds", cases().tensor("prompt.A").clone());
    out.write("prompt_embeds@x", cases().tensor("prompt.B").clone());
    out.commit();
  }
  e = error_of(causal_gen(9, "prompt-embeds=" + file));
  fail_unless(contains(e, "prompt_embeds@x"), "a bad switch tensor: '%s'", e.c_str());
  e = error_of("videogen name=gen model=" + (data() / "pipeline").string() + " prompt-embeds=" + a +
               " schedule=fifo width=64 height=48 num-frames=9 prompt-schedule=\"3:b\" ! ");
  fail_unless(contains(e, "schedule=causal"), "prompt-schedule with fifo: '%s'", e.c_str());
  // The default generator has no key/value cache to run causally.
  e = error_of("videogen name=gen schedule=causal num-frames=9 ! ");
  fail_unless(contains(e, "key/value cache"), "a model without a causal form: '%s'", e.c_str());
}
GST_END_TEST;

static Suite* causal_suite() {
  Suite* s = suite_create("causal");
  TCase* tc = tcase_create("general");
  tcase_set_timeout(tc, 300);
  suite_add_tcase(s, tc);
  tcase_add_test(tc, test_latents_match_the_references);
  tcase_add_test(tc, test_scripted_switch_matches_longlive);
  tcase_add_test(tc, test_prompt_set_while_playing_switches_at_a_block_start);
  tcase_add_test(tc, test_live_timestamps_follow_when_latents_exist);
  tcase_add_test(tc, test_live_sink_lateness_skips_time);
  tcase_add_test(tc, test_endless_stream_memory_is_flat);
  tcase_add_test(tc, test_bad_settings_are_refused_by_name);
  tcase_add_test(tc, test_seek_and_restart_replay_the_stream);
  tcase_add_test(tc, test_the_prompt_switcher_calls_back_outside_its_lock);
  tcase_add_test(tc, test_the_prompt_switcher_stops_without_waiting_for_an_encoding);
  tcase_add_test(tc, test_a_seek_keeps_the_live_prompt);
  tcase_add_test(tc, test_a_seek_during_a_block_interrupts_it);
  if (pipeline_fixtures().empty())
    latent_test::skip_missing("no pipeline fixtures (LATENT_PIPELINE_FIXTURES unset: a build without the .venv): "
                              "prompt-schedule with a text encoder not run");
  else {
    tcase_add_test(tc, test_prompt_schedule_encodes_its_prompts);
    tcase_add_test(tc, test_a_live_switch_by_the_other_property_replaces_it);
    tcase_add_test(tc, test_live_switches_do_not_load_the_text_encoder_again);
  }
  add_restyle_tests(s);
  return s;
}

LATENT_CHECK_MAIN(causal)
