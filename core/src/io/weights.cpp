#include "latent/io/weights.h"

#include <ATen/ops/isfinite.h>
#include <ATen/ops/isinf.h>
#include <ATen/ops/isnan.h>
#include <torch/serialize.h>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <system_error>
#include <utility>
#include <vector>

#include "io/json.h"
#include "io/regular_file.h"
#include "io/pth_format.h"
#include "io/weight_files.h"
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

ModelConfig read_config_file(const fs::path& path) { return checked_config(read_text_file(path), path.string()); }

void read_safetensors(const fs::path& file, WeightSource& out) {
  auto st = SafetensorsFile::open(file);
  out.metadata = st.metadata();
  for (const auto& name : st.names()) out.tensors.emplace(name, st.tensor(name));
  out.mapped.push_back(st.mapping());
  if (auto it = out.metadata.find("config"); it != out.metadata.end() && !out.config)
    out.config = checked_config(it->second, file.string() + ": __metadata__ config");
}

// A whole file mapped private and writable: tensors handed out may be modified in place, the file never is.
struct FileMapping {
  void* addr = nullptr;
  size_t size = 0;
  ~FileMapping() {
    if (addr) ::munmap(addr, size);
  }
  std::byte* data() const { return static_cast<std::byte*>(addr); }
  std::span<const std::byte> bytes() const { return {data(), size}; }
};

std::shared_ptr<FileMapping> map_file(const fs::path& file) {
  std::string why;
  const std::optional<RegularFile> f = open_regular_file(file, why);
  if (!f) throw ModelError(file.string() + ": " + why);
  auto map = std::make_shared<FileMapping>();
  if (f->size == 0) return map;
  map->size = size_t(f->size);
  void* addr = ::mmap(nullptr, map->size, PROT_READ | PROT_WRITE, MAP_PRIVATE, f->fd, 0);
  if (addr == MAP_FAILED) throw ModelError(file.string() + ": cannot map: " + std::system_category().message(errno));
  map->addr = addr;
  return map;
}

c10::ScalarType to_scalar_type(pth::Dtype dtype) {
  using pth::Dtype;
  switch (dtype) {
    case Dtype::F64: return c10::kDouble;
    case Dtype::F32: return c10::kFloat;
    case Dtype::F16: return c10::kHalf;
    case Dtype::BF16: return c10::kBFloat16;
    case Dtype::C64: return c10::kComplexFloat;
    case Dtype::C128: return c10::kComplexDouble;
    case Dtype::I64: return c10::kLong;
    case Dtype::I32: return c10::kInt;
    case Dtype::I16: return c10::kShort;
    case Dtype::I8: return c10::kChar;
    case Dtype::U8: return c10::kByte;
    case Dtype::BOOL: return c10::kBool;
    case Dtype::U16: return c10::kUInt16;
    case Dtype::U32: return c10::kUInt32;
    case Dtype::U64: return c10::kUInt64;
    case Dtype::F8_E4M3: return c10::kFloat8_e4m3fn;
    case Dtype::F8_E5M2: return c10::kFloat8_e5m2;
    case Dtype::F8_E8M0: return c10::kFloat8_e8m0fnu;
  }
  throw ModelError("unknown .pth dtype");
}

// A view of the mapping where the data is aligned for its dtype (torch.save aligns records to 64 bytes), else a
// copy of the bytes the view reaches. Storages shared by several tensors stay shared: their views overlap.
torch::Tensor tensor_from(const pth::Tensor& t, const pth::Storage& s, const std::shared_ptr<FileMapping>& map) {
  const auto options = torch::TensorOptions().dtype(to_scalar_type(t.dtype)).device(torch::kCPU);
  if (t.extent_bytes == 0) return torch::empty_strided(t.shape, t.strides, options);
  const size_t size = pth::dtype_size(t.dtype);
  std::byte* data = map->data() + s.record.offset + t.storage_offset * size;
  if (reinterpret_cast<uintptr_t>(data) % size == 0) {
    std::shared_ptr<FileMapping> keep = map;
    return torch::from_blob(
        data, t.shape, t.strides, [keep](void*) mutable { keep.reset(); }, options);
  }
  auto copy = torch::empty({int64_t(t.extent_bytes / size)}, options);
  std::memcpy(copy.data_ptr(), data, t.extent_bytes);
  return copy.as_strided(t.shape, t.strides);
}

// A torch.save() archive holding a flat name->tensor dict, possibly nested under "state_dict" or "model". Read
// by pth::parse, which builds nothing but tensor descriptors: a general unpickler (torch::pickle_load) runs
// further than a weights file needs and trusts the sizes the pickle declares (docs/pth-format.md).
std::string read_pickle(const fs::path& file, WeightSource& out,
                        std::span<const std::string_view> containers = pth::kDefaultContainers) {
  const auto map = map_file(file);
  pth::Checkpoint checkpoint;
  try {
    checkpoint = pth::parse(map->bytes(), file.string(), containers);
  } catch (const pth::FormatError& e) {
    // The message starts with the file name; the reader learns first that the file is not usable.
    std::string what = e.what();
    const std::string label = file.string() + ": ";
    if (what.compare(0, label.size(), label) == 0) what.erase(0, label.size());
    throw ModelError(label + "not a readable torch.save checkpoint: " + what);
  }
  for (const auto& t : checkpoint.tensors)
    out.tensors.emplace(t.name, tensor_from(t, checkpoint.storages.at(t.storage), map));
  out.mapped.push_back(map->bytes());
  return checkpoint.container;
}

}  // namespace

