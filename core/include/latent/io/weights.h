// Model weights as users have them: a diffusers folder (config.json + diffusion_pytorch_model.safetensors), one
// .safetensors file (config in __metadata__ or none), or a torch.save() checkpoint (.pth, e.g. Wan2.1_VAE.pth).
#pragma once

#include <torch/types.h>

#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

namespace latent {

// Every problem with a model source: unreadable files, unknown families, missing or mis-shaped tensors.
class ModelError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A model's configuration as its authors wrote it: config.json beside the weights, or __metadata__ "config". It is
// checked to be a JSON object when read; each family reads its own typed configuration from it (core/src/vae/).
struct ModelConfig {
  std::string class_name;  // "_class_name" (e.g. AutoencoderKLWan); empty when absent
  std::string text;        // the JSON object as read
};

// A float32 term added to a stored tensor when a model takes it (a LoRA's product), and where it comes from.
struct WeightUpdate {
  std::string from;                     // "<file>: \"<key>\"", for messages
  std::function<torch::Tensor()> make;  // the term, float32 on the CPU; throws ModelError when it is not finite
};

struct WeightSource {
  std::filesystem::path weights;  // the tensor file actually read
  std::optional<ModelConfig> config;
  std::map<std::string, std::string> metadata;
  std::map<std::string, torch::Tensor> tensors;  // CPU, dtype as stored
  // Terms added, in order, to the named tensors as WeightReader takes them: merged one tensor at a time, in float32,
  // so the merged copies never all exist at once.
  std::map<std::string, std::vector<WeightUpdate>> updates;
  // The memory-mapped files the tensors point into (safetensors and torch.save checkpoints alike).
  std::vector<std::span<const std::byte>> mapped;
};

// Resolves `path` (folder or file) and reads every tensor. Throws ModelError (or SafetensorsError) naming the
// file and the defect.
WeightSource read_weights(const std::filesystem::path& path);

// Takes tensors out of a WeightSource for one model, checking each shape, and reports every problem at once:
// a user fixing a checkpoint wants the whole list, not one name per attempt.
class WeightReader {
 public:
  WeightReader(const WeightSource& source, torch::Device device, torch::ScalarType dtype);

  // The tensor converted to the compute device and dtype; an undefined tensor (and a recorded problem) when it
  // is missing or its shape differs from `shape`. Where no conversion was needed it is a new view of the
  // source's storage, so settle_residency() can tell kept tensors from dropped ones by their storage's users.
  // A converted tensor (another device or dtype) is checked for NaN and infinite values on the way, which costs one
  // pass over memory it has just written; one that is only viewed is not, so its mapped pages are not all read at
  // load (the elements say so of their output instead). A tensor with updates is merged here (a float32 copy plus
  // each term): ModelError naming the update when the sum overflows float32.
  torch::Tensor take(const std::string& name, std::vector<int64_t> shape);
  // Throws ModelError listing missing, mis-shaped, non-finite and unused tensors, if any.
  void finish() const;

 private:
  const WeightSource& source_;
  torch::Device device_;
  torch::ScalarType dtype_;
  std::map<std::string, bool> used_;
  std::vector<std::string> missing_;
  std::vector<std::string> misshaped_;
  std::vector<std::string> non_finite_;
};

}  // namespace latent
