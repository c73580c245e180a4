// CogVideoX's denoiser, diffusers' CogVideoXTransformer3DModel (CogVideoX 2B and 5B, version 1.0), run natively
// from a diffusers folder. The arithmetic follows diffusers 0.42 op for op, in the same dtypes (every module in
// the compute dtype, as diffusers keeps none in float32; the positional tables in float64 or float32 as diffusers
// builds them), so tests/core/gen/test_cogvideox_transformer.cpp can hold it to diffusers within float rounding.
//
// Text and video tokens run as one sequence (text first) through full attention. The 2B model adds fixed 3-D
// sin-cos positions to the video tokens, rebuilt for a size other than the one in its config as diffusers does;
// the 5B model instead rotates queries and keys with the 3-D RoPE that CogVideoXPipeline computes (its positions
// stretched over the crop of a 720x480 grid the latent size fits in), which is reproduced here so the model alone
// gives what the pipeline's loop gives. The model takes a single timestep per call.
#include <torch/types.h>

#include <cmath>
#include <list>
#include <mutex>
#include <optional>
#include <sstream>
#include <tuple>

#include "gen/models/backends.h"
#include "gen/models/diffusers_folder.h"
#include "gen/models/sequence_parallel.h"
#include "io/weight_files.h"
#include "memory/residency.h"

