// The CogVideoX VAE (diffusers AutoencoderKLCogVideoX; CogVideoX 2b, 5b, 1.5).
//
// GroupNorm takes its statistics over all frames of a chunk, so results depend on where chunks are cut. The
// engine therefore always cuts the reference's chunks: 1 + 8 frames, then 8, when encoding; 3 latents, then 2,
// when decoding. Convolutions carry their last two input frames across chunks, as in the reference.
#include <torch/types.h>

#include <cmath>

#include "io/json.h"
#include "latent/parallel/row_shard.h"
#include "nn/layers.h"
#include "vae/families.h"
#include "vae/slot_state.h"

namespace latent {
namespace {

using namespace layers;
using torch::Tensor;

struct CogConfig {
  std::vector<int64_t> channels = {128, 256, 256, 512};
  int64_t latent_channels = 16;
  int64_t layers_per_block = 3;
  int64_t groups = 32;
  double norm_eps = 1e-6;
  int64_t temporal_compression = 4;
  double scaling_factor = 1.15258426;
};

// The reference hard-codes this eps everywhere except the encoder's resnets, which use the config's norm_eps.
constexpr double kFixedEps = 1e-6;

struct GroupNorm {
  Tensor weight, bias;
  int64_t groups = 32;
  double eps = kFixedEps;
  static GroupNorm load(WeightReader& r, const std::string& p, int64_t c, int64_t groups, double eps) {
    return {r.take(p + ".weight", {c}), r.take(p + ".bias", {c}), groups, eps};
  }
  Tensor forward(const Tensor& x, const parallel::RowShard* shard) const {
    return shard ? banded(x, *shard) : torch::group_norm(x, groups, weight, bias, eps);
  }

 private:
  // A band's statistics are summed over the ranks, in float32 and in two passes (the mean, then the squared
  // deviations from it), as a one-pass sum of squares would lose the variance of a feature far from zero.
  Tensor banded(const Tensor& x, const parallel::RowShard& shard) const {
    const int64_t b = x.size(0), c = x.size(1);
    Tensor g = x.reshape({b, groups, -1}).to(torch::kFloat);
    Tensor n = torch::full({1}, double(g.size(2)), g.options());
    Tensor sums = torch::cat({g.sum(-1).reshape({-1}), n});
    shard.all_reduce(sums);
    const Tensor count = sums.slice(0, b * groups);
    Tensor mean = (sums.slice(0, 0, b * groups) / count).reshape({b, groups, 1});
    Tensor centred = g - mean;
    Tensor sq = centred.square().sum(-1).reshape({-1});
    shard.all_reduce(sq);
    Tensor rstd = torch::rsqrt(sq / count + eps).reshape({b, groups, 1});
    Tensor y = centred.mul_(rstd).reshape(x.sizes());
    auto per_channel = [&](const Tensor& v) { return v.to(torch::kFloat).reshape({1, c, 1, 1, 1}); };
    return y.mul_(per_channel(weight)).add_(per_channel(bias)).to(x.scalar_type());
  }
};

// Nearest resize of z to (T, H, W); with an odd T > 1 the first frame is resized on its own, so latent 0 maps
// to frame 0 only.
Tensor resize_like(const Tensor& z, const Tensor& f) {
  const int64_t t = f.size(2), h = f.size(3), w = f.size(4);
  if (t > 1 && t % 2 == 1) {
    Tensor first = torch::upsample_nearest3d(z.slice(2, 0, 1), std::vector<int64_t>{1, h, w});
    Tensor rest = torch::upsample_nearest3d(z.slice(2, 1), std::vector<int64_t>{t - 1, h, w});
    return torch::cat({first, rest}, 2);
  }
  return torch::upsample_nearest3d(z, std::vector<int64_t>{t, h, w});
}

// Decoder normalisation conditioned on the chunk's input latents.
struct SpatialNorm {
  GroupNorm norm;
  CausalConv3d conv_y, conv_b;
  static SpatialNorm load(WeightReader& r, const std::string& p, int64_t c, int64_t zc, int64_t groups,
                          SlotAllocator& slots) {
    return {GroupNorm::load(r, p + ".norm_layer", c, groups, kFixedEps),
            CausalConv3d::load(r, p + ".conv_y.conv", zc, c, {1, 1, 1}, TimePad::replicate_first, slots),
            CausalConv3d::load(r, p + ".conv_b.conv", zc, c, {1, 1, 1}, TimePad::replicate_first, slots)};
  }
  Tensor forward(const Tensor& f, const Tensor& zq, StateSlots& s) const {
    Tensor z = resize_like(zq, f);
    // In place on the fresh norm output: one full-size tensor instead of three.
    Tensor out = norm.forward(f, s.shard);
    out.mul_(conv_y.forward(z, s));
    return out.add_(conv_b.forward(z, s));
  }
};

struct ResBlock {
  std::variant<GroupNorm, SpatialNorm> norm1, norm2;
  CausalConv3d conv1, conv2;
  std::optional<Conv> shortcut;

