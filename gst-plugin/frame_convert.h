// Raw video frames <-> tensors. Colour conversion runs as tensor operations on the compute device, so a
// GPU pipeline uploads 8-bit planes and converts there.
#pragma once

#include <gst/video/video.h>
#include <torch/types.h>

namespace latent::gst {

// The formats vaeencode accepts and vaedecode produces, as a caps list string.
inline constexpr const char* kEncoderFormats =
    "{ RGB, BGR, RGBA, BGRA, ARGB, ABGR, RGBx, BGRx, xRGB, xBGR, I420, NV12 }";
inline constexpr const char* kDecoderFormats = "{ RGB, BGR, RGBA, BGRA, ARGB, ABGR, RGBx, BGRx, xRGB, xBGR }";

// One mapped frame -> float [3, H, W] RGB in [-1, 1] on `device`. YUV input is converted with the frame's
// colour matrix and range; chroma is upsampled by repetition.
torch::Tensor frame_to_tensor(const GstVideoFrame* frame, torch::Device device);

// uint8 RGB [H, W, 3] (CPU) -> the mapped (writable) frame, in its packed RGB-family format; padding and
// alpha bytes become 255.
void rgb8_to_frame(const torch::Tensor& rgb, GstVideoFrame* frame);

}  // namespace latent::gst
