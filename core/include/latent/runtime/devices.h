// Choosing devices and dtypes from user strings. An explicitly requested device that is missing is an error, so a
// pipeline never runs on the CPU by surprise.
#pragma once

#include <torch/types.h>

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
// budgets: the kernel's MemAvailable on the CPU; on a CUDA device the driver's free memory plus what the caching
// allocator holds unused. 0 where it cannot be told.
size_t available_memory(torch::Device device);

}  // namespace latent
