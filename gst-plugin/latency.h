// The compute-time part of an element's latency. Live sinks drop whatever arrives later than the latency the
// pipeline announced, so it must be an upper bound, not a mean; and every LATENCY message makes the pipeline
// recompute its latency, so the bound must not follow every wobble. Hence: the longest of the last `window`
// measurements, announced with headroom, raised at once when a measurement goes past it, lowered only when the
// window's longest (with headroom) has fallen to half of it.
#pragma once

#include <gst/gst.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <vector>

namespace latent::gst {

class LatencyBound {
 public:
  explicit LatencyBound(size_t window = 32, double headroom = 1.25);
  // Records one compute time; true when the announced bound changed (post a LATENCY message then).
  bool add(GstClockTime t);
  // What to answer a LATENCY query with: 0 before the first measurement.
  GstClockTime announced() const;
  void reset();

 private:
  GstClockTime padded(GstClockTime t) const;
  const size_t window_;
  const double headroom_;
  mutable std::mutex mu_;
  std::vector<GstClockTime> recent_;  // a ring of the last window_ measurements
  size_t next_ = 0;
  GstClockTime announced_ = 0;
};

// Compute time of model calls; the stats properties read it from any thread.
struct ChunkStats {
  std::atomic<guint64> chunks{0}, compute_ns{0};
  void reset() { chunks = compute_ns = 0; }
  void add(std::chrono::steady_clock::duration d) {
    compute_ns += guint64(std::chrono::duration_cast<std::chrono::nanoseconds>(d).count());
    chunks++;
  }
  GstClockTime mean() const {
    guint64 n = chunks.load();
    return n ? GstClockTime(compute_ns.load() / n) : 0;
  }
};

}  // namespace latent::gst