namespace latent {
namespace {

namespace fs = std::filesystem;
using torch::Tensor;

// Bounds far above the published configs (2B: 30 heads of 64, 30 layers; 5B: 48 heads, 42 layers), low enough
// that no product of them overflows before the tensor shapes are checked against the files.
constexpr int64_t kMaxDim = 1 << 16;
constexpr int64_t kMaxLayers = 256;
constexpr int64_t kMaxPatch = 16;
constexpr int64_t kMaxSide = 1 << 14;

struct CogConfig {
  int64_t heads = 30, head_dim = 64, in_channels = 16, time_embed_dim = 512, text_dim = 4096, layers = 30;
  int64_t sample_width = 90, sample_height = 60, sample_frames = 49, patch = 2, temporal_compression = 4;
  int64_t text_tokens = 226, freq_shift = 0;
  bool flip_sin_to_cos = true, attention_bias = true, affine = true, rope = false, patch_bias = true;
  double eps = 1e-5, spatial_scale = 1.875, temporal_scale = 1.0;
  int64_t dim() const { return heads * head_dim; }
  int64_t sample_latent_frames() const { return (sample_frames - 1) / temporal_compression + 1; }
};

CogConfig parse_config(const json::Value& v, const std::string& where) {
  ConfigReader r(v, where);
  CogConfig c;
  c.heads = r.integer("num_attention_heads", c.heads, 1, kMaxDim);
  c.head_dim = r.integer("attention_head_dim", c.head_dim, 1, kMaxDim);
  if (c.dim() > kMaxDim) r.fail("num_attention_heads", "times attention_head_dim is too large");
  c.in_channels = r.integer("in_channels", c.in_channels, 1, kMaxDim);
  if (r.integer("out_channels", c.in_channels, 1, kMaxDim) != c.in_channels)
    r.fail("out_channels", "differs from in_channels: not a denoiser of its own latents (image-to-video?)");
  c.flip_sin_to_cos = r.boolean("flip_sin_to_cos", c.flip_sin_to_cos);
  c.freq_shift = r.integer("freq_shift", c.freq_shift, -kMaxDim, kMaxDim);
  c.time_embed_dim = r.integer("time_embed_dim", c.time_embed_dim, 1, kMaxDim);
  // Only CogVideoX 1.5's image-to-video model has it, and the text-to-video pipeline passes no offset for it.
  r.unsupported("ofs_embed_dim", "the offset embedding (CogVideoX 1.5 image-to-video)");
  c.text_dim = r.integer("text_embed_dim", c.text_dim, 1, kMaxDim);
  c.layers = r.integer("num_layers", c.layers, 1, kMaxLayers);
  r.number("dropout", 0, 0, 1);  // training only
  c.attention_bias = r.boolean("attention_bias", c.attention_bias);
  c.sample_width = r.integer("sample_width", c.sample_width, 1, kMaxSide);
  c.sample_height = r.integer("sample_height", c.sample_height, 1, kMaxSide);
  c.sample_frames = r.integer("sample_frames", c.sample_frames, 1, kMaxSide);
  c.patch = r.integer("patch_size", c.patch, 1, kMaxPatch);
  r.unsupported("patch_size_t", "a temporal patch (CogVideoX 1.5)");
  c.temporal_compression = r.integer("temporal_compression_ratio", c.temporal_compression, 1, 64);
  c.text_tokens = r.integer("max_text_seq_length", c.text_tokens, 1, kMaxSide);
  const std::string act = r.string("activation_fn", "gelu-approximate");
  if (act != "gelu-approximate") r.fail("activation_fn", "= \"" + act + "\": only \"gelu-approximate\" is supported");
  const std::string tact = r.string("timestep_activation_fn", "silu");
  if (tact != "silu") r.fail("timestep_activation_fn", "= \"" + tact + "\": only \"silu\" is supported");
  c.affine = r.boolean("norm_elementwise_affine", c.affine);
  c.eps = r.number("norm_eps", c.eps, 0, 1);
  c.spatial_scale = r.number("spatial_interpolation_scale", c.spatial_scale, 1e-6, 1e6);
  c.temporal_scale = r.number("temporal_interpolation_scale", c.temporal_scale, 1e-6, 1e6);
  c.rope = r.boolean("use_rotary_positional_embeddings", c.rope);
  if (r.boolean("use_learned_positional_embeddings", false))
    r.fail("use_learned_positional_embeddings",
           "is true: learned positions (CogVideoX image-to-video) are not "
           "supported by the native backend");
  c.patch_bias = r.boolean("patch_bias", c.patch_bias);
  r.no_other_keys();
  if (c.dim() % 2 != 0) r.fail("attention_head_dim", "times num_attention_heads is odd: no sinusoidal time embedding");
  // The sin-cos table splits the width 1 : 3 between time and space, and space in two halves of sin and cos.
  if (!c.rope && c.dim() % 16 != 0)
    r.fail("attention_head_dim", "times num_attention_heads must be a multiple of 16 for the 3-D sin-cos positions");
  // RoPE splits a head 2 : 3 : 3 between frame, row and column, each in sin-cos pairs.
  if (c.rope && c.head_dim % 16 != 0)
    r.fail("attention_head_dim", "= " + std::to_string(c.head_dim) + " must be a multiple of 16 for the 3-D RoPE");
  return c;
}

// The sampler CogVideoXPipeline would use: scheduler/scheduler_config.json where the folder has one, else what
// the published folders ship (CogVideoX-2b's DDIM; the 5B's DPM with its snr_shift_scale where the model is
// 5B-like).
struct SchedulerChoice {
  SamplerOptions sampler;
  Prediction prediction = Prediction::v;
};

SchedulerChoice parse_scheduler(const fs::path& file, bool rope) {
  SchedulerChoice c;
  c.sampler.kind = rope ? SamplerKind::dpm : SamplerKind::ddim;
  c.sampler.steps = 50;  // CogVideoXPipeline's num_inference_steps
  c.sampler.snr_shift_scale = rope ? 1.0 : 3.0;
  c.sampler.train_timesteps = 1000;
  if (!fs::exists(file)) return c;
  const json::Value v = read_json_object(file);
  const std::string cls = class_name_of(v);
  ConfigReader r(v, file.string());
  if (cls != "CogVideoXDDIMScheduler" && cls != "CogVideoXDPMScheduler")
    throw ModelError(file.string() + ": scheduler \"" + cls +
                     "\" is not supported for CogVideoX (CogVideoXDDIMScheduler or CogVideoXDPMScheduler)");
  // The sampler's ddim and dpm fix what the published configs set; anything else would be a different schedule.
  const auto require = [&](const std::string& key, const std::string& want, const std::string& fallback) {
    const std::string got = r.string(key, fallback);
    if (got != want) r.fail(key, "= \"" + got + "\": only \"" + want + "\" is supported");
  };
  const auto require_bool = [&](const std::string& key, bool want, bool fallback) {
    if (r.boolean(key, fallback) != want) r.fail(key, std::string("must be ") + (want ? "true" : "false"));
  };
  const auto require_number = [&](const std::string& key, double want) {
    const double got = r.number(key, want, -1e9, 1e9);
    if (std::fabs(got - want) > 1e-12) r.fail(key, "must be " + std::to_string(want));
  };
  c.sampler.train_timesteps = r.integer("num_train_timesteps", 1000, 1, 100000);
  require_number("beta_start", 0.00085);
  require_number("beta_end", 0.012);
  require("beta_schedule", "scaled_linear", "scaled_linear");
  if (r.get("trained_betas")) r.fail("trained_betas", "is set: only the scaled-linear betas are supported");
  require_bool("set_alpha_to_one", true, true);
  require_bool("rescale_betas_zero_snr", true, false);
  require("timestep_spacing", "trailing", "leading");
  // Trailing spacing does not add steps_offset; the clip settings do not enter these schedulers' steps.
  for (const char* k : {"steps_offset", "clip_sample", "clip_sample_range", "sample_max_value"}) r.ignore(k);
  c.sampler.snr_shift_scale = r.number("snr_shift_scale", 3.0, 1e-6, 1e6);
  const std::string pred = r.string("prediction_type", "epsilon");
  if (pred == "v_prediction")
    c.prediction = Prediction::v;
  else if (pred == "epsilon")
    c.prediction = Prediction::epsilon;
  else
    r.fail("prediction_type", "= \"" + pred + "\": only \"v_prediction\" and \"epsilon\" are supported");
  // CogVideoXDPMScheduler (the 5B folders') has the same noise schedule and timesteps and its own stochastic
  // second-order step. The pipeline's eta reaches neither scheduler's update, so there is no setting for it.
  c.sampler.kind = cls == "CogVideoXDPMScheduler" ? SamplerKind::dpm : SamplerKind::ddim;
  r.no_other_keys();
  return c;
}

struct Linear {
  Tensor w, b;
  static Linear load(WeightReader& r, const std::string& p, int64_t in, int64_t out, bool bias = true) {
    Linear l;
    l.w = r.take(p + ".weight", {out, in});
    if (bias) l.b = r.take(p + ".bias", {out});
    return l;
  }
  Tensor operator()(const Tensor& x) const { return torch::linear(x, w, b); }
};

struct Norm {
  Tensor w, b;  // undefined without elementwise affine
  static Norm load(WeightReader& r, const std::string& p, int64_t dim, bool affine) {
    if (!affine) return {};
    return {r.take(p + ".weight", {dim}), r.take(p + ".bias", {dim})};
  }
};

struct Block {
  Linear norm1_mod, norm2_mod;  // CogVideoXLayerNormZero's projections of the time embedding to 6 rows
  Norm norm1, norm2;
  Linear q, k, v, out;
  Norm norm_q, norm_k;  // per head, always affine
  Linear ff_in, ff_out;
};

class CogVideoXTransformer : public Denoiser {
 public:
  CogVideoXTransformer(const CogConfig& cfg, DenoiserSpec spec, const WeightSource& src, const LoadOptions& opt)
      : Denoiser(std::move(spec), opt), cfg_(cfg) {
    const int64_t d = cfg.dim(), te = cfg.time_embed_dim, p = cfg.patch;
    WeightReader r(src, opt.device, opt.dtype);
    patch_w_ = r.take("patch_embed.proj.weight", {d, cfg.in_channels, p, p});
    if (cfg.patch_bias) patch_b_ = r.take("patch_embed.proj.bias", {d});
    text_proj_ = Linear::load(r, "patch_embed.text_proj", cfg.text_dim, d);
    time_1_ = Linear::load(r, "time_embedding.linear_1", d, te);
    time_2_ = Linear::load(r, "time_embedding.linear_2", te, te);
    for (int64_t i = 0; i < cfg.layers; ++i) {
      const std::string b = "transformer_blocks." + std::to_string(i);
      Block k;
      k.norm1_mod = Linear::load(r, b + ".norm1.linear", te, 6 * d);
      k.norm1 = Norm::load(r, b + ".norm1.norm", d, cfg.affine);
      k.q = Linear::load(r, b + ".attn1.to_q", d, d, cfg.attention_bias);
      k.k = Linear::load(r, b + ".attn1.to_k", d, d, cfg.attention_bias);
      k.v = Linear::load(r, b + ".attn1.to_v", d, d, cfg.attention_bias);
      k.out = Linear::load(r, b + ".attn1.to_out.0", d, d);
      k.norm_q = Norm::load(r, b + ".attn1.norm_q", cfg.head_dim, true);
      k.norm_k = Norm::load(r, b + ".attn1.norm_k", cfg.head_dim, true);
      k.norm2_mod = Linear::load(r, b + ".norm2.linear", te, 6 * d);
      k.norm2 = Norm::load(r, b + ".norm2.norm", d, cfg.affine);
      k.ff_in = Linear::load(r, b + ".ff.net.0.proj", d, 4 * d);
      k.ff_out = Linear::load(r, b + ".ff.net.2", 4 * d, d);
      blocks_.push_back(std::move(k));
    }
    norm_final_ = Norm::load(r, "norm_final", d, cfg.affine);
    out_mod_ = Linear::load(r, "norm_out.linear", te, 2 * d);
    norm_out_ = Norm::load(r, "norm_out.norm", d, cfg.affine);
    proj_out_ = Linear::load(r, "proj_out", d, p * p * cfg.in_channels);
    r.finish();
    // diffusers builds the table of the configured size once (its pos_embedding buffer) and others per call.
    if (!cfg.rope)
      sample_positions_ = sincos_positions(cfg.sample_latent_frames(), cfg.sample_height / p, cfg.sample_width / p,
                                           opt.device, opt.dtype);
  }

