// Denoisers exported by users: AOTInductor packages (.pt2) made by tools/export_denoiser.py. The package's own
// loader checks nothing about its inputs (a wrong shape returns garbage), so the contract travels in the package
// metadata ("latent.*" keys) and Denoiser::predict checks every call against it.
#include <ATen/cpu/Utils.h>
#include <torch/csrc/inductor/aoti_package/model_package_loader.h>

#include <algorithm>
#include <cctype>
#include <mutex>
#include <sstream>
#include <unordered_map>

#include "gen/models/backends.h"
#include "io/numbers.h"
#include "latent/io/weights.h"
#include "latent/runtime/devices.h"

namespace latent {
namespace {

using Metadata = std::unordered_map<std::string, std::string>;

// The version of the metadata contract tools/export_denoiser.py writes.
constexpr const char* kFormatVersion = "1";

class PackageReader {
 public:
  PackageReader(const std::filesystem::path& path, const Metadata& md) : path_(path), md_(md) {}

  const std::string& text(const std::string& key) const {
    auto it = md_.find(key);
    if (it == md_.end())
      throw ModelError(path_.string() + ": package metadata has no \"" + key +
                       "\" (export it with tools/export_denoiser.py)");
    return it->second;
  }
  std::string text_or(const std::string& key, const std::string& fallback) const {
    auto it = md_.find(key);
    return it == md_.end() ? fallback : it->second;
  }
  int64_t integer(const std::string& key, int64_t lo, int64_t hi) const {
    const std::string& s = text(key);
    if (auto v = bounded_integer(s, lo, hi)) return *v;
    throw ModelError(path_.string() + ": package metadata \"" + key + "\" = \"" + s + "\" is not an integer in [" +
                     std::to_string(lo) + ", " + std::to_string(hi) + "]");
  }
  double number(const std::string& key, double lo, double hi) const {
    const std::string& s = text(key);
    if (auto v = bounded_number(s, lo, hi)) return *v;
    throw ModelError(path_.string() + ": package metadata \"" + key + "\" = \"" + s + "\" is not a number in [" +
                     std::to_string(lo) + ", " + std::to_string(hi) + "]");
  }
  template <class F>
  auto parsed(const std::string& key, F parse) const {
    try {
      return parse(text(key));
    } catch (const std::invalid_argument& e) {
      throw ModelError(path_.string() + ": package metadata \"" + key + "\": " + e.what());
    }
  }

 private:
  const std::filesystem::path& path_;
  const Metadata& md_;
};

DenoiserSpec spec_from(const std::filesystem::path& path, const Metadata& md) {
  PackageReader r(path, md);
  if (r.text("latent.format") != kFormatVersion)
    throw ModelError(path.string() + ": package metadata format " + r.text("latent.format") + ", this build reads " +
                     kFormatVersion);
  DenoiserSpec s;
  s.backend = "aoti";
  s.prediction = r.parsed("latent.prediction", parse_prediction);
  s.latent_space = r.text("latent.latent_space");
  constexpr int64_t kMaxDim = 1 << 16;
  s.channels = r.integer("latent.channels", 1, kMaxDim);
  s.min_frames = r.integer("latent.min_frames", 1, kMaxDim);
  s.window = r.integer("latent.window", s.min_frames, kMaxDim);
  s.height = r.integer("latent.height", 1, kMaxDim);
  s.width = r.integer("latent.width", 1, kMaxDim);
  s.text_tokens = r.integer("latent.text_tokens", 0, kMaxDim);
  s.text_dim = s.text_tokens > 0 ? r.integer("latent.text_dim", 1, kMaxDim) : 0;
  s.sampler.kind = r.parsed("latent.sampler", parse_sampler_kind);
  s.sampler.steps = r.integer("latent.steps", 1, 1000);
  s.sampler.shift = r.number("latent.shift", 1e-3, 1e3);
  s.guidance = r.number("latent.guidance", 0.0, 100.0);
  s.native_height = s.height;
  s.native_width = s.width;
  read_optional_contract(
      s,
      [&](const std::string& key) -> const std::string* {
        auto it = md.find(key);
        return it == md.end() ? nullptr : &it->second;
      },
      path.string(), "latent.");
  return s;
}

torch::ScalarType package_dtype(const std::filesystem::path& path, const Metadata& md) {
  const std::string name = PackageReader(path, md).text("latent.dtype");
  if (name == "float32") return torch::kFloat;
  if (name == "float16") return torch::kHalf;
  if (name == "bfloat16") return torch::kBFloat16;
  throw ModelError(path.string() + ": package metadata \"latent.dtype\" = \"" + name + "\" is not a dtype");
}

// A CPU package holds code for the instruction sets of the machine that compiled it (AOTI_CPU_ISA, e.g. "AVX512
// AVX512_VNNI AMX_TILE"); on a CPU without them the first run dies of SIGILL. Refuse it at load time instead. Best
// effort: Inductor also compiles with -march=native, whose extensions the metadata does not list.
void check_cpu_isa(const std::filesystem::path& path, const Metadata& md) {
  auto it = md.find("AOTI_CPU_ISA");
  if (it == md.end() || it->second.empty()) return;
  const auto caps = at::cpu::get_cpu_capabilities();
  std::string missing;
  std::istringstream words(it->second);
  for (std::string word; words >> word;) {
    std::transform(word.begin(), word.end(), word.begin(), [](unsigned char c) { return std::tolower(c); });
    // Inductor's AVX512 means the F, DQ, VL and BW subsets together.
    const std::vector<std::string> keys =
        word == "avx512" ? std::vector<std::string>{"avx512_f", "avx512_dq", "avx512_vl", "avx512_bw"}
                         : std::vector<std::string>{word};
    for (const std::string& key : keys) {
      auto cap = caps.find(key);
      if (cap != caps.end() && cap->second.isBool() && !cap->second.toBool()) missing += " " + key;
    }
  }
  if (!missing.empty())
    throw ModelError(path.string() + ": compiled for CPUs with " + it->second + "; this CPU lacks" + missing +
                     ". Export the model again on this machine");
}

// A package's own checks of input shapes, strides and dtypes run only when AOTI_RUNTIME_CHECK_INPUTS is set in
// the environment at its first call. The loader does not set it: setenv in a process whose other threads may be
// reading the environment (any GStreamer application) is undefined behaviour. Denoiser::predict checks every call
// against the metadata; a package is native code, trusted like a shared library, and users who want its own
// checks too set the variable before starting the process.

class AotiDenoiser final : public Denoiser {
 public:
  AotiDenoiser(DenoiserSpec spec, LoadOptions options, std::unique_ptr<torch::inductor::AOTIModelPackageLoader> p)
      : Denoiser(std::move(spec), options), package_(std::move(p)) {}

