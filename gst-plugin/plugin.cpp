// The entry point of the `latent` plugin: registers every element of gst-latent.
#include <gst/gst.h>

#include "elements.h"
#include "latent/runtime/build_info.h"
#include "plugin-config.h"

GST_DEBUG_CATEGORY_STATIC(latent_plugin_debug);
#define GST_CAT_DEFAULT latent_plugin_debug

static gboolean plugin_init(GstPlugin* plugin) {
  GST_DEBUG_CATEGORY_INIT(latent_plugin_debug, "latent", 0, "gst-latent plugin");
  // Only what the build offers is logged here: probing the GPUs would initialise CUDA inside
  // gst-plugin-scanner. A machine without CUDA must still get every element, running on the CPU.
  GST_INFO("core library built %s CUDA", latent::built_with_cuda() ? "with" : "without");
  // Registration only fails for a broken GType; one bad element should not hide the others.
  gboolean ok = FALSE;
  ok |= GST_ELEMENT_REGISTER(latentfilesink, plugin);
  ok |= GST_ELEMENT_REGISTER(latentfilesrc, plugin);
  ok |= GST_ELEMENT_REGISTER(vaedecode, plugin);
  ok |= GST_ELEMENT_REGISTER(vaeencode, plugin);
  ok |= GST_ELEMENT_REGISTER(videogen, plugin);
  ok |= GST_ELEMENT_REGISTER(videorestyle, plugin);
  return ok;
}

GST_PLUGIN_DEFINE(
    GST_VERSION_MAJOR, GST_VERSION_MINOR, latent,
    "Streaming causal video VAEs (Wan 2.1, CogVideoX), latent video generation and latent video I/O on LibTorch",
    plugin_init, LATENT_VERSION, "LGPL", LATENT_PACKAGE, LATENT_ORIGIN)