  int64_t attention_heads() const override { return cfg_.heads; }

  // Latent frames, patch rows and columns, device, dtype.
  using TableKey = std::tuple<int64_t, int64_t, int64_t, c10::DeviceType, c10::DeviceIndex, torch::ScalarType>;
  // The position tables kept for `key` (see position_tables()), nothing where none are.
  std::optional<std::vector<Tensor>> cached_tables(const TableKey& key) const {
    std::lock_guard<std::mutex> lock(tables_mutex_);
    for (auto it = tables_.begin(); it != tables_.end(); ++it)
      if (it->first == key) {
        if (it != tables_.begin()) tables_.splice(tables_.begin(), tables_, it);
        return tables_.front().second;
      }
    return std::nullopt;
  }

 protected:
  Tensor run(const Tensor& x, const Tensor& timesteps, const Tensor& text) const override {
    return forward(x, timesteps, text, nullptr);
  }
  Tensor run_sequence_parallel(const Tensor& x, const Tensor& timesteps, const Tensor& text,
                               parallel::Communicator& group) const override {
    return forward(x, timesteps, text, &group);
  }

 private:
  // The text tokens are few and join every video token in attention: each rank keeps all of them, and splits
  // only the video tokens (see attention()).
  Tensor forward(const Tensor& x, const Tensor& timesteps, const Tensor& text, parallel::Communicator* group) const {
    const int64_t p = cfg_.patch, c = cfg_.in_channels, d = cfg_.dim();
    const int64_t frames = x.size(2), height = x.size(3), width = x.size(4);
    if (height % p != 0 || width % p != 0)
      throw std::invalid_argument("denoiser input latents: height " + std::to_string(height) + " and width " +
                                  std::to_string(width) + " must be multiples of the patch size " + std::to_string(p));
    const int64_t hp = height / p, wp = width / p, tokens = frames * hp * wp, text_len = text.size(1);
    const auto dt = dtype();

    // Time: Timesteps' float32 sinusoid, then the embedding in the compute dtype. One row: the clip's timestep.
    const int64_t half = d / 2;
    Tensor exponent =
        torch::arange(0, half, torch::TensorOptions().dtype(torch::kFloat).device(x.device())) * (-std::log(10000.0));
    exponent = exponent / (half - cfg_.freq_shift);
    const Tensor args = timesteps.select(1, 0).reshape({1, 1}).to(torch::kFloat) * torch::exp(exponent).unsqueeze(0);
    Tensor sinusoid = torch::cat({torch::sin(args), torch::cos(args)}, -1);
    if (cfg_.flip_sin_to_cos) sinusoid = torch::cat({sinusoid.narrow(1, half, half), sinusoid.narrow(1, 0, half)}, -1);
    const Tensor temb = time_2_(torch::silu(time_1_(sinusoid.to(dt))));  // [1, te]

    // Patches: each latent frame through the 2-D convolution, tokens frame by frame in row-major order.
    const Tensor frames_first = x.permute({0, 2, 1, 3, 4}).reshape({frames, c, height, width});
    Tensor video = torch::conv2d(frames_first, patch_w_, patch_b_, p);
    video = video.view({1, frames, d, hp * wp}).transpose(2, 3).flatten(1, 2);
    Tensor seq = torch::cat({text_proj_(text), video}, 1).contiguous();
    Tensor enc = seq.narrow(1, 0, text_len), h = seq.narrow(1, text_len, tokens);
    std::optional<TokenSlice> slice;
    if (group) slice.emplace(*group, tokens, x.device());
    if (!cfg_.rope) {
      const bool sample_size = frames == cfg_.sample_latent_frames() &&
                               (frames - 1) * cfg_.temporal_compression + 1 == cfg_.sample_frames &&
                               height == cfg_.sample_height && width == cfg_.sample_width;
      const Tensor positions = sample_size ? sample_positions_ : position_tables(frames, hp, wp, x.device(), dt)[0];
      h = slice ? slice->take(h + positions) : h + positions;
    } else if (slice) {
      h = slice->take(h);
    }
    Tensor cos, sin;
    if (cfg_.rope) {
      const std::vector<Tensor> rope = position_tables(frames, hp, wp, x.device(), dt);
      cos = rope[0], sin = rope[1];
    }
    if (slice && cos.defined()) cos = cos.index_select(0, slice->index()), sin = sin.index_select(0, slice->index());
    const int64_t rows = slice ? slice->chunk() : tokens;  // this rank's video rows

    const auto ln = [&](const Tensor& v, const Norm& n) { return torch::layer_norm(v, {d}, n.w, n.b, cfg_.eps); };
    const auto modulated = [&](const Tensor& v, const Norm& n, const Tensor& shift, const Tensor& scale) {
      return ln(v, n) * (1 + scale).unsqueeze(1) + shift.unsqueeze(1);
    };
    for (const Block& b : blocks_) {
      std::vector<Tensor> m = b.norm1_mod(torch::silu(temb)).chunk(6, 1);
      Tensor nh = modulated(h, b.norm1, m[0], m[1]), ne = modulated(enc, b.norm1, m[3], m[4]);
      const Tensor a = attention(b, torch::cat({ne, nh}, 1), text_len, cos, sin, slice ? &*slice : nullptr);
      h = h + m[2].unsqueeze(1) * a.narrow(1, text_len, rows);
      enc = enc + m[5].unsqueeze(1) * a.narrow(1, 0, text_len);

      m = b.norm2_mod(torch::silu(temb)).chunk(6, 1);
      nh = modulated(h, b.norm2, m[0], m[1]);
      ne = modulated(enc, b.norm2, m[3], m[4]);
      const Tensor ff = b.ff_out(torch::gelu(b.ff_in(torch::cat({ne, nh}, 1)), "tanh"));
      h = h + m[2].unsqueeze(1) * ff.narrow(1, text_len, rows);
      enc = enc + m[5].unsqueeze(1) * ff.narrow(1, 0, text_len);
    }
    h = ln(h, norm_final_);
    const std::vector<Tensor> m = out_mod_(torch::silu(temb)).chunk(2, 1);  // shift first, as AdaLayerNorm's dim 1
    h = modulated(h, norm_out_, m[0], m[1]);
    h = proj_out_(h);
    if (slice) h = slice->gather_tokens(h);
    return h.reshape({1, frames, hp, wp, c, p, p})
        .permute({0, 1, 4, 2, 5, 3, 6})
        .reshape({1, frames, c, height, width})
        .permute({0, 2, 1, 3, 4});
  }

