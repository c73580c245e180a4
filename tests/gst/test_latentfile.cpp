// latentfilesink and latentfilesrc through real pipelines (appsrc ! latentfilesink, latentfilesrc ! appsink), the
// files they exchange read back with the core reader, and the latent caps glue they share.

// The C++ and torch headers come first: check's function-like macros (fail, ...) would rewrite their members.
#include <sys/resource.h>

#include <algorithm>
#include <csignal>
#include <cstring>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "latent/io/safetensors.h"
#include "latent_caps.h"

#include <glib/gstdio.h>
#include <gst/app/gstappsink.h>
#include <gst/app/gstappsrc.h>
#include <gst/check/gstcheck.h>
#include <gst/check/gstharness.h>

namespace {

using latent::gst::LatentCapsInfo;
using latent::gst::LatentFrameStamp;
using latent::gst::LocationPattern;

const GstClockTime kVideoFrame = GST_SECOND / 24;

std::string caps_string(const char* format = "F32", int channels = 4) {
  return std::string("video/x-latent, model=(string)tiny, format=(string)") + format + ", channels=(int)" +
         std::to_string(channels) +
         ", width=(int)8, height=(int)6, framerate=(fraction)6/1, temporal-factor=(int)4, spatial-factor=(int)8, "
         "video-width=(int)64, video-height=(int)48, video-framerate=(fraction)24/1";
}

LatentCapsInfo info_of(const std::string& caps) {
  std::string why;
  auto info = LatentCapsInfo::from_string(caps, &why);
  fail_unless(info.has_value(), "test caps refused: %s", why.c_str());
  return *info;
}

struct Frame {
  std::vector<uint8_t> bytes;
  LatentFrameStamp stamp;
};

// Latent frames as a causal VAE emits them: the first covers source frame 0, each next one 4 frames, and the
// last a padded tail holding only 2 real frames. Arbitrary bytes: the files must carry them bit for bit.
std::vector<Frame> make_frames(const std::string& caps, int n, GstClockTime base_pts = 0, uint32_t seed = 1,
                               uint64_t first_source = 0) {
  LatentCapsInfo info = info_of(caps);
  std::vector<Frame> frames;
  uint32_t state = seed * 2654435761u + 12345u;
  for (int i = 0; i < n; ++i) {
    Frame f;
    f.bytes.resize(info.frame_bytes());
    for (auto& b : f.bytes) {
      state = state * 1664525u + 1013904223u;
      b = uint8_t(state >> 24);
    }
    uint64_t first = first_source + (i == 0 ? 0 : 1 + 4 * uint64_t(i - 1));
    uint64_t end = first_source + (i == 0 ? 1 : 1 + 4 * uint64_t(i));
    if (i == n - 1 && i > 0) end -= 2;
    f.stamp = {base_pts + (first - first_source) * kVideoFrame, (end - first) * kVideoFrame, first, end};
    frames.push_back(std::move(f));
  }
  return frames;
}

GstBuffer* make_buffer(const Frame& f) {
  GstBuffer* buf = gst_buffer_new_memdup(f.bytes.data(), f.bytes.size());
  latent::gst::apply_stamp(buf, f.stamp);
  return buf;
}

// A private directory, emptied and removed at the end of the test.
struct TempDir {
  std::string path;
  TempDir() {
    gchar* p = g_dir_make_tmp("latentfile-XXXXXX", nullptr);
    fail_unless(p != nullptr);
    path = p;
    g_free(p);
  }
  ~TempDir() {
    for (const auto& name : entries()) g_remove(file(name).c_str());
    g_rmdir(path.c_str());
  }
  std::string file(const std::string& name) const { return path + "/" + name; }
  std::vector<std::string> entries() const {
    std::vector<std::string> out;
    if (GDir* d = g_dir_open(path.c_str(), 0, nullptr)) {
      while (const gchar* n = g_dir_read_name(d)) out.push_back(n);
      g_dir_close(d);
    }
    std::sort(out.begin(), out.end());
    return out;
  }
};

struct RunResult {
  bool eos = false;
  bool error = false;
  std::string message;  // the error's human text
  std::string debug;
};

// Waits for EOS or ERROR; a pipeline that produces neither within the limit counts as a hang.
RunResult wait_bus(GstElement* pipeline, GstClockTime timeout = 30 * GST_SECOND) {
  RunResult r;
  GstBus* bus = gst_element_get_bus(pipeline);
  GstMessage* msg = gst_bus_timed_pop_filtered(bus, timeout, GstMessageType(GST_MESSAGE_EOS | GST_MESSAGE_ERROR));
  gst_object_unref(bus);
  fail_unless(msg != nullptr, "pipeline hung: no EOS and no ERROR");
  if (GST_MESSAGE_TYPE(msg) == GST_MESSAGE_EOS) {
    r.eos = true;
  } else {
    GError* err = nullptr;
    gchar* dbg = nullptr;
    gst_message_parse_error(msg, &err, &dbg);
    r.error = true;
    r.message = err->message;
    r.debug = dbg ? dbg : "";
    g_error_free(err);
    g_free(dbg);
  }
  gst_message_unref(msg);
  return r;
}

struct Segment {
  std::string caps;
  std::vector<Frame> frames;
};

// appsrc ! latentfilesink, the caps switching between segments.
RunResult write_stream(const std::string& location, const std::vector<Segment>& segments, guint max_frames = 0,
                       guint* files_written = nullptr, const char* metadata = nullptr) {
  GstElement* pipeline = gst_pipeline_new(nullptr);
  GstElement* src = gst_element_factory_make("appsrc", nullptr);
  GstElement* sink = gst_element_factory_make("latentfilesink", nullptr);
  fail_unless(src && sink, "appsrc or latentfilesink missing");
  g_object_set(src, "format", GST_FORMAT_TIME, nullptr);
  g_object_set(sink, "location", location.c_str(), "max-frames", max_frames, nullptr);
  if (metadata) {
    GstStructure* m = gst_structure_from_string(metadata, nullptr);
    fail_unless(m != nullptr, "bad structure %s", metadata);
    g_object_set(sink, "metadata", m, nullptr);
    gst_structure_free(m);
  }
  gst_bin_add_many(GST_BIN(pipeline), src, sink, nullptr);
  fail_unless(gst_element_link(src, sink));
  if (gst_element_set_state(pipeline, GST_STATE_PLAYING) != GST_STATE_CHANGE_FAILURE) {
    for (const auto& seg : segments) {
      GstCaps* caps = gst_caps_from_string(seg.caps.c_str());
      gst_app_src_set_caps(GST_APP_SRC(src), caps);
      gst_caps_unref(caps);
      for (const auto& f : seg.frames) gst_app_src_push_buffer(GST_APP_SRC(src), make_buffer(f));
    }
    gst_app_src_end_of_stream(GST_APP_SRC(src));
  }
  RunResult r = wait_bus(pipeline);
  if (files_written) g_object_get(sink, "files-written", files_written, nullptr);
  gst_element_set_state(pipeline, GST_STATE_NULL);
  gst_object_unref(pipeline);
  return r;
}

struct ReadBack {
  RunResult run;
  std::vector<Frame> frames;
  std::vector<std::string> caps;  // per frame
  std::vector<bool> discont;
  GstClockTime segment_start = GST_CLOCK_TIME_NONE;
};

// latentfilesrc ! appsink, collecting every buffer with its caps.
ReadBack read_stream(const std::string& location, guint index = 0) {
  ReadBack out;
  GstElement* pipeline = gst_pipeline_new(nullptr);
  GstElement* src = gst_element_factory_make("latentfilesrc", nullptr);
  GstElement* sink = gst_element_factory_make("appsink", nullptr);
  fail_unless(src && sink, "latentfilesrc or appsink missing");
  g_object_set(src, "location", location.c_str(), "index", index, nullptr);
  g_object_set(sink, "sync", FALSE, nullptr);
  gst_bin_add_many(GST_BIN(pipeline), src, sink, nullptr);
  fail_unless(gst_element_link(src, sink));
  if (gst_element_set_state(pipeline, GST_STATE_PLAYING) != GST_STATE_CHANGE_FAILURE) {
    while (GstSample* s = gst_app_sink_try_pull_sample(GST_APP_SINK(sink), 30 * GST_SECOND)) {
      GstBuffer* buf = gst_sample_get_buffer(s);
      Frame f;
      f.stamp = latent::gst::read_stamp(buf);
      f.bytes.resize(gst_buffer_get_size(buf));
      gst_buffer_extract(buf, 0, f.bytes.data(), f.bytes.size());
      out.frames.push_back(std::move(f));
      out.discont.push_back(GST_BUFFER_FLAG_IS_SET(buf, GST_BUFFER_FLAG_DISCONT));
      gchar* caps = gst_caps_to_string(gst_sample_get_caps(s));
      out.caps.push_back(caps);
      g_free(caps);
      if (out.frames.size() == 1) out.segment_start = gst_sample_get_segment(s)->start;
      gst_sample_unref(s);
    }
  }
  out.run = wait_bus(pipeline);
  gst_element_set_state(pipeline, GST_STATE_NULL);
  gst_object_unref(pipeline);
  return out;
}

void expect_same_frames(const std::vector<Frame>& got, const std::vector<Frame>& want) {
  fail_unless_equals_int(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    fail_unless(got[i].bytes == want[i].bytes, "frame %zu differs in its bytes", i);
    fail_unless_equals_uint64(got[i].stamp.pts, want[i].stamp.pts);
    fail_unless_equals_uint64(got[i].stamp.duration, want[i].stamp.duration);
    fail_unless_equals_uint64(got[i].stamp.first_frame, want[i].stamp.first_frame);
    fail_unless_equals_uint64(got[i].stamp.end_frame, want[i].stamp.end_frame);
  }
}

void expect_caps(const std::string& got, const std::string& want) {
  GstCaps* a = gst_caps_from_string(got.c_str());
  GstCaps* b = gst_caps_from_string(want.c_str());
  fail_unless(a && b && gst_caps_is_equal(a, b), "caps %s, expected %s", got.c_str(), want.c_str());
  gst_caps_unref(a);
  gst_caps_unref(b);
}

void expect_error_naming(const RunResult& r, const std::string& path, const char* also = nullptr) {
  fail_unless(r.error, "expected an error about %s, got %s", path.c_str(), r.eos ? "EOS" : "nothing");
  fail_unless(r.message.find(path) != std::string::npos, "error does not name %s: %s", path.c_str(), r.message.c_str());
  if (also) fail_unless(r.message.find(also) != std::string::npos, "'%s' not in: %s", also, r.message.c_str());
}

std::vector<Frame> concat(const std::vector<Frame>& a, const std::vector<Frame>& b) {
  std::vector<Frame> out = a;
  out.insert(out.end(), b.begin(), b.end());
  return out;
}

torch::Tensor zeros(std::vector<int64_t> shape, c10::ScalarType type) {
  return torch::zeros(shape, torch::TensorOptions().dtype(type));
}

// A safetensors file written by hand, for the files latentfilesink would never write.
void write_file(const std::string& path, const std::map<std::string, torch::Tensor>& tensors,
                const std::map<std::string, std::string>& metadata) {
  latent::SafetensorsWriter::Options options;
  options.durable = false;
  latent::SafetensorsWriter w(path, options);
  for (const auto& [k, v] : metadata) w.set_metadata(k, v);
  for (const auto& [name, t] : tensors) w.write(name, t);
  w.commit();
}

}  // namespace

