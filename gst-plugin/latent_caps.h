// The GStreamer glue every latent element shares: the `video/x-latent` caps (docs/latent-caps.md), the conventions
// of one latent buffer, buffer <-> tensor views, and the naming and metadata of latent files.
#pragma once

#include <gst/gst.h>
#include <torch/types.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace latent::gst {

inline constexpr const char* kLatentMediaType = "video/x-latent";

enum class LatentFormat { F32, F16, BF16 };

const char* format_name(LatentFormat format);
std::optional<LatentFormat> format_from_name(std::string_view name);
size_t element_size(LatentFormat format);
c10::ScalarType scalar_type(LatentFormat format);

struct Fraction {
  int num = 0;
  int den = 1;
  bool operator==(const Fraction&) const = default;
};

// The fields of fixed `video/x-latent` caps. The latent grid (width, height, framerate) is what travels in the
// buffers; the video-* fields describe the source video the latents came from, so a decoder can restore it.
struct LatentCapsInfo {
  std::string model;
  LatentFormat format = LatentFormat::F32;
  int channels = 0;
  int width = 0;   // latent columns W'
  int height = 0;  // latent rows H'
  Fraction framerate{0, 1};
  int temporal_factor = 1;
  int spatial_factor = 1;
  int video_width = 0;
  int video_height = 0;
  Fraction video_framerate{0, 1};

  bool operator==(const LatentCapsInfo&) const = default;

  // Reads and validates fixed caps. On failure returns nullopt and, when `error` is given, says why in words
  // a user can act on (the offending field and its value).
  static std::optional<LatentCapsInfo> from_caps(const GstCaps* caps, std::string* error = nullptr);
  static std::optional<LatentCapsInfo> from_structure(const GstStructure* s, std::string* error = nullptr);
  // Parses a caps string (as stored in a latent file) with the same validation.
  static std::optional<LatentCapsInfo> from_string(const std::string& caps, std::string* error = nullptr);

  // Full ownership of the returned caps goes to the caller.
  GstCaps* to_caps() const;
  std::string to_string() const;

  size_t element_size() const { return gst::element_size(format); }
  c10::ScalarType scalar_type() const { return gst::scalar_type(format); }
  // C x H' x W' elements of element_size() bytes each.
  size_t frame_bytes() const;
  // The shape of one latent frame: {C, H', W'}.
  std::vector<int64_t> frame_shape() const { return {channels, height, width}; }
  // The time one latent frame covers at the latent frame rate; GST_CLOCK_TIME_NONE for a variable rate.
  GstClockTime frame_duration() const;
};

// A template caps string for pads carrying latents. An empty model accepts any model; a model id pins it,
// which is how an element refuses another model's latents at negotiation.
std::string latent_template_caps_string(std::string_view model = {});

// Answers a CAPS query with `caps` (taken) narrowed by the query's filter.
gboolean answer_caps_query(GstQuery* query, GstCaps* caps);
// Answers an ACCEPT_CAPS query on a pad that takes any fixed caps of its template: latents of another model then
// reach the caps event, whose refusal names both models, instead of a bare not-negotiated.
gboolean accept_template_caps(GstPad* pad, GstQuery* query);

// ---------------------------------------------------------------------------------------------------------------
// One buffer = one latent frame, C x H' x W' contiguous little-endian. PTS is the PTS of the first source frame it
// covers, DURATION the time it covers, OFFSET/OFFSET_END the source frame indices [first, last + 1) it covers.

struct LatentFrameStamp {
  GstClockTime pts = GST_CLOCK_TIME_NONE;
  GstClockTime duration = GST_CLOCK_TIME_NONE;
  uint64_t first_frame = GST_BUFFER_OFFSET_NONE;  // OFFSET
  uint64_t end_frame = GST_BUFFER_OFFSET_NONE;    // OFFSET_END

  bool has_frame_range() const {
    return first_frame != GST_BUFFER_OFFSET_NONE && end_frame != GST_BUFFER_OFFSET_NONE && end_frame >= first_frame;
  }
  // Source frames this latent frame stands for; 0 when the buffer carries no valid range.
  uint64_t source_frames() const { return has_frame_range() ? end_frame - first_frame : 0; }
  bool operator==(const LatentFrameStamp&) const = default;
};

LatentFrameStamp read_stamp(const GstBuffer* buffer);
// The buffer must be writable.
void apply_stamp(GstBuffer* buffer, const LatentFrameStamp& stamp);

// A [C, H', W'] tensor viewing mapped buffer memory without copying; valid only while the mapping is. Throws
// std::invalid_argument when the mapped size is not one frame of `info`.
torch::Tensor frame_tensor_view(const LatentCapsInfo& info, const GstMapInfo& map);
// A read-only buffer whose memory is the tensor's storage, kept alive by the buffer: no copy. The tensor must be
// a contiguous CPU tensor.
GstBuffer* buffer_wrapping_tensor(const torch::Tensor& tensor);

// ---------------------------------------------------------------------------------------------------------------
// Latent files (latentfilesink writes them, latentfilesrc reads them): safetensors with the stream in tensor
// `latents` [T', C, H', W'], per-frame timing in tensor `timing` [T', 4] U64 (pts, duration, offset, offset_end,
// with G_MAXUINT64 for "none"), and the caps and a summary in `__metadata__` under the keys below.

namespace file_keys {
inline constexpr const char* kLatents = "latents";
inline constexpr const char* kTiming = "timing";
inline constexpr const char* kVersion = "latent.version";
inline constexpr const char* kCaps = "latent.caps";
inline constexpr const char* kModel = "latent.model";
inline constexpr const char* kFormat = "latent.format";
inline constexpr const char* kVideoFramerate = "latent.video-framerate";
inline constexpr const char* kFrames = "latent.frames";
inline constexpr const char* kPts0 = "latent.pts0";
inline constexpr const char* kSourceFirst = "latent.source-first";
inline constexpr const char* kSourceEnd = "latent.source-end";
inline constexpr const char* kSourceFrames = "latent.source-frames";
inline constexpr const char* kFileIndex = "latent.file-index";
inline constexpr const char* kStreamFrame = "latent.stream-frame";
}  // namespace file_keys
inline constexpr const char* kLatentFileVersion = "1";

// A file location that may hold one printf-style integer conversion (`%05d`, `%d`, `%u`, `%i`), `%%` standing
// for a literal percent. Anything else after a `%` is refused, so a user string never reaches a real printf.
class LocationPattern {
 public:
  static std::optional<LocationPattern> parse(const std::string& location, std::string* error = nullptr);

  const std::string& location() const { return location_; }
  bool has_index() const { return has_index_; }
  std::string path_for(uint64_t index) const;

 private:
  std::string location_;
  std::string prefix_, suffix_;  // with `%%` already unescaped
  bool has_index_ = false;
  bool left_align_ = false;
  bool zero_pad_ = false;
  char sign_ = 0;  // '+', ' ' or none
  unsigned width_ = 0;
};

}  // namespace latent::gst
