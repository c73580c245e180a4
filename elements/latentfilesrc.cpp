#include "latentfilesrc.h"

#include <glib/gstdio.h>
#include <unistd.h>

#include <bit>
#include <cerrno>
#include <cstring>
#include <exception>
#include <optional>
#include <string>
#include <vector>

#include "elements.h"
#include "fixed_latents.h"
#include "latent/io/safetensors.h"
#include "latent_caps.h"

GST_DEBUG_CATEGORY_STATIC(latent_file_src_debug);
#define GST_CAT_DEFAULT latent_file_src_debug

// Frames go downstream as the file stores them, and the file is little-endian.
static_assert(std::endian::native == std::endian::little, "latent files are little-endian: add byte swapping here");

using latent::gst::LatentCapsInfo;
using latent::gst::LatentFrameStamp;
using latent::gst::LocationPattern;
namespace keys = latent::gst::file_keys;

namespace {

enum { PROP_0, PROP_LOCATION, PROP_INDEX, N_PROPS };
GParamSpec* properties[N_PROPS];

// Why a file cannot be played; decides the GError domain and code the user sees.
enum class Problem { kMissing, kUnreadable, kForeign, kCorrupt };

struct FileProblem {
  Problem kind;
  std::string message;  // names the file and the defect
};

struct LatentFile {
  std::string path;
  LatentCapsInfo info;
  torch::Tensor latents;  // [T', C, H', W'], viewing the file mapping
  std::vector<LatentFrameStamp> stamps;
  uint64_t next = 0;  // next frame to push
  uint64_t frames() const { return stamps.size(); }
};

std::string quoted(const std::string& path) { return "\"" + path + "\""; }

std::string shape_text(const latent::st::TensorEntry& e) {
  std::string s = std::string(latent::st::dtype_name(e.dtype)) + " [";
  for (size_t i = 0; i < e.shape.size(); ++i) s += (i ? ", " : "") + std::to_string(e.shape[i]);
  return s + "]";
}

// The reader's messages start with the path; the element's message names it already.
std::string without_path_prefix(const std::string& what, const std::string& path) {
  std::string prefix = path + ": ";
  return what.rfind(prefix, 0) == 0 ? what.substr(prefix.size()) : what;
}

std::optional<uint64_t> parse_u64(const std::string& text) {
  guint64 v = 0;
  if (!g_ascii_string_to_unsigned(text.c_str(), 10, 0, G_MAXUINT64, &v, nullptr)) return std::nullopt;
  return v;
}

[[noreturn]] void refuse(Problem kind, const std::string& path, const std::string& what) {
  throw FileProblem{kind, "Latent file " + quoted(path) + " " + what + "."};
}

// Opens and checks a whole file before a single frame is pushed: a file that disagrees with itself is refused
// rather than played as garbage.
LatentFile load_latent_file(const std::string& path) {
  if (!g_file_test(path.c_str(), G_FILE_TEST_EXISTS)) refuse(Problem::kMissing, path, "does not exist");
  if (g_access(path.c_str(), R_OK) != 0) {
    refuse(Problem::kUnreadable, path, std::string("cannot be opened for reading: ") + g_strerror(errno));
  }
  std::optional<latent::SafetensorsFile> file;
  try {
    file.emplace(latent::SafetensorsFile::open(path));
  } catch (const latent::SafetensorsError& e) {
    refuse(Problem::kForeign, path, "is not a valid safetensors file: " + without_path_prefix(e.what(), path));
  }
  const auto& meta = file->metadata();
  if (!file->contains(keys::kLatents)) {
    std::string names;
    for (const auto& n : file->names()) names += (names.empty() ? "" : ", ") + n;
    refuse(Problem::kForeign, path,
           std::string("has no '") + keys::kLatents + "' tensor (it holds: " + (names.empty() ? "none" : names) +
               "), so it is not a latent stream");
  }
  auto caps_it = meta.find(keys::kCaps);
  if (caps_it == meta.end()) {
    refuse(Problem::kForeign, path,
           std::string("has no '") + keys::kCaps + "' entry in its metadata, so its latents cannot be described");
  }
  if (auto v = meta.find(keys::kVersion); v != meta.end() && v->second != latent::gst::kLatentFileVersion) {
    refuse(Problem::kCorrupt, path,
           "has format version '" + v->second + "'; this build reads version " + latent::gst::kLatentFileVersion);
  }
  std::string why;
  auto info = LatentCapsInfo::from_string(caps_it->second, &why);
  if (!info) refuse(Problem::kCorrupt, path, "has invalid caps in its metadata: " + why);
  if (auto m = meta.find(keys::kModel); m != meta.end() && m->second != info->model) {
    refuse(Problem::kCorrupt, path,
           "names model '" + m->second + "' in its metadata but model '" + info->model + "' in its caps");
  }

  const auto& entry = file->entry(keys::kLatents);
  bool dtype_ok = latent::to_scalar_type(entry.dtype) == info->scalar_type();
  bool shape_ok = entry.shape.size() == 4 && entry.shape[1] == uint64_t(info->channels) &&
                  entry.shape[2] == uint64_t(info->height) && entry.shape[3] == uint64_t(info->width);
  if (!dtype_ok || !shape_ok) {
    refuse(Problem::kCorrupt, path,
           "holds '" + std::string(keys::kLatents) + "' as " + shape_text(entry) + ", but the caps in its metadata " +
               "describe " + latent::gst::format_name(info->format) + " frames [T', " + std::to_string(info->channels) +
               ", " + std::to_string(info->height) + ", " + std::to_string(info->width) + "]");
  }
  uint64_t frames = entry.shape[0];
  if (auto n = meta.find(keys::kFrames); n != meta.end() && parse_u64(n->second) != frames) {
    refuse(Problem::kCorrupt, path,
           "says " + n->second + " latent frames in its metadata, but '" + keys::kLatents + "' holds " +
               std::to_string(frames));
  }

  LatentFile out;
  out.path = path;
  out.info = *info;
  out.latents = file->tensor(keys::kLatents);
  out.stamps.resize(frames);
  if (file->contains(keys::kTiming)) {
    const auto& t = file->entry(keys::kTiming);
    if (t.dtype != latent::st::Dtype::U64 || t.shape != std::vector<uint64_t>{frames, 4}) {
      refuse(Problem::kCorrupt, path,
             "holds '" + std::string(keys::kTiming) + "' as " + shape_text(t) + ", expected U64 [" +
                 std::to_string(frames) + ", 4] for its " + std::to_string(frames) + " latent frames");
    }
    auto bytes = file->bytes(keys::kTiming);
    for (uint64_t i = 0; i < frames; ++i) {
      uint64_t row[4];
      std::memcpy(row, bytes.data() + i * sizeof row, sizeof row);
      out.stamps[i] = LatentFrameStamp{row[0], row[1], row[2], row[3]};
    }
  } else {
    // A file from another writer may carry no timing: frames follow each other at the latent frame rate.
    GstClockTime pts0 = 0;
    if (auto p = meta.find(keys::kPts0); p != meta.end()) {
      auto v = parse_u64(p->second);
      if (!v) refuse(Problem::kCorrupt, path, "has '" + p->second + "' as " + keys::kPts0 + ", not a time in ns");
      pts0 = *v;
    }
    // Scaled from the frame index, not summed, so rounding does not drift over a long file.
    auto at = [&](uint64_t i) {
      return pts0 + gst_util_uint64_scale(i, GST_SECOND * uint64_t(info->framerate.den), info->framerate.num);
    };
    for (uint64_t i = 0; i < frames; ++i) {
      if (info->framerate.num > 0) {
        out.stamps[i].pts = at(i);
        out.stamps[i].duration = at(i + 1) - at(i);
      } else {
        out.stamps[i].pts = i == 0 ? pts0 : GST_CLOCK_TIME_NONE;
      }
    }
  }
  return out;
}

struct Impl {
  // Settings, under the object lock.
  std::string location;
  guint index = 0;

