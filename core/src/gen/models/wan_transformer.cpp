// Wan 2.1's denoiser, diffusers' WanTransformer3DModel, run natively from a diffusers folder. The arithmetic
// follows diffusers 0.42's module op for op, in the same dtypes (the modulation, the layer norms, the time
// embedder and the scale-shift tables in float32 whatever the compute dtype, as diffusers keeps those modules), so
// tests/core/gen/test_wan_transformer.cpp can hold it to diffusers' output within float rounding.
//
// Each latent frame has its own timestep (the Denoiser interface), which is diffusers' per-token timestep with
// one value repeated over a frame's patches (tools/export_denoiser.py feeds it so): the time embedding and the
// modulation are computed once per frame here and broadcast over that frame's tokens, which is the same values.
#include <torch/types.h>
#include <torch/utils.h>

#include <algorithm>
#include <cmath>
#include <deque>
#include <memory>
#include <mutex>
#include <numeric>
#include <optional>
#include <set>
#include <sstream>

#include "gen/layer_interrupt.h"
#include "gen/models/backends.h"
#include "gen/models/causal_model.h"
#include "gen/models/diffusers_folder.h"
#include "gen/models/sequence_parallel.h"
#include "gen/models/wan_weights.h"
#include "io/weight_files.h"
#include "latent/io/safetensors.h"
#include "memory/residency.h"

