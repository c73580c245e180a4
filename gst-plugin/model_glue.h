// What vaeencode and vaedecode share: the model/device/dtype properties, loading a shared model at
// NULL->READY, and turning C++ exceptions into GStreamer errors a user can act on.
#pragma once

#include <gst/gst.h>

#include <atomic>
#include <chrono>
#include <exception>
#include <filesystem>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>

#include "latency.h"
#include "latent/parallel/comm.h"
#include "latent/vae/streaming.h"
#include "latent/vae/vae.h"
#include "latent_caps.h"

namespace latent::gst {

struct ModelSettings {
  std::string model;
  std::string device = "auto";
  std::string dtype = "auto";
  // Patch parallel (vaeencode, vaedecode): a comma-separated device list, one rank per entry; empty: `device`.
  std::string devices;
  guint rank_timeout_s = 60;
};

enum ModelProperty { PROP_MODEL = 1, PROP_DEVICE, PROP_DTYPE, PROP_FIRST_FREE };
// Ids of the patch-parallel properties, apart from each element's own.
enum ParallelProperty { PROP_DEVICES = 1000, PROP_RANK_TIMEOUT };

// Installs "model", "device" and "dtype" as properties 1-3 (changes take effect at the next NULL->READY); the
// first form describes a VAE used in `direction`, the second any model with the blurb given.
void install_model_properties(GObjectClass* klass, const char* direction);
void install_model_properties(GObjectClass* klass, const std::string& model_blurb);
// Installs "devices" and "rank-timeout" (PROP_DEVICES, PROP_RANK_TIMEOUT); `example` is a launch line. The first
// form describes patch parallel (vaeencode, vaedecode); the second starts the blurb with `what` instead.
void install_parallel_properties(GObjectClass* klass, const char* example);
void install_parallel_properties(GObjectClass* klass, const std::string& what, const char* example);
// How vaeencode and vaedecode bound the memory of a frame: tile-size and tile-overlap (CogVideoX's tiles),
// band-height and max-memory (exact bands). Object lock.
struct MemorySettings {
  guint tile_size = 0;
  double tile_overlap = 0;
  guint band_height = 0;
  gint max_memory = -1;  // MiB; -1 automatic (BandOptions::automatic)
  // The core's options: an overlap of 0 keeps diffusers' defaults.
  TileOptions tiles() const;
  BandOptions bands() const;
};
// Ids of the memory properties, apart from each element's own.
enum MemoryProperty { PROP_TILE_SIZE = 1100, PROP_TILE_OVERLAP, PROP_BAND_HEIGHT, PROP_MAX_MEMORY };
// Installs the four (changes take effect at the next READY->PAUSED).
void install_memory_properties(GObjectClass* klass);
// Handles the memory properties under the object lock; false for any other id.
bool set_memory_property(GObject* object, MemorySettings& settings, guint id, const GValue* value);
bool get_memory_property(GObject* object, const MemorySettings& settings, guint id, GValue* value);
// Handles the model and parallel properties; false for any other id.
bool set_model_property(GObject* object, ModelSettings& settings, guint id, const GValue* value);
bool get_model_property(GObject* object, const ModelSettings& settings, guint id, GValue* value);

// What an element loads when no model is set: a name for messages, where it is looked for, and what the model
// property accepts instead.
struct DefaultModel {
  const char* what;
  std::filesystem::path (*find)();
  const char* accepted;
};
using Loader = std::function<void(const std::string& path, const LoadOptions& options)>;

// Resolves the settings (the default model when none is set, the device, the dtype) and calls `load`. Every
// failure is posted as an ERROR message naming the model and the problem; returns whether it loaded.
bool load_model(GstElement* element, const ModelSettings& settings, const DefaultModel& fallback, const Loader& load);

// Loads (or shares an already loaded copy of) the model. On failure posts an ERROR message naming the problem
// and returns nullptr.
std::shared_ptr<const Vae> acquire_model(GstElement* element, const ModelSettings& settings);

// A latent with NaN or infinite values would travel on silently (decoded: black or garbage frames): a WARNING once
// a stream (`warned` is the stream's flag) naming the first such latent, its values and `consequence`. The latent
// still goes on: a live stream keeps running and the application decides.
void warn_once_if_non_finite(GstElement* element, bool& warned, const torch::Tensor& latent, uint64_t index,
                             GstClockTime pts, const char* consequence);

// Posts the ERROR message for an exception caught at the element boundary while streaming.
void post_exception(GstElement* element, const char* doing, const std::exception& e);

// Runs `f` at the element boundary: an exception becomes an ERROR message and false, never a C++ exception
// unwinding through GStreamer's C frames (std::terminate).
template <class F>
bool guarded(GstElement* element, const char* doing, F&& f) noexcept {
  try {
    f();
    return true;
  } catch (const std::exception& e) {
    post_exception(element, doing, e);
  } catch (...) {
    post_exception(element, doing, std::runtime_error("an exception of unknown type"));
  }
  return false;
}

LatentFormat latent_format_for(c10::ScalarType dtype);

// The settings of each rank of `settings.devices` (one entry: `device` set to it), every rank in the dtype the
// first device would pick when dtype is auto; just `settings` without devices. Empty after posting an ERROR message
// (an empty entry in the list).
std::vector<ModelSettings> rank_settings(GstElement* element, const ModelSettings& settings);
// How long a rank of the settings' group waits for another.
parallel::GroupOptions group_options(const ModelSettings& settings);

// Under torchrun (launch_device.h), a device left to the element (auto, cuda) becomes the GPU of this process's
// LOCAL_RANK; settings with a devices list are left alone. False after posting an ERROR message (a LOCAL_RANK that
// is malformed or names a GPU the machine does not have).
bool place_on_local_rank(GstElement* element, ModelSettings& settings);

// Loads the model for the settings as they stand (read under the object lock) at NULL->READY.
std::shared_ptr<const Vae> acquire_model_locked(GstElement* element, const ModelSettings& settings);
// One model per rank: `devices` entries in order (ranks on one device share it), or just the `device` one (under
// torchrun, place_on_local_rank's). Every rank computes in the first device's dtype when dtype is auto. Empty after
// posting an ERROR message.
std::vector<std::shared_ptr<const Vae>> acquire_models_locked(GstElement* element, const ModelSettings& settings);

// The stream for `models`: one device's, or a patch-parallel group's over all of them. Null after posting an
// ERROR message (a group that cannot form).
std::unique_ptr<EncoderStream> make_encoder(GstElement* element, const std::vector<std::shared_ptr<const Vae>>& models,
                                            const EncoderOptions& options, const ModelSettings& settings);
std::unique_ptr<DecoderStream> make_decoder(GstElement* element, const std::vector<std::shared_ptr<const Vae>>& models,
                                            const DecoderOptions& options, const ModelSettings& settings);

// False, after posting a NEGOTIATION error, when frames of `height` pixels have fewer latent rows than ranks.
bool check_rows_for_ranks(GstElement* element, const Vae& model, int64_t height, size_t ranks);

// An event handler at the element boundary: an exception becomes an ERROR message and FALSE.
template <class F>
gboolean guarded_event(GstElement* element, F&& handle) noexcept {
  gboolean ok = FALSE;
  return guarded(element, "handling an event", [&] { ok = handle(); }) ? ok : FALSE;
}

// Records one model call's compute time in the stats and the latency bound; posts a LATENCY message when the
// bound changed.
void record_compute_time(GstElement* element, ChunkStats& stats, LatencyBound& bound,
                         std::chrono::steady_clock::duration d);

// The LATENCY query of a filter: upstream's answer plus `ours`.
gboolean answer_latency_query(GstPad* sinkpad, GstQuery* query, GstClockTime ours);

}  // namespace latent::gst
