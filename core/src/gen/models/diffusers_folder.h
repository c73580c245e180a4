// What every natively run diffusers transformer shares in its files: where a pipeline folder keeps the transformer
// and the scheduler, which classes they name, and checked, typed access to their config.json. The families
// (gen/models/wan_transformer.cpp, gen/models/cogvideox_transformer.cpp) read their own keys through ConfigReader.
#pragma once

#include <filesystem>
#include <optional>
#include <set>
#include <string>

#include "io/json.h"

namespace latent {

// The file parsed as a JSON object; ModelError naming it otherwise.
json::Value read_json_object(const std::filesystem::path& path);

// The "_class_name" of a diffusers config, or "" when it has none.
std::string class_name_of(const json::Value& config);

// A config object read key by key, every key optional with the family's default, every value checked; errors are
// ModelError naming the file and the key.
class ConfigReader {
 public:
  ConfigReader(const json::Value& obj, std::string where) : obj_(obj), where_(std::move(where)) {}

  // The value, or null when absent or JSON null (diffusers' None); marks the key as read.
  const json::Value* get(const std::string& key);
  int64_t integer(const std::string& key, int64_t fallback, int64_t lo, int64_t hi);
  double number(const std::string& key, double fallback, double lo, double hi);
  bool boolean(const std::string& key, bool fallback);
  std::string string(const std::string& key, const std::string& fallback);
  // A key whose only supported value is absence (null): image conditioning and the like.
  void unsupported(const std::string& key, const std::string& what);
  void ignore(const std::string& key) { seen_.insert(key); }
  // Keys this version does not know could change the network in ways it would silently ignore. Keys starting
  // with "_" are diffusers' bookkeeping.
  void no_other_keys() const;
  [[noreturn]] void fail(const std::string& key, const std::string& what) const;
  const std::string& where() const { return where_; }

 private:
  const json::Value& obj_;
  std::string where_;
  std::set<std::string> seen_;
};

// The latents a pipeline's VAE makes, read from its vae/config.json: what the caps call the model (the VAE
// family's VaeSpec::model_id), channels and compression.
struct LatentSpace {
  std::string id;  // "wan2.1", "wan2.2", "cogvideox"
  int64_t channels = 16;
  int64_t spatial_factor = 8;
  int64_t temporal_factor = 4;
};

struct DiffusersFolder {
  std::filesystem::path transformer;  // the folder with config.json and the weights
  std::filesystem::path config_file;  // transformer/config.json
  std::filesystem::path scheduler;    // scheduler/scheduler_config.json, which may not exist
  json::Value config;                 // config_file's object
  std::string transformer_class;      // its "_class_name"
  std::string pipeline_class;         // model_index.json's "_class_name"; "" for a bare transformer folder
  // What model_index.json decides beyond the components every pipeline has (defaults without one): a second
  // expert (Wan 2.2 A14B: transformer_2/ and the boundary_ratio of the steps it takes) and per-token timesteps
  // (Wan 2.2 TI2V-5B: expand_timesteps, which makes image to video possible).
  std::filesystem::path transformer_2;  // empty for a single network
  double boundary_ratio = 0.0;          // 0 without a second expert
  bool expand_timesteps = false;
  std::optional<LatentSpace> latent_space;  // from vae/config.json; none without a vae/ folder
  std::filesystem::path vae;                // the vae/ folder; empty without one
};

// A pipeline folder (model_index.json or transformer/config.json) or a transformer folder (config.json beside
// diffusion_pytorch_model.safetensors or its shard index).
bool is_diffusers_folder(const std::filesystem::path& path);

// Locates and parses the transformer's config and the pipeline's model_index.json, which is read whole: a
// pipeline class, component or flag the native backends do not implement is a ModelError naming the key (never
// ignored, so a folder never loads to run a different model than it describes). ModelError naming the file when
// one is missing or not JSON.
DiffusersFolder read_diffusers_folder(const std::filesystem::path& path);

}  // namespace latent