namespace latent {
namespace {

namespace fs = std::filesystem;
using torch::Tensor;

// The prompt embedding length of Wan's pipeline (umT5 output, padded to 512 tokens).
constexpr int64_t kTextTokens = 512;
// Bounds far above the published configs (1.3B: 12 heads of 128, 30 layers; 14B: 40 heads, 40 layers), low enough
// that no product of them overflows before the tensor shapes are checked against the files.
constexpr int64_t kMaxDim = 1 << 16;
constexpr int64_t kMaxLayers = 256;
constexpr int64_t kMaxPatch = 16;
constexpr int64_t kMaxWindow = 1024;
// WanPipeline's num_frames: 81 video frames, 21 latents, the clip Wan 2.1 was trained on.
constexpr int64_t kTrainedFrames = 21;

struct WanConfig {
  int64_t pt = 1, ph = 2, pw = 2;
  int64_t heads = 0, head_dim = 0, in_channels = 0, out_channels = 0, text_dim = 0, freq_dim = 0, ffn_dim = 0;
  int64_t layers = 0, rope_max_seq_len = 1024;
  bool cross_attn_norm = true;
  double eps = 1e-6;
  int64_t dim() const { return heads * head_dim; }
};

WanConfig parse_config(const json::Value& v, const std::string& where) {
  ConfigReader r(v, where);
  WanConfig c;
  if (const json::Value* p = r.get("patch_size")) {
    if (!p->is_array() || p->as_array().size() != 3) r.fail("patch_size", "is not a list of 3 integers");
    int64_t s[3];
    for (int i = 0; i < 3; ++i) {
      try {
        s[i] = p->as_array()[size_t(i)].as_int64();
      } catch (const json::Error&) {
        r.fail("patch_size", "is not a list of 3 integers");
      }
      if (s[i] < 1 || s[i] > kMaxPatch) r.fail("patch_size", "has an entry out of range [1, 16]");
    }
    c.pt = s[0], c.ph = s[1], c.pw = s[2];
    // One timestep per latent frame needs one frame per token.
    if (c.pt != 1) r.fail("patch_size", "has a temporal patch of " + std::to_string(c.pt) + ": only 1 is supported");
  }
  c.heads = r.integer("num_attention_heads", 40, 1, kMaxDim);
  c.head_dim = r.integer("attention_head_dim", 128, 2, kMaxDim);
  if (c.head_dim % 2 != 0 || (c.head_dim - 4 * (c.head_dim / 6)) % 2 != 0)
    r.fail("attention_head_dim", "= " + std::to_string(c.head_dim) + " cannot be split into 3 even RoPE parts");
  if (c.dim() > kMaxDim) r.fail("num_attention_heads", "times attention_head_dim is too large");
  c.in_channels = r.integer("in_channels", 16, 1, kMaxDim);
  c.out_channels = r.integer("out_channels", c.in_channels, 1, kMaxDim);
  if (c.out_channels != c.in_channels)
    r.fail("out_channels", "differs from in_channels: not a denoiser of its own latents");
  c.text_dim = r.integer("text_dim", 4096, 1, kMaxDim);
  c.freq_dim = r.integer("freq_dim", 256, 2, kMaxDim);
  if (c.freq_dim % 2 != 0) r.fail("freq_dim", "is odd");
  c.ffn_dim = r.integer("ffn_dim", 13824, 1, 4 * kMaxDim);
  c.layers = r.integer("num_layers", 40, 1, kMaxLayers);
  c.cross_attn_norm = r.boolean("cross_attn_norm", true);
  // diffusers builds the q/k RMS norms across heads whatever this says.
  const std::string qk = r.string("qk_norm", "rms_norm_across_heads");
  if (qk != "rms_norm_across_heads") r.fail("qk_norm", "= \"" + qk + "\": only \"rms_norm_across_heads\" is known");
  c.eps = r.number("eps", 1e-6, 0, 1);
  c.rope_max_seq_len = r.integer("rope_max_seq_len", 1024, 1, 1 << 20);
  r.unsupported("image_dim", "image conditioning (Wan image-to-video)");
  r.unsupported("added_kv_proj_dim", "image conditioning (Wan image-to-video)");
  r.unsupported("pos_embed_seq_len", "image position embedding (Wan FLF2V)");
  r.no_other_keys();
  return c;
}

// The sampler Wan's pipeline would use: scheduler/scheduler_config.json where the folder has one.
SamplerOptions parse_scheduler(const fs::path& file) {
  SamplerOptions s;
  s.kind = SamplerKind::unipc;
  s.steps = 50;   // WanPipeline's num_inference_steps
  s.shift = 3.0;  // Wan2.1-T2V-1.3B-Diffusers' scheduler (480p)
  if (!fs::exists(file)) return s;
  const json::Value v = read_json_object(file);
  const std::string cls = class_name_of(v);
  const std::string where = file.string();
  ConfigReader r(v, where);
  const auto require = [&](const std::string& key, const std::string& want, const std::string& fallback) {
    const std::string got = r.string(key, fallback);
    if (got != want) r.fail(key, "= \"" + got + "\": only \"" + want + "\" is supported");
  };
  const auto require_bool = [&](const std::string& key, bool want, bool fallback) {
    if (r.boolean(key, fallback) != want) r.fail(key, std::string("must be ") + (want ? "true" : "false"));
  };
  s.train_timesteps = r.integer("num_train_timesteps", 1000, 1, 100000);
  // A terminal stretch of the shifted sigmas, which the samplers do not make.
  if (const json::Value* t = r.get("shift_terminal"); t && !(t->is_number() && t->as_double() == 0))
    r.fail("shift_terminal", "is set: a stretched schedule is not supported");
  if (cls == "UniPCMultistepScheduler") {
    s.kind = SamplerKind::unipc;
    s.shift = r.number("flow_shift", 1.0, 1e-3, 1e3);
    require("prediction_type", "flow_prediction", "epsilon");
    require_bool("use_flow_sigmas", true, false);
    if (r.integer("solver_order", 2, 1, 3) != 2) r.fail("solver_order", "must be 2");
    require("solver_type", "bh2", "bh2");
    require_bool("predict_x0", true, true);
    require_bool("lower_order_final", true, true);
    require("final_sigmas_type", "zero", "zero");
    require_bool("thresholding", false, false);
    for (const char* k : {"use_karras_sigmas", "use_exponential_sigmas", "use_beta_sigmas", "use_dynamic_shifting"})
      require_bool(k, false, false);
    if (const json::Value* d = r.get("disable_corrector"); d && !(d->is_array() && d->as_array().empty()))
      r.fail("disable_corrector", "must be empty");
    if (r.get("solver_p")) r.fail("solver_p", "is set: only UniPC's own predictor is supported");
    // With flow sigmas the schedule is the shifted linspace alone: the betas, the spacing and its offset, the
    // Karras range and the dynamic-shift kind never enter it, and the threshold values only act with
    // thresholding, which is refused above.
    for (const char* k : {"beta_start", "beta_end", "beta_schedule", "trained_betas", "timestep_spacing",
                          "steps_offset", "rescale_betas_zero_snr", "sigma_min", "sigma_max", "time_shift_type",
                          "dynamic_thresholding_ratio", "sample_max_value"})
      r.ignore(k);
  } else if (cls == "FlowMatchEulerDiscreteScheduler") {
    s.kind = SamplerKind::euler;
    s.shift = r.number("shift", 1.0, 1e-3, 1e3);
    for (const char* k : {"use_karras_sigmas", "use_exponential_sigmas", "use_beta_sigmas", "use_dynamic_shifting",
                          "invert_sigmas", "stochastic_sampling"})
      require_bool(k, false, false);
    // Only dynamic shifting, refused above, reads these.
    for (const char* k : {"base_shift", "max_shift", "base_image_seq_len", "max_image_seq_len", "time_shift_type"})
      r.ignore(k);
  } else {
    throw ModelError(where + ": scheduler \"" + cls +
                     "\" is not supported (UniPCMultistepScheduler or FlowMatchEulerDiscreteScheduler)");
  }
  r.no_other_keys();
  return s;
}

struct Linear {
  Tensor w, b;
  static Linear load(WeightReader& r, const std::string& p, int64_t in, int64_t out) {
    return {r.take(p + ".weight", {out, in}), r.take(p + ".bias", {out})};
  }
  Tensor operator()(const Tensor& x) const { return torch::linear(x, w, b); }
};

struct Attention {
  Linear q, k, v, out;
  Tensor norm_q, norm_k;
  static Attention load(WeightReader& r, const std::string& p, int64_t dim) {
    Attention a;
    a.q = Linear::load(r, p + ".to_q", dim, dim);
    a.k = Linear::load(r, p + ".to_k", dim, dim);
    a.v = Linear::load(r, p + ".to_v", dim, dim);
    a.out = Linear::load(r, p + ".to_out.0", dim, dim);
    a.norm_q = r.take(p + ".norm_q.weight", {dim});
    a.norm_k = r.take(p + ".norm_k.weight", {dim});
    return a;
  }
};

struct Block {
  Attention self_attn, cross_attn;
  Tensor norm2_w, norm2_b;  // float32; undefined without cross_attn_norm
  Linear ffn_in, ffn_out;
  Tensor scale_shift;  // float32 [1, 6, D]
};

// The table of diffusers' module names kept in float32 (WanTransformer3DModel._keep_in_fp32_modules).
bool kept_in_fp32(const std::string& name) {
  std::stringstream ss(name);
  std::string part;
  while (std::getline(ss, part, '.'))
    if (part == "time_embedder" || part == "scale_shift_table" || part == "norm1" || part == "norm2" || part == "norm3")
      return true;
  return false;
}

WeightSource subset(const WeightSource& src, bool fp32) {
  WeightSource out;
  out.weights = src.weights;
  for (const auto& [k, t] : src.tensors)
    if (kept_in_fp32(k) == fp32) out.tensors.emplace(k, t);
  for (const auto& [k, u] : src.updates)
    if (kept_in_fp32(k) == fp32) out.updates.emplace(k, u);
  return out;
}

// A causal call's key/value store and where its frames are (CausalModel::predict_stored).
struct CachedCall {
  KvStore* store;
  int64_t first_frame;
};

class WanTransformer : public Denoiser, public CausalModel {
 public:
  WanTransformer(const WanConfig& cfg, DenoiserSpec spec, const WeightSource& src, const LoadOptions& opt)
      : Denoiser(std::move(spec), opt), cfg_(cfg) {
    const int64_t d = cfg.dim();
    WeightSource wide = subset(src, true), narrow = subset(src, false);
    {
      WeightReader f(wide, opt.device, torch::kFloat), r(narrow, opt.device, opt.dtype);
      patch_w_ = r.take("patch_embedding.weight", {d, cfg.in_channels, cfg.pt, cfg.ph, cfg.pw});
      patch_b_ = r.take("patch_embedding.bias", {d});
      time_1_ = Linear::load(f, "condition_embedder.time_embedder.linear_1", cfg.freq_dim, d);
      time_2_ = Linear::load(f, "condition_embedder.time_embedder.linear_2", d, d);
      time_proj_ = Linear::load(r, "condition_embedder.time_proj", d, 6 * d);
      text_1_ = Linear::load(r, "condition_embedder.text_embedder.linear_1", cfg.text_dim, d);
      text_2_ = Linear::load(r, "condition_embedder.text_embedder.linear_2", d, d);
      for (int64_t i = 0; i < cfg.layers; ++i) {
        const std::string p = "blocks." + std::to_string(i);
        Block b;
        b.self_attn = Attention::load(r, p + ".attn1", d);
        b.cross_attn = Attention::load(r, p + ".attn2", d);
        if (cfg.cross_attn_norm) {
          b.norm2_w = f.take(p + ".norm2.weight", {d});
          b.norm2_b = f.take(p + ".norm2.bias", {d});
        }
        b.ffn_in = Linear::load(r, p + ".ffn.net.0.proj", d, cfg.ffn_dim);
        b.ffn_out = Linear::load(r, p + ".ffn.net.2", cfg.ffn_dim, d);
        b.scale_shift = f.take(p + ".scale_shift_table", {1, 6, d});
        blocks_.push_back(std::move(b));
      }
      proj_out_ = Linear::load(r, "proj_out", d, cfg.out_channels * cfg.pt * cfg.ph * cfg.pw);
      scale_shift_out_ = f.take("scale_shift_table", {1, 2, d});
      // One list of problems for both precisions: a user fixing a checkpoint wants them all at once.
      std::string problems;
      for (WeightReader* w : {&f, &r}) {
        try {
          w->finish();
        } catch (const ModelError& e) {
          std::string m = e.what();
          problems += problems.empty() ? m : m.substr(m.find('\n'));
        }
      }
      if (!problems.empty()) throw ModelError(problems);
    }
    // RoPE frequencies as diffusers makes them: float64, cast to float32 at the end.
    const int64_t hd = cfg.head_dim, hw_dim = 2 * (hd / 6);
    const auto f64 = torch::TensorOptions().dtype(torch::kDouble);
    const Tensor pos = torch::arange(cfg.rope_max_seq_len, torch::TensorOptions().dtype(torch::kLong));
    for (int64_t part : {hd - 2 * hw_dim, hw_dim, hw_dim}) {
      const Tensor inv = 1.0 / torch::pow(10000.0, torch::arange(0, part, 2, f64).narrow(0, 0, part / 2) / part);
      rope_inv_.push_back(inv);
      const Tensor ang = torch::outer(pos, inv);
      rope_cos_.push_back(ang.cos().to(torch::kFloat).to(opt.device));
      rope_sin_.push_back(ang.sin().to(torch::kFloat).to(opt.device));
    }
    const int64_t half = cfg.freq_dim / 2;
    freqs_ =
        torch::exp(torch::arange(0, half, torch::TensorOptions().dtype(torch::kFloat)) * (-std::log(10000.0)) / half)
            .to(opt.device);
    // The original Wan code's sinusoid: float64 frequencies of the float64 timestep (its causal models are
    // distilled with it; diffusers' float32 one differs by ~2e-6 relative in the flow).
    freqs64_ = torch::pow(10000.0, -torch::arange(0, half, f64) / double(half)).to(opt.device);
  }

