// Every element of the `latent` plugin; each element file defines its registration function with
// GST_ELEMENT_REGISTER_DEFINE and plugin.cpp calls them all.
#pragma once

#include <gst/gst.h>

GST_ELEMENT_REGISTER_DECLARE(latentfilesink);
GST_ELEMENT_REGISTER_DECLARE(latentfilesrc);
GST_ELEMENT_REGISTER_DECLARE(vaedecode);
GST_ELEMENT_REGISTER_DECLARE(vaeencode);
GST_ELEMENT_REGISTER_DECLARE(videogen);
GST_ELEMENT_REGISTER_DECLARE(videorestyle);