GST_START_TEST(test_caps_glue) {
  std::string why;
  auto info = LatentCapsInfo::from_string(caps_string(), &why);
  fail_unless(info.has_value(), "%s", why.c_str());
  fail_unless_equals_string(info->model.c_str(), "tiny");
  fail_unless(info->format == latent::gst::LatentFormat::F32);
  fail_unless_equals_int(info->channels, 4);
  fail_unless_equals_int(info->width, 8);
  fail_unless_equals_int(info->height, 6);
  fail_unless_equals_int(info->video_width, 64);
  fail_unless(info->framerate == (latent::gst::Fraction{6, 1}));
  fail_unless_equals_int(info->frame_bytes(), 4 * 6 * 8 * 4);
  fail_unless_equals_uint64(info->frame_duration(), GST_SECOND / 6);
  fail_unless(info->scalar_type() == c10::kFloat);
  fail_unless_equals_int(latent::gst::element_size(latent::gst::LatentFormat::BF16), 2);
  fail_unless(latent::gst::scalar_type(latent::gst::LatentFormat::F16) == c10::kHalf);
  fail_unless(latent::gst::scalar_type(latent::gst::LatentFormat::BF16) == c10::kBFloat16);

  GstCaps* caps = info->to_caps();
  auto again = LatentCapsInfo::from_caps(caps);
  fail_unless(again.has_value() && *again == *info);
  gst_caps_unref(caps);

  auto refused = [](const std::string& text, const char* fragment) {
    std::string why;
    fail_unless(!LatentCapsInfo::from_string(text, &why).has_value(), "accepted %s", text.c_str());
    fail_unless(why.find(fragment) != std::string::npos, "'%s' not in: %s", fragment, why.c_str());
  };
  auto with = [](std::string text, const std::string& from, const std::string& to) {
    return text.replace(text.find(from), from.size(), to);
  };
  refused(with(caps_string(), "format=(string)F32", "format=(string)F64"), "F64");
  refused(with(caps_string(), "format=(string)F32", "format=(string){ F32, F16 }"), "not fixed");
  refused(with(caps_string(), "model=(string)tiny, ", ""), "model");
  refused(with(caps_string(), "width=(int)8,", "width=(int)9,"), "does not match video size");
  refused(with(caps_string(), "framerate=(fraction)6/1", "framerate=(fraction)5/1"), "temporal-factor");
  refused(with(caps_string(), "channels=(int)4", "channels=(int)0"), "channels");
  refused(with(caps_string(), "video/x-latent", "video/x-raw"), "video/x-raw");
  refused("not caps at all ((", "caps");

  GstCaps* any_model = gst_caps_from_string(latent::gst::latent_template_caps_string().c_str());
  GstCaps* wan = gst_caps_from_string(latent::gst::latent_template_caps_string("wan2.1").c_str());
  GstCaps* tiny = gst_caps_from_string(caps_string().c_str());
  fail_unless(any_model && wan && tiny);
  fail_unless(gst_caps_can_intersect(any_model, tiny));
  fail_unless(!gst_caps_can_intersect(wan, tiny), "a template pinned to wan2.1 accepts tiny latents");
  gst_caps_unref(any_model);
  gst_caps_unref(wan);
  gst_caps_unref(tiny);
}
GST_END_TEST;

