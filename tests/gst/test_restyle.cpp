// videorestyle: StreamDiffusionV2's streaming video-to-video as a filter, against its own loop's outputs
// (tests/fixtures/data/restyle/, made by tests/fixtures/gen_restyle_fixtures.py from its code), the latent space its
// checkpoints take, a camera-like chain through vaeencode and vaedecode, QoS that skips late frames, prompts
// switched while playing and latents of another model refused. Part of gst-causal-tests (add_restyle_tests).

// The C++ headers come first: check's function-like macros (fail, ...) would rewrite their members.
#include <torch/types.h>

#include <chrono>
#include <filesystem>
#include <limits>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "latent/io/safetensors.h"
#include "latent/vae/vae.h"

#include <gst/app/gstappsink.h>
#include <gst/app/gstappsrc.h>
#include <gst/check/gstcheck.h>

#include "check_main.h"
#include "generated_latents.h"
#include "pipeline_run.h"
#include "prompt_settled.h"
#include "test_restyle.h"

namespace {

namespace fs = std::filesystem;
using latent_test::Out;

// The core's test holds the loop to 1e-4 of the reference's largest value; the element adds the float32 wire
// format and, with raw-input, one de-normalisation in float32 (~1e-7 relative).
constexpr double kTolerance = 1e-4;
constexpr int64_t kC = 16, kH = 6, kW = 8;

fs::path data() { return fs::path(LATENT_TEST_SOURCE_ROOT) / "tests" / "fixtures" / "data"; }

const latent::SafetensorsFile& cases() {
  static const latent::SafetensorsFile f =
      latent::SafetensorsFile::open(data() / "restyle" / "restyle-cases.safetensors");
  return f;
}

torch::Tensor raw_input() { return cases().tensor("s080.input").to(torch::kFloat)[0]; }  // [T, C, h, w]
torch::Tensor want() { return cases().tensor("s080.output").to(torch::kFloat)[0]; }

fs::path scratch() {
  static const fs::path dir = [] {
    fs::path p = fs::temp_directory_path() / ("latent-restyle-" + std::to_string(getpid()));
    fs::create_directories(p);
    return p;
  }();
  return dir;
}

std::string embeds(const std::string& name, const torch::Tensor& t) {
  const fs::path path = scratch() / (name + ".safetensors");
  latent::SafetensorsWriter out(path, {.durable = false});
  out.write("prompt_embeds", t.to(torch::kFloat).contiguous().clone());
  out.commit();
  return path.string();
}

std::string prompt_a() { return embeds("a", cases().tensor("prompt.A")); }

// The other prompt of the causal fixtures.
std::string prompt_b() {
  static const latent::SafetensorsFile causal =
      latent::SafetensorsFile::open(data() / "causal" / "causal-cases.safetensors");
  return embeds("b", causal.tensor("prompt.B"));
}

std::string restyle(const std::string& extra = "") {
  return "videorestyle name=r model=" + (data() / "causal" / "pipeline").string() +
         " transformer-weights=" + (data() / "causal" / "causal-model.safetensors").string() + " seed=7 " + extra;
}

// 4 video frames per latent at 16 fps: a latent every 250 ms.
constexpr GstClockTime kLatent = GST_SECOND / 4;
const char* kCaps =
    "video/x-latent,model=(string)wan2.1,format=(string)F32,channels=(int)16,width=(int)8,height=(int)6,"
    "framerate=(fraction)4/1,temporal-factor=(int)4,spatial-factor=(int)8,video-width=(int)64,"
    "video-height=(int)48,video-framerate=(fraction)16/1";

// Queues the frames [T, C, h, w] in the appsrc named "in", stamped as vaeencode stamps them, then EOS.
std::function<void(GstElement*)> feed(torch::Tensor frames, std::function<void(GstElement*)> more = {}) {
  return [frames, more](GstElement* pipeline) {
    GstElement* src = gst_bin_get_by_name(GST_BIN(pipeline), "in");
    GstCaps* caps = gst_caps_from_string(kCaps);
    g_object_set(src, "caps", caps, "format", GST_FORMAT_TIME, "max-bytes", guint64(0), nullptr);
    gst_caps_unref(caps);
    for (int64_t t = 0; t < frames.size(0); ++t) {
      const torch::Tensor f = frames[t].contiguous();
      GstBuffer* b = gst_buffer_new_memdup(f.data_ptr(), size_t(f.nbytes()));
      GST_BUFFER_PTS(b) = GstClockTime(t) * kLatent;
      GST_BUFFER_DURATION(b) = kLatent;
      GST_BUFFER_OFFSET(b) = t == 0 ? 0 : 1 + 4 * (t - 1);
      GST_BUFFER_OFFSET_END(b) = 1 + 4 * t;
      fail_unless_equals_int(gst_app_src_push_buffer(GST_APP_SRC(src), b), GST_FLOW_OK);
    }
    gst_app_src_end_of_stream(GST_APP_SRC(src));
    gst_object_unref(src);
    if (more) more(pipeline);
  };
}

// Runs appsrc ! videorestyle `props` (prompt A) ! appsink over `frames`; `also` sets up the pipeline further
// before the frames are queued.
void run_restyle(Out& out, const torch::Tensor& frames, const std::function<void(GstElement*)>& also = {},
                 const std::string& props = "raw-input=false") {
  latent_test::run("appsrc name=in ! " + restyle(props) + " ! appsink name=out", out, 120 * GST_SECOND,
                   [&](GstElement* p) {
                     g_object_set(gst_bin_get_by_name(GST_BIN(p), "r"), "prompt-embeds", prompt_a().c_str(), nullptr);
                     if (also) also(p);
                     feed(frames)(p);
                   });
}

torch::Tensor got(const Out& out) { return latent_test::stacked(out, kC, kH, kW)[0].transpose(0, 1); }  // [T, C, h, w]

double rel(const torch::Tensor& a, const torch::Tensor& b) {
  return ((a - b).abs().max() / b.abs().max()).item<double>();
}

// Sets `name` to `value` on the element "r" when the n-th frame reaches it, from the streaming thread, and holds
// that frame until the switcher's worker has handed the prompt over (or refused it).
struct SetAtFrame {
  int at;
  std::string name, value;
  int n = 0;
  latent_test::PromptsSettled settled{};
  void attach(GstElement* pipeline) {
    GstElement* r = gst_bin_get_by_name(GST_BIN(pipeline), "r");
    GstPad* in = gst_element_get_static_pad(r, "sink");
    gst_pad_add_probe(
        in, GST_PAD_PROBE_TYPE_BUFFER,
        [](GstPad* pad, GstPadProbeInfo*, gpointer d) {
          auto* self = static_cast<SetAtFrame*>(d);
          if (++self->n == self->at) {
            GstElement* e = gst_pad_get_parent_element(pad);
            const size_t before = self->settled.count();
            g_object_set(e, self->name.c_str(), self->value.c_str(), nullptr);
            gst_object_unref(e);
            fail_unless(self->settled.wait_for(before + 1), "the %s set at frame %d never settled", self->name.c_str(),
                        self->at);
          }
          return GST_PAD_PROBE_OK;
        },
        this, nullptr);
    gst_object_unref(in);
    gst_object_unref(r);
  }
};

}  // namespace