  // The position tables of a latent size: the sin-cos positions [tokens, D] in the compute dtype, or RoPE's cos and
  // sin [tokens, head_dim] in float32, on `device`. They depend on the size alone but are made on the host in
  // float64 and copied over, which at every call would stall the device's queue behind the host: each size's are
  // made once and kept. Every stream of a shared model looks them up, hence the lock; a size made twice at once
  // keeps the first.
  std::vector<Tensor> position_tables(int64_t frames, int64_t hp, int64_t wp, torch::Device device,
                                      torch::ScalarType dtype) const {
    const TableKey key{frames, hp, wp, device.type(), device.index(), dtype};
    if (std::optional<std::vector<Tensor>> kept = cached_tables(key)) return *kept;
    std::vector<Tensor> made;
    if (cfg_.rope) {
      auto [cos, sin] = pipeline_rope(frames, hp, wp, device);
      made = {std::move(cos), std::move(sin)};
    } else {
      made = {sincos_positions(frames, hp, wp, device, dtype)};
    }
    std::lock_guard<std::mutex> lock(tables_mutex_);
    for (const auto& [k, t] : tables_)
      if (k == key) return t;
    tables_.emplace_front(key, made);
    if (tables_.size() > kCachedSizes) tables_.pop_back();
    return made;
  }

