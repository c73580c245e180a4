// The Wan 2.1 VAE (diffusers AutoencoderKLWan; also the original Wan2.1_VAE.pth layout).
//
// Streaming is the model's own definition: the reference encodes frame 0 alone and then 4 frames per call,
// carrying every causal conv's last frames, and decodes one latent per call. Any cut with a 1-frame first chunk
// and later chunks of multiples of 4 frames (any number of latents when decoding) gives the same result.
#include <torch/torch.h>

#include <variant>

#include "io/json.h"
#include "latent/parallel/row_shard.h"
#include "nn/layers.h"
#include "vae/families.h"
#include "vae/slot_state.h"

namespace latent {
namespace {

using namespace layers;
using torch::Tensor;

struct WanConfig {
  int64_t base_dim = 96;
  int64_t z_dim = 16;
  std::vector<int64_t> dim_mult = {1, 2, 4, 4};
  int64_t num_res_blocks = 2;
  std::vector<bool> temporal_downsample = {false, true, true};
  int64_t in_channels = 3;
  int64_t out_channels = 3;
  std::vector<double> latents_mean;
  std::vector<double> latents_std;
};

constexpr int64_t kMaxWidth = 1 << 16;
constexpr int64_t kMaxDepth = 64;

// Published Wan 2.1 normalisation (diffusers config and the original WanVAE agree).
const std::vector<double> kWanMean = {-0.7571, -0.7089, -0.9113, 0.1075,  -0.1745, 0.9653,  -0.1517, 1.5508,
                                      0.4134,  -0.0715, 0.5517,  -0.3632, -0.1922, -0.9497, 0.2503,  -0.2921};
const std::vector<double> kWanStd = {2.8184, 1.4541, 2.3275, 2.6558, 1.2196, 1.7708, 2.6052, 2.0743,
                                     3.2687, 2.1526, 2.8652, 1.5579, 1.6382, 1.1253, 2.8251, 1.9160};

struct ResBlock {
  Tensor gamma1, gamma2;
  CausalConv3d conv1, conv2;
  std::optional<Conv> shortcut;

  static ResBlock load(WeightReader& r, const std::string& p, int64_t cin, int64_t cout, SlotAllocator& slots) {
    ResBlock b;
    b.gamma1 = r.take(p + ".norm1.gamma", {cin, 1, 1, 1});
    b.conv1 = CausalConv3d::load(r, p + ".conv1", cin, cout, {3, 3, 3}, TimePad::zeros, slots);
    b.gamma2 = r.take(p + ".norm2.gamma", {cout, 1, 1, 1});
    b.conv2 = CausalConv3d::load(r, p + ".conv2", cout, cout, {3, 3, 3}, TimePad::zeros, slots);
    if (cin != cout) b.shortcut = Conv::load(r, p + ".conv_shortcut", {cout, cin, 1, 1, 1});
    return b;
  }

  Tensor forward(const Tensor& x, StateSlots& s) const {
    Tensor y = conv_silu_rms_norm(conv1, x, gamma1, s);
    y = conv_silu_rms_norm(conv2, y, gamma2, s);
    // The shortcut is made last and added into the conv's fresh output, so neither is held through the convs.
    return y.add_(shortcut ? conv1x1x1(x, *shortcut) : x);
  }
};

// Per-frame single-head self-attention over the H*W positions (mid blocks only): frames never see each other. A
// patch-parallel band computes the queries of its own rows against the keys and values of the whole frame.
struct Attention {
  Tensor gamma;
  Conv qkv, proj;

  static Attention load(WeightReader& r, const std::string& p, int64_t c) {
    return {r.take(p + ".norm.gamma", {c, 1, 1}), Conv::load(r, p + ".to_qkv", {3 * c, c, 1, 1}),
            Conv::load(r, p + ".proj", {c, c, 1, 1})};
  }

