// Wan 2.2 from diffusers folders: videogen's TI2V-5B (48 latent channels, one timestep per patch token, image to
// video with image=) and A14B (transformer and transformer_2 split at boundary_ratio, guidance-scale-2) against
// diffusers' own pipelines on tiny random folders (tests/fixtures/gen_wan22_fixtures.py), the latent caps each
// folder's VAE gives, and what a folder or a setting the code does not implement is refused with.

// The C++ headers come first: check's function-like macros (fail, ...) would rewrite their members.
#include <torch/types.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <sstream>
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

fs::path with_stamp(const char* var) {
  const char* d = g_getenv(var);
  return d && fs::exists(fs::path(d) / "stamp") ? fs::path(d) : fs::path();
}
fs::path fixtures() { return with_stamp("LATENT_WAN22_FIXTURES"); }
// gen_pipeline_fixtures.py's Wan 2.1 text-to-video folder: a model that takes no image and has one expert.
fs::path wan21_fixtures() { return with_stamp("LATENT_PIPELINE_FIXTURES"); }

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

std::string fixture(const std::string& name) { return (fixtures() / name).string(); }

struct Case {
  std::string name, prompt;
  std::optional<std::string> negative, image;
  double guidance = 1;
  std::optional<double> guidance_2;
};

std::vector<Case> cases_of(const latent::SafetensorsFile& f) {
  std::vector<Case> out;
  const auto doc = latent::json::parse(f.metadata().at("cases"));
  for (const auto& c : doc.as_array()) {
    Case k;
    k.name = c.find("name")->as_string();
    k.prompt = c.find("prompt")->as_string();
    if (!c.find("negative_prompt")->is_null()) k.negative = c.find("negative_prompt")->as_string();
    if (!c.find("image")->is_null()) k.image = fixture(c.find("image")->as_string());
    k.guidance = c.find("guidance")->as_double();
    if (!c.find("guidance_2")->is_null()) k.guidance_2 = c.find("guidance_2")->as_double();
    out.push_back(k);
  }
  return out;
}

int64_t meta_int(const latent::SafetensorsFile& f, const char* key) { return std::stoll(f.metadata().at(key)); }

// Fails the test with a clear message where videogen lacks a property the run needs: a launch line with an unknown
// property would otherwise run without it (gst_parse_launch only warns), and comparing that run says nothing.
void require_properties(std::initializer_list<const char*> names) {
  GstElement* gen = gst_element_factory_make("videogen", nullptr);
  fail_unless(gen != nullptr, "no videogen element");
  for (const char* name : names)
    fail_unless(g_object_class_find_property(G_OBJECT_GET_CLASS(gen), name) != nullptr, "videogen has no property %s",
                name);
  gst_object_unref(gen);
}

std::string number(double v) {
  std::ostringstream s;
  s << v;
  return s.str();
}

std::string caps_string(GstCaps* caps, const char* field) {
  const gchar* v = gst_structure_get_string(gst_caps_get_structure(caps, 0), field);
  return v ? v : "";
}

int caps_int(GstCaps* caps, const char* field) {
  int v = -1;
  gst_structure_get_int(gst_caps_get_structure(caps, 0), field, &v);
  return v;
}

struct Family {
  std::string name;  // the folder and the prefix of its files
  int64_t channels, spatial_factor;
  std::string caps_model;  // the latent space the folder's vae/ names
};

