#include "latentfilesink.h"

#include <atomic>
#include <bit>
#include <exception>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "buffer_map.h"
#include "elements.h"
#include "latent/io/safetensors.h"
#include "latent_caps.h"

GST_DEBUG_CATEGORY_STATIC(latent_file_sink_debug);
#define GST_CAT_DEFAULT latent_file_sink_debug

// Buffers are stored as they arrive and the timing rows as native u64; both must already be little-endian.
static_assert(std::endian::native == std::endian::little, "latent files are little-endian: add byte swapping here");

using latent::gst::LatentCapsInfo;
using latent::gst::LatentFrameStamp;
using latent::gst::LocationPattern;
namespace keys = latent::gst::file_keys;

namespace {

enum { PROP_0, PROP_LOCATION, PROP_MAX_FRAMES, PROP_FILES_WRITTEN, PROP_METADATA, N_PROPS };
GParamSpec* properties[N_PROPS];

// Touched by the streaming thread, and by start()/stop(), which never run while it streams.
struct Stream {
  std::optional<LocationPattern> pattern;
  guint max_frames = 0;
  std::optional<LatentCapsInfo> info;
  std::vector<std::pair<std::string, std::string>> extra_metadata;  // the metadata property, read at start

  // The file being written; no writer until its first frame, so an empty stream leaves no file behind.
  std::unique_ptr<latent::SafetensorsWriter> writer;
  std::string path;
  std::vector<uint64_t> timing;  // per frame: pts, duration, offset, offset_end
  uint64_t frames = 0;
  uint64_t source_frames = 0;
  uint64_t source_first = GST_BUFFER_OFFSET_NONE;
  uint64_t source_end = GST_BUFFER_OFFSET_NONE;

  uint64_t next_index = 0;     // index of the next file in the location pattern
  uint64_t stream_frames = 0;  // latent frames accepted since start, across files
  // Files committed since start or the last flush: without a pattern in the location a second one would replace
  // the first, so that is refused instead of losing data.
  unsigned files_this_stream = 0;

  void drop_file() {
    writer.reset();  // abandons the temporary file unless it was committed
    path.clear();
    timing.clear();
    frames = source_frames = 0;
    source_first = source_end = GST_BUFFER_OFFSET_NONE;
  }
};

struct Impl {
  // Settings, under the object lock.
  std::string location;
  guint max_frames = 0;
  GstStructure* metadata = nullptr;
  std::atomic<guint> files_written{0};
  Stream stream;
};

}  // namespace

struct _GstLatentFileSink {
  GstBaseSink parent;
  Impl* impl;
};

G_DEFINE_TYPE_WITH_CODE(GstLatentFileSink, gst_latent_file_sink, GST_TYPE_BASE_SINK,
                        GST_DEBUG_CATEGORY_INIT(latent_file_sink_debug, "latentfilesink", 0,
                                                "latent stream to safetensors files"));
GST_ELEMENT_REGISTER_DEFINE(latentfilesink, "latentfilesink", GST_RANK_NONE, GST_TYPE_LATENT_FILE_SINK);