  Tensor forward(const Tensor& x, const parallel::RowShard* shard) const {
    const int64_t b = x.size(0), c = x.size(1), t = x.size(2), h = x.size(3), w = x.size(4);
    Tensor f = x.permute({0, 2, 1, 3, 4}).reshape({b * t, c, h, w});
    Tensor n = rms_norm_channels(f, gamma);
    Tensor qkv_out = conv_direct(n, qkv.w, qkv.b, {1, 1}, {0, 0});  // [BT, 3C, H, W]
    auto tokens = [&](const Tensor& m) {                            // [BT, 1, rows * W, channels]
      return m.reshape({b * t, m.size(1), -1}).transpose(1, 2).unsqueeze(1);
    };
    std::vector<Tensor> qkv_parts = tokens(qkv_out).chunk(3, -1);  // q, k, v: [BT, 1, HW, C], views
    if (shard) {
      auto kv = tokens(shard->gather_rows(qkv_out.slice(1, c).contiguous())).chunk(2, -1);
      qkv_parts[1] = kv[0];
      qkv_parts[2] = kv[1];
    }
    Tensor a = at::scaled_dot_product_attention(qkv_parts[0], qkv_parts[1], qkv_parts[2]);
    a = a.squeeze(1).transpose(1, 2).reshape({b * t, c, h, w});
    Tensor out = conv_direct(a, proj.w, proj.b, {1, 1}, {0, 0});
    return out.reshape({b, t, c, h, w}).permute({0, 2, 1, 3, 4}) + x;
  }
};

enum class ResampleMode { down2d, down3d, up2d, up3d };

struct Resample {
  ResampleMode mode;
  Conv spatial;
  Conv time;             // down3d: [C, C, 3, 1, 1] stride 2; up3d: [2C, C, 3, 1, 1]
  CausalConv3d time_up;  // up3d's time conv, causal with zero padding
  int slot = -1;

  static Resample load(WeightReader& r, const std::string& p, int64_t c, ResampleMode mode, SlotAllocator& slots) {
    Resample s;
    s.mode = mode;
    const bool up = mode == ResampleMode::up2d || mode == ResampleMode::up3d;
    s.spatial = Conv::load(r, p + ".resample.1", {up ? c / 2 : c, c, 3, 3});
    if (up) s.spatial.prefer_winograd();  // the downsamplers' convs have stride 2
    if (mode == ResampleMode::down3d) {
      s.time = Conv::load(r, p + ".time_conv", {c, c, 3, 1, 1});
      s.slot = slots.take();
    } else if (mode == ResampleMode::up3d) {
      s.time_up = CausalConv3d::load(r, p + ".time_conv", c, 2 * c, {3, 1, 1}, TimePad::zeros, slots);
      s.slot = slots.take();
    }
    return s;
  }

  Tensor forward(const Tensor& x_in, StateSlots& s) const {
    Tensor x = x_in;
    switch (mode) {
      case ResampleMode::down2d: return conv2d_down2x_per_frame(x, spatial, s.shard);
      case ResampleMode::down3d: {
        x = conv2d_down2x_per_frame(x, spatial, s.shard);
        // The first chunk (frame 0) passes through; later chunks see the previous chunk's last frame ahead of
        // their own, so 1 + 2n frames go into a stride-2 conv and n come out.
        if (!s.started[slot]) {
          s.started[slot] = true;
          s.carry(slot, x.slice(2, x.size(2) - 1));
          return x;
        }
        Tensor in = torch::cat({s.tensors[slot], x}, 2);
        s.carry(slot, x.slice(2, x.size(2) - 1));
        return conv_direct(in, time.w, time.b, {2, 1, 1}, {0, 0, 0});
      }
      case ResampleMode::up3d: {
        // The first chunk is not upsampled in time; from the second on, a causal conv doubles the channels and
        // the two halves become consecutive frames.
        if (!s.started[slot]) {
          s.started[slot] = true;
        } else {
          Tensor y = time_up.forward(x, s);  // [B, 2C, T, H, W]
          const int64_t b = y.size(0), c = y.size(1) / 2, t = y.size(2), h = y.size(3), w = y.size(4);
          x = y.reshape({b, 2, c, t, h, w}).permute({0, 2, 3, 1, 4, 5}).reshape({b, c, 2 * t, h, w});
        }
        return conv2d_per_frame(upsample2x_per_frame(x), spatial, 1, 1, s.shard);
      }
      case ResampleMode::up2d: return conv2d_per_frame(upsample2x_per_frame(x), spatial, 1, 1, s.shard);
    }
    return x;
  }
};

using Block = std::variant<ResBlock, Resample>;

Tensor run(const Block& b, const Tensor& x, StateSlots& s) {
  return std::visit([&](const auto& m) { return m.forward(x, s); }, b);
}

struct Mid {
  ResBlock res0, res1;
  Attention attn;
  static Mid load(WeightReader& r, const std::string& p, int64_t c, SlotAllocator& slots) {
    Mid m;
    m.res0 = ResBlock::load(r, p + ".resnets.0", c, c, slots);
    m.attn = Attention::load(r, p + ".attentions.0", c);
    m.res1 = ResBlock::load(r, p + ".resnets.1", c, c, slots);
    return m;
  }
  Tensor forward(const Tensor& x, StateSlots& s) const {
    return res1.forward(attn.forward(res0.forward(x, s), s.shard), s);
  }
};

class WanVae : public Vae {
 public:
  WanVae(const WanConfig& cfg, const WeightSource& src, const LoadOptions& opt) : Vae(make_spec(cfg, src), opt) {
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
    for (const auto& b : down_) h = run(b, h, s);
    h = enc_mid_.forward(h, s);
    h = conv_silu_rms_norm(enc_out_, h, enc_norm_, s);
    return conv1x1x1(h, quant_);
  }

