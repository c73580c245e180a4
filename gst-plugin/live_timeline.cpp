#include "live_timeline.h"

namespace latent::gst {

LiveTimeline::Stamp LiveTimeline::stamp(GstClockTime stream_time, GstClockTime now) {
  std::lock_guard<std::mutex> lock(mu_);
  Stamp s;
  if (!GST_CLOCK_TIME_IS_VALID(offset_)) offset_ = now > stream_time ? now - stream_time : 0;
  s.skipped = skip_;
  offset_ += skip_;
  skip_ = 0;
  s.pts = stream_time + offset_;
  if (s.pts < now) {
    s.late = now - s.pts;
    offset_ += s.late;
    s.pts = now;
  }
  if (s.skipped > 0 || s.late > 0) moved_at_ = s.pts;
  return s;
}

void LiveTimeline::sink_lateness(GstClockTimeDiff diff, GstClockTime timestamp, GstClockTime max_lateness) {
  if (!GST_CLOCK_TIME_IS_VALID(max_lateness) || diff <= 0 || GstClockTime(diff) <= max_lateness) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (GST_CLOCK_TIME_IS_VALID(timestamp) && timestamp < moved_at_) return;
  // Reports of one episode overlap (each late frame reports its own lateness): the largest is enough.
  if (GstClockTime(diff) > skip_) skip_ = GstClockTime(diff);
}

void LiveTimeline::reset() {
  std::lock_guard<std::mutex> lock(mu_);
  offset_ = GST_CLOCK_TIME_NONE;
  skip_ = 0;
  moved_at_ = 0;
}

}  // namespace latent::gst