// Every case of a folder's fixture through videogen, against the pipeline's latents, and the caps it negotiates.
// The tolerance: the transformer and the text encoder each match diffusers / transformers to ~1e-6 relative in
// float32 (their own tests), and the Wan 2.2 VAE's encoder (i2v's image latent) the same (the VAE tests); three or
// four steps with guidance up to 5 scale a difference of the model output by up to 1 + 2 * 5 per step, so 1e-4
// leaves a margin. What it must catch moves the result far more: every pair of cases differs by over 1e-2 (the
// fixture checks), rounding the timesteps instead of truncating them moves TI2V's t2v by ~8e-2 (metadata
// "rounding_moves"), and the wrong expert on a step runs a different random network.
void check_family(const Family& f) {
  const latent::SafetensorsFile ref = latent::SafetensorsFile::open(fixtures() / (f.name + "-cases.safetensors"));
  const int64_t height = meta_int(ref, "height"), width = meta_int(ref, "width"), frames = meta_int(ref, "frames");
  const int64_t h = height / f.spatial_factor, w = width / f.spatial_factor, latent_frames = (frames - 1) / 4 + 1;
  for (const Case& c : cases_of(ref)) {
    std::string props = " width=" + std::to_string(width) + " height=" + std::to_string(height) +
                        " num-frames=" + std::to_string(frames) + " schedule=clip steps=" + ref.metadata().at("steps") +
                        " guidance-scale=" + number(c.guidance);
    if (c.guidance_2) props += " guidance-scale-2=" + number(*c.guidance_2);
    Out out;
    latent_test::run("videogen name=gen model=" + fixture(f.name) + props +
                         " initial-noise=" + fixture(f.name + "-noise.safetensors") + " ! appsink name=out",
                     out, 120 * GST_SECOND,
                     set_strings({{"prompt", c.prompt}, {"negative-prompt", c.negative}, {"image", c.image}}));
    fail_unless(out.error.empty(), "%s %s: %s", f.name.c_str(), c.name.c_str(), out.error.c_str());
    fail_unless_equals_int(out.buffers.size(), latent_frames);
    fail_unless(out.caps != nullptr);
    fail_unless_equals_string(caps_string(out.caps, "model").c_str(), f.caps_model.c_str());
    fail_unless_equals_int(caps_int(out.caps, "channels"), f.channels);
    fail_unless_equals_int(caps_int(out.caps, "spatial-factor"), f.spatial_factor);
    fail_unless_equals_int(caps_int(out.caps, "width"), w);
    fail_unless_equals_int(caps_int(out.caps, "height"), h);
    const torch::Tensor got = stacked(out, f.channels, h, w);
    if (ref.contains(c.name + ".condition")) {
      // Image to video puts the image's latent back as frame 0: said apart, as it is the first thing to look at.
      const double first = relative_error(got.narrow(2, 0, 1), ref.tensor(c.name + ".condition"));
      g_print("%s %s: latent frame 0 %.2e relative to the image's latent\n", f.name.c_str(), c.name.c_str(), first);
      fail_unless(first <= 1e-4, "%s %s: latent frame 0 is %g from the image's latent", f.name.c_str(), c.name.c_str(),
                  first);
    }
    const double rel = relative_error(got, ref.tensor(c.name + ".latents"));
    g_print("%s %s (guidance %g, guidance-2 %s): %.2e relative to diffusers\n", f.name.c_str(), c.name.c_str(),
            c.guidance, c.guidance_2 ? number(*c.guidance_2).c_str() : "unset", rel);
    fail_unless(rel <= 1e-4, "%s %s: relative error %g against diffusers' pipeline", f.name.c_str(), c.name.c_str(),
                rel);
  }
}

fs::path scratch(const std::string& tag) {
  fs::path p = fs::temp_directory_path() / ("wan22-" + tag + "-" + std::to_string(getpid()));
  fs::remove_all(p);
  fs::create_directories(p);
  return p;
}