  // get_3d_sincos_pos_embed: [frames * hp * wp, D], a frame part (D/4) and a spatial part (3D/4, column then row
  // halves), each sin then cos of float32 positions over float64 frequencies. diffusers rounds the float64 table
  // to the compute dtype when adding it; the parts are rounded before they are spread over the tokens here, which
  // gives the same values without a float64 table of every token.
  Tensor sincos_positions(int64_t frames, int64_t hp, int64_t wp, torch::Device device, torch::ScalarType dtype) const {
    const int64_t d = cfg_.dim();
    const auto f32 = torch::TensorOptions().dtype(torch::kFloat);
    const auto table = [](int64_t dim, const Tensor& pos) {
      Tensor omega = torch::arange(dim / 2, torch::TensorOptions().dtype(torch::kDouble));
      omega = omega / (dim / 2.0);
      omega = torch::pow(10000.0, omega).reciprocal();
      const Tensor out = torch::outer(pos.reshape(-1), omega);
      return torch::cat({torch::sin(out), torch::cos(out)}, 1);
    };
    const int64_t spatial = 3 * d / 4;
    const Tensor rows = torch::arange(hp, f32) / cfg_.spatial_scale;
    const Tensor cols = torch::arange(wp, f32) / cfg_.spatial_scale;
    const Tensor col_at = cols.view({1, wp}).expand({hp, wp}), row_at = rows.view({hp, 1}).expand({hp, wp});
    const Tensor space = torch::cat({table(spatial / 2, col_at), table(spatial / 2, row_at)}, 1).to(device, dtype);
    const Tensor time = table(d / 4, torch::arange(frames, f32) / cfg_.temporal_scale).to(device, dtype);
    return torch::cat({time.unsqueeze(1).expand({frames, hp * wp, d / 4}),
                       space.unsqueeze(0).expand({frames, hp * wp, spatial})},
                      -1)
        .reshape({frames * hp * wp, d});
  }

