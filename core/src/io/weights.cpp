#include "latent/io/weights.h"

#include <torch/serialize.h>

#include <algorithm>
#include <fstream>
#include <sstream>
#include <utility>

#include "io/json.h"
#include "latent/io/safetensors.h"

namespace latent {
namespace fs = std::filesystem;
namespace {

std::string shape_str(at::IntArrayRef s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

// Parsed once here so a malformed config fails with the file's name before any family looks at it.
ModelConfig checked_config(std::string text, const std::string& where) {
  ModelConfig cfg;
  try {
    json::Value v = json::parse(text);
    if (!v.is_object()) throw json::Error(std::string("a JSON ") + v.kind_name() + ", not an object");
    if (const json::Value* cls = v.find("_class_name"); cls && cls->is_string()) cfg.class_name = cls->as_string();
  } catch (const json::Error& e) {
    throw ModelError(where + ": invalid config: " + e.what());
  }
  cfg.text = std::move(text);
  return cfg;
}

ModelConfig read_config_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ModelError(path.string() + ": cannot read");
  std::stringstream ss;
  ss << in.rdbuf();
  return checked_config(ss.str(), path.string());
}

void read_safetensors(const fs::path& file, WeightSource& out) {
  auto st = SafetensorsFile::open(file);
  out.metadata = st.metadata();
  for (const auto& name : st.names()) out.tensors.emplace(name, st.tensor(name));
  out.mapped.push_back(st.mapping());
  if (auto it = out.metadata.find("config"); it != out.metadata.end() && !out.config)
    out.config = checked_config(it->second, file.string() + ": __metadata__ config");
}

// A torch.save() archive holding a flat name->tensor dict, possibly nested under "state_dict" or "model".
void read_pickle(const fs::path& file, WeightSource& out) {
  std::ifstream in(file, std::ios::binary);
  if (!in) throw ModelError(file.string() + ": cannot read");
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  c10::IValue root;
  try {
    root = torch::pickle_load(bytes);
  } catch (const std::exception& e) {
    std::string what = e.what();
    throw ModelError(file.string() + ": not a readable torch.save checkpoint: " + what.substr(0, what.find('\n')));
  }
  for (const char* key : {"state_dict", "model"}) {
    if (!root.isGenericDict()) break;
    auto dict = root.toGenericDict();
    auto it = dict.find(c10::IValue(std::string(key)));
    if (it != dict.end() && it->value().isGenericDict()) root = it->value();
  }
  if (!root.isGenericDict()) throw ModelError(file.string() + ": checkpoint does not hold a dict of tensors");
  for (const auto& kv : root.toGenericDict()) {
    if (!kv.key().isString() || !kv.value().isTensor()) continue;  // optimizer state, step counters, ...
    out.tensors.emplace(kv.key().toStringRef(), kv.value().toTensor());
  }
  if (out.tensors.empty()) throw ModelError(file.string() + ": checkpoint holds no tensors");
}

}  // namespace

WeightSource read_weights(const fs::path& path) {
  WeightSource out;
  std::error_code ec;
  if (!fs::exists(path, ec)) throw ModelError(path.string() + ": no such file or directory");
  fs::path file = path;
  if (fs::is_directory(path)) {
    // A pipeline folder has the VAE in vae/; a VAE folder has it at its top.
    fs::path dir = fs::exists(path / "vae" / "config.json") ? path / "vae" : path;
    if (!fs::exists(dir / "config.json")) throw ModelError(path.string() + ": folder has no config.json");
    out.config = read_config_file(dir / "config.json");
    file = dir / "diffusion_pytorch_model.safetensors";
    if (!fs::exists(file)) throw ModelError(dir.string() + ": folder has no diffusion_pytorch_model.safetensors");
  } else if (auto cfg = path.parent_path() / "config.json"; fs::exists(cfg)) {
    out.config = read_config_file(cfg);
  }
  out.weights = file;
  std::string ext = file.extension().string();
  if (ext == ".pth" || ext == ".pt" || ext == ".ckpt") {
    read_pickle(file, out);
  } else {
    read_safetensors(file, out);
  }
  return out;
}

WeightReader::WeightReader(const WeightSource& source, torch::Device device, torch::ScalarType dtype)
    : source_(source), device_(device), dtype_(dtype) {
  for (const auto& [name, t] : source.tensors) used_[name] = false;
}

torch::Tensor WeightReader::take(const std::string& name, std::vector<int64_t> shape) {
  auto it = source_.tensors.find(name);
  if (it == source_.tensors.end()) {
    missing_.push_back(name + " " + shape_str(shape));
    return {};
  }
  used_[name] = true;
  if (it->second.sizes() != at::IntArrayRef(shape)) {
    misshaped_.push_back(name + " is " + shape_str(it->second.sizes()) + ", expected " + shape_str(shape));
    return {};
  }
  if (!at::isFloatingType(it->second.scalar_type()))
    misshaped_.push_back(name + " has dtype " + std::string(c10::toString(it->second.scalar_type())));
  torch::Tensor t = it->second.to(device_, dtype_).contiguous();
  return t.is_same(it->second) ? t.alias() : t;
}

void WeightReader::finish() const {
  std::vector<std::string> unused;
  for (const auto& [name, used] : used_)
    if (!used) unused.push_back(name);
  if (missing_.empty() && misshaped_.empty() && unused.empty()) return;
  std::string msg = source_.weights.string() + ": weights do not match the model";
  auto list = [&msg](const char* what, const std::vector<std::string>& names) {
    if (names.empty()) return;
    msg += "\n  " + std::to_string(names.size()) + " " + what + ":";
    for (size_t i = 0; i < names.size() && i < 20; ++i) msg += "\n    " + names[i];
    if (names.size() > 20) msg += "\n    ... and " + std::to_string(names.size() - 20) + " more";
  };
  list("missing", missing_);
  list("with the wrong shape or dtype", misshaped_);
  list("unexpected", unused);
  throw ModelError(msg);
}

}  // namespace latent