std::string read_text(const fs::path& p) {
  std::ifstream in(p);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// A copy of a fixture folder with `entry` (a JSON member, "key": value) added to one of its JSON files.
fs::path edited_copy(const fs::path& dir, const std::string& folder, const std::string& file,
                     const std::string& entry) {
  const fs::path copy = dir / (folder + "-" + std::to_string(std::hash<std::string>{}(file + entry)));
  fs::copy(fixtures() / folder, copy, fs::copy_options::recursive);
  std::string text = read_text(copy / file);
  const size_t brace = text.find('{');
  fail_unless(brace != std::string::npos, "%s holds no JSON object", file.c_str());
  text.insert(brace + 1, "\n  " + entry + ",");
  std::ofstream(copy / file) << text;
  return copy;
}

// Takes `desc` to READY, which must fail, and returns the error the element posted.
std::string ready_error(const std::string& desc, const std::function<void(GstElement*)>& setup = {}) {
  GError* err = nullptr;
  GstElement* pipeline = gst_parse_launch(desc.c_str(), &err);
  fail_unless(pipeline != nullptr && err == nullptr, "cannot build %s: %s", desc.c_str(), err ? err->message : "?");
  if (setup) setup(pipeline);
  const GstStateChangeReturn ret = gst_element_set_state(pipeline, GST_STATE_READY);
  std::string said;
  GstBus* bus = gst_element_get_bus(pipeline);
  if (GstMessage* msg = gst_bus_pop_filtered(bus, GST_MESSAGE_ERROR)) {
    GError* e = nullptr;
    gst_message_parse_error(msg, &e, nullptr);
    said = e->message;
    g_clear_error(&e);
    gst_message_unref(msg);
  }
  gst_element_set_state(pipeline, GST_STATE_NULL);
  gst_object_unref(bus);
  gst_object_unref(pipeline);
  fail_unless_equals_int(ret, GST_STATE_CHANGE_FAILURE);
  return said;
}

// Runs `desc` (ending in "appsink name=out"), which must fail before a single latent frame is made, and returns
// its error. Settings that need the run's size (the image is scaled to it) are checked when the run is planned,
// READY->PAUSED, as the other generation settings are.
std::string refusal(const std::string& desc, const std::function<void(GstElement*)>& setup = {}) {
  Out out;
  latent_test::run(desc, out, 120 * GST_SECOND, setup);
  fail_unless(out.buffers.empty(), "%s made %zu latent frames before failing", desc.c_str(), out.buffers.size());
  fail_if(out.error.empty(), "%s ran to the end", desc.c_str());
  return out.error;
}

}  // namespace

// TI2V-5B as text to video and as image to video: per-token timesteps (all equal in t2v; 0 on i2v's frame-0
// tokens), the 48-channel Wan 2.2 latent space at 16x, latent frame 0 the image's normalised latent.
GST_START_TEST(test_ti2v_matches_diffusers) {
  require_properties({"image"});
  check_family({"ti2v", 48, 16, "wan2.2"});
}
GST_END_TEST;

// A14B: transformer for steps whose integer timestep is >= 900.1, transformer_2 after (the second step, 900.12 as a
// float, is 900), guidance-scale-2 for the second expert (unset: guidance-scale), CFG off when guidance-scale is 1
// whatever guidance-scale-2 says; the Wan 2.1 latent space.
GST_START_TEST(test_a14b_matches_diffusers) {
  require_properties({"guidance-scale-2"});
  check_family({"a14b", 16, 8, "wan2.1"});
}
GST_END_TEST;

// model_index.json decides what runs: a component or a flag the code does not implement is refused when the folder
// loads (NULL->READY), named, never ignored; the scheduler config is as strict.
GST_START_TEST(test_unknown_folder_entries_are_refused_by_name) {
  const fs::path dir = scratch("folder");
  const struct {
    std::string file, entry, key;
  } bad[] = {
      {"model_index.json", R"("image_encoder": ["transformers", "CLIPVisionModel"])", "image_encoder"},
      {"model_index.json", R"("foo_flag": true)", "foo_flag"},
      {"scheduler/scheduler_config.json", R"("foo_sigma_mode": "karras")", "foo_sigma_mode"},
  };
  for (const auto& b : bad) {
    const fs::path copy = edited_copy(dir, "ti2v", b.file, b.entry);
    const std::string said =
        ready_error("videogen name=gen model=" + copy.string() + " prompt=fox width=96 height=64 ! fakesink");
    fail_unless(contains(said, b.key), "%s with %s\n  gave: '%s'\n  expected it named: '%s'", b.file.c_str(),
                b.entry.c_str(), said.c_str(), b.key.c_str());
  }
  fs::remove_all(dir);
}
GST_END_TEST;