  int64_t attention_heads() const override { return cfg_.heads; }
  int64_t layers() const override { return cfg_.layers; }
  size_t kv_bytes_per_frame(int64_t height, int64_t width) const override {
    const int64_t tokens = (height / cfg_.ph) * (width / cfg_.pw);
    return size_t(cfg_.layers) * 2 * size_t(tokens) * size_t(cfg_.dim()) * c10::elementSize(dtype());
  }

  size_t call_bytes(int64_t frames, int64_t height, int64_t width) const override {
    const size_t tokens = size_t(frames) * size_t((height / cfg_.ph) * (width / cfg_.pw));
    return tokens * (size_t(cfg_.ffn_dim) * c10::elementSize(dtype()) + 2 * size_t(cfg_.dim()) * sizeof(float));
  }

  Tensor predict_stored(const Tensor& x, const Tensor& timesteps, const Tensor& text, int64_t first_frame,
                        KvStore& store) const override {
    torch::NoGradGuard no_grad;
    if (!x.defined() || x.dim() != 5 || x.size(0) != 1 || x.size(1) != spec_.channels || x.size(2) < 1)
      throw std::invalid_argument("causal call: latents must be [1, " + std::to_string(spec_.channels) +
                                  ", frames, h, w]");
    const int64_t t = x.size(2);
    if (!timesteps.defined() || timesteps.numel() != t)
      throw std::invalid_argument("causal call: one timestep per latent frame");
    if (first_frame < 0) throw std::invalid_argument("causal call: a negative first frame");
    if (!text.defined() || text.dim() != 3 || text.size(2) != cfg_.text_dim)
      throw std::invalid_argument("causal call: text must be prompt embeddings [1, L, " +
                                  std::to_string(cfg_.text_dim) + "]");
    CachedCall call{&store, first_frame};
    const Tensor out = forward(x.to(device(), dtype()), timesteps.to(device(), torch::kFloat).reshape({1, t}),
                               text.to(device(), dtype()), nullptr, &call);
    return out.to(torch::kFloat);
  }