  // CogVideoXPipeline._prepare_rotary_positional_embeddings for CogVideoX 1.0: the grid spans the crop region
  // that the latent grid, resized to fit, takes in the configured sample grid; positions and tables in float32.
  std::pair<Tensor, Tensor> pipeline_rope(int64_t frames, int64_t hp, int64_t wp, torch::Device device) const {
    const int64_t base_w = cfg_.sample_width / cfg_.patch, base_h = cfg_.sample_height / cfg_.patch;
    // Python's round() rounds halves to even, as nearbyint does in the default rounding mode.
    const auto py_round = [](double v) { return static_cast<int64_t>(std::nearbyint(v)); };
    int64_t resize_h, resize_w;
    if (double(hp) / double(wp) > double(base_h) / double(base_w)) {
      resize_h = base_h;
      resize_w = py_round(double(base_h) / double(hp) * double(wp));
    } else {
      resize_w = base_w;
      resize_h = py_round(double(base_w) / double(wp) * double(hp));
    }
    const int64_t top = py_round((base_h - resize_h) / 2.0), left = py_round((base_w - resize_w) / 2.0);
    const int64_t bottom = top + resize_h, right = left + resize_w;
    const auto f32 = torch::TensorOptions().dtype(torch::kFloat);
    const Tensor grid_h = torch::linspace(double(top), double(bottom * (hp - 1)) / double(hp), hp, f32);
    const Tensor grid_w = torch::linspace(double(left), double(right * (wp - 1)) / double(wp), wp, f32);
    const Tensor grid_t = torch::linspace(0.0, double(frames * (frames - 1)) / double(frames), frames, f32);
    const int64_t hd = cfg_.head_dim, dim_t = hd / 4, dim_hw = hd / 8 * 3;
    const auto axis = [&](int64_t dim, const Tensor& pos) {
      const Tensor freqs = torch::pow(10000.0, torch::arange(0, dim, 2, f32) / dim).reciprocal();
      const Tensor ang = torch::outer(pos, freqs);
      return std::make_pair(ang.cos().repeat_interleave(2, 1), ang.sin().repeat_interleave(2, 1));
    };
    const auto [t_cos, t_sin] = axis(dim_t, grid_t);
    const auto [h_cos, h_sin] = axis(dim_hw, grid_h);
    const auto [w_cos, w_sin] = axis(dim_hw, grid_w);
    const auto combine = [&](const Tensor& t, const Tensor& h, const Tensor& w) {
      return torch::cat({t.view({frames, 1, 1, -1}).expand({frames, hp, wp, -1}),
                         h.view({1, hp, 1, -1}).expand({frames, hp, wp, -1}),
                         w.view({1, 1, wp, -1}).expand({frames, hp, wp, -1})},
                        -1)
          .view({frames * hp * wp, -1})
          .to(device);
    };
    return {combine(t_cos, h_cos, w_cos), combine(t_sin, h_sin, w_sin)};
  }

