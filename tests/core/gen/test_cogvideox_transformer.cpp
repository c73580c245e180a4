// The native CogVideoX transformer (core/src/gen/models/cogvideox_transformer.cpp) against diffusers'
// CogVideoXTransformer3DModel and CogVideoXPipeline on tiny random-weight pipeline folders
// (tests/fixtures/gen_cogvideox_transformer_fixtures.py), its folder layouts, and the errors bad input gives.
#include <gtest/gtest.h>
#include <torch/types.h>
#include <unistd.h>

#include <cstdlib>
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
  const char* d = std::getenv("LATENT_COGVIDEOX_TRANSFORMER_FIXTURES");
  return d ? fs::path(d) : fs::path();
}

bool have_fixtures() { return !fixtures().empty() && fs::exists(fixtures() / "stamp"); }

#define LATENT_REQUIRE_COGVIDEOX_FIXTURES()                                                              \
  do {                                                                                                   \
    if (!have_fixtures())                                                                                \
      GTEST_SKIP() << "no CogVideoX transformer fixtures (LATENT_COGVIDEOX_TRANSFORMER_FIXTURES unset: " \
                      "build without the .venv)";                                                        \
  } while (0)

// Every op is the LibTorch kernel diffusers calls (conv2d, linear, layer norm, SDPA, GELU, the sinusoids) in the
// same order, so what differs is where the data sits: the weights are views into the mapped file, at whatever
// alignment its offsets give (diffusers' tensors are freshly allocated), and the pipeline stacks its unconditional
// and conditional inputs in one batch where the model runs a batch of one. The kernels' vector loops may then
// split their sums differently, which moves a float32 result by an ulp or so; through 2 blocks of random weights
// the outputs (magnitude ~1-10) stay within a few 1e-7 relative (0 for the sharded copy, see below).
// 1e-5 relative to the output's largest value leaves a margin of 10 and more for other CPUs' kernels, while a
// weight read into the wrong place, a position table transposed or a crop rounded the other way moves the output
// by 1e-3 or more.
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

// "<variant>.<name>" of every case.
std::vector<std::string> case_keys() {
  std::vector<std::string> keys;
  const json::Value listing = json::parse(cases().metadata.at("cases"));
  for (const auto& c : listing.as_array())
    keys.push_back(c.find("variant")->as_string() + "." + c.find("name")->as_string());
  return keys;
}

std::shared_ptr<Denoiser> model(const std::string& folder) {
  static std::map<std::string, std::shared_ptr<Denoiser>> cache;
  auto& m = cache[folder];
  if (!m) m = load_denoiser(fixtures() / folder);
  return m;
}

double rel_error(const torch::Tensor& got, const torch::Tensor& want) {
  const auto g = got.to(torch::kDouble), w = want.to(torch::kDouble);
  return (g - w).abs().max().item<double>() / w.abs().max().item<double>();
}

std::string variant_of(const std::string& key) { return key.substr(0, key.find('.')); }

torch::Tensor predict(const Denoiser& m, const std::string& key) {
  return m.predict(tensor(key + ".x"), tensor(key + ".timesteps"), tensor(key + ".text"));
}

TEST(CogVideoXTransformer, MatchesDiffusersFp32) {
  LATENT_REQUIRE_COGVIDEOX_FIXTURES();
  const auto keys = case_keys();
  ASSERT_EQ(keys.size(), 10u);
  for (const auto& key : keys) {
    const torch::Tensor want = tensor(key + ".out");
    const torch::Tensor got = predict(*model(variant_of(key)), key);
    ASSERT_EQ(got.sizes(), want.sizes()) << key;
    const double err = rel_error(got, want);
    std::printf("%s: max |out| %.3g, max abs error relative to it %.3g\n", key.c_str(), want.abs().max().item<double>(),
                err);
    EXPECT_LE(err, kRelTolerance) << key;
  }
}

