// An application that embeds a gst-latent pipeline: test video -> vaeencode -> appsink, with the latents read
// back in the program. It needs only the installed `latent` plugin (or GST_PLUGIN_PATH pointing at a build), not
// liblatentcore: everything it knows about a latent comes from the caps and buffers (docs/latent-caps.md).
//
// usage: encode_to_appsink [FRAMES [WIDTH HEIGHT [MODEL]]]     (defaults: 17 frames of 64x64, the default model)
// Prints one line per latent frame and a summary; exit status 0 when every source frame came back covered by a
// latent frame of the size the caps announce, 1 on a pipeline error or a mismatch, 2 on bad arguments.
#include <gst/app/gstappsink.h>
#include <gst/gst.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace {

// Latent sizes the caps announce, read once from the first sample.
struct LatentFormat {
  int channels = 0, width = 0, height = 0;
  std::string format;
  gsize frame_bytes = 0;
};

bool read_format(GstCaps* caps, LatentFormat* out) {
  const GstStructure* s = gst_caps_get_structure(caps, 0);
  if (!gst_structure_has_name(s, "video/x-latent")) {
    std::fprintf(stderr, "unexpected caps %s\n", gst_structure_get_name(s));
    return false;
  }
  const char* format = gst_structure_get_string(s, "format");
  if (!gst_structure_get_int(s, "channels", &out->channels) || !gst_structure_get_int(s, "width", &out->width) ||
      !gst_structure_get_int(s, "height", &out->height) || !format) {
    std::fprintf(stderr, "latent caps without channels, width, height or format\n");
    return false;
  }
  out->format = format;
  gsize sample_bytes = out->format == "F32" ? 4 : 2;
  out->frame_bytes = sample_bytes * out->channels * out->width * out->height;
  return true;
}

// An error on the bus, if any: appsink never sees EOS after an upstream failure, so the pull loop must look here.
bool bus_error(GstBus* bus) {
  GstMessage* msg = gst_bus_pop_filtered(bus, GST_MESSAGE_ERROR);
  if (!msg) return false;
  GError* err = nullptr;
  gchar* debug = nullptr;
  gst_message_parse_error(msg, &err, &debug);
  std::fprintf(stderr, "error from %s: %s\n%s\n", GST_OBJECT_NAME(GST_MESSAGE_SRC(msg)), err->message,
               debug ? debug : "");
  g_clear_error(&err);
  g_free(debug);
  gst_message_unref(msg);
  return true;
}

int parse_positive(const char* text) {
  char* end = nullptr;
  long v = std::strtol(text, &end, 10);
  return (*end || v <= 0 || v > 65536) ? -1 : static_cast<int>(v);
}

}  // namespace

