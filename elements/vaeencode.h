// vaeencode: raw video -> latent frames of a causal video VAE, streamed with carried temporal caches.
#pragma once

#include <gst/gst.h>

#include "latent_filter.h"

G_BEGIN_DECLS
#define GST_TYPE_VAE_ENCODE (gst_vae_encode_get_type())
G_DECLARE_FINAL_TYPE(GstVaeEncode, gst_vae_encode, GST, VAE_ENCODE, GstLatentFilter)
G_END_DECLS