// Every module in the compute dtype, as diffusers runs CogVideoX in half precision: bf16's 8-bit mantissa (3e-3
// relative per rounding) through 2 blocks leaves ~1e-2 of the output scale, fp16's 11 bits less; a broken dtype
// path shows as far more.
// The position tables (2B-like sin-cos positions, 5B-like RoPE) depend on the latent size alone: made once per size
// and kept on the model's device, the same tensors at every call of that size, other ones for another size. The
// outputs stay diffusers' (MatchesDiffusersFp32 runs the kept tables at every size of its cases).
TEST(CogVideoXTransformer, PositionTablesAreMadeOncePerSize) {
  LATENT_REQUIRE_COGVIDEOX_FIXTURES();
  for (const std::string variant : {"sincos", "rope"}) {
    const auto m = load_denoiser(fixtures() / variant);  // a cache of its own
    const torch::Tensor text = tensor(variant + ".t2_4x8.text");
    const auto call = [&](int64_t frames, int64_t height, int64_t width) {
      const torch::Tensor x = torch::randn({1, 16, frames, height, width});
      return m->predict(x, torch::full({1, frames}, 500.0f), text);
    };
    // 2 frames of 4x6 and 1 of 6x4: neither is the configured size, whose sin-cos table is built at load.
    EXPECT_TRUE(cogvideox_cached_tables(*m, 2, 4, 6).empty()) << variant;
    call(2, 4, 6);
    const std::vector<torch::Tensor> kept = cogvideox_cached_tables(*m, 2, 4, 6);
    ASSERT_EQ(kept.size(), variant == "rope" ? 2u : 1u) << variant;
    EXPECT_EQ(kept[0].size(0), 2 * 2 * 3) << variant;  // a row per video token
    EXPECT_EQ(kept[0].device(), m->device());
    call(2, 4, 6);
    const std::vector<torch::Tensor> again = cogvideox_cached_tables(*m, 2, 4, 6);
    ASSERT_EQ(again.size(), kept.size());
    for (size_t i = 0; i < kept.size(); ++i) EXPECT_TRUE(again[i].is_same(kept[i])) << variant << " table " << i;
    call(1, 6, 4);
    const std::vector<torch::Tensor> other = cogvideox_cached_tables(*m, 1, 6, 4);
    ASSERT_EQ(other.size(), kept.size()) << variant;
    EXPECT_FALSE(other[0].is_same(kept[0])) << variant;
    EXPECT_EQ(other[0].size(0), 1 * 3 * 2) << variant;
    EXPECT_TRUE(cogvideox_cached_tables(*m, 2, 4, 6)[0].is_same(kept[0])) << variant << ": the first size was dropped";
  }
}

TEST(CogVideoXTransformer, HalfPrecisionCloseToFp32) {
  LATENT_REQUIRE_COGVIDEOX_FIXTURES();
  for (const auto dtype : {torch::kBFloat16, torch::kHalf}) {
    std::map<std::string, std::shared_ptr<Denoiser>> half;
    for (const char* v : {"sincos", "rope"}) half[v] = load_denoiser(fixtures() / v, {torch::kCPU, dtype});
    for (const auto& key : case_keys()) {
      const double err = rel_error(predict(*half[variant_of(key)], key), tensor(key + ".out"));
      std::printf("%s %s: max abs error relative to fp32 diffusers %.3g\n", key.c_str(), c10::toString(dtype), err);
      EXPECT_LE(err, 5e-2) << key << " " << c10::toString(dtype);
    }
  }
}

