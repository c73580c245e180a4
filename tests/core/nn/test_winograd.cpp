// The CPU convolution paths (core/src/winograd.h, layers.h conv_direct) against float64 convolutions.
// Whole-model parity with diffusers on these paths runs in the core-winograd test (LATENT_CPU_CONV=winograd).
#include <gtest/gtest.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <stdexcept>

#include "nn/layers.h"
#include "nn/winograd.h"

using namespace latent::layers;

namespace {

// Winograd F(2x2, 3x3) adds and subtracts with coefficients 1 and 1/2 around float32 products: measured errors
// are 1e-7..5e-7 of the output range, like the direct convolution's. 1e-5 leaves room for other shapes and
// is still 10x below the model tests' 1e-4; a wrong tile index or transform gives errors of order 1.
constexpr double kTol = 1e-5;

double rel_err(const torch::Tensor& got, const torch::Tensor& want) {
  return ((got.to(torch::kDouble) - want).abs().max() / want.abs().max()).item<double>();
}

torch::Tensor reference(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b) {
  return torch::conv3d(x.to(torch::kDouble), w.to(torch::kDouble), b.defined() ? b.to(torch::kDouble) : b, 1,
                       {0, 1, 1});
}

struct Shape {
  int64_t batch, ci, co, kt, tp, h, w;
};

}  // namespace

TEST(Winograd, MatchesFloat64ConvolutionOnEveryShape) {
  torch::manual_seed(7);
  // Odd and tiny sizes (a tile hanging over the edge, a single pixel), channel counts that are not multiples of
  // the 16-channel blocks, 1-frame and 3-frame kernels, batches.
  const Shape shapes[] = {{1, 16, 16, 3, 5, 8, 8},   {1, 5, 3, 3, 3, 9, 13},  {2, 17, 33, 3, 4, 6, 10},
                          {1, 40, 24, 1, 2, 7, 5},   {1, 3, 96, 3, 3, 1, 1},  {1, 24, 8, 3, 6, 1, 7},
                          {1, 64, 64, 3, 3, 16, 16}, {1, 33, 17, 1, 1, 3, 2}, {2, 96, 16, 3, 3, 22, 40}};
  for (const Shape& s : shapes) {
    auto x = torch::randn({s.batch, s.ci, s.tp, s.h, s.w});
    auto w = torch::randn({s.co, s.ci, s.kt, 3, 3}) / std::sqrt(9.0 * s.kt * s.ci);
    auto b = torch::randn({s.co});
    auto got = winograd_conv3d(x, winograd_weights(w), b);
    auto want = reference(x, w, b);
    ASSERT_EQ(got.sizes(), want.sizes());
    EXPECT_LT(rel_err(got, want), kTol) << "shape " << x.sizes() << " kernel " << w.sizes();
  }
}

TEST(Winograd, TwoDimensionalKernelsRunFrameByFrame) {
  torch::manual_seed(8);
  auto x = torch::randn({1, 20, 4, 10, 6});
  auto w2 = torch::randn({12, 20, 3, 3}) / 10.0;
  auto got = winograd_conv3d(x, winograd_weights(w2), torch::Tensor());
  auto want = reference(x, w2.unsqueeze(2), torch::Tensor());
  EXPECT_LT(rel_err(got, want), kTol);
}

TEST(Winograd, CarriedFramesReadInPlaceEqualTheConcatenatedInput) {
  torch::manual_seed(11);
  // Carried frames as a causal conv has them (2 for a 3-frame kernel), more than the chunk has, and batches.
  const Shape shapes[] = {{1, 16, 24, 3, 4, 10, 12}, {2, 17, 9, 3, 1, 7, 5}, {1, 8, 8, 3, 3, 5, 9}};
  for (const Shape& s : shapes) {
    auto left = torch::randn({s.batch, s.ci, 2, s.h, s.w});
    auto x = torch::randn({s.batch, s.ci, s.tp, s.h, s.w});
    auto w = torch::randn({s.co, s.ci, s.kt, 3, 3}) / std::sqrt(9.0 * s.kt * s.ci);
    auto b = torch::randn({s.co});
    auto u = winograd_weights(w);
    auto got = winograd_conv3d(x, u, b, left);
    EXPECT_TRUE(torch::equal(got, winograd_conv3d(torch::cat({left, x}, 2), u, b))) << x.sizes();
    EXPECT_LT(rel_err(got, reference(torch::cat({left, x}, 2), w, b)), kTol);
  }
  auto u = winograd_weights(torch::randn({4, 8, 3, 3, 3}));
  EXPECT_THROW(winograd_conv3d(torch::randn({1, 8, 2, 4, 4}), u, torch::Tensor(), torch::randn({1, 8, 2, 4, 5})),
               c10::Error);  // carried frames of another size
}

