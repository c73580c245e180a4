// videogen: a source of generated latent video (video/x-latent) from a video diffusion model, endless or of a set
// length, in constant memory.
#pragma once

#include <gst/base/gstpushsrc.h>
#include <gst/gst.h>

G_BEGIN_DECLS
#define GST_TYPE_VIDEO_GEN (gst_video_gen_get_type())
G_DECLARE_FINAL_TYPE(GstVideoGen, gst_video_gen, GST, VIDEO_GEN, GstPushSrc)

#define GST_TYPE_VIDEO_GEN_SCHEDULE (gst_video_gen_schedule_get_type())
GType gst_video_gen_schedule_get_type(void);
#define GST_TYPE_VIDEO_GEN_SAMPLER (gst_video_gen_sampler_get_type())
GType gst_video_gen_sampler_get_type(void);
#define GST_TYPE_VIDEO_GEN_FORMAT (gst_video_gen_format_get_type())
GType gst_video_gen_format_get_type(void);
G_END_DECLS