// End to end against diffusers' CogVideoXPipeline (output_type="latent", latents= the fixture's noise given as
// initial_noise): the folder's DDIM, 3 steps, with guidance 6 (the pipeline's default) and without. Each model call
// differs by a few 1e-7 of its scale (above); guidance multiplies the difference of two calls by 6 and the v to x0
// conversion and 3 steps carry it on, which stays well under 1e-4 relative.
TEST(CogVideoXTransformer, ClipEqualsDiffusersPipeline) {
  LATENT_REQUIRE_COGVIDEOX_FIXTURES();
  for (const char* variant : {"sincos", "rope"}) {
    const std::string pipe = std::string("pipe.") + variant;
    for (int guidance : {6, 1}) {
      GeneratorOptions o;
      o.schedule = ScheduleKind::clip;
      o.sampler = model(variant)->spec().sampler;
      o.sampler.steps = 3;
      o.frames = 3;
      o.height = 6;
      o.width = 8;
      o.guidance = guidance;
      o.text = tensor(pipe + ".text");
      o.negative_text = tensor(pipe + ".negative_text");
      o.initial_noise = tensor(pipe + ".noise").permute({0, 2, 1, 3, 4});
      Generator g(model(variant), o);
      std::vector<torch::Tensor> latents;
      while (!g.finished())
        for (auto& f : g.next()) latents.push_back(f.latent);
      const torch::Tensor want = tensor(pipe + ".g" + std::to_string(guidance) + ".latents").permute({0, 2, 1, 3, 4});
      const double err = rel_error(torch::cat(latents, 2), want);
      std::printf("%s: clip, ddim, 3 steps, guidance %d: max |C++ - CogVideoXPipeline| / max |pipeline| = %.3g\n",
                  variant, guidance, err);
      EXPECT_LE(err, 1e-4) << variant << " guidance " << guidance;
      // The same noise gives the same frames again.
      g.reset();
      std::vector<torch::Tensor> again;
      while (!g.finished())
        for (auto& f : g.next()) again.push_back(f.latent);
      EXPECT_TRUE(torch::equal(torch::cat(again, 2), torch::cat(latents, 2)));
    }
  }
}

// A seed instead of latents=: CogVideoXPipeline(generator=torch.Generator().manual_seed(seed)) draws its starting
// noise for [1, T, C, h, w] latents and, with CogVideoXDPMScheduler, one or two more such tensors per step, from
// that CPU generator. The Generator draws every tensor in that layout from its seeded CPU stream, so the same seed
// gives the same noise; what is left is each model call's few 1e-7 (above), carried through guidance and the
// steps as in ClipEqualsDiffusersPipeline. DPM's extra noise enters linearly and is the same on both sides, so the
// bound is the same. A wrong layout or a draw too many or too few changes the result by its own scale.
TEST(CogVideoXTransformer, ClipFromSeedEqualsDiffusersPipeline) {
  LATENT_REQUIRE_COGVIDEOX_FIXTURES();
  const uint64_t seed = std::stoull(cases().metadata.at("pipe_seed"));
  const json::Value runs = json::parse(cases().metadata.at("seeded"));
  ASSERT_EQ(runs.as_array().size(), 7u);
  for (const auto& run : runs.as_array()) {
    const std::string folder = run.find("folder")->as_string(), variant = run.find("variant")->as_string();
    const int64_t steps = run.find("steps")->as_int64(), guidance = run.find("guidance")->as_int64();
    const std::string pipe = "pipe." + variant;
    GeneratorOptions o;
    o.schedule = ScheduleKind::clip;
    o.sampler = model(folder)->spec().sampler;
    o.sampler.steps = steps;
    o.frames = 3;
    o.height = 6;
    o.width = 8;
    o.guidance = static_cast<double>(guidance);
    o.text = tensor(pipe + ".text");
    o.negative_text = tensor(pipe + ".negative_text");
    o.seed = seed;
    Generator g(model(folder), o);
    const auto all_frames = [&] {
      std::vector<torch::Tensor> latents;
      while (!g.finished())
        for (auto& f : g.next()) latents.push_back(f.latent);
      return torch::cat(latents, 2);
    };
    const torch::Tensor got = all_frames();
    const std::string key = "seeded." + folder + ".n" + std::to_string(steps) + ".g" + std::to_string(guidance);
    const torch::Tensor want = tensor(key + ".latents").permute({0, 2, 1, 3, 4});
    const double err = rel_error(got, want);
    std::printf(
        "%s: clip, %s, %lld steps, guidance %lld, seed %llu: max |C++ - CogVideoXPipeline| / max |pipeline| "
        "= %.3g\n",
        folder.c_str(), sampler_kind_name(o.sampler.kind), static_cast<long long>(steps),
        static_cast<long long>(guidance), static_cast<unsigned long long>(seed), err);
    EXPECT_LE(err, 1e-4) << key;
    g.reset();
    EXPECT_TRUE(torch::equal(all_frames(), got)) << key << ": the seed again";
    g.reset(seed + 1);
    EXPECT_GT(rel_error(all_frames(), want), 1e-2) << key << ": another seed";
  }
  EXPECT_EQ(model("rope-dpm")->spec().sampler.kind, SamplerKind::dpm);
}

