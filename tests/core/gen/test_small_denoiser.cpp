// The native latent-gen-small denoiser (core/src/gen/models/small_denoiser.cpp) against its PyTorch module
// (models/recipes/gen_small_model.py) on random weights, its causality, and the errors a damaged file gives.
#include <gtest/gtest.h>
#include <torch/types.h>

#include <cstdlib>
#include <filesystem>
#include <functional>

#include "gen/models/backends.h"
#include "io/json.h"
#include "latent/gen/denoiser.h"
#include "latent/io/weights.h"

using namespace latent;

namespace {

std::filesystem::path fixtures() {
  const char* d = std::getenv("LATENT_SMALL_DENOISER_FIXTURES");
  return d ? std::filesystem::path(d) : std::filesystem::path();
}

#define LATENT_REQUIRE_SMALL_FIXTURES()                                                                  \
  do {                                                                                                   \
    if (fixtures().empty() || !std::filesystem::exists(fixtures() / "stamp"))                            \
      GTEST_SKIP() << "no small denoiser fixtures (LATENT_SMALL_DENOISER_FIXTURES unset: build without " \
                      "the .venv)";                                                                      \
  } while (0)

// float32 rounding through the 22 convolutions of the default config moves PyTorch's own outputs (magnitude ~3) by
// up to 5e-6 from the same network in float64 (the fixture script prints it). The C++ side rounds differently
// (Winograd for the wide 3x3 convs, per-frame GEMMs for the temporal convs, other oneDNN blockings), so its error is of
// that order but not the same values; 1e-4 leaves a factor of 20 for other CPUs' kernels, while a single tensor
// read into the wrong place moves the outputs by 1e-1 or more with these random weights.
constexpr double kFp32Tolerance = 1e-4;

const WeightSource& source(const std::string& model) {
  static std::map<std::string, WeightSource> cache;
  auto it = cache.find(model);
  if (it == cache.end()) it = cache.emplace(model, read_weights(fixtures() / (model + ".safetensors"))).first;
  return it->second;
}

std::shared_ptr<Denoiser> model(const std::string& name = "model") {
  static std::map<std::string, std::shared_ptr<Denoiser>> cache;
  auto& m = cache[name];
  if (!m) m = make_small_denoiser(source(name), {});
  return m;
}

const WeightSource& cases() {
  static const WeightSource c = read_weights(fixtures() / "cases.safetensors");
  return c;
}

torch::Tensor tensor(const std::string& name) {
  auto it = cases().tensors.find(name);
  if (it == cases().tensors.end()) throw std::runtime_error("fixture tensor " + name + " missing");
  return it->second;
}

double max_abs_diff(const torch::Tensor& a, const torch::Tensor& b) {
  return (a.to(torch::kDouble) - b.to(torch::kDouble)).abs().max().item<double>();
}

// The ModelError message of building the model from `src`, or "(loaded)".
std::string load_error(const WeightSource& src) {
  try {
    make_small_denoiser(src, {});
  } catch (const ModelError& e) {
    return e.what();
  }
  return "(loaded)";
}

// The default model's file with its config edited.
std::string config_error(const std::function<void(json::Object&)>& edit) {
  WeightSource src = source("model");  // shares the tensors
  json::Value cfg = json::parse(src.metadata.at("config"));
  edit(cfg.as_object());
  src.metadata["config"] = json::dump(cfg);
  if (src.config) src.config->text = src.metadata["config"];
  return load_error(src);
}

json::Value& member(json::Object& o, const std::string& key) {
  for (auto& [k, v] : o)
    if (k == key) return v;
  throw std::runtime_error("no config key " + key);
}

void erase_key(json::Object& o, const std::string& key) {
  std::erase_if(o, [&](const auto& kv) { return kv.first == key; });
}

std::string predict_error(const torch::Tensor& x, const torch::Tensor& t, const torch::Tensor& text = {}) {
  try {
    model()->predict(x, t, text);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "(ran)";
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

}  // namespace

TEST(SmallDenoiser, ReadsTheContractFromTheFile) {
  LATENT_REQUIRE_SMALL_FIXTURES();
  EXPECT_TRUE(is_small_denoiser(source("model")));
  EXPECT_FALSE(is_small_denoiser(cases()));
  const DenoiserSpec& s = model()->spec();
  EXPECT_EQ(s.backend, "latent-gen-small");
  EXPECT_EQ(s.prediction, Prediction::flow);
  EXPECT_EQ(s.latent_space, "latent-tiny-wan");
  EXPECT_EQ(s.channels, 16);
  EXPECT_EQ(s.min_frames, 1);
  EXPECT_EQ(s.window, 16);
  EXPECT_EQ(s.height, 0);
  EXPECT_EQ(s.width, 0);
  EXPECT_EQ(s.size_multiple, 2);
  EXPECT_EQ(s.text_tokens, 0);
  EXPECT_EQ(s.text_dim, 0);
  EXPECT_EQ(s.sampler.kind, SamplerKind::euler);
  EXPECT_EQ(s.sampler.steps, 20);
  EXPECT_DOUBLE_EQ(s.sampler.shift, 3.0);
  EXPECT_DOUBLE_EQ(s.guidance, 1.0);
  EXPECT_EQ(model()->dtype(), torch::kFloat);
  // Three levels: two downsamplings.
  EXPECT_EQ(model("model-3level")->spec().size_multiple, 4);
}

TEST(SmallDenoiser, LoadDenoiserPicksTheNativeBackend) {
  LATENT_REQUIRE_SMALL_FIXTURES();
  auto m = load_denoiser(fixtures() / "model.safetensors");
  EXPECT_EQ(m->spec().backend, "latent-gen-small");
  const torch::Tensor x = tensor("t3.x"), t = tensor("t3.timesteps");
  EXPECT_EQ(max_abs_diff(m->predict(x, t, {}), model()->predict(x, t, {})), 0.0);
}

// T = 1, 3, 8 at 16x16 and a non-square 8x24 on the default config, and a 3-level config at 8x12; every frame at
// its own noise level.
TEST(SmallDenoiser, EqualsPyTorch) {
  LATENT_REQUIRE_SMALL_FIXTURES();
  const json::Value list = json::parse(cases().metadata.at("cases"));
  ASSERT_EQ(list.as_array().size(), 5u);
  for (const auto& c : list.as_array()) {
    const std::string name = c.find("name")->as_string();
    const torch::Tensor x = tensor(name + ".x"), t = tensor(name + ".timesteps");
    const torch::Tensor out = model(c.find("model")->as_string())->predict(x, t, {});
    ASSERT_EQ(out.sizes(), x.sizes()) << name;
    EXPECT_EQ(out.scalar_type(), torch::kFloat);
    const double diff = max_abs_diff(out, tensor(name + ".out"));
    const double diff64 = max_abs_diff(out, tensor(name + ".out64"));
    const double torch64 = max_abs_diff(tensor(name + ".out"), tensor(name + ".out64"));
    EXPECT_LE(diff, kFp32Tolerance) << name;
    // Against float64, C++ float32 is about as far off as PyTorch's float32.
    EXPECT_LE(diff64, kFp32Tolerance) << name;
    std::printf("%s: max |C++ - PyTorch| = %.3g; vs float64: C++ %.3g, PyTorch %.3g (max |out| %.3g)\n", name.c_str(),
                diff, diff64, torch64, tensor(name + ".out").abs().max().item<double>());
  }
}

// Frame t's prediction depends on frames <= t only: changing frame 5 (its latents and its level) leaves frames
// 0..4 as they were, and a window's first 5 frames run alone give the same predictions. The first check is exact:
// the same shapes run the same kernels, and no value of frames >= 5 enters the sums of earlier frames.
TEST(SmallDenoiser, IsCausal) {
  LATENT_REQUIRE_SMALL_FIXTURES();
  const torch::Tensor x = tensor("t8.x"), t = tensor("t8.timesteps");
  const torch::Tensor base = model()->predict(x, t, {});
  torch::Tensor x2 = x.clone(), t2 = t.clone();
  x2.select(2, 5).add_(torch::randn_like(x2.select(2, 5)));
  t2.select(1, 5).fill_(t.select(1, 5).item<double>() > 500 ? 10.0 : 990.0);
  const torch::Tensor changed = model()->predict(x2, t2, {});
  EXPECT_EQ(max_abs_diff(changed.narrow(2, 0, 5), base.narrow(2, 0, 5)), 0.0);
  for (int64_t f = 5; f < 8; ++f)
    EXPECT_GT(max_abs_diff(changed.select(2, f), base.select(2, f)), 1e-2) << "frame " << f << " did not change";
  const torch::Tensor prefix = model()->predict(x.narrow(2, 0, 5), t.narrow(1, 0, 5), {});
  EXPECT_LE(max_abs_diff(prefix, base.narrow(2, 0, 5)), kFp32Tolerance);
}

TEST(SmallDenoiser, RunsInBfloat16) {
  LATENT_REQUIRE_SMALL_FIXTURES();
  LoadOptions bf16;
  bf16.dtype = torch::kBFloat16;
  auto m = make_small_denoiser(source("model"), bf16);
  const torch::Tensor ref = tensor("t3.out");
  const torch::Tensor out = m->predict(tensor("t3.x"), tensor("t3.timesteps"), {});
  EXPECT_EQ(out.scalar_type(), torch::kFloat);
  // bfloat16 keeps 8 bits of mantissa: errors of a few percent of the output's range through 22 convolutions.
  EXPECT_LE(max_abs_diff(out, ref), 0.1 * ref.abs().max().item<double>());
}

TEST(SmallDenoiser, RefusesInputsOutsideTheContract) {
  LATENT_REQUIRE_SMALL_FIXTURES();
  const auto x = torch::zeros({1, 16, 3, 16, 16});
  const auto t = torch::zeros({1, 3});
  EXPECT_TRUE(contains(predict_error(torch::zeros({1, 16, 3, 16, 15}), t), "multiples of 2"));
  EXPECT_TRUE(contains(predict_error(torch::zeros({1, 8, 3, 16, 16}), t), "[1, 16, T, h, w]"));
  EXPECT_TRUE(contains(predict_error(torch::zeros({1, 16, 17, 16, 16}), torch::zeros({1, 17})), "1 <= T <= 16"));
  EXPECT_TRUE(contains(predict_error(torch::zeros({16, 3, 16, 16}), t), "latents"));
  EXPECT_TRUE(contains(predict_error(x, torch::zeros({1, 4})), "timesteps"));
  EXPECT_TRUE(contains(predict_error(x, torch::zeros({3})), "timesteps"));
  EXPECT_TRUE(contains(predict_error(x, t, torch::zeros({1, 4, 8})), "no text conditioning"));
  // Other dtypes and strides are converted, not refused.
  torch::Tensor strided = torch::zeros({1, 16, 16, 3, 16}).transpose(2, 3);
  EXPECT_EQ(model()->predict(strided.to(torch::kDouble), t, {}).sizes(), x.sizes());
}

TEST(SmallDenoiser, ABadConfigNamesTheKey) {
  LATENT_REQUIRE_SMALL_FIXTURES();
  std::string e = config_error([](json::Object& o) {
    member(o, "widths") = json::Array{json::Value::integer(80), json::Value::integer(1000000000)};
  });
  EXPECT_TRUE(contains(e, "\"widths\" = 1000000000 is out of range")) << e;
  e = config_error([](json::Object& o) { erase_key(o, "groups"); });
  EXPECT_TRUE(contains(e, "config has no \"groups\"")) << e;
  e = config_error([](json::Object& o) { member(o, "blocks_per_level") = json::Value::integer(-2); });
  EXPECT_TRUE(contains(e, "\"blocks_per_level\" = -2 is out of range")) << e;
  e = config_error([](json::Object& o) { member(o, "temporal_kernel") = json::Value(json::Number{"2.5"}); });
  EXPECT_TRUE(contains(e, "\"temporal_kernel\" = 2.5 is not an integer")) << e;
  e = config_error([](json::Object& o) { member(o, "embed_dim") = json::Value("256"); });
  EXPECT_TRUE(contains(e, "\"embed_dim\" is a JSON string")) << e;
  e = config_error([](json::Object& o) { member(o, "widths") = json::Array{}; });
  EXPECT_TRUE(contains(e, "\"widths\" is not a list of 1 to 4 integers")) << e;
  e = config_error([](json::Object& o) { member(o, "groups") = json::Value::integer(7); });
  EXPECT_TRUE(contains(e, "\"widths\" entry 80 is not a multiple of groups = 7")) << e;
  e = config_error([](json::Object& o) { o.emplace_back("attention", json::Value(true)); });
  EXPECT_TRUE(contains(e, "unknown key \"attention\"")) << e;

  WeightSource src = source("model");
  src.metadata["config"] = "{\"in_channels\": 16,";
  EXPECT_TRUE(contains(load_error(src), "config is not valid JSON")) << load_error(src);
  src.metadata.erase("config");
  src.config.reset();
  EXPECT_TRUE(contains(load_error(src), "lack their config")) << load_error(src);
}

TEST(SmallDenoiser, ABadContractNamesTheMetadataKey) {
  LATENT_REQUIRE_SMALL_FIXTURES();
  const auto error_with = [](const std::string& key, const char* value) {
    WeightSource src = source("model");
    if (value)
      src.metadata[key] = value;
    else
      src.metadata.erase(key);
    return load_error(src);
  };
  EXPECT_TRUE(contains(error_with("window", nullptr), "__metadata__ \"window\"")) << error_with("window", nullptr);
  EXPECT_TRUE(contains(error_with("window", "1000000000000"), "\"window\": \"1000000000000\" is not an integer"));
  EXPECT_TRUE(contains(error_with("steps", "0"), "\"steps\""));
  EXPECT_TRUE(contains(error_with("shift", "nan"), "\"shift\""));
  EXPECT_TRUE(contains(error_with("prediction", "x0"), "\"prediction\""));
  EXPECT_TRUE(contains(error_with("sampler", "heun"), "\"sampler\""));
  // DDIM cannot run flow predictions: refused at load, not at the first step.
  EXPECT_TRUE(contains(error_with("sampler", "ddim"), "\"sampler\"")) << error_with("sampler", "ddim");
  EXPECT_TRUE(contains(error_with("latent_space", ""), "\"latent_space\""));
}

TEST(SmallDenoiser, ReadsTheVaeGeometryAndNativeSize) {
  LATENT_REQUIRE_SMALL_FIXTURES();
  EXPECT_EQ(model()->spec().temporal_factor, 4);  // unset: every supported family's
  EXPECT_EQ(model()->spec().spatial_factor, 8);
  EXPECT_EQ(model()->spec().native_height, 0);
  WeightSource src = source("model");
  src.metadata["temporal_factor"] = "2";
  src.metadata["spatial_factor"] = "16";
  src.metadata["native_height"] = "12";
  src.metadata["native_width"] = "20";
  const DenoiserSpec s = make_small_denoiser(src, {})->spec();
  EXPECT_EQ(s.temporal_factor, 2);
  EXPECT_EQ(s.spatial_factor, 16);
  EXPECT_EQ(s.native_height, 12);
  EXPECT_EQ(s.native_width, 20);
  src.metadata["spatial_factor"] = "0";
  EXPECT_TRUE(contains(load_error(src), "\"spatial_factor\" = \"0\" is not an integer in [1, 64]")) << load_error(src);
  src.metadata["spatial_factor"] = "8";
  src.metadata.erase("native_width");
  EXPECT_TRUE(contains(load_error(src), "without the other")) << load_error(src);
}

TEST(SmallDenoiser, ListsEveryMissingMisshapedAndUnusedTensor) {
  LATENT_REQUIRE_SMALL_FIXTURES();
  WeightSource src = source("model");
  src.tensors.erase("down.0.blocks.1.conv1.weight");
  src.tensors.erase("up.0.blocks.0.tconv.bias");
  src.tensors["down.1.blocks.0.film.weight"] = torch::zeros({320, 255});
  src.tensors["down.0.blocks.0.attn.weight"] = torch::zeros({4});
  const std::string e = load_error(src);
  EXPECT_TRUE(contains(e, "down.0.blocks.1.conv1.weight")) << e;
  EXPECT_TRUE(contains(e, "up.0.blocks.0.tconv.bias")) << e;
  EXPECT_TRUE(contains(e, "down.1.blocks.0.film.weight")) << e;
  EXPECT_TRUE(contains(e, "down.0.blocks.0.attn.weight")) << e;
}
