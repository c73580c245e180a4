#include "model_glue.h"

#include <c10/util/Exception.h>
#include <torch/types.h>

#include "latent/io/safetensors.h"
#include "latent/runtime/build_info.h"
#include "latent/runtime/default_model.h"
#include "latent/runtime/devices.h"
#include "latent/runtime/shared_models.h"
#include "latent/vae/sharded_streaming.h"
#include "launch_device.h"

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

// The model, device, dtype and devices are read when the model loads, at NULL->READY: a change in READY would
// only take effect after going through NULL, so they carry no MUTABLE_READY flag and their blurbs say so.
constexpr const char* kReadAtLoad = ". Read at NULL->READY: set it in the NULL state";

void install_model_properties(GObjectClass* klass, const std::string& model_blurb) {
  auto flags = GParamFlags(G_PARAM_READWRITE | G_PARAM_STATIC_STRINGS);
  // GObject keeps the blurb pointer for the life of the class.
  const char* blurb = g_intern_string((model_blurb + kReadAtLoad).c_str());
  g_object_class_install_property(klass, PROP_MODEL, g_param_spec_string("model", "Model", blurb, nullptr, flags));
  g_object_class_install_property(
      klass, PROP_DEVICE,
      g_param_spec_string("device", "Device",
                          "Where to compute: auto (the first GPU if any, else the CPU), cpu, cuda, cuda:N. Under "
                          "torchrun auto and cuda mean cuda:LOCAL_RANK, one GPU per process. A device that is missing "
                          "is an error, never a silent fallback. Read at NULL->READY: set it in the NULL state",
                          "auto", flags));
  g_object_class_install_property(
      klass, PROP_DTYPE,
      g_param_spec_string("dtype", "Compute dtype",
                          "auto (float32 on the CPU, bfloat16 on a GPU), float32, float16 or bfloat16; also the "
                          "format of the latents on the wire. Read at NULL->READY: set it in the NULL state",
                          "auto", flags));
}

void install_parallel_properties(GObjectClass* klass, const char* example) {
  install_parallel_properties(klass,
                              "Runs one stream across several devices (patch parallel): a comma-separated list, one "
                              "rank per entry, each computing a band of every frame's rows and exchanging the rows "
                              "at its borders with its neighbours; the result equals one device's",
                              example);
}

void install_parallel_properties(GObjectClass* klass, const std::string& what, const char* example) {
  auto flags = GParamFlags(G_PARAM_READWRITE | G_PARAM_STATIC_STRINGS);
  const std::string blurb = what +
                            ". CUDA devices talk over NCCL; cpu entries (or repeats of one GPU) over an "
                            "in-process backend. Unset or one entry: the 'device' property" +
                            std::string(kReadAtLoad) + ". Example: " + std::string(example);
  g_object_class_install_property(
      klass, PROP_DEVICES, g_param_spec_string("devices", "Devices", g_intern_string(blurb.c_str()), nullptr, flags));
  g_object_class_install_property(
      klass, PROP_RANK_TIMEOUT,
      g_param_spec_uint("rank-timeout", "Rank timeout",
                        "Seconds a rank waits for another (with devices) before the element fails with an error "
                        "instead of hanging",
                        1, 24 * 3600, 60, GParamFlags(flags | GST_PARAM_MUTABLE_READY)));
}

void install_memory_properties(GObjectClass* klass) {
  const auto flags = GParamFlags(G_PARAM_READWRITE | G_PARAM_STATIC_STRINGS | GST_PARAM_MUTABLE_READY);
  g_object_class_install_property(
      klass, PROP_TILE_SIZE,
      g_param_spec_uint(
          "tile-size", "Tile size",
          "Spatial tiles of this many pixels square, as diffusers' enable_tiling(tile_sample_min_height=, "
          "tile_sample_min_width=): each overlapping tile is coded with its own caches and the tiles are blended at "
          "their borders, so activation memory is that of one tile. CogVideoX only (its GroupNorm spans the frame, so "
          "the output changes as with diffusers' tiling); for Wan use band-height or max-memory, which are exact. "
          "Frames within one tile are not tiled. 0 = off",
          0, 16384, 0, flags));
  g_object_class_install_property(
      klass, PROP_TILE_OVERLAP,
      g_param_spec_double("tile-overlap", "Tile overlap",
                          "Fraction of a tile shared with its neighbour when tile-size is set (tile_overlap_factor_*); "
                          "0 = diffusers' defaults, 1/6 vertically and 1/5 horizontally",
                          0.0, 0.9, 0.0, flags));
  g_object_class_install_property(
      klass, PROP_BAND_HEIGHT,
      g_param_spec_uint(
          "band-height", "Band height",
          "Exact spatial bands of this many pixel rows (Wan 2.1 and 2.2; a multiple of the model's spatial factor, 8 "
          "or 16): each chunk is computed band by band, every band from its rows plus the context its convolutions "
          "read (recomputed), the temporal caches kept once for the frame; only the attention, at latent "
          "resolution, sees the whole frame. The output equals whole frames'; activation memory follows the band. "
          "Bands cost extra "
          "compute for the recomputed rows (docs/performance.md). 0 = whole frames, or what max-memory picks. "
          "E.g. vaedecode band-height=256 ! ... for 2160x3840",
          0, 65536, 0, flags));
  g_object_class_install_property(
      klass, PROP_MAX_MEMORY,
      g_param_spec_int("max-memory", "Max memory",
                       "Activation memory per chunk to stay within, MiB (Wan): when band-height is 0, the tallest "
                       "exact bands whose estimated activations fit are chosen at the first chunk (whole frames "
                       "when they fit); a budget below one-row bands is an error naming the least. The estimate "
                       "covers activations and caches, not the weights or queued buffers. -1 = automatic: on a GPU "
                       "90% of the device's free memory at the first chunk (one device; the least estimate's bands "
                       "when nothing fits), no bound on the CPU. 0 = no bound",
                       -1, G_MAXINT, -1, flags));
}