// The same weights from shards, and from the transformer folder alone. Shards put the tensors at other offsets of
// their mapped files, and the CPU kernels' vector loops round differently on data of another alignment: here the
// sharded copy gives diffusers' output bit for bit and the single file a few 1e-7 from it. 1e-6 tells that apart
// from a tensor read from the wrong shard.
TEST(CogVideoXTransformer, ShardedEqualsSingleAndTransformerFolder) {
  LATENT_REQUIRE_COGVIDEOX_FIXTURES();
  const auto sharded = load_denoiser(fixtures() / "sincos-sharded");
  const auto direct = load_denoiser(fixtures() / "sincos" / "transformer");
  for (const auto& key : case_keys()) {
    if (variant_of(key) != "sincos") continue;
    const torch::Tensor want = predict(*model("sincos"), key);
    EXPECT_LE(rel_error(predict(*sharded, key), want), 1e-6) << key;
    EXPECT_TRUE(torch::equal(predict(*direct, key), want)) << key;
  }
}

TEST(CogVideoXTransformer, Spec) {
  LATENT_REQUIRE_COGVIDEOX_FIXTURES();
  for (const char* v : {"sincos", "rope"}) {
    const DenoiserSpec& s = model(v)->spec();
    EXPECT_EQ(s.backend, "cogvideox");
    EXPECT_EQ(s.prediction, Prediction::v);
    EXPECT_EQ(s.latent_space, "cogvideox");
    EXPECT_EQ(s.channels, 16);
    EXPECT_EQ(s.min_frames, 1);
    EXPECT_EQ(s.window, 3);  // sample_frames 9
    EXPECT_EQ(s.height, 0);
    EXPECT_EQ(s.size_multiple, 2);
    EXPECT_EQ(s.text_tokens, 16);
    EXPECT_EQ(s.text_dim, 20);
    EXPECT_EQ(s.guidance, 6.0);
    EXPECT_EQ(s.native_height, 6);
    EXPECT_EQ(s.native_width, 8);
    EXPECT_EQ(s.temporal_factor, 4);
    EXPECT_FALSE(s.per_frame_timesteps);
    EXPECT_TRUE(s.noise_frames_first);
    EXPECT_EQ(s.sampler.kind, SamplerKind::ddim);
    EXPECT_EQ(s.sampler.steps, 50);
    EXPECT_EQ(s.sampler.train_timesteps, 1000);
  }
  EXPECT_EQ(model("sincos")->spec().sampler.snr_shift_scale, 3.0);
  EXPECT_EQ(model("rope")->spec().sampler.snr_shift_scale, 1.0);
  const SamplerOptions dpm = model("rope-dpm")->spec().sampler;
  EXPECT_EQ(dpm.kind, SamplerKind::dpm);
  EXPECT_EQ(dpm.snr_shift_scale, 1.0);
  EXPECT_EQ(dpm.steps, 50);
}

