// The Wan 2.1 and Wan 2.2 (TI2V-5B) VAEs: diffusers' AutoencoderKLWan with is_residual false or true, and the
// original Wan2.1_VAE.pth / Wan2.2_VAE.pth layouts.
//
// Streaming is the model's own definition: the reference encodes frame 0 alone and then 4 frames per call,
// carrying every causal conv's last frames, and decodes one latent per call. Any cut with a 1-frame first chunk
// and later chunks of multiples of 4 frames (any number of latents when decoding) gives the same result.
//
// Wan 2.2 differs in three ways. Frames are folded 2x2 into 12 channels before the encoder and unfolded after the
// decoder. Each level gets a parameter-free shortcut around it (channel-group averages of 2x2(x2) blocks going
// down, their duplication going up); these see whole chunks, and stay exact under any cut the rule above allows
// because a later chunk always holds an even number of frames at every temporally downsampled level. And the
// decoder's upsamplers keep their width instead of halving it.
#include <torch/types.h>

#include <cmath>
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
  int64_t decoder_base_dim = 0;  // 0: base_dim
  bool residual = false;         // Wan 2.2's residual levels
  int64_t patch = 1;             // frames are folded patch x patch into channels
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
// Published Wan 2.2 (TI2V-5B) normalisation, for the original checkpoint, which has no config (the diffusers
// config and Wan2_2_VAE in the original vae2_2.py agree).
const std::vector<double> kWan22Mean = {
    -0.2289, -0.0052, -0.1323, -0.2339, -0.2799, 0.0174,  0.1838,  0.1557,  -0.1382, 0.0542,  0.2813,  0.0891,
    0.1570,  -0.0098, 0.0375,  -0.1825, -0.2246, -0.1207, -0.0698, 0.5109,  0.2665,  -0.2108, -0.2158, 0.2502,
    -0.2055, -0.0322, 0.1109,  0.1567,  -0.0729, 0.0899,  -0.2799, -0.1230, -0.0313, -0.1649, 0.0117,  0.0723,
    -0.2839, -0.2083, -0.0520, 0.3748,  0.0152,  0.1957,  0.1433,  -0.2944, 0.3573,  -0.0548, -0.1681, -0.0667};
const std::vector<double> kWan22Std = {0.4765, 1.0364, 0.4514, 1.1677, 0.5313, 0.4990, 0.4818, 0.5013, 0.8158, 1.0344,
                                       0.5894, 1.0901, 0.6885, 0.6165, 0.8454, 0.4978, 0.5759, 0.3523, 0.7135, 0.6804,
                                       0.5833, 1.4146, 0.8986, 0.5659, 0.7069, 0.5338, 0.4889, 0.4917, 0.4069, 0.4999,
                                       0.6866, 0.4093, 0.5709, 0.6065, 0.6415, 0.4944, 0.5726, 1.2042, 0.5458, 1.6887,
                                       0.3971, 1.0600, 0.3943, 0.5537, 0.5444, 0.4089, 0.7468, 0.7744};

// Rows [lo, hi) of a frame at one resolution. Band tiling walks the layers backwards from the rows a band keeps
// to the input rows they depend on (need()); rows past the frame's edges are clipped later, where the layers'
// zero padding is what the whole frame sees too.
struct Rows {
  int64_t lo = 0, hi = 0;
};

int64_t floor_div(int64_t a, int64_t b) { return a >= 0 ? a / b : -((-a + b - 1) / b); }
int64_t ceil_div(int64_t a, int64_t b) { return -floor_div(-a, b); }

// A 3x3 convolution with padding 1.
Rows conv3_need(Rows r) { return {r.lo - 1, r.hi + 1}; }

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

  static Rows need(Rows r) { return conv3_need(conv3_need(r)); }
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
    // [BT, 1, rows * W, channels], channels last in memory: SDPA takes its flash kernel only for a unit stride
    // there, and otherwise falls back to materialising every frame's HW x HW scores (67 GB at 2160x3840).
    auto tokens = [&](const Tensor& m) {
      return m.reshape({b * t, m.size(1), -1}).transpose(1, 2).contiguous().unsqueeze(1);
    };
    std::vector<Tensor> qkv_parts = tokens(qkv_out).chunk(3, -1);  // q, k, v: [BT, 1, HW, C]
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

  // `up_out`: the upsamplers' output width (Wan 2.1 halves it, Wan 2.2 keeps it).
  static Resample load(WeightReader& r, const std::string& p, int64_t c, ResampleMode mode, SlotAllocator& slots,
                       int64_t up_out) {
    Resample s;
    s.mode = mode;
    const bool up = mode == ResampleMode::up2d || mode == ResampleMode::up3d;
    s.spatial = Conv::load(r, p + ".resample.1", {up ? up_out : c, c, 3, 3});
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

  Rows need(Rows r) const {
    switch (mode) {
      case ResampleMode::down2d:
      case ResampleMode::down3d: return {2 * r.lo, 2 * r.hi + 1};  // stride 2, one zero row padded below
      case ResampleMode::up2d:
      case ResampleMode::up3d: r = conv3_need(r); return {floor_div(r.lo, 2), ceil_div(r.hi, 2)};
    }
    return r;
  }
};

using Block = std::variant<ResBlock, Resample>;

Tensor run(const Block& b, const Tensor& x, StateSlots& s) {
  return std::visit([&](const auto& m) { return m.forward(x, s); }, b);
}

Rows need(const Block& b, Rows r) {
  return std::visit([&](const auto& m) { return m.need(r); }, b);
}

