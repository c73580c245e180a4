// Serialized events that arrive while an element still holds data (frames waiting to fill a chunk, latents
// waiting to be decoded) must not overtake that data, or the held output would go out under the next segment,
// tags or gap. As GstVideoEncoder does, each such event is tagged with the input it came before and goes out just
// ahead of the first output that covers that input, or when the element drains.
#pragma once

#include <gst/gst.h>

#include <cstdint>
#include <deque>

namespace latent::gst {

class HeldEvents {
 public:
  HeldEvents() = default;
  ~HeldEvents();
  HeldEvents(const HeldEvents&) = delete;
  HeldEvents& operator=(const HeldEvents&) = delete;

  // Takes `event`, which arrived when `position` inputs of the stream had been received.
  void hold(GstEvent* event, uint64_t position);
  // Pushes on `pad`, in arrival order, the events that came before input `end`: call it before pushing an
  // output that covers inputs below `end`. False when a push failed (the rest are still pushed).
  bool release_before(GstPad* pad, uint64_t end);
  bool release_all(GstPad* pad);
  // A flush: the stream starts again at input 0. Sticky events other than SEGMENT (a new one follows the flush)
  // stay, to go out before the first output; the others are dropped.
  void flush();
  void clear();
  bool empty() const { return held_.empty(); }
  size_t size() const { return held_.size(); }

 private:
  struct Held {
    GstEvent* event;
    uint64_t position;
  };
  std::deque<Held> held_;
};

// Whether vaeencode/vaedecode keep `event` behind held data: the serialized events that are neither data
// boundaries they act on themselves (CAPS, SEGMENT, STREAM_START, EOS, flushes) nor out of band.
bool waits_behind_data(GstEvent* event);

}  // namespace latent::gst