  Tensor decode_step(VaeState& state, const Tensor& z) const override {
    StateSlots& s = SlotState::of(state);
    Tensor h = dec_in_.forward(conv1x1x1(z, post_quant_), s);
    h = dec_mid_.forward(h, s);
    for (const auto& b : up_) h = run(b, h, s);
    h = conv_silu_rms_norm(dec_out_, h, dec_norm_, s);
    return h.clamp(-1, 1);
  }

 private:
  static VaeSpec make_spec(const WanConfig& cfg, const WeightSource& src) {
    VaeSpec s;
    s.family = "wan2.1";
    s.model_id = model_id_of(src, "wan2.1");
    s.in_channels = cfg.in_channels;
    s.latent_channels = cfg.z_dim;
    s.spatial_factor = int64_t(1) << (cfg.dim_mult.size() - 1);
    int64_t tf = 1;
    for (bool t : cfg.temporal_downsample) tf *= t ? 2 : 1;
    s.temporal_factor = tf;
    s.size_multiple = s.spatial_factor;
    const ChunkRules rules = wan_chunks(tf);
    s.encode_chunks = rules.encode;
    s.decode_chunks = rules.decode;
    auto mean = torch::tensor(cfg.latents_mean, torch::kDouble).to(torch::kFloat);
    auto std = torch::tensor(cfg.latents_std, torch::kDouble).to(torch::kFloat);
    s.latent_shift = mean;
    s.latent_scale = 1.0 / std;
    s.clamp_output = true;
    return s;
  }

  void load_encoder(WeightReader& r, const WanConfig& cfg) {
    SlotAllocator slots;
    std::vector<int64_t> dims = {cfg.base_dim};
    for (int64_t m : cfg.dim_mult) dims.push_back(cfg.base_dim * m);
    enc_in_ = CausalConv3d::load(r, "encoder.conv_in", cfg.in_channels, dims[0], {3, 3, 3}, TimePad::zeros, slots);
    int idx = 0;
    const size_t levels = cfg.dim_mult.size();
    for (size_t i = 0; i < levels; ++i) {
      int64_t cin = dims[i], cout = dims[i + 1];
      for (int64_t j = 0; j < cfg.num_res_blocks; ++j) {
        down_.emplace_back(ResBlock::load(r, "encoder.down_blocks." + std::to_string(idx++), cin, cout, slots));
        cin = cout;
      }
      if (i + 1 != levels) {
        auto mode = cfg.temporal_downsample[i] ? ResampleMode::down3d : ResampleMode::down2d;
        down_.emplace_back(Resample::load(r, "encoder.down_blocks." + std::to_string(idx++), cout, mode, slots));
      }
    }
    const int64_t c = dims.back();
    enc_mid_ = Mid::load(r, "encoder.mid_block", c, slots);
    enc_norm_ = r.take("encoder.norm_out.gamma", {c, 1, 1, 1});
    enc_out_ = CausalConv3d::load(r, "encoder.conv_out", c, 2 * cfg.z_dim, {3, 3, 3}, TimePad::zeros, slots);
    quant_ = Conv::load(r, "quant_conv", {2 * cfg.z_dim, 2 * cfg.z_dim, 1, 1, 1});
    enc_slots_ = size_t(slots.next);
  }

