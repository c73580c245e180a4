// What the benchmark drivers (latent-bench, latent-gen-bench) share: their command-line reading, process memory
// from /proc and the CUDA allocator's peaks, and device synchronisation around timed spans.
#pragma once

#include <torch/csrc/autograd/profiler_kineto.h>
#include <torch/types.h>

#ifdef LATENT_WITH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <torch/cuda.h>
#endif

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <optional>
#include <set>
#include <string>

#include "io/json.h"
#include "io/numbers.h"

namespace latent::bench {

using latent::json::Value;

// Walks argv as `--key value` pairs and flags. A missing or malformed value is reported on stderr, naming the
// program and the key, and ends in usage(2).
class ArgReader {
 public:
  ArgReader(const char* program, int argc, char** argv, void (*usage)(int))
      : program_(program), argc_(argc), argv_(argv), usage_(usage) {}

  bool next_key() {
    if (++i_ >= argc_) return false;
    key_ = argv_[i_];
    return true;
  }
  const std::string& key() const { return key_; }
  std::string value() {
    if (i_ + 1 >= argc_) fail("needs a value");
    return argv_[++i_];
  }
  int64_t integer(int64_t lo, int64_t hi) {
    const std::string v = value();
    if (auto n = latent::bounded_integer(v, lo, hi)) return *n;
    fail("wants an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got '" + v + "'");
  }
  [[noreturn]] void fail(const std::string& what) const {
    std::fprintf(stderr, "%s: %s %s\n", program_, key_.c_str(), what.c_str());
    usage_(2);
    std::exit(2);
  }

 private:
  const char* program_;
  int argc_;
  char** argv_;
  void (*usage_)(int);
  int i_ = 0;
  std::string key_;
};

// ---- process memory ------------------------------------------------------------------------------------------

// A "VmXXX:  1234 kB" line of /proc/self/status, in bytes; -1 where it cannot be read.
inline int64_t proc_status_bytes(const char* key) {
  std::ifstream f("/proc/self/status");
  std::string line;
  const std::string prefix = std::string(key) + ":";
  while (std::getline(f, line)) {
    if (line.rfind(prefix, 0) == 0) return std::stoll(line.substr(prefix.size())) * 1024;
  }
  return -1;
}

// Resets VmHWM to the current RSS (Linux >= 4.0). False where the kernel refuses.
inline bool reset_peak_rss() {
  std::ofstream f("/proc/self/clear_refs");
  if (!f) return false;
  f << "5";
  f.flush();
  return bool(f);
}

// ---- devices -------------------------------------------------------------------------------------------------

inline void synchronize(const torch::Device& device) {
#ifdef LATENT_WITH_CUDA
  if (device.is_cuda()) torch::cuda::synchronize(device.index());
#else
  (void)device;
#endif
}

inline void reset_gpu_peak(const torch::Device& device) {
#ifdef LATENT_WITH_CUDA
  if (device.is_cuda()) c10::cuda::CUDACachingAllocator::resetPeakStats(device.index());
#else
  (void)device;
#endif
}

inline std::optional<Value> gpu_memory(const torch::Device& device, int64_t baseline_allocated) {
#ifdef LATENT_WITH_CUDA
  if (!device.is_cuda()) return std::nullopt;
  const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device.index());
  const size_t all = 0;  // StatType::AGGREGATE
  const int64_t peak = stats.allocated_bytes[all].peak;
  return Value(latent::json::Object{
      {"allocated_baseline_bytes", Value::integer(baseline_allocated)},
      {"allocated_peak_bytes", Value::integer(peak)},
      {"allocated_peak_above_baseline_bytes", Value::integer(peak - baseline_allocated)},
      {"reserved_peak_bytes", Value::integer(stats.reserved_bytes[all].peak)},
      {"num_ooms", Value::integer(stats.num_ooms)},
  });
#else
  (void)device;
  (void)baseline_allocated;
  return std::nullopt;
#endif
}

inline int64_t gpu_allocated_now(const torch::Device& device) {
#ifdef LATENT_WITH_CUDA
  if (device.is_cuda()) {
    return c10::cuda::CUDACachingAllocator::getDeviceStats(device.index()).allocated_bytes[0].current;
  }
#else
  (void)device;
#endif
  return 0;
}

// PyTorch's own profiler (Kineto) over a span: the operators on the CPU and, where the device is a GPU, its kernels
// and copies with their times, so the gaps between kernels show what the host costs. Stopping writes a Chrome
// trace.
inline void start_profiler(const torch::Device& device) {
  using namespace torch::profiler::impl;
  const ProfilerConfig config(ProfilerState::KINETO);
  std::set<ActivityType> activities{ActivityType::CPU};
  if (device.is_cuda()) activities.insert(ActivityType::CUDA);
  torch::autograd::profiler::prepareProfiler(config, activities);
  torch::autograd::profiler::enableProfiler(config, activities);
}

inline void stop_profiler(const std::string& path) { torch::autograd::profiler::disableProfiler()->save(path); }

}  // namespace latent::bench