// Wan 2.2's down shortcut: every output channel is the mean of `group` consecutive entries of the input's
// (channel, dt, dy, dx) blocks of ft x fs x fs. A chunk of an odd number of frames (only the first: 1 frame) is
// preceded by zero frames, as the reference pads it.
struct AvgDown {
  int64_t cout = 0, ft = 1, fs = 1;

  Tensor forward(const Tensor& x_in) const {
    Tensor x = x_in;
    if (const int64_t pad = (ft - x.size(2) % ft) % ft; pad > 0)
      x = torch::cat({torch::zeros({x.size(0), x.size(1), pad, x.size(3), x.size(4)}, x.options()), x}, 2);
    const int64_t b = x.size(0), c = x.size(1), t = x.size(2) / ft, h = x.size(3) / fs, w = x.size(4) / fs;
    const int64_t group = c * ft * fs * fs / cout;
    return x.reshape({b, c, t, ft, h, fs, w, fs})
        .permute({0, 1, 3, 5, 7, 2, 4, 6})
        .reshape({b, cout, group, t, h, w})
        .mean(2);
  }
};

// Wan 2.2's up shortcut, the mirror of AvgDown: each input channel is repeated and the copies laid out as
// ft x fs x fs blocks. In the clip's first chunk the upsamplers do not double time, so the first ft - 1 frames
// are dropped to match.
struct DupUp {
  int64_t cout = 0, ft = 1, fs = 1;

  Tensor forward(const Tensor& x, bool first) const {
    const int64_t b = x.size(0), c = x.size(1), t = x.size(2), h = x.size(3), w = x.size(4);
    const int64_t repeats = cout * ft * fs * fs / c;
    Tensor y = x.unsqueeze(2)
                   .expand({b, c, repeats, t, h, w})
                   .reshape({b, cout, ft, fs, fs, t, h, w})
                   .permute({0, 1, 5, 2, 6, 3, 7, 4})
                   .reshape({b, cout, t * ft, h * fs, w * fs});
    return first && ft > 1 ? y.slice(2, ft - 1) : y;
  }
};

// One resolution level: its blocks in order (residual blocks, then the resampler), and for Wan 2.2 the
// shortcut around the whole level.
struct Level {
  std::vector<Block> blocks;
  std::optional<AvgDown> down;
  std::optional<DupUp> up;

  Tensor forward(const Tensor& x, StateSlots& s, bool first_chunk) const {
    Tensor h = x;
    for (const auto& b : blocks) h = run(b, h, s);
    if (down) return h.add_(down->forward(x));
    if (up) return h.add_(up->forward(x, first_chunk));
    return h;
  }

  // 2 when the level ends in a resampler (rows halve going down, double going up), else 1.
  int64_t factor() const { return !blocks.empty() && std::holds_alternative<Resample>(blocks.back()) ? 2 : 1; }

  // The shortcuts read 2x2 blocks of what the main path reads anyway.
  Rows need(Rows r) const {
    for (auto it = blocks.rbegin(); it != blocks.rend(); ++it) r = latent::need(*it, r);
    return r;
  }
};

// [B, C, T, H, W] -> [B, C p p, T, H/p, W/p]: channel c*p*p + dx*p + dy holds pixel (dy, dx) of each p x p block,
// the order of the reference's patchify.
Tensor patchify(const Tensor& x, int64_t p) {
  if (p == 1) return x;
  const int64_t b = x.size(0), c = x.size(1), t = x.size(2), h = x.size(3) / p, w = x.size(4) / p;
  return x.reshape({b, c, t, h, p, w, p}).permute({0, 1, 6, 4, 2, 3, 5}).reshape({b, c * p * p, t, h, w});
}

Tensor unpatchify(const Tensor& x, int64_t p) {
  if (p == 1) return x;
  const int64_t b = x.size(0), c = x.size(1) / (p * p), t = x.size(2), h = x.size(3), w = x.size(4);
  return x.reshape({b, c, p, p, t, h, w}).permute({0, 1, 4, 5, 3, 6, 2}).reshape({b, c, t, h * p, w * p});
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
};

class WanVae : public Vae {
 public:
  WanVae(const WanConfig& cfg, const WeightSource& src, const LoadOptions& opt)
      : Vae(make_spec(cfg, src), opt), patch_(cfg.patch) {
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
    if (banded(state, x.size(3) / spec_.spatial_factor)) return encode_banded(SlotState::from(state), x);
    Tensor h = enc_mid_.attn.forward(encode_front(x, s), s.shard);
    return encode_back(h, s);
  }

  Tensor decode_step(VaeState& state, const Tensor& z) const override {
    StateSlots& s = SlotState::of(state);
    bool first = false;
    if (first_slot_ >= 0) {
      first = !s.started[first_slot_];
      s.started[first_slot_] = true;
    }
    if (banded(state, z.size(3))) return decode_banded(SlotState::from(state), z, first);
    Tensor h = dec_mid_.attn.forward(decode_front(z, s), s.shard);
    return decode_back(h, s, first);
  }

  bool exact_bands() const override { return true; }