  static ResBlock load(WeightReader& r, const std::string& p, int64_t cin, int64_t cout, const CogConfig& cfg,
                       bool spatial, SlotAllocator& slots) {
    ResBlock b;
    auto norm = [&](const std::string& name, int64_t c) -> std::variant<GroupNorm, SpatialNorm> {
      if (spatial) return SpatialNorm::load(r, p + "." + name, c, cfg.latent_channels, cfg.groups, slots);
      return GroupNorm::load(r, p + "." + name, c, cfg.groups, cfg.norm_eps);
    };
    b.norm1 = norm("norm1", cin);
    b.conv1 = CausalConv3d::load(r, p + ".conv1.conv", cin, cout, {3, 3, 3}, TimePad::replicate_first, slots);
    b.norm2 = norm("norm2", cout);
    b.conv2 = CausalConv3d::load(r, p + ".conv2.conv", cout, cout, {3, 3, 3}, TimePad::replicate_first, slots);
    if (cin != cout) b.shortcut = Conv::load(r, p + ".conv_shortcut", {cout, cin, 1, 1, 1});
    return b;
  }

  static Tensor apply(const std::variant<GroupNorm, SpatialNorm>& n, const Tensor& x, const Tensor& zq, StateSlots& s) {
    if (auto* g = std::get_if<GroupNorm>(&n)) return g->forward(x, s.shard);
    return std::get<SpatialNorm>(n).forward(x, zq, s);
  }

  Tensor forward(const Tensor& x, const Tensor& zq, StateSlots& s) const {
    Tensor h = conv1.forward(silu_owned(apply(norm1, x, zq, s)), s);
    h = conv2.forward(silu_owned(apply(norm2, h, zq, s)), s);
    return h.add_(shortcut ? conv1x1x1(x, *shortcut) : x);  // h is the conv's fresh output
  }
};

struct Downsample {
  Conv conv;
  bool compress_time = false;
  Tensor forward(const Tensor& x_in, const parallel::RowShard* shard) const {
    Tensor x = x_in;
    if (compress_time && x.size(2) > 1) {
      // Pairs of frames are averaged; an odd chunk keeps its first frame alone.
      if (x.size(2) % 2 == 1) {
        Tensor rest = x.slice(2, 1);
        x = torch::cat({x.slice(2, 0, 1), torch::avg_pool3d(rest, {2, 1, 1}, {2, 1, 1})}, 2);
      } else {
        x = torch::avg_pool3d(x, {2, 1, 1}, {2, 1, 1});
      }
    }
    return conv2d_down2x_per_frame(x, conv, shard);
  }
};

struct Upsample {
  Conv conv;
  bool compress_time = false;
  Tensor forward(const Tensor& x_in, const parallel::RowShard* shard) const {
    Tensor x = x_in;
    const int64_t t = x.size(2);
    if (compress_time && t > 1) {
      // Every frame is doubled in time, except the first of an odd chunk.
      x = t % 2 == 1 ? torch::cat({x.slice(2, 0, 1), x.slice(2, 1).repeat_interleave(2, 2)}, 2)
                     : x.repeat_interleave(2, 2);
    }
    return conv2d_per_frame(upsample2x_per_frame(x), conv, 1, 1, shard);
  }
};

class CogVae : public Vae {
 public:
  CogVae(const CogConfig& cfg, const WeightSource& src, const LoadOptions& opt) : Vae(make_spec(cfg, src), opt) {
    WeightReader r(src, opt.device, opt.dtype);
    load_encoder(r, cfg);
    load_decoder(r, cfg);
    r.finish();
  }