// Raw encoder means in, as StreamDiffusionV2's loop takes them: its outputs, each with the timestamps of the
// frame it restyles.
GST_START_TEST(test_restyle_equals_streamdiffusionv2) {
  Out out;
  run_restyle(out, raw_input());
  fail_unless(out.error.empty(), "%s", out.error.c_str());
  fail_unless_equals_int(out.buffers.size(), 14);
  const double err = rel(got(out), want());
  GST_INFO("relative error %.3g", err);
  fail_unless(err <= kTolerance, "relative error %g", err);
  for (size_t i = 0; i < out.buffers.size(); ++i) {
    fail_unless_equals_uint64(GST_BUFFER_PTS(out.buffers[i]), i * kLatent);
    fail_unless_equals_uint64(GST_BUFFER_OFFSET_END(out.buffers[i]), 1 + 4 * i);
  }
}
GST_END_TEST;

// The project's latents are normalised (vaeencode's diffusion space): raw-input (the default) makes them the raw
// means the checkpoints take, so the chain gives the reference's frames.
GST_START_TEST(test_normalised_latents_are_made_raw) {
  const latent::LatentStatistics s = latent::published_latent_statistics("wan2.1");
  const torch::Tensor mean = torch::tensor(s.mean, torch::kDouble).to(torch::kFloat).view({1, -1, 1, 1});
  const torch::Tensor std = torch::tensor(s.std, torch::kDouble).to(torch::kFloat).view({1, -1, 1, 1});
  const torch::Tensor normalised = (raw_input() - mean) / std;
  Out out;
  run_restyle(out, normalised, {}, "");
  fail_unless(out.error.empty(), "%s", out.error.c_str());
  const double err = rel(got(out), want());
  fail_unless(err <= kTolerance, "relative error %g", err);
  // And the test can fail: the same latents passed as they come are another input.
  Out plain;
  run_restyle(plain, normalised);
  fail_unless(rel(got(plain), want()) > 1e-2);
}
GST_END_TEST;