 protected:
  Tensor run(const Tensor& x, const Tensor& timesteps, const Tensor& text) const override {
    return forward(x, timesteps, text, nullptr, nullptr);
  }
  Tensor run_sequence_parallel(const Tensor& x, const Tensor& timesteps, const Tensor& text,
                               parallel::Communicator& group) const override {
    return forward(x, timesteps, text, &group, nullptr);
  }

 private:
  // `cached`: a causal call (CausalModel::predict_cached), which runs on one rank.
  Tensor forward(const Tensor& x, const Tensor& timesteps, const Tensor& text, parallel::Communicator* group,
                 const CachedCall* cached) const {
    const int64_t t = x.size(2), hp = x.size(3) / cfg_.ph, wp = x.size(4) / cfg_.pw, d = cfg_.dim();
    const int64_t tokens = hp * wp, seq = t * tokens;
    if (x.size(3) % cfg_.ph || x.size(4) % cfg_.pw)
      throw std::invalid_argument("denoiser input latents: height and width must be multiples of the patch");
    if (cached && group) throw std::invalid_argument("a causal call runs on one rank");
    if (t > cfg_.rope_max_seq_len || hp > cfg_.rope_max_seq_len || wp > cfg_.rope_max_seq_len)
      throw std::invalid_argument("denoiser input latents: more than rope_max_seq_len = " +
                                  std::to_string(cfg_.rope_max_seq_len) + " positions along an axis");
    const auto dt = dtype();
    auto [cos, sin] = rope(t, hp, wp, cached ? cached->first_frame : 0);

    Tensor h = torch::conv3d(x, patch_w_, patch_b_, {cfg_.pt, cfg_.ph, cfg_.pw});
    h = h.flatten(2).transpose(1, 2).contiguous();  // [1, seq, D]

    // Time: float32 sinusoid and embedder; the projection in the compute dtype. One row per frame.
    const Tensor args = cached ? timesteps.reshape({t, 1}).to(torch::kDouble) * freqs64_.unsqueeze(0)
                               : timesteps.reshape({t, 1}).to(torch::kFloat) * freqs_.unsqueeze(0);
    const Tensor sinusoid = torch::cat({torch::cos(args), torch::sin(args)}, 1).to(torch::kFloat);
    Tensor temb = time_2_(torch::silu(time_1_(sinusoid))).to(dt);                    // [T, D]
    Tensor tproj = time_proj_(torch::silu(temb)).view({t, 6, d}).to(torch::kFloat);  // [T, 6, D]
    const std::shared_ptr<const TextKeys> keys = text_keys(text);

    // h is viewed as [frames, tokens, D] so that each frame's modulation broadcasts over its tokens. A rank of a
    // group keeps a slice of the tokens that may start and end mid-frame: it views its rows as [chunk, 1, D] and
    // takes each row's own frame's modulation, the same values.
    int64_t frames = t, per_frame = tokens;
    std::optional<TokenSlice> slice;
    if (group) {
      slice.emplace(*group, seq, x.device());
      h = slice->take(h);
      cos = cos.index_select(0, slice->index());
      sin = sin.index_select(0, slice->index());
      const Tensor frame = torch::floor_divide(slice->index(), tokens);
      temb = temb.index_select(0, frame);
      tproj = tproj.index_select(0, frame);
      frames = slice->chunk(), per_frame = 1;
    }
    const int64_t rows = frames * per_frame;

    const auto ln = [&](const Tensor& v, const Tensor& w, const Tensor& b) {
      return torch::layer_norm(v.to(torch::kFloat), {d}, w, b, cfg_.eps);
    };
    for (const Block& b : blocks_) {
      // One rank of a group cannot leave alone: the others would wait for it in this layer's exchange.
      if (!group) LayerInterrupt::check();
      const Tensor mod = b.scale_shift + tproj;                       // [T, 6, D] float32
      const auto m = [&](int64_t i) { return mod.narrow(1, i, 1); };  // [T, 1, D], broadcast over a frame's tokens
      Tensor hf = h.view({frames, per_frame, d}).to(torch::kFloat);
      Tensor n = (ln(hf, {}, {}) * (1 + m(1)) + m(0)).to(dt).view({1, rows, d});
      const size_t i = size_t(&b - blocks_.data());
      Tensor a = cached ? cached_self_attention(b.self_attn, n, cos, sin, *cached, i, tokens)
                        : self_attention(b.self_attn, n, cos, sin, slice ? &*slice : nullptr);
      h = (hf + a.view({frames, per_frame, d}) * m(2)).to(dt).view({1, rows, d});

      n = cfg_.cross_attn_norm ? ln(h, b.norm2_w, b.norm2_b).to(dt) : h;
      h = h + attention(b.cross_attn, n, keys->k[i], keys->v[i], nullptr, nullptr);

      hf = h.view({frames, per_frame, d}).to(torch::kFloat);
      n = (ln(hf, {}, {}) * (1 + m(4)) + m(3)).to(dt).view({1, rows, d});
      const Tensor ff = b.ffn_out(torch::gelu(b.ffn_in(n), "tanh"));
      h = (hf + ff.view({frames, per_frame, d}).to(torch::kFloat) * m(5)).to(dt).view({1, rows, d});
    }

    const Tensor out_mod = scale_shift_out_ + temb.unsqueeze(1);  // [T, 2, D] float32
    Tensor hf = h.view({frames, per_frame, d}).to(torch::kFloat);
    h = (ln(hf, {}, {}) * (1 + out_mod.narrow(1, 1, 1)) + out_mod.narrow(1, 0, 1)).to(dt).view({1, rows, d});
    h = proj_out_(h);
    if (slice) h = slice->gather_tokens(h);
    const int64_t c = cfg_.out_channels;
    return h.reshape({1, t, hp, wp, cfg_.pt, cfg_.ph, cfg_.pw, c})
        .permute({0, 7, 1, 4, 2, 5, 3, 6})
        .reshape({1, c, t * cfg_.pt, hp * cfg_.ph, wp * cfg_.pw});
  }

