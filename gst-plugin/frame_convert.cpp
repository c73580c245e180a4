#include "frame_convert.h"

#include <torch/types.h>

#include <stdexcept>

namespace latent::gst {
namespace {

torch::Tensor plane(const GstVideoFrame* f, int p, int64_t h, int64_t w, int64_t ps) {
  auto* data = static_cast<uint8_t*>(GST_VIDEO_FRAME_PLANE_DATA(f, p));
  const int64_t stride = GST_VIDEO_FRAME_PLANE_STRIDE(f, p);
  return torch::from_blob(data, {h, w, ps}, {stride, ps, 1}, torch::kByte);
}

torch::Tensor yuv_to_rgb(const GstVideoFrame* f, const torch::Tensor& y, const torch::Tensor& u,
                         const torch::Tensor& v) {
  gdouble kr = 0.299, kb = 0.114;
  gst_video_color_matrix_get_Kr_Kb(GST_VIDEO_INFO_COLORIMETRY(&f->info).matrix, &kr, &kb);
  gint offset[GST_VIDEO_MAX_COMPONENTS], scale[GST_VIDEO_MAX_COMPONENTS];
  gst_video_color_range_offsets(GST_VIDEO_INFO_COLORIMETRY(&f->info).range, f->info.finfo, offset, scale);
  auto yf = (y - offset[0]) / double(scale[0]);
  auto uf = (u - offset[1]) / double(scale[1]);
  auto vf = (v - offset[2]) / double(scale[2]);
  auto r = yf + 2 * (1 - kr) * vf;
  auto b = yf + 2 * (1 - kb) * uf;
  auto g = (yf - kr * r - kb * b) / (1 - kr - kb);
  return torch::stack({r, g, b}).clamp(0, 1);
}

torch::Tensor upsample_chroma(const torch::Tensor& c, int64_t h, int64_t w) {
  return c.repeat_interleave(2, 0).repeat_interleave(2, 1).slice(0, 0, h).slice(1, 0, w);
}

}  // namespace

torch::Tensor frame_to_tensor(const GstVideoFrame* f, torch::Device device) {
  const int64_t h = GST_VIDEO_FRAME_HEIGHT(f), w = GST_VIDEO_FRAME_WIDTH(f);
  const auto format = GST_VIDEO_FRAME_FORMAT(f);
  torch::Tensor rgb01;
  if (format == GST_VIDEO_FORMAT_I420 || format == GST_VIDEO_FORMAT_NV12) {
    const int64_t ch = (h + 1) / 2, cw = (w + 1) / 2;
    auto y = plane(f, 0, h, w, 1).select(2, 0).to(device).to(torch::kFloat);
    torch::Tensor u, v;
    if (format == GST_VIDEO_FORMAT_I420) {
      u = plane(f, 1, ch, cw, 1).select(2, 0);
      v = plane(f, 2, ch, cw, 1).select(2, 0);
    } else {
      auto uv = plane(f, 1, ch, cw, 2);
      u = uv.select(2, 0);
      v = uv.select(2, 1);
    }
    u = upsample_chroma(u.to(device).to(torch::kFloat), h, w);
    v = upsample_chroma(v.to(device).to(torch::kFloat), h, w);
    rgb01 = yuv_to_rgb(f, y, u, v);
  } else if (GST_VIDEO_FORMAT_INFO_IS_RGB(f->info.finfo) && GST_VIDEO_FRAME_N_PLANES(f) == 1) {
    const int64_t ps = GST_VIDEO_FRAME_COMP_PSTRIDE(f, 0);
    auto pixels = plane(f, 0, h, w, ps);
    auto index =
        torch::tensor({int64_t(GST_VIDEO_FRAME_COMP_POFFSET(f, 0)), int64_t(GST_VIDEO_FRAME_COMP_POFFSET(f, 1)),
                       int64_t(GST_VIDEO_FRAME_COMP_POFFSET(f, 2))});
    // Only the three colour bytes leave the CPU; the rest of the conversion runs on the device.
    rgb01 = pixels.index_select(2, index).to(device).permute({2, 0, 1}).to(torch::kFloat) / 255.0;
  } else {
    throw std::invalid_argument(std::string("unsupported video format ") +
                                gst_video_format_to_string(GST_VIDEO_FRAME_FORMAT(f)));
  }
  return rgb01 * 2 - 1;
}

void rgb8_to_frame(const torch::Tensor& rgb, GstVideoFrame* f) {
  const int64_t h = GST_VIDEO_FRAME_HEIGHT(f), w = GST_VIDEO_FRAME_WIDTH(f);
  if (rgb.dim() != 3 || rgb.size(0) != h || rgb.size(1) != w || rgb.size(2) != 3)
    throw std::invalid_argument("decoded frame size does not match the output caps");
  const int64_t ps = GST_VIDEO_FRAME_COMP_PSTRIDE(f, 0);
  auto out = plane(f, 0, h, w, ps);
  if (ps > 3) out.fill_(255);  // alpha or padding
  for (int c = 0; c < 3; ++c) out.select(2, GST_VIDEO_FRAME_COMP_POFFSET(f, c)).copy_(rgb.select(2, c));
}

}  // namespace latent::gst