// Downstream's QoS says outputs before 2 s are late: the frames whose output would be late are skipped (never the
// first two), each with a QoS message, and the rest come out.
GST_START_TEST(test_late_frames_are_skipped) {
  for (const bool qos : {true, false}) {
    Out out;
    guint64 dropped = 0;
    GstElement* r = nullptr;
    latent_test::run("appsrc name=in ! " + restyle(qos ? "" : "qos=false") + " raw-input=false ! appsink name=out", out,
                     120 * GST_SECOND, [&](GstElement* p) {
                       r = gst_bin_get_by_name(GST_BIN(p), "r");
                       g_object_set(r, "prompt-embeds", prompt_a().c_str(), nullptr);
                       // Before the first frame reaches it, as a sink's QoS would come.
                       GstPad* sink = gst_element_get_static_pad(r, "sink");
                       gst_pad_add_probe(
                           sink, GST_PAD_PROBE_TYPE_BUFFER,
                           [](GstPad*, GstPadProbeInfo*, gpointer e) {
                             GstPad* src = gst_element_get_static_pad(GST_ELEMENT(e), "src");
                             gst_pad_send_event(src, gst_event_new_qos(GST_QOS_TYPE_UNDERFLOW, 1.0, 0, 2 * GST_SECOND));
                             gst_object_unref(src);
                             return GST_PAD_PROBE_REMOVE;
                           },
                           r, nullptr);
                       gst_object_unref(sink);
                       feed(raw_input())(p);
                     });
    fail_unless(out.error.empty(), "%s", out.error.c_str());
    g_object_get(r, "dropped", &dropped, nullptr);
    gst_object_unref(r);
    if (!qos) {
      fail_unless_equals_int(out.buffers.size(), 14);
      fail_unless_equals_uint64(dropped, 0);
      continue;
    }
    // Frames 2-7 end at or before 2 s.
    fail_unless_equals_uint64(dropped, 6);
    fail_unless_equals_int(out.buffers.size(), 8);
    fail_unless_equals_uint64(GST_BUFFER_PTS(out.buffers[1]), kLatent);
    fail_unless_equals_uint64(GST_BUFFER_PTS(out.buffers[2]), 8 * kLatent);
  }
}
GST_END_TEST;

