// The base of the latent transform elements (vaeencode, vaedecode, videorestyle), as GstVideoEncoder and
// GstVideoDecoder are of codecs. It owns the two pads and what every one of them does the same way:
// - a buffer reaches the subclass only after its caps; a DISCONT buffer first drains what the subclass holds;
// - the end of a stream or segment and the start of another drain it (its output goes out under the segment it
//   belongs to), a flush drops it, and the next clip starts with fresh caches;
// - serialized events wait behind input that has not produced its output yet and go out ahead of the first output
//   that covers it (HeldEvents), so no segment, tag or gap overtakes the data it came after;
// - the LATENCY query adds what the subclass holds back plus a bound on its compute time;
// - every C++ exception at the boundary becomes an ERROR message.
// The subclass keeps its model and settings; it counts input in `taken` and output in `done` (its own units: frames,
// latents) and pushes through latent::gst::push_output.
#pragma once

#include <gst/gst.h>

#include <atomic>
#include <chrono>
#include <cstdint>

#include "held_events.h"
#include "latency.h"

G_BEGIN_DECLS
#define GST_TYPE_LATENT_FILTER (gst_latent_filter_get_type())
G_DECLARE_DERIVABLE_TYPE(GstLatentFilter, gst_latent_filter, GST, LATENT_FILTER, GstElement)

struct _GstLatentFilterClass {
  GstElementClass parent_class;

  // For messages: what one input buffer holds ("frame", "latent") and what the element does ("encoding").
  const char* unit;
  const char* work;

  // On the streaming thread (or in a state change, which never overlaps it). Those that return a gboolean return
  // FALSE after posting an ERROR message.
  // Sink caps, every time they come (the subclass tells a change from a repeat). The base never forwards the caps
  // event: the subclass pushes its source caps. Buffers are taken once a call returned TRUE.
  gboolean (*set_caps)(GstLatentFilter* self, GstCaps* caps);
  // One buffer (owned by the subclass from here on). An exception is posted as an ERROR naming `work`.
  GstFlowReturn (*handle_buffer)(GstLatentFilter* self, GstBuffer* buffer);
  // Makes and pushes the output of the clip's input not yet out (called once input was taken since its start).
  GstFlowReturn (*finish)(GstLatentFilter* self);
  // Starts a new clip: fresh caches, nothing pending. Through latent::gst::start_clip, which marks where it starts.
  gboolean (*reset)(GstLatentFilter* self);
  // FLUSH_STOP, before reset: drop what the flush discards beyond the pending data.
  void (*flush)(GstLatentFilter* self);
  // Every sink event, after the base handled it and before it goes on downstream.
  void (*observe_event)(GstLatentFilter* self, GstEvent* event);
  // From any thread: the time of the input held back before an output can go out.
  GstClockTime (*held_latency)(GstLatentFilter* self);
  // Pad queries; the defaults answer LATENCY (source pad) and forward the rest. Overrides chain up for the rest.
  gboolean (*sink_query)(GstLatentFilter* self, GstQuery* query);
  gboolean (*src_query)(GstLatentFilter* self, GstQuery* query);
};
G_END_DECLS

namespace latent::gst {

// The stream state the base keeps for a subclass (its streaming thread's, except the stats).
struct FilterStream {
  HeldEvents held;
  uint64_t taken = 0;   // input units of the stream received: the position events are held at
  uint64_t done = 0;    // input units whose output has all gone out
  uint64_t clip_start = 0;  // `taken` when the current clip started
  bool negotiated = false;  // set_caps succeeded since READY->PAUSED
  bool discont = true;  // the next output starts a clip
  // Since READY->PAUSED, read by the counter properties from any thread: buffers received and pushed.
  std::atomic<guint64> in{0}, out{0};
  ChunkStats stats;
  LatencyBound compute;
  bool holding() const { return taken > done || !held.empty(); }
  // Whether the clip has begun: a DISCONT buffer then ends it, a drain finishes it.
  bool clip_begun() const { return taken > clip_start; }
};

GstPad* sink_pad(GstLatentFilter* self);
GstPad* src_pad(GstLatentFilter* self);
FilterStream& filter_stream(GstLatentFilter* self);

// Pushes `buffer` after the held events that came before input `covers_end` (the first input unit past those it
// covers), marked DISCONT when it starts a clip.
GstFlowReturn push_output(GstLatentFilter* self, GstBuffer* buffer, uint64_t covers_end);
// Makes the output of what is pending, lets every held event go and starts a new clip (errors are posted).
GstFlowReturn drain(GstLatentFilter* self);
// Starts a clip at the current input (the subclass's reset); false after an ERROR message.
bool start_clip(GstLatentFilter* self);
// Records one model call's compute time (stats and the latency bound; a LATENCY message when it moved).
void record_compute(GstLatentFilter* self, std::chrono::steady_clock::duration d);

// The read-only counters of a subclass: buffers received and pushed since READY->PAUSED, under the names the
// subclass gives them ({"frames-in", "Frames in", "Video frames received since READY->PAUSED"}), and, when
// `mean_latency`, mean-chunk-latency.
enum FilterProperty { PROP_UNITS_IN = 1200, PROP_UNITS_OUT, PROP_MEAN_CHUNK_LATENCY };
struct CounterNames {
  const char *name, *nick, *blurb;
};
void install_counter_properties(GObjectClass* klass, CounterNames in, CounterNames out, bool mean_latency);
// Reads those; false for any other id.
bool get_counter_property(GstLatentFilter* self, guint id, GValue* value);

}  // namespace latent::gst
