#include "nn/layers.h"

#include <algorithm>

#include "latent/parallel/row_shard.h"
#include "nn/winograd.h"

namespace latent::layers {

Conv Conv::load(WeightReader& r, const std::string& prefix, std::vector<int64_t> weight_shape) {
  Conv c;
  int64_t cout = weight_shape[0];
  c.w = r.take(prefix + ".weight", std::move(weight_shape));
  c.b = r.take(prefix + ".bias", {cout});
  return c;
}

void Conv::prefer_winograd() {
  if (!winograd_preferred(w)) return;
  wino = winograd_weights(w);
  w = Tensor();
}

CausalConv3d CausalConv3d::load(WeightReader& r, const std::string& prefix, int64_t cin, int64_t cout,
                                std::array<int64_t, 3> k, TimePad pad, SlotAllocator& slots) {
  CausalConv3d c;
  c.conv = Conv::load(r, prefix, {cout, cin, k[0], k[1], k[2]});
  c.kt = k[0];
  c.kh = k[1];
  c.kw = k[2];
  c.pad = pad;
  if (c.kt > 1) c.slot = slots.take();
  c.conv.prefer_winograd();
  return c;
}

namespace {
// Winograd kernels always pad by one: with halo rows present that gives `halo` rows too many at each end.
Tensor drop_halo(const Tensor& y, int64_t halo) {
  return halo ? y.narrow(3, halo, y.size(3) - 2 * halo).contiguous() : y;
}
}  // namespace

Tensor CausalConv3d::conv3d_same(const Tensor& x, const Conv& c, int64_t halo) const {
  if (c.wino.defined()) return drop_halo(winograd_conv3d(x, c.wino, c.b), halo);
  return conv_direct(x, c.w, c.b, {1, 1, 1}, {0, halo ? 0 : (kh - 1) / 2, (kw - 1) / 2});
}

Tensor CausalConv3d::left_frames(const Tensor& x, const Tensor& history) const {
  if (history.defined()) return history;
  auto sizes = x.sizes().vec();
  sizes[2] = kt - 1;
  if (pad == TimePad::zeros) return torch::zeros(sizes, x.options());
  return x.slice(2, 0, 1).expand(sizes);
}

int64_t CausalConv3d::headroom() const {
  const Tensor& w = conv.w;
  return (kt > 1 && !conv.wino.defined() && w.defined() && w.device().is_cpu() && w.scalar_type() == torch::kFloat)
             ? kt - 1
             : 0;
}

Tensor CausalConv3d::forward_padded(const Tensor& padded, StateSlots& s) const {
  const int64_t n = kt - 1;
  TORCH_CHECK(kt > 1 && padded.dim() == 5 && padded.size(2) > n, "CausalConv3d::forward_padded: no time padding");
  Tensor& history = s.tensors[slot];
  padded.narrow(2, 0, n).copy_(left_frames(padded.narrow(2, n, padded.size(2) - n), history));
  Tensor y = conv3d_same(padded, conv, 0);
  s.carry(slot, padded.slice(2, padded.size(2) - n));
  return y;
}

Tensor CausalConv3d::forward(const Tensor& band, StateSlots& s) const {
  // A band gets its neighbours' rows before anything else, and carries them with its frames: the next chunk's
  // carried frames then already hold the rows the kernel reaches across.
  const int64_t halo = s.shard ? (kh - 1) / 2 : 0;
  const Tensor x = halo ? s.shard->with_halo(band, halo, halo) : band;
  if (kt == 1) return conv3d_same(x, conv, halo);
  const int64_t n = kt - 1;
  Tensor& history = s.tensors[slot];
  const Tensor left = left_frames(x, history).contiguous();
  Tensor y;
  if (conv.wino.defined()) {
    // Reads the carried frames and the chunk where they lie: no padded copy of the chunk.
    y = drop_halo(winograd_conv3d(x, conv.wino, conv.b, left), halo);
  } else {
    y = conv3d_same(torch::cat({left, x}, 2), conv, halo);
  }
  if (x.size(2) >= n)
    s.carry(slot, x.slice(2, x.size(2) - n));
  else
    s.carry(slot, torch::cat({left, x}, 2).slice(2, x.size(2)));  // fewer new frames than carried ones
  return y;
}

Tensor conv_silu_rms_norm(const CausalConv3d& conv, const Tensor& x, const Tensor& gamma, StateSlots& s) {
  const int64_t h = conv.headroom();
  if (h == 0 || s.shard) return conv.forward(silu_rms_norm_channels(x, gamma), s);
  return conv.forward_padded(silu_rms_norm_channels(x, gamma, h), s);
}

namespace {
Tensor frames_to_batch(const Tensor& x) {  // [B, C, T, H, W] -> [B*T, C, H, W]
  return x.permute({0, 2, 1, 3, 4}).reshape({x.size(0) * x.size(2), x.size(1), x.size(3), x.size(4)});
}
Tensor batch_to_frames(const Tensor& y, int64_t b, int64_t t) {  // [B*T, C, H, W] -> [B, C, T, H, W]
  return y.reshape({b, t, y.size(1), y.size(2), y.size(3)}).permute({0, 2, 1, 3, 4}).contiguous();
}
}  // namespace

Tensor conv2d_per_frame(const Tensor& band, const Conv& c, int64_t stride, int64_t padding,
                        const parallel::RowShard* shard) {
  TORCH_CHECK(!(c.wino.defined() || shard) || (stride == 1 && padding == 1),
              "conv2d_per_frame: Winograd kernels and bands need stride 1, padding 1");
  const int64_t halo = shard ? 1 : 0;
  const Tensor x = halo ? shard->with_halo(band, halo, halo) : band;
  if (c.wino.defined()) return drop_halo(winograd_conv3d(x, c.wino, c.b), halo);  // frame by frame, no copies
  Tensor y = conv_direct(frames_to_batch(x), c.w, c.b, {stride, stride}, {padding - halo, padding});
  return batch_to_frames(y, x.size(0), x.size(2));
}

Tensor conv2d_down2x_per_frame(const Tensor& x, const Conv& c, const parallel::RowShard* shard) {
  // Output row i reads rows 2i to 2i + 2: a band (of even height) needs one row from below, the frame's last
  // band a zero row.
  const Tensor padded =
      shard ? torch::constant_pad_nd(shard->with_halo(x, 0, 1), {0, 1, 0, 0}) : torch::constant_pad_nd(x, {0, 1, 0, 1});
  Tensor y = conv_direct(frames_to_batch(padded), c.w, c.b, {2, 2}, {0, 0});
  return batch_to_frames(y, x.size(0), x.size(2));
}

Tensor upsample2x_per_frame(const Tensor& x) {
  // Nearest x2 is pure repetition: expand and reshape instead of an interpolation kernel.
  auto s = x.sizes();
  return x.unsqueeze(4)
      .unsqueeze(6)
      .expand({s[0], s[1], s[2], s[3], 2, s[4], 2})
      .reshape({s[0], s[1], s[2], s[3] * 2, s[4] * 2});
}

Tensor conv_direct(const Tensor& x, const Tensor& w, const Tensor& b, std::vector<int64_t> stride,
                   std::vector<int64_t> padding) {
  std::vector<int64_t> dilation(stride.size(), 1);
  if (at::hasMKLDNN() && x.device().is_cpu() && x.scalar_type() == torch::kFloat && w.scalar_type() == torch::kFloat)
    return at::mkldnn_convolution(x, w, b, padding, stride, dilation, 1);
  return at::convolution(x, w, b, stride, padding, dilation, false, std::vector<int64_t>(stride.size(), 0), 1);
}

Tensor conv1x1x1(const Tensor& x, const Conv& c) { return conv_direct(x, c.w, c.b, {1, 1, 1}, {0, 0, 0}); }

}  // namespace latent::layers
