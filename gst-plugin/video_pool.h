// Where an element's raw video frames are written: a buffer pool chosen with downstream through the ALLOCATION
// query, as GstVideoDecoder does. Downstream's pool when it offers one (a sink that maps its own memory, a
// converter that recycles), otherwise a GstVideoBufferPool of the element's own sized for the caps; buffers carry
// a GstVideoMeta when downstream reads it, so a pool may pad rows and the frames are written at its strides.
#pragma once

#include <gst/gst.h>
#include <gst/video/video.h>

#include <mutex>

namespace latent::gst {

class VideoOutputPool {
 public:
  VideoOutputPool() = default;
  VideoOutputPool(const VideoOutputPool&) = delete;
  VideoOutputPool& operator=(const VideoOutputPool&) = delete;
  ~VideoOutputPool() { stop(); }

  // Asks `srcpad`'s peer how to allocate frames of `caps` (fixed, already sent) and activates the pool for them,
  // replacing the pool of earlier caps. A pool that refuses its configuration or cannot be activated is replaced
  // by the next choice with a WARNING message on `element`: downstream's, then one of our own, then a buffer
  // allocated per frame. Streaming thread.
  void negotiate(GstElement* element, GstPad* srcpad, GstCaps* caps);

  // A buffer for one frame of the negotiated caps. GST_FLOW_FLUSHING while the pool is flushing or inactive (a
  // flush or a state change under way). Streaming thread.
  GstFlowReturn acquire(GstBuffer** buffer);

  // Wakes a thread waiting in acquire() for a buffer (FLUSH_START, PAUSED->READY) and lets acquire() hand out
  // buffers again (FLUSH_STOP). Any thread.
  void set_flushing(bool flushing);

  // Deactivates and drops the pool (PAUSED->READY). Not while another thread is in acquire().
  void stop();

  // The pool frames come from now, with a reference; null when none could be activated.
  GstBufferPool* pool() const;

 private:
  mutable std::mutex mutex_;  // pool_: set_flushing() runs on other threads
  GstBufferPool* pool_ = nullptr;
  GstVideoInfo info_{};
  GstAllocator* allocator_ = nullptr;  // for frames allocated one by one
  GstAllocationParams params_{};
};

}  // namespace latent::gst