  // cos and sin of every token's angles, [seq, 1, head_dim / 2]: frame, row and column parts side by side, the
  // frames at positions first .. first + t - 1.
  std::pair<Tensor, Tensor> rope(int64_t t, int64_t hp, int64_t wp, int64_t first = 0) const {
    // A stream runs past the table (rope_max_seq_len frames, ~4 minutes of 16 fps video): its frame angles are
    // made from the same float64 formula, so a position has one rotation whatever the table's length. Attention
    // sees only differences of positions within the cached window, which stay as small as in training.
    Tensor frame_cos = rope_cos_[0], frame_sin = rope_sin_[0];
    if (first + t > frame_cos.size(0)) {
      const auto f64 = torch::TensorOptions().dtype(torch::kDouble);
      const Tensor ang = torch::outer(torch::arange(first, first + t, f64), rope_inv_[0]);
      frame_cos = ang.cos().to(torch::kFloat).to(frame_cos.device());
      frame_sin = ang.sin().to(torch::kFloat).to(frame_sin.device());
      first = 0;
    }
    const auto grid = [&](const Tensor& frame, const std::vector<Tensor>& parts) {
      const Tensor f = frame.narrow(0, first, t).view({t, 1, 1, -1}).expand({t, hp, wp, -1});
      const Tensor r = parts[1].narrow(0, 0, hp).view({1, hp, 1, -1}).expand({t, hp, wp, -1});
      const Tensor c = parts[2].narrow(0, 0, wp).view({1, 1, wp, -1}).expand({t, hp, wp, -1});
      return torch::cat({f, r, c}, -1).reshape({t * hp * wp, 1, -1});
    };
    return {grid(frame_cos, rope_cos_), grid(frame_sin, rope_sin_)};
  }

