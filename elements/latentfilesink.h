// latentfilesink: writes a video/x-latent stream into safetensors files, committed atomically.
#pragma once

#include <gst/base/gstbasesink.h>

G_BEGIN_DECLS

#define GST_TYPE_LATENT_FILE_SINK (gst_latent_file_sink_get_type())
G_DECLARE_FINAL_TYPE(GstLatentFileSink, gst_latent_file_sink, GST, LATENT_FILE_SINK, GstBaseSink)

G_END_DECLS
