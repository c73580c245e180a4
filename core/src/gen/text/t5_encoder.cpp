#include "gen/text/t5_encoder.h"

#include <ATen/ops/scaled_dot_product_attention.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <cmath>
#include <limits>
#include <optional>
#include <set>

#include "io/json.h"
#include "io/weight_files.h"
#include "latent/io/safetensors.h"
#include "latent/io/weights.h"

namespace fs = std::filesystem;

namespace latent {
namespace {

int64_t get_int(const json::Value& doc, const char* key, const std::string& where, std::optional<int64_t> def = {}) {
  const json::Value* v = doc.find(key);
  if (!v) {
    if (def) return *def;
    throw ModelError(where + ": config has no \"" + key + "\"");
  }
  try {
    int64_t x = v->as_int64();
    if (x <= 0) throw json::Error("must be positive");
    return x;
  } catch (const json::Error& e) {
    throw ModelError(where + ": config \"" + key + "\": " + e.what());
  }
}

}  // namespace

T5EncoderConfig T5EncoderConfig::parse(const std::string& text, const std::string& where) {
  json::Value doc;
  try {
    doc = json::parse(text);
  } catch (const json::Error& e) {
    throw ModelError(where + ": not JSON: " + e.what());
  }
  if (!doc.is_object()) throw ModelError(where + ": config is not a JSON object");
  const json::Value* type = doc.find("model_type");
  T5EncoderConfig c;
  if (type && type->is_string() && type->as_string() == "umt5")
    c.variant = Variant::UMT5;
  else if (type && type->is_string() && type->as_string() == "t5")
    c.variant = Variant::T5;
  else
    throw ModelError(where + ": \"model_type\" is " +
                     (type ? (type->is_string() ? "\"" + type->as_string() + "\"" : "not a string") : "absent") +
                     "; the text encoders read are \"t5\" (T5EncoderModel) and \"umt5\" (UMT5EncoderModel)");
  c.vocab_size = get_int(doc, "vocab_size", where);
  c.d_model = get_int(doc, "d_model", where);
  c.d_kv = get_int(doc, "d_kv", where);
  c.d_ff = get_int(doc, "d_ff", where);
  c.num_layers = get_int(doc, "num_layers", where);
  c.num_heads = get_int(doc, "num_heads", where);
  c.num_buckets = get_int(doc, "relative_attention_num_buckets", where, 32);
  c.max_distance = get_int(doc, "relative_attention_max_distance", where, 128);
  if (const json::Value* e = doc.find("layer_norm_epsilon")) {
    try {
      c.eps = e->as_double();
    } catch (const json::Error& err) {
      throw ModelError(where + ": config \"layer_norm_epsilon\": " + err.what());
    }
  }
  // T5Config and UMT5Config alike: "gated-gelu" means gelu_new; otherwise the activation named after an optional
  // "gated-".
  std::string proj = "gated-gelu";
  if (const json::Value* p = doc.find("feed_forward_proj"); p && p->is_string()) proj = p->as_string();
  c.gated = proj.rfind("gated-", 0) == 0;
  c.act = c.gated ? proj.substr(6) : proj;
  if (proj == "gated-gelu") c.act = "gelu_new";
  if (const json::Value* a = doc.find("dense_act_fn"); a && a->is_string()) c.act = a->as_string();
  static const std::set<std::string> known = {"gelu_new", "gelu_pytorch_tanh", "gelu", "relu"};
  if (!known.count(c.act))
    throw ModelError(where + ": activation \"" + c.act + "\" (feed_forward_proj / dense_act_fn) is not supported");
  if (c.num_buckets < 4 || c.max_distance <= c.num_buckets / 4)
    throw ModelError(where + ": relative_attention_num_buckets / relative_attention_max_distance out of range");
  return c;
}

T5Encoder::T5Encoder(const fs::path& dir, torch::Device device, torch::ScalarType dtype)
    : device_(device), dtype_(dtype) {
  if (!fs::is_directory(dir)) throw ModelError(dir.string() + ": no text encoder folder");
  fs::path cfg = dir / "config.json";
  if (!fs::exists(cfg)) throw ModelError(dir.string() + ": folder has no config.json");
  config_ = T5EncoderConfig::parse(read_text_file(cfg), cfg.string());
  const auto& c = config_;
  WeightSource src = read_safetensors_folder(dir, "model");
  WeightReader r(src, device, dtype);
  const int64_t inner = c.num_heads * c.d_kv;
  shared_ = r.take("shared.weight", {c.vocab_size, c.d_model});
  // Tied to shared.weight; some exports write both.
  if (src.tensors.count("encoder.embed_tokens.weight"))
    r.take("encoder.embed_tokens.weight", {c.vocab_size, c.d_model});
  for (int64_t i = 0; i < c.num_layers; ++i) {
    std::string p = "encoder.block." + std::to_string(i) + ".layer.";
    Layer l;
    l.attn_norm = r.take(p + "0.layer_norm.weight", {c.d_model});
    l.q = r.take(p + "0.SelfAttention.q.weight", {inner, c.d_model});
    l.k = r.take(p + "0.SelfAttention.k.weight", {inner, c.d_model});
    l.v = r.take(p + "0.SelfAttention.v.weight", {inner, c.d_model});
    l.o = r.take(p + "0.SelfAttention.o.weight", {c.d_model, inner});
    if (c.variant == T5EncoderConfig::Variant::UMT5 || i == 0)
      l.rel_bias = r.take(p + "0.SelfAttention.relative_attention_bias.weight", {c.num_buckets, c.num_heads});
    l.ff_norm = r.take(p + "1.layer_norm.weight", {c.d_model});
    if (c.gated) {
      l.wi_0 = r.take(p + "1.DenseReluDense.wi_0.weight", {c.d_ff, c.d_model});
      l.wi_1 = r.take(p + "1.DenseReluDense.wi_1.weight", {c.d_ff, c.d_model});
    } else {
      l.wi_0 = r.take(p + "1.DenseReluDense.wi.weight", {c.d_ff, c.d_model});
    }
    l.wo = r.take(p + "1.DenseReluDense.wo.weight", {c.d_model, c.d_ff});
    // Straight from the file, not through float16: transformers upcasts the stored values.
    if (dtype == torch::kFloat16 && l.wo.defined())
      l.wo = src.tensors.at(p + "1.DenseReluDense.wo.weight").to(device, torch::kFloat32);
    layers_.push_back(std::move(l));
  }
  final_norm_ = r.take("encoder.final_layer_norm.weight", {c.d_model});
  r.finish();
}

void T5Encoder::release() {
  shared_ = torch::Tensor();
  layers_.clear();
  layers_.shrink_to_fit();
  final_norm_ = torch::Tensor();
}

// T5LayerNorm / UMT5LayerNorm: variance in fp32, no mean, no bias; back to the weight's dtype only for half types.
torch::Tensor T5Encoder::rms_norm(const torch::Tensor& x, const torch::Tensor& w) const {
  auto variance = x.to(torch::kFloat32).pow(2).mean(-1, true);
  auto h = x * torch::rsqrt(variance + config_.eps);
  if (w.scalar_type() == torch::kFloat16 || w.scalar_type() == torch::kBFloat16) h = h.to(w.scalar_type());
  return w * h;
}

torch::Tensor T5Encoder::act(const torch::Tensor& x) const {
  const auto& a = config_.act;
  if (a == "gelu_new") {
    // transformers' NewGELUActivation, written out as it is there.
    return 0.5 * x * (1.0 + torch::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * torch::pow(x, 3.0))));
  }
  if (a == "gelu_pytorch_tanh") return torch::gelu(x, "tanh");
  if (a == "gelu") return torch::gelu(x);
  return torch::relu(x);
}

