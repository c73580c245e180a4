// The denoiser fixtures (tests/fixtures/gen_denoiser_fixtures.py, run by the build from the .venv): a tiny
// random-weight diffusers WanTransformer3DModel, its .pt2 package, and what PyTorch and diffusers computed with it.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <map>
#include <string>

#include "latent/io/weights.h"

namespace latent::testing {

inline std::filesystem::path denoiser_fixtures_dir() {
  const char* d = std::getenv("LATENT_DENOISER_FIXTURES");
  return d ? std::filesystem::path(d) : std::filesystem::path();
}

inline bool have_denoiser_fixtures() {
  const auto dir = denoiser_fixtures_dir();
  return !dir.empty() && std::filesystem::exists(dir / "stamp");
}

#define LATENT_REQUIRE_DENOISER_FIXTURES()                                                              \
  do {                                                                                                  \
    if (!latent::testing::have_denoiser_fixtures())                                                     \
      GTEST_SKIP() << "no denoiser fixtures (LATENT_DENOISER_FIXTURES unset: build without the .venv)"; \
  } while (0)

// The fixture tensors, read once per process.
inline const WeightSource& denoiser_cases() {
  static const WeightSource cases = read_weights(denoiser_fixtures_dir() / "wan-tiny-cases.safetensors");
  return cases;
}

inline torch::Tensor denoiser_case(const std::string& name) {
  const auto& t = denoiser_cases().tensors;
  auto it = t.find(name);
  if (it == t.end()) throw std::runtime_error("fixture tensor " + name + " missing");
  return it->second.to(torch::kFloat);
}

inline double max_abs_diff(const torch::Tensor& a, const torch::Tensor& b) {
  return (a.to(torch::kCPU, torch::kDouble) - b.to(torch::kCPU, torch::kDouble)).abs().max().item<double>();
}

}  // namespace latent::testing
