// A diffusers pipeline folder read whole (core/src/gen/models/diffusers_folder.cpp): model_index.json's pipeline
// class, components and flags, the scheduler config as strictly as the transformer's, the latent space from vae/,
// and the two experts of a Wan 2.2 A14B folder. On the tiny Wan pipeline of
// tests/fixtures/gen_wan_transformer_fixtures.py, edited per test.
#include <gtest/gtest.h>
#include <torch/types.h>
#include <torch/utils.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <map>

#include "io/json.h"
#include "latent/gen/denoiser.h"
#include "latent/io/safetensors.h"
#include "latent/io/weights.h"

using namespace latent;
namespace fs = std::filesystem;

namespace {

fs::path fixtures() {
  const char* d = std::getenv("LATENT_WAN_TRANSFORMER_FIXTURES");
  return d ? fs::path(d) : fs::path();
}

json::Value read(const fs::path& p) {
  std::ifstream in(p);
  return json::parse(std::string((std::istreambuf_iterator<char>(in)), {}));
}

void set(json::Object& o, const std::string& key, json::Value value) {
  for (auto& [k, v] : o)
    if (k == key) {
      v = std::move(value);
      return;
    }
  o.emplace_back(key, std::move(value));
}

json::Value pair(const char* library, const char* cls) { return json::Value(json::Array{library, cls}); }

class PipelineFolder : public ::testing::Test {
 protected:
  void SetUp() override {
    if (fixtures().empty() || !fs::exists(fixtures() / "stamp"))
      GTEST_SKIP() << "no Wan transformer fixtures (LATENT_WAN_TRANSFORMER_FIXTURES unset: build without the .venv)";
    dir_ = fs::temp_directory_path() / ("latent-folder-" + std::to_string(::getpid()) + "-" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    fs::copy(fixtures() / "pipeline", dir_ / "pipeline", fs::copy_options::recursive);
  }
  void TearDown() override {
    if (!dir_.empty()) fs::remove_all(dir_);
  }

  fs::path root() const { return dir_ / "pipeline"; }

  void edit(const fs::path& file, const std::function<void(json::Object&)>& change) {
    json::Value v = fs::exists(file) ? read(file) : json::Value(json::Object{});
    change(v.as_object());
    std::ofstream(file) << json::dump(v);
  }
  void edit_index(const std::function<void(json::Object&)>& change) { edit(root() / "model_index.json", change); }

  std::string error() {
    try {
      load_denoiser(root());
    } catch (const ModelError& e) {
      return e.what();
    }
    return "(loaded)";
  }

  // transformer_2/: the first transformer with one bias moved, so the experts' outputs differ.
  void add_second_expert(double boundary_ratio) {
    fs::copy(root() / "transformer", root() / "transformer_2", fs::copy_options::recursive);
    const fs::path w = root() / "transformer_2" / "diffusion_pytorch_model.safetensors";
    std::map<std::string, torch::Tensor> t;
    {
      auto st = SafetensorsFile::open(w);
      for (const auto& n : st.names()) t[n] = st.tensor(n).clone();
    }
    t["proj_out.bias"] = t["proj_out.bias"] + 0.25;
    SafetensorsWriter out(w, {.durable = false});
    for (const auto& [n, v] : t) out.write(n, v);
    out.commit();
    edit_index([&](json::Object& o) {
      set(o, "transformer_2", pair("diffusers", "WanTransformer3DModel"));
      set(o, "boundary_ratio", json::Value::real(boundary_ratio));
    });
  }

  fs::path dir_;
};

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

TEST_F(PipelineFolder, UnknownFlagsAndComponentsAreRefusedByName) {
  ASSERT_EQ(error(), "(loaded)");
  edit_index([](json::Object& o) { set(o, "foo_flag", true); });
  std::string e = error();
  EXPECT_TRUE(has(e, "\"foo_flag\" is not known for WanPipeline")) << e;
  EXPECT_TRUE(has(e, "model_index.json")) << e;

  fs::copy_file(fixtures() / "pipeline" / "model_index.json", root() / "model_index.json",
                fs::copy_options::overwrite_existing);
  edit_index([](json::Object& o) { set(o, "image_encoder", pair("transformers", "CLIPVisionModel")); });
  e = error();
  EXPECT_TRUE(has(e, "\"image_encoder\" is not known for WanPipeline")) << e;
  edit_index([](json::Object& o) { set(o, "_class_name", "WanImageToVideoPipeline"); });
  e = error();
  EXPECT_TRUE(has(e, "\"image_encoder\" is set (CLIPVisionModel)")) << e;

  edit_index([](json::Object& o) { set(o, "_class_name", "WanVACEPipeline"); });
  e = error();
  EXPECT_TRUE(has(e, "pipeline \"WanVACEPipeline\" is not supported natively")) << e;
}

TEST_F(PipelineFolder, ExpertsNeedBothTheSecondTransformerAndTheBoundary) {
  edit_index([](json::Object& o) { set(o, "boundary_ratio", json::Value::real(0.875)); });
  std::string e = error();
  EXPECT_TRUE(has(e, "\"boundary_ratio\" is set without \"transformer_2\"")) << e;
  edit_index([](json::Object& o) {
    set(o, "boundary_ratio", nullptr);
    set(o, "transformer_2", pair("diffusers", "WanTransformer3DModel"));
  });
  e = error();
  EXPECT_TRUE(has(e, "\"transformer_2\" is set without \"boundary_ratio\"")) << e;
  edit_index([](json::Object& o) { set(o, "boundary_ratio", json::Value::real(1.5)); });
  e = error();
  EXPECT_TRUE(has(e, "\"boundary_ratio\" must be in (0, 1)")) << e;
  edit_index([](json::Object& o) { set(o, "boundary_ratio", json::Value::real(0.5)); });
  e = error();
  EXPECT_TRUE(has(e, "transformer_2/config.json is missing")) << e;
  // [null, null] is no second expert, as diffusers saves a Wan 2.1 or TI2V folder.
  edit_index([](json::Object& o) {
    set(o, "transformer_2", json::Value(json::Array{nullptr, nullptr}));
    set(o, "boundary_ratio", nullptr);
    set(o, "expand_timesteps", false);
  });
  EXPECT_EQ(error(), "(loaded)");
}

TEST_F(PipelineFolder, SchedulerConfigIsAsStrictAsTheTransformers) {
  edit(root() / "scheduler" / "scheduler_config.json", [](json::Object& o) { set(o, "karras_rho", json::Value::real(7.0)); });
  const std::string e = error();
  EXPECT_TRUE(has(e, "unknown config keys \"karras_rho\"")) << e;
  EXPECT_TRUE(has(e, "scheduler_config.json")) << e;
}

TEST_F(PipelineFolder, LatentSpaceComesFromTheVae) {
  EXPECT_EQ(load_denoiser(root())->spec().latent_space, "wan2.1");  // no vae/: the channels say Wan 2.1's VAE
  fs::create_directories(root() / "vae");
  edit(root() / "vae" / "config.json", [](json::Object& o) {
    set(o, "_class_name", "AutoencoderKLWan");
    set(o, "z_dim", json::Value::integer(48));
    set(o, "is_residual", true);
    set(o, "scale_factor_spatial", json::Value::integer(16));
  });
  edit_index([](json::Object& o) { set(o, "vae", pair("diffusers", "AutoencoderKLWan")); });
  std::string e = error();
  EXPECT_TRUE(has(e, "the transformer takes 16 latent channels and the folder's VAE")) << e;
  EXPECT_TRUE(has(e, "makes 48")) << e;

  const int64_t channels = load_denoiser(fixtures() / "pipeline")->spec().channels;
  edit(root() / "vae" / "config.json", [&](json::Object& o) {
    set(o, "z_dim", json::Value::integer(channels));
    set(o, "is_residual", false);
    set(o, "scale_factor_spatial", json::Value::integer(8));
  });
  const DenoiserSpec s = load_denoiser(root())->spec();
  EXPECT_EQ(s.latent_space, "wan2.1");
  EXPECT_EQ(s.spatial_factor, 8);
  EXPECT_FALSE(s.image_condition);

  edit(root() / "vae" / "config.json", [](json::Object& o) { set(o, "_class_name", "AutoencoderKLMochi"); });
  e = error();
  EXPECT_TRUE(has(e, "VAE \"AutoencoderKLMochi\" is not supported")) << e;
}

TEST_F(PipelineFolder, ExpandTimestepsTakesAnImage) {
  edit_index([](json::Object& o) { set(o, "expand_timesteps", true); });
  EXPECT_TRUE(load_denoiser(root())->spec().image_condition);
  edit_index([](json::Object& o) { set(o, "expand_timesteps", "yes"); });
  EXPECT_TRUE(has(error(), "\"expand_timesteps\" is not true or false"));
}

// The high-noise expert runs the calls at timesteps >= boundary_ratio x num_train_timesteps, the low-noise one the
// rest; each equals its transformer loaded alone.
TEST_F(PipelineFolder, TwoExpertsSplitTheTimestepsAtTheBoundary) {
  add_second_expert(0.5);
  const auto experts = load_denoiser(root());
  EXPECT_EQ(experts->spec().expert_boundary, 500.0);
  EXPECT_FALSE(experts->spec().per_frame_timesteps);
  const auto high = load_denoiser(root() / "transformer");
  const auto low = load_denoiser(root() / "transformer_2");
  const DenoiserSpec& s = experts->spec();
  torch::manual_seed(3);
  const torch::Tensor x = torch::randn({1, s.channels, 2, 4, 6});
  const torch::Tensor text = torch::randn({1, s.text_tokens, s.text_dim});
  for (float t : {999.0f, 500.0f, 499.0f, 20.0f}) {
    const torch::Tensor ts = torch::full({1, 2}, t);
    const torch::Tensor got = experts->predict(x, ts, text);
    const auto& want = t >= 500.0f ? high : low;
    EXPECT_TRUE(torch::equal(got, want->predict(x, ts, text))) << t;
    EXPECT_FALSE(torch::equal(got, (t >= 500.0f ? low : high)->predict(x, ts, text))) << t;
  }
  // Frames at two noise levels in one call would need both experts at once.
  EXPECT_THROW(experts->predict(x, torch::tensor({{700.0f, 300.0f}}), text), std::invalid_argument);
  // A device short of memory keeps one expert, loading the other at the switch: the same predictions.
  setenv("LATENT_RESIDENT_EXPERTS", "1", 1);
  const auto one_at_a_time = load_denoiser(root());
  unsetenv("LATENT_RESIDENT_EXPERTS");
  for (float t : {999.0f, 20.0f, 999.0f}) {
    const torch::Tensor ts = torch::full({1, 2}, t);
    EXPECT_TRUE(torch::equal(one_at_a_time->predict(x, ts, text), experts->predict(x, ts, text))) << t;
  }
  // Edits for a second expert of a folder with one are refused.
  fs::remove_all(root() / "transformer_2");
  edit_index([](json::Object& o) {
    set(o, "transformer_2", json::Value(json::Array{nullptr, nullptr}));
    set(o, "boundary_ratio", nullptr);
  });
  DenoiserFiles files;
  files.second.loras.push_back({root() / "x.safetensors", 1.0});
  try {
    load_denoiser(root(), {}, files);
    ADD_FAILURE() << "loaded";
  } catch (const ModelError& e) {
    EXPECT_TRUE(has(e.what(), "for a second expert, and the folder has one transformer")) << e.what();
  }
}

}  // namespace