// T5Attention / UMT5Attention._relative_position_bucket for the encoder (bidirectional), the same tensor ops in the
// same order so the float32 logarithm rounds as it does there.
torch::Tensor T5Encoder::buckets(int64_t length) const {
  auto opts = torch::TensorOptions().dtype(torch::kLong).device(device_);
  auto context = torch::arange(length, opts).unsqueeze(1);
  auto memory = torch::arange(length, opts).unsqueeze(0);
  auto rel = memory - context;
  int64_t num_buckets = config_.num_buckets / 2;
  auto out = (rel > 0).to(torch::kLong) * num_buckets;
  rel = torch::abs(rel);
  int64_t max_exact = num_buckets / 2;
  auto is_small = rel < max_exact;
  auto log_ratio = torch::log(rel.to(torch::kFloat) / static_cast<double>(max_exact)) /
                   std::log(static_cast<double>(config_.max_distance) / static_cast<double>(max_exact));
  log_ratio = log_ratio * static_cast<double>(num_buckets - max_exact);
  auto if_large = max_exact + log_ratio.to(torch::kLong);
  if_large = torch::min(if_large, torch::full_like(if_large, num_buckets - 1));
  return out + torch::where(is_small, rel, if_large);
}

torch::Tensor T5Encoder::forward(const torch::Tensor& ids_in, const torch::Tensor& mask) const {
  if (!shared_.defined()) throw ModelError("text encoder: the weights were released");
  torch::NoGradGuard no_grad;
  const auto& c = config_;
  TORCH_CHECK(ids_in.dim() == 2, "text encoder: ids must be [batch, length]");
  auto ids = ids_in.to(device_, torch::kLong);
  const int64_t B = ids.size(0), L = ids.size(1);
  if (L == 0) return torch::zeros({B, 0, c.d_model}, torch::TensorOptions().dtype(dtype_).device(device_));
  if (ids.min().item<int64_t>() < 0 || ids.max().item<int64_t>() >= c.vocab_size)
    throw ModelError("text encoder: a token id is outside the vocabulary of " + std::to_string(c.vocab_size));

  auto h = torch::embedding(shared_, ids);
  auto bucket = buckets(L);
  torch::Tensor pad;  // [B, 1, 1, L] true where the key is padding
  if (mask.defined()) pad = (mask.to(device_) == 0).view({B, 1, 1, L});
  // On the hidden state's own dtype, as transformers tests it: with float32 output projections in float16 the
  // stream is float32 after the first feed-forward, and no longer clamped.
  auto clamp16 = [&](torch::Tensor x) {
    if (x.scalar_type() != torch::kFloat16) return x;
    double max = 65504.0;
    double v = torch::isinf(x).any().item<bool>() ? max - 1000 : max;
    return torch::clamp(x, -v, v);
  };
  auto position_bias = [&](const torch::Tensor& table, torch::ScalarType dtype) {
    auto bias = torch::embedding(table, bucket).permute({2, 0, 1}).unsqueeze(0).to(dtype);
    if (pad.defined())
      bias = torch::where(pad, torch::full({}, -std::numeric_limits<double>::infinity(), bias.options()), bias);
    return bias;
  };
  torch::Tensor shared_bias;  // T5: the first layer's, reused by the others
  for (const auto& l : layers_) {
    auto x = rms_norm(h, l.attn_norm);
    auto q = torch::linear(x, l.q).view({B, L, c.num_heads, c.d_kv}).transpose(1, 2);
    auto k = torch::linear(x, l.k).view({B, L, c.num_heads, c.d_kv}).transpose(1, 2);
    auto v = torch::linear(x, l.v).view({B, L, c.num_heads, c.d_kv}).transpose(1, 2);
    // No 1/sqrt(d) scaling: the models were trained with it folded into the weights.
    torch::Tensor bias;
    if (c.variant == T5EncoderConfig::Variant::UMT5) {
      bias = position_bias(l.rel_bias, q.scalar_type());
    } else {
      if (!shared_bias.defined()) shared_bias = position_bias(l.rel_bias, q.scalar_type());
      bias = shared_bias;
    }
    auto a = at::scaled_dot_product_attention(q, k, v, bias, 0.0, false, 1.0);
    a = a.transpose(1, 2).reshape({B, L, c.num_heads * c.d_kv});
    h = clamp16(h + torch::linear(a, l.o));
    x = rms_norm(h, l.ff_norm);
    auto f = c.gated ? act(torch::linear(x, l.wi_0)) * torch::linear(x, l.wi_1) : act(torch::linear(x, l.wi_0));
    h = clamp16(h + torch::linear(f.to(l.wo.scalar_type()), l.wo));
  }
  return rms_norm(h, final_norm_);
}

}  // namespace latent