// A prompt set while playing lands at a frame (a latent-prompt tag marks it): the frames made before it are the
// old prompt's, the frames from it on differ.
GST_START_TEST(test_prompt_set_while_playing_switches) {
  struct Seen {
    std::mutex mu;
    size_t buffers = 0;
    long tag_at = -1;
  } seen;
  SetAtFrame set{4, "prompt-embeds", prompt_b()};
  Out out;
  run_restyle(out, raw_input(), [&](GstElement* p) {
    GstElement* sink = gst_bin_get_by_name(GST_BIN(p), "out");
    GstPad* pad = gst_element_get_static_pad(sink, "sink");
    gst_pad_add_probe(
        pad, GstPadProbeType(GST_PAD_PROBE_TYPE_BUFFER | GST_PAD_PROBE_TYPE_EVENT_DOWNSTREAM),
        [](GstPad*, GstPadProbeInfo* info, gpointer d) {
          auto* s = static_cast<Seen*>(d);
          std::lock_guard<std::mutex> lock(s->mu);
          if (GST_PAD_PROBE_INFO_TYPE(info) & GST_PAD_PROBE_TYPE_BUFFER) {
            s->buffers++;
          } else if (GstEvent* e = GST_PAD_PROBE_INFO_EVENT(info); GST_EVENT_TYPE(e) == GST_EVENT_TAG) {
            GstTagList* tags;
            gst_event_parse_tag(e, &tags);
            gchar* label = nullptr;
            if (gst_tag_list_get_string(tags, "latent-prompt", &label) && s->tag_at < 0) s->tag_at = long(s->buffers);
            g_free(label);
          }
          return GST_PAD_PROBE_OK;
        },
        &seen, nullptr);
    gst_object_unref(pad);
    gst_object_unref(sink);
    // At the fourth frame, from the streaming thread (as an application's would come from any thread).
    set.attach(p);
  });
  fail_unless(out.error.empty(), "%s", out.error.c_str());
  fail_unless_equals_int(out.buffers.size(), 14);
  fail_unless(seen.tag_at >= 2 && seen.tag_at < 13, "the switch landed at output %ld", seen.tag_at);
  const torch::Tensor g = got(out), w = want();
  // A frame is made over two calls: the ones done before the frame that took the switch are the old prompt's.
  for (long f = 0; f + 1 < seen.tag_at; ++f) fail_unless(rel(g[f], w[f]) <= kTolerance, "frame %ld changed", f);
  for (long f = seen.tag_at; f < 14; ++f) fail_unless(rel(g[f], w[f]) > 1e-3, "frame %ld is the old prompt's", f);
}
GST_END_TEST;

// Latents of another latent space are refused at negotiation, naming both.
GST_START_TEST(test_other_latents_are_refused) {
  Out out;
  latent_test::run(
      "appsrc name=in caps=\"video/x-latent,model=(string)wan2.2,format=(string)F32,channels=(int)48,"
      "width=(int)8,height=(int)6,framerate=(fraction)4/1,temporal-factor=(int)4,"
      "spatial-factor=(int)16,video-width=(int)128,video-height=(int)96,video-framerate=(fraction)16/1\" ! " +
          restyle() + " ! appsink name=out",
      out, 60 * GST_SECOND, [&](GstElement* p) {
        g_object_set(gst_bin_get_by_name(GST_BIN(p), "r"), "prompt-embeds", prompt_a().c_str(), nullptr);
        GstElement* src = gst_bin_get_by_name(GST_BIN(p), "in");
        GstBuffer* b = gst_buffer_new_allocate(nullptr, 48 * 6 * 8 * 4, nullptr);
        gst_buffer_memset(b, 0, 0, 48 * 6 * 8 * 4);
        gst_app_src_push_buffer(GST_APP_SRC(src), b);
        gst_app_src_end_of_stream(GST_APP_SRC(src));
        gst_object_unref(src);
      });
  fail_unless(out.error.find("wan2.2") != std::string::npos && out.error.find("wan2.1") != std::string::npos, "%s",
              out.error.c_str());
}
GST_END_TEST;

// No prompt, a bad step list, a folder without a causal model: refused by name before any data flows.
GST_START_TEST(test_bad_settings_are_refused) {
  const auto error_of = [](const std::string& extra, bool with_prompt) {
    Out out;
    latent_test::run(
        "appsrc name=in ! " + restyle(extra) + " ! appsink name=out", out, 30 * GST_SECOND, [&](GstElement* p) {
          if (with_prompt)
            g_object_set(gst_bin_get_by_name(GST_BIN(p), "r"), "prompt-embeds", prompt_a().c_str(), nullptr);
          feed(raw_input().narrow(0, 0, 3))(p);
        });
    return out.error;
  };
  fail_unless(error_of("", false).find("prompt") != std::string::npos);
  fail_unless(error_of("denoising-steps=700,x", true).find("denoising-steps") != std::string::npos);
  fail_unless(error_of("denoising-steps=1000,500", true).find("denoising_steps") != std::string::npos);
  fail_unless(error_of("kv-window=3", true).find("kv_window") != std::string::npos);
}
GST_END_TEST;

