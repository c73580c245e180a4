// The CPU fast paths of core/src/layers.h against float64 references: the fused RMS norm over channels, and the
// causal convolution that receives its time padding from the norm (forward_padded) instead of concatenating it.
// The two paths agree to float32 rounding (1e-6), not bitwise: SiLU's vector loops split a strided view's rows
// differently from a contiguous tensor's.
#include <gtest/gtest.h>
#include <torch/types.h>
#include <torch/utils.h>

#include "nn/layers.h"

using namespace latent::layers;

namespace {

// The kernel sums squares in float32 over at most a few hundred channels: relative errors are ~1e-7; 1e-5 is
// still 10x below the model tests' 1e-4, while a wrong channel stride or pixel offset gives errors of order 1.
constexpr double kTol = 1e-5;

torch::Tensor reference_norm(const torch::Tensor& x, const torch::Tensor& gamma) {
  const torch::Tensor xd = x.to(torch::kDouble);
  const torch::Tensor norm = xd.pow(2).sum(1, /*keepdim=*/true).sqrt().clamp_min(1e-12);
  auto gshape = std::vector<int64_t>(x.dim(), 1);
  gshape[1] = x.size(1);
  return xd / norm * std::sqrt(double(x.size(1))) * gamma.to(torch::kDouble).reshape(gshape);
}

double rel_err(const torch::Tensor& got, const torch::Tensor& want) {
  return ((got.to(torch::kDouble) - want).abs().max() / want.abs().max().clamp_min(1e-30)).item<double>();
}

CausalConv3d random_causal_conv(int64_t cin, int64_t cout) {
  CausalConv3d c;
  c.conv.w = torch::randn({cout, cin, 3, 3, 3}) / std::sqrt(27.0 * double(cin));
  c.conv.b = torch::randn({cout});
  c.slot = 0;
  return c;
}

}  // namespace

TEST(RmsNorm, MatchesFloat64OnEveryShape) {
  torch::manual_seed(3);
  // Channel counts below, at and above the 8-float vector width; pixel counts that are not multiples of the
  // kernel's 512-pixel runs; a batch of two; 4-D attention inputs.
  const std::vector<std::vector<int64_t>> shapes = {{1, 1, 2, 3, 5},    {1, 3, 1, 7, 9},   {2, 8, 3, 11, 13},
                                                    {1, 12, 5, 17, 31}, {2, 96, 2, 9, 40}, {3, 16, 21, 19}};
  for (const auto& shape : shapes) {
    const torch::Tensor x = torch::randn(shape) * 3;
    const torch::Tensor gamma = torch::randn({shape[1], 1, 1}).abs() + 0.5;
    EXPECT_LT(rel_err(rms_norm_channels(x, gamma), reference_norm(x, gamma)), kTol) << x.sizes();
  }
}

TEST(RmsNorm, NonContiguousInputAndZeroPixels) {
  torch::manual_seed(4);
  const torch::Tensor base = torch::randn({1, 5, 4, 6, 8});
  const torch::Tensor x = base.permute({0, 1, 2, 4, 3});  // a view with swapped H and W strides
  const torch::Tensor gamma = torch::randn({5, 1, 1, 1});
  EXPECT_LT(rel_err(rms_norm_channels(x, gamma), reference_norm(x, gamma)), kTol);
  // An all-zero pixel stays zero (the norm is clamped at 1e-12, not divided by zero).
  torch::Tensor z = torch::randn({1, 4, 1, 2, 2});
  z.index_put_({torch::indexing::Slice(), torch::indexing::Slice(), 0, 1, 1}, 0.0);
  const torch::Tensor y = rms_norm_channels(z, torch::ones({4, 1, 1, 1}));
  EXPECT_TRUE(torch::isfinite(y).all().item<bool>());
  EXPECT_EQ(y.index({0, torch::indexing::Slice(), 0, 1, 1}).abs().max().item<float>(), 0.0f);
}

