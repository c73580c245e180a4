#include "held_events.h"

namespace latent::gst {

HeldEvents::~HeldEvents() { clear(); }

void HeldEvents::clear() {
  for (Held& h : held_) gst_event_unref(h.event);
  held_.clear();
}

void HeldEvents::hold(GstEvent* event, uint64_t position) { held_.push_back({event, position}); }

bool HeldEvents::release_before(GstPad* pad, uint64_t end) {
  bool ok = true;
  while (!held_.empty() && held_.front().position < end) {
    GstEvent* e = held_.front().event;
    held_.pop_front();
    ok = gst_pad_push_event(pad, e) && ok;
  }
  return ok;
}

bool HeldEvents::release_all(GstPad* pad) { return release_before(pad, UINT64_MAX); }

void HeldEvents::flush() {
  std::deque<Held> kept;
  for (Held& h : held_) {
    if (GST_EVENT_IS_STICKY(h.event) && GST_EVENT_TYPE(h.event) != GST_EVENT_SEGMENT) {
      kept.push_back({h.event, 0});
    } else {
      gst_event_unref(h.event);
    }
  }
  held_.swap(kept);
}

bool waits_behind_data(GstEvent* event) {
  if (!GST_EVENT_IS_SERIALIZED(event)) return false;
  switch (GST_EVENT_TYPE(event)) {
    case GST_EVENT_CAPS:
    case GST_EVENT_SEGMENT:
    case GST_EVENT_STREAM_START:
    case GST_EVENT_EOS:
    case GST_EVENT_FLUSH_STOP:
    case GST_EVENT_SEGMENT_DONE: return false;
    default: return true;
  }
}

}  // namespace latent::gst