// A camera-like chain, frames in == frames out: videotestsrc through TAEHV's taew2_1 (random weights) both ways.
GST_START_TEST(test_video_chain_keeps_every_frame) {
  const std::string taew = std::string(g_getenv("LATENT_TAEHV_FIXTURES")) + "/taew2_1.pth";
  Out out;
  latent_test::run(
      "videotestsrc num-buffers=21 pattern=ball ! video/x-raw,width=64,height=48,framerate=16/1 ! "
      "videoconvert ! vaeencode model=" +
          taew + " ! " + restyle() + " ! vaedecode model=" + taew + " ! appsink name=out",
      out, 120 * GST_SECOND, [&](GstElement* p) {
        g_object_set(gst_bin_get_by_name(GST_BIN(p), "r"), "prompt-embeds", prompt_a().c_str(), nullptr);
      });
  fail_unless(out.error.empty(), "%s", out.error.c_str());
  fail_unless_equals_int(out.buffers.size(), 21);
  for (size_t i = 0; i < out.buffers.size(); ++i)
    fail_unless_equals_uint64(GST_BUFFER_PTS(out.buffers[i]), gst_util_uint64_scale(i, GST_SECOND, 16));
}
GST_END_TEST;

namespace {

// The warnings the pipeline posts, recorded as they are posted.
struct Warnings {
  std::mutex mu;
  std::vector<std::string> seen;
  void attach(GstElement* pipeline) {
    GstBus* bus = gst_element_get_bus(pipeline);
    gst_bus_set_sync_handler(
        bus,
        [](GstBus*, GstMessage* m, gpointer d) {
          if (GST_MESSAGE_TYPE(m) == GST_MESSAGE_WARNING) {
            GError* e = nullptr;
            gst_message_parse_warning(m, &e, nullptr);
            auto* self = static_cast<Warnings*>(d);
            std::lock_guard<std::mutex> lock(self->mu);
            self->seen.push_back(e->message);
            g_clear_error(&e);
          }
          return GST_BUS_PASS;
        },
        this, nullptr);
    gst_object_unref(bus);
  }
};

// Runs appsrc "in" ! videorestyle ! appsink by hand: to PAUSED, `paused` (may set properties), then the frames
// with the caps `caps[i]` from frame `from[i]` on, then PLAYING to EOS. Returns the frames out [T, C, h, w].
torch::Tensor run_by_hand(const std::string& props, const torch::Tensor& frames, const std::vector<std::string>& caps,
                          const std::vector<int64_t>& from, const std::function<void(GstElement*)>& paused = {},
                          const std::function<void(GstElement*)>& setup = {}) {
  GstElement* p = gst_parse_launch(
      ("appsrc name=in format=time ! " + restyle(props) + " ! appsink name=out sync=false").c_str(), nullptr);
  fail_unless(p != nullptr);
  if (setup) setup(p);
  GstElement* src = gst_bin_get_by_name(GST_BIN(p), "in");
  g_object_set(src, "max-bytes", guint64(0), nullptr);
  fail_unless(gst_element_set_state(p, GST_STATE_PAUSED) != GST_STATE_CHANGE_FAILURE);
  if (paused) paused(p);
  for (int64_t t = 0; t < frames.size(0); ++t) {
    for (size_t i = 0; i < from.size(); ++i)
      if (from[i] == t) {
        GstCaps* c = gst_caps_from_string(caps[i].c_str());
        g_object_set(src, "caps", c, nullptr);
        gst_caps_unref(c);
      }
    const torch::Tensor f = frames[t].contiguous();
    GstBuffer* b = gst_buffer_new_memdup(f.data_ptr(), size_t(f.nbytes()));
    GST_BUFFER_PTS(b) = GstClockTime(t) * kLatent;
    GST_BUFFER_DURATION(b) = kLatent;
    fail_unless_equals_int(gst_app_src_push_buffer(GST_APP_SRC(src), b), GST_FLOW_OK);
  }
  gst_app_src_end_of_stream(GST_APP_SRC(src));
  gst_object_unref(src);
  Out out;
  GstAppSink* sink = GST_APP_SINK(gst_bin_get_by_name(GST_BIN(p), "out"));
  fail_unless(gst_element_set_state(p, GST_STATE_PLAYING) != GST_STATE_CHANGE_FAILURE);
  while (GstSample* s = gst_app_sink_try_pull_sample(sink, 60 * GST_SECOND)) {
    out.buffers.push_back(gst_buffer_ref(gst_sample_get_buffer(s)));
    gst_sample_unref(s);
  }
  fail_unless(gst_app_sink_is_eos(sink) && !out.buffers.empty(), "the stream gave %zu frames, then no EOS",
              out.buffers.size());
  gst_element_set_state(p, GST_STATE_NULL);
  gst_object_unref(sink);
  gst_object_unref(p);
  return got(out);
}

}  // namespace

