// Text to video from a diffusers pipeline folder: videogen's prompt, negative-prompt and initial-noise against
// diffusers' own pipeline on tiny random folders complete with tokenizer and text encoder
// (tests/fixtures/gen_pipeline_fixtures.py), latent-prompt's file against videogen's prompt, decoding with the
// folder's VAE, and the errors of bad input.

// The C++ headers come first: check's function-like macros (fail, ...) would rewrite their members.
#include <torch/types.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "io/json.h"
#include "latent/io/safetensors.h"

#include <gst/app/gstappsink.h>
#include <gst/check/gstcheck.h>

#include "check_main.h"
#include "generated_latents.h"
#include "pipeline_run.h"

namespace {

namespace fs = std::filesystem;
using latent_test::Out;
using latent_test::relative_error;
using latent_test::set_strings;
using latent_test::stacked;

fs::path fixtures() {
  const char* d = g_getenv("LATENT_PIPELINE_FIXTURES");
  return d && fs::exists(fs::path(d) / "stamp") ? fs::path(d) : fs::path();
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

struct Case {
  std::string name, prompt;
  std::optional<std::string> negative;
  double guidance = 1;
};

std::vector<Case> cases_of(const latent::SafetensorsFile& f) {
  std::vector<Case> out;
  const auto doc = latent::json::parse(f.metadata().at("cases"));
  for (const auto& c : doc.as_array()) {
    Case k;
    k.name = c.find("name")->as_string();
    k.prompt = c.find("prompt")->as_string();
    if (!c.find("negative_prompt")->is_null()) k.negative = c.find("negative_prompt")->as_string();
    k.guidance = c.find("guidance")->as_double();
    out.push_back(k);
  }
  return out;
}

std::string wan() { return (fixtures() / "wan").string(); }
std::string wan_noise() { return (fixtures() / "wan-noise.safetensors").string(); }

// 17 frames of 96x64: 5 latent frames of 12x8, as the fixture's pipeline run.
std::string wan_gen(const std::string& props) {
  return "videogen name=gen model=" + wan() + " width=96 height=64 num-frames=17 schedule=clip " + props + " ! ";
}

fs::path scratch(const std::string& tag) {
  fs::path p = fs::temp_directory_path() / ("t2v-" + tag + "-" + std::to_string(getpid()));
  fs::remove_all(p);
  fs::create_directories(p);
  return p;
}

}  // namespace

// Every case of a family's fixture through videogen from its prompt, against the pipeline's latents. The
// tolerance: the transformers and the text encoders each match diffusers / transformers to ~1e-6 relative in
// float32 (their own tests); three steps with guidance 5 or 6 scale a difference of the model output by up to
// 1 + 2 * 6 per step, so 1e-4 leaves a margin while a wrong token, a missing clean-up or the wrong negative prompt
// moves the result by over 1e-2 (the fixture checks that its cases differ by that much).
void check_family(const std::string& family, const std::string& size, int64_t frames, int64_t h, int64_t w,
                  bool frames_first) {
  const latent::SafetensorsFile ref = latent::SafetensorsFile::open(fixtures() / (family + "-cases.safetensors"));
  const std::string noise = (fixtures() / (family + "-noise.safetensors")).string();
  for (const Case& c : cases_of(ref)) {
    Out out;
    latent_test::run("videogen name=gen model=" + (fixtures() / family).string() + " " + size +
                         " schedule=clip steps=3 guidance-scale=" + std::to_string(c.guidance) +
                         " initial-noise=" + noise + " ! appsink name=out",
                     out, 120 * GST_SECOND, set_strings({{"prompt", c.prompt}, {"negative-prompt", c.negative}}));
    fail_unless(out.error.empty(), "%s %s: %s", family.c_str(), c.name.c_str(), out.error.c_str());
    fail_unless_equals_int(out.buffers.size(), frames);
    torch::Tensor want = ref.tensor(c.name + ".latents");
    if (frames_first) want = want.permute({0, 2, 1, 3, 4});
    const double rel = relative_error(stacked(out, 16, h, w), want);
    g_print("%s %s (guidance %g): %.2e relative to diffusers\n", family.c_str(), c.name.c_str(), c.guidance, rel);
    fail_unless(rel <= 1e-4, "%s %s: relative error %g against diffusers' pipeline", family.c_str(), c.name.c_str(),
                rel);
  }
}

GST_START_TEST(test_wan_prompt_matches_diffusers) {
  check_family("wan", "width=96 height=64 num-frames=17", 5, 8, 12, false);
}
GST_END_TEST;

// CogVideoX: T5 over the whole padded prompt, one timestep per clip, DDIM with v-prediction, latents= in
// [1, T, C, h, w].
GST_START_TEST(test_cogvideox_prompt_matches_diffusers) {
  check_family("cogvideox", "width=64 height=48 num-frames=9", 3, 6, 8, true);
}
GST_END_TEST;

// latent-prompt writes what videogen computes: the same run from its file gives the same latents, bit for bit.
GST_START_TEST(test_latent_prompt_file_equals_the_prompt_property) {
  const fs::path dir = scratch("prompt");
  const std::string file = (dir / "embeds.safetensors").string();
  const std::string prompt = "A  red fox &amp; a cat running through   snow at dawn";
  const std::string cmd =
      std::string(LATENT_PROMPT_TOOL) + " " + wan() + " '" + prompt + "' --negative 'grey water' " + file;
  fail_unless_equals_int(std::system(cmd.c_str()), 0);
  const latent::SafetensorsFile f = latent::SafetensorsFile::open(file);
  fail_unless(f.contains("prompt_embeds") && f.contains("negative_prompt_embeds"));
  fail_unless(f.tensor("prompt_embeds").sizes() == torch::IntArrayRef({1, 512, 32}));
  Out a, b;
  latent_test::run(wan_gen("steps=2 guidance-scale=5") + "appsink name=out", a, 120 * GST_SECOND,
                   set_strings({{"prompt", prompt}, {"negative-prompt", "grey water"}}));
  latent_test::run(wan_gen("steps=2 guidance-scale=5 prompt-embeds=" + file) + "appsink name=out", b);
  fail_unless(a.error.empty() && b.error.empty(), "%s %s", a.error.c_str(), b.error.c_str());
  fail_unless(torch::equal(stacked(a, 16, 8, 12), stacked(b, 16, 8, 12)));
  // Bad use: a clear message and status 1 (2 for the command line).
  fail_unless_equals_int(WEXITSTATUS(std::system((std::string(LATENT_PROMPT_TOOL) + " 2>/dev/null").c_str())), 2);
  fail_unless_equals_int(
      WEXITSTATUS(std::system((std::string(LATENT_PROMPT_TOOL) + " /nonexistent x " + file + " 2>/dev/null").c_str())),
      1);
  // The pipeline's vae/ is not where prompts are encoded: refused with the folder to give, not silently the parent's.
  const std::string log = (dir / "vae.log").string();
  fail_unless_equals_int(WEXITSTATUS(std::system(
                             (std::string(LATENT_PROMPT_TOOL) + " " + wan() + "/vae x " + file + " 2>" + log).c_str())),
                         1);
  std::ifstream in(log);
  const std::string said((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  fail_unless(contains(said, "this is its vae/ folder: give the pipeline folder"), "%s", said.c_str());
  fs::remove_all(dir);
}
GST_END_TEST;

// The folder's own VAE takes the latents: the caps name the same model, and 17 frames come out.
GST_START_TEST(test_folder_vae_decodes_the_latents) {
  Out out;
  latent_test::run(
      wan_gen("steps=1 guidance-scale=1 prompt=fox") + "vaedecode model=" + wan() + "/vae ! appsink name=out", out);
  fail_unless(out.error.empty(), "%s", out.error.c_str());
  fail_unless_equals_int(out.buffers.size(), 17);
  const std::string cog = (fixtures() / "cogvideox").string();
  Out c;
  latent_test::run("videogen model=" + cog + " prompt=fox steps=1 num-frames=9 schedule=clip ! vaedecode model=" + cog +
                       "/vae ! appsink name=out",
                   c);
  fail_unless(c.error.empty(), "%s", c.error.c_str());
  fail_unless_equals_int(c.buffers.size(), 9);
}
GST_END_TEST;

// Defaults that every model can run: the schedule is clip for CogVideoX (one timestep per call, where fifo cannot
// drive it), and an endless clip of Wan is its trained clip of 21 latents (81 frames), not the 1,024 its
// positions reach.
GST_START_TEST(test_defaults_run_every_model) {
  Out cog;
  latent_test::run(
      "videogen model=" + (fixtures() / "cogvideox").string() + " prompt=fox steps=1 num-frames=9 ! appsink name=out",
      cog);
  fail_unless(cog.error.empty(), "%s", cog.error.c_str());
  fail_unless_equals_int(cog.buffers.size(), 3);
  Out wan_clip;
  latent_test::run("videogen model=" + wan() +
                       " width=96 height=64 schedule=clip steps=1 guidance-scale=1 prompt=fox "
                       "! appsink name=out",
                   wan_clip);
  fail_unless(wan_clip.error.empty(), "%s", wan_clip.error.c_str());
  fail_unless_equals_int(wan_clip.buffers.size(), 21);
}
GST_END_TEST;

// The prompts are encoded at NULL->READY and again only when they change: a new prompt set in READY gives the
// latents a fresh pipeline gives for it.
GST_START_TEST(test_prompt_changed_in_ready_is_encoded_again) {
  const std::string desc = wan_gen("steps=1 guidance-scale=1 prompt=fox") + "appsink name=out";
  Out fresh;
  latent_test::run(desc, fresh, 120 * GST_SECOND, set_strings({{"prompt", "a cat on a windowsill"}}));
  fail_unless(fresh.error.empty(), "%s", fresh.error.c_str());

  GstElement* pipeline = gst_parse_launch(desc.c_str(), nullptr);
  GstElement* gen = gst_bin_get_by_name(GST_BIN(pipeline), "gen");
  GstElement* sink = gst_bin_get_by_name(GST_BIN(pipeline), "out");
  fail_unless_equals_int(gst_element_set_state(pipeline, GST_STATE_READY), GST_STATE_CHANGE_SUCCESS);
  g_object_set(gen, "prompt", "a cat on a windowsill", nullptr);
  gst_element_set_state(pipeline, GST_STATE_PLAYING);
  std::vector<torch::Tensor> frames;
  while (GstSample* s = gst_app_sink_try_pull_sample(GST_APP_SINK(sink), 60 * GST_SECOND)) {
    GstMapInfo m;
    gst_buffer_map(gst_sample_get_buffer(s), &m, GST_MAP_READ);
    frames.push_back(torch::from_blob(m.data, {16, 8, 12}, torch::kFloat).clone());
    gst_buffer_unmap(gst_sample_get_buffer(s), &m);
    gst_sample_unref(s);
  }
  gst_element_set_state(pipeline, GST_STATE_NULL);
  gst_object_unref(sink);
  gst_object_unref(gen);
  gst_object_unref(pipeline);
  fail_unless_equals_int(frames.size(), 5);
  fail_unless(torch::equal(torch::stack(frames, 1).unsqueeze(0), stacked(fresh, 16, 8, 12)));
}
GST_END_TEST;

// Prompts of no words and of 100 kB are prompts: the first is the end-of-sequence token alone, the second is cut
// to the encoder's 512 tokens.
GST_START_TEST(test_empty_and_huge_prompts_generate) {
  std::string huge;
  while (huge.size() < 100 * 1024) huge += "a red fox runs through fresh snow at dawn ";
  for (const std::string& prompt : {std::string(), huge}) {
    Out out;
    latent_test::run(wan_gen("steps=1 guidance-scale=1") + "appsink name=out", out, 120 * GST_SECOND,
                     set_strings({{"prompt", prompt}}));
    fail_unless(out.error.empty(), "%zu bytes: %s", prompt.size(), out.error.c_str());
    fail_unless_equals_int(out.buffers.size(), 5);
  }
}
GST_END_TEST;

// Several devices (CPU ranks here) make the one-device latents: CFG on two ranks, CFG x Ulysses on four, fifo's
// partitions on two; the plan is what `parallel` says, or chosen when it says auto.
GST_START_TEST(test_devices_give_the_one_device_latents) {
  const std::string cog = (fixtures() / "cogvideox").string();
  const struct {
    std::string model, size, props;
    int64_t frames, h, w;
  } runs[] = {
      {wan(), "width=96 height=64 num-frames=17", "schedule=clip steps=2 guidance-scale=5", 5, 8, 12},
      {wan(), "width=96 height=64 num-frames=13", "schedule=fifo steps=4 window=2 guidance-scale=1", 4, 8, 12},
      {cog, "width=64 height=48 num-frames=9", "schedule=clip steps=2 guidance-scale=6", 3, 6, 8},
  };
  const struct {
    int run;
    std::string devices, parallel;
  } cases[] = {
      {0, "cpu,cpu", "cfg=2"},     {0, "cpu,cpu,cpu,cpu", "auto"}, {1, "cpu,cpu", "partitions=2"},
      {1, "cpu,cpu", "ulysses=2"}, {2, "cpu,cpu", "auto"},         {2, "cpu,cpu,cpu,cpu", "cfg=2,ulysses=2"},
  };
  for (const auto& c : cases) {
    const auto& r = runs[c.run];
    const std::string base = "videogen name=gen model=" + r.model + " " + r.size + " " + r.props + " prompt=fox ";
    Out one, many;
    latent_test::run(base + "! appsink name=out", one);
    latent_test::run(base + "devices=" + c.devices + " parallel=" + c.parallel + " ! appsink name=out", many);
    fail_unless(one.error.empty() && many.error.empty(), "%s %s: %s %s", c.devices.c_str(), c.parallel.c_str(),
                one.error.c_str(), many.error.c_str());
    fail_unless_equals_int(many.buffers.size(), r.frames);
    const double rel = relative_error(stacked(many, 16, r.h, r.w), stacked(one, 16, r.h, r.w));
    g_print("devices=%s parallel=%s: %.2e relative to one device\n", c.devices.c_str(), c.parallel.c_str(), rel);
    fail_unless(rel <= 1e-5, "devices=%s parallel=%s: %g", c.devices.c_str(), c.parallel.c_str(), rel);
  }
}
GST_END_TEST;

// Each bad input fails with a message that names it, at READY or when the run is planned.
GST_START_TEST(test_bad_text_input_is_named) {
  const fs::path dir = scratch("bad");
  // A copy of the folder without its tokenizer.
  const fs::path broken = dir / "no-tokenizer";
  fs::create_directories(broken);
  for (const char* part : {"model_index.json", "text_encoder", "transformer", "scheduler", "vae"})
    fs::create_symlink(fs::path(wan()) / part, broken / part);
  // Noise of the wrong shape, a file of two tensors, and noise with a NaN.
  const std::string wrong = (dir / "wrong.safetensors").string(), two = (dir / "two.safetensors").string();
  const std::string nan = (dir / "nan.safetensors").string();
  {
    latent::SafetensorsWriter w(wrong);
    w.write("latents", torch::zeros({1, 16, 4, 8, 12}));
    w.commit();
    torch::Tensor with_nan = torch::zeros({1, 16, 5, 8, 12});
    with_nan[0][3][2][1][0] = std::nan("");
    latent::SafetensorsWriter n(nan);
    n.write("latents", with_nan);
    n.commit();
    latent::SafetensorsWriter t(two);
    t.write("a", torch::zeros({1, 16, 5, 8, 12}));
    t.write("b", torch::zeros({1, 16, 5, 8, 12}));
    t.commit();
  }
  const struct {
    std::string desc;
    std::string expected;
  } bad[] = {
      {"videogen model=" + broken.string() + " prompt=fox num-frames=1 ! ", "no tokenizer/ folder"},
      {"videogen prompt=fox num-frames=1 ! ", "this model takes no text"},
      {"videogen model=" + wan() + "/transformer prompt=fox prompt-embeds=" + wrong + " num-frames=1 ! ",
       "set prompt or prompt-embeds, not both"},
      {"videogen model=" + wan() + " negative-prompt=blur guidance-scale=5 num-frames=1 ! ",
       "negative-prompt needs prompt"},
      {wan_gen("prompt=fox initial-noise=" + wrong), "these settings need [1, 16, 5, 8, 12]"},
      {wan_gen("prompt=fox initial-noise=" + two), "holds 2 tensors"},
      {wan_gen("prompt=fox initial-noise=" + nan), nan + ": tensor \"latents\" holds 1 NaN"},
      {wan_gen("prompt=fox initial-noise=/nonexistent.safetensors"), "nonexistent.safetensors"},
      {"videogen model=" + wan() + " prompt=fox schedule=fifo num-frames=9 initial-noise=" + wan_noise() + " ! ",
       "initial-noise needs schedule=clip"},
      {"videogen model=" + wan() + " num-frames=1 ! ", "this model needs text: set prompt"},
      {"videogen model=" + wan() + " prompt=fox text-device=cuda:7 num-frames=1 ! ", "cuda"},
      {"videogen model=" + (fixtures() / "cogvideox").string() + " prompt=fox num-frames=9 schedule=fifo ! ",
       "use the clip schedule"},
      {wan_gen("prompt=fox devices=cpu,cpu,cpu parallel=cfg=2"), "needs 2 devices; there are 3"},
      {wan_gen("prompt=fox parallel=cfg=2"), "needs devices"},
      {wan_gen("prompt=fox devices=cpu,cpu parallel=cfg=two"), "is not one of cfg=N"},
      {wan_gen("prompt=fox devices=cpu,cpu,cpu parallel=ulysses=3"), "valid: 1, 2"},
      {wan_gen("prompt=fox guidance-scale=5 devices=cpu,cpu,cpu"), "no plan for 3 devices"},
      {wan_gen("prompt=fox devices=cpu,,cpu"), "empty entry"},
      {"videogen model=" + (fixtures() / "cogvideox").string() + " prompt=fox num-frames=9 schedule=clip " +
           "initial-noise=" + wan_noise() + " ! ",
       "([1, T, C, h, w]"},
  };
  for (const auto& b : bad) {
    Out out;
    latent_test::run(b.desc + "fakesink", out);
    fail_unless(contains(out.error, b.expected), "%.200s\n  gave: '%.300s'\n  expected: '%s'", b.desc.c_str(),
                out.error.c_str(), b.expected.c_str());
  }
  fs::remove_all(dir);
}
GST_END_TEST;

static Suite* text_to_video_suite() {
  Suite* s = suite_create("text-to-video");
  TCase* tc = tcase_create("text-to-video");
  tcase_set_timeout(tc, 600);
  suite_add_tcase(s, tc);
  if (fixtures().empty()) {
    latent_test::skip_missing("no pipeline fixtures (LATENT_PIPELINE_FIXTURES unset: a build without the .venv)");
    return s;
  }
  tcase_add_test(tc, test_wan_prompt_matches_diffusers);
  tcase_add_test(tc, test_cogvideox_prompt_matches_diffusers);
  tcase_add_test(tc, test_latent_prompt_file_equals_the_prompt_property);
  tcase_add_test(tc, test_folder_vae_decodes_the_latents);
  tcase_add_test(tc, test_defaults_run_every_model);
  tcase_add_test(tc, test_prompt_changed_in_ready_is_encoded_again);
  tcase_add_test(tc, test_empty_and_huge_prompts_generate);
  tcase_add_test(tc, test_devices_give_the_one_device_latents);
  tcase_add_test(tc, test_bad_text_input_is_named);
  return s;
}

LATENT_CHECK_MAIN(text_to_video);