TEST(CogVideoXTransformer, RejectsBadInput) {
  LATENT_REQUIRE_COGVIDEOX_FIXTURES();
  const auto& m = *model("sincos");
  const torch::Tensor text = tensor("sincos.t3_6x8.text");
  // Not a multiple of the patch.
  EXPECT_THROW(m.predict(torch::zeros({1, 16, 1, 7, 8}), torch::zeros({1, 1}), text), std::invalid_argument);
  // One timestep per clip.
  try {
    m.predict(torch::zeros({1, 16, 2, 6, 8}), torch::tensor({{500.0f, 400.0f}}), text);
    ADD_FAILURE() << "unequal timesteps accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("one timestep"), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW(m.predict(torch::zeros({1, 16, 2, 6, 8}), torch::tensor({{500.0f, 500.0f}}), text));
}

TEST(CogVideoXTransformer, GeneratorRefusesFifoRollingAndBadNoise) {
  LATENT_REQUIRE_COGVIDEOX_FIXTURES();
  GeneratorOptions o;
  o.sampler = model("rope")->spec().sampler;
  o.sampler.steps = 3;
  o.height = 6;
  o.width = 8;
  o.window = 3;
  o.text = tensor("pipe.rope.text");
  for (auto kind : {ScheduleKind::fifo, ScheduleKind::rolling}) {
    o.schedule = kind;
    try {
      Generator g(model("rope"), o);
      ADD_FAILURE() << schedule_kind_name(kind) << " accepted";
    } catch (const std::invalid_argument& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find(schedule_kind_name(kind)), std::string::npos) << m;
      EXPECT_NE(m.find("one timestep per call"), std::string::npos) << m;
    }
  }
  o.schedule = ScheduleKind::clip;
  o.frames = 3;
  o.initial_noise = torch::zeros({1, 16, 2, 6, 8});
  try {
    Generator g(model("rope"), o);
    ADD_FAILURE() << "wrong initial_noise accepted";
  } catch (const std::invalid_argument& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("[1, 16, 3, 6, 8]"), std::string::npos) << m;
    EXPECT_NE(m.find("[1, 16, 2, 6, 8]"), std::string::npos) << m;
  }
}

void set(json::Object& o, const std::string& key, json::Value value) {
  for (auto& [k, v] : o)
    if (k == key) {
      v = std::move(value);
      return;
    }
  o.emplace_back(key, std::move(value));
}

// A writable copy of the fixture pipelines, removed afterwards.
class CogVideoXFolder : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!have_fixtures()) GTEST_SKIP() << "no CogVideoX transformer fixtures";
    dir_ = fs::temp_directory_path() / ("latent-cogvideox-" + std::to_string(::getpid()) + "-" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    fs::copy(fixtures() / "sincos", dir_ / "pipeline", fs::copy_options::recursive);
    fs::copy(fixtures() / "sincos-sharded", dir_ / "sharded", fs::copy_options::recursive);
  }
  void TearDown() override {
    if (!dir_.empty()) fs::remove_all(dir_);
  }

  void edit_json(const fs::path& p, const std::function<void(json::Object&)>& edit) {
    std::ifstream in(p);
    std::string text((std::istreambuf_iterator<char>(in)), {});
    json::Value v = json::parse(text);
    edit(v.as_object());
    std::ofstream(p) << json::dump(v);
  }
  fs::path config() const { return dir_ / "pipeline" / "transformer" / "config.json"; }
  fs::path scheduler() const { return dir_ / "pipeline" / "scheduler" / "scheduler_config.json"; }

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

TEST_F(CogVideoXFolder, MissingShardNamed) {
  const fs::path shard = dir_ / "sharded" / "transformer" / "diffusion_pytorch_model-00002-of-00006.safetensors";
  ASSERT_TRUE(fs::exists(shard));
  fs::remove(shard);
  const std::string e = error(dir_ / "sharded");
  EXPECT_NE(e.find("diffusion_pytorch_model-00002-of-00006.safetensors is missing"), std::string::npos) << e;
}

TEST_F(CogVideoXFolder, ConfigErrorsNameTheKey) {
  const fs::path original = fixtures() / "sincos" / "transformer" / "config.json";
  edit_json(config(), [](json::Object& o) { o.emplace_back("sliding_window", json::Value::integer(3)); });
  std::string e = error(dir_ / "pipeline");
  EXPECT_NE(e.find(config().string()), std::string::npos) << e;
  EXPECT_NE(e.find("unknown config keys \"sliding_window\""), std::string::npos) << e;

  fs::copy_file(original, config(), fs::copy_options::overwrite_existing);
  edit_json(config(), [](json::Object& o) { set(o, "patch_size_t", json::Value::integer(2)); });
  e = error(dir_ / "pipeline");
  EXPECT_NE(e.find("\"patch_size_t\" is set: a temporal patch (CogVideoX 1.5) is not supported"), std::string::npos)
      << e;

  fs::copy_file(original, config(), fs::copy_options::overwrite_existing);
  edit_json(config(), [](json::Object& o) { set(o, "use_learned_positional_embeddings", json::Value(true)); });
  e = error(dir_ / "pipeline");
  EXPECT_NE(e.find("\"use_learned_positional_embeddings\""), std::string::npos) << e;

  fs::copy_file(original, config(), fs::copy_options::overwrite_existing);
  edit_json(config(), [](json::Object& o) { set(o, "_class_name", json::Value("MochiTransformer3DModel")); });
  e = error(dir_ / "pipeline");
  EXPECT_NE(e.find("\"MochiTransformer3DModel\" is not supported natively"), std::string::npos) << e;
  EXPECT_NE(e.find("CogVideoXTransformer3DModel"), std::string::npos) << e;
}

