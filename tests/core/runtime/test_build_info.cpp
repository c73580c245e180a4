#include <gtest/gtest.h>
#include <torch/cuda.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "latent/runtime/build_info.h"

namespace {

// What the machine says, without asking CUDA: a GPU shows up as /dev/nvidiaN, unless hidden from the process.
bool machine_has_visible_gpu() {
  if (const char* v = std::getenv("CUDA_VISIBLE_DEVICES")) {
    std::string s(v);
    if (s.empty() || s == "-1" || s == "none") return false;
  }
  for (int i = 0; i < 64; ++i)
    if (std::filesystem::exists("/dev/nvidia" + std::to_string(i))) return true;
  return false;
}

}  // namespace

TEST(Runtime, CudaAvailabilityAgreesWithTheMachine) {
  bool expected = latent::built_with_cuda() && machine_has_visible_gpu();
  EXPECT_EQ(torch::cuda::is_available(), expected)
      << "built_with_cuda=" << latent::built_with_cuda() << " gpu visible=" << machine_has_visible_gpu()
      << " (a CUDA build that sees a GPU but reports none has lost libtorch_cuda to --as-needed linking)";
  EXPECT_EQ(latent::cuda_available(), expected);
  EXPECT_EQ(latent::cuda_device_count() > 0, expected);
}

TEST(Runtime, SummaryNamesTheBuild) {
  std::string s = latent::runtime_summary();
  EXPECT_NE(s.find("LibTorch 2."), std::string::npos) << s;
  EXPECT_NE(s.find(latent::built_with_cuda() ? "CUDA build" : "CPU build"), std::string::npos) << s;
}

TEST(Runtime, GpuComputeWhereAGpuIsPresent) {
  if (!latent::cuda_available()) GTEST_SKIP() << "no GPU on this machine";
  auto a = torch::arange(1000, torch::TensorOptions().dtype(torch::kFloat).device(torch::kCUDA));
  EXPECT_EQ(a.sum().item<float>(), 499500.0f);
}
