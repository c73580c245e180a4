#include "latent/weights.h"

#include <sys/mman.h>
#include <torch/serialize.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <sstream>
#include <utility>

#include "latent/safetensors.h"

namespace latent {
namespace fs = std::filesystem;
namespace {

std::string shape_str(at::IntArrayRef s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

json::Value read_json_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ModelError(path.string() + ": cannot read");
  std::stringstream ss;
  ss << in.rdbuf();
  try {
    json::Value v = json::parse(ss.str());
    if (!v.is_object()) throw json::Error("not a JSON object");
    return v;
  } catch (const json::Error& e) {
    throw ModelError(path.string() + ": invalid config: " + e.what());
  }
}

void read_safetensors(const fs::path& file, WeightSource& out) {
  auto st = SafetensorsFile::open(file);
  out.metadata = st.metadata();
  for (const auto& name : st.names()) out.tensors.emplace(name, st.tensor(name));
  out.mapped.push_back(st.mapping());
  if (auto it = out.metadata.find("config"); it != out.metadata.end() && !out.config) {
    try {
      out.config = json::parse(it->second);
    } catch (const json::Error& e) {
      throw ModelError(file.string() + ": __metadata__ config is not valid JSON: " + e.what());
    }
  }
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

using PageRange = std::pair<uintptr_t, uintptr_t>;  // [first, last) byte addresses, page-aligned

uintptr_t page_down(uintptr_t a, uintptr_t page) { return a / page * page; }
uintptr_t page_up(uintptr_t a, uintptr_t page) { return (a + page - 1) / page * page; }

// Sorted, overlapping and touching ranges merged.
std::vector<PageRange> merged(std::vector<PageRange> ranges) {
  std::sort(ranges.begin(), ranges.end());
  std::vector<PageRange> out;
  for (const auto& r : ranges) {
    if (!out.empty() && r.first <= out.back().second)
      out.back().second = std::max(out.back().second, r.second);
    else
      out.push_back(r);
  }
  return out;
}

// `from` without any byte of `keep` (both merged).
std::vector<PageRange> subtract(const std::vector<PageRange>& from, const std::vector<PageRange>& keep) {
  std::vector<PageRange> out;
  size_t k = 0;
  for (auto [lo, hi] : from) {
    while (k < keep.size() && keep[k].second <= lo) ++k;
    for (size_t j = k; j < keep.size() && keep[j].first < hi; ++j) {
      if (keep[j].first > lo) out.emplace_back(lo, keep[j].first);
      lo = std::max(lo, keep[j].second);
    }
    if (lo < hi) out.emplace_back(lo, hi);
  }
  return out;
}

// Faults the pages in; MADV_POPULATE_READ (Linux 5.14) does it in one call, older kernels get a read per page.
int64_t populate(const PageRange& r, uintptr_t page) {
#ifndef MADV_POPULATE_READ
  constexpr int MADV_POPULATE_READ = 22;
#endif
  void* addr = reinterpret_cast<void*>(r.first);
  const size_t len = r.second - r.first;
  if (::madvise(addr, len, MADV_POPULATE_READ) != 0) {
    volatile unsigned char sink = 0;
    for (uintptr_t p = r.first; p < r.second; p += page)
      sink = sink + *reinterpret_cast<volatile const unsigned char*>(p);
    (void)sink;
  }
  return int64_t(len);
}

}  // namespace

Residency settle_residency(const WeightSource& source) {
  Residency out;
  if (source.mapped.empty()) return out;
  const uintptr_t page = uintptr_t(::sysconf(_SC_PAGESIZE));
  std::vector<PageRange> kept, dropped;
  for (const auto& [name, t] : source.tensors) {
    if (!t.defined() || !t.device().is_cpu() || t.nbytes() == 0) continue;
    const auto* data = static_cast<const std::byte*>(t.data_ptr());
    const bool in_mapping = std::any_of(source.mapped.begin(), source.mapped.end(), [&](const auto& m) {
      return data >= m.data() && data + t.nbytes() <= m.data() + m.size();
    });
    if (!in_mapping) continue;
    const uintptr_t lo = reinterpret_cast<uintptr_t>(data), hi = lo + t.nbytes();
    // Another user of the storage than the source's own tensor means a model holds it.
    // Kept: every page the tensor touches. Dropped: only the pages it fills alone.
    if (t.storage().use_count() > 1)
      kept.emplace_back(page_down(lo, page), page_up(hi, page));
    else if (page_up(lo, page) < page_down(hi, page))
      dropped.emplace_back(page_up(lo, page), page_down(hi, page));
  }
  kept = merged(std::move(kept));
  for (const auto& r : subtract(merged(std::move(dropped)), kept)) {
    // Failure only leaves the pages where they were: memory, not correctness.
    if (::madvise(reinterpret_cast<void*>(r.first), r.second - r.first, MADV_DONTNEED) == 0)
      out.released_bytes += int64_t(r.second - r.first);
  }
  for (const auto& r : kept) out.resident_bytes += populate(r, page);
  return out;
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
    out.config = read_json_file(dir / "config.json");
    file = dir / "diffusion_pytorch_model.safetensors";
    if (!fs::exists(file)) throw ModelError(dir.string() + ": folder has no diffusion_pytorch_model.safetensors");
  } else if (auto cfg = path.parent_path() / "config.json"; fs::exists(cfg)) {
    out.config = read_json_file(cfg);
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
