#include "model_glue.h"

#include <c10/util/Exception.h>

#include "latent/io/safetensors.h"
#include "latent/runtime/default_model.h"
#include "latent/runtime/devices.h"
#include "latent/runtime/shared_models.h"

GST_DEBUG_CATEGORY_STATIC(latent_model_debug);
#define GST_CAT_DEFAULT latent_model_debug

namespace latent::gst {
namespace {

void init_debug() {
  static gsize once = 0;
  if (g_once_init_enter(&once)) {
    GST_DEBUG_CATEGORY_INIT(latent_model_debug, "latentmodel", 0, "gst-latent model loading");
    g_once_init_leave(&once, 1);
  }
}

std::string first_line(const std::string& s) { return s.substr(0, s.find('\n')); }

}  // namespace

void install_model_properties(GObjectClass* klass, const char* direction) {
  std::string blurb = std::string("The VAE ") + direction +
                      " with: a diffusers folder (config.json + diffusion_pytorch_model.safetensors), a "
                      ".safetensors file or a Wan2.1_VAE.pth checkpoint. Unset: the embedded default model, " +
                      std::string(latent::kDefaultModelFile) + " (small, trained for demos and tests)";
  install_model_properties(klass, blurb);
}

void install_model_properties(GObjectClass* klass, const std::string& model_blurb) {
  auto flags = GParamFlags(G_PARAM_READWRITE | G_PARAM_STATIC_STRINGS | GST_PARAM_MUTABLE_READY);
  // GObject keeps the blurb pointer for the life of the class.
  const char* blurb = g_intern_string(model_blurb.c_str());
  g_object_class_install_property(klass, PROP_MODEL, g_param_spec_string("model", "Model", blurb, nullptr, flags));
  g_object_class_install_property(
      klass, PROP_DEVICE,
      g_param_spec_string("device", "Device",
                          "Where to compute: auto (the first GPU if any, else the CPU), cpu, cuda, cuda:N. A device "
                          "that is missing is an error, never a silent fallback",
                          "auto", flags));
  g_object_class_install_property(
      klass, PROP_DTYPE,
      g_param_spec_string("dtype", "Compute dtype",
                          "auto (float32 on the CPU, bfloat16 on a GPU), float32, float16 or bfloat16; also the "
                          "format of the latents on the wire",
                          "auto", flags));
}

bool set_model_property(GObject* object, ModelSettings& settings, guint id, const GValue* value) {
  std::string* field = id == PROP_MODEL    ? &settings.model
                       : id == PROP_DEVICE ? &settings.device
                       : id == PROP_DTYPE  ? &settings.dtype
                                           : nullptr;
  if (!field) return false;
  const char* s = g_value_get_string(value);
  GST_OBJECT_LOCK(object);
  *field = s ? s : (id == PROP_MODEL ? "" : "auto");
  GST_OBJECT_UNLOCK(object);
  return true;
}

bool get_model_property(GObject* object, const ModelSettings& settings, guint id, GValue* value) {
  const std::string* field = id == PROP_MODEL    ? &settings.model
                             : id == PROP_DEVICE ? &settings.device
                             : id == PROP_DTYPE  ? &settings.dtype
                                                 : nullptr;
  if (!field) return false;
  GST_OBJECT_LOCK(object);
  g_value_set_string(value, field->empty() ? nullptr : field->c_str());
  GST_OBJECT_UNLOCK(object);
  return true;
}

bool load_model(GstElement* element, const ModelSettings& s, const DefaultModel& fallback, const Loader& load) {
  init_debug();
  std::string model = s.model;
  if (model.empty()) {
    try {
      model = fallback.find().string();
    } catch (const ModelError& e) {
      GST_ELEMENT_ERROR(element, RESOURCE, NOT_FOUND, ("No model set, and the default %s is missing.", fallback.what),
                        ("%s. Set the 'model' property to %s.", e.what(), fallback.accepted));
      return false;
    }
  }
  try {
    LoadOptions options;
    options.device = resolve_device(s.device);
    options.dtype = resolve_dtype(s.dtype, options.device);
    GST_INFO_OBJECT(element, "loading %s on %s as %s", model.c_str(), options.device.str().c_str(),
                    c10::toString(options.dtype));
    load(model, options);
    return true;
  } catch (const DeviceError& e) {
    GST_ELEMENT_ERROR(element, RESOURCE, NOT_FOUND, ("%s", e.what()), ("device property: %s", s.device.c_str()));
  } catch (const ModelError& e) {
    GST_ELEMENT_ERROR(element, RESOURCE, OPEN_READ,
                      ("Cannot load model '%s': %s", model.c_str(), first_line(e.what()).c_str()), ("%s", e.what()));
  } catch (const SafetensorsError& e) {
    GST_ELEMENT_ERROR(element, RESOURCE, OPEN_READ, ("Cannot load model '%s': %s", model.c_str(), e.what()), (nullptr));
  } catch (const c10::OutOfMemoryError& e) {
    GST_ELEMENT_ERROR(element, RESOURCE, NO_SPACE_LEFT,
                      ("Out of memory loading model '%s' on %s", model.c_str(), s.device.c_str()),
                      ("%s", first_line(e.what()).c_str()));
  } catch (const std::exception& e) {
    GST_ELEMENT_ERROR(element, RESOURCE, OPEN_READ,
                      ("Cannot load model '%s': %s", model.c_str(), first_line(e.what()).c_str()), ("%s", e.what()));
  }
  return false;
}

std::shared_ptr<const Vae> acquire_model(GstElement* element, const ModelSettings& s) {
  static const DefaultModel vae{"model", find_default_model,
                                "a diffusers VAE folder, a .safetensors file or a .pth file"};
  std::shared_ptr<const Vae> out;
  load_model(element, s, vae, [&](const std::string& path, const LoadOptions& o) { out = shared_vae(path, o); });
  return out;
}

void post_exception(GstElement* element, const char* doing, const std::exception& e) {
  init_debug();
  if (dynamic_cast<const c10::OutOfMemoryError*>(&e)) {
    GST_ELEMENT_ERROR(element, RESOURCE, NO_SPACE_LEFT, ("Out of memory while %s.", doing),
                      ("%s", first_line(e.what()).c_str()));
  } else if (dynamic_cast<const std::invalid_argument*>(&e) || dynamic_cast<const ModelError*>(&e)) {
    GST_ELEMENT_ERROR(element, STREAM, FORMAT, ("Cannot continue %s: %s", doing, e.what()), (nullptr));
  } else {
    GST_ELEMENT_ERROR(element, STREAM, FAILED, ("Failed while %s: %s", doing, first_line(e.what()).c_str()),
                      ("%s", e.what()));
  }
}

std::shared_ptr<const Vae> acquire_model_locked(GstElement* element, const ModelSettings& settings) {
  GST_OBJECT_LOCK(element);
  ModelSettings copy = settings;
  GST_OBJECT_UNLOCK(element);
  return acquire_model(element, copy);
}

void LatencyAnnouncer::update(GstElement* element, GstClockTime now) {
  if (GST_CLOCK_TIME_IS_VALID(last) && (now > last ? now - last : last - now) < GST_MSECOND) return;
  last = now;
  gst_element_post_message(element, gst_message_new_latency(GST_OBJECT(element)));
}

gboolean answer_latency_query(GstPad* sinkpad, GstQuery* query, GstClockTime ours) {
  if (!gst_pad_peer_query(sinkpad, query)) return FALSE;
  gboolean live;
  GstClockTime min, max;
  gst_query_parse_latency(query, &live, &min, &max);
  min += ours;
  if (GST_CLOCK_TIME_IS_VALID(max)) max += ours;
  gst_query_set_latency(query, live, min, max);
  return TRUE;
}

LatentFormat latent_format_for(c10::ScalarType dtype) {
  switch (dtype) {
    case c10::kHalf: return LatentFormat::F16;
    case c10::kBFloat16: return LatentFormat::BF16;
    default: return LatentFormat::F32;
  }
}

}  // namespace latent::gst
