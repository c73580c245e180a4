// Decoding the image with a small pipeline of its own: a still PNG or JPEG file, told by its first bytes, through
// its decoder alone. No typefinding and no demuxers: decodebin would follow a playlist's URLs or open an SDP's
// sockets for a file named .png. The size a file declares is checked before anything is decoded.
#include "generation_image.h"

#include <gst/gst.h>
#include <gst/video/video.h>
#include <torch/types.h>

#include <chrono>
#include <cstring>
#include <fstream>
#include <mutex>
#include <stdexcept>
#include <vector>

#include "latent/runtime/shared_models.h"
#include "latent/vae/streaming.h"
#include "latent/vae/vae.h"

namespace latent::gst {
namespace {

struct FirstFrame {
  std::mutex lock;
  torch::Tensor rgb;  // uint8 [H, W, 3]
};

void on_handoff(GstElement*, GstBuffer* buffer, GstPad* pad, gpointer data) {
  auto* first = static_cast<FirstFrame*>(data);
  std::lock_guard<std::mutex> guard(first->lock);
  if (first->rgb.defined()) return;
  GstCaps* caps = gst_pad_get_current_caps(pad);
  GstVideoInfo info;
  const bool known = caps && gst_video_info_from_caps(&info, caps);
  if (caps) gst_caps_unref(caps);
  GstVideoFrame frame;
  if (!known || !gst_video_frame_map(&frame, &info, buffer, GST_MAP_READ)) return;
  const int w = GST_VIDEO_FRAME_WIDTH(&frame), h = GST_VIDEO_FRAME_HEIGHT(&frame);
  const int stride = GST_VIDEO_FRAME_PLANE_STRIDE(&frame, 0);
  auto* data8 = static_cast<uint8_t*>(GST_VIDEO_FRAME_PLANE_DATA(&frame, 0));
  // Rows may be padded: copied row by row into a packed tensor.
  torch::Tensor rgb = torch::empty({h, w, 3}, torch::kUInt8);
  for (int y = 0; y < h; ++y) std::memcpy(rgb[y].data_ptr(), data8 + size_t(y) * size_t(stride), size_t(w) * 3);
  gst_video_frame_unmap(&frame);
  first->rgb = rgb;
}

// Limits of what image= decodes: a picture's sides, its pixels (at 3 bytes each, 192 MiB decoded) and its file.
constexpr uint32_t kMaxSide = 16384;
constexpr uint64_t kMaxPixels = uint64_t(8192) * 8192;
constexpr uintmax_t kMaxFileBytes = uintmax_t(256) << 20;
constexpr auto kDecodeDeadline = std::chrono::seconds(60);

struct Declared {
  const char* decoder;  // the GStreamer element that decodes it
  uint32_t width = 0, height = 0;
};

uint32_t big_endian(const unsigned char* p, int bytes) {
  uint32_t v = 0;
  for (int i = 0; i < bytes; ++i) v = v << 8 | p[i];
  return v;
}

// The format and size the file declares (PNG's IHDR, JPEG's start of frame), or why it is not taken.
Declared declared_picture(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::vector<unsigned char> head(size_t(1) << 16);
  in.read(reinterpret_cast<char*>(head.data()), std::streamsize(head.size()));
  head.resize(size_t(in.gcount()));
  const auto refuse = [&](const std::string& why) {
    return std::invalid_argument("image " + path + ": " + why + " (image= takes a still picture: a PNG or JPEG file)");
  };
  static const unsigned char png[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  if (head.size() >= 24 && std::memcmp(head.data(), png, 8) == 0) {
    if (std::memcmp(head.data() + 12, "IHDR", 4) != 0) throw refuse("a PNG file without its header chunk");
    return {"pngdec", big_endian(head.data() + 16, 4), big_endian(head.data() + 20, 4)};
  }
  if (head.size() >= 4 && head[0] == 0xFF && head[1] == 0xD8 && head[2] == 0xFF) {
    // Markers up to the first start of frame (SOF0-SOF15 but DHT, JPG and DAC), each with its length.
    size_t i = 2;
    while (i + 9 < head.size() && head[i] == 0xFF) {
      const unsigned char marker = head[i + 1];
      if (marker == 0xFF) {
        ++i;
        continue;
      }
      const size_t length = big_endian(head.data() + i + 2, 2);
      if (marker >= 0xC0 && marker <= 0xCF && marker != 0xC4 && marker != 0xC8 && marker != 0xCC)
        return {"jpegdec", big_endian(head.data() + i + 7, 2), big_endian(head.data() + i + 5, 2)};
      if (length < 2) break;
      i += 2 + length;
    }
    throw refuse("a JPEG file whose size is not in its first 64 KiB");
  }
  throw refuse("not a PNG or JPEG file by its first bytes");
}

}  // namespace

torch::Tensor read_image(const std::string& path, int width, int height) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec))
    throw std::invalid_argument("image " + path + ": no such file");
  if (const uintmax_t bytes = std::filesystem::file_size(path, ec); !ec && bytes > kMaxFileBytes)
    throw std::invalid_argument("image " + path + ": " + std::to_string(bytes >> 20) + " MiB, more than the " +
                                std::to_string(kMaxFileBytes >> 20) + " MiB a picture is given");
  const Declared picture = declared_picture(path);
  if (picture.width == 0 || picture.height == 0 || picture.width > kMaxSide || picture.height > kMaxSide ||
      uint64_t(picture.width) * picture.height > kMaxPixels)
    throw std::invalid_argument("image " + path + ": declares " + std::to_string(picture.width) + "x" +
                                std::to_string(picture.height) + " pixels; a picture is taken up to " +
                                std::to_string(kMaxSide) + " a side and " + std::to_string(kMaxPixels >> 20) +
                                " megapixels");
  const std::string description =
      "filesrc name=src ! " + std::string(picture.decoder) +
      " ! videoconvert ! videoscale method=lanczos ! video/x-raw,format=RGB,width=" + std::to_string(width) +
      ",height=" + std::to_string(height) + ",pixel-aspect-ratio=1/1 ! fakesink name=sink " +
      "signal-handoffs=true sync=false";
  GError* error = nullptr;
  GstElement* pipeline = gst_parse_launch(description.c_str(), &error);
  if (!pipeline) {
    const std::string what = error ? error->message : "unknown error";
    g_clear_error(&error);
    throw std::runtime_error("image decoding pipeline: " + what);
  }
  g_clear_error(&error);
  GstElement* src = gst_bin_get_by_name(GST_BIN(pipeline), "src");
  GstElement* sink = gst_bin_get_by_name(GST_BIN(pipeline), "sink");
  g_object_set(src, "location", path.c_str(), nullptr);
  FirstFrame first;
  g_signal_connect(sink, "handoff", G_CALLBACK(on_handoff), &first);
  gst_object_unref(src);
  gst_object_unref(sink);

  std::string failure;
  gst_element_set_state(pipeline, GST_STATE_PLAYING);
  GstBus* bus = gst_element_get_bus(pipeline);
  // Until the first frame, the end, an error or the deadline.
  const auto deadline = std::chrono::steady_clock::now() + kDecodeDeadline;
  for (;;) {
    if (std::chrono::steady_clock::now() > deadline) {
      failure = "not decoded within " + std::to_string(kDecodeDeadline.count()) + " s";
      break;
    }
    GstMessage* msg =
        gst_bus_timed_pop_filtered(bus, 50 * GST_MSECOND, GstMessageType(GST_MESSAGE_EOS | GST_MESSAGE_ERROR));
    {
      std::lock_guard<std::mutex> guard(first.lock);
      if (first.rgb.defined()) {
        if (msg) gst_message_unref(msg);
        break;
      }
    }
    if (!msg) continue;
    if (GST_MESSAGE_TYPE(msg) == GST_MESSAGE_ERROR) {
      GError* err = nullptr;
      gst_message_parse_error(msg, &err, nullptr);
      failure = err ? err->message : "decoding failed";
      g_clear_error(&err);
    } else {
      failure = "no picture in it";
    }
    gst_message_unref(msg);
    break;
  }
  gst_object_unref(bus);
  gst_element_set_state(pipeline, GST_STATE_NULL);
  gst_object_unref(pipeline);
  std::lock_guard<std::mutex> guard(first.lock);
  if (!first.rgb.defined())
    throw std::invalid_argument("image " + path + ": cannot be read as a picture: " +
                                (failure.empty() ? "no frame" : failure));
  // diffusers' VaeImageProcessor: u8 / 255, then 2 x - 1, in float32.
  return first.rgb.permute({2, 0, 1}).unsqueeze(0).to(torch::kFloat).div(255.0).mul(2.0).sub(1.0);
}