  void load_decoder(WeightReader& r, const WanConfig& cfg) {
    SlotAllocator slots;
    std::vector<int64_t> dims = {cfg.base_dim * cfg.dim_mult.back()};
    for (auto it = cfg.dim_mult.rbegin(); it != cfg.dim_mult.rend(); ++it) dims.push_back(cfg.base_dim * *it);
    post_quant_ = Conv::load(r, "post_quant_conv", {cfg.z_dim, cfg.z_dim, 1, 1, 1});
    dec_in_ = CausalConv3d::load(r, "decoder.conv_in", cfg.z_dim, dims[0], {3, 3, 3}, TimePad::zeros, slots);
    dec_mid_ = Mid::load(r, "decoder.mid_block", dims[0], slots);
    const size_t levels = cfg.dim_mult.size();
    for (size_t i = 0; i < levels; ++i) {
      // Every upsampler halves the channels, so blocks after the first start from half their input width.
      int64_t cin = i > 0 ? dims[i] / 2 : dims[i];
      const int64_t cout = dims[i + 1];
      const std::string p = "decoder.up_blocks." + std::to_string(i);
      for (int64_t j = 0; j <= cfg.num_res_blocks; ++j) {
        up_.emplace_back(ResBlock::load(r, p + ".resnets." + std::to_string(j), cin, cout, slots));
        cin = cout;
      }
      if (i + 1 != levels) {
        bool time = cfg.temporal_downsample[cfg.temporal_downsample.size() - 1 - i];
        up_.emplace_back(
            Resample::load(r, p + ".upsamplers.0", cout, time ? ResampleMode::up3d : ResampleMode::up2d, slots));
      }
    }
    const int64_t c = dims.back();
    dec_norm_ = r.take("decoder.norm_out.gamma", {c, 1, 1, 1});
    dec_out_ = CausalConv3d::load(r, "decoder.conv_out", c, 3, {3, 3, 3}, TimePad::zeros, slots);
    dec_slots_ = size_t(slots.next);
  }

