// Choosing devices and dtypes from user strings. An explicitly requested device that is missing is an error, so a
// pipeline never runs on the CPU by surprise.
#pragma once

#include <torch/types.h>

#include <filesystem>
#include <functional>
#include <stdexcept>
#include <string>

namespace latent {

class DeviceError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// "auto" (the first GPU if there is one, else the CPU), "cpu", "cuda", "cuda:N". An explicit device that is
// missing is an error, never a silent fallback.
torch::Device resolve_device(const std::string& spec);

// "auto" (float32 on the CPU, bfloat16 on a GPU), "float32", "float16", "bfloat16" (also f32/f16/bf16, fp32/...).
torch::ScalarType resolve_dtype(const std::string& spec, torch::Device device);

// Bytes the device can still hand out, for checks made before a large allocation and for automatic memory
// budgets: host_available_memory() on the CPU; on a CUDA device the driver's free memory plus what the caching
// allocator holds unused. 0 where it cannot be told.
size_t available_memory(torch::Device device);

// The host memory this process can still take: the smaller of the kernel's MemAvailable and the room left under the
// memory limits of the process's cgroup and its ancestors (cgroup v2 memory.max, v1 memory.limit_in_bytes), so a
// container refuses a size instead of being killed by the OOM killer. The room under a limit is the limit less the
// usage that cannot be reclaimed (usage less inactive file cache, as the kernel would drop that page cache before
// killing). `root` is the file system root the /proc and /sys/fs/cgroup files are read under (another root in
// tests). A limit that is absent, "max" or unreadable is no limit; 0 where neither MemAvailable nor a limit can be
// read.
size_t host_available_memory(const std::filesystem::path& root = "/");

// Runs `work` on a CUDA stream of its own on `device` and waits for it, so work done beside a stream that generates
// (a live prompt's text encoder) neither waits behind its kernels nor delays them; on the CPU it just runs `work`.
void run_on_side_stream(torch::Device device, const std::function<void()>& work);

}  // namespace latent
