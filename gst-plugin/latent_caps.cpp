#include "latent_caps.h"

#include <limits>
#include <stdexcept>

namespace latent::gst {
namespace {

// Bounds that keep every size computed from caps far from overflow while leaving room for any real model.
constexpr int kMaxChannels = 65536;
constexpr int kMaxLatentSide = 65536;
constexpr int kMaxFactor = 1024;
constexpr int kMaxVideoSide = std::numeric_limits<int>::max();

bool fail(std::string* error, std::string message) {
  if (error) *error = std::move(message);
  return false;
}

std::nullopt_t refuse(std::string* error, std::string message) {
  fail(error, std::move(message));
  return std::nullopt;
}

bool read_int(const GstStructure* s, const char* field, int lo, int hi, int* out, std::string* error) {
  if (!gst_structure_has_field(s, field)) return fail(error, std::string("field '") + field + "' is missing");
  if (!gst_structure_get_int(s, field, out)) {
    const GValue* v = gst_structure_get_value(s, field);
    return fail(error, std::string("field '") + field + "' must be a fixed int, not " + G_VALUE_TYPE_NAME(v));
  }
  if (*out < lo || *out > hi) {
    return fail(error, std::string("field '") + field + "' is " + std::to_string(*out) + ", outside [" +
                           std::to_string(lo) + ", " + std::to_string(hi) + "]");
  }
  return true;
}

bool read_fraction(const GstStructure* s, const char* field, Fraction* out, std::string* error) {
  if (!gst_structure_has_field(s, field)) return fail(error, std::string("field '") + field + "' is missing");
  if (!gst_structure_get_fraction(s, field, &out->num, &out->den)) {
    const GValue* v = gst_structure_get_value(s, field);
    return fail(error, std::string("field '") + field + "' must be a fixed fraction, not " + G_VALUE_TYPE_NAME(v));
  }
  if (out->num < 0 || out->den <= 0) {
    return fail(error, std::string("field '") + field + "' is " + std::to_string(out->num) + "/" +
                           std::to_string(out->den) + ", not a frame rate");
  }
  return true;
}

std::string fraction_text(Fraction f) { return std::to_string(f.num) + "/" + std::to_string(f.den); }

void set_int_range(GstStructure* s, const char* field, int lo, int hi) {
  GValue v = G_VALUE_INIT;
  g_value_init(&v, GST_TYPE_INT_RANGE);
  gst_value_set_int_range(&v, lo, hi);
  gst_structure_take_value(s, field, &v);
}

void set_fraction_range(GstStructure* s, const char* field) {
  GValue v = G_VALUE_INIT;
  g_value_init(&v, GST_TYPE_FRACTION_RANGE);
  gst_value_set_fraction_range_full(&v, 0, 1, G_MAXINT, 1);
  gst_structure_take_value(s, field, &v);
}

}  // namespace

const char* format_name(LatentFormat format) {
  switch (format) {
    case LatentFormat::F32: return "F32";
    case LatentFormat::F16: return "F16";
    case LatentFormat::BF16: return "BF16";
  }
  return "?";
}

std::optional<LatentFormat> format_from_name(std::string_view name) {
  if (name == "F32") return LatentFormat::F32;
  if (name == "F16") return LatentFormat::F16;
  if (name == "BF16") return LatentFormat::BF16;
  return std::nullopt;
}

size_t element_size(LatentFormat format) { return format == LatentFormat::F32 ? 4 : 2; }

c10::ScalarType scalar_type(LatentFormat format) {
  switch (format) {
    case LatentFormat::F32: return c10::kFloat;
    case LatentFormat::F16: return c10::kHalf;
    case LatentFormat::BF16: return c10::kBFloat16;
  }
  return c10::kFloat;
}

std::optional<LatentCapsInfo> LatentCapsInfo::from_caps(const GstCaps* caps, std::string* error) {
  if (!caps) return refuse(error, "no caps");
  if (gst_caps_get_size(caps) != 1) {
    return refuse(error, "expected one structure, got " + std::to_string(gst_caps_get_size(caps)));
  }
  if (!gst_caps_is_fixed(caps)) return refuse(error, "caps are not fixed");
  return from_structure(gst_caps_get_structure(caps, 0), error);
}

std::optional<LatentCapsInfo> LatentCapsInfo::from_string(const std::string& text, std::string* error) {
  GstCaps* caps = gst_caps_from_string(text.c_str());
  if (!caps) return refuse(error, "'" + text + "' is not a caps string");
  auto info = from_caps(caps, error);
  gst_caps_unref(caps);
  return info;
}

std::optional<LatentCapsInfo> LatentCapsInfo::from_structure(const GstStructure* s, std::string* error) {
  if (!s) return refuse(error, "no caps");
  if (!gst_structure_has_name(s, kLatentMediaType)) {
    return refuse(error, std::string("media type is ") + gst_structure_get_name(s) + ", not " + kLatentMediaType);
  }
  LatentCapsInfo info;
  const char* model = gst_structure_get_string(s, "model");
  if (!model || !*model) return refuse(error, "field 'model' is missing or not a non-empty string");
  info.model = model;
  const char* format = gst_structure_get_string(s, "format");
  if (!format) return refuse(error, "field 'format' is missing or not a fixed string");
  auto f = format_from_name(format);
  if (!f) return refuse(error, std::string("format '") + format + "' is not one of F32, F16, BF16");
  info.format = *f;

  bool ok = read_int(s, "channels", 1, kMaxChannels, &info.channels, error) &&
            read_int(s, "width", 1, kMaxLatentSide, &info.width, error) &&
            read_int(s, "height", 1, kMaxLatentSide, &info.height, error) &&
            read_fraction(s, "framerate", &info.framerate, error) &&
            read_int(s, "temporal-factor", 1, kMaxFactor, &info.temporal_factor, error) &&
            read_int(s, "spatial-factor", 1, kMaxFactor, &info.spatial_factor, error) &&
            read_int(s, "video-width", 1, kMaxVideoSide, &info.video_width, error) &&
            read_int(s, "video-height", 1, kMaxVideoSide, &info.video_height, error) &&
            read_fraction(s, "video-framerate", &info.video_framerate, error);
  if (!ok) return std::nullopt;

  // The latent grid must be the video grid divided by the factors (rounded up, for encoders that pad), or a
  // decoder would restore a video of the wrong size.
  auto latent_side = [&](int video) { return (int64_t(video) + info.spatial_factor - 1) / info.spatial_factor; };
  if (latent_side(info.video_width) != info.width || latent_side(info.video_height) != info.height) {
    return refuse(error, "latent size " + std::to_string(info.width) + "x" + std::to_string(info.height) +
                             " does not match video size " + std::to_string(info.video_width) + "x" +
                             std::to_string(info.video_height) + " divided by spatial-factor " +
                             std::to_string(info.spatial_factor));
  }
  if (int64_t(info.framerate.num) * info.video_framerate.den * info.temporal_factor !=
      int64_t(info.video_framerate.num) * info.framerate.den) {
    return refuse(error, "framerate " + fraction_text(info.framerate) + " is not video-framerate " +
                             fraction_text(info.video_framerate) + " divided by temporal-factor " +
                             std::to_string(info.temporal_factor));
  }
  return info;
}

GstCaps* LatentCapsInfo::to_caps() const {
  return gst_caps_new_simple(kLatentMediaType,                                              //
                             "model", G_TYPE_STRING, model.c_str(),                         //
                             "format", G_TYPE_STRING, format_name(format),                  //
                             "channels", G_TYPE_INT, channels,                              //
                             "width", G_TYPE_INT, width,                                    //
                             "height", G_TYPE_INT, height,                                  //
                             "framerate", GST_TYPE_FRACTION, framerate.num, framerate.den,  //
                             "temporal-factor", G_TYPE_INT, temporal_factor,                //
                             "spatial-factor", G_TYPE_INT, spatial_factor,                  //
                             "video-width", G_TYPE_INT, video_width,                        //
                             "video-height", G_TYPE_INT, video_height,                      //
                             "video-framerate", GST_TYPE_FRACTION, video_framerate.num, video_framerate.den, nullptr);
}

std::string LatentCapsInfo::to_string() const {
  GstCaps* caps = to_caps();
  gchar* text = gst_caps_to_string(caps);
  std::string out(text);
  g_free(text);
  gst_caps_unref(caps);
  return out;
}

size_t LatentCapsInfo::frame_bytes() const {
  return size_t(channels) * size_t(height) * size_t(width) * element_size();
}

GstClockTime LatentCapsInfo::frame_duration() const {
  if (framerate.num <= 0) return GST_CLOCK_TIME_NONE;
  return gst_util_uint64_scale_int(GST_SECOND, framerate.den, framerate.num);
}

std::string latent_template_caps_string(std::string_view model) {
  GstStructure* s = gst_structure_new_empty(kLatentMediaType);
  if (!model.empty()) gst_structure_set(s, "model", G_TYPE_STRING, std::string(model).c_str(), nullptr);
  GValue formats = G_VALUE_INIT;
  gst_value_list_init(&formats, 3);
  for (auto f : {LatentFormat::F32, LatentFormat::F16, LatentFormat::BF16}) {
    GValue v = G_VALUE_INIT;
    g_value_init(&v, G_TYPE_STRING);
    g_value_set_static_string(&v, format_name(f));
    gst_value_list_append_and_take_value(&formats, &v);
  }
  gst_structure_take_value(s, "format", &formats);
  set_int_range(s, "channels", 1, kMaxChannels);
  set_int_range(s, "width", 1, kMaxLatentSide);
  set_int_range(s, "height", 1, kMaxLatentSide);
  set_fraction_range(s, "framerate");
  set_int_range(s, "temporal-factor", 1, kMaxFactor);
  set_int_range(s, "spatial-factor", 1, kMaxFactor);
  set_int_range(s, "video-width", 1, kMaxVideoSide);
  set_int_range(s, "video-height", 1, kMaxVideoSide);
  set_fraction_range(s, "video-framerate");
  GstCaps* caps = gst_caps_new_full(s, nullptr);
  gchar* text = gst_caps_to_string(caps);
  std::string out(text);
  g_free(text);
  gst_caps_unref(caps);
  return out;
}

LatentFrameStamp read_stamp(const GstBuffer* buffer) {
  LatentFrameStamp st;
  st.pts = GST_BUFFER_PTS(buffer);
  st.duration = GST_BUFFER_DURATION(buffer);
  st.first_frame = GST_BUFFER_OFFSET(buffer);
  st.end_frame = GST_BUFFER_OFFSET_END(buffer);
  return st;
}

void apply_stamp(GstBuffer* buffer, const LatentFrameStamp& stamp) {
  GST_BUFFER_PTS(buffer) = stamp.pts;
  GST_BUFFER_DURATION(buffer) = stamp.duration;
  GST_BUFFER_OFFSET(buffer) = stamp.first_frame;
  GST_BUFFER_OFFSET_END(buffer) = stamp.end_frame;
}

torch::Tensor frame_tensor_view(const LatentCapsInfo& info, const GstMapInfo& map) {
  if (map.size != info.frame_bytes()) {
    throw std::invalid_argument("a latent buffer of " + std::to_string(map.size) + " bytes, but the caps say " +
                                std::to_string(info.frame_bytes()) + " bytes per frame (" +
                                std::to_string(info.channels) + "x" + std::to_string(info.height) + "x" +
                                std::to_string(info.width) + " " + format_name(info.format) + ")");
  }
  return torch::from_blob(map.data, info.frame_shape(), torch::TensorOptions().dtype(info.scalar_type()));
}

GstBuffer* buffer_wrapping_tensor(const torch::Tensor& tensor) {
  if (!tensor.defined() || !tensor.device().is_cpu() || !tensor.is_contiguous() || tensor.nbytes() == 0) {
    throw std::invalid_argument("only a non-empty contiguous CPU tensor can back a buffer");
  }
  auto* keep = new torch::Tensor(tensor);
  size_t size = keep->nbytes();
  // Read-only: the storage may be shared (a file mapping, another buffer); a writer gets a copy from GStreamer.
  return gst_buffer_new_wrapped_full(GST_MEMORY_FLAG_READONLY, keep->data_ptr(), size, 0, size, keep,
                                     [](gpointer p) { delete static_cast<torch::Tensor*>(p); });
}

std::optional<LocationPattern> LocationPattern::parse(const std::string& location, std::string* error) {
  LocationPattern p;
  p.location_ = location;
  if (location.empty()) return refuse(error, "the location is empty");
  std::string* out = &p.prefix_;
  for (size_t i = 0; i < location.size(); ++i) {
    char c = location[i];
    if (c != '%') {
      out->push_back(c);
      continue;
    }
    size_t start = i++;
    if (i < location.size() && location[i] == '%') {
      out->push_back('%');
      continue;
    }
    for (; i < location.size() && std::string_view("-0+ ").find(location[i]) != std::string_view::npos; ++i) {
      char flag = location[i];
      if (flag == '-') p.left_align_ = true;
      if (flag == '0') p.zero_pad_ = true;
      if (flag == '+' || (flag == ' ' && p.sign_ != '+')) p.sign_ = flag;
    }
    unsigned width = 0;
    for (; i < location.size() && location[i] >= '0' && location[i] <= '9'; ++i) {
      width = width * 10 + unsigned(location[i] - '0');
      if (width > 64) return refuse(error, "the field width in '" + location + "' is above 64");
    }
    // Length modifiers change nothing here: the index is formatted from a 64-bit value whatever they say.
    for (int n = 0;
         n < 2 && i < location.size() && std::string_view("hlzj").find(location[i]) != std::string_view::npos; ++n)
      ++i;
    if (i >= location.size()) {
      return refuse(error, "'" + location + "' ends in an unfinished %-conversion; write %% for a literal %");
    }
    char conv = location[i];
    if (conv != 'd' && conv != 'i' && conv != 'u') {
      return refuse(error, "'" + location + "' has the conversion '" + location.substr(start, i - start + 1) +
                               "'; only one integer conversion such as %05d is allowed (%% for a literal %)");
    }
    if (p.has_index_) {
      return refuse(error, "'" + location + "' has more than one %-conversion; only one file index is allowed");
    }
    if (conv == 'u') p.sign_ = 0;
    p.has_index_ = true;
    p.width_ = width;
    out = &p.suffix_;
  }
  return p;
}

std::string LocationPattern::path_for(uint64_t index) const {
  if (!has_index_) return prefix_;
  std::string digits = std::to_string(index);
  std::string sign = sign_ ? std::string(1, sign_) : std::string();
  std::string number = sign + digits;
  if (number.size() < width_) {
    size_t pad = width_ - number.size();
    if (left_align_)
      number += std::string(pad, ' ');
    else if (zero_pad_)
      number = sign + std::string(pad, '0') + digits;
    else
      number = std::string(pad, ' ') + number;
  }
  return prefix_ + number + suffix_;
}

gboolean answer_caps_query(GstQuery* query, GstCaps* caps) {
  GstCaps* filter = nullptr;
  gst_query_parse_caps(query, &filter);
  if (filter) {
    GstCaps* both = gst_caps_intersect_full(filter, caps, GST_CAPS_INTERSECT_FIRST);
    gst_caps_unref(caps);
    caps = both;
  }
  gst_query_set_caps_result(query, caps);
  gst_caps_unref(caps);
  return TRUE;
}

gboolean accept_template_caps(GstPad* pad, GstQuery* query) {
  GstCaps* caps = nullptr;
  gst_query_parse_accept_caps(query, &caps);
  GstCaps* templ = gst_pad_get_pad_template_caps(pad);
  gst_query_set_accept_caps_result(query, gst_caps_is_fixed(caps) && gst_caps_is_subset(caps, templ));
  gst_caps_unref(templ);
  return TRUE;
}

}  // namespace latent::gst