  // Caps of the file being read, for caps queries from any thread; under the object lock.
  GstCaps* caps = nullptr;

  // Streaming state: the streaming thread, start() and stop() only.
  std::optional<LocationPattern> pattern;
  uint64_t next_index = 0;
  std::optional<LatentFile> file;
  bool first_buffer = true;
};

}  // namespace

struct _GstLatentFileSrc {
  GstPushSrc parent;
  Impl* impl;
};

G_DEFINE_TYPE_WITH_CODE(GstLatentFileSrc, gst_latent_file_src, GST_TYPE_PUSH_SRC,
                        GST_DEBUG_CATEGORY_INIT(latent_file_src_debug, "latentfilesrc", 0,
                                                "latent stream from safetensors files"));
GST_ELEMENT_REGISTER_DEFINE(latentfilesrc, "latentfilesrc", GST_RANK_NONE, GST_TYPE_LATENT_FILE_SRC);

namespace {

void post_problem(GstLatentFileSrc* self, const FileProblem& p) {
  switch (p.kind) {
    case Problem::kMissing: GST_ELEMENT_ERROR(self, RESOURCE, NOT_FOUND, ("%s", p.message.c_str()), (nullptr)); break;
    case Problem::kUnreadable:
      GST_ELEMENT_ERROR(self, RESOURCE, OPEN_READ, ("%s", p.message.c_str()), (nullptr));
      break;
    case Problem::kForeign: GST_ELEMENT_ERROR(self, STREAM, WRONG_TYPE, ("%s", p.message.c_str()), (nullptr)); break;
    case Problem::kCorrupt: GST_ELEMENT_ERROR(self, STREAM, DECODE, ("%s", p.message.c_str()), (nullptr)); break;
  }
}

// Loads the file at the current index; false after posting an error.
bool open_current(GstLatentFileSrc* self) {
  Impl& impl = *self->impl;
  std::string path = impl.pattern->path_for(impl.next_index);
  try {
    impl.file.emplace(load_latent_file(path));
  } catch (const FileProblem& p) {
    post_problem(self, p);
    return false;
  }
  GST_INFO_OBJECT(self, "reading %s: %" G_GUINT64_FORMAT " latent frames, %s", path.c_str(), impl.file->frames(),
                  impl.file->info.to_string().c_str());
  GstCaps* caps = impl.file->info.to_caps();
  GST_OBJECT_LOCK(self);
  gst_caps_replace(&impl.caps, caps);
  GST_OBJECT_UNLOCK(self);
  gst_caps_unref(caps);
  return true;
}

// Moves to the next file with frames. Returns GST_FLOW_EOS past the last file of the sequence.
GstFlowReturn advance(GstLatentFileSrc* self) {
  Impl& impl = *self->impl;
  while (!impl.file || impl.file->next >= impl.file->frames()) {
    if (impl.file) {
      impl.file.reset();
      if (!impl.pattern->has_index()) return GST_FLOW_EOS;
      ++impl.next_index;
      // The sequence ends at the first missing index; a later file that exists but is broken is still an error.
      std::string path = impl.pattern->path_for(impl.next_index);
      if (!g_file_test(path.c_str(), G_FILE_TEST_EXISTS)) {
        GST_INFO_OBJECT(self, "%s does not exist: end of the sequence", path.c_str());
        return GST_FLOW_EOS;
      }
    }
    if (!open_current(self)) return GST_FLOW_ERROR;
  }
  return GST_FLOW_OK;
}

GstFlowReturn create_frame(GstLatentFileSrc* self, GstBuffer** out) {
  Impl& impl = *self->impl;
  GstFlowReturn ret = advance(self);
  if (ret != GST_FLOW_OK) return ret;
  LatentFile& file = *impl.file;

  GstCaps* caps = file.info.to_caps();
  GstCaps* current = gst_pad_get_current_caps(GST_BASE_SRC_PAD(self));
  bool same = current && gst_caps_is_equal(current, caps);
  if (current) gst_caps_unref(current);
  if (!same && !gst_base_src_set_caps(GST_BASE_SRC(self), caps)) {
    GST_ELEMENT_ERROR(self, CORE, NEGOTIATION,
                      ("Downstream does not accept the caps of latent file \"%s\".", file.path.c_str()),
                      ("caps %" GST_PTR_FORMAT, caps));
    gst_caps_unref(caps);
    return GST_FLOW_NOT_NEGOTIATED;
  }
  gst_caps_unref(caps);

  const LatentFrameStamp& stamp = file.stamps[file.next];
  // The frame views the file mapping, which the buffer keeps alive: no copy.
  GstBuffer* buffer = latent::gst::buffer_wrapping_tensor(file.latents.select(0, int64_t(file.next)));
  latent::gst::apply_stamp(buffer, stamp);
  ++file.next;

  if (impl.first_buffer) {
    impl.first_buffer = false;
    GST_BUFFER_FLAG_SET(buffer, GST_BUFFER_FLAG_DISCONT);
    // Recorded timestamps may start anywhere (a live capture's running time); a segment starting there plays the
    // file at once while the buffers keep their timestamps.
    if (GST_CLOCK_TIME_IS_VALID(stamp.pts) && stamp.pts > 0) {
      GstSegment segment;
      gst_segment_init(&segment, GST_FORMAT_TIME);
      segment.start = segment.time = segment.position = stamp.pts;
      gst_base_src_new_segment(GST_BASE_SRC(self), &segment);
    }
  }
  *out = buffer;
  return GST_FLOW_OK;
}

GstFlowReturn src_create(GstPushSrc* push, GstBuffer** out) {
  auto* self = GST_LATENT_FILE_SRC(push);
  Impl& impl = *self->impl;
  try {
    return create_frame(self, out);
  } catch (const std::exception& e) {
    std::string path = impl.pattern ? impl.pattern->path_for(impl.next_index) : std::string("?");
    GST_ELEMENT_ERROR(self, STREAM, FAILED,
                      ("Could not read a frame of latent file \"%s\": %s", path.c_str(), e.what()), (nullptr));
  } catch (...) {
    GST_ELEMENT_ERROR(self, STREAM, FAILED, ("Could not read a frame of a latent file."), ("unknown exception"));
  }
  return GST_FLOW_ERROR;
}

gboolean src_start(GstBaseSrc* base) {
  auto* self = GST_LATENT_FILE_SRC(base);
  Impl& impl = *self->impl;
  GST_OBJECT_LOCK(self);
  std::string location = impl.location;
  guint index = impl.index;
  GST_OBJECT_UNLOCK(self);
  if (location.empty()) {
    GST_ELEMENT_ERROR(self, RESOURCE, NOT_FOUND, ("No file name specified for reading."),
                      ("set the location property"));
    return FALSE;
  }
  std::string why;
  impl.pattern = LocationPattern::parse(location, &why);
  if (!impl.pattern) {
    GST_ELEMENT_ERROR(self, RESOURCE, SETTINGS,
                      ("Invalid latent file location \"%s\": %s.", location.c_str(), why.c_str()), (nullptr));
    return FALSE;
  }
  impl.next_index = impl.pattern->has_index() ? index : 0;
  impl.first_buffer = true;
  // The first file is opened now, so a wrong path fails the state change and its caps are known for negotiation.
  try {
    return open_current(self);
  } catch (const std::exception& e) {
    GST_ELEMENT_ERROR(self, RESOURCE, OPEN_READ, ("Could not open latent file \"%s\": %s", location.c_str(), e.what()),
                      (nullptr));
  }
  return FALSE;
}

gboolean src_stop(GstBaseSrc* base) {
  auto* self = GST_LATENT_FILE_SRC(base);
  Impl& impl = *self->impl;
  impl.file.reset();
  impl.pattern.reset();
  GST_OBJECT_LOCK(self);
  gst_caps_replace(&impl.caps, nullptr);
  GST_OBJECT_UNLOCK(self);
  return TRUE;
}

// The open file's latents, or downstream told which latent spaces it takes instead.
gboolean src_negotiate(GstBaseSrc* base) {
  auto* self = GST_LATENT_FILE_SRC(base);
  Impl& impl = *self->impl;
  if (!impl.file) return GST_BASE_SRC_CLASS(gst_latent_file_src_parent_class)->negotiate(base);
  return latent::gst::negotiate_fixed_latents(base, impl.file->info, "Latent file \"" + impl.file->path + "\" holds");
}

GstCaps* src_get_caps(GstBaseSrc* base, GstCaps* filter) {
  auto* self = GST_LATENT_FILE_SRC(base);
  GST_OBJECT_LOCK(self);
  GstCaps* caps = self->impl->caps ? gst_caps_ref(self->impl->caps) : nullptr;
  GST_OBJECT_UNLOCK(self);
  if (!caps) caps = gst_pad_get_pad_template_caps(GST_BASE_SRC_PAD(base));
  if (filter) {
    GstCaps* both = gst_caps_intersect_full(filter, caps, GST_CAPS_INTERSECT_FIRST);
    gst_caps_unref(caps);
    caps = both;
  }
  return caps;
}

void src_set_property(GObject* object, guint id, const GValue* value, GParamSpec* pspec) {
  auto* self = GST_LATENT_FILE_SRC(object);
  Impl& impl = *self->impl;
  GST_OBJECT_LOCK(self);
  bool running = GST_STATE(self) > GST_STATE_READY;
  switch (id) {
    case PROP_LOCATION:
      if (running) {
        g_warning("latentfilesrc: changing the location while the element is running is not supported");
        break;
      }
      impl.location = g_value_get_string(value) ? g_value_get_string(value) : "";
      break;
    case PROP_INDEX:
      if (running) {
        g_warning("latentfilesrc: changing the index while the element is running is not supported");
        break;
      }
      impl.index = g_value_get_uint(value);
      break;
    default: G_OBJECT_WARN_INVALID_PROPERTY_ID(object, id, pspec); break;
  }
  GST_OBJECT_UNLOCK(self);
}

void src_get_property(GObject* object, guint id, GValue* value, GParamSpec* pspec) {
  auto* self = GST_LATENT_FILE_SRC(object);
  Impl& impl = *self->impl;
  GST_OBJECT_LOCK(self);
  switch (id) {
    case PROP_LOCATION: g_value_set_string(value, impl.location.empty() ? nullptr : impl.location.c_str()); break;
    case PROP_INDEX: g_value_set_uint(value, impl.index); break;
    default: G_OBJECT_WARN_INVALID_PROPERTY_ID(object, id, pspec); break;
  }
  GST_OBJECT_UNLOCK(self);
}

void src_finalize(GObject* object) {
  auto* self = GST_LATENT_FILE_SRC(object);
  gst_caps_replace(&self->impl->caps, nullptr);
  delete self->impl;
  G_OBJECT_CLASS(gst_latent_file_src_parent_class)->finalize(object);
}

}  // namespace