// Embeddings set while playing are read and checked off the streaming thread: a file of NaN, of the wrong width or
// of two dimensions is a warning naming it, and the stream goes on under its prompt, unchanged.
GST_START_TEST(test_bad_embeddings_set_while_playing_are_warnings) {
  const torch::Tensor a = cases().tensor("prompt.A").to(torch::kFloat);
  const std::vector<std::pair<std::string, torch::Tensor>> bad = {
      {"nan", a.clone().fill_(std::numeric_limits<float>::quiet_NaN())},
      {"narrow", a.narrow(2, 0, a.size(2) / 2).clone()},
      {"flat", a[0].clone()}};
  for (const auto& [name, t] : bad) {
    const std::string file = embeds("bad-" + name, t);
    SetAtFrame set{4, "prompt-embeds", file};
    Warnings warnings;
    Out out;
    run_restyle(out, raw_input(), [&](GstElement* p) {
      set.attach(p);
      warnings.attach(p);
    });
    fail_unless(out.error.empty(), "%s: %s", name.c_str(), out.error.c_str());
    fail_unless_equals_int(out.buffers.size(), 14);
    std::lock_guard<std::mutex> lock(warnings.mu);
    fail_unless(warnings.seen.size() == 1 && warnings.seen[0].find(file) != std::string::npos,
                "%s: %zu warnings, the first '%s'", name.c_str(), warnings.seen.size(),
                warnings.seen.empty() ? "" : warnings.seen[0].c_str());
    const torch::Tensor g = got(out), w = want();
    for (int64_t f = 0; f < 14; ++f)
      fail_unless(rel(g[f], w[f]) <= kTolerance, "%s: frame %ld changed", name.c_str(), f);
  }
}
GST_END_TEST;

// A prompt set in PAUSED before the first caps is the stream's from its first frame; new caps mid-stream start a
// new stream under the prompt switched to while playing, not the first one.
GST_START_TEST(test_prompts_before_caps_and_across_new_caps) {
  const torch::Tensor in = raw_input();
  std::string caps2 = kCaps;
  caps2.replace(caps2.find("framerate=(fraction)4/1"), 23, "framerate=(fraction)8/1");
  caps2.replace(caps2.find("video-framerate=(fraction)16/1"), 30, "video-framerate=(fraction)32/1");
  const std::string a = prompt_a(), b = prompt_b();
  const torch::Tensor with_b = run_by_hand("raw-input=false prompt-embeds=" + b, in, {kCaps}, {0});
  const torch::Tensor before_caps =
      run_by_hand("raw-input=false prompt-embeds=" + a, in, {kCaps}, {0}, [&](GstElement* p) {
        latent_test::PromptsSettled settled;
        g_object_set(gst_bin_get_by_name(GST_BIN(p), "r"), "prompt-embeds", b.c_str(), nullptr);
        fail_unless(settled.wait_for(1), "the prompt set in PAUSED never settled");  // read off this thread
      });
  fail_unless_equals_int(before_caps.size(0), with_b.size(0));
  for (int64_t f = 0; f < with_b.size(0); ++f)
    fail_unless(rel(before_caps[f], with_b[f]) <= kTolerance, "frame %ld is not prompt B's", f);

  SetAtFrame set{3, "prompt-embeds", b};
  const torch::Tensor across = run_by_hand("raw-input=false prompt-embeds=" + a, in, {kCaps, caps2}, {0, 7}, {},
                                           [&](GstElement* p) { set.attach(p); });
  const torch::Tensor second_with_b =
      run_by_hand("raw-input=false prompt-embeds=" + b, in.narrow(0, 7, 7), {caps2}, {0});
  fail_unless_equals_int(across.size(0), 14);
  for (int64_t f = 0; f < 7; ++f)
    fail_unless(rel(across[7 + f], second_with_b[f]) <= kTolerance, "frame %ld after the new caps is not B's", 7 + f);
}
GST_END_TEST;