GST_START_TEST(test_location_pattern) {
  // Compared through variables: check pastes the expression text into a printf format, and these hold '%'.
  auto expect_path = [](const char* location, uint64_t index, const char* want) {
    std::string why;
    auto p = LocationPattern::parse(location, &why);
    fail_unless(p.has_value(), "%s refused: %s", location, why.c_str());
    std::string got = p->path_for(index);
    fail_unless(got == want, "%s with index %llu gave '%s', expected '%s'", location, (unsigned long long)index,
                got.c_str(), want);
  };
  expect_path("clip-%05d.safetensors", 7, "clip-00007.safetensors");
  expect_path("clip-%05d.safetensors", 1234567, "clip-1234567.safetensors");
  expect_path("%d", 12, "12");
  expect_path("100%%-%03u.x", 12, "100%-012.x");
  expect_path("[%-4d]", 7, "[7   ]");
  expect_path("[%4i]", 7, "[   7]");
  expect_path("[%+03ld]", 7, "[+07]");
  expect_path("plain.safetensors", 3, "plain.safetensors");
  fail_unless(!LocationPattern::parse("plain.safetensors")->has_index());
  for (const char* bad : {"%s.safetensors", "%d-%d", "end%", "%5.2f", "%n", ""}) {
    std::string why;
    fail_unless(!LocationPattern::parse(bad, &why).has_value(), "accepted '%s'", bad);
    fail_unless(!why.empty());
  }
}
GST_END_TEST;

