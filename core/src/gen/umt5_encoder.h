// transformers' UMT5EncoderModel (the text encoder of the Wan 2.1 pipelines) in LibTorch, read from a diffusers
// pipeline's text_encoder/ folder (config.json + model.safetensors, or shards with model.safetensors.index.json).
#pragma once
#include <torch/types.h>

#include <filesystem>
#include <string>
#include <vector>

namespace latent {

struct Umt5Config {
  int64_t vocab_size = 0;
  int64_t d_model = 0;
  int64_t d_kv = 0;
  int64_t d_ff = 0;
  int64_t num_layers = 0;
  int64_t num_heads = 0;
  int64_t num_buckets = 32;
  int64_t max_distance = 128;
  double eps = 1e-6;
  bool gated = true;
  std::string act = "gelu_new";

  // Throws ModelError naming `where` and the key that is missing or not understood.
  static Umt5Config parse(const std::string& json_text, const std::string& where);
};

class Umt5Encoder {
 public:
  // Weights stay views of the mapped files where `dtype` is theirs (and the device the CPU).
  Umt5Encoder(const std::filesystem::path& text_encoder_dir, torch::Device device, torch::ScalarType dtype);

  const Umt5Config& config() const { return config_; }
  torch::ScalarType dtype() const { return dtype_; }
  torch::Device device() const { return device_; }

  // ids [B, L] int64; mask [B, L] (nonzero = token, zero = padding) or undefined for none. Returns the last hidden
  // state [B, L, d_model] in the weights' dtype.
  torch::Tensor forward(const torch::Tensor& ids, const torch::Tensor& mask = {}) const;

  // Drops every weight (and so the file mappings); forward() throws afterwards.
  void release();
  bool released() const { return shared_.defined() == false; }

 private:
  struct Layer {
    torch::Tensor attn_norm, q, k, v, o, rel_bias;
    torch::Tensor ff_norm, wi_0, wi_1, wo;  // wi_1 undefined when not gated (wi_0 is then "wi")
  };
  torch::Tensor rms_norm(const torch::Tensor& x, const torch::Tensor& w) const;
  torch::Tensor act(const torch::Tensor& x) const;
  torch::Tensor buckets(int64_t length) const;

  Umt5Config config_;
  torch::Device device_;
  torch::ScalarType dtype_;
  torch::Tensor shared_;
  std::vector<Layer> layers_;
  torch::Tensor final_norm_;
};

}  // namespace latent