  // Every block's cross-attention keys and values of one prompt, [1, L, heads, head_dim] each. They depend on the
  // text alone, so a clip's steps and its two guidance branches would otherwise recompute the text embedder and
  // two linear maps of all 512 tokens per block on every call.
  struct TextKeys {
    // The prompt's key: the embeddings tensor they were made from (held, so its address is never another's) and its
    // version counter then. The same tensor at the same version holds the same values, which the lookup tells
    // from the host alone; comparing the values on the device would wait for the device at every call. An
    // inference tensor has no version counter: a copy of it is kept instead, found by value only.
    Tensor text;
    std::optional<uint32_t> version;
    std::vector<Tensor> k, v;
    bool same_tensor(const Tensor& t) const {
      return version && !t.is_inference() && text.unsafeGetTensorImpl() == t.unsafeGetTensorImpl() &&
             t._version() == *version;
    }
    // Whether `text` still holds the values the keys were made from.
    bool unchanged() const { return !version || text._version() == *version; }
  };

  static void key_by(TextKeys& e, const Tensor& text) {
    if (text.is_inference()) {
      e.text = text.clone();
      e.version.reset();
    } else {
      e.text = text;
      e.version = text._version();
    }
  }

  // Keys by tensor first: the generator passes the same embeddings tensor at every call, so its lookups never read
  // the values. Another tensor (a caller that copies its embeddings for every call, or changed them in place) is
  // compared by value, once: an equal entry is then kept under the new tensor. Writes that bypass the version
  // counter (through a raw pointer) are not seen; in-place tensor operations are.
  std::shared_ptr<const TextKeys> text_keys(const Tensor& text) const {
    const auto equal_values = [&](const TextKeys& e) {
      return e.text.sizes() == text.sizes() && e.text.scalar_type() == text.scalar_type() &&
             e.text.device() == text.device() && torch::equal(e.text, text);
    };
    const auto to_front = [&](auto it, std::shared_ptr<const TextKeys> entry) {
      text_keys_.erase(it);
      text_keys_.push_front(entry);
      return entry;
    };
    std::unique_lock<std::mutex> lock(text_keys_mutex_);
    for (auto it = text_keys_.begin(); it != text_keys_.end(); ++it)
      if ((*it)->same_tensor(text)) return to_front(it, *it);
    // An entry whose own tensor changed since holds other values than its keys were made from: never compared.
    for (auto it = text_keys_.begin(); it != text_keys_.end(); ++it)
      if ((*it)->unchanged() && equal_values(**it)) {
        auto rekeyed = std::make_shared<TextKeys>(**it);
        key_by(*rekeyed, text);
        return to_front(it, std::move(rekeyed));
      }
    lock.unlock();
    auto e = std::make_shared<TextKeys>();
    key_by(*e, text);
    const Tensor ctx = text_2_(torch::gelu(text_1_(text), "tanh"));  // [1, L, D]
    for (const Block& b : blocks_) {
      const Attention& a = b.cross_attn;
      e->k.push_back(torch::rms_norm(a.k(ctx), {cfg_.dim()}, a.norm_k, cfg_.eps).unflatten(2, {cfg_.heads, -1}));
      e->v.push_back(a.v(ctx).unflatten(2, {cfg_.heads, -1}));
    }
    lock.lock();
    text_keys_.push_front(e);
    if (text_keys_.size() > kCachedPrompts) text_keys_.pop_back();
    return e;
  }

  static Tensor rotate(const Tensor& y, const Tensor& cos, const Tensor& sin) {
    const Tensor pairs = y.unflatten(-1, {-1, 2});
    const Tensor x1 = pairs.select(-1, 0), x2 = pairs.select(-1, 1);
    return torch::stack({x1 * cos - x2 * sin, x1 * sin + x2 * cos}, -1).flatten(-2).to(y.scalar_type());
  }

