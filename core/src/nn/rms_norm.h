// The channel RMS norm of the Wan family, with a CPU kernel of its own (rms_norm.cpp says why).
#pragma once

#include <torch/types.h>

namespace latent::layers {

using torch::Tensor;

// x / max(||x||_2 over channels, 1e-12) * sqrt(C) * gamma, computed in float32 for half inputs. With headroom
// h > 0 (x is [B, C, T, H, W]) the result is [B, C, h + T, H, W] with the normalised x in its last T frames and
// the first h left unset, for CausalConv3d::forward_padded.
Tensor rms_norm_channels(const Tensor& x, const Tensor& gamma, int64_t headroom = 0);
// SiLU in place, for a tensor nobody else holds (a fresh norm output): saves one full-size allocation.
inline Tensor silu_owned(Tensor t) {
  torch::silu_(t);
  return t;
}

// silu(rms_norm_channels(x, gamma)) without a second full-size tensor.
Tensor silu_rms_norm_channels(const Tensor& x, const Tensor& gamma, int64_t headroom = 0);

}  // namespace latent::layers
