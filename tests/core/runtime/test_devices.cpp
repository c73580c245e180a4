#include <gtest/gtest.h>

#include "latent/runtime/build_info.h"
#include "latent/runtime/devices.h"
#include "latent/runtime/shared_models.h"
#include "vae_fixtures.h"

using namespace latent;

TEST(Registry, ParsesDevicesAndRefusesMissingOnes) {
  EXPECT_EQ(resolve_device("cpu"), torch::Device(torch::kCPU));
  EXPECT_EQ(resolve_device("auto").is_cuda(), cuda_available());
  for (const char* bad : {"gpu", "cuda:", "cuda:x", "cuda0", "cuda:-1", "tpu:0"}) {
    EXPECT_THROW(resolve_device(bad), DeviceError) << bad;
  }
  if (cuda_device_count() < 8) {
    try {
      resolve_device("cuda:7");
      FAIL() << "cuda:7 accepted";
    } catch (const DeviceError& e) {
      EXPECT_NE(std::string(e.what()).find("'cuda:7' requested, but this machine has"), std::string::npos) << e.what();
    }
  }
  if (!cuda_available()) {
    EXPECT_THROW(resolve_device("cuda"), DeviceError);
  }
}

TEST(Registry, ParsesDtypes) {
  EXPECT_EQ(resolve_dtype("auto", torch::kCPU), torch::kFloat);
  EXPECT_EQ(resolve_dtype("auto", torch::Device(torch::kCUDA, 0)), torch::kBFloat16);
  EXPECT_EQ(resolve_dtype("bfloat16", torch::kCPU), torch::kBFloat16);
  EXPECT_EQ(resolve_dtype("fp16", torch::kCPU), torch::kHalf);
  EXPECT_THROW(resolve_dtype("int8", torch::kCPU), std::invalid_argument);
}

TEST(Registry, SharesOneLoadedCopyWhileHeld) {
  LATENT_REQUIRE_FIXTURES();
  auto dir = latent::testing::fixtures_dir() / "wan";
  auto a = shared_vae(dir, {});
  auto b = shared_vae(dir.parent_path() / "." / "wan", {});  // another spelling of the same folder
  EXPECT_EQ(a.get(), b.get());
  auto half = shared_vae(dir, {.dtype = torch::kBFloat16});
  EXPECT_NE(a.get(), half.get());
  const Vae* old = a.get();
  a.reset();
  b.reset();
  auto again = shared_vae(dir, {});
  EXPECT_EQ(again->spec().family, "wan2.1");
  (void)old;  // the address may be reused; what matters is that a fresh load works
}