  size_t band_chunk_bytes(VaeState::Role role, int64_t band_rows, int64_t rows, int64_t cols,
                          int64_t frames) const override {
    if (rows <= 0 || cols <= 0 || frames <= 0) return 0;
    if (band_rows <= 0 || band_rows > rows) band_rows = rows;
    const bool enc = role == VaeState::Role::encoder;
    const int64_t sf = spec_.spatial_factor, tf = spec_.temporal_factor, top = sf / patch_;
    // Rows of the band's crop at the top level (full resolution, or the patch grid): the encoder's first level
    // runs on the whole crop; the decoder's last level on the kept rows and the few its convs read.
    const int64_t halo = enc ? ceil_div(band_halo(role), patch_) : top_level_halo();
    const double crop = double(std::min(rows * top, band_rows * top + (band_rows < rows ? 2 * halo : 0)));
    const double px_frames = double(enc ? frames : frames * tf);
    const double lat_frames = double(enc ? ceil_div(frames, tf) : frames);
    const double es = double(c10::elementSize(dtype()));
    // The largest tensors are at the top level: a conv's input with its cached frames, its output, the block's
    // input kept for the shortcut, and on the way up the upsampled input of the last upsampler's conv. The count
    // is measured on the CPU heap (tests/core/memory/test_band_memory.cpp).
    const double top_tensor =
        double(enc ? enc_top_width_ : dec_top_width_) * crop * double(cols * top) * px_frames * es;
    // Whole-frame tensors at latent resolution around the attention (its input, q, k, v, output), and the
    // chunk's input and output.
    const double whole = double(mid_width_) * double(rows * cols) * lat_frames * es;
    const double io = double(3 * rows * sf * cols * sf) * px_frames * es;
    // The caches, kept once for the frame (vae/band_caches.h), and while bands run the rows they own that later
    // bands' halos still read in their old values, with the chunk's carried frames on their way back: counted as
    // two crops. Most of the bytes are at the top level, whose halo after trimming is what counts (the decoder's
    // latent-size stages read 15 rows beyond a band, its last level 8 pixels).
    const int64_t lat_halo = enc ? ceil_div(band_halo(role), sf) : ceil_div(top_level_halo(), top);
    const double crop_rows = band_rows < rows ? double(std::min(rows, band_rows + 2 * lat_halo)) : 0;
    const double state = (enc ? enc_cache_ : dec_cache_) * (double(rows) + 2 * crop_rows) * double(cols) * es;
    // 10% for the heap's fragmentation between band-sized and frame-sized blocks.
    return size_t(1.1 * (kTopTensors * top_tensor + kWholeTensors * whole + 2 * io + state));
  }

  int64_t band_halo(VaeState::Role role) const override {
    // The rows a band of one latent row needs, less that row, on the side that needs more.
    if (role == VaeState::Role::encoder) {
      const Rows in = encode_front_need({0, 1});
      return std::max(-in.lo, in.hi - spec_.spatial_factor);
    }
    const Rows in = decode_back_need({0, spec_.spatial_factor});
    return std::max(-in.lo, in.hi - 1);
  }

 private:
  // Each direction is three stages: the layers before the mid block's attention, the attention, and the layers
  // after it. The attention is the one layer that looks across the whole frame, at latent resolution; the
  // others are causal in time and 3x3 in space, so the stages around it can run in bands.
  Tensor encode_front(const Tensor& x, StateSlots& s) const {
    Tensor h = enc_in_.forward(patchify(x, patch_), s);
    for (const auto& level : down_) h = level.forward(h, s, false);
    return enc_mid_.res0.forward(h, s);
  }
  Tensor encode_back(const Tensor& h, StateSlots& s) const {
    Tensor y = conv_silu_rms_norm(enc_out_, enc_mid_.res1.forward(h, s), enc_norm_, s);
    return conv1x1x1(y, quant_);
  }
  Tensor decode_front(const Tensor& z, StateSlots& s) const {
    return dec_mid_.res0.forward(dec_in_.forward(conv1x1x1(z, post_quant_), s), s);
  }
  Tensor decode_back(const Tensor& h, StateSlots& s, bool first) const {
    Tensor y = dec_mid_.res1.forward(h, s);
    for (const auto& level : up_) y = level.forward(y, s, first);
    y = conv_silu_rms_norm(dec_out_, y, dec_norm_, s);
    return unpatchify(y, patch_).clamp(-1, 1);
  }

  // The input rows each stage's output rows depend on (pixels for the encoder's front, latent rows elsewhere).
  Rows encode_front_need(Rows r) const {
    r = ResBlock::need(r);
    for (auto it = down_.rbegin(); it != down_.rend(); ++it) r = it->need(r);
    r = conv3_need(r);
    return {r.lo * patch_, r.hi * patch_};
  }
  static Rows back_need(Rows r) { return ResBlock::need(conv3_need(r)); }  // res1 and the out conv (or conv_in, res0)
  Rows decode_back_need(Rows r) const {
    r = conv3_need({floor_div(r.lo, patch_), ceil_div(r.hi, patch_)});
    for (auto it = up_.rbegin(); it != up_.rend(); ++it) r = it->need(r);
    return ResBlock::need(r);
  }

  // Rows beyond its own that the decoder's last level and the upsampler feeding it read, on the patch grid.
  int64_t top_level_halo() const {
    const int64_t top = spec_.spatial_factor / patch_;
    Rows r = up_.back().need(conv3_need({0, top}));
    r = conv3_need(r);
    return std::max(-r.lo, r.hi - top);
  }

  // A rank with bands always takes the band path: it was given a crop, and its bands never exchange rows.
  static bool banded(const VaeState& state, int64_t latent_rows) {
    return state.band_rows() > 0 && (latent_rows > state.band_rows() || state.shard());
  }

  // A band's activations: rows [first, first + t.size(3)) of a frame of `frame` rows at the current resolution.
  struct Slab {
    Tensor t;
    int64_t first = 0, frame = 0;
  };