  // CogVideoXAttnProcessor2_0 on the joint sequence [1, S, D]: per-head LayerNorm of queries and keys, RoPE on
  // the video tokens (after the first text_len) where cos is defined. With a slice, x holds all the text tokens
  // and this rank's video rows, and so does the result.
  Tensor attention(const Block& b, const Tensor& x, int64_t text_len, const Tensor& cos, const Tensor& sin,
                   const TokenSlice* slice) const {
    const int64_t heads = cfg_.heads, hd = cfg_.head_dim;
    const auto split = [&](const Tensor& t) { return t.view({1, -1, heads, hd}).transpose(1, 2); };
    Tensor q = torch::layer_norm(split(b.q(x)), {hd}, b.norm_q.w, b.norm_q.b, 1e-6);
    Tensor k = torch::layer_norm(split(b.k(x)), {hd}, b.norm_k.w, b.norm_k.b, 1e-6);
    const Tensor v = split(b.v(x));
    if (cos.defined()) {
      const auto rotate = [&](const Tensor& t) {
        const Tensor video = t.narrow(2, text_len, t.size(2) - text_len);
        const Tensor pairs = video.reshape({1, heads, -1, hd / 2, 2});
        const Tensor rotated = torch::stack({-pairs.select(-1, 1), pairs.select(-1, 0)}, -1).flatten(3);
        const Tensor out = (video.to(torch::kFloat) * cos + rotated.to(torch::kFloat) * sin).to(t.scalar_type());
        return torch::cat({t.narrow(2, 0, text_len), out}, 2);
      };
      q = rotate(q);
      k = rotate(k);
    }
    if (slice) return b.out(sharded_attention(q, k, v, text_len, *slice).transpose(1, 2).reshape({1, -1, heads * hd}));
    const Tensor o = at::scaled_dot_product_attention(q, k, v);
    return b.out(o.transpose(1, 2).reshape({1, -1, heads * hd}));
  }

