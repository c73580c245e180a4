#include "nn/rms_norm.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>

namespace latent::layers {

namespace {
// The CPU float path in one kernel. LibTorch's norm over dim 1 reduces along the strided channel axis one
// output at a time, which made it a large share of the default model's decode (its 8-64 channel layers;
// docs/performance.md); here each task owns a
// run of pixels, sums the squares channel by channel into a contiguous accumulator (the loops vectorise), then
// scales: two reads of x and one write, no temporaries.
Tensor rms_norm_channels_cpu(const Tensor& x, const Tensor& gamma, int64_t headroom) {
  const Tensor& xc = x;
  const Tensor g = gamma.to(torch::kFloat).contiguous();
  const int64_t batch = xc.size(0), channels = xc.size(1);
  const int64_t pixels = channels ? xc.numel() / (batch * channels) : 0;
  Tensor y;
  int64_t y_offset = 0, y_channel = pixels;  // where channel c of batch b starts in y: b*C*y_channel + c*y_channel
  if (headroom > 0) {
    auto sizes = xc.sizes().vec();
    sizes[2] += headroom;
    y = torch::empty(sizes, xc.options());
    y_offset = pixels / xc.size(2) * headroom;
    y_channel = pixels + y_offset;
  } else {
    y = torch::empty_like(xc);
  }
  const float* xp = xc.data_ptr<float>();
  const float* gp = g.data_ptr<float>();
  float* yp = y.data_ptr<float>() + y_offset;
  const float scale = std::sqrt(float(channels));
  constexpr int64_t kRun = 512;  // pixels per task: the accumulator stays in L1
  const int64_t runs = (pixels + kRun - 1) / kRun;
  at::parallel_for(0, batch * runs, 1, [&](int64_t begin, int64_t end) {
    float acc[kRun];
    for (int64_t task = begin; task < end; ++task) {
      const int64_t b = task / runs, p0 = (task % runs) * kRun, n = std::min(kRun, pixels - p0);
      const float* xb = xp + b * channels * pixels + p0;
      float* yb = yp + b * channels * y_channel + p0;
      std::fill(acc, acc + n, 0.0f);
      for (int64_t c = 0; c < channels; ++c) {
        const float* xr = xb + c * pixels;
        for (int64_t i = 0; i < n; ++i) acc[i] += xr[i] * xr[i];
      }
      for (int64_t i = 0; i < n; ++i) acc[i] = scale / std::max(std::sqrt(acc[i]), 1e-12f);
      for (int64_t c = 0; c < channels; ++c) {
        const float* xr = xb + c * pixels;
        float* yr = yb + c * y_channel;
        const float gc = gp[c];
        for (int64_t i = 0; i < n; ++i) yr[i] = xr[i] * acc[i] * gc;
      }
    }
  });
  return y;
}
}  // namespace

Tensor rms_norm_channels(const Tensor& x, const Tensor& gamma, int64_t headroom) {
  TORCH_CHECK(headroom == 0 || x.dim() == 5, "rms_norm_channels: headroom needs a [B, C, T, H, W] tensor");
  // A strided input (Wan's temporal upsampler hands one on) takes LibTorch's path: a contiguous copy first
  // would hold one more activation at the peak.
  if (x.device().is_cpu() && x.scalar_type() == torch::kFloat && x.is_contiguous() && x.dim() >= 2 && x.numel() > 0 &&
      gamma.numel() == x.size(1))
    return rms_norm_channels_cpu(x, gamma, headroom);
  if (headroom > 0) {
    auto sizes = x.sizes().vec();
    sizes[2] = headroom;
    return torch::cat({torch::empty(sizes, x.options()), rms_norm_channels(x, gamma)}, 2);
  }
  const bool half = x.scalar_type() != torch::kFloat && x.scalar_type() != torch::kDouble;
  Tensor xf = half ? x.to(torch::kFloat) : x;
  // The per-pixel factor is 1/C of the activation's size: fold sqrt(C) into it, then make one full-size
  // tensor and scale it in place (x / norm * sqrt(C) * gamma made three).
  Tensor factor = xf.norm(2, {1}, /*keepdim=*/true).clamp_min_(1e-12).reciprocal_().mul_(std::sqrt(double(x.size(1))));
  Tensor y = xf * factor;
  y.mul_(gamma.to(xf.scalar_type()));
  return half ? y.to(x.scalar_type()) : y;
}

Tensor silu_rms_norm_channels(const Tensor& x, const Tensor& gamma, int64_t headroom) {
  Tensor y = rms_norm_channels(x, gamma, headroom);
  if (headroom > 0) {
    Tensor chunk = y.narrow(2, headroom, y.size(2) - headroom);  // the scratch frames are the conv's to fill
    torch::silu_(chunk);
    return y;
  }
  return silu_owned(std::move(y));
}

}  // namespace latent::layers