TileOptions MemorySettings::tiles() const {
  TileOptions t;
  t.height = t.width = int64_t(tile_size);
  if (tile_overlap > 0) t.overlap_height = t.overlap_width = tile_overlap;
  return t;
}

BandOptions MemorySettings::bands() const {
  BandOptions b;
  b.height = int64_t(band_height);
  b.max_bytes = max_memory > 0 ? size_t(max_memory) << 20 : 0;
  b.automatic = max_memory < 0;
  return b;
}

bool set_memory_property(GObject* object, MemorySettings& settings, guint id, const GValue* value) {
  if (id < PROP_TILE_SIZE || id > PROP_MAX_MEMORY) return false;
  GST_OBJECT_LOCK(object);
  switch (id) {
    case PROP_TILE_SIZE: settings.tile_size = g_value_get_uint(value); break;
    case PROP_TILE_OVERLAP: settings.tile_overlap = g_value_get_double(value); break;
    case PROP_BAND_HEIGHT: settings.band_height = g_value_get_uint(value); break;
    default: settings.max_memory = g_value_get_int(value); break;
  }
  GST_OBJECT_UNLOCK(object);
  return true;
}

bool get_memory_property(GObject* object, const MemorySettings& settings, guint id, GValue* value) {
  if (id < PROP_TILE_SIZE || id > PROP_MAX_MEMORY) return false;
  GST_OBJECT_LOCK(object);
  switch (id) {
    case PROP_TILE_SIZE: g_value_set_uint(value, settings.tile_size); break;
    case PROP_TILE_OVERLAP: g_value_set_double(value, settings.tile_overlap); break;
    case PROP_BAND_HEIGHT: g_value_set_uint(value, settings.band_height); break;
    default: g_value_set_int(value, settings.max_memory); break;
  }
  GST_OBJECT_UNLOCK(object);
  return true;
}

