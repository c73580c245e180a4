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

bool is_diffusers_folder(const fs::path& path) { return locate(path).has_value(); }

DiffusersFolder read_diffusers_folder(const fs::path& path) {
  const auto where = locate(path);
  if (!where) throw ModelError(path.string() + ": not a diffusers pipeline or transformer folder");
  DiffusersFolder f;
  f.transformer = where->transformer;
  f.scheduler = where->scheduler;
  f.config_file = where->transformer / "config.json";
  if (!where->model_index.empty() && present(where->model_index))
    f.pipeline_class = class_name_of(read_json_object(where->model_index));
  if (!present(f.config_file)) throw ModelError(path.string() + ": pipeline folder has no transformer/config.json");
  f.config = read_json_object(f.config_file);
  f.transformer_class = class_name_of(f.config);
  return f;
}

}  // namespace latent