TEST_F(CogVideoXFolder, WeightErrorsNamed) {
  const fs::path weights = dir_ / "pipeline" / "transformer" / "diffusion_pytorch_model.safetensors";
  std::map<std::string, torch::Tensor> t;
  {
    auto st = SafetensorsFile::open(weights);
    for (const auto& n : st.names()) t[n] = st.tensor(n).clone();
  }
  t.erase("transformer_blocks.1.attn1.norm_k.bias");
  SafetensorsWriter w(weights, {.durable = false});
  for (const auto& [n, v] : t) w.write(n, v);
  w.commit();
  const std::string e = error(dir_ / "pipeline");
  EXPECT_NE(e.find("missing"), std::string::npos) << e;
  EXPECT_NE(e.find("transformer_blocks.1.attn1.norm_k.bias"), std::string::npos) << e;
}

TEST_F(CogVideoXFolder, SchedulerConfigRead) {
  edit_json(scheduler(), [](json::Object& o) { set(o, "snr_shift_scale", json::Value::real(2.5)); });
  EXPECT_EQ(load_denoiser(dir_ / "pipeline")->spec().sampler.snr_shift_scale, 2.5);
  // The 5B folders' scheduler: the same schedule, stepped by its DPM-Solver++(2M).
  edit_json(scheduler(), [](json::Object& o) { set(o, "_class_name", json::Value("CogVideoXDPMScheduler")); });
  const SamplerOptions dpm = load_denoiser(dir_ / "pipeline")->spec().sampler;
  EXPECT_EQ(dpm.kind, SamplerKind::dpm);
  EXPECT_EQ(dpm.snr_shift_scale, 2.5);
  edit_json(scheduler(), [](json::Object& o) { set(o, "timestep_spacing", json::Value("leading")); });
  std::string e = error(dir_ / "pipeline");
  EXPECT_NE(e.find("\"timestep_spacing\" = \"leading\""), std::string::npos) << e;
  edit_json(scheduler(), [](json::Object& o) { set(o, "_class_name", json::Value("UniPCMultistepScheduler")); });
  e = error(dir_ / "pipeline");
  EXPECT_NE(e.find("scheduler \"UniPCMultistepScheduler\" is not supported for CogVideoX"), std::string::npos) << e;
  // None: CogVideoX-2b's DDIM.
  fs::remove(scheduler());
  const SamplerOptions s = load_denoiser(dir_ / "pipeline")->spec().sampler;
  EXPECT_EQ(s.kind, SamplerKind::ddim);
  EXPECT_EQ(s.snr_shift_scale, 3.0);
  // A 5B-like transformer alone: the 5B's DPM.
  fs::copy(fixtures() / "rope" / "transformer", dir_ / "rope-transformer", fs::copy_options::recursive);
  const SamplerOptions five_b = load_denoiser(dir_ / "rope-transformer")->spec().sampler;
  EXPECT_EQ(five_b.kind, SamplerKind::dpm);
  EXPECT_EQ(five_b.snr_shift_scale, 1.0);
}

TEST_F(CogVideoXFolder, ImageToVideoPipelineRefused) {
  edit_json(dir_ / "pipeline" / "model_index.json",
            [](json::Object& o) { set(o, "_class_name", json::Value("CogVideoXImageToVideoPipeline")); });
  const std::string e = error(dir_ / "pipeline");
  EXPECT_NE(e.find("\"CogVideoXImageToVideoPipeline\" is not supported"), std::string::npos) << e;
}

}  // namespace