  CausalConv3d enc_in_, enc_out_, dec_in_, dec_out_;
  std::vector<Block> down_, up_;
  Mid enc_mid_, dec_mid_;
  Tensor enc_norm_, dec_norm_;
  Conv quant_, post_quant_;
  size_t enc_slots_ = 0, dec_slots_ = 0;
};

std::vector<int64_t> int_list(const json::Value& v, const char* key) {
  std::vector<int64_t> out;
  for (const auto& x : v.as_array()) out.push_back(x.as_int64());
  if (out.empty()) throw json::Error(std::string(key) + " is empty");
  return out;
}

// The original checkpoint has no config: widths come from the tensors, the rest is Wan 2.1's.
WanConfig config_from_tensors(const WeightSource& src) {
  WanConfig cfg;
  auto get = [&](const std::string& k) -> const Tensor& {
    auto it = src.tensors.find(k);
    if (it == src.tensors.end()) throw ModelError(src.weights.string() + ": Wan checkpoint lacks " + k);
    return it->second;
  };
  cfg.base_dim = get("encoder.conv_in.weight").size(0);
  cfg.z_dim = get("post_quant_conv.weight").size(0);
  int64_t blocks = 0;
  while (src.tensors.count("encoder.down_blocks." + std::to_string(blocks) + ".norm1.gamma")) ++blocks;
  cfg.num_res_blocks = blocks > 0 ? blocks : cfg.num_res_blocks;
  cfg.latents_mean = kWanMean;
  cfg.latents_std = kWanStd;
  if (cfg.z_dim != 16) {
    cfg.latents_mean.assign(size_t(cfg.z_dim), 0.0);
    cfg.latents_std.assign(size_t(cfg.z_dim), 1.0);
  }
  return cfg;
}

WanConfig config_from_json(const json::Value& j, const std::string& where) {
  WanConfig cfg;
  try {
    if (auto* v = j.find("base_dim")) cfg.base_dim = v->as_int64();
    if (auto* v = j.find("z_dim")) cfg.z_dim = v->as_int64();
    if (auto* v = j.find("dim_mult")) cfg.dim_mult = int_list(*v, "dim_mult");
    if (auto* v = j.find("num_res_blocks")) cfg.num_res_blocks = v->as_int64();
    if (auto* v = j.find("in_channels")) cfg.in_channels = v->as_int64();
    if (auto* v = j.find("out_channels")) cfg.out_channels = v->as_int64();
    if (auto* v = j.find("temperal_downsample")) {
      cfg.temporal_downsample.clear();
      for (const auto& b : v->as_array()) cfg.temporal_downsample.push_back(b.as_bool());
    }
    if (auto* v = j.find("attn_scales"); v && !v->as_array().empty())
      throw ModelError(where + ": attention in the down/up path (attn_scales) is not supported");
    if (auto* v = j.find("is_residual"); v && v->is_bool() && v->as_bool())
      throw ModelError(where + ": the Wan 2.2 residual VAE (is_residual) is not supported yet");
    if (auto* v = j.find("patch_size"); v && !v->is_null())
      throw ModelError(where + ": patchified Wan VAEs (patch_size) are not supported yet");
    auto floats = [](const json::Value* v) {
      std::vector<double> out;
      if (v && !v->is_null())
        for (const auto& x : v->as_array()) out.push_back(x.as_double());
      return out;
    };
    cfg.latents_mean = floats(j.find("latents_mean"));
    cfg.latents_std = floats(j.find("latents_std"));
  } catch (const json::Error& e) {
    throw ModelError(where + ": invalid Wan config: " + e.what());
  }
  if (cfg.latents_mean.empty()) cfg.latents_mean.assign(size_t(cfg.z_dim), 0.0);
  if (cfg.latents_std.empty()) cfg.latents_std.assign(size_t(cfg.z_dim), 1.0);
  auto bad = [&](const std::string& what) { throw ModelError(where + ": invalid Wan config: " + what); };
  if (cfg.base_dim <= 0 || cfg.z_dim <= 0 || cfg.num_res_blocks <= 0) bad("non-positive width or depth");
  // Far above any published model, and low enough that no width product overflows.
  if (cfg.base_dim > kMaxWidth || cfg.z_dim > kMaxWidth || cfg.num_res_blocks > kMaxDepth)
    bad("base_dim, z_dim or num_res_blocks beyond " + std::to_string(kMaxWidth) + " / " + std::to_string(kMaxDepth));
  for (int64_t m : cfg.dim_mult)
    if (m <= 0 || m > kMaxDepth) bad("dim_mult entries must be 1 to " + std::to_string(kMaxDepth));
  if (cfg.dim_mult.size() < 2 || cfg.dim_mult.size() > 6) bad("dim_mult needs 2 to 6 levels");
  if (cfg.temporal_downsample.size() != cfg.dim_mult.size() - 1)
    bad("temperal_downsample needs one entry per level - 1");
  if (cfg.in_channels != 3 || cfg.out_channels != 3) bad("only 3-channel (RGB) models are supported");
  if (int64_t(cfg.latents_mean.size()) != cfg.z_dim || int64_t(cfg.latents_std.size()) != cfg.z_dim)
    bad("latents_mean and latents_std need z_dim entries");
  for (double s : cfg.latents_std)
    if (!(s > 0)) bad("latents_std must be positive");
  return cfg;
}

}  // namespace

std::shared_ptr<Vae> make_wan(const WeightSource& src, const LoadOptions& opt) {
  WanConfig cfg =
      src.config ? config_from_json(json::parse(src.config->text), src.weights.string()) : config_from_tensors(src);
  return std::make_shared<WanVae>(cfg, src, opt);
}

bool recognise_wan(WeightSource& src) {
  if (rename_original_wan_keys(src)) return true;
  return src.tensors.count("encoder.conv_in.weight") && src.tensors.count("encoder.down_blocks.0.norm1.gamma");
}

// The reference encodes frame 0 alone, then temporal_factor frames per call, and decodes one latent per call;
// any batch of whole steps gives the same result.
ChunkRules wan_chunks(int64_t temporal_factor) { return {{1, temporal_factor, true}, {1, 1, true}}; }

}  // namespace latent