GST_START_TEST(test_round_trip_one_frame) {
  TempDir dir;
  std::string path = dir.file("one.safetensors");
  auto frames = make_frames(caps_string(), 1);
  guint written = 0;
  RunResult w = write_stream(path, {{caps_string(), frames}}, 0, &written);
  fail_unless(w.eos, "write failed: %s", w.message.c_str());
  fail_unless_equals_int(written, 1);

  ReadBack r = read_stream(path);
  fail_unless(r.run.eos, "read failed: %s", r.run.message.c_str());
  expect_same_frames(r.frames, frames);
  expect_caps(r.caps[0], caps_string());
  fail_unless(r.discont[0]);
}
GST_END_TEST;

GST_START_TEST(test_round_trip_five_frames_and_layout) {
  TempDir dir;
  std::string path = dir.file("five.safetensors");
  const GstClockTime base = 10 * GST_SECOND;
  auto frames = make_frames(caps_string(), 5, base, 7);
  RunResult w = write_stream(path, {{caps_string(), frames}});
  fail_unless(w.eos, "write failed: %s", w.message.c_str());
  fail_unless(dir.entries() == std::vector<std::string>{"five.safetensors"}, "stray files beside the output");

  // The layout other tools rely on.
  auto file = latent::SafetensorsFile::open(path);
  const auto& latents = file.entry("latents");
  fail_unless(latents.dtype == latent::st::Dtype::F32);
  fail_unless(latents.shape == (std::vector<uint64_t>{5, 4, 6, 8}), "latents are not [T', C, H', W']");
  auto bytes = file.bytes("latents");
  for (size_t i = 0; i < frames.size(); ++i) {
    fail_unless(
        std::memcmp(bytes.data() + i * frames[i].bytes.size(), frames[i].bytes.data(), frames[i].bytes.size()) == 0,
        "frame %zu stored wrongly", i);
  }
  const auto& timing = file.entry("timing");
  fail_unless(timing.dtype == latent::st::Dtype::U64);
  fail_unless(timing.shape == (std::vector<uint64_t>{5, 4}));
  auto meta = file.metadata();
  fail_unless_equals_string(meta["latent.version"].c_str(), "1");
  fail_unless_equals_string(meta["latent.model"].c_str(), "tiny");
  fail_unless_equals_string(meta["latent.format"].c_str(), "F32");
  fail_unless_equals_string(meta["latent.video-framerate"].c_str(), "24/1");
  fail_unless_equals_string(meta["latent.frames"].c_str(), "5");
  fail_unless_equals_string(meta["latent.source-first"].c_str(), "0");
  fail_unless_equals_string(meta["latent.source-end"].c_str(), "15");
  fail_unless_equals_string(meta["latent.source-frames"].c_str(), "15");
  fail_unless_equals_string(meta["latent.pts0"].c_str(), std::to_string(base).c_str());
  fail_unless_equals_string(meta["latent.file-index"].c_str(), "0");
  fail_unless_equals_string(meta["latent.stream-frame"].c_str(), "0");
  expect_caps(meta["latent.caps"], caps_string());

  ReadBack r = read_stream(path);
  fail_unless(r.run.eos, "read failed: %s", r.run.message.c_str());
  expect_same_frames(r.frames, frames);
  for (const auto& c : r.caps) expect_caps(c, caps_string());
  fail_unless(r.discont[0] && !r.discont[1]);
  // Playback starts at once although the recording's timestamps start at 10 s.
  fail_unless_equals_uint64(r.segment_start, base);
}
GST_END_TEST;

GST_START_TEST(test_round_trip_f16_and_bf16) {
  TempDir dir;
  for (const char* format : {"F16", "BF16"}) {
    std::string caps = caps_string(format, 16);
    std::string path = dir.file(std::string(format) + ".safetensors");
    auto frames = make_frames(caps, 3, 0, 3);
    RunResult w = write_stream(path, {{caps, frames}});
    fail_unless(w.eos, "write failed: %s", w.message.c_str());
    auto file = latent::SafetensorsFile::open(path);
    fail_unless_equals_string(latent::st::dtype_name(file.entry("latents").dtype), format);
    fail_unless(file.entry("latents").shape == (std::vector<uint64_t>{3, 16, 6, 8}));
    fail_unless(file.tensor("latents").scalar_type() == info_of(caps).scalar_type());
    ReadBack r = read_stream(path);
    fail_unless(r.run.eos, "read failed: %s", r.run.message.c_str());
    expect_same_frames(r.frames, frames);
    expect_caps(r.caps[0], caps);
  }
}
GST_END_TEST;

