// videorestyle: latent frames -> the same frames regenerated under a prompt by a causal few-step Wan model, one frame
// at a time (StreamDiffusionV2's streaming video-to-video).
#pragma once

#include <gst/gst.h>

#include "latent_filter.h"

G_BEGIN_DECLS
#define GST_TYPE_VIDEO_RESTYLE (gst_video_restyle_get_type())
G_DECLARE_FINAL_TYPE(GstVideoRestyle, gst_video_restyle, GST, VIDEO_RESTYLE, GstLatentFilter)
G_END_DECLS
