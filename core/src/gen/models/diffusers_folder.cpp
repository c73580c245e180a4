// Locating the pieces of a diffusers folder and reading their configs.
#include "gen/models/diffusers_folder.h"

#include "io/weight_files.h"
#include "latent/io/weights.h"

namespace latent {

namespace fs = std::filesystem;

json::Value read_json_object(const fs::path& p) {
  json::Value v;
  try {
    v = json::parse(read_text_file(p));
  } catch (const json::Error& e) {
    throw ModelError(p.string() + ": not valid JSON: " + e.what());
  }
  if (!v.is_object()) throw ModelError(p.string() + ": not a JSON object");
  return v;
}

std::string class_name_of(const json::Value& v) {
  const json::Value* c = v.find("_class_name");
  return c && c->is_string() ? c->as_string() : std::string();
}

const json::Value* ConfigReader::get(const std::string& key) {
  seen_.insert(key);
  const json::Value* v = obj_.find(key);
  return v && !v->is_null() ? v : nullptr;
}

int64_t ConfigReader::integer(const std::string& key, int64_t fallback, int64_t lo, int64_t hi) {
  const json::Value* v = get(key);
  if (!v) return fallback;
  int64_t i = 0;
  try {
    i = v->as_int64();
  } catch (const json::Error&) {
    fail(key, "is not an integer");
  }
  if (i < lo || i > hi)
    fail(key, "= " + std::to_string(i) + " is out of range [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
  return i;
}

double ConfigReader::number(const std::string& key, double fallback, double lo, double hi) {
  const json::Value* v = get(key);
  if (!v) return fallback;
  double d = 0;
  try {
    d = v->as_double();
  } catch (const json::Error&) {
    fail(key, "is not a number");
  }
  if (!(d >= lo && d <= hi)) fail(key, "is out of range");
  return d;
}

bool ConfigReader::boolean(const std::string& key, bool fallback) {
  const json::Value* v = get(key);
  if (!v) return fallback;
  if (!v->is_bool()) fail(key, "is not true or false");
  return v->as_bool();
}

std::string ConfigReader::string(const std::string& key, const std::string& fallback) {
  const json::Value* v = get(key);
  if (!v) return fallback;
  if (!v->is_string()) fail(key, "is not a string");
  return v->as_string();
}

void ConfigReader::unsupported(const std::string& key, const std::string& what) {
  if (get(key)) fail(key, "is set: " + what + " is not supported by the native backend");
}

void ConfigReader::no_other_keys() const {
  std::string unknown;
  for (const auto& [k, v] : obj_.as_object())
    if (!seen_.count(k) && k.rfind('_', 0) != 0) unknown += (unknown.empty() ? "\"" : ", \"") + k + "\"";
  if (!unknown.empty()) throw ModelError(where_ + ": unknown config keys " + unknown + " (a newer model version?)");
}

void ConfigReader::fail(const std::string& key, const std::string& what) const {
  throw ModelError(where_ + ": config \"" + key + "\" " + what);
}

namespace {

struct Located {
  fs::path transformer;
  fs::path scheduler;
  fs::path model_index;  // empty for a transformer folder
};

bool present(const fs::path& p) {
  std::error_code ec;
  return fs::exists(p, ec);
}

std::optional<Located> locate(const fs::path& path) {
  std::error_code ec;
  if (!fs::is_directory(path, ec)) return std::nullopt;
  if (present(path / "transformer" / "config.json") || present(path / "model_index.json"))
    return Located{path / "transformer", path / "scheduler" / "scheduler_config.json", path / "model_index.json"};
  // A transformer folder on its own: its scheduler, if any, is the pipeline's beside it.
  if (present(path / "config.json") && (present(path / "diffusion_pytorch_model.safetensors") ||
                                        present(path / "diffusion_pytorch_model.safetensors.index.json")))
    return Located{path, path.parent_path() / "scheduler" / "scheduler_config.json", {}};
  return std::nullopt;
}

}  // namespace

// What a supported pipeline class may hold in model_index.json: its components (["library", "Class"] or
// [null, null]) and flags. Anything else is refused by name.
struct PipelineKind {
  const char* name;
  bool wan;  // the Wan family: flags boundary_ratio and expand_timesteps, component transformer_2
  bool image_components;
};
constexpr PipelineKind kPipelines[] = {
    {"WanPipeline", true, false},
    {"WanImageToVideoPipeline", true, true},
    {"CogVideoXPipeline", false, false},
};

// A component entry: ["library", "Class"], or null / [null, null] for none. The class, or "" for none.
std::string component_class(const json::Value& v, const std::string& key, const std::string& where) {
  if (v.is_null()) return "";
  if (!v.is_array() || v.as_array().size() != 2)
    throw ModelError(where + ": \"" + key + "\" is not a [library, class] pair");
  const json::Value& cls = v.as_array()[1];
  if (cls.is_null()) return "";
  if (!cls.is_string()) throw ModelError(where + ": \"" + key + "\" has a class that is not a string");
  return cls.as_string();
}

std::optional<LatentSpace> read_latent_space(const fs::path& vae_dir) {
  const fs::path file = vae_dir / "config.json";
  if (!present(file)) return std::nullopt;
  const json::Value v = read_json_object(file);
  ConfigReader r(v, file.string());
  const std::string cls = class_name_of(v);
  LatentSpace ls;
  if (cls == "AutoencoderKLWan") {
    ls.id = r.boolean("is_residual", false) ? "wan2.2" : "wan2.1";
    ls.channels = r.integer("z_dim", 16, 1, 1 << 16);
    ls.spatial_factor = r.integer("scale_factor_spatial", 8, 1, 64);
    ls.temporal_factor = r.integer("scale_factor_temporal", 4, 1, 64);
  } else if (cls == "AutoencoderKLCogVideoX") {
    ls.id = "cogvideox";
    ls.channels = r.integer("latent_channels", 16, 1, 1 << 16);
    ls.temporal_factor = r.integer("temporal_compression_ratio", 4, 1, 64);
  } else {
    throw ModelError(file.string() + ": VAE \"" + cls +
                     "\" is not supported (AutoencoderKLWan, AutoencoderKLCogVideoX)");
  }
  return ls;
}

// Reads model_index.json into `f`, refusing what the native backends would not run as described.
void read_pipeline_index(const fs::path& root, const fs::path& index, DiffusersFolder& f) {
  const json::Value v = read_json_object(index);
  const std::string where = index.string();
  f.pipeline_class = class_name_of(v);
  const PipelineKind* kind = nullptr;
  std::string known;
  for (const PipelineKind& k : kPipelines) {
    if (f.pipeline_class == k.name) kind = &k;
    known += (known.empty() ? "" : ", ") + std::string(k.name);
  }
  if (!kind)
    throw ModelError(where + ": pipeline \"" + f.pipeline_class + "\" is not supported natively (supported: " + known +
                     ")");
  std::set<std::string> components = {"tokenizer", "text_encoder", "transformer", "vae", "scheduler"};
  std::set<std::string> flags;
  if (kind->wan) {
    components.insert("transformer_2");
    flags = {"boundary_ratio", "expand_timesteps"};
  }
  if (kind->image_components) components.insert({"image_encoder", "image_processor"});
  std::string transformer_2;
  std::optional<double> boundary;
  for (const auto& [key, value] : v.as_object()) {
    if (key.rfind('_', 0) == 0) continue;  // diffusers' bookkeeping
    if (components.count(key)) {
      const std::string cls = component_class(value, key, where);
      if (key == "transformer" && cls.empty()) throw ModelError(where + ": \"transformer\" is not set");
      if (key == "transformer_2") transformer_2 = cls;
      if ((key == "image_encoder" || key == "image_processor") && !cls.empty())
        throw ModelError(where + ": \"" + key + "\" is set (" + cls +
                         "): image to video through an image encoder (Wan 2.1 I2V) is not supported natively; "
                         "Wan 2.2 TI2V folders (expand_timesteps) take an image without one");
      continue;
    }
    if (!flags.count(key))
      throw ModelError(where + ": \"" + key + "\" is not known for " + f.pipeline_class +
                       " (a newer pipeline version?): refusing a folder whose model would not run as it says");
    if (key == "expand_timesteps") {
      if (!value.is_null() && !value.is_bool()) throw ModelError(where + ": \"expand_timesteps\" is not true or false");
      f.expand_timesteps = value.is_bool() && value.as_bool();
    } else if (key == "boundary_ratio" && !value.is_null()) {
      double b = 0;
      try {
        b = value.as_double();
      } catch (const json::Error&) {
        throw ModelError(where + ": \"boundary_ratio\" is not a number");
      }
      if (!(b > 0.0 && b < 1.0)) throw ModelError(where + ": \"boundary_ratio\" must be in (0, 1)");
      boundary = b;
    }
  }
  if (!transformer_2.empty() && !boundary)
    throw ModelError(where + ": \"transformer_2\" is set without \"boundary_ratio\": which steps it takes is unknown");
  if (boundary && transformer_2.empty())
    throw ModelError(where + ": \"boundary_ratio\" is set without \"transformer_2\": there is no second expert");
  if (!transformer_2.empty()) {
    if (transformer_2 != "WanTransformer3DModel")
      throw ModelError(where + ": \"transformer_2\" is " + transformer_2 + ", not WanTransformer3DModel");
    f.transformer_2 = root / "transformer_2";
    if (!present(f.transformer_2 / "config.json"))
      throw ModelError(root.string() +
                       ": model_index.json names transformer_2, and transformer_2/config.json is missing");
    f.boundary_ratio = *boundary;
  }
  if (const json::Value* vae = v.find("vae"); vae && !component_class(*vae, "vae", where).empty()) {
    f.vae = root / "vae";
    f.latent_space = read_latent_space(f.vae);
  }
}

bool is_diffusers_folder(const fs::path& path) { return locate(path).has_value(); }

DiffusersFolder read_diffusers_folder(const fs::path& path) {
  const auto where = locate(path);
  if (!where) throw ModelError(path.string() + ": not a diffusers pipeline or transformer folder");
  DiffusersFolder f;
  f.transformer = where->transformer;
  f.scheduler = where->scheduler;
  f.config_file = where->transformer / "config.json";
  if (!where->model_index.empty() && present(where->model_index))
    read_pipeline_index(where->model_index.parent_path(), where->model_index, f);
  else if (!where->model_index.empty() && present(where->model_index.parent_path() / "vae" / "config.json"))
    f.latent_space = read_latent_space(f.vae = where->model_index.parent_path() / "vae");
  if (!present(f.config_file)) throw ModelError(path.string() + ": pipeline folder has no transformer/config.json");
  f.config = read_json_object(f.config_file);
  f.transformer_class = class_name_of(f.config);
  return f;
}

}  // namespace latent