// Latents of 1e30 come out NaN: the stream goes on, but a WARNING says so once, naming the first such latent (it
// went on silently before).
GST_START_TEST(test_non_finite_output_is_said_once) {
  Warnings warnings;
  Out out;
  run_restyle(out, torch::full_like(raw_input().narrow(0, 0, 5), 1e30f), [&](GstElement* p) { warnings.attach(p); });
  fail_unless(out.error.empty(), "%s", out.error.c_str());
  fail_unless_equals_int(out.buffers.size(), 5);
  std::lock_guard<std::mutex> lock(warnings.mu);
  fail_unless(warnings.seen.size() == 1 && warnings.seen[0].find("NaN") != std::string::npos, "%zu warnings: '%s'",
              warnings.seen.size(), warnings.seen.empty() ? "" : warnings.seen[0].c_str());
}
GST_END_TEST;

// A caps query names the model's latent space and channels, so an upstream that chooses sees what fits.
GST_START_TEST(test_caps_queries_name_the_latent_space) {
  GstElement* r = gst_parse_launch(restyle("prompt-embeds=" + prompt_a()).c_str(), nullptr);
  fail_unless(gst_element_set_state(r, GST_STATE_READY) == GST_STATE_CHANGE_SUCCESS);
  for (const char* name : {"sink", "src"}) {
    GstPad* pad = gst_element_get_static_pad(r, name);
    GstCaps* caps = gst_pad_query_caps(pad, nullptr);
    fail_unless(!gst_caps_is_empty(caps));
    const GstStructure* st = gst_caps_get_structure(caps, 0);
    int channels = 0;
    fail_unless_equals_string(gst_structure_get_string(st, "model"), "wan2.1");
    fail_unless(gst_structure_get_int(st, "channels", &channels) && channels == 16, "%s: channels %d", name, channels);
    gst_caps_unref(caps);
    gst_object_unref(pad);
  }
  gst_element_set_state(r, GST_STATE_NULL);
  gst_object_unref(r);
}
GST_END_TEST;

