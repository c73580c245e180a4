#include "latency.h"

#include <algorithm>
#include <cmath>

namespace latent::gst {

LatencyBound::LatencyBound(size_t window, double headroom) : window_(std::max<size_t>(window, 1)), headroom_(headroom) {
  recent_.reserve(window_);
}

GstClockTime LatencyBound::padded(GstClockTime t) const {
  // Whole milliseconds, rounded up: nothing below that matters to a sink, and it keeps repeated answers equal.
  const double ns = std::ceil(double(t) * headroom_ / double(GST_MSECOND)) * double(GST_MSECOND);
  return GstClockTime(ns);
}

bool LatencyBound::add(GstClockTime t) {
  if (!GST_CLOCK_TIME_IS_VALID(t)) return false;
  std::lock_guard<std::mutex> lock(mu_);
  if (recent_.size() < window_) {
    recent_.push_back(t);
  } else {
    recent_[next_] = t;
  }
  next_ = (next_ + 1) % window_;
  if (t > announced_) {
    announced_ = padded(t);
    return true;
  }
  if (recent_.size() < window_) return false;
  const GstClockTime lower = padded(*std::max_element(recent_.begin(), recent_.end()));
  if (lower * 2 > announced_) return false;
  announced_ = lower;
  return true;
}

GstClockTime LatencyBound::announced() const {
  std::lock_guard<std::mutex> lock(mu_);
  return announced_;
}

void LatencyBound::reset() {
  std::lock_guard<std::mutex> lock(mu_);
  recent_.clear();
  next_ = 0;
  announced_ = 0;
}

}  // namespace latent::gst