  // Drops the rows of `y` that no row still to be kept depends on (`need`, widened to multiples of `align`, the
  // phase the downsamplers still ahead need). Every chunk of a band trims the same rows, so the layers' caches
  // keep one shape.
  static Slab trim(Slab y, Rows need, int64_t align) {
    const int64_t lo = std::max({int64_t(0), y.first, floor_div(need.lo, align) * align});
    const int64_t hi = std::min({y.frame, y.first + y.t.size(3), ceil_div(need.hi, align) * align});
    if (lo == y.first && hi == y.first + y.t.size(3)) return y;
    return {y.t.narrow(3, lo - y.first, hi - lo).contiguous(), lo, y.frame};
  }

  // The encoder's front for one band: pixels in, the latent rows `keep` depends on out. After each level the band
  // is trimmed to what the levels below still need, so the recomputed rows shrink with depth.
  Slab encode_front_band(Slab x, StateSlots& s, Rows keep) const {
    s.at_rows(x.first / patch_, x.t.size(4) / patch_);
    Slab y{enc_in_.forward(patchify(x.t, patch_), s), x.first / patch_, x.frame / patch_};
    for (size_t i = 0; i < down_.size(); ++i) {
      s.at_rows(y.first, y.t.size(4));
      y.t = down_[i].forward(y.t, s, false);
      const int64_t f = down_[i].factor();
      y.first /= f;
      y.frame /= f;
      Rows need = ResBlock::need(keep);
      int64_t align = 1;
      for (size_t j = down_.size(); j-- > i + 1;) {
        need = down_[j].need(need);
        align *= down_[j].factor();
      }
      y = trim(y, need, align);
    }
    s.at_rows(y.first, y.t.size(4));
    y.t = enc_mid_.res0.forward(y.t, s);
    return y;
  }

  // The decoder's back for one band: latent rows in, the pixel rows `keep` out, trimmed after each level.
  Slab decode_back_band(Slab h, StateSlots& s, bool first, Rows keep) const {
    s.at_rows(h.first, h.t.size(4));
    Slab y{dec_mid_.res1.forward(h.t, s), h.first, h.frame};
    for (size_t i = 0; i < up_.size(); ++i) {
      s.at_rows(y.first, y.t.size(4));
      y.t = up_[i].forward(y.t, s, first);
      const int64_t f = up_[i].factor();
      y.first *= f;
      y.frame *= f;
      Rows need = conv3_need({floor_div(keep.lo, patch_), ceil_div(keep.hi, patch_)});
      for (size_t j = up_.size(); j-- > i + 1;) need = up_[j].need(need);
      y = trim(y, need, 1);
    }
    s.at_rows(y.first, y.t.size(4));
    y.t = unpatchify(conv_silu_rms_norm(dec_out_, y.t, dec_norm_, s), patch_).clamp(-1, 1);
    return {y.t, y.first * patch_, y.frame * patch_};
  }

  // Where a banded stage keeps its caches: the bands' slots, the stage's shared caches (SlotState::band_caches),
  // the frame's latent width and the stage's output rows per latent row.
  struct BandStage {
    std::vector<StateSlots>& slots;
    BandCaches& caches;
    int64_t latent_width = 0, out_scale = 1;
  };

  // Runs `stage` over consecutive bands of output rows `out_bands`, which it returns. Band k starts from the crop
  // of `x` (rows along dim 3) holding every row its kept rows depend on (`need`, widened to multiples of `align`,
  // the downsamplers' phase), with the caches of its crop; `stage` returns its output rows with their place in
  // the frame.
  template <class Need, class Stage>
  Slab run_bands(const Slab& x, const std::vector<Rows>& out_bands, int64_t align, Need need, BandStage where,
                 Stage stage) const {
    const int64_t first = out_bands.front().lo;
    Tensor out;
    int64_t frame = 0;
    for (size_t k : where.caches.order(out_bands.size())) {
      const Rows keep = out_bands[k];
      const Rows reads = need(keep);
      const Slab crop = trim(x, reads, align);
      if (crop.first > std::max<int64_t>(0, reads.lo) || crop.first + crop.t.size(3) < std::min(x.frame, reads.hi))
        throw std::logic_error("a band's input lacks rows it reads");
      StateSlots& s = where.slots[k];
      where.caches.begin(k, out_bands.size(), s, keep.lo / where.out_scale, keep.hi / where.out_scale,
                         where.latent_width);
      const Slab y = stage(crop, s, keep);
      where.caches.end(s);
      if (y.first > keep.lo || y.first + y.t.size(3) < keep.hi)
        throw std::logic_error("a band's stage lost rows it was to keep");
      if (!out.defined()) {
        auto sizes = y.t.sizes().vec();
        sizes[3] = out_bands.back().hi - first;
        out = torch::empty(sizes, y.t.options());
        frame = y.frame;
      }
      out.narrow(3, keep.lo - first, keep.hi - keep.lo).copy_(y.t.narrow(3, keep.lo - y.first, keep.hi - keep.lo));
    }
    where.caches.finish();
    return {out, first, frame};
  }

  // Bands of `rows` latent rows over the latent rows `span`, scaled to a stage's output rows.
  static std::vector<Rows> bands_of(Rows span, int64_t rows, int64_t scale) {
    std::vector<Rows> out;
    for (int64_t lo = span.lo; lo < span.hi; lo += rows)
      out.push_back({lo * scale, std::min(lo + rows, span.hi) * scale});
    return out;
  }

  // The latent rows a stream computes: a rank's share of the frame's, or all of them.
  static Rows own_rows(const VaeState& state, int64_t latent_rows) {
    const parallel::RowShard* shard = state.shard();
    if (!shard) return {0, latent_rows};
    const parallel::Band b = parallel::split_rows(latent_rows, shard->world())[size_t(shard->rank())];
    return {b.first, b.first + b.count};
  }