// What the latent-filter base does for all three transform elements, seen through videorestyle (a frame leaves one
// frame after it came): a serialized event waits behind the frames that came before it and goes out ahead of the
// first output that covers a later frame; a DISCONT input ends the clip (what was in flight goes out, then the held
// events) and the next clip's first output is DISCONT, as the stream's first is.
GST_START_TEST(test_events_keep_their_place_and_a_discont_starts_a_clip) {
  struct Seen {
    std::mutex mu;
    std::vector<std::string> order;
    void add(const std::string& what) {
      std::lock_guard<std::mutex> lock(mu);
      order.push_back(what);
    }
  } seen;
  GstElement* r = gst_parse_launch(restyle("raw-input=false prompt-embeds=" + prompt_a()).c_str(), nullptr);
  fail_unless(r != nullptr);
  GstPad* src = gst_pad_new("src", GST_PAD_SRC);
  GstPad* sink = gst_pad_new("sink", GST_PAD_SINK);
  gst_pad_set_element_private(sink, &seen);
  gst_pad_set_chain_function(sink, [](GstPad* pad, GstObject*, GstBuffer* b) {
    static_cast<Seen*>(gst_pad_get_element_private(pad))->add(GST_BUFFER_IS_DISCONT(b) ? "bD" : "b");
    gst_buffer_unref(b);
    return GST_FLOW_OK;
  });
  gst_pad_set_event_function(sink, [](GstPad* pad, GstObject*, GstEvent* e) -> gboolean {
    if (GST_EVENT_TYPE(e) == GST_EVENT_CUSTOM_DOWNSTREAM)
      static_cast<Seen*>(gst_pad_get_element_private(pad))->add(gst_structure_get_name(gst_event_get_structure(e)));
    gst_event_unref(e);
    return TRUE;
  });
  GstPad* rsink = gst_element_get_static_pad(r, "sink");
  GstPad* rsrc = gst_element_get_static_pad(r, "src");
  fail_unless(gst_pad_link(src, rsink) == GST_PAD_LINK_OK && gst_pad_link(rsrc, sink) == GST_PAD_LINK_OK);
  gst_pad_set_active(src, TRUE);
  gst_pad_set_active(sink, TRUE);
  fail_unless(gst_element_set_state(r, GST_STATE_PLAYING) == GST_STATE_CHANGE_SUCCESS);
  fail_unless(gst_pad_push_event(src, gst_event_new_stream_start("restyle")));
  GstCaps* caps = gst_caps_from_string(kCaps);
  fail_unless(gst_pad_push_event(src, gst_event_new_caps(caps)));
  gst_caps_unref(caps);
  GstSegment segment;
  gst_segment_init(&segment, GST_FORMAT_TIME);
  fail_unless(gst_pad_push_event(src, gst_event_new_segment(&segment)));
  const torch::Tensor frames = raw_input();
  const auto push = [&](int64_t t, bool discont) {
    const torch::Tensor f = frames[t].contiguous();
    GstBuffer* b = gst_buffer_new_memdup(f.data_ptr(), size_t(f.nbytes()));
    GST_BUFFER_PTS(b) = GstClockTime(t) * kLatent;
    GST_BUFFER_DURATION(b) = kLatent;
    if (discont) GST_BUFFER_FLAG_SET(b, GST_BUFFER_FLAG_DISCONT);
    fail_unless_equals_int(gst_pad_push(src, b), GST_FLOW_OK);
  };
  const auto mark = [&](const char* name) {
    fail_unless(
        gst_pad_push_event(src, gst_event_new_custom(GST_EVENT_CUSTOM_DOWNSTREAM, gst_structure_new_empty(name))));
  };
  push(0, false);
  push(1, false);
  mark("A");
  push(2, false);
  mark("B");
  push(3, true);
  push(4, false);
  fail_unless(gst_pad_push_event(src, gst_event_new_eos()));
  gst_element_set_state(r, GST_STATE_NULL);
  std::string order;
  for (const std::string& s : seen.order) order += (order.empty() ? "" : " ") + s;
  fail_unless_equals_string(order.c_str(), "bD b A b B bD b");
  gst_pad_unlink(src, rsink);
  gst_pad_unlink(rsrc, sink);
  gst_object_unref(rsink);
  gst_object_unref(rsrc);
  gst_object_unref(src);
  gst_object_unref(sink);
  gst_object_unref(r);
}
GST_END_TEST;

void add_restyle_tests(Suite* s) {
  TCase* tc = tcase_create("restyle");
  tcase_set_timeout(tc, 300);
  suite_add_tcase(s, tc);
  tcase_add_test(tc, test_restyle_equals_streamdiffusionv2);
  tcase_add_test(tc, test_normalised_latents_are_made_raw);
  tcase_add_test(tc, test_late_frames_are_skipped);
  tcase_add_test(tc, test_prompt_set_while_playing_switches);
  tcase_add_test(tc, test_other_latents_are_refused);
  tcase_add_test(tc, test_bad_settings_are_refused);
  tcase_add_test(tc, test_bad_embeddings_set_while_playing_are_warnings);
  tcase_add_test(tc, test_prompts_before_caps_and_across_new_caps);
  tcase_add_test(tc, test_caps_queries_name_the_latent_space);
  tcase_add_test(tc, test_events_keep_their_place_and_a_discont_starts_a_clip);
  tcase_add_test(tc, test_non_finite_output_is_said_once);
  const char* taehv = g_getenv("LATENT_TAEHV_FIXTURES");
  if (taehv && fs::exists(fs::path(taehv) / "stamp"))
    tcase_add_test(tc, test_video_chain_keeps_every_frame);
  else
    latent_test::skip_missing("no TAEHV fixtures (LATENT_TAEHV_FIXTURES unset: a build without the .venv)");
}
