// Timestamps of a live source whose frames exist only once generated. A frame stamped before the running time at
// which it exists is late everywhere downstream, and every frame after it later still when the model is slower
// than real time: the stream drifts without bound while the sinks drop or freeze. So the timeline starts when the
// first frame exists and moves later whenever a frame exists after its time (the model is slow) or a sink reports
// frames later than max-lateness (the sink is slow): the stream skips time instead of building a backlog, and
// each move is reported.
#pragma once

#include <gst/gst.h>

#include <mutex>

namespace latent::gst {

class LiveTimeline {
 public:
  struct Stamp {
    GstClockTime pts = GST_CLOCK_TIME_NONE;
    // How much later than its place on the timeline the frame exists (0 when on time): the timeline moved by it.
    GstClockTime late = 0;
    // What a sink's lateness moved the timeline by since the last stamp.
    GstClockTime skipped = 0;
  };
  // `stream_time`: the frame's time from the start of the stream at the nominal frame rate; `now`: the running
  // time at which it exists.
  Stamp stamp(GstClockTime stream_time, GstClockTime now);
  // A QoS event from downstream: the frame stamped `timestamp` (running time) reached a sink `diff` late
  // (negative: early). Beyond `max_lateness` (GST_CLOCK_TIME_NONE: never), the next frames are moved later by
  // `diff`. A report about a frame stamped before the last move is not acted on: with a queue before a slow sink,
  // every frame of the backlog reports the lateness that move already took back. Any thread.
  void sink_lateness(GstClockTimeDiff diff, GstClockTime timestamp, GstClockTime max_lateness);
  void reset();

 private:
  std::mutex mu_;
  GstClockTime offset_ = GST_CLOCK_TIME_NONE;  // running time minus stream time
  GstClockTime skip_ = 0;                      // from sinks, not applied yet
  GstClockTime moved_at_ = 0;                  // the first timestamp after the last move
};

}  // namespace latent::gst
