// Building blocks shared by the VAE families. Layers are plain structs of weight tensors with const forward
// functions; whatever a layer carries from chunk to chunk lives in a StateSlots object (nn/state.h) owned by the
// stream, at an index fixed when the model is built. One loaded model therefore serves any number of streams.
#pragma once

#include <torch/types.h>

#include <string>
#include <vector>

#include "latent/io/weights.h"
#include "nn/rms_norm.h"
#include "nn/state.h"

namespace latent::layers {

using torch::Tensor;

struct Conv {
  Tensor w, b;
  // For 3x3 (stride 1, padding 1) kernels that run faster by Winograd (winograd.h): the transformed kernel,
  // which then replaces w (keeping both would hold the weights twice).
  Tensor wino;
  static Conv load(WeightReader& r, const std::string& prefix, std::vector<int64_t> weight_shape);
  // Switches to the Winograd form when winograd_preferred() says so. Only for kernels used with stride 1 and
  // padding 1 in H and W.
  void prefer_winograd();
};

enum class TimePad {
  zeros,           // Wan: the clip is preceded by zero frames
  replicate_first  // CogVideoX: the first frame is repeated
};

// A convolution that is causal in time: each output frame sees its own and the kT-1 previous input frames. The
// last kT-1 frames of the time-padded input are carried to the next chunk, so a clip cut into chunks gives the
// convolution exactly the sequence it would see in one pass.
struct CausalConv3d {
  Conv conv;
  int64_t kt = 3, kh = 3, kw = 3;
  TimePad pad = TimePad::zeros;
  int slot = -1;  // -1 when kT == 1 (nothing to carry)

  static CausalConv3d load(WeightReader& r, const std::string& prefix, int64_t cin, int64_t cout,
                           std::array<int64_t, 3> k, TimePad pad, SlotAllocator& slots);
  Tensor forward(const Tensor& x, StateSlots& s) const;
  // Time-padding frames this conv wants allocated in front of its input; 0 where it reads the carried frames in
  // place anyway (Winograd) or runs off the CPU. A producer that makes them (silu_rms_norm_channels) spares
  // forward() the padded copy of the whole chunk, which costs thin models a large share of their time.
  int64_t headroom() const;
  // `padded` is [B, C, headroom() + T, H, W]; its first headroom() frames are scratch that this call fills with
  // the carried frames.
  Tensor forward_padded(const Tensor& padded, StateSlots& s) const;

 private:
  // The frames that precede this chunk: carried ones, or the clip's start padding.
  Tensor left_frames(const Tensor& x, const Tensor& history) const;
  // Stride 1, time already padded, H and W padded to keep their size; `halo` rows above and below already there
  // (a patch-parallel band) are consumed instead of padding.
  Tensor conv3d_same(const Tensor& x, const Conv& c, int64_t halo) const;
};

// conv(silu(rms_norm(x))), the Wan pattern, with the norm writing straight into the conv's padded input.
Tensor conv_silu_rms_norm(const CausalConv3d& conv, const Tensor& x, const Tensor& gamma, StateSlots& s);

// Applies a 2-D convolution to every frame of a [B, C, T, H, W] tensor (stride 1 and padding 1 when the
// kernel is in the Winograd form or the frames are a patch-parallel band).
Tensor conv2d_per_frame(const Tensor& x, const Conv& c, int64_t stride, int64_t padding,
                        const parallel::RowShard* shard = nullptr);

// The downsamplers' 3x3 stride-2 convolution of every frame, after one zero column on the right and one zero row
// at the bottom (of the frame: a band takes its bottom row from the rank below).
Tensor conv2d_down2x_per_frame(const Tensor& x, const Conv& c, const parallel::RowShard* shard);

// Nearest-neighbour x2 upsampling of H and W of every frame. Pure repetition, so exact in any dtype (the
// references compute it in float32 for the same values).
Tensor upsample2x_per_frame(const Tensor& x);

// A convolution (2-D or 3-D by the kernel's rank) without LibTorch's size heuristic on the CPU: for float32
// it calls oneDNN directly, where LibTorch sends thin or short inputs (N*C*D*H <= 20480) to an im2col kernel
// that is several times slower on these models' layers (docs/performance.md). Elsewhere it is torch::convolution.
Tensor conv_direct(const Tensor& x, const Tensor& w, const Tensor& b, std::vector<int64_t> stride,
                   std::vector<int64_t> padding);

// Pointwise (1x1x1) 3-D convolution.
Tensor conv1x1x1(const Tensor& x, const Conv& c);

}  // namespace latent::layers