namespace {

Stream& stream_of(GstLatentFileSink* self) { return self->impl->stream; }

// The writer's messages start with the path of the file (or of its temporary twin); the element's message names
// the file already, so the human text keeps only the reason and the debug text keeps everything.
std::string reason(const std::exception& e, const std::string& path) {
  std::string what = e.what();
  gchar* base = g_path_get_basename(path.c_str());
  std::string name = base;
  g_free(base);
  size_t colon = what.find(": ");
  if (colon != std::string::npos && what.substr(0, colon).find(name) != std::string::npos)
    return what.substr(colon + 2);
  return what;
}

void post_committed(GstLatentFileSink* self, const std::string& path, uint64_t index, uint64_t frames,
                    uint64_t source_frames) {
  GstStructure* s = gst_structure_new("latentfilesink-committed", "location", G_TYPE_STRING, path.c_str(), "index",
                                      G_TYPE_UINT64, index, "latent-frames", G_TYPE_UINT64, frames, "source-frames",
                                      G_TYPE_UINT64, source_frames, nullptr);
  gst_element_post_message(GST_ELEMENT(self), gst_message_new_element(GST_OBJECT(self), s));
}

// Finishes the open file, if any, and renames it into place: under its final name when the stream reached a
// boundary (EOS, max-frames, a caps change), else (`complete` false: stopped without EOS, after an error upstream or
// an interrupted capture) under "<name>.partial", whole frames kept but never passed off as the complete clip.
// Posts an error and returns false on failure; the temporary file is then removed and nothing already committed is
// touched.
bool commit_file(GstLatentFileSink* self, bool complete = true) {
  Stream& st = stream_of(self);
  if (!st.writer) return true;
  const LatentCapsInfo& info = *st.info;
  std::string path = complete ? st.path : st.path + ".partial";
  try {
    auto& w = *st.writer;
    w.write_bytes(keys::kTiming, latent::st::Dtype::U64, {st.frames, 4},
                  std::as_bytes(std::span<const uint64_t>(st.timing)));
    w.set_metadata(keys::kVersion, latent::gst::kLatentFileVersion);
    w.set_metadata(keys::kCaps, info.to_string());
    w.set_metadata(keys::kModel, info.model);
    w.set_metadata(keys::kFormat, latent::gst::format_name(info.format));
    w.set_metadata(keys::kVideoFramerate,
                   std::to_string(info.video_framerate.num) + "/" + std::to_string(info.video_framerate.den));
    w.set_metadata(keys::kFrames, std::to_string(st.frames));
    w.set_metadata(keys::kSourceFrames, std::to_string(st.source_frames));
    if (st.source_first != GST_BUFFER_OFFSET_NONE) w.set_metadata(keys::kSourceFirst, std::to_string(st.source_first));
    if (st.source_end != GST_BUFFER_OFFSET_NONE) w.set_metadata(keys::kSourceEnd, std::to_string(st.source_end));
    if (st.timing[0] != GST_CLOCK_TIME_NONE) w.set_metadata(keys::kPts0, std::to_string(st.timing[0]));
    w.set_metadata(keys::kFileIndex, std::to_string(st.next_index));
    w.set_metadata(keys::kStreamFrame, std::to_string(st.stream_frames - st.frames));
    for (const auto& [key, value] : st.extra_metadata) w.set_metadata(key, value);
    if (complete)
      w.commit();
    else
      w.commit_as(path);
  } catch (const std::exception& e) {
    GST_ELEMENT_ERROR(self, RESOURCE, WRITE,
                      ("Could not finish latent file \"%s\": %s", path.c_str(), reason(e, path).c_str()),
                      ("committing %" G_GUINT64_FORMAT " latent frames failed: %s", st.frames, e.what()));
    st.drop_file();
    return false;
  }
  if (!complete) {
    GST_WARNING_OBJECT(self, "stopped without EOS: %" G_GUINT64_FORMAT " latent frames kept as %s", st.frames,
                       path.c_str());
    st.drop_file();
    return true;
  }
  GST_INFO_OBJECT(self, "committed %s: %" G_GUINT64_FORMAT " latent frames, %" G_GUINT64_FORMAT " source frames",
                  path.c_str(), st.frames, st.source_frames);
  uint64_t index = st.next_index, frames = st.frames, source_frames = st.source_frames;
  st.drop_file();
  ++st.next_index;
  ++st.files_this_stream;
  self->impl->files_written.fetch_add(1);
  g_object_notify_by_pspec(G_OBJECT(self), properties[PROP_FILES_WRITTEN]);
  post_committed(self, path, index, frames, source_frames);
  return true;
}

bool open_file(GstLatentFileSink* self) {
  Stream& st = stream_of(self);
  std::string path = st.pattern->path_for(st.next_index);
  if (!st.pattern->has_index() && st.files_this_stream > 0) {
    GST_ELEMENT_ERROR(self, RESOURCE, SETTINGS,
                      ("The latent stream needs a second file, but location \"%s\" has no %%05d-style pattern to "
                       "number it.",
                       path.c_str()),
                      ("the caps changed after \"%s\" was committed; writing on would replace it", path.c_str()));
    return false;
  }
  latent::SafetensorsWriter::Options options;
  // Room for the metadata ahead of the data, so commit() writes the header in place.
  options.header_reserve = 16 * 1024;
  try {
    st.writer = std::make_unique<latent::SafetensorsWriter>(path, options);
  } catch (const std::exception& e) {
    GST_ELEMENT_ERROR(self, RESOURCE, OPEN_WRITE,
                      ("Could not open latent file \"%s\" for writing: %s", path.c_str(), e.what()), (nullptr));
    return false;
  }
  st.path = path;
  GST_DEBUG_OBJECT(self, "writing %s (temporary %s)", path.c_str(), st.writer->temp_path().c_str());
  return true;
}

GstFlowReturn render_frame(GstLatentFileSink* self, GstBuffer* buffer) {
  Stream& st = stream_of(self);
  if (!st.info) {
    GST_ELEMENT_ERROR(self, CORE, NEGOTIATION, ("Received a latent buffer before any caps."), (nullptr));
    return GST_FLOW_NOT_NEGOTIATED;
  }
  const LatentCapsInfo& info = *st.info;
  if (gst_buffer_get_size(buffer) != info.frame_bytes()) {
    GST_ELEMENT_ERROR(self, STREAM, FORMAT,
                      ("Latent buffer of %" G_GSIZE_FORMAT " bytes, but the caps describe frames of %" G_GSIZE_FORMAT
                       " bytes (%d x %d x %d %s).",
                       gst_buffer_get_size(buffer), info.frame_bytes(), info.channels, info.height, info.width,
                       latent::gst::format_name(info.format)),
                      ("buffer %" GST_PTR_FORMAT, buffer));
    return GST_FLOW_ERROR;
  }
  if (!st.writer && !open_file(self)) return GST_FLOW_ERROR;

  {
    latent::gst::BufferMap map(buffer, GST_MAP_READ);
    if (!map) {
      GST_ELEMENT_ERROR(self, RESOURCE, READ, ("Could not map a latent buffer for reading."), (nullptr));
      return GST_FLOW_ERROR;
    }
    try {
      st.writer->append(keys::kLatents, latent::gst::frame_tensor_view(info, map.info()).unsqueeze(0));
    } catch (const std::exception& e) {
      GST_ELEMENT_ERROR(self, RESOURCE, WRITE,
                        ("Could not write to latent file \"%s\": %s", st.path.c_str(), reason(e, st.path).c_str()),
                        ("%s", e.what()));
      st.drop_file();
      return GST_FLOW_ERROR;
    }
  }

  LatentFrameStamp stamp = latent::gst::read_stamp(buffer);
  st.timing.insert(st.timing.end(), {stamp.pts, stamp.duration, stamp.first_frame, stamp.end_frame});
  if (stamp.has_frame_range()) {
    if (st.source_first == GST_BUFFER_OFFSET_NONE) st.source_first = stamp.first_frame;
    st.source_end = stamp.end_frame;
    st.source_frames += stamp.source_frames();
  }
  ++st.frames;
  ++st.stream_frames;
  if (st.max_frames > 0 && st.frames >= st.max_frames && !commit_file(self)) return GST_FLOW_ERROR;
  return GST_FLOW_OK;
}

GstFlowReturn sink_render(GstBaseSink* sink, GstBuffer* buffer) {
  auto* self = GST_LATENT_FILE_SINK(sink);
  try {
    return render_frame(self, buffer);
  } catch (const std::exception& e) {
    GST_ELEMENT_ERROR(self, LIBRARY, FAILED, ("Writing a latent frame failed: %s", e.what()), (nullptr));
  } catch (...) {
    GST_ELEMENT_ERROR(self, LIBRARY, FAILED, ("Writing a latent frame failed."), ("unknown exception"));
  }
  stream_of(self).drop_file();
  return GST_FLOW_ERROR;
}

gboolean sink_set_caps(GstBaseSink* sink, GstCaps* caps) {
  auto* self = GST_LATENT_FILE_SINK(sink);
  Stream& st = stream_of(self);
  try {
    std::string why;
    auto info = LatentCapsInfo::from_caps(caps, &why);
    if (!info) {
      GST_ELEMENT_ERROR(self, CORE, NEGOTIATION, ("Invalid latent caps: %s.", why.c_str()),
                        ("caps: %" GST_PTR_FORMAT, caps));
      return FALSE;
    }
    if (st.info && *st.info == *info) return TRUE;
    // One file holds one caps: frames of another shape, dtype or model start a new file.
    if (st.writer) {
      GST_INFO_OBJECT(self, "caps changed mid-stream, finishing %s", st.path.c_str());
      if (!commit_file(self)) return FALSE;
    }
    st.info = std::move(info);
    return TRUE;
  } catch (const std::exception& e) {
    GST_ELEMENT_ERROR(self, LIBRARY, FAILED, ("Could not accept new caps: %s", e.what()), (nullptr));
  }
  return FALSE;
}

gboolean sink_event(GstBaseSink* sink, GstEvent* event) {
  auto* self = GST_LATENT_FILE_SINK(sink);
  Stream& st = stream_of(self);
  switch (GST_EVENT_TYPE(event)) {
    case GST_EVENT_EOS:
      if (!commit_file(self)) {
        gst_event_unref(event);
        return FALSE;
      }
      break;
    case GST_EVENT_FLUSH_STOP:
      // A flush discards data in flight; like filesink truncating, the unfinished file goes, the committed stay.
      if (st.writer)
        GST_INFO_OBJECT(self, "flush: abandoning %s (%" G_GUINT64_FORMAT " frames)", st.path.c_str(), st.frames);
      st.stream_frames -= st.frames;
      st.drop_file();
      st.files_this_stream = 0;
      break;
    default: break;
  }
  return GST_BASE_SINK_CLASS(gst_latent_file_sink_parent_class)->event(sink, event);
}

gboolean sink_start(GstBaseSink* sink) {
  auto* self = GST_LATENT_FILE_SINK(sink);
  Impl& impl = *self->impl;
  GST_OBJECT_LOCK(self);
  std::string location = impl.location;
  guint max_frames = impl.max_frames;
  std::vector<std::pair<std::string, std::string>> extra;
  bool reserved = false;
  std::string reserved_key;
  if (impl.metadata) {
    for (int i = 0; i < gst_structure_n_fields(impl.metadata); ++i) {
      const char* name = gst_structure_nth_field_name(impl.metadata, i);
      const GValue* v = gst_structure_get_value(impl.metadata, name);
      gchar* text = G_VALUE_HOLDS_STRING(v) ? g_value_dup_string(v) : gst_value_serialize(v);
      extra.emplace_back(name, text ? text : "");
      g_free(text);
      if (g_str_has_prefix(name, "latent.") && !reserved) {
        reserved = true;
        reserved_key = name;
      }
    }
  }
  GST_OBJECT_UNLOCK(self);

  if (reserved) {
    GST_ELEMENT_ERROR(self, RESOURCE, SETTINGS,
                      ("metadata field \"%s\" is refused: the latent.* keys describe the stream and are the sink's "
                       "own.",
                       reserved_key.c_str()),
                      (nullptr));
    return FALSE;
  }

  if (location.empty()) {
    GST_ELEMENT_ERROR(self, RESOURCE, NOT_FOUND, ("No file name specified for writing."),
                      ("set the location property"));
    return FALSE;
  }
  std::string why;
  auto pattern = LocationPattern::parse(location, &why);
  if (!pattern) {
    GST_ELEMENT_ERROR(self, RESOURCE, SETTINGS,
                      ("Invalid latent file location \"%s\": %s.", location.c_str(), why.c_str()), (nullptr));
    return FALSE;
  }
  if (max_frames > 0 && !pattern->has_index()) {
    GST_ELEMENT_ERROR(self, RESOURCE, SETTINGS,
                      ("max-frames=%u splits the stream into several files, but location \"%s\" has no %%05d-style "
                       "pattern to number them.",
                       max_frames, location.c_str()),
                      (nullptr));
    return FALSE;
  }
  // Refuse now rather than at the first frame, so a typo fails the state change like filesink does.
  std::string first = pattern->path_for(0);
  gchar* dir = g_path_get_dirname(first.c_str());
  bool dir_ok = g_file_test(dir, G_FILE_TEST_IS_DIR);
  if (!dir_ok) {
    GST_ELEMENT_ERROR(
        self, RESOURCE, OPEN_WRITE,
        ("Could not open latent file \"%s\" for writing: directory \"%s\" does not exist.", first.c_str(), dir),
        (nullptr));
  }
  g_free(dir);
  if (!dir_ok) return FALSE;

  Stream& st = impl.stream;
  st = Stream{};
  st.pattern = std::move(pattern);
  st.max_frames = max_frames;
  st.extra_metadata = std::move(extra);
  impl.files_written = 0;
  return TRUE;
}

gboolean sink_stop(GstBaseSink* sink) {
  auto* self = GST_LATENT_FILE_SINK(sink);
  Stream& st = stream_of(self);
  // Stopping without EOS (an error upstream, an interrupted live capture) keeps what was recorded, every frame
  // whole, but the final name is kept for a stream that ended.
  try {
    commit_file(self, false);
  } catch (...) {
    GST_ERROR_OBJECT(self, "unexpected exception while finishing the last file");
  }
  st.drop_file();
  st.info.reset();
  return TRUE;
}

void sink_set_property(GObject* object, guint id, const GValue* value, GParamSpec* pspec) {
  auto* self = GST_LATENT_FILE_SINK(object);
  Impl& impl = *self->impl;
  GST_OBJECT_LOCK(self);
  bool running = GST_STATE(self) > GST_STATE_READY;
  switch (id) {
    case PROP_LOCATION:
      if (running) {
        g_warning("latentfilesink: changing the location while the element is running is not supported");
        break;
      }
      impl.location = g_value_get_string(value) ? g_value_get_string(value) : "";
      break;
    case PROP_MAX_FRAMES:
      if (running) {
        g_warning("latentfilesink: changing max-frames while the element is running is not supported");
        break;
      }
      impl.max_frames = g_value_get_uint(value);
      break;
    case PROP_METADATA: {
      if (running) {
        g_warning("latentfilesink: changing metadata while the element is running is not supported");
        break;
      }
      const GstStructure* m = gst_value_get_structure(value);
      if (impl.metadata) gst_structure_free(impl.metadata);
      impl.metadata = m ? gst_structure_copy(m) : nullptr;
      break;
    }
    default: G_OBJECT_WARN_INVALID_PROPERTY_ID(object, id, pspec); break;
  }
  GST_OBJECT_UNLOCK(self);
}

void sink_get_property(GObject* object, guint id, GValue* value, GParamSpec* pspec) {
  auto* self = GST_LATENT_FILE_SINK(object);
  Impl& impl = *self->impl;
  GST_OBJECT_LOCK(self);
  switch (id) {
    case PROP_LOCATION: g_value_set_string(value, impl.location.empty() ? nullptr : impl.location.c_str()); break;
    case PROP_MAX_FRAMES: g_value_set_uint(value, impl.max_frames); break;
    case PROP_FILES_WRITTEN: g_value_set_uint(value, impl.files_written.load()); break;
    case PROP_METADATA: g_value_set_boxed(value, impl.metadata); break;
    default: G_OBJECT_WARN_INVALID_PROPERTY_ID(object, id, pspec); break;
  }
  GST_OBJECT_UNLOCK(self);
}

void sink_finalize(GObject* object) {
  Impl* impl = GST_LATENT_FILE_SINK(object)->impl;
  if (impl->metadata) gst_structure_free(impl->metadata);
  delete impl;
  G_OBJECT_CLASS(gst_latent_file_sink_parent_class)->finalize(object);
}

}  // namespace