static void gst_latent_file_src_class_init(GstLatentFileSrcClass* klass) {
  auto* gobject_class = G_OBJECT_CLASS(klass);
  auto* element_class = GST_ELEMENT_CLASS(klass);
  auto* base_class = GST_BASE_SRC_CLASS(klass);
  auto* push_class = GST_PUSH_SRC_CLASS(klass);

  gobject_class->set_property = src_set_property;
  gobject_class->get_property = src_get_property;
  gobject_class->finalize = src_finalize;

  properties[PROP_LOCATION] = g_param_spec_string(
      "location", "File location",
      "Path of the latent safetensors file to read. With a printf-style integer pattern such as %05d, the numbered "
      "files are read in sequence from index until the first missing one; %% is a literal %",
      nullptr, GParamFlags(G_PARAM_READWRITE | G_PARAM_STATIC_STRINGS | GST_PARAM_MUTABLE_READY));
  properties[PROP_INDEX] = g_param_spec_uint(
      "index", "First file index", "Index of the first file to read when location holds a %05d-style pattern", 0,
      G_MAXUINT, 0, GParamFlags(G_PARAM_READWRITE | G_PARAM_STATIC_STRINGS | GST_PARAM_MUTABLE_READY));
  g_object_class_install_properties(gobject_class, N_PROPS, properties);

  GstCaps* caps = gst_caps_from_string(latent::gst::latent_template_caps_string().c_str());
  gst_element_class_add_pad_template(element_class, gst_pad_template_new("src", GST_PAD_SRC, GST_PAD_ALWAYS, caps));
  gst_caps_unref(caps);

  gst_element_class_set_static_metadata(
      element_class, "Latent file source", "Source/File",
      "Reads latent video streams written by latentfilesink: safetensors files holding tensor 'latents' "
      "[T', C, H', W'] and the caps in their metadata. Pushes one video/x-latent buffer per latent frame with the "
      "recorded timestamps and source frame ranges (OFFSET/OFFSET_END) restored, then EOS. With a %05d-style "
      "pattern in location it plays the numbered files one after the other from index until one is missing. Every "
      "file is checked when opened; a file that is not a latent stream, or whose tensor disagrees with its caps, "
      "stops the pipeline with an error naming the file and the defect. Example: gst-launch-1.0 latentfilesrc "
      "location=cam-%05d.safetensors ! vaedecode ! videoconvert ! autovideosink",
      "gst-latent developers");

  base_class->start = GST_DEBUG_FUNCPTR(src_start);
  base_class->stop = GST_DEBUG_FUNCPTR(src_stop);
  base_class->get_caps = GST_DEBUG_FUNCPTR(src_get_caps);
  base_class->negotiate = GST_DEBUG_FUNCPTR(src_negotiate);
  push_class->create = GST_DEBUG_FUNCPTR(src_create);
}

static void gst_latent_file_src_init(GstLatentFileSrc* self) {
  self->impl = new Impl();
  gst_base_src_set_format(GST_BASE_SRC(self), GST_FORMAT_TIME);
}