 protected:
  std::unique_ptr<VaeState> make_encoder_state() const override { return std::make_unique<SlotState>(enc_slots_); }
  std::unique_ptr<VaeState> make_decoder_state() const override { return std::make_unique<SlotState>(dec_slots_); }

  Tensor encode_step(VaeState& state, const Tensor& x) const override {
    StateSlots& s = SlotState::of(state);
    Tensor h = enc_in_.forward(x, s);
    for (size_t i = 0; i < down_.size(); ++i) {
      for (const auto& b : down_[i]) h = b.forward(h, {}, s);
      if (i < downsamplers_.size()) h = downsamplers_[i].forward(h, s.shard);
    }
    for (const auto& b : enc_mid_) h = b.forward(h, {}, s);
    return enc_out_.forward(silu_owned(enc_norm_.forward(h, s.shard)), s);
  }

  Tensor decode_step(VaeState& state, const Tensor& z) const override {
    StateSlots& s = SlotState::of(state);
    Tensor h = dec_in_.forward(z, s);
    for (const auto& b : dec_mid_) h = b.forward(h, z, s);
    for (size_t i = 0; i < up_.size(); ++i) {
      for (const auto& b : up_[i]) h = b.forward(h, z, s);
      if (i < upsamplers_.size()) h = upsamplers_[i].forward(h, s.shard);
    }
    return dec_out_.forward(silu_owned(dec_norm_.forward(h, z, s)), s);
  }

 private:
  static VaeSpec make_spec(const CogConfig& cfg, const WeightSource& src) {
    VaeSpec s;
    s.family = "cogvideox";
    s.model_id = model_id_of(src, "cogvideox");
    s.latent_channels = cfg.latent_channels;
    s.temporal_factor = cfg.temporal_compression;
    s.spatial_factor = int64_t(1) << (cfg.channels.size() - 1);
    s.size_multiple = s.spatial_factor;
    const ChunkRules rules = cogvideox_chunks(cfg.temporal_compression);
    s.encode_chunks = rules.encode;
    s.decode_chunks = rules.decode;
    s.latent_shift = torch::zeros({cfg.latent_channels});
    s.latent_scale = torch::full({cfg.latent_channels}, cfg.scaling_factor);
    s.clamp_output = false;
    return s;
  }

  int64_t compress_levels(const CogConfig& cfg) const { return int64_t(std::log2(double(cfg.temporal_compression))); }

  void load_encoder(WeightReader& r, const CogConfig& cfg) {
    SlotAllocator slots;
    const auto& c = cfg.channels;
    enc_in_ = CausalConv3d::load(r, "encoder.conv_in.conv", 3, c[0], {3, 3, 3}, TimePad::replicate_first, slots);
    int64_t cin = c[0];
    for (size_t i = 0; i < c.size(); ++i) {
      const std::string p = "encoder.down_blocks." + std::to_string(i);
      std::vector<ResBlock> blocks;
      for (int64_t j = 0; j < cfg.layers_per_block; ++j) {
        blocks.push_back(ResBlock::load(r, p + ".resnets." + std::to_string(j), cin, c[i], cfg, false, slots));
        cin = c[i];
      }
      down_.push_back(std::move(blocks));
      if (i + 1 < c.size()) {
        downsamplers_.push_back(
            {Conv::load(r, p + ".downsamplers.0.conv", {c[i], c[i], 3, 3}), int64_t(i) < compress_levels(cfg)});
      }
    }
    for (int j = 0; j < 2; ++j) {
      enc_mid_.push_back(
          ResBlock::load(r, "encoder.mid_block.resnets." + std::to_string(j), cin, cin, cfg, false, slots));
    }
    enc_norm_ = GroupNorm::load(r, "encoder.norm_out", cin, cfg.groups, kFixedEps);
    enc_out_ = CausalConv3d::load(r, "encoder.conv_out.conv", cin, 2 * cfg.latent_channels, {3, 3, 3},
                                  TimePad::replicate_first, slots);
    enc_slots_ = size_t(slots.next);
  }

