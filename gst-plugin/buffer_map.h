// Mappings of buffer memory that end exactly once. A mapping ends at release() or when its guard goes out of
// scope, whichever comes first, so an exception thrown between the two can neither leave memory mapped nor unmap
// it a second time (which GStreamer answers with a critical and an extra unref of the memory).
#pragma once

#include <gst/gst.h>
#include <gst/video/video.h>

#include <memory>
#include <utility>

namespace latent::gst {

struct BufferUnref {
  void operator()(GstBuffer* buffer) const { gst_buffer_unref(buffer); }
};
// Owns one reference to a buffer. Declared ahead of the guards mapping it, so it outlives them.
using BufferPtr = std::unique_ptr<GstBuffer, BufferUnref>;

// gst_buffer_map over all of a buffer's memory. The buffer must outlive the mapping; the guard holds no reference.
class BufferMap {
 public:
  BufferMap() = default;
  BufferMap(GstBuffer* buffer, GstMapFlags flags) {
    if (gst_buffer_map(buffer, &info_, flags)) buffer_ = buffer;
  }
  BufferMap(BufferMap&& other) noexcept : buffer_(std::exchange(other.buffer_, nullptr)), info_(other.info_) {}
  BufferMap& operator=(BufferMap&& other) noexcept {
    if (this != &other) {
      release();
      buffer_ = std::exchange(other.buffer_, nullptr);
      info_ = other.info_;
    }
    return *this;
  }
  BufferMap(const BufferMap&) = delete;
  BufferMap& operator=(const BufferMap&) = delete;
  ~BufferMap() { release(); }

  // False when the map failed or the mapping has ended.
  explicit operator bool() const { return buffer_ != nullptr; }
  const GstMapInfo& info() const { return info_; }
  guint8* data() const { return info_.data; }
  gsize size() const { return info_.size; }

  // Ends the mapping now; anything viewing data() must be done with it.
  void release() {
    if (GstBuffer* buffer = std::exchange(buffer_, nullptr)) gst_buffer_unmap(buffer, &info_);
  }

 private:
  GstBuffer* buffer_ = nullptr;
  GstMapInfo info_ = GST_MAP_INFO_INIT;
};

// gst_video_frame_map: planes, strides and offsets come from the buffer's GstVideoMeta when it has one, so padded
// rows and planes are read where they are. The frame holds a reference to the buffer while mapped.
class VideoFrameMap {
 public:
  VideoFrameMap() = default;
  VideoFrameMap(const GstVideoInfo* info, GstBuffer* buffer, GstMapFlags flags)
      : mapped_(gst_video_frame_map(&frame_, info, buffer, flags)) {}
  VideoFrameMap(VideoFrameMap&& other) noexcept : frame_(other.frame_), mapped_(std::exchange(other.mapped_, false)) {}
  VideoFrameMap& operator=(VideoFrameMap&& other) noexcept {
    if (this != &other) {
      release();
      frame_ = other.frame_;
      mapped_ = std::exchange(other.mapped_, false);
    }
    return *this;
  }
  VideoFrameMap(const VideoFrameMap&) = delete;
  VideoFrameMap& operator=(const VideoFrameMap&) = delete;
  ~VideoFrameMap() { release(); }

  explicit operator bool() const { return mapped_; }
  GstVideoFrame* get() { return &frame_; }
  const GstVideoFrame* get() const { return &frame_; }

  void release() {
    if (std::exchange(mapped_, false)) gst_video_frame_unmap(&frame_);
  }

 private:
  GstVideoFrame frame_{};
  bool mapped_ = false;
};

}  // namespace latent::gst