// image= where it cannot be used: a model that takes no image (Wan 2.1 text to video, A14B), a missing file, a file
// that is not an image. Each is refused before any latent is made and names what is wrong.
GST_START_TEST(test_bad_image_is_refused) {
  require_properties({"image"});
  const fs::path dir = scratch("image");
  const std::string text = (dir / "not-an-image.png").string();
  std::ofstream(text) << "a text file, not a picture\n";
  const std::string png = fixture("ti2v-image.png");
  struct Bad {
    std::string model, image, expected;
  };
  // A playlist named .png: decodebin would fetch the URLs it lists (any reachable host made a target).
  const std::string playlist = (dir / "playlist.png").string();
  std::ofstream(playlist) << "#EXTM3U\n#EXT-X-TARGETDURATION:1\n#EXTINF:1,\nhttp://127.0.0.1:9/a.ts\n#EXT-X-ENDLIST\n";
  // A PNG declaring 20000x20000 with a few bytes of data: refused before anything is decoded.
  const std::string huge = (dir / "huge.png").string();
  {
    std::ofstream out(huge, std::ios::binary);
    const unsigned char header[] = {0x89, 'P',  'N',  'G', '\r', '\n', 0x1a, '\n', 0, 0, 0, 13, 'I', 'H', 'D', 'R', 0,
                                    0,    0x4e, 0x20, 0,   0,    0x4e, 0x20, 8,    2, 0, 0, 0,  0,   0,   0,   0};
    out.write(reinterpret_cast<const char*>(header), sizeof header);
  }
  std::vector<Bad> bad = {
      {fixture("ti2v"), "/nonexistent/first-frame.png", "/nonexistent/first-frame.png"},
      {fixture("ti2v"), text, "not a PNG or JPEG file"},
      {fixture("ti2v"), playlist, "not a PNG or JPEG file"},
      {fixture("ti2v"), huge, "declares 20000x20000 pixels"},
      {fixture("a14b"), png, "image"},
  };
  if (!wan21_fixtures().empty()) bad.push_back({(wan21_fixtures() / "wan").string(), png, "image"});
  for (const Bad& b : bad) {
    const std::string said =
        refusal("videogen name=gen model=" + b.model + " prompt=fox width=96 height=64 num-frames=5 ! appsink name=out",
                set_strings({{"image", b.image}}));
    fail_unless(contains(said, b.expected), "%s with image=%s\n  gave: '%s'\n  expected: '%s'", b.model.c_str(),
                b.image.c_str(), said.c_str(), b.expected.c_str());
  }
  fs::remove_all(dir);
}
GST_END_TEST;

// guidance-scale-2 on a folder with one expert is refused, not ignored: it would do nothing there, and a user who
// sets it believes it does something (diffusers' pipelines raise the same way).
GST_START_TEST(test_guidance_scale_2_needs_two_experts) {
  require_properties({"guidance-scale-2"});
  std::vector<std::string> single = {fixture("ti2v")};
  if (!wan21_fixtures().empty()) single.push_back((wan21_fixtures() / "wan").string());
  for (const std::string& model : single) {
    const std::string said = refusal("videogen name=gen model=" + model +
                                     " prompt=fox width=96 height=64 num-frames=5 guidance-scale=5 "
                                     "guidance-scale-2=3 ! appsink name=out");
    fail_unless(contains(said, "guidance-scale-2"), "%s\n  gave: '%s'", model.c_str(), said.c_str());
  }
}
GST_END_TEST;