  void load_decoder(WeightReader& r, const CogConfig& cfg) {
    SlotAllocator slots;
    std::vector<int64_t> c(cfg.channels.rbegin(), cfg.channels.rend());
    dec_in_ = CausalConv3d::load(r, "decoder.conv_in.conv", cfg.latent_channels, c[0], {3, 3, 3},
                                 TimePad::replicate_first, slots);
    for (int j = 0; j < 2; ++j) {
      dec_mid_.push_back(
          ResBlock::load(r, "decoder.mid_block.resnets." + std::to_string(j), c[0], c[0], cfg, true, slots));
    }
    int64_t cin = c[0];
    for (size_t i = 0; i < c.size(); ++i) {
      const std::string p = "decoder.up_blocks." + std::to_string(i);
      std::vector<ResBlock> blocks;
      for (int64_t j = 0; j <= cfg.layers_per_block; ++j) {
        blocks.push_back(ResBlock::load(r, p + ".resnets." + std::to_string(j), cin, c[i], cfg, true, slots));
        cin = c[i];
      }
      up_.push_back(std::move(blocks));
      if (i + 1 < c.size()) {
        Conv conv = Conv::load(r, p + ".upsamplers.0.conv", {c[i], c[i], 3, 3});
        conv.prefer_winograd();
        upsamplers_.push_back({std::move(conv), int64_t(i) < compress_levels(cfg)});
      }
    }
    dec_norm_ = SpatialNorm::load(r, "decoder.norm_out", cin, cfg.latent_channels, cfg.groups, slots);
    dec_out_ = CausalConv3d::load(r, "decoder.conv_out.conv", cin, 3, {3, 3, 3}, TimePad::replicate_first, slots);
    dec_slots_ = size_t(slots.next);
  }

