// Bad model sources end in a ModelError (or SafetensorsError) that names the file and the problem.
#include <gtest/gtest.h>
#include <torch/types.h>
#include <unistd.h>

#include <fstream>

#include "latent/io/safetensors.h"
#include "latent/vae/vae.h"
#include "vae_fixtures.h"

using namespace latent;
using namespace latent::testing;
namespace fs = std::filesystem;

namespace {

class VaeLoading : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("latent-load-" + std::to_string(::getpid()) + "-" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // A copy of the Wan fixture folder whose tensors went through `edit`.
  fs::path edited_wan(const std::function<void(std::map<std::string, torch::Tensor>&)>& edit) {
    fs::path out = dir_ / "wan";
    fs::create_directories(out);
    fs::copy_file(fixtures_dir() / "wan" / "config.json", out / "config.json");
    auto src = SafetensorsFile::open(fixtures_dir() / "wan" / "diffusion_pytorch_model.safetensors");
    std::map<std::string, torch::Tensor> tensors;
    for (const auto& n : src.names()) tensors[n] = src.tensor(n);
    edit(tensors);
    SafetensorsWriter w(out / "diffusion_pytorch_model.safetensors");
    for (const auto& [n, t] : tensors) w.write(n, t);
    w.commit();
    return out;
  }

  static std::string error_of(const fs::path& p) {
    try {
      load_vae(p);
    } catch (const std::exception& e) {
      return e.what();
    }
    ADD_FAILURE() << "loaded " << p;
    return {};
  }

  fs::path dir_;
};

void expect_has(const std::string& msg, const std::string& part) {
  EXPECT_NE(msg.find(part), std::string::npos) << "'" << part << "' not in: " << msg;
}

}  // namespace

TEST_F(VaeLoading, ListsEveryMissingExtraAndMisshapedTensor) {
  LATENT_REQUIRE_FIXTURES();
  auto p = edited_wan([](auto& t) {
    t.erase("decoder.conv_out.bias");
    t.erase("encoder.norm_out.gamma");
    t["encoder.conv_in.weight"] = torch::zeros({12, 3, 3, 3, 1});
    t["lora.extra"] = torch::zeros({1});
  });
  std::string msg = error_of(p);
  expect_has(msg, "diffusion_pytorch_model.safetensors: weights do not match the model");
  expect_has(msg, "2 missing");
  expect_has(msg, "decoder.conv_out.bias");
  expect_has(msg, "encoder.norm_out.gamma");
  expect_has(msg, "encoder.conv_in.weight is [12, 3, 3, 3, 1], expected [12, 3, 3, 3, 3]");
  expect_has(msg, "1 unexpected");
  expect_has(msg, "lora.extra");
}

TEST_F(VaeLoading, RecognisesFamiliesWithoutConfig) {
  LATENT_REQUIRE_FIXTURES();
  // Without config.json the widths come from the tensors and the family from the names.
  auto p = edited_wan([](auto&) {});
  fs::remove(p / "config.json");
  fs::rename(p / "diffusion_pytorch_model.safetensors", dir_ / "bare.safetensors");
  auto vae = load_vae(dir_ / "bare.safetensors");
  EXPECT_EQ(vae->spec().family, "wan2.1");
  EXPECT_EQ(vae->spec().latent_channels, 8);
}

TEST_F(VaeLoading, RefusesUnknownFamilies) {
  {
    SafetensorsWriter w(dir_ / "unet.safetensors");
    w.write("down.0.attn.weight", torch::zeros({4}));
    w.commit();
  }
  std::string msg = error_of(dir_ / "unet.safetensors");
  expect_has(msg, "unet.safetensors: cannot recognise the model family");
  expect_has(msg, "down.0.attn.weight");

  fs::create_directories(dir_ / "other");
  std::ofstream(dir_ / "other" / "config.json") << R"({"_class_name": "AutoencoderKLMochi"})";
  fs::copy_file(dir_ / "unet.safetensors", dir_ / "other" / "diffusion_pytorch_model.safetensors");
  expect_has(error_of(dir_ / "other"), "'AutoencoderKLMochi' is not a supported VAE");
}

TEST_F(VaeLoading, RefusesMissingAndCorruptFiles) {
  expect_has(error_of(dir_ / "nope"), "nope: no such file or directory");
  fs::create_directories(dir_ / "empty");
  expect_has(error_of(dir_ / "empty"), "folder has no config.json");
  std::ofstream(dir_ / "junk.safetensors") << "this is not a model file at all";
  expect_has(error_of(dir_ / "junk.safetensors"), "junk.safetensors: header length");
  std::ofstream(dir_ / "junk.pth") << "PK not really a zip";
  expect_has(error_of(dir_ / "junk.pth"), "junk.pth: not a readable torch.save checkpoint");
}

TEST_F(VaeLoading, RefusesCorruptConfig) {
  LATENT_REQUIRE_FIXTURES();
  auto p = edited_wan([](auto&) {});
  std::ofstream(p / "config.json") << R"({"_class_name": "AutoencoderKLWan", "z_dim": "eight"})";
  expect_has(error_of(p), "invalid Wan config");
  std::ofstream(p / "config.json") << R"({"_class_name": "AutoencoderKLWan", )";
  expect_has(error_of(p), "config.json: invalid config");
  // Wan 2.2's patchify needs 12 channels in.
  std::ofstream(p / "config.json") << R"({"_class_name": "AutoencoderKLWan", "is_residual": true, "patch_size": 2})";
  expect_has(error_of(p),
             "invalid Wan config: only RGB models are supported: in_channels and out_channels must be "
             "3 x patch_size^2 = 12, got 3 and 3");
}