static void gst_latent_file_sink_class_init(GstLatentFileSinkClass* klass) {
  auto* gobject_class = G_OBJECT_CLASS(klass);
  auto* element_class = GST_ELEMENT_CLASS(klass);
  auto* sink_class = GST_BASE_SINK_CLASS(klass);

  gobject_class->set_property = sink_set_property;
  gobject_class->get_property = sink_get_property;
  gobject_class->finalize = sink_finalize;

  properties[PROP_LOCATION] = g_param_spec_string(
      "location", "File location",
      "Path of the safetensors file to write. May hold one printf-style integer pattern such as %05d, replaced by "
      "the file index (0, 1, 2, ...) when the stream is split by max-frames or by a caps change; %% is a literal %",
      nullptr, GParamFlags(G_PARAM_READWRITE | G_PARAM_STATIC_STRINGS | GST_PARAM_MUTABLE_READY));
  properties[PROP_MAX_FRAMES] = g_param_spec_uint(
      "max-frames", "Maximum latent frames per file",
      "Start a new file every this many latent frames, so an endless live stream lands in bounded files "
      "(needs a %05d-style pattern in location); 0 writes one file per stream",
      0, G_MAXUINT, 0, GParamFlags(G_PARAM_READWRITE | G_PARAM_STATIC_STRINGS | GST_PARAM_MUTABLE_READY));
  properties[PROP_FILES_WRITTEN] =
      g_param_spec_uint("files-written", "Files written",
                        "Number of files committed under their final name since the element started (notified from "
                        "the streaming thread)",
                        0, G_MAXUINT, 0, GParamFlags(G_PARAM_READABLE | G_PARAM_STATIC_STRINGS));
  properties[PROP_METADATA] = g_param_spec_boxed(
      "metadata", "Extra metadata",
      "A structure whose fields are written into every file's __metadata__, each under its own name as a string "
      "(e.g. metadata=\"clip,caption=(string)\\\"a cat\\\",source=(string)cat.mp4\"); latent.* names are the "
      "sink's own and refused",
      GST_TYPE_STRUCTURE, GParamFlags(G_PARAM_READWRITE | G_PARAM_STATIC_STRINGS | GST_PARAM_MUTABLE_READY));
  g_object_class_install_properties(gobject_class, N_PROPS, properties);

  GstCaps* caps = gst_caps_from_string(latent::gst::latent_template_caps_string().c_str());
  gst_element_class_add_pad_template(element_class, gst_pad_template_new("sink", GST_PAD_SINK, GST_PAD_ALWAYS, caps));
  gst_caps_unref(caps);

  gst_element_class_set_static_metadata(
      element_class, "Latent file sink", "Sink/File",
      "Writes a latent video stream (video/x-latent, one buffer per latent frame) into safetensors files: the frames "
      "in tensor 'latents' [T', C, H', W'], their timestamps and source frame ranges in tensor 'timing' [T', 4], "
      "and the caps, model and frame counts in the metadata. Each file is written under a temporary name and "
      "renamed into place when it is complete (at EOS, every max-frames latent frames, when the caps change), so a "
      "crash or an error never leaves a partial file under the final name; stopped without EOS, the frames received "
      "are kept as <name>.partial. A stream without "
      "frames writes no file. latentfilesrc reads the files back. Example: gst-launch-1.0 -e v4l2src ! "
      "videoconvert ! vaeencode ! latentfilesink location=cam-%05d.safetensors max-frames=600",
      "gst-latent developers");

  sink_class->start = GST_DEBUG_FUNCPTR(sink_start);
  sink_class->stop = GST_DEBUG_FUNCPTR(sink_stop);
  sink_class->set_caps = GST_DEBUG_FUNCPTR(sink_set_caps);
  sink_class->event = GST_DEBUG_FUNCPTR(sink_event);
  sink_class->render = GST_DEBUG_FUNCPTR(sink_render);
}

static void gst_latent_file_sink_init(GstLatentFileSink* self) {
  self->impl = new Impl();
  // Writing a file has no reason to wait for the clock.
  gst_base_sink_set_sync(GST_BASE_SINK(self), FALSE);
}