  // A chunk's input as the stream has it: whole frames, or the crop a rank was given (VaeState::set_input_rows).
  static Slab input_of(const VaeState& state, const Tensor& x) {
    if (!state.shard()) return {x, 0, x.size(3)};
    return {x, state.input_first(), state.input_frame()};
  }

  // The attention's output rows every band of the back stage reads: a rank's queries cover its own rows (against
  // the keys and values of the whole frame); the ranks' rows are gathered once for the halos its bands read.
  static Slab gather_for_bands(const Slab& own, const VaeState& state) {
    if (!state.shard()) return own;
    return {state.shard()->gather_rows(own.t), 0, own.frame};
  }

  std::vector<StateSlots>& band_slots(SlotState& state, size_t count, size_t slots) const {
    if (state.bands.empty()) state.bands.assign(count, StateSlots(slots));
    if (state.bands.size() != count) throw std::logic_error("band count changed within a clip");
    return state.bands;
  }

  Tensor encode_banded(SlotState& state, const Tensor& x) const {
    const int64_t sf = spec_.spatial_factor, width = x.size(4) / sf;
    const Slab in = input_of(state, x);
    const auto bands = bands_of(own_rows(state, in.frame / sf), state.band_rows(), 1);
    auto& slots = band_slots(state, bands.size(), enc_slots_);
    Slab h = run_bands(
        in, bands, sf, [&](Rows r) { return encode_front_need(r); }, {slots, state.band_caches[0], width, 1},
        [&](const Slab& crop, StateSlots& s, Rows keep) { return encode_front_band(crop, s, keep); });
    h.t = enc_mid_.attn.forward(h.t, state.shard());
    return run_bands(gather_for_bands(h, state), bands, 1, back_need, {slots, state.band_caches[1], width, 1},
                     [&](const Slab& crop, StateSlots& s, Rows) {
                       s.at_rows(crop.first, crop.t.size(4));
                       return Slab{encode_back(crop.t, s), crop.first, crop.frame};
                     })
        .t;
  }

  Tensor decode_banded(SlotState& state, const Tensor& z, bool first) const {
    const int64_t sf = spec_.spatial_factor;
    const Slab in = input_of(state, z);
    const Rows own = own_rows(state, in.frame);
    const auto bands = bands_of(own, state.band_rows(), 1);
    auto& slots = band_slots(state, bands.size(), dec_slots_);
    const int64_t width = z.size(4);
    Slab h = run_bands(in, bands, 1, back_need, {slots, state.band_caches[0], width, 1},
                       [&](const Slab& crop, StateSlots& s, Rows) {
                         s.at_rows(crop.first, crop.t.size(4));
                         return Slab{decode_front(crop.t, s), crop.first, crop.frame};
                       });
    h.t = dec_mid_.attn.forward(h.t, state.shard());
    return run_bands(
               gather_for_bands(h, state), bands_of(own, state.band_rows(), sf), 1,
               [&](Rows r) { return decode_back_need(r); }, {slots, state.band_caches[1], width, sf},
               [&](const Slab& crop, StateSlots& s, Rows keep) { return decode_back_band(crop, s, first, keep); })
        .t;
  }