  CausalConv3d enc_in_, enc_out_, dec_in_, dec_out_;
  std::vector<std::vector<ResBlock>> down_, up_;
  std::vector<Downsample> downsamplers_;
  std::vector<Upsample> upsamplers_;
  std::vector<ResBlock> enc_mid_, dec_mid_;
  GroupNorm enc_norm_;
  SpatialNorm dec_norm_;
  size_t enc_slots_ = 0, dec_slots_ = 0;
};

CogConfig config_from_json(const json::Value& j, const std::string& where) {
  CogConfig cfg;
  auto bad = [&](const std::string& what) { throw ModelError(where + ": invalid CogVideoX config: " + what); };
  try {
    if (auto* v = j.find("block_out_channels")) {
      cfg.channels.clear();
      for (const auto& c : v->as_array()) cfg.channels.push_back(c.as_int64());
    }
    if (auto* v = j.find("latent_channels")) cfg.latent_channels = v->as_int64();
    if (auto* v = j.find("layers_per_block")) cfg.layers_per_block = v->as_int64();
    if (auto* v = j.find("norm_num_groups")) cfg.groups = v->as_int64();
    if (auto* v = j.find("norm_eps")) cfg.norm_eps = v->as_double();
    if (auto* v = j.find("temporal_compression_ratio")) {
      const double r = v->as_double();  // diffusers writes it as a float; converting one out of range is undefined
      if (!(r >= 1 && r <= 64) || r != double(int64_t(r))) bad("temporal_compression_ratio must be a whole 1 to 64");
      cfg.temporal_compression = int64_t(r);
    }
    if (auto* v = j.find("scaling_factor")) cfg.scaling_factor = v->as_double();
    for (const char* k : {"in_channels", "out_channels"})
      if (auto* v = j.find(k); v && v->as_int64() != 3) bad("only 3-channel (RGB) models are supported");
    for (const char* k : {"use_quant_conv", "use_post_quant_conv"})
      if (auto* v = j.find(k); v && v->is_bool() && v->as_bool()) bad(std::string(k) + " is not supported");
    for (const char* k : {"shift_factor", "latents_mean", "latents_std"})
      if (auto* v = j.find(k); v && !v->is_null()) bad(std::string(k) + " is not supported");
  } catch (const json::Error& e) {
    bad(e.what());
  }
  if (cfg.channels.size() < 2 || cfg.channels.size() > 6) bad("block_out_channels needs 2 to 6 levels");
  for (int64_t c : cfg.channels)
    if (c <= 0 || cfg.groups <= 0 || c % cfg.groups != 0)
      bad("block_out_channels must be multiples of norm_num_groups");
  if (cfg.latent_channels <= 0 || cfg.layers_per_block <= 0) bad("non-positive width or depth");
  // Far above any published model, and low enough that no width product overflows.
  constexpr int64_t kMaxWidth = 1 << 16, kMaxDepth = 64;
  for (int64_t c : cfg.channels)
    if (c > kMaxWidth) bad("block_out_channels beyond " + std::to_string(kMaxWidth));
  if (cfg.latent_channels > kMaxWidth || cfg.layers_per_block > kMaxDepth)
    bad("latent_channels or layers_per_block beyond " + std::to_string(kMaxWidth) + " / " + std::to_string(kMaxDepth));
  const int64_t tc = cfg.temporal_compression;
  if (tc < 1 || (tc & (tc - 1)) != 0 || tc > (int64_t(1) << (cfg.channels.size() - 1)))
    bad("temporal_compression_ratio must be a power of two no larger than the spatial factor");
  if (!(cfg.scaling_factor > 0)) bad("scaling_factor must be positive");
  return cfg;
}

// Without a config the widths come from the tensors; everything else is the published CogVideoX's.
CogConfig config_from_tensors(const WeightSource& src) {
  auto dim = [&](const std::string& k, int d) -> std::optional<int64_t> {
    auto it = src.tensors.find(k);
    if (it == src.tensors.end() || it->second.dim() <= d) return std::nullopt;
    return it->second.size(d);
  };
  CogConfig cfg;
  cfg.channels.clear();
  for (int i = 0;; ++i) {
    auto c = dim("encoder.down_blocks." + std::to_string(i) + ".resnets.0.conv1.conv.weight", 0);
    if (!c) break;
    cfg.channels.push_back(*c);
  }
  auto z = dim("decoder.conv_in.conv.weight", 1);
  if (cfg.channels.empty() || !z)
    throw ModelError(src.weights.string() + ": CogVideoX weights lack encoder.down_blocks or decoder.conv_in");
  cfg.latent_channels = *z;
  cfg.layers_per_block = 0;
  while (dim("encoder.down_blocks.0.resnets." + std::to_string(cfg.layers_per_block) + ".norm1.weight", 0))
    ++cfg.layers_per_block;
  return cfg;
}

}  // namespace

std::shared_ptr<Vae> make_cogvideox(const WeightSource& src, const LoadOptions& opt) {
  CogConfig cfg =
      src.config ? config_from_json(json::parse(src.config->text), src.weights.string()) : config_from_tensors(src);
  return std::make_shared<CogVae>(cfg, src, opt);
}

bool recognise_cogvideox(WeightSource& src) { return src.tensors.count("encoder.conv_in.conv.weight") > 0; }

// GroupNorm's statistics span a chunk, so the reference's cut is the only exact one: it batches two latents' worth
// of frames per call, the first chunk taking the clip's first frame too, and decodes 3 latents, then 2.
ChunkRules cogvideox_chunks(int64_t temporal_factor) {
  const int64_t frames = 2 * temporal_factor;
  return {{frames + 1, frames, false}, {3, 2, false}};
}

}  // namespace latent
