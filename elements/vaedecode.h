// vaedecode: latent frames of a causal video VAE -> raw video, streamed with carried temporal caches.
#pragma once

#include <gst/gst.h>

#include "latent_filter.h"

G_BEGIN_DECLS
#define GST_TYPE_VAE_DECODE (gst_vae_decode_get_type())
G_DECLARE_FINAL_TYPE(GstVaeDecode, gst_vae_decode, GST, VAE_DECODE, GstLatentFilter)
G_END_DECLS