  // q, k, v [1, heads, text_len + chunk, hd]: every text token, this rank's video rows. Each rank attends with its
  // heads over the text and every real video token; the text rows' outputs of all heads are then gathered (each
  // rank needs them: it keeps every text token), the video rows' go back to the ranks that hold those rows.
  static Tensor sharded_attention(const Tensor& q, const Tensor& k, const Tensor& v, int64_t text_len,
                                  const TokenSlice& slice) {
    const auto text = [&](const Tensor& t) { return slice.my_heads(t.narrow(2, 0, text_len), 1); };
    const auto video = [&](const Tensor& t) { return t.narrow(2, text_len, t.size(2) - text_len).transpose(1, 2); };
    // [3, tokens, heads / ranks, hd] -> [3, heads / ranks, tokens, hd]
    const Tensor vq = slice.to_heads(torch::cat({video(q), video(k), video(v)}, 0)).transpose(1, 2);
    const auto joint = [&](const Tensor& t, int64_t i) { return torch::cat({text(t), vq.narrow(0, i, 1)}, 2); };
    const Tensor o = at::scaled_dot_product_attention(joint(q, 0), joint(k, 1), joint(v, 2));
    const Tensor o_text = slice.gather(o.narrow(2, 0, text_len), 1);  // [1, heads, text_len, hd]
    const Tensor o_video = slice.to_tokens(o.narrow(2, text_len, o.size(2) - text_len).transpose(1, 2));
    return torch::cat({o_text, o_video.transpose(1, 2)}, 2);
  }

  CogConfig cfg_;
  Tensor patch_w_, patch_b_;
  Linear text_proj_, time_1_, time_2_, out_mod_, proj_out_;
  std::vector<Block> blocks_;
  Norm norm_final_, norm_out_;
  Tensor sample_positions_;  // [sample tokens, D] in the compute dtype, sin-cos models only
  // A stream calls with one size (the clip schedule's); each entry is a table of the whole latent video (tens of
  // MB for a 2B clip in bfloat16), so only the most recent few sizes stay.
  static constexpr size_t kCachedSizes = 4;
  mutable std::mutex tables_mutex_;
  mutable std::list<std::pair<TableKey, std::vector<Tensor>>> tables_;  // most recently used first
};

}  // namespace

std::vector<torch::Tensor> cogvideox_cached_tables(const Denoiser& model, int64_t frames, int64_t height,
                                                   int64_t width) {
  const auto* cog = dynamic_cast<const CogVideoXTransformer*>(&model);
  if (!cog) return {};
  const int64_t p = model.spec().size_multiple;
  const CogVideoXTransformer::TableKey key{
      frames, height / p, width / p, model.device().type(), model.device().index(), model.dtype()};
  return cog->cached_tables(key).value_or(std::vector<torch::Tensor>{});
}

std::shared_ptr<Denoiser> load_cogvideox_transformer(const DiffusersFolder& folder, const LoadOptions& opt,
                                                     const DenoiserFiles& files) {
  if (!files.first.empty() || !files.second.empty())
    throw ModelError(folder.config_file.string() + ": transformer weights and LoRAs apply to Wan folders only");
  if (!folder.pipeline_class.empty() && folder.pipeline_class != "CogVideoXPipeline")
    throw ModelError(folder.transformer.parent_path().string() + ": pipeline \"" + folder.pipeline_class +
                     "\" is not supported: only CogVideoXPipeline (text to video) runs natively");
  const CogConfig cfg = parse_config(folder.config, folder.config_file.string());
  const SchedulerChoice scheduler = parse_scheduler(folder.scheduler, cfg.rope);

  DenoiserSpec spec;
  spec.backend = "cogvideox";
  spec.prediction = scheduler.prediction;
  spec.latent_space = "cogvideox";
  spec.channels = cfg.in_channels;
  spec.min_frames = 1;
  // The clip length it was trained at (13 latent frames, 49 video frames for the published models); diffusers
  // runs longer clips, but the model was not made for them.
  spec.window = cfg.sample_latent_frames();
  spec.size_multiple = cfg.patch;
  spec.text_tokens = cfg.text_tokens;
  spec.text_dim = cfg.text_dim;
  spec.sampler = scheduler.sampler;
  spec.guidance = 6.0;  // CogVideoXPipeline's guidance_scale
  spec.temporal_factor = cfg.temporal_compression;
  spec.spatial_factor = 8;
  spec.native_height = cfg.sample_height;
  spec.native_width = cfg.sample_width;
  spec.per_frame_timesteps = false;
  // CogVideoXPipeline draws its noise for latents [1, T, C, h, w].
  spec.noise_frames_first = true;

  WeightSource src = read_safetensors_folder(folder.transformer, "diffusion_pytorch_model");
  auto model = std::make_shared<CogVideoXTransformer>(cfg, std::move(spec), src, opt);
  settle_residency(src);
  return model;
}

}  // namespace latent
