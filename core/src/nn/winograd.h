// 3x3 convolutions by Winograd's minimal filtering F(2x2, 3x3) on the CPU.
//
// On the CPU the direct float32 convolutions of these VAEs already run near the FMA units' peak
// (docs/performance.md), so no amount of copy removal makes them much faster; doing fewer multiplications does. F(2x2,
// 3x3) computes each 2x2 block of outputs with 16 products per input channel and time tap instead of 36 (2.25x fewer),
// as 16 independent matrix products over the channels, between an input transform and an output transform that only add
// and subtract. The rounding it adds is of the order of float32's epsilon (tests/core/nn/test_winograd.cpp checks it
// against float64).
#pragma once

#include <torch/types.h>

#include <string_view>

namespace latent::layers {

using torch::Tensor;

enum class ConvAlgorithm {
  automatic,  // Winograd where it measured faster (wide layers), direct elsewhere
  winograd,   // Winograd wherever the shape allows it (tests use this to cover it on small models)
  direct      // LibTorch's convolution everywhere
};

// $LATENT_CPU_CONV: "auto" (default), "winograd" or "direct"; read once per process. Any other value is an
// error the first time a model is loaded, not a silent fallback.
ConvAlgorithm cpu_conv_algorithm();
// The same, for a given value (empty: auto). Throws std::invalid_argument naming the variable and the value.
ConvAlgorithm parse_conv_algorithm(std::string_view value);

// Whether stride-1 convolutions with spatial padding 1 by w ([Co, Ci, kT, 3, 3] or [Co, Ci, 3, 3]) should go
// through winograd_conv3d under the current algorithm: float32 CPU kernels with a 3x3 spatial extent only.
bool winograd_preferred(const Tensor& w);

// Weights transformed for winograd_conv3d: [kT, 16, Ci, Co] (kT = 1 for a [Co, Ci, 3, 3] kernel).
Tensor winograd_weights(const Tensor& w);

// conv3d(x, w, b, stride 1, padding {0, 1, 1}) for x [B, Ci, kT - 1 + T, H, W] (time padding already in place),
// u = winograd_weights(w), b [Co] or undefined. Returns [B, Co, T, H, W]. Any H and W (odd ones included).
// With `left` [B, Ci, L, H, W], the input is left's frames followed by x's, read where they lie: a causal conv
// passes its carried frames so that no padded copy of the chunk is made.
Tensor winograd_conv3d(const Tensor& x, const Tensor& u, const Tensor& b, const Tensor& left = {});

}  // namespace latent::layers