torch::Tensor encode_image(const torch::Tensor& rgb, const std::filesystem::path& model_dir,
                           const DenoiserSpec& spec, torch::Device device) {
  std::error_code ec;
  const std::filesystem::path vae_dir =
      std::filesystem::is_directory(model_dir / "vae", ec) ? model_dir / "vae" : model_dir;
  // Shared with a vaedecode of the same folder on the same device, which then loads nothing.
  std::shared_ptr<const Vae> vae = shared_vae(vae_dir, {device, torch::kFloat});
  if (vae->spec().model_id != spec.latent_space || vae->spec().latent_channels != spec.channels)
    throw std::invalid_argument("image: the VAE in " + vae_dir.string() + " makes " + vae->spec().model_id +
                                " latents of " + std::to_string(vae->spec().latent_channels) +
                                " channels; the model takes " + spec.latent_space + " latents of " +
                                std::to_string(spec.channels));
  StreamingEncoder encoder(vae);  // the posterior mean, normalised to diffusion space
  EncodedLatents first = encoder.push(rgb);
  EncodedLatents rest = encoder.finish();
  const torch::Tensor latents = first.size() > 0 ? first.latents : rest.latents;  // [T', C, h, w]
  if (latents.size(0) != 1)
    throw std::runtime_error("image: the VAE made " + std::to_string(latents.size(0)) + " latents of one picture");
  return latents.to(torch::kFloat).permute({1, 0, 2, 3}).unsqueeze(0);  // [1, C, 1, h, w]
}

}  // namespace latent::gst