GST_START_TEST(test_max_frames_splits_files) {
  TempDir dir;
  std::string pattern = dir.file("clip-%05d.safetensors");
  auto frames = make_frames(caps_string(), 7, 0, 11);
  guint written = 0;
  RunResult w = write_stream(pattern, {{caps_string(), frames}}, 3, &written);
  fail_unless(w.eos, "write failed: %s", w.message.c_str());
  fail_unless_equals_int(written, 3);
  std::vector<std::string> names = {"clip-00000.safetensors", "clip-00001.safetensors", "clip-00002.safetensors"};
  fail_unless(dir.entries() == names, "expected exactly three files and no temporary ones");
  const uint64_t counts[] = {3, 3, 1};
  const char* stream_frame[] = {"0", "3", "6"};
  for (size_t i = 0; i < 3; ++i) {
    auto file = latent::SafetensorsFile::open(dir.file(names[i]));
    fail_unless_equals_uint64(file.entry("latents").shape[0], counts[i]);
    auto meta = file.metadata();
    fail_unless_equals_string(meta["latent.file-index"].c_str(), std::to_string(i).c_str());
    fail_unless_equals_string(meta["latent.stream-frame"].c_str(), stream_frame[i]);
  }
  // Source frames of the whole stream: 1 + 4 + 4 | 4 + 4 + 4 | 2 (the padded tail).
  auto last = latent::SafetensorsFile::open(dir.file(names[2]));
  fail_unless_equals_string(last.metadata().at("latent.source-frames").c_str(), "2");
  fail_unless_equals_string(last.metadata().at("latent.source-end").c_str(), "23");

  ReadBack all = read_stream(pattern);
  fail_unless(all.run.eos, "read failed: %s", all.run.message.c_str());
  expect_same_frames(all.frames, frames);

  ReadBack tail = read_stream(pattern, 1);
  fail_unless(tail.run.eos, "read failed: %s", tail.run.message.c_str());
  expect_same_frames(tail.frames, std::vector<Frame>(frames.begin() + 3, frames.end()));
}
GST_END_TEST;

GST_START_TEST(test_eos_without_frames_writes_nothing) {
  TempDir dir;
  guint written = 99;
  RunResult w = write_stream(dir.file("empty.safetensors"), {{caps_string(), {}}}, 0, &written);
  fail_unless(w.eos, "an empty stream failed: %s", w.message.c_str());
  fail_unless_equals_int(written, 0);
  fail_unless(dir.entries().empty(), "an empty stream left a file");
}
GST_END_TEST;

GST_START_TEST(test_file_appears_only_when_complete) {
  TempDir dir;
  std::string path = dir.file("atomic.safetensors");
  GstElement* sink = gst_element_factory_make("latentfilesink", nullptr);
  g_object_set(sink, "location", path.c_str(), nullptr);
  GstHarness* h = gst_harness_new_with_element(sink, "sink", nullptr);
  gst_object_unref(sink);
  gst_harness_set_src_caps_str(h, caps_string().c_str());
  auto frames = make_frames(caps_string(), 3);
  for (const auto& f : frames) fail_unless_equals_int(gst_harness_push(h, make_buffer(f)), GST_FLOW_OK);

  auto names = dir.entries();
  fail_unless(!g_file_test(path.c_str(), G_FILE_TEST_EXISTS), "the final name exists before EOS");
  fail_unless_equals_int(names.size(), 1);
  fail_unless(g_str_has_prefix(names[0].c_str(), ".atomic.safetensors.tmp"), "no temporary file: %s", names[0].c_str());

  fail_unless(gst_harness_push_event(h, gst_event_new_eos()));
  fail_unless(dir.entries() == std::vector<std::string>{"atomic.safetensors"}, "temporary file left after EOS");
  guint written = 0;
  g_object_get(h->element, "files-written", &written, nullptr);
  fail_unless_equals_int(written, 1);
  gst_harness_teardown(h);
  fail_unless_equals_uint64(latent::SafetensorsFile::open(path).entry("latents").shape[0], 3);
}
GST_END_TEST;

// A stream stopped without EOS (an error upstream, an interrupted capture) did not end: its frames are kept, but
// never under the final name, which promises the whole clip (latent-precompute took such a file for a done clip).
GST_START_TEST(test_stop_without_eos_keeps_a_partial_file) {
  TempDir dir;
  std::string path = dir.file("interrupted.safetensors");
  GstElement* sink = gst_element_factory_make("latentfilesink", nullptr);
  g_object_set(sink, "location", path.c_str(), nullptr);
  GstHarness* h = gst_harness_new_with_element(sink, "sink", nullptr);
  gst_harness_set_src_caps_str(h, caps_string().c_str());
  auto frames = make_frames(caps_string(), 2);
  for (const auto& f : frames) fail_unless_equals_int(gst_harness_push(h, make_buffer(f)), GST_FLOW_OK);
  gst_harness_teardown(h);  // to NULL with no EOS, as when a live capture is interrupted or upstream failed
  fail_unless(dir.entries() == std::vector<std::string>{"interrupted.safetensors.partial"}, "files: %s",
              dir.entries().empty() ? "none" : dir.entries()[0].c_str());
  fail_unless_equals_uint64(latent::SafetensorsFile::open(path + ".partial").entry("latents").shape[0], 2);
  guint written = 7;
  g_object_get(sink, "files-written", &written, nullptr);
  fail_unless_equals_int(written, 0);
  gst_object_unref(sink);
}
GST_END_TEST;

// Files that reached a boundary before the stop are complete and keep their names; only the unfinished one is
// partial.
GST_START_TEST(test_stop_without_eos_keeps_committed_files) {
  TempDir dir;
  GstElement* sink = gst_element_factory_make("latentfilesink", nullptr);
  g_object_set(sink, "location", dir.file("s-%d.safetensors").c_str(), "max-frames", 2u, nullptr);
  GstHarness* h = gst_harness_new_with_element(sink, "sink", nullptr);
  gst_object_unref(sink);
  gst_harness_set_src_caps_str(h, caps_string().c_str());
  auto frames = make_frames(caps_string(), 3);
  for (const auto& f : frames) fail_unless_equals_int(gst_harness_push(h, make_buffer(f)), GST_FLOW_OK);
  gst_harness_teardown(h);
  fail_unless(dir.entries() == (std::vector<std::string>{"s-0.safetensors", "s-1.safetensors.partial"}));
  fail_unless_equals_uint64(latent::SafetensorsFile::open(dir.file("s-0.safetensors")).entry("latents").shape[0], 2);
}
GST_END_TEST;