// transformer-weights, lora and lora-2 reach the model videogen loads (the core's tests hold the readers and the
// merge to diffusers): the original-layout checkpoint of tests/fixtures/gen_wan_weights_fixtures.py's folder makes
// the folder's latents, a LoRA at 0.7 moves them and at 0 does not, and bad values fail at NULL->READY by name.
GST_START_TEST(test_weight_edits_reach_the_model) {
  require_properties({"transformer-weights", "lora", "lora-2"});
  const fs::path w = with_stamp("LATENT_WAN_WEIGHTS_FIXTURES");
  const fs::path dir = fs::temp_directory_path() / ("latent-wan22-edits-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const fs::path embeds = dir / "embeds.safetensors";
  {
    const latent::SafetensorsFile cases = latent::SafetensorsFile::open(w / "cases.safetensors");
    latent::SafetensorsWriter out(embeds, {.durable = false});
    out.write("prompt_embeds", cases.tensor("text").clone());
    out.commit();
  }
  const std::string base = "videogen name=gen model=" + (w / "pipeline").string() +
                           " prompt-embeds=" + embeds.string() +
                           " schedule=clip num-frames=5 width=96 height=64 steps=2 seed=7 guidance-scale=1";
  const auto latents = [&](const std::string& extra) {
    Out out;
    latent_test::run(base + extra + " ! appsink name=out", out);
    fail_unless(out.error.empty(), "%s: %s", extra.c_str(), out.error.c_str());
    return stacked(out, 16, 8, 12);
  };
  const torch::Tensor plain = latents("");
  fail_unless(torch::equal(latents(" transformer-weights=" + (w / "original.pt").string()), plain),
              "the original-layout checkpoint gave other latents than its folder");
  const std::string lora = (w / "lora-original.safetensors").string();
  fail_unless(torch::equal(latents(" lora=" + lora + ":0"), plain), "a LoRA at 0 changed the latents");
  const double moved = relative_error(latents(" lora=" + lora + ":0.7"), plain);
  fail_unless(moved > 1e-3, "a LoRA at 0.7 moved the latents by %g only", moved);

  std::string said = ready_error(base + " lora=" + (dir / "missing.safetensors").string() + " ! fakesink");
  fail_unless(contains(said, "missing.safetensors"), "a missing LoRA: '%s'", said.c_str());
  said = ready_error(base + " lora=" + lora + ":0.x7 ! fakesink");
  fail_unless(contains(said, "\"0.x7\" is not a number"), "a bad scale: '%s'", said.c_str());
  said = ready_error(base + " lora-2=" + lora + " ! fakesink");
  fail_unless(contains(said, "second expert"), "lora-2 on one transformer: '%s'", said.c_str());
  said = ready_error(base + " transformer-weights=" + embeds.string() + " ! fakesink");
  fail_unless(contains(said, embeds.filename().string()), "weights of another model: '%s'", said.c_str());
  fs::remove_all(dir);
}
GST_END_TEST;

static Suite* wan22_suite() {
  Suite* s = suite_create("wan22");
  TCase* tc = tcase_create("wan22");
  tcase_set_timeout(tc, 600);
  suite_add_tcase(s, tc);
  if (fixtures().empty()) {
    latent_test::skip_missing("no Wan 2.2 fixtures (LATENT_WAN22_FIXTURES unset: a build without the .venv)");
    return s;
  }
  if (wan21_fixtures().empty())
    latent_test::skip_missing(
        "no Wan 2.1 pipeline fixture (LATENT_PIPELINE_FIXTURES): image= and guidance-scale-2 "
        "on it are not tried");
  tcase_add_test(tc, test_ti2v_matches_diffusers);
  tcase_add_test(tc, test_a14b_matches_diffusers);
  tcase_add_test(tc, test_unknown_folder_entries_are_refused_by_name);
  tcase_add_test(tc, test_bad_image_is_refused);
  tcase_add_test(tc, test_guidance_scale_2_needs_two_experts);
  if (with_stamp("LATENT_WAN_WEIGHTS_FIXTURES").empty())
    latent_test::skip_missing("no Wan weights fixtures (LATENT_WAN_WEIGHTS_FIXTURES): weight edits are not tried");
  else
    tcase_add_test(tc, test_weight_edits_reach_the_model);
  return s;
}

LATENT_CHECK_MAIN(wan22);
