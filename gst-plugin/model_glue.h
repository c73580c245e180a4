// What vaeencode and vaedecode share: the model/device/dtype properties, loading a shared model at
// NULL->READY, and turning C++ exceptions into GStreamer errors a user can act on.
#pragma once

#include <gst/gst.h>

#include <exception>
#include <memory>
#include <string>

#include "latent/vae.h"
#include "latent_caps.h"

namespace latent::gst {

struct ModelSettings {
  std::string model;
  std::string device = "auto";
  std::string dtype = "auto";
};

enum ModelProperty { PROP_MODEL = 1, PROP_DEVICE, PROP_DTYPE, PROP_FIRST_FREE };

// Installs "model", "device" and "dtype" as properties 1-3 (changes take effect at the next NULL->READY).
void install_model_properties(GObjectClass* klass, const char* direction);
// Handles the three properties; false for any other id.
bool set_model_property(GObject* object, ModelSettings& settings, guint id, const GValue* value);
bool get_model_property(GObject* object, const ModelSettings& settings, guint id, GValue* value);

// Loads (or shares an already loaded copy of) the model. On failure posts an ERROR message naming the problem
// and returns nullptr.
std::shared_ptr<const Vae> acquire_model(GstElement* element, const ModelSettings& settings);

// Posts the ERROR message for an exception caught at the element boundary while streaming.
void post_exception(GstElement* element, const char* doing, const std::exception& e);

LatentFormat latent_format_for(c10::ScalarType dtype);

}  // namespace latent::gst