int main(int argc, char** argv) {
  GError* init_error = nullptr;
  if (!gst_init_check(&argc, &argv, &init_error)) {
    std::fprintf(stderr, "GStreamer: %s\n", init_error->message);
    return 1;
  }
  const bool help = argc > 1 && !std::strcmp(argv[1], "--help");
  if (help || argc > 5 || argc == 3) {
    std::fprintf(help ? stdout : stderr, "usage: %s [FRAMES [WIDTH HEIGHT [MODEL]]]\n", argv[0]);
    return help ? 0 : 2;
  }
  int frames = argc > 1 ? parse_positive(argv[1]) : 17;
  int width = argc > 3 ? parse_positive(argv[2]) : 64;
  int height = argc > 3 ? parse_positive(argv[3]) : 64;
  std::string model = argc > 4 ? argv[4] : "default";
  if (frames < 0 || width < 0 || height < 0) {
    std::fprintf(stderr, "FRAMES, WIDTH and HEIGHT must be positive integers\n");
    return 2;
  }

  // The whole description, not element by element: a pipeline reads the same here as with gst-launch-1.0.
  // appsink's sync=false takes latents as fast as they come instead of at the clip's real-time pace.
  std::string description = "videotestsrc num-buffers=" + std::to_string(frames) +
                            " ! videoconvert ! video/x-raw,width=" + std::to_string(width) +
                            ",height=" + std::to_string(height) + " ! vaeencode name=enc" +
                            " ! appsink name=sink sync=false";
  GError* parse_error = nullptr;
  GstElement* pipeline = gst_parse_launch(description.c_str(), &parse_error);
  if (!pipeline || parse_error) {
    std::fprintf(stderr, "cannot build '%s': %s\n", description.c_str(),
                 parse_error ? parse_error->message : "unknown error");
    g_clear_error(&parse_error);
    if (pipeline) gst_object_unref(pipeline);
    return 1;
  }
  if (model != "default") {
    GstElement* enc = gst_bin_get_by_name(GST_BIN(pipeline), "enc");
    g_object_set(enc, "model", model.c_str(), nullptr);
    gst_object_unref(enc);
  }
  GstElement* sink = gst_bin_get_by_name(GST_BIN(pipeline), "sink");
  GstBus* bus = gst_element_get_bus(pipeline);

  int status = 0;
  if (gst_element_set_state(pipeline, GST_STATE_PLAYING) == GST_STATE_CHANGE_FAILURE) {
    // A model that fails to load fails the state change; the bus says why.
    if (!bus_error(bus)) std::fprintf(stderr, "the pipeline refused to start\n");
    status = 1;
  }

  LatentFormat fmt;
  int latents = 0;
  guint64 covered = 0;
  while (status == 0) {
    GstSample* sample = gst_app_sink_try_pull_sample(GST_APP_SINK(sink), 100 * GST_MSECOND);
    if (!sample) {
      if (bus_error(bus)) status = 1;
      if (gst_app_sink_is_eos(GST_APP_SINK(sink))) break;
      continue;
    }
    if (latents == 0 && !read_format(gst_sample_get_caps(sample), &fmt)) status = 1;
    GstBuffer* buf = gst_sample_get_buffer(sample);
    gsize size = gst_buffer_get_size(buf);
    // OFFSET..OFFSET_END is the range of source frames this latent frame stands for.
    guint64 first = GST_BUFFER_OFFSET(buf), end = GST_BUFFER_OFFSET_END(buf);
    if (status == 0) {
      std::printf("latent %d: %dx%dx%d %s, %zu bytes, pts %.3f s, source frames [%llu, %llu)\n", latents, fmt.channels,
                  fmt.height, fmt.width, fmt.format.c_str(), static_cast<size_t>(size),
                  GST_BUFFER_PTS_IS_VALID(buf) ? GST_BUFFER_PTS(buf) / 1e9 : -1.0,
                  static_cast<unsigned long long>(first), static_cast<unsigned long long>(end));
      if (size != fmt.frame_bytes) {
        std::fprintf(stderr, "latent %d has %zu bytes, the caps say %zu\n", latents, static_cast<size_t>(size),
                     static_cast<size_t>(fmt.frame_bytes));
        status = 1;
      }
      if (first != GST_BUFFER_OFFSET_NONE && end != GST_BUFFER_OFFSET_NONE && end > first) covered += end - first;
    }
    ++latents;
    gst_sample_unref(sample);
  }
  gst_element_set_state(pipeline, GST_STATE_NULL);

  if (status == 0) {
    std::printf("%d latents (%dx%dx%d %s) for %d frames of %dx%d, covering %llu frames\n", latents, fmt.channels,
                fmt.height, fmt.width, fmt.format.c_str(), frames, width, height,
                static_cast<unsigned long long>(covered));
    if (latents == 0 || covered != static_cast<guint64>(frames)) {
      std::fprintf(stderr, "the latents do not cover the %d source frames\n", frames);
      status = 1;
    }
  }
  gst_object_unref(bus);
  gst_object_unref(sink);
  gst_object_unref(pipeline);
  return status;
}