GST_START_TEST(test_flush_abandons_only_the_unfinished_file) {
  TempDir dir;
  std::string pattern = dir.file("f-%d.safetensors");
  GstElement* sink = gst_element_factory_make("latentfilesink", nullptr);
  g_object_set(sink, "location", pattern.c_str(), "max-frames", 2u, nullptr);
  GstHarness* h = gst_harness_new_with_element(sink, "sink", nullptr);
  gst_object_unref(sink);
  gst_harness_set_src_caps_str(h, caps_string().c_str());
  auto frames = make_frames(caps_string(), 4);
  for (int i = 0; i < 3; ++i) fail_unless_equals_int(gst_harness_push(h, make_buffer(frames[i])), GST_FLOW_OK);
  // f-0 is committed (2 frames); the third frame sits in f-1 when the flush comes.
  fail_unless(gst_harness_push_event(h, gst_event_new_flush_start()));
  fail_unless(gst_harness_push_event(h, gst_event_new_flush_stop(TRUE)));
  GstSegment segment;
  gst_segment_init(&segment, GST_FORMAT_TIME);
  fail_unless(gst_harness_push_event(h, gst_event_new_segment(&segment)));
  fail_unless_equals_int(gst_harness_push(h, make_buffer(frames[3])), GST_FLOW_OK);
  fail_unless(gst_harness_push_event(h, gst_event_new_eos()));
  gst_harness_teardown(h);
  fail_unless(dir.entries() == (std::vector<std::string>{"f-0.safetensors", "f-1.safetensors"}));
  fail_unless_equals_uint64(latent::SafetensorsFile::open(dir.file("f-0.safetensors")).entry("latents").shape[0], 2);
  auto second = latent::SafetensorsFile::open(dir.file("f-1.safetensors"));
  fail_unless_equals_uint64(second.entry("latents").shape[0], 1);
  fail_unless(std::memcmp(second.bytes("latents").data(), frames[3].bytes.data(), frames[3].bytes.size()) == 0);
}
GST_END_TEST;

GST_START_TEST(test_caps_change_starts_a_new_file) {
  TempDir dir;
  std::string pattern = dir.file("c-%02d.safetensors");
  auto a = make_frames(caps_string("F32"), 2, 0, 1);
  auto b = make_frames(caps_string("F16", 16), 3, a.back().stamp.pts + a.back().stamp.duration, 2, 5);
  guint written = 0;
  RunResult w = write_stream(pattern, {{caps_string("F32"), a}, {caps_string("F16", 16), b}}, 0, &written);
  fail_unless(w.eos, "write failed: %s", w.message.c_str());
  fail_unless_equals_int(written, 2);
  fail_unless(dir.entries() == (std::vector<std::string>{"c-00.safetensors", "c-01.safetensors"}));

  ReadBack r = read_stream(pattern);
  fail_unless(r.run.eos, "read failed: %s", r.run.message.c_str());
  expect_same_frames(r.frames, concat(a, b));
  expect_caps(r.caps[1], caps_string("F32"));
  expect_caps(r.caps[2], caps_string("F16", 16));

  // Without a pattern the second file would replace the first: refused, the first file kept.
  TempDir dir2;
  std::string plain = dir2.file("plain.safetensors");
  RunResult refused = write_stream(plain, {{caps_string("F32"), a}, {caps_string("F16", 16), b}});
  expect_error_naming(refused, plain, "pattern");
  fail_unless(dir2.entries() == std::vector<std::string>{"plain.safetensors"});
  fail_unless_equals_uint64(latent::SafetensorsFile::open(plain).entry("latents").shape[0], 2);
}
GST_END_TEST;

GST_START_TEST(test_identical_caps_keep_one_file) {
  TempDir dir;
  std::string plain = dir.file("one.safetensors");
  GstElement* sink = gst_element_factory_make("latentfilesink", nullptr);
  g_object_set(sink, "location", plain.c_str(), nullptr);
  GstHarness* h = gst_harness_new_with_element(sink, "sink", nullptr);
  gst_object_unref(sink);
  gst_harness_set_src_caps_str(h, caps_string().c_str());
  auto frames = make_frames(caps_string(), 4);
  for (int i = 0; i < 4; ++i) {
    if (i == 2) {
      // The same caps again, written with their fields in another order: equal caps, so the same file.
      GstCaps* same = gst_caps_from_string(
          "video/x-latent, video-framerate=(fraction)24/1, video-height=(int)48, video-width=(int)64, "
          "spatial-factor=(int)8, temporal-factor=(int)4, framerate=(fraction)6/1, height=(int)6, width=(int)8, "
          "channels=(int)4, format=(string)F32, model=(string)tiny");
      GstCaps* current = gst_pad_get_current_caps(h->srcpad);
      fail_unless(gst_caps_is_equal(same, current));
      gst_caps_unref(current);
      fail_unless(gst_harness_push_event(h, gst_event_new_caps(same)));
      gst_caps_unref(same);
    }
    fail_unless_equals_int(gst_harness_push(h, make_buffer(frames[i])), GST_FLOW_OK);
  }
  fail_unless(gst_harness_push_event(h, gst_event_new_eos()));
  guint written = 0;
  g_object_get(h->element, "files-written", &written, nullptr);
  gst_harness_teardown(h);
  fail_unless_equals_int(written, 1);
  fail_unless(dir.entries() == std::vector<std::string>{"one.safetensors"});
  ReadBack r = read_stream(plain);
  fail_unless(r.run.eos, "read failed: %s", r.run.message.c_str());
  expect_same_frames(r.frames, frames);
}
GST_END_TEST;