  static VaeSpec make_spec(const WanConfig& cfg, const WeightSource& src) {
    VaeSpec s;
    s.family = cfg.residual ? "wan2.2" : "wan2.1";
    s.model_id = model_id_of(src, s.family);
    s.in_channels = cfg.in_channels / (cfg.patch * cfg.patch);
    s.latent_channels = cfg.z_dim;
    s.spatial_factor = (int64_t(1) << (cfg.dim_mult.size() - 1)) * cfg.patch;
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

  // diffusers nests Wan 2.2's levels (down_blocks.{i}.resnets.{j}, .downsampler) where Wan 2.1's list is flat
  // (down_blocks.{n}); the original checkpoints' names are mapped to these before loading.
  void load_encoder(WeightReader& r, const WanConfig& cfg) {
    SlotAllocator slots;
    std::vector<int64_t> dims = {cfg.base_dim};
    for (int64_t m : cfg.dim_mult) dims.push_back(cfg.base_dim * m);
    enc_in_ = CausalConv3d::load(r, "encoder.conv_in", cfg.in_channels, dims[0], {3, 3, 3}, TimePad::zeros, slots);
    enc_top_width_ = std::max(dims[0], dims[1]);
    mid_width_ = dims.back();
    const double top = double((int64_t(1) << (cfg.dim_mult.size() - 1)));
    enc_cache_ = 2.0 * double(cfg.in_channels) * top * top;
    int idx = 0;
    const size_t levels = cfg.dim_mult.size();
    for (size_t i = 0; i < levels; ++i) {
      const std::string p = "encoder.down_blocks." + std::to_string(i);
      auto name = [&](const char* residual_name) {
        return cfg.residual ? p + "." + residual_name : "encoder.down_blocks." + std::to_string(idx++);
      };
      Level level;
      int64_t cin = dims[i], cout = dims[i + 1];
      const double px = std::pow(top / double(int64_t(1) << i), 2);  // pixels per latent pixel at this level
      for (int64_t j = 0; j < cfg.num_res_blocks; ++j) {
        const std::string resnet = "resnets." + std::to_string(j);
        level.blocks.emplace_back(ResBlock::load(r, name(resnet.c_str()), cin, cout, slots));
        enc_cache_ += 2.0 * double(cin + cout) * px;
        cin = cout;
      }
      const bool last = i + 1 == levels, time = !last && cfg.temporal_downsample[i];
      if (time) enc_cache_ += double(cout) * px / 4;  // the time downsampler's last frame, at half size
      if (!last) {
        level.blocks.emplace_back(Resample::load(r, name("downsampler"), cout,
                                                 time ? ResampleMode::down3d : ResampleMode::down2d, slots, cout));
      }
      if (cfg.residual) level.down = AvgDown{cout, time ? 2 : 1, last ? 1 : 2};
      down_.push_back(std::move(level));
    }
    const int64_t c = dims.back();
    enc_cache_ += 2.0 * 5 * double(c);  // the mid block's four convs and conv_out, at latent size
    enc_mid_ = Mid::load(r, "encoder.mid_block", c, slots);
    enc_norm_ = r.take("encoder.norm_out.gamma", {c, 1, 1, 1});
    enc_out_ = CausalConv3d::load(r, "encoder.conv_out", c, 2 * cfg.z_dim, {3, 3, 3}, TimePad::zeros, slots);
    quant_ = Conv::load(r, "quant_conv", {2 * cfg.z_dim, 2 * cfg.z_dim, 1, 1, 1});
    enc_slots_ = size_t(slots.next);
  }

  void load_decoder(WeightReader& r, const WanConfig& cfg) {
    SlotAllocator slots;
    const int64_t base = cfg.decoder_base_dim > 0 ? cfg.decoder_base_dim : cfg.base_dim;
    std::vector<int64_t> dims = {base * cfg.dim_mult.back()};
    for (auto it = cfg.dim_mult.rbegin(); it != cfg.dim_mult.rend(); ++it) dims.push_back(base * *it);
    post_quant_ = Conv::load(r, "post_quant_conv", {cfg.z_dim, cfg.z_dim, 1, 1, 1});
    dec_in_ = CausalConv3d::load(r, "decoder.conv_in", cfg.z_dim, dims[0], {3, 3, 3}, TimePad::zeros, slots);
    dec_top_width_ = std::max(dims[dims.size() - 2], dims.back());
    const double top = double((int64_t(1) << (cfg.dim_mult.size() - 1)));
    dec_cache_ = 2.0 * double(cfg.z_dim + 4 * dims[0]) + 2.0 * double(dims.back()) * top * top;  // in, mid, out
    dec_mid_ = Mid::load(r, "decoder.mid_block", dims[0], slots);
    const size_t levels = cfg.dim_mult.size();
    for (size_t i = 0; i < levels; ++i) {
      // Wan 2.1's upsamplers halve the channels, so its blocks after the first start from half their input width.
      int64_t cin = i > 0 && !cfg.residual ? dims[i] / 2 : dims[i];
      const int64_t cout = dims[i + 1];
      const std::string p = "decoder.up_blocks." + std::to_string(i);
      Level level;
      const double px = std::pow(double(int64_t(1) << i), 2);
      for (int64_t j = 0; j <= cfg.num_res_blocks; ++j) {
        level.blocks.emplace_back(ResBlock::load(r, p + ".resnets." + std::to_string(j), cin, cout, slots));
        dec_cache_ += 2.0 * double(cin + cout) * px;
        cin = cout;
      }
      if (i + 1 != levels && cfg.temporal_downsample[cfg.temporal_downsample.size() - 1 - i])
        dec_cache_ += 2.0 * double(cout) * px;  // the time upsampler's conv
      if (i + 1 != levels) {
        const bool time = cfg.temporal_downsample[cfg.temporal_downsample.size() - 1 - i];
        level.blocks.emplace_back(Resample::load(r, p + (cfg.residual ? ".upsampler" : ".upsamplers.0"), cout,
                                                 time ? ResampleMode::up3d : ResampleMode::up2d, slots,
                                                 cfg.residual ? cout : cout / 2));
        if (cfg.residual) level.up = DupUp{cout, time ? 2 : 1, 2};
      }
      up_.push_back(std::move(level));
    }
    const int64_t c = dims.back();
    dec_norm_ = r.take("decoder.norm_out.gamma", {c, 1, 1, 1});
    dec_out_ = CausalConv3d::load(r, "decoder.conv_out", c, cfg.out_channels, {3, 3, 3}, TimePad::zeros, slots);
    // The up shortcuts treat the clip's first chunk apart; the stream remembers whether it has had one.
    if (cfg.residual) first_slot_ = slots.take();
    dec_slots_ = size_t(slots.next);
  }

  int64_t patch_ = 1;
  // Widths for band_chunk_bytes(): the encoder's first level, the widest tensor the decoder's top level sees
  // (the last upsampler's input, upsampled), and the mid block.
  int64_t enc_top_width_ = 0, dec_top_width_ = 0, mid_width_ = 0;
  // Elements the carried caches of a whole-frame stream hold per latent pixel (frames x channels x pixels at each
  // cached layer's resolution): the state a chunk leaves behind, which bands multiply by their crops' overlap.
  double enc_cache_ = 0, dec_cache_ = 0;
  static constexpr double kTopTensors = 6, kWholeTensors = 8;
  CausalConv3d enc_in_, enc_out_, dec_in_, dec_out_;
  std::vector<Level> down_, up_;
  Mid enc_mid_, dec_mid_;
  Tensor enc_norm_, dec_norm_;
  Conv quant_, post_quant_;
  int first_slot_ = -1;
  size_t enc_slots_ = 0, dec_slots_ = 0;
};

std::vector<int64_t> int_list(const json::Value& v, const char* key) {
  std::vector<int64_t> out;
  for (const auto& x : v.as_array()) out.push_back(x.as_int64());
  if (out.empty()) throw json::Error(std::string(key) + " is empty");
  return out;
}

void check_config(const WanConfig& cfg, const std::string& where) {
  auto bad = [&](const std::string& what) { throw ModelError(where + ": invalid Wan config: " + what); };
  if (cfg.base_dim <= 0 || cfg.z_dim <= 0 || cfg.num_res_blocks <= 0 || cfg.decoder_base_dim < 0)
    bad("non-positive width or depth");
  // Far above any published model, and low enough that no width product overflows.
  if (cfg.base_dim > kMaxWidth || cfg.decoder_base_dim > kMaxWidth || cfg.z_dim > kMaxWidth ||
      cfg.num_res_blocks > kMaxDepth)
    bad("base_dim, decoder_base_dim, z_dim or num_res_blocks beyond " + std::to_string(kMaxWidth) + " / " +
        std::to_string(kMaxDepth));
  for (int64_t m : cfg.dim_mult)
    if (m <= 0 || m > kMaxDepth) bad("dim_mult entries must be 1 to " + std::to_string(kMaxDepth));
  if (cfg.dim_mult.size() < 2 || cfg.dim_mult.size() > 6) bad("dim_mult needs 2 to 6 levels");
  if (cfg.temporal_downsample.size() != cfg.dim_mult.size() - 1)
    bad("temperal_downsample needs one entry per level - 1");
  if (cfg.patch < 1 || cfg.patch > 8) bad("patch_size must be 1 to 8");
  const int64_t rgb = 3 * cfg.patch * cfg.patch;
  if (cfg.in_channels != rgb || cfg.out_channels != rgb) {
    bad("only RGB models are supported: in_channels and out_channels must be 3 x patch_size^2 = " +
        std::to_string(rgb) + ", got " + std::to_string(cfg.in_channels) + " and " + std::to_string(cfg.out_channels));
  }
  if (cfg.residual) {
    // The shortcuts regroup whole channel blocks; widths that do not divide cannot be built (diffusers refuses
    // them too).
    const size_t levels = cfg.dim_mult.size();
    const int64_t dec = cfg.decoder_base_dim > 0 ? cfg.decoder_base_dim : cfg.base_dim;
    for (size_t i = 0; i < levels; ++i) {
      const bool last = i + 1 == levels, time = !last && cfg.temporal_downsample[i];
      const int64_t factor = (time ? 2 : 1) * (last ? 1 : 4);
      const int64_t cin = cfg.base_dim * (i == 0 ? 1 : cfg.dim_mult[i - 1]), cout = cfg.base_dim * cfg.dim_mult[i];
      if (cin * factor % cout != 0) bad("encoder level " + std::to_string(i) + " widths do not divide");
    }
    for (size_t i = 0; i + 1 < levels; ++i) {  // decoder levels, from the latent side
      const int64_t din = dec * cfg.dim_mult[i == 0 ? levels - 1 : levels - i],
                    dout = dec * cfg.dim_mult[levels - 1 - i];
      if (dout * (cfg.temporal_downsample[levels - 2 - i] ? 8 : 4) % din != 0)
        bad("decoder level " + std::to_string(i) + " widths do not divide");
    }
  }
  if (int64_t(cfg.latents_mean.size()) != cfg.z_dim || int64_t(cfg.latents_std.size()) != cfg.z_dim)
    bad("latents_mean and latents_std need z_dim entries");
  for (double s : cfg.latents_std)
    if (!(s > 0)) bad("latents_std must be positive");
}

// The original checkpoints have no config: widths, depth, patch size and which levels downsample time come from
// the tensors; the latent statistics are the published ones of the model whose width they have (identity else).
WanConfig config_from_tensors(const WeightSource& src, bool residual) {
  WanConfig cfg;
  cfg.residual = residual;
  const std::string where = src.weights.string();
  auto get = [&](const std::string& k) -> const Tensor& {
    auto it = src.tensors.find(k);
    if (it == src.tensors.end()) throw ModelError(where + ": Wan checkpoint lacks " + k);
    return it->second;
  };
  auto has = [&](const std::string& k) { return src.tensors.count(k) > 0; };
  const Tensor& conv_in = get("encoder.conv_in.weight");
  if (conv_in.dim() != 5) throw ModelError(where + ": encoder.conv_in.weight is not a 3-D convolution");
  cfg.base_dim = conv_in.size(0);
  cfg.z_dim = get("post_quant_conv.weight").size(0);
  if (!residual) {
    int64_t blocks = 0;
    while (has("encoder.down_blocks." + std::to_string(blocks) + ".norm1.gamma")) ++blocks;
    cfg.num_res_blocks = blocks > 0 ? blocks : cfg.num_res_blocks;
    cfg.latents_mean = cfg.z_dim == 16 ? kWanMean : std::vector<double>(size_t(cfg.z_dim), 0.0);
    cfg.latents_std = cfg.z_dim == 16 ? kWanStd : std::vector<double>(size_t(cfg.z_dim), 1.0);
    return cfg;
  }
  const std::string enc = "encoder.down_blocks.";
  size_t levels = 0;
  while (has(enc + std::to_string(levels) + ".resnets.0.conv1.weight")) ++levels;
  if (levels < 2 || levels > 6)
    throw ModelError(where + ": Wan 2.2 checkpoint with " + std::to_string(levels) +
                     " encoder levels (2 to 6 supported)");
  cfg.dim_mult.clear();
  cfg.temporal_downsample.clear();
  for (size_t i = 0; i < levels; ++i) {
    const std::string p = enc + std::to_string(i);
    cfg.dim_mult.push_back(std::max<int64_t>(1, get(p + ".resnets.0.conv1.weight").size(0) / cfg.base_dim));
    if (i + 1 < levels) cfg.temporal_downsample.push_back(has(p + ".downsampler.time_conv.weight"));
  }
  int64_t blocks = 0;
  while (has(enc + "0.resnets." + std::to_string(blocks) + ".norm1.gamma")) ++blocks;
  cfg.num_res_blocks = std::max<int64_t>(blocks, 1);
  cfg.in_channels = conv_in.size(1);
  const Tensor& conv_out = get("decoder.conv_out.weight");
  cfg.out_channels = conv_out.size(0);
  cfg.decoder_base_dim = conv_out.dim() == 5 ? conv_out.size(1) / cfg.dim_mult[0] : 0;
  while (3 * cfg.patch * cfg.patch < cfg.in_channels && cfg.patch < 8) ++cfg.patch;
  cfg.latents_mean = cfg.z_dim == 48 ? kWan22Mean : std::vector<double>(size_t(cfg.z_dim), 0.0);
  cfg.latents_std = cfg.z_dim == 48 ? kWan22Std : std::vector<double>(size_t(cfg.z_dim), 1.0);
  check_config(cfg, where);
  return cfg;
}

WanConfig config_from_json(const json::Value& j, const std::string& where) {
  WanConfig cfg;
  try {
    if (auto* v = j.find("base_dim")) cfg.base_dim = v->as_int64();
    if (auto* v = j.find("decoder_base_dim"); v && !v->is_null()) cfg.decoder_base_dim = v->as_int64();
    if (auto* v = j.find("z_dim")) cfg.z_dim = v->as_int64();
    if (auto* v = j.find("dim_mult")) cfg.dim_mult = int_list(*v, "dim_mult");
    if (auto* v = j.find("num_res_blocks")) cfg.num_res_blocks = v->as_int64();
    if (auto* v = j.find("in_channels")) cfg.in_channels = v->as_int64();
    if (auto* v = j.find("out_channels")) cfg.out_channels = v->as_int64();
    if (auto* v = j.find("temperal_downsample")) {
      cfg.temporal_downsample.clear();
      for (const auto& b : v->as_array()) cfg.temporal_downsample.push_back(b.as_bool());
    }
    if (auto* v = j.find("is_residual"); v && !v->is_null()) cfg.residual = v->as_bool();
    if (auto* v = j.find("patch_size"); v && !v->is_null()) cfg.patch = v->as_int64();
    // The residual levels have no place for attention (diffusers ignores attn_scales there).
    if (auto* v = j.find("attn_scales"); v && !cfg.residual && !v->as_array().empty())
      throw ModelError(where + ": attention in the down/up path (attn_scales) is not supported");
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
  if (cfg.latents_mean.empty()) cfg.latents_mean.assign(size_t(std::max<int64_t>(cfg.z_dim, 0)), 0.0);
  if (cfg.latents_std.empty()) cfg.latents_std.assign(size_t(std::max<int64_t>(cfg.z_dim, 0)), 1.0);
  check_config(cfg, where);
  return cfg;
}

std::shared_ptr<Vae> make(const WeightSource& src, const LoadOptions& opt, bool residual) {
  const std::string where = src.weights.string();
  WanConfig cfg =
      src.config ? config_from_json(json::parse(src.config->text), where) : config_from_tensors(src, residual);
  if (cfg.residual != residual) {
    throw ModelError(where +
                     (cfg.residual ? ": the config is a Wan 2.2 one (is_residual true)"
                                   : ": the config is a Wan 2.1 one (is_residual false)") +
                     ", but the file names the family " + (residual ? "wan2.2" : "wan2.1"));
  }
  return std::make_shared<WanVae>(cfg, src, opt);
}

}  // namespace

std::shared_ptr<Vae> make_wan(const WeightSource& src, const LoadOptions& opt) { return make(src, opt, false); }
std::shared_ptr<Vae> make_wan22(const WeightSource& src, const LoadOptions& opt) { return make(src, opt, true); }

bool wan_config_is_residual(const ModelConfig& config) {
  try {
    const json::Value j = json::parse(config.text);
    const json::Value* v = j.find("is_residual");
    return v && v->is_bool() && v->as_bool();
  } catch (const std::exception&) {
    return false;  // the Wan 2.1 row then reports the broken config
  }
}

bool wan21_takes_config(const ModelConfig& config) { return !wan_config_is_residual(config); }
bool wan22_takes_config(const ModelConfig& config) { return wan_config_is_residual(config); }

bool recognise_wan(WeightSource& src) {
  if (rename_original_wan_keys(src)) return true;
  return src.tensors.count("encoder.conv_in.weight") && src.tensors.count("encoder.down_blocks.0.norm1.gamma");
}

bool recognise_wan22(WeightSource& src) {
  if (rename_original_wan22_keys(src)) return true;
  return src.tensors.count("encoder.conv_in.weight") &&
         src.tensors.count("encoder.down_blocks.0.resnets.0.norm1.gamma");
}

// The reference encodes frame 0 alone, then temporal_factor frames per call, and decodes one latent per call;
// any batch of whole steps gives the same result.
ChunkRules wan_chunks(int64_t temporal_factor) { return {{1, temporal_factor, true}, {1, 1, true}}; }

LatentStatistics published_latent_statistics(const std::string& model_id) {
  if (model_id == "wan2.1") return {kWanMean, kWanStd};
  if (model_id == "wan2.2") return {kWan22Mean, kWan22Std};
  throw std::invalid_argument("no published latent statistics for model '" + model_id + "' (known: wan2.1, wan2.2)");
}

}  // namespace latent
