// The native Wan 2.1 transformer (core/src/gen/models/wan_transformer.cpp) against diffusers' WanTransformer3DModel on a
// tiny random-weight pipeline folder (tests/fixtures/gen_wan_transformer_fixtures.py), its folder layouts, and the
// errors a damaged folder gives.
#include <gtest/gtest.h>
#include <torch/types.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>

#include "gen/models/backends.h"
#include "io/json.h"
#include "latent/gen/denoiser.h"
#include "latent/gen/generator.h"
#include "latent/io/safetensors.h"
#include "latent/io/weights.h"

using namespace latent;
namespace fs = std::filesystem;

namespace {

fs::path fixtures() {
  const char* d = std::getenv("LATENT_WAN_TRANSFORMER_FIXTURES");
  return d ? fs::path(d) : fs::path();
}

#define LATENT_REQUIRE_WAN_FIXTURES()                                                                      \
  do {                                                                                                     \
    if (fixtures().empty() || !fs::exists(fixtures() / "stamp"))                                           \
      GTEST_SKIP() << "no Wan transformer fixtures (LATENT_WAN_TRANSFORMER_FIXTURES unset: build without " \
                      "the .venv)";                                                                        \
  } while (0)

// The C++ side runs the same LibTorch kernels as diffusers for every op (linear, layer and RMS norm, SDPA, GELU),
// so most of the difference is where the order of operations differs: the time embedding and the modulation are
// computed once per frame here and once per token there (GEMMs of other heights may block differently), and the
// RoPE rotation is assembled by a stack instead of strided writes. Each of those moves a float32 result by an ulp
// or so; through 2 blocks of random weights the outputs (magnitude ~1-10) stay within a few 1e-7 relative. 1e-5
// relative to the output's largest value (the issue's bound) leaves a margin of 10 and more for other CPUs'
// kernels, while a single weight read into the wrong place or a RoPE axis swapped moves the output by 1e-2 or more.
constexpr double kRelTolerance = 1e-5;

const WeightSource& cases() {
  static const WeightSource c = read_weights(fixtures() / "cases.safetensors");
  return c;
}

torch::Tensor tensor(const std::string& name) {
  auto it = cases().tensors.find(name);
  if (it == cases().tensors.end()) throw std::runtime_error("fixture tensor " + name + " missing");
  return it->second;
}

std::vector<std::string> case_names() {
  std::vector<std::string> names;
  const json::Value listing = json::parse(cases().metadata.at("cases"));
  for (const auto& c : listing.as_array()) names.push_back(c.find("name")->as_string());
  return names;
}

std::shared_ptr<Denoiser> model(const std::string& folder = "pipeline") {
  static std::map<std::string, std::shared_ptr<Denoiser>> cache;
  auto& m = cache[folder];
  if (!m) m = load_denoiser(fixtures() / folder);
  return m;
}

double rel_error(const torch::Tensor& got, const torch::Tensor& want) {
  const auto g = got.to(torch::kDouble), w = want.to(torch::kDouble);
  return (g - w).abs().max().item<double>() / w.abs().max().item<double>();
}

torch::Tensor predict(const Denoiser& m, const std::string& c) {
  return m.predict(tensor(c + ".x"), tensor(c + ".timesteps"), tensor(c + ".text"));
}

TEST(WanTransformer, MatchesDiffusersFp32) {
  LATENT_REQUIRE_WAN_FIXTURES();
  const auto names = case_names();
  ASSERT_EQ(names.size(), 4u);
  for (const auto& c : names) {
    const torch::Tensor want = tensor(c + ".out");
    const torch::Tensor got = predict(*model(), c);
    ASSERT_EQ(got.sizes(), want.sizes()) << c;
    const double err = rel_error(got, want);
    RecordProperty(c + ".rel_error", std::to_string(err));
    std::printf("%s: max |out| %.3g, max abs error relative to it %.3g\n", c.c_str(), want.abs().max().item<double>(),
                err);
    EXPECT_LE(err, kRelTolerance) << c;
  }
}

// bfloat16 compute with the modulation, norms and time embedder in float32, as diffusers keeps them: bf16's 8-bit
// mantissa (3e-3 relative per rounding) through 2 blocks leaves ~1e-2 of the output scale; a wrong dtype path (the
// modulation rounded to bf16, say) or a broken kernel shows as far more.
TEST(WanTransformer, Bfloat16CloseToFp32) {
  LATENT_REQUIRE_WAN_FIXTURES();
  const auto bf16 = load_denoiser(fixtures() / "pipeline", {torch::kCPU, torch::kBFloat16});
  for (const auto& c : case_names()) {
    const double err = rel_error(predict(*bf16, c), tensor(c + ".out"));
    std::printf("%s bf16: max abs error relative to fp32 diffusers %.3g\n", c.c_str(), err);
    EXPECT_LE(err, 5e-2) << c;
  }
}

// End to end against diffusers' WanPipeline (output_type="latent", latents= the noise the generator draws from the
// same seed): the folder's UniPC, 3 steps, with guidance 5 (the folder's default) and without. Each model call
// differs by a few 1e-7 of its scale (above); guidance multiplies the difference of two calls by 5 and the sampler
// carries it through 3 steps, which stays well under the issue's 1e-4 relative.
TEST(WanTransformer, ClipEqualsDiffusersWanPipeline) {
  LATENT_REQUIRE_WAN_FIXTURES();
  for (int guidance : {5, 1}) {
    GeneratorOptions o;
    o.schedule = ScheduleKind::clip;
    o.sampler = model()->spec().sampler;
    o.sampler.steps = 3;
    o.frames = 5;
    o.height = 8;
    o.width = 12;
    o.seed = 7;
    o.guidance = guidance;
    o.text = tensor("pipe.text");
    o.negative_text = tensor("pipe.negative_text");
    Generator g(model(), o);
    std::vector<torch::Tensor> latents;
    while (!g.finished())
      for (auto& f : g.next()) latents.push_back(f.latent);
    const torch::Tensor want = tensor("pipe.g" + std::to_string(guidance) + ".latents");
    const double err = rel_error(torch::cat(latents, 2), want);
    std::printf("clip, unipc, 3 steps, guidance %d: max |C++ - WanPipeline| / max |WanPipeline| = %.3g\n", guidance,
                err);
    EXPECT_LE(err, 1e-4) << "guidance " << guidance;
  }
}

// The per-frame timesteps reach each frame's own tokens: a frame's output changes when only another frame's
// timestep changes (self-attention mixes frames) but the changed frame moves the most.
TEST(WanTransformer, TimestepsArePerFrame) {
  LATENT_REQUIRE_WAN_FIXTURES();
  const auto& m = *model();
  const torch::Tensor x = tensor("t5_8x12.x"), text = tensor("t5_8x12.text");
  torch::Tensor ts = tensor("t5_8x12.timesteps").clone();
  const torch::Tensor a = m.predict(x, ts, text);
  ts[0][2] = ts[0][2].item<float>() * 0.5f + 1.0f;
  const torch::Tensor b = m.predict(x, ts, text);
  const torch::Tensor per_frame = (a - b).abs().amax({0, 1, 3, 4});
  EXPECT_EQ(per_frame.argmax().item<int64_t>(), 2);
}

// The prompt cache is keyed by the embeddings tensor and its version counter, so the generator's calls (the same
// tensor every time) find it without reading the values, which on a GPU would wait for the device at every call.
// A write the version counter does not see (through a raw pointer) shows that no value is read; an in-place
// operation is seen, and other tensors give their own values' prediction.
TEST(WanTransformer, PromptCacheHitsByTensorWithoutReadingIt) {
  LATENT_REQUIRE_WAN_FIXTURES();
  const auto m = load_denoiser(fixtures() / "pipeline");  // a cache of its own
  const torch::Tensor x = tensor("t5_8x12.x"), ts = tensor("t5_8x12.timesteps");
  torch::Tensor text = tensor("t5_8x12.text").clone();
  const torch::Tensor original = text.clone(), other = text * 0.5f - 0.25f;
  const torch::Tensor first = m->predict(x, ts, text);
  const torch::Tensor with_other = m->predict(x, ts, other.clone());
  ASSERT_FALSE(torch::allclose(first, with_other));

  std::memcpy(text.data_ptr<float>(), other.data_ptr<float>(), size_t(text.numel()) * sizeof(float));
  EXPECT_TRUE(torch::equal(m->predict(x, ts, text), first)) << "the lookup read the values";

  text.copy_(other);  // the same values, now through the version counter
  EXPECT_TRUE(torch::equal(m->predict(x, ts, text), with_other)) << "an in-place change was not seen";
  text.copy_(original);
  EXPECT_TRUE(torch::equal(m->predict(x, ts, text), first));
  EXPECT_TRUE(torch::equal(m->predict(x, ts, other.clone()), with_other));
}

TEST(WanTransformer, ShardedEqualsSingleAndTransformerFolder) {
  LATENT_REQUIRE_WAN_FIXTURES();
  const auto sharded = load_denoiser(fixtures() / "pipeline-sharded");
  const auto direct = load_denoiser(fixtures() / "pipeline" / "transformer");
  for (const auto& c : case_names()) {
    const torch::Tensor want = predict(*model(), c);
    EXPECT_TRUE(torch::equal(predict(*sharded, c), want)) << c;
    EXPECT_TRUE(torch::equal(predict(*direct, c), want)) << c;
  }
}

TEST(WanTransformer, Spec) {
  LATENT_REQUIRE_WAN_FIXTURES();
  const DenoiserSpec& s = model()->spec();
  EXPECT_EQ(s.backend, "wan2.1");
  EXPECT_EQ(s.prediction, Prediction::flow);
  EXPECT_EQ(s.latent_space, "wan2.1");
  EXPECT_EQ(s.channels, 16);
  EXPECT_EQ(s.min_frames, 1);
  EXPECT_EQ(s.window, 1024);
  // A run without a window is WanPipeline's clip: 81 frames, not the 4,093 the positions allow.
  EXPECT_EQ(s.native_frames, 21);
  EXPECT_EQ(default_window(s), 21);
  EXPECT_EQ(s.height, 0);
  EXPECT_EQ(s.size_multiple, 2);
  EXPECT_EQ(s.text_tokens, 512);
  EXPECT_EQ(s.text_dim, 24);
  EXPECT_EQ(s.guidance, 5.0);
  EXPECT_EQ(s.native_height, 60);
  EXPECT_EQ(s.native_width, 104);
  // From scheduler/scheduler_config.json.
  EXPECT_EQ(s.sampler.kind, SamplerKind::unipc);
  EXPECT_EQ(s.sampler.shift, 3.0);
  EXPECT_EQ(s.sampler.steps, 50);
  EXPECT_EQ(s.sampler.train_timesteps, 1000);
  // A transformer folder reads the scheduler beside it.
  EXPECT_EQ(model("pipeline/transformer")->spec().sampler.shift, 3.0);
}

TEST(WanTransformer, RejectsOddSizes) {
  LATENT_REQUIRE_WAN_FIXTURES();
  const torch::Tensor x = torch::zeros({1, 16, 1, 7, 12});
  EXPECT_THROW(model()->predict(x, torch::zeros({1, 1}), tensor("t1_8x12.text")), std::invalid_argument);
}

void set(json::Object& o, const std::string& key, json::Value value) {
  for (auto& [k, v] : o)
    if (k == key) {
      v = std::move(value);
      return;
    }
  o.emplace_back(key, std::move(value));
}

// A writable copy of the fixture pipeline, removed afterwards.
class WanFolder : public ::testing::Test {
 protected:
  void SetUp() override {
    if (fixtures().empty() || !fs::exists(fixtures() / "stamp")) GTEST_SKIP() << "no Wan transformer fixtures";
    dir_ = fs::temp_directory_path() / ("latent-wan-" + std::to_string(::getpid()) + "-" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    fs::copy(fixtures() / "pipeline", dir_ / "pipeline", fs::copy_options::recursive);
    fs::copy(fixtures() / "pipeline-sharded", dir_ / "sharded", fs::copy_options::recursive);
  }
  void TearDown() override {
    if (!dir_.empty()) fs::remove_all(dir_);
  }

  fs::path weights() const { return dir_ / "pipeline" / "transformer" / "diffusion_pytorch_model.safetensors"; }

  // Rewrites the single-file weights through `edit` (name -> tensor; erase to drop one).
  void rewrite(const std::function<void(std::map<std::string, torch::Tensor>&)>& edit) {
    std::map<std::string, torch::Tensor> t;
    {
      auto st = SafetensorsFile::open(weights());
      for (const auto& n : st.names()) t[n] = st.tensor(n).clone();
    }
    edit(t);
    SafetensorsWriter w(weights(), {.durable = false});
    for (const auto& [n, v] : t) w.write(n, v);
    w.commit();
  }

  void edit_config(const std::function<void(json::Object&)>& edit) {
    const fs::path p = dir_ / "pipeline" / "transformer" / "config.json";
    std::ifstream in(p);
    std::string text((std::istreambuf_iterator<char>(in)), {});
    json::Value v = json::parse(text);
    edit(v.as_object());
    std::ofstream(p) << json::dump(v);
  }

  std::string error(const fs::path& p) {
    try {
      load_denoiser(p);
    } catch (const ModelError& e) {
      return e.what();
    } catch (const SafetensorsError& e) {
      return e.what();
    }
    return "(loaded)";
  }

  fs::path dir_;
};

TEST_F(WanFolder, MissingKeyNamesFileAndKey) {
  rewrite([](auto& t) { t.erase("blocks.1.attn2.norm_k.weight"); });
  const std::string e = error(dir_ / "pipeline");
  EXPECT_NE(e.find(weights().string()), std::string::npos) << e;
  EXPECT_NE(e.find("missing"), std::string::npos) << e;
  EXPECT_NE(e.find("blocks.1.attn2.norm_k.weight"), std::string::npos) << e;
}

TEST_F(WanFolder, WrongShapeAndExtraKeyNamed) {
  rewrite([](auto& t) {
    t["blocks.0.scale_shift_table"] = torch::zeros({1, 5, 32});
    t["blocks.0.attn1.norm_added_q.weight"] = torch::zeros({32});
  });
  const std::string e = error(dir_ / "pipeline");
  EXPECT_NE(e.find("blocks.0.scale_shift_table is [1, 5, 32], expected [1, 6, 32]"), std::string::npos) << e;
  EXPECT_NE(e.find("unexpected"), std::string::npos) << e;
  EXPECT_NE(e.find("blocks.0.attn1.norm_added_q.weight"), std::string::npos) << e;
}

TEST_F(WanFolder, MissingShardNamed) {
  const fs::path shard = dir_ / "sharded" / "transformer" / "diffusion_pytorch_model-00002-of-00005.safetensors";
  ASSERT_TRUE(fs::exists(shard));
  fs::remove(shard);
  const std::string e = error(dir_ / "sharded");
  EXPECT_NE(e.find("diffusion_pytorch_model-00002-of-00005.safetensors is missing"), std::string::npos) << e;
}

TEST_F(WanFolder, ConfigErrorsNameTheKey) {
  edit_config([](json::Object& o) { set(o, "image_dim", json::Value::integer(1280)); });
  std::string e = error(dir_ / "pipeline");
  EXPECT_NE(e.find("\"image_dim\" is set: image conditioning"), std::string::npos) << e;

  fs::copy_file(fixtures() / "pipeline" / "transformer" / "config.json",
                dir_ / "pipeline" / "transformer" / "config.json", fs::copy_options::overwrite_existing);
  edit_config([](json::Object& o) { o.emplace_back("sliding_window", json::Value::integer(3)); });
  e = error(dir_ / "pipeline");
  EXPECT_NE(e.find("unknown config keys \"sliding_window\""), std::string::npos) << e;

  edit_config([](json::Object& o) { set(o, "_class_name", json::Value("MochiTransformer3DModel")); });
  e = error(dir_ / "pipeline");
  EXPECT_NE(e.find("\"MochiTransformer3DModel\" is not supported natively"), std::string::npos) << e;
}

TEST_F(WanFolder, SchedulerConfigRead) {
  const fs::path p = dir_ / "pipeline" / "scheduler" / "scheduler_config.json";
  // None: what Wan2.1-T2V-1.3B-Diffusers' scheduler config says.
  fs::remove(p);
  const SamplerOptions defaults = load_denoiser(dir_ / "pipeline")->spec().sampler;
  EXPECT_EQ(defaults.kind, SamplerKind::unipc);
  EXPECT_EQ(defaults.shift, 3.0);
  EXPECT_EQ(defaults.steps, 50);
  std::ofstream(p) << R"({"_class_name": "FlowMatchEulerDiscreteScheduler", "shift": 7.0})";
  EXPECT_EQ(load_denoiser(dir_ / "pipeline")->spec().sampler.kind, SamplerKind::euler);
  EXPECT_EQ(load_denoiser(dir_ / "pipeline")->spec().sampler.shift, 7.0);
  std::ofstream(p) << R"({"_class_name": "UniPCMultistepScheduler", "prediction_type": "epsilon"})";
  const std::string e = error(dir_ / "pipeline");
  EXPECT_NE(e.find("\"prediction_type\" = \"epsilon\""), std::string::npos) << e;
}

}  // namespace