TEST(RmsNorm, HeadroomLeavesRoomInFrontAndTheSameValues) {
  torch::manual_seed(5);
  const torch::Tensor x = torch::randn({2, 8, 3, 5, 7});
  const torch::Tensor gamma = torch::randn({8, 1, 1, 1});
  const torch::Tensor plain = silu_rms_norm_channels(x, gamma);
  const torch::Tensor padded = silu_rms_norm_channels(x, gamma, 2);
  ASSERT_EQ(padded.sizes(), torch::IntArrayRef({2, 8, 5, 5, 7}));
  // Not bitwise: SiLU runs over a strided view here, where LibTorch's vector loops split the rows differently.
  EXPECT_LT(rel_err(padded.narrow(2, 2, 3), plain.to(torch::kDouble)), 1e-6);
  EXPECT_THROW(rms_norm_channels(torch::randn({1, 8, 4, 4}), torch::ones({8, 1, 1}), 2), c10::Error);
}

TEST(CausalConv, PaddedInputFromTheNormEqualsTheConcatenatingPath) {
  torch::manual_seed(6);
  const CausalConv3d conv = random_causal_conv(8, 16);
  ASSERT_EQ(conv.headroom(), 2);
  const torch::Tensor gamma = torch::randn({8, 1, 1, 1});
  const torch::Tensor clip = torch::randn({1, 8, 10, 9, 11});
  StateSlots concat(1), padded(1);
  std::vector<torch::Tensor> a, b;
  // Chunks of 1, 4, 1 (fewer frames than the two carried) and 4 frames, as a stream cuts them.
  int64_t t = 0;
  for (int64_t n : {1, 4, 1, 4}) {
    const torch::Tensor chunk = clip.narrow(2, t, n);
    a.push_back(conv.forward(silu_rms_norm_channels(chunk, gamma), concat));
    b.push_back(conv_silu_rms_norm(conv, chunk, gamma, padded));
    t += n;
    EXPECT_LT(rel_err(padded.tensors[0], concat.tensors[0].to(torch::kDouble)), 1e-6) << "carried, frame " << t;
  }
  const torch::Tensor ya = torch::cat(a, 2), yb = torch::cat(b, 2);
  EXPECT_LT(rel_err(yb, ya.to(torch::kDouble)), 1e-6);
  // And both are the causal convolution of the whole clip (zero frames before it).
  const torch::Tensor in = torch::silu(reference_norm(clip, gamma));
  const torch::Tensor want =
      torch::conv3d(torch::constant_pad_nd(in, {0, 0, 0, 0, 2, 0}), conv.conv.w.to(torch::kDouble),
                    conv.conv.b.to(torch::kDouble), 1, {0, 1, 1});
  EXPECT_LT(rel_err(yb, want), kTol);
}

// The carried frames stay in one buffer from the first chunk on (StateSlots::carry): a fresh copy per chunk
// would land somewhere new in the stream's heap each time and spread its touched pages. The chunked result is
// still the whole clip's convolution (the test above).
TEST(CausalConv, CarriedFramesKeepTheirBuffer) {
  torch::manual_seed(7);
  const CausalConv3d conv = random_causal_conv(4, 4);
  const torch::Tensor clip = torch::randn({1, 4, 9, 5, 6});
  StateSlots s(1);
  conv.forward(clip.narrow(2, 0, 1), s);
  const void* buffer = s.tensors[0].data_ptr();
  int64_t t = 1;
  for (int64_t n : {4, 1, 3}) {  // the one-frame chunk carries one old and one new frame
    conv.forward(clip.narrow(2, t, n), s);
    t += n;
    EXPECT_EQ(s.tensors[0].data_ptr(), buffer) << "after frame " << t;
    EXPECT_TRUE(torch::equal(s.tensors[0], clip.narrow(2, t - 2, 2))) << "after frame " << t;
  }
}

TEST(CausalConv, NoHeadroomWhereTheConvReadsInPlaceOrOffTheCpu) {
  CausalConv3d one_frame = random_causal_conv(8, 8);
  one_frame.kt = 1;
  EXPECT_EQ(one_frame.headroom(), 0);
  CausalConv3d half = random_causal_conv(8, 8);
  half.conv.w = half.conv.w.to(torch::kBFloat16);
  EXPECT_EQ(half.headroom(), 0);
}
