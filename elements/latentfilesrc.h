// latentfilesrc: reads latent streams written by latentfilesink (one file, or a numbered sequence).
#pragma once

#include <gst/base/gstpushsrc.h>

G_BEGIN_DECLS

#define GST_TYPE_LATENT_FILE_SRC (gst_latent_file_src_get_type())
G_DECLARE_FINAL_TYPE(GstLatentFileSrc, gst_latent_file_src, GST, LATENT_FILE_SRC, GstPushSrc)

G_END_DECLS