  // x [1, S, D] queries from; k, v [1, L, heads, head_dim]; RoPE on queries and keys where cos is given.
  Tensor attention(const Attention& a, const Tensor& x, Tensor k, const Tensor& v, const Tensor* cos,
                   const Tensor* sin) const {
    const int64_t heads = cfg_.heads, d = cfg_.dim();
    Tensor q = torch::rms_norm(a.q(x), {d}, a.norm_q, cfg_.eps).unflatten(2, {heads, -1});
    if (cos) {
      q = rotate(q, *cos, *sin);
      k = rotate(k, *cos, *sin);
    }
    Tensor o = at::scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2));
    return a.out(o.transpose(1, 2).flatten(2).to(x.scalar_type()));
  }
  // With a slice, x is this rank's rows. The q and k norms run over all heads of a token, which every rank has
  // before the all-to-all, so they need no communication; RoPE takes the rows' own positions (in cos and sin).
  Tensor self_attention(const Attention& a, const Tensor& x, const Tensor& cos, const Tensor& sin,
                        const TokenSlice* slice) const {
    const int64_t heads = cfg_.heads, d = cfg_.dim();
    Tensor k = torch::rms_norm(a.k(x), {d}, a.norm_k, cfg_.eps).unflatten(2, {heads, -1});
    if (!slice) return attention(a, x, k, a.v(x).unflatten(2, {heads, -1}), &cos, &sin);
    const Tensor q = rotate(torch::rms_norm(a.q(x), {d}, a.norm_q, cfg_.eps).unflatten(2, {heads, -1}), cos, sin);
    k = rotate(k, cos, sin);
    // [3, seq, heads / ranks, head_dim] -> [3, heads / ranks, seq, head_dim]
    const Tensor qkv = slice->to_heads(torch::cat({q, k, a.v(x).unflatten(2, {heads, -1})}, 0)).transpose(1, 2);
    const Tensor o = at::scaled_dot_product_attention(qkv.narrow(0, 0, 1), qkv.narrow(0, 1, 1), qkv.narrow(0, 2, 1));
    return a.out(slice->to_tokens(o.transpose(1, 2)).flatten(2).to(x.scalar_type()));
  }

  // Self-attention of a causal call: its queries see what its store gives for its own keys and values.
  Tensor cached_self_attention(const Attention& a, const Tensor& x, const Tensor& cos, const Tensor& sin,
                               const CachedCall& call, size_t layer, int64_t tokens_per_frame) const {
    const int64_t heads = cfg_.heads, d = cfg_.dim();
    const Tensor q = rotate(torch::rms_norm(a.q(x), {d}, a.norm_q, cfg_.eps).unflatten(2, {heads, -1}), cos, sin);
    const Tensor k = rotate(torch::rms_norm(a.k(x), {d}, a.norm_k, cfg_.eps).unflatten(2, {heads, -1}), cos, sin);
    const auto [ks, vs] = call.store->attend(layer, k, a.v(x).unflatten(2, {heads, -1}), tokens_per_frame);
    const Tensor o = at::scaled_dot_product_attention(q.transpose(1, 2), ks.transpose(1, 2), vs.transpose(1, 2));
    return a.out(o.transpose(1, 2).flatten(2).to(x.scalar_type()));
  }

  WanConfig cfg_;
  Tensor patch_w_, patch_b_;
  Linear time_1_, time_2_, time_proj_, text_1_, text_2_, proj_out_;
  std::vector<Block> blocks_;
  Tensor scale_shift_out_;
  std::vector<Tensor> rope_cos_, rope_sin_;  // frame, row, column: [rope_max_seq_len, part / 2] float32
  std::vector<Tensor> rope_inv_;             // their inverse frequencies, float64 on the CPU
  Tensor freqs_, freqs64_;
  // Two prompts: one guided stream's prompt and negative prompt. More would hold layers x 2 x L x dim values each
  // (a Wan 14B prompt: 420 MB in bf16) for streams that seldom share a model.
  static constexpr size_t kCachedPrompts = 2;
  mutable std::mutex text_keys_mutex_;
  mutable std::deque<std::shared_ptr<const TextKeys>> text_keys_;  // most recently used first
};

}  // namespace

