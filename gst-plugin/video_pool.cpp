#include "video_pool.h"

#include <algorithm>
#include <string>
#include <utility>

GST_DEBUG_CATEGORY_STATIC(latent_pool_debug);
#define GST_CAT_DEFAULT latent_pool_debug

namespace latent::gst {
namespace {

void init_debug() {
  static gsize once = 0;
  if (g_once_init_enter(&once)) {
    GST_DEBUG_CATEGORY_INIT(latent_pool_debug, "latentpool", 0, "gst-latent output buffer pools");
    g_once_init_leave(&once, 1);
  }
}

// What the ALLOCATION query's answer offers.
struct Offer {
  GstBufferPool* pool = nullptr;  // owned
  guint size = 0, min = 0, max = 0;
  GstAllocator* allocator = nullptr;  // owned
  GstAllocationParams params{};
  bool video_meta = false;
};

Offer ask_downstream(GstElement* element, GstPad* srcpad, GstCaps* caps, const GstVideoInfo& info) {
  Offer o;
  gst_allocation_params_init(&o.params);
  o.size = guint(GST_VIDEO_INFO_SIZE(&info));
  GstQuery* query = gst_query_new_allocation(caps, TRUE);
  if (!gst_pad_peer_query(srcpad, query)) GST_DEBUG_OBJECT(element, "downstream did not answer the ALLOCATION query");
  o.video_meta = gst_query_find_allocation_meta(query, GST_VIDEO_META_API_TYPE, nullptr);
  if (gst_query_get_n_allocation_params(query) > 0)
    gst_query_parse_nth_allocation_param(query, 0, &o.allocator, &o.params);
  if (gst_query_get_n_allocation_pools(query) > 0) {
    guint size = 0;
    gst_query_parse_nth_allocation_pool(query, 0, &o.pool, &size, &o.min, &o.max);
    // A pool sized below a frame would hand out buffers the frame does not fit in.
    o.size = std::max(o.size, size);
  }
  gst_query_unref(query);
  return o;
}

// Configures `pool` (taken) for the offer and activates it; null, with the reason in `why`, when it will not.
GstBufferPool* start_pool(GstBufferPool* pool, GstCaps* caps, const Offer& o, guint max, std::string& why) {
  GstStructure* config = gst_buffer_pool_get_config(pool);
  gst_buffer_pool_config_set_params(config, caps, o.size, o.min, max);
  gst_buffer_pool_config_set_allocator(config, o.allocator, &o.params);
  if (o.video_meta) gst_buffer_pool_config_add_option(config, GST_BUFFER_POOL_OPTION_VIDEO_META);
  if (!gst_buffer_pool_set_config(pool, config)) {
    // A pool may answer with a configuration of its own: take it when frames of these caps still fit.
    config = gst_buffer_pool_get_config(pool);
    if (!gst_buffer_pool_config_validate_params(config, caps, o.size, o.min, max) ||
        !gst_buffer_pool_set_config(pool, config)) {
      why = "it refuses a configuration for these caps";
      gst_object_unref(pool);
      return nullptr;
    }
  }
  if (!gst_buffer_pool_set_active(pool, TRUE)) {
    why = "it cannot be activated";
    gst_object_unref(pool);
    return nullptr;
  }
  return pool;
}

}  // namespace

void VideoOutputPool::negotiate(GstElement* element, GstPad* srcpad, GstCaps* caps) {
  init_debug();
  stop();  // the old pool's buffers are frames of the old caps
  GstVideoInfo info;
  if (!gst_video_info_from_caps(&info, caps)) {
    GST_WARNING_OBJECT(element, "not raw video caps, no pool: %" GST_PTR_FORMAT, caps);
    return;
  }
  Offer offer = ask_downstream(element, srcpad, caps, info);
  GstBufferPool* pool = nullptr;
  std::string why;
  if (offer.pool) {
    pool = start_pool(std::exchange(offer.pool, nullptr), caps, offer, offer.max, why);
    if (!pool)
      GST_ELEMENT_WARNING(element, RESOURCE, SETTINGS,
                          ("Downstream's buffer pool cannot be used: %s. Using a pool of our own.", why.c_str()),
                          ("caps %" GST_PTR_FORMAT, caps));
  }
  if (!pool) {
    // Ours never runs dry: a downstream that holds many frames (a queue) must not stall the decoder.
    offer.size = guint(GST_VIDEO_INFO_SIZE(&info));
    pool = start_pool(gst_video_buffer_pool_new(), caps, offer, 0, why);
    if (!pool)
      GST_ELEMENT_WARNING(element, RESOURCE, SETTINGS,
                          ("No buffer pool can be used (%s): every frame is allocated on its own.", why.c_str()),
                          ("caps %" GST_PTR_FORMAT, caps));
  }
  GST_DEBUG_OBJECT(element, "frames from %" GST_PTR_FORMAT " (video meta %s)", pool, offer.video_meta ? "on" : "off");
  std::lock_guard<std::mutex> lock(mutex_);
  pool_ = pool;
  info_ = info;
  allocator_ = offer.allocator;
  params_ = offer.params;
}

GstFlowReturn VideoOutputPool::acquire(GstBuffer** buffer) {
  *buffer = nullptr;
  GstBufferPool* pool = this->pool();
  if (!pool) {
    *buffer = gst_buffer_new_allocate(allocator_, GST_VIDEO_INFO_SIZE(&info_), &params_);
    return *buffer ? GST_FLOW_OK : GST_FLOW_ERROR;
  }
  const GstFlowReturn ret = gst_buffer_pool_acquire_buffer(pool, buffer, nullptr);
  gst_object_unref(pool);
  return ret;
}

void VideoOutputPool::set_flushing(bool flushing) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (pool_ && gst_buffer_pool_is_active(pool_)) gst_buffer_pool_set_flushing(pool_, flushing);
}

void VideoOutputPool::stop() {
  GstBufferPool* pool;
  GstAllocator* allocator;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    pool = std::exchange(pool_, nullptr);
    allocator = std::exchange(allocator_, nullptr);
  }
  if (pool) {
    gst_buffer_pool_set_active(pool, FALSE);
    gst_object_unref(pool);
  }
  if (allocator) gst_object_unref(allocator);
}

GstBufferPool* VideoOutputPool::pool() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return pool_ ? GST_BUFFER_POOL(gst_object_ref(pool_)) : nullptr;
}

}  // namespace latent::gst