 protected:
  torch::Tensor run(const torch::Tensor& x, const torch::Tensor& timesteps, const torch::Tensor& text) const override {
    std::vector<torch::Tensor> inputs{x, timesteps};
    if (text.defined()) inputs.push_back(text);
    // One runner: calls from several streams take turns rather than share its buffers.
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<torch::Tensor> out = package_->run(inputs);
    if (out.size() != 1)
      throw std::runtime_error("denoiser package returned " + std::to_string(out.size()) + " outputs");
    return out[0];
  }

 private:
  mutable std::mutex mutex_;
  std::unique_ptr<torch::inductor::AOTIModelPackageLoader> package_;
};

}  // namespace

std::shared_ptr<Denoiser> load_aoti_denoiser(const std::filesystem::path& path, const LoadOptions& options) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) throw ModelError(path.string() + ": no such file");
  Metadata md;
  try {
    md = torch::inductor::AOTIModelPackageLoader::load_metadata_from_package(path.string(), "model");
  } catch (const std::exception& e) {
    throw ModelError(path.string() + ": not a readable AOTInductor package: " + e.what());
  }
  DenoiserSpec spec = spec_from(path, md);
  const std::string device_key = PackageReader(path, md).text_or("AOTI_DEVICE_KEY", "cpu");
  const std::string wanted = options.device.is_cuda() ? "cuda" : "cpu";
  if (device_key != wanted)
    throw ModelError(path.string() + ": compiled for " + device_key + ", asked to run on " + options.device.str() +
                     "; export it with --device " + wanted);
  if (!options.device.is_cuda()) check_cpu_isa(path, md);
  LoadOptions run_options = options;
  // A package runs in the dtype it was exported in; the compute dtype is chosen at export time.
  run_options.dtype = package_dtype(path, md);
  // "cuda" means cuda:0, as resolve_device() has it: inputs and the package's runner must agree on one device.
  if (run_options.device.is_cuda() && !run_options.device.has_index())
    run_options.device = torch::Device(torch::kCUDA, 0);
  std::unique_ptr<torch::inductor::AOTIModelPackageLoader> package;
  try {
    package = std::make_unique<torch::inductor::AOTIModelPackageLoader>(
        path.string(), "model", /*run_single_threaded=*/false, /*num_runners=*/1,
        run_options.device.is_cuda() ? run_options.device.index() : -1);
  } catch (const std::exception& e) {
    throw ModelError(path.string() + ": the package does not load: " + e.what());
  }
  return std::make_shared<AotiDenoiser>(std::move(spec), run_options, std::move(package));
}

}  // namespace latent
