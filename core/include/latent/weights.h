// Model weights as users have them: a diffusers folder (config.json + diffusion_pytorch_model.safetensors), one
// .safetensors file (config in __metadata__ or none), or a torch.save() checkpoint (.pth, e.g. Wan2.1_VAE.pth).
#pragma once

#include <torch/types.h>

#include <filesystem>
#include <map>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "latent/json.h"

namespace latent {

// Every problem with a model source: unreadable files, unknown families, missing or mis-shaped tensors.
class ModelError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct WeightSource {
  std::filesystem::path weights;      // the tensor file actually read
  std::optional<json::Value> config;  // config.json beside it, or __metadata__["config"]
  std::map<std::string, std::string> metadata;
  std::map<std::string, torch::Tensor> tensors;  // CPU, dtype as stored
  // The memory-mapped files the tensors point into (safetensors and torch.save checkpoints alike).
  std::vector<std::span<const std::byte>> mapped;
};

// Resolves `path` (folder or file) and reads every tensor. Throws ModelError (or SafetensorsError) naming the
// file and the defect.
WeightSource read_weights(const std::filesystem::path& path);

// Page residency of a mapped WeightSource once a model has taken its tensors: the pages of tensors the model still
// holds as views are read in now (the first chunk then pays no page faults, and a process's baseline memory holds
// the whole model), and the pages of tensors it holds no view of (replaced by a transformed copy, converted to
// another dtype or device) are handed back to the kernel, so the weights do not count twice. The pages are clean
// file pages of a private mapping: a later reader of a released tensor gets them again from the file, unchanged.
// Returns {bytes read in, bytes released}.
struct Residency {
  int64_t resident_bytes = 0;
  int64_t released_bytes = 0;
};
Residency settle_residency(const WeightSource& source);

// Takes tensors out of a WeightSource for one model, checking each shape, and reports every problem at once:
// a user fixing a checkpoint wants the whole list, not one name per attempt.
class WeightReader {
 public:
  WeightReader(const WeightSource& source, torch::Device device, torch::ScalarType dtype);

  // The tensor converted to the compute device and dtype; an undefined tensor (and a recorded problem) when it
  // is missing or its shape differs from `shape`. Where no conversion was needed it is a new view of the
  // source's storage, so settle_residency() can tell kept tensors from dropped ones by their storage's users.
  torch::Tensor take(const std::string& name, std::vector<int64_t> shape);
  // Throws ModelError listing missing, mis-shaped and unused tensors, if any.
  void finish() const;

 private:
  const WeightSource& source_;
  torch::Device device_;
  torch::ScalarType dtype_;
  std::map<std::string, bool> used_;
  std::vector<std::string> missing_;
  std::vector<std::string> misshaped_;
};

}  // namespace latent