namespace {

// The latent space of the folder's VAE; without a vae/ folder, the one the channels name (16: Wan 2.1's VAE, 48:
// Wan 2.2's), as a transformer folder given alone with prompt-embeds has no other clue.
LatentSpace wan_latent_space(const DiffusersFolder& folder, const WanConfig& cfg) {
  if (folder.latent_space) {
    const LatentSpace& ls = *folder.latent_space;
    if (ls.id == "cogvideox")
      throw ModelError(folder.vae.string() + ": a CogVideoX VAE in a Wan pipeline; its latents are not Wan's");
    if (ls.channels != cfg.in_channels)
      throw ModelError(folder.config_file.string() + ": the transformer takes " + std::to_string(cfg.in_channels) +
                       " latent channels and the folder's VAE (" + folder.vae.string() + ") makes " +
                       std::to_string(ls.channels));
    return ls;
  }
  if (cfg.in_channels == 48) return {"wan2.2", 48, 16, 4};
  return {"wan2.1", cfg.in_channels, 8, 4};
}

// The network's parameters from its config (the embeddings, blocks and head), for what the device must hold.
int64_t parameter_count(const WanConfig& c) {
  const int64_t d = c.dim(), patch = c.in_channels * c.pt * c.ph * c.pw;
  const int64_t block = 8 * d * d + 8 * d + 2 * d * c.ffn_dim + c.ffn_dim + d + 12 * d;
  const int64_t embed = (c.text_dim + 1) * d + (d + 1) * d + (c.freq_dim + 1) * d + (d + 1) * d + (d + 1) * 6 * d +
                        (patch + 1) * d + (d + 1) * c.out_channels * c.pt * c.ph * c.pw + 2 * d;
  return c.layers * block + embed;
}

std::shared_ptr<WanTransformer> load_network(const fs::path& dir, const WanConfig& cfg, const DenoiserSpec& spec,
                                             const WeightEdits& edits, const LoadOptions& opt) {
  WeightSource src = wan_transformer_weights(dir, edits);
  auto model = std::make_shared<WanTransformer>(cfg, spec, src, opt);
  settle_residency(src);
  return model;
}

}  // namespace

std::shared_ptr<Denoiser> load_wan_transformer(const DiffusersFolder& folder, const LoadOptions& opt,
                                               const DenoiserFiles& files) {
  if (!folder.pipeline_class.empty() && folder.pipeline_class.rfind("Wan", 0) != 0)
    throw ModelError(folder.transformer.parent_path().string() + ": pipeline \"" + folder.pipeline_class +
                     "\" with a Wan transformer");
  const WanConfig cfg = parse_config(folder.config, folder.config_file.string());
  const LatentSpace latents = wan_latent_space(folder, cfg);

  DenoiserSpec spec;
  spec.backend = latents.id == "wan2.2" || !folder.transformer_2.empty() ? "wan2.2" : "wan2.1";
  spec.prediction = Prediction::flow;
  spec.latent_space = latents.id;
  spec.channels = cfg.in_channels;
  spec.temporal_factor = latents.temporal_factor;
  spec.spatial_factor = latents.spatial_factor;
  spec.min_frames = 1;
  spec.window = std::min(kMaxWindow, cfg.rope_max_seq_len);
  spec.native_frames = std::min<int64_t>(kTrainedFrames, spec.window);
  spec.size_multiple = std::lcm(cfg.ph, cfg.pw);
  spec.text_tokens = kTextTokens;
  spec.text_dim = cfg.text_dim;
  spec.sampler = parse_scheduler(folder.scheduler);
  spec.guidance = 5.0;  // WanPipeline's guidance_scale
  spec.image_condition = folder.expand_timesteps;
  // WanPipeline's 480x832 video, in latents of the folder's VAE (whose patch the size must also divide).
  spec.native_height = 480 / latents.spatial_factor / spec.size_multiple * spec.size_multiple;
  spec.native_width = 832 / latents.spatial_factor / spec.size_multiple * spec.size_multiple;

  if (folder.transformer_2.empty()) {
    if (!files.second.empty())
      throw ModelError(folder.transformer.parent_path().string() +
                       ": weights or LoRAs for a second expert, and the folder has one transformer");
    return load_network(folder.transformer, cfg, spec, files.first, opt);
  }
  // Two experts (Wan 2.2 A14B): the second shares the first's interface, so one spec describes both.
  const fs::path config_2 = folder.transformer_2 / "config.json";
  const WanConfig cfg_2 = parse_config(read_json_object(config_2), config_2.string());
  if (cfg_2.in_channels != cfg.in_channels || cfg_2.text_dim != cfg.text_dim || cfg_2.ph != cfg.ph ||
      cfg_2.pw != cfg.pw || cfg_2.heads != cfg.heads || cfg_2.rope_max_seq_len != cfg.rope_max_seq_len)
    throw ModelError(config_2.string() + ": the second expert's channels, text width, patch, heads or positions " +
                     "differ from transformer/config.json's");
  spec.expert_boundary = folder.boundary_ratio * double(spec.sampler.train_timesteps);
  spec.per_frame_timesteps = false;
  ExpertLoader high = [=] { return load_network(folder.transformer, cfg, spec, files.first, opt); };
  ExpertLoader low = [=] { return load_network(folder.transformer_2, cfg_2, spec, files.second, opt); };
  const size_t bytes = size_t(parameter_count(cfg_2)) * torch::elementSize(opt.dtype);
  return make_wan_experts(std::move(high), std::move(low), spec, opt, keep_both_experts(opt.device, bytes));
}

}  // namespace latent