GST_START_TEST(test_sink_errors) {
  TempDir dir;
  std::string missing_dir = dir.file("no-such-dir");
  RunResult r = write_stream(missing_dir + "/out.safetensors", {{caps_string(), make_frames(caps_string(), 2)}});
  expect_error_naming(r, missing_dir, "does not exist");

  std::string plain = dir.file("plain.safetensors");
  r = write_stream(plain, {{caps_string(), make_frames(caps_string(), 2)}}, 3);
  expect_error_naming(r, plain, "max-frames");

  std::string bad_pattern = dir.file("out-%s.safetensors");
  r = write_stream(bad_pattern, {{caps_string(), make_frames(caps_string(), 1)}});
  expect_error_naming(r, bad_pattern);
  fail_unless(dir.entries().empty());
}
GST_END_TEST;

// The metadata property lands in every file's __metadata__ as strings; the sink's own latent.* keys cannot be
// replaced through it.
GST_START_TEST(test_extra_metadata_is_written) {
  TempDir dir;
  const std::string path = dir.file("meta-%05d.safetensors");
  const char* extra = "m, caption=(string)\"a cat, \\\"running\\\"\", frames=(int)7";
  RunResult w = write_stream(path, {{caps_string(), make_frames(caps_string(), 3)}}, 2, nullptr, extra);
  fail_unless(w.eos, "write failed: %s", w.message.c_str());
  for (const char* name : {"meta-00000.safetensors", "meta-00001.safetensors"}) {
    latent::SafetensorsFile f = latent::SafetensorsFile::open(dir.file(name));
    fail_unless_equals_string(f.metadata().at("caption").c_str(), "a cat, \"running\"");
    fail_unless_equals_string(f.metadata().at("frames").c_str(), "7");
    fail_unless(f.metadata().count("latent.caps") == 1);
  }
  RunResult bad = write_stream(dir.file("bad.safetensors"), {{caps_string(), make_frames(caps_string(), 1)}}, 0,
                               nullptr, "m, latent.model=(string)wan2.1");
  fail_unless(!bad.eos && bad.message.find("latent.model") != std::string::npos, "got '%s'", bad.message.c_str());
}
GST_END_TEST;

// A disk that fills up mid-stream, simulated with a file size limit: the error names the file, the file already
// committed stays whole, and no temporary file is left behind.
GST_START_TEST(test_sink_write_failure_keeps_committed_files) {
  TempDir dir;
  std::string pattern = dir.file("d-%02d.safetensors");
  auto small = make_frames(caps_string("F32", 4), 2, 0, 1);
  auto big = make_frames(caps_string("F32", 16), 3, GST_SECOND, 2, 5);
  // Room for the header reserve (16 KiB) and the two small frames, not for one big frame.
  struct rlimit old {};
  getrlimit(RLIMIT_FSIZE, &old);
  struct rlimit limit = old;
  limit.rlim_cur = 16 * 1024 + 8 + 2 * small[0].bytes.size() + 1024;
  fail_unless(setrlimit(RLIMIT_FSIZE, &limit) == 0);
  auto old_handler = signal(SIGXFSZ, SIG_IGN);
  RunResult r = write_stream(pattern, {{caps_string("F32", 4), small}, {caps_string("F32", 16), big}});
  setrlimit(RLIMIT_FSIZE, &old);
  signal(SIGXFSZ, old_handler);

  expect_error_naming(r, dir.file("d-01.safetensors"), "File too large");
  fail_unless(dir.entries() == std::vector<std::string>{"d-00.safetensors"}, "a partial or temporary file remains");
  auto kept = latent::SafetensorsFile::open(dir.file("d-00.safetensors"));
  fail_unless_equals_uint64(kept.entry("latents").shape[0], 2);
}
GST_END_TEST;

GST_START_TEST(test_src_missing_and_corrupt_files) {
  TempDir dir;
  std::string missing = dir.file("missing.safetensors");
  expect_error_naming(read_stream(missing).run, missing, "does not exist");

  std::string garbage = dir.file("garbage.safetensors");
  std::ofstream(garbage) << "this is not a safetensors file, only some text";
  expect_error_naming(read_stream(garbage).run, garbage, "not a valid safetensors file");

  // A real latent file cut short, as by a copy that did not finish.
  std::string good = dir.file("good.safetensors");
  fail_unless(write_stream(good, {{caps_string(), make_frames(caps_string(), 3)}}).eos);
  std::string truncated = dir.file("truncated.safetensors");
  {
    std::ifstream in(good, std::ios::binary);
    std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::ofstream(truncated, std::ios::binary) << all.substr(0, all.size() - 100);
  }
  expect_error_naming(read_stream(truncated).run, truncated, "not a valid safetensors file");
}
GST_END_TEST;

