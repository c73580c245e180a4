// AOTInductor packages made by tools/export_denoiser.py from a diffusers WanTransformer3DModel: the C++ output
// equals PyTorch's, and a damaged package or a wrong input is a clear error.
#include <ATen/cpu/Utils.h>
#include <gtest/gtest.h>
#include <torch/types.h>

#include "gen_fixtures.h"
#include "latent/gen/denoiser.h"

using namespace latent;
using namespace latent::testing;

namespace {

std::shared_ptr<Denoiser> tiny() {
  static std::shared_ptr<Denoiser> model = load_denoiser(denoiser_fixtures_dir() / "wan-tiny.pt2");
  return model;
}

std::string load_error(const std::string& file, const LoadOptions& options = {}) {
  try {
    load_denoiser(denoiser_fixtures_dir() / file, options);
  } catch (const ModelError& e) {
    return e.what();
  }
  return "(loaded)";
}

std::string predict_error(const torch::Tensor& x, const torch::Tensor& t, const torch::Tensor& text) {
  try {
    tiny()->predict(x, t, text);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "(ran)";
}

}  // namespace

TEST(AotiDenoiser, ReadsTheContractFromThePackage) {
  LATENT_REQUIRE_DENOISER_FIXTURES();
  const DenoiserSpec& s = tiny()->spec();
  EXPECT_EQ(s.backend, "aoti");
  EXPECT_EQ(s.prediction, Prediction::flow);
  EXPECT_EQ(s.latent_space, "wan2.1");
  EXPECT_EQ(s.channels, 4);
  EXPECT_EQ(s.min_frames, 1);
  EXPECT_EQ(s.window, 8);
  EXPECT_EQ(s.height, 8);
  EXPECT_EQ(s.width, 8);
  EXPECT_EQ(s.text_tokens, 7);
  EXPECT_EQ(s.text_dim, 16);
  EXPECT_EQ(s.sampler.kind, SamplerKind::euler);
  EXPECT_EQ(s.sampler.steps, 6);
  EXPECT_DOUBLE_EQ(s.sampler.shift, 3.0);
  EXPECT_DOUBLE_EQ(s.guidance, 2.5);
  EXPECT_EQ(tiny()->dtype(), torch::kFloat);
}

// Per-frame timesteps (each latent frame at its own level), T = 1, 3 and 8 through one package with a dynamic
// frame count. Tolerance 1e-5: Inductor fuses and reorders the float32 reductions of layer norms, attention and
// GEMMs (measured 5e-7 on outputs of magnitude ~1 in the export check); 1e-5 leaves room for another CPU's ISA.
TEST(AotiDenoiser, EqualsPyTorchWithPerFrameTimesteps) {
  LATENT_REQUIRE_DENOISER_FIXTURES();
  const torch::Tensor text = denoiser_case("text");
  for (int frames : {1, 3, 8}) {
    const std::string key = "predict." + std::to_string(frames);
    torch::Tensor x = denoiser_case(key + ".x"), t = denoiser_case(key + ".timesteps");
    torch::Tensor out = tiny()->predict(x, t, text);
    const double diff = max_abs_diff(out, denoiser_case(key + ".out"));
    EXPECT_LE(diff, 1e-5) << "T=" << frames;
    std::printf("T=%d: max |C++ - PyTorch| = %.3g\n", frames, diff);
  }
}

TEST(AotiDenoiser, RefusesInputsOutsideTheContract) {
  LATENT_REQUIRE_DENOISER_FIXTURES();
  const torch::Tensor text = denoiser_case("text");
  const auto x = torch::zeros({1, 4, 3, 8, 8});
  const auto t = torch::zeros({1, 3});
  EXPECT_NE(predict_error(torch::zeros({1, 4, 9, 8, 8}), torch::zeros({1, 9}), text).find("1 <= T <= 8"),
            std::string::npos);
  EXPECT_NE(predict_error(torch::zeros({1, 4, 3, 16, 8}), t, text).find("h = 8"), std::string::npos);
  EXPECT_NE(predict_error(torch::zeros({1, 16, 3, 8, 8}), t, text).find("[1, 4, T, h, w]"), std::string::npos);
  EXPECT_NE(predict_error(torch::zeros({2, 4, 3, 8, 8}), t, text).find("latents"), std::string::npos);
  EXPECT_NE(predict_error(x, torch::zeros({1, 4}), text).find("timesteps"), std::string::npos);
  EXPECT_NE(predict_error(x, torch::zeros({3}), text).find("timesteps"), std::string::npos);
  EXPECT_NE(predict_error(x, t, torch::zeros({1, 8, 16})).find("[1, 7, 16]"), std::string::npos);
  EXPECT_NE(predict_error(x, t, torch::Tensor()).find("prompt embeddings"), std::string::npos);
  // Other dtypes and non-contiguous inputs are converted, not refused, and give what the contiguous input gives.
  torch::Tensor strided = torch::randn({1, 4, 8, 3, 8}).transpose(2, 3);
  torch::Tensor levels = torch::rand({1, 3}) * 1000;
  EXPECT_TRUE(torch::equal(tiny()->predict(strided.to(torch::kDouble), levels, text),
                           tiny()->predict(strided.contiguous(), levels, text)));
}

TEST(AotiDenoiser, DamagedPackagesAreClearErrors) {
  LATENT_REQUIRE_DENOISER_FIXTURES();
  EXPECT_NE(load_error("missing.pt2").find("no such file"), std::string::npos);
  EXPECT_NE(load_error("bad-truncated.pt2").find("not a readable AOTInductor package"), std::string::npos)
      << load_error("bad-truncated.pt2");
  EXPECT_NE(load_error("bad-no-window.pt2").find("no \"latent.window\""), std::string::npos);
  EXPECT_NE(load_error("bad-huge-window.pt2").find("\"latent.window\" = \"1000000000000\""), std::string::npos);
  EXPECT_NE(load_error("bad-channels.pt2").find("\"latent.channels\" = \"four\""), std::string::npos);
  EXPECT_NE(load_error("bad-prediction.pt2").find("latent.prediction"), std::string::npos);
  EXPECT_NE(load_error("bad-format.pt2").find("format 99"), std::string::npos);
  EXPECT_NE(load_error("bad-device.pt2").find("compiled for cuda"), std::string::npos);
}

// A package compiled where AVX-512 and AMX exist would die of SIGILL here at its first call.
TEST(AotiDenoiser, APackageForAnotherCpuIsRefusedAtLoad) {
  LATENT_REQUIRE_DENOISER_FIXTURES();
  const auto caps = at::cpu::get_cpu_capabilities();
  if (caps.count("amx_tile") && caps.at("amx_tile").toBool() && caps.at("avx512_f").toBool())
    GTEST_SKIP() << "[hardware] this CPU has AVX-512 and AMX";
  const std::string error = load_error("bad-isa.pt2");
  EXPECT_NE(error.find("this CPU lacks"), std::string::npos) << error;
}

TEST(AotiDenoiser, ACpuPackageRefusesAGpu) {
  LATENT_REQUIRE_DENOISER_FIXTURES();
  LoadOptions gpu;
  gpu.device = torch::Device(torch::kCUDA, 0);
  EXPECT_NE(load_error("wan-tiny.pt2", gpu).find("compiled for cpu"), std::string::npos);
}

TEST(AotiDenoiser, OtherFilesAreNotDenoisers) {
  LATENT_REQUIRE_DENOISER_FIXTURES();
  // A VAE's weights (or any safetensors without the architecture key) are named as such.
  EXPECT_NE(load_error("wan-tiny-cases.safetensors").find("not a denoiser"), std::string::npos);
}
