// Choosing devices and dtypes from user strings, and sharing loaded models between streams: an encoder and a
// decoder of the same model on the same device hold one copy of the weights.
#pragma once

#include <torch/types.h>

#include <filesystem>
#include <memory>
#include <stdexcept>
#include <string>

#include "latent/vae.h"

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

// The loaded model for (path, device, dtype), shared while anyone holds it and loaded again after the last
// holder let go. Thread-safe; concurrent first requests load once.
std::shared_ptr<const Vae> shared_vae(const std::filesystem::path& path, const LoadOptions& options);

}  // namespace latent