std::string read_text_file(const fs::path& path) {
  std::string why;
  const std::optional<RegularFile> f = open_regular_file(path, why);
  if (!f) throw ModelError(path.string() + ": " + why);
  std::string text;
  char buf[65536];
  for (;;) {
    const ssize_t n = ::read(f->fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw ModelError(path.string() + ": cannot read: " + std::system_category().message(errno));
    if (n == 0) return text;
    text.append(buf, size_t(n));
  }
}

WeightSource read_torch_checkpoint(const fs::path& file, std::span<const std::string_view> containers,
                                   std::string* container) {
  WeightSource out;
  out.weights = file;
  std::string taken = read_pickle(file, out, containers);
  if (container) *container = std::move(taken);
  return out;
}

WeightSource read_safetensors_folder(const fs::path& dir, const std::string& stem) {
  WeightSource src;
  const fs::path single = dir / (stem + ".safetensors");
  const fs::path index = dir / (stem + ".safetensors.index.json");
  std::vector<fs::path> files;
  json::Value idx;
  if (fs::exists(single)) {
    files.push_back(single);
    src.weights = single;
  } else if (fs::exists(index)) {
    try {
      idx = json::parse(read_text_file(index));
    } catch (const json::Error& e) {
      throw ModelError(index.string() + ": not valid JSON: " + e.what());
    }
    const json::Value* map = idx.find("weight_map");
    if (!map || !map->is_object()) throw ModelError(index.string() + ": no \"weight_map\" object");
    std::set<std::string> names;
    for (const auto& [k, f] : map->as_object()) {
      if (!f.is_string() || f.as_string().find('/') != std::string::npos || f.as_string() == "..")
        throw ModelError(index.string() + ": weight_map entry \"" + k + "\" is not a file name in the folder");
      if (names.insert(f.as_string()).second) files.push_back(dir / f.as_string());
    }
    for (const auto& f : files)
      if (!fs::exists(f)) throw ModelError(index.string() + ": shard " + f.filename().string() + " is missing");
    src.weights = index;
  } else {
    throw ModelError(dir.string() + ": no " + single.filename().string() + " nor its .index.json");
  }
  std::map<std::string, fs::path> from;
  for (const auto& f : files) {
    auto st = SafetensorsFile::open(f);
    for (const auto& name : st.names()) {
      if (!src.tensors.emplace(name, st.tensor(name)).second)
        throw ModelError(f.string() + ": tensor \"" + name + "\" is also in " + from[name].filename().string());
      from[name] = f;
    }
    src.mapped.push_back(st.mapping());
  }
  if (!idx.is_null())
    for (const auto& [k, f] : idx.find("weight_map")->as_object())
      if (auto it = from.find(k); it == from.end() || it->second.filename() != f.as_string())
        throw ModelError(index.string() + ": \"" + k + "\" is not in " + f.as_string());
  return src;
}

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
  torch::Tensor stored = it->second;
  if (auto u = source_.updates.find(name); u != source_.updates.end()) {
    torch::Tensor merged = stored.to(torch::kFloat, /*non_blocking=*/false, /*copy=*/true);
    for (const WeightUpdate& update : u->second) {
      merged.add_(update.make());
      if (!at::isfinite(merged).all().item<bool>())
        throw ModelError(update.from + ": \"" + name + "\" overflows float32 with its update");
    }
    stored = merged;
  }
  torch::Tensor t = stored.to(device_, dtype_).contiguous();
  if (t.is_same(it->second)) return t.alias();
  // One NaN weight makes every latent NaN; a value past the dtype's range becomes infinite in the conversion.
  if (at::isFloatingType(t.scalar_type()) && !at::isfinite(t).all().item<bool>()) {
    const int64_t nan = at::isnan(t).sum().item<int64_t>(), inf = at::isinf(t).sum().item<int64_t>();
    non_finite_.push_back(name + " holds " + std::to_string(nan) + " NaN and " + std::to_string(inf) +
                          " infinite values as " + std::string(c10::toString(dtype_)));
  }
  return t;
}

void WeightReader::finish() const {
  std::vector<std::string> unused;
  for (const auto& [name, used] : used_)
    if (!used) unused.push_back(name);
  if (missing_.empty() && misshaped_.empty() && non_finite_.empty() && unused.empty()) return;
  std::string msg = source_.weights.string() + (missing_.empty() && misshaped_.empty() && unused.empty()
                                                    ? ": weights hold values that are not finite"
                                                    : ": weights do not match the model");
  auto list = [&msg](const char* what, const std::vector<std::string>& names) {
    if (names.empty()) return;
    msg += "\n  " + std::to_string(names.size()) + " " + what + ":";
    for (size_t i = 0; i < names.size() && i < 20; ++i) msg += "\n    " + names[i];
    if (names.size() > 20) msg += "\n    ... and " + std::to_string(names.size() - 20) + " more";
  };
  list("missing", missing_);
  list("with the wrong shape or dtype", misshaped_);
  list("with NaN or infinite values", non_finite_);
  list("unexpected", unused);
  throw ModelError(msg);
}

}  // namespace latent