GST_START_TEST(test_src_foreign_and_inconsistent_files) {
  TempDir dir;
  const std::map<std::string, std::string> meta = {{"latent.caps", caps_string()}, {"latent.version", "1"}};

  std::string no_latents = dir.file("weights.safetensors");
  write_file(no_latents, {{"encoder.conv.weight", zeros({3, 3}, c10::kFloat)}}, meta);
  expect_error_naming(read_stream(no_latents).run, no_latents, "'latents'");

  std::string no_meta = dir.file("no-meta.safetensors");
  write_file(no_meta, {{"latents", zeros({2, 4, 6, 8}, c10::kFloat)}}, {});
  expect_error_naming(read_stream(no_meta).run, no_meta, "latent.caps");

  std::string wrong_shape = dir.file("wrong-shape.safetensors");
  write_file(wrong_shape, {{"latents", zeros({2, 3, 6, 8}, c10::kFloat)}}, meta);
  expect_error_naming(read_stream(wrong_shape).run, wrong_shape, "[2, 3, 6, 8]");

  std::string wrong_dtype = dir.file("wrong-dtype.safetensors");
  write_file(wrong_dtype, {{"latents", zeros({2, 4, 6, 8}, c10::kHalf)}}, meta);
  expect_error_naming(read_stream(wrong_dtype).run, wrong_dtype, "F16");

  std::string wrong_rank = dir.file("wrong-rank.safetensors");
  write_file(wrong_rank, {{"latents", zeros({4, 6, 8}, c10::kFloat)}}, meta);
  expect_error_naming(read_stream(wrong_rank).run, wrong_rank, "latents");

  std::string bad_caps = dir.file("bad-caps.safetensors");
  write_file(bad_caps, {{"latents", zeros({2, 4, 6, 8}, c10::kFloat)}},
             {{"latent.caps", "video/x-raw, format=(string)RGB"}});
  expect_error_naming(read_stream(bad_caps).run, bad_caps, "invalid caps");

  std::string wrong_count = dir.file("wrong-count.safetensors");
  write_file(wrong_count, {{"latents", zeros({2, 4, 6, 8}, c10::kFloat)}},
             {{"latent.caps", caps_string()}, {"latent.frames", "3"}});
  expect_error_naming(read_stream(wrong_count).run, wrong_count, "3 latent frames");

  std::string bad_timing = dir.file("bad-timing.safetensors");
  write_file(bad_timing, {{"latents", zeros({2, 4, 6, 8}, c10::kFloat)}, {"timing", zeros({3, 4}, c10::kLong)}}, meta);
  expect_error_naming(read_stream(bad_timing).run, bad_timing, "'timing'");

  std::string future = dir.file("future.safetensors");
  write_file(future, {{"latents", zeros({2, 4, 6, 8}, c10::kFloat)}},
             {{"latent.caps", caps_string()}, {"latent.version", "2"}});
  expect_error_naming(read_stream(future).run, future, "version");
}
GST_END_TEST;

GST_START_TEST(test_src_synthesises_timing_for_other_writers) {
  TempDir dir;
  std::string path = dir.file("python.safetensors");
  auto latents = torch::arange(3 * 4 * 6 * 8, torch::TensorOptions().dtype(c10::kFloat)).reshape({3, 4, 6, 8});
  write_file(path, {{"latents", latents}}, {{"latent.caps", caps_string()}, {"latent.pts0", "1000"}});
  ReadBack r = read_stream(path);
  fail_unless(r.run.eos, "read failed: %s", r.run.message.c_str());
  fail_unless_equals_int(r.frames.size(), 3);
  for (size_t i = 0; i < 3; ++i) {
    GstClockTime start = gst_util_uint64_scale(i, GST_SECOND, 6), end = gst_util_uint64_scale(i + 1, GST_SECOND, 6);
    fail_unless_equals_uint64(r.frames[i].stamp.pts, 1000 + start);
    fail_unless_equals_uint64(r.frames[i].stamp.duration, end - start);
    fail_unless_equals_uint64(r.frames[i].stamp.first_frame, GST_BUFFER_OFFSET_NONE);
    fail_unless(std::memcmp(r.frames[i].bytes.data(), latents[i].data_ptr(), r.frames[i].bytes.size()) == 0);
  }
}
GST_END_TEST;

static Suite* latentfile_suite() {
  Suite* s = suite_create("latentfile");
  TCase* glue = tcase_create("glue");
  suite_add_tcase(s, glue);
  tcase_add_test(glue, test_caps_glue);
  tcase_add_test(glue, test_location_pattern);

  TCase* tc = tcase_create("elements");
  tcase_set_timeout(tc, 120);
  suite_add_tcase(s, tc);
  tcase_add_test(tc, test_round_trip_one_frame);
  tcase_add_test(tc, test_round_trip_five_frames_and_layout);
  tcase_add_test(tc, test_round_trip_f16_and_bf16);
  tcase_add_test(tc, test_max_frames_splits_files);
  tcase_add_test(tc, test_eos_without_frames_writes_nothing);
  tcase_add_test(tc, test_file_appears_only_when_complete);
  tcase_add_test(tc, test_stop_without_eos_keeps_a_partial_file);
  tcase_add_test(tc, test_stop_without_eos_keeps_committed_files);
  tcase_add_test(tc, test_flush_abandons_only_the_unfinished_file);
  tcase_add_test(tc, test_caps_change_starts_a_new_file);
  tcase_add_test(tc, test_identical_caps_keep_one_file);
  tcase_add_test(tc, test_sink_errors);
  tcase_add_test(tc, test_extra_metadata_is_written);
  tcase_add_test(tc, test_sink_write_failure_keeps_committed_files);
  tcase_add_test(tc, test_src_missing_and_corrupt_files);
  tcase_add_test(tc, test_src_foreign_and_inconsistent_files);
  tcase_add_test(tc, test_src_synthesises_timing_for_other_writers);
  return s;
}

GST_CHECK_MAIN(latentfile);