bool set_model_property(GObject* object, ModelSettings& settings, guint id, const GValue* value) {
  if (id == PROP_RANK_TIMEOUT) {
    GST_OBJECT_LOCK(object);
    settings.rank_timeout_s = g_value_get_uint(value);
    GST_OBJECT_UNLOCK(object);
    return true;
  }
  if (id == PROP_DEVICES) {
    const char* s = g_value_get_string(value);
    GST_OBJECT_LOCK(object);
    settings.devices = s ? s : "";
    GST_OBJECT_UNLOCK(object);
    return true;
  }
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
  if (id == PROP_RANK_TIMEOUT) {
    GST_OBJECT_LOCK(object);
    g_value_set_uint(value, settings.rank_timeout_s);
    GST_OBJECT_UNLOCK(object);
    return true;
  }
  if (id == PROP_DEVICES) {
    GST_OBJECT_LOCK(object);
    g_value_set_string(value, settings.devices.empty() ? nullptr : settings.devices.c_str());
    GST_OBJECT_UNLOCK(object);
    return true;
  }
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

void warn_once_if_non_finite(GstElement* element, bool& warned, const torch::Tensor& latent, uint64_t index,
                             GstClockTime pts, const char* consequence) {
  if (warned) return;
  const int64_t nan = torch::isnan(latent).sum().item<int64_t>(), inf = torch::isinf(latent).sum().item<int64_t>();
  if (nan + inf == 0) return;
  warned = true;
  GST_ELEMENT_WARNING(element, STREAM, DECODE,
                      ("Latent %llu (pts %" GST_TIME_FORMAT ") holds %lld NaN and %lld infinite values: %s. Said "
                       "once a stream.",
                       (unsigned long long)index, GST_TIME_ARGS(pts), (long long)nan, (long long)inf, consequence),
                      ("the model, its weights or the data upstream produced them"));
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

namespace {

std::vector<std::string> device_list(const std::string& devices) {
  std::vector<std::string> out;
  size_t start = 0;
  for (;;) {
    const size_t comma = devices.find(',', start);
    std::string item = devices.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    item.erase(0, item.find_first_not_of(" \t"));
    item.erase(item.find_last_not_of(" \t") + 1);
    out.push_back(item);
    if (comma == std::string::npos) return out;
    start = comma + 1;
  }
}

template <typename Stream, typename Make>
std::unique_ptr<Stream> make_stream(GstElement* element, const char* what, Make make) {
  init_debug();
  try {
    return make();
  } catch (const std::exception& e) {
    GST_ELEMENT_ERROR(element, RESOURCE, SETTINGS,
                      ("Cannot start the %s on its devices: %s", what, first_line(e.what()).c_str()), ("%s", e.what()));
    return nullptr;
  }
}

}  // namespace

parallel::GroupOptions group_options(const ModelSettings& settings) {
  parallel::GroupOptions o;
  o.timeout = std::chrono::seconds(settings.rank_timeout_s);
  return o;
}

std::vector<ModelSettings> rank_settings(GstElement* element, const ModelSettings& settings) {
  init_debug();
  if (settings.devices.empty()) return {settings};
  const std::vector<std::string> list = device_list(settings.devices);
  for (const auto& d : list) {
    if (d.empty()) {
      GST_ELEMENT_ERROR(element, RESOURCE, SETTINGS,
                        ("The devices list '%s' has an empty entry.", settings.devices.c_str()),
                        ("write devices as cuda:0,cuda:1 or cpu,cpu"));
      return {};
    }
  }
  ModelSettings s = settings;
  if (s.dtype == "auto") {
    // Every rank computes in one dtype: the one the first device would pick.
    try {
      const auto t = resolve_dtype("auto", resolve_device(list[0]));
      s.dtype = t == torch::kBFloat16 ? "bfloat16" : t == torch::kHalf ? "float16" : "float32";
    } catch (const std::exception&) {
      // Loading names the missing device.
    }
  }
  std::vector<ModelSettings> out;
  for (const auto& d : list) {
    ModelSettings one = s;
    one.device = d;
    out.push_back(one);
  }
  return out;
}

bool place_on_local_rank(GstElement* element, ModelSettings& settings) {
  init_debug();
  if (!settings.devices.empty()) return true;
  const LaunchVariables env = LaunchVariables::from_environment();
  if (!env.present()) return true;
  try {
    const std::string device = device_for_process(settings.device, env, cuda_device_count());
    if (device != settings.device)
      GST_INFO_OBJECT(element, "device %s under torchrun (LOCAL_RANK=%s): %s", settings.device.c_str(),
                      env.local_rank.c_str(), device.c_str());
    settings.device = device;
    return true;
  } catch (const std::exception& e) {
    GST_ELEMENT_ERROR(element, RESOURCE, SETTINGS, ("Cannot pick this process's GPU: %s", e.what()),
                      ("device property: %s; WORLD_SIZE=%s RANK=%s LOCAL_RANK=%s", settings.device.c_str(),
                       env.world_size.c_str(), env.rank.c_str(), env.local_rank.c_str()));
    return false;
  }
}

std::vector<std::shared_ptr<const Vae>> acquire_models_locked(GstElement* element, const ModelSettings& settings) {
  GST_OBJECT_LOCK(element);
  ModelSettings s = settings;
  GST_OBJECT_UNLOCK(element);
  if (!place_on_local_rank(element, s)) return {};
  std::vector<std::shared_ptr<const Vae>> models;
  for (const ModelSettings& one : rank_settings(element, s)) {
    auto m = acquire_model(element, one);
    if (!m) return {};
    models.push_back(m);
  }
  return models;
}

std::unique_ptr<EncoderStream> make_encoder(GstElement* element, const std::vector<std::shared_ptr<const Vae>>& models,
                                            const EncoderOptions& options, const ModelSettings& settings) {
  return make_stream<EncoderStream>(element, "encoder",
                                    [&] { return open_encoder(models, options, group_options(settings)); });
}

std::unique_ptr<DecoderStream> make_decoder(GstElement* element, const std::vector<std::shared_ptr<const Vae>>& models,
                                            const DecoderOptions& options, const ModelSettings& settings) {
  return make_stream<DecoderStream>(element, "decoder",
                                    [&] { return open_decoder(models, options, group_options(settings)); });
}

bool check_rows_for_ranks(GstElement* element, const Vae& model, int64_t height, size_t ranks) {
  const int64_t rows = height / model.spec().spatial_factor;
  if (ranks <= 1 || rows >= int64_t(ranks)) return true;
  init_debug();
  GST_ELEMENT_ERROR(
      element, CORE, NEGOTIATION,
      ("%zu devices need frames of at least %zu latent rows (%lld pixels); these have %lld.", ranks, ranks,
       static_cast<long long>(int64_t(ranks) * model.spec().spatial_factor), static_cast<long long>(rows)),
      ("use fewer devices or taller frames"));
  return false;
}

void record_compute_time(GstElement* element, ChunkStats& stats, LatencyBound& bound,
                         std::chrono::steady_clock::duration d) {
  stats.add(d);
  const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(d).count();
  if (bound.add(GstClockTime(ns))) gst_element_post_message(element, gst_message_new_latency(GST_OBJECT(element)));
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