TEST(Winograd, NonContiguousInputIsTheSameAsItsCopy) {
  torch::manual_seed(9);
  auto base = torch::randn({1, 8, 3, 12, 10});
  auto x = base.transpose(3, 4);  // [1, 8, 3, 10, 12], not contiguous
  auto w = torch::randn({8, 8, 3, 3, 3}) / 8.0;
  auto u = winograd_weights(w);
  EXPECT_TRUE(
      torch::equal(winograd_conv3d(x, u, torch::Tensor()), winograd_conv3d(x.contiguous(), u, torch::Tensor())));
}

TEST(Winograd, RefusesWhatItCannotCompute) {
  auto w = torch::randn({4, 8, 3, 3, 3});
  auto u = winograd_weights(w);
  EXPECT_THROW(winograd_conv3d(torch::randn({1, 7, 3, 4, 4}), u, torch::Tensor()), c10::Error);  // channels
  EXPECT_THROW(winograd_conv3d(torch::randn({1, 8, 2, 4, 4}), u, torch::Tensor()), c10::Error);  // frames < kT
  EXPECT_THROW(winograd_conv3d(torch::randn({1, 8, 3, 4, 4}, torch::kDouble), u, torch::Tensor()), c10::Error);
  EXPECT_THROW(winograd_weights(torch::randn({4, 8, 3, 5, 5})), c10::Error);  // not 3x3
  EXPECT_THROW(winograd_weights(torch::randn({4, 8, 3, 3, 3}, torch::kDouble)), c10::Error);
}

TEST(Winograd, OnlyFloat32CpuThreeByThreeKernelsAreCandidates) {
  EXPECT_FALSE(winograd_preferred(torch::randn({128, 128, 3, 3, 3}, torch::kDouble)));
  EXPECT_FALSE(winograd_preferred(torch::randn({128, 128, 3, 1, 1})));
  EXPECT_FALSE(winograd_preferred(torch::randn({128, 128, 1, 1, 1})));
  EXPECT_FALSE(winograd_preferred(torch::Tensor()));
  const bool wide = winograd_preferred(torch::randn({128, 128, 3, 3, 3}));
  const bool thin = winograd_preferred(torch::randn({3, 128, 3, 3, 3}));
  switch (cpu_conv_algorithm()) {
    case ConvAlgorithm::automatic:
      EXPECT_TRUE(wide);
      EXPECT_FALSE(thin);  // 3 output channels: the direct convolution is faster
      break;
    case ConvAlgorithm::winograd:
      EXPECT_TRUE(wide);
      EXPECT_TRUE(thin);
      break;
    case ConvAlgorithm::direct:
      EXPECT_FALSE(wide);
      EXPECT_FALSE(thin);
      break;
  }
}

TEST(Winograd, AlgorithmSettingIsParsedStrictly) {
  EXPECT_EQ(parse_conv_algorithm(""), ConvAlgorithm::automatic);
  EXPECT_EQ(parse_conv_algorithm("auto"), ConvAlgorithm::automatic);
  EXPECT_EQ(parse_conv_algorithm("winograd"), ConvAlgorithm::winograd);
  EXPECT_EQ(parse_conv_algorithm("direct"), ConvAlgorithm::direct);
  try {
    parse_conv_algorithm("Winograd ");
    FAIL() << "accepted a misspelt value";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("LATENT_CPU_CONV"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("'Winograd '"), std::string::npos);
  }
}

TEST(ConvDirect, MatchesFloat64ConvolutionWhereLibTorchWouldUseIm2col) {
  torch::manual_seed(10);
  // N*C*D*H <= 20480: the shapes LibTorch's heuristic sends to its slow kernel, which conv_direct avoids.
  auto x = torch::randn({1, 12, 3, 22, 40});
  auto w = torch::randn({3, 12, 3, 3, 3}) / 18.0;
  auto b = torch::randn({3});
  EXPECT_LT(rel_err(conv_direct(x, w, b, {1, 1, 1}, {0, 1, 1}), reference(x, w, b)), kTol);
  // Strided 2-D, as in the downsamplers.
  auto x2 = torch::randn({4, 16, 9, 11});
  auto w2 = torch::randn({16, 16, 3, 3}) / 12.0;
  auto want2 = torch::conv2d(x2.to(torch::kDouble), w2.to(torch::kDouble), {}, 2);
  EXPECT_LT(rel_err(conv_direct(x2, w2, torch::Tensor(), {2, 2}, {0, 0}), want2), kTol);
  // Other dtypes take LibTorch's own path.
  auto xd = x.to(torch::kDouble);
  EXPECT_TRUE(torch::allclose(conv_direct(xd, w.to(torch::kDouble), b.to(torch::kDouble), {1, 1, 1}, {0, 1, 1}),
                              reference(x, w, b)));
}
