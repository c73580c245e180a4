// transformers' T5EncoderModel (the CogVideoX text encoder, t5-v1_1-xxl) and UMT5EncoderModel (the Wan 2.1 one) in
// LibTorch, read from a diffusers pipeline's text_encoder/ folder (config.json + model.safetensors, or shards with
// model.safetensors.index.json). The two differ only in the relative position bias: T5 has one table, in the first
// layer, whose bias every layer adds; umT5 has a table per layer. config.json's "model_type" says which.
#pragma once
#include <torch/types.h>

#include <filesystem>
#include <string>
#include <vector>

namespace latent {

struct T5EncoderConfig {
  enum class Variant { T5, UMT5 };
  Variant variant = Variant::UMT5;
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

  // "model_type" "t5" or "umt5". Throws ModelError naming `where` and the key that is missing or not understood.
  static T5EncoderConfig parse(const std::string& json_text, const std::string& where);
};

class T5Encoder {
 public:
  // Weights stay views of the mapped files where `dtype` is theirs (and the device the CPU). In float16 the
  // feed-forward output projections are kept in float32, as transformers loads both models (their
  // _keep_in_fp32_modules), which also keeps the residual stream in float32 from the first one on.
  T5Encoder(const std::filesystem::path& text_encoder_dir, torch::Device device, torch::ScalarType dtype);

  const T5EncoderConfig& config() const { return config_; }
  torch::ScalarType dtype() const { return dtype_; }
  torch::Device device() const { return device_; }

  // ids [B, L] int64; mask [B, L] (nonzero = token, zero = padding) or undefined for none. Returns the last hidden
  // state [B, L, d_model] in `dtype`.
  torch::Tensor forward(const torch::Tensor& ids, const torch::Tensor& mask = {}) const;

  // Drops every weight (and so the file mappings); forward() throws afterwards.
  void release();
  bool released() const { return shared_.defined() == false; }

 private:
  struct Layer {
    torch::Tensor attn_norm, q, k, v, o;
    torch::Tensor rel_bias;                 // umT5: every layer; T5: only the first
    torch::Tensor ff_norm, wi_0, wi_1, wo;  // wi_1 undefined when not gated (wi_0 is then "wi")
  };
  torch::Tensor rms_norm(const torch::Tensor& x, const torch::Tensor& w) const;
  torch::Tensor act(const torch::Tensor& x) const;
  torch::Tensor buckets(int64_t length) const;

  T5EncoderConfig config_;
  torch::Device device_;
  torch::ScalarType dtype_;
  torch::Tensor shared_;
  std::vector<Layer> layers_;
  torch::Tensor final_norm_;
};

}  // namespace latent
