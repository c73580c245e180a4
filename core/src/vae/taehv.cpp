// TAEHV, the tiny streaming autoencoders of madebyollin/taehv (taew2_1 for Wan 2.1's latents, taew2_2 and
// taew2_2_super for Wan 2.2 TI2V-5B's): 2-D convolutions per frame, with time carried by three kinds of blocks.
// A MemBlock (SuperMemBlock in the super decoder) reads its own input at the previous timestep of its rate, zeros
// at the first; a TPool concatenates s consecutive frames on channels into one; a TGrow splits one frame into s.
// So the state between chunks is each memory block's last input and each TPool's frames waiting for a group, and
// any cut of the frames into chunks gives the reference's sequential result.
//
// Values: frames in [0, 1] (the engine's [-1, 1] is mapped at the edges), latents exactly the diffusion model's
// (no shift or scale), so the latent space is that of the VAE the model imitates. The encoder pools frames 4 by 4
// after padding the clip's end with its last frame (N frames, ceil(N / 4) latents); the decoder's first 3 output
// frames are dropped, so T latents give 4T - 3 frames, the first latent one.
//
// The architecture comes from the tensors' shapes (patch size, latent channels, time strides, base or super
// decoder), never from the file's name, which the reference reads instead.
#include <torch/types.h>

#include <cmath>

#include "vae/families.h"

namespace latent {
namespace {

using torch::Tensor;

struct Conv {
  Tensor w, b;
  int64_t stride = 1, padding = 0, groups = 1;
  Tensor operator()(const Tensor& x) const {
    return torch::conv2d(x, w, b, {stride, stride}, {padding, padding}, {1, 1}, groups);
  }
};

enum class Kind { conv, relu, clamp, mem, super_mem, tpool, tgrow, upsample, pixel_shuffle };

// One entry of the reference's nn.Sequential, at the same index (so state-dict keys and carried state line up).
struct Layer {
  Kind kind = Kind::relu;
  std::vector<Conv> convs;  // conv: 1; mem: 3 (+ a 1x1 skip); super_mem: conv.0, conv.1, conv.3; tpool/tgrow: 1
  int64_t stride = 1;       // tpool/tgrow: frames per group
};

// Frames travel as [B * T, C, H, W] with B known: the reference's layout, so its reshapes carry over.
struct Clip {
  Tensor x;
  int64_t batch = 1;
  int64_t frames() const { return x.size(0) / batch; }
};

class TaehvState : public VaeState {
 public:
  explicit TaehvState(size_t layers) : memory(layers) {}
  size_t bytes() const override {
    size_t n = 0;
    for (const auto& m : memory)
      if (m.defined()) n += m.nbytes();
    return n;
  }
  // Per layer: a memory block's last input [B, C, H, W]; a TPool's waiting frames [B, k, C, H, W] (k < s).
  std::vector<Tensor> memory;
  int64_t raw_frames = 0;  // decoder frames made so far, for the start-up trim
};

Tensor past_of(const Tensor& x5, const Tensor& last) {
  Tensor first = last.defined() ? last.unsqueeze(1) : torch::zeros_like(x5.slice(1, 0, 1));
  return torch::cat({first, x5.slice(1, 0, x5.size(1) - 1)}, 1);
}

Clip run(const std::vector<Layer>& layers, TaehvState& state, Clip c, size_t first = 0);

// Frame by frame through layers[first...], outputs joined in time: the reference's depth-first order, so a chunk
// holds one frame's activations at each resolution, not all of its frames' (4 per latent at full size).
Clip run_each_frame(const std::vector<Layer>& layers, TaehvState& state, const Clip& c, size_t first) {
  const int64_t t = c.frames();
  if (t <= 1 || first == layers.size()) return t == 0 ? c : run(layers, state, c, first);
  Tensor x5 = c.x.reshape({c.batch, t, c.x.size(1), c.x.size(2), c.x.size(3)});
  std::vector<Tensor> outs;
  for (int64_t j = 0; j < t; ++j) {
    Clip y = run(layers, state, {x5.select(1, j), c.batch}, first);
    if (y.frames() > 0) outs.push_back(y.x.reshape({c.batch, y.frames(), y.x.size(1), y.x.size(2), y.x.size(3)}));
  }
  if (outs.empty()) return {c.x.slice(0, 0, 0), c.batch};  // frames still waiting in a TPool
  Tensor all = torch::cat(outs, 1);
  return {all.reshape({all.size(0) * all.size(1), all.size(2), all.size(3), all.size(4)}), c.batch};
}

Clip run(const std::vector<Layer>& layers, TaehvState& state, Clip c, size_t first) {
  for (size_t i = first; i < layers.size(); ++i) {
    const Layer& l = layers[i];
    const int64_t t = c.frames();
    if (t == 0) return c;
    const int64_t ch = c.x.size(1), h = c.x.size(2), w = c.x.size(3);
    switch (l.kind) {
      case Kind::conv: c.x = l.convs[0](c.x); break;
      case Kind::relu: c.x = torch::relu(c.x); break;
      case Kind::clamp: c.x = torch::tanh(c.x / 3) * 3; break;
      case Kind::upsample: c.x = torch::upsample_nearest2d(c.x, {h * 2, w * 2}); break;
      case Kind::pixel_shuffle: c.x = torch::pixel_shuffle(c.x, 2); break;
      case Kind::mem:
      case Kind::super_mem: {
        Tensor x5 = c.x.reshape({c.batch, t, ch, h, w});
        Tensor past = past_of(x5, state.memory[i]).reshape({c.batch * t, ch, h, w});
        state.memory[i] = x5.select(1, t - 1).clone();
        Tensor both = torch::cat({c.x, past}, 1);
        if (l.kind == Kind::mem) {
          Tensor y = l.convs[2](torch::relu(l.convs[1](torch::relu(l.convs[0](both)))));
          c.x = torch::relu(y + (l.convs.size() > 3 ? l.convs[3](c.x) : c.x));
        } else {
          c.x = l.convs[2](torch::relu(l.convs[1](l.convs[0](both)))) + c.x;  // no ReLU after the sum
        }
        break;
      }
      case Kind::tpool: {
        Tensor x5 = c.x.reshape({c.batch, t, ch, h, w});
        Tensor all = state.memory[i].defined() ? torch::cat({state.memory[i], x5}, 1) : x5;
        const int64_t n = all.size(1) / l.stride * l.stride;
        state.memory[i] = n < all.size(1) ? all.slice(1, n).clone() : Tensor();
        // s consecutive frames side by side on channels, the older first.
        c.x = l.convs[0](all.slice(1, 0, n).reshape({c.batch * (n / l.stride), l.stride * ch, h, w}));
        break;
      }
      case Kind::tgrow: {
        // Output channel block k is the k-th new frame.
        c.x = l.convs[0](c.x).reshape({c.batch * t * l.stride, ch, h, w});
        if (l.stride > 1) return run_each_frame(layers, state, c, i + 1);
        break;
      }
    }
  }
  return c;
}

// ---- loading ------------------------------------------------------------------------------------------------

int64_t shape_of(const WeightSource& src, const std::string& key, int64_t dim, int64_t fallback) {
  auto it = src.tensors.find(key);
  return it != src.tensors.end() && it->second.dim() > dim ? it->second.size(dim) : fallback;
}

// A TPool's or TGrow's frames per group, from its 1x1 weight (the side that is s times the width); 1 where the
// shape says nothing usable, which the weight reader then reports as mis-shaped.
int64_t time_stride(const WeightSource& src, const std::string& key, int64_t dim, int64_t width) {
  const int64_t v = shape_of(src, key, dim, width);
  return v > 0 && v % width == 0 ? v / width : 1;
}

struct Builder {
  WeightReader& r;
  std::string prefix;
  std::vector<Layer> layers;

  std::string key(const std::string& rest) const { return prefix + std::to_string(layers.size()) + "." + rest; }
  Conv take(const std::string& name, int64_t out, int64_t in, int64_t k, bool bias, int64_t stride = 1,
            int64_t groups = 1) {
    Conv c;
    c.w = r.take(key(name + "weight"), {out, in / groups, k, k});
    if (bias) c.b = r.take(key(name + "bias"), {out});
    c.stride = stride;
    c.padding = k / 2;
    c.groups = groups;
    return c;
  }
  void conv(int64_t in, int64_t out, bool bias = true, int64_t stride = 1, int64_t k = 3) {
    layers.push_back({Kind::conv, {take("", out, in, k, bias, stride)}});
  }
  void plain(Kind kind) { layers.push_back({kind, {}}); }
  void mem(int64_t n) {
    layers.push_back(
        {Kind::mem,
         {take("conv.0.", n, 2 * n, 3, true), take("conv.2.", n, n, 3, true), take("conv.4.", n, n, 3, true)}});
  }
  void super_mem(int64_t n) {
    layers.push_back({Kind::super_mem,
                      {take("conv.0.", 2 * n, 2 * n, 7, false, 1, 2 * n), take("conv.1.", 4 * n, 2 * n, 1, true),
                       take("conv.3.", n, 4 * n, 1, false)}});
  }
  void tpool(int64_t n, int64_t s) { layers.push_back({Kind::tpool, {take("conv.", n, s * n, 1, false)}, s}); }
  void tgrow(int64_t n, int64_t s) { layers.push_back({Kind::tgrow, {take("conv.", s * n, n, 1, false)}, s}); }
};

struct Arch {
  int64_t patch = 1, latent_channels = 16;
  bool encoder = false, decoder = false, super = false;
};

Arch arch_of(const WeightSource& src) {
  const std::string where = src.weights.string();
  Arch a;
  a.encoder = src.tensors.count("encoder.0.weight") > 0;
  a.decoder = src.tensors.count("decoder.22.weight") > 0;
  a.super = src.tensors.count("decoder.0.weight") > 0;
  if (!a.encoder && !a.decoder)
    throw ModelError(where + ": a TAEHV file holds encoder.0.weight or decoder.22.weight; it has neither");
  auto patch_from = [&](int64_t rgb_channels, const char* key) {
    const int64_t p = std::llround(std::sqrt(double(rgb_channels) / 3));
    if (p < 1 || 3 * p * p != rgb_channels)
      throw ModelError(where + ": " + key + " has " + std::to_string(rgb_channels) +
                       " RGB channels; TAEHV's are 3 x patch^2 (3, 12, 48)");
    return p;
  };
  if (a.encoder) {
    a.patch = patch_from(shape_of(src, "encoder.0.weight", 1, 0), "encoder.0.weight");
    a.latent_channels = shape_of(src, "encoder.17.weight", 0, 0);
  }
  if (a.decoder) {
    const int64_t p = patch_from(shape_of(src, "decoder.22.weight", 0, 0), "decoder.22.weight");
    const int64_t c = shape_of(src, a.super ? "decoder.0.weight" : "decoder.1.weight", 1, 0);
    if (a.encoder && (p != a.patch || c != a.latent_channels)) {
      throw ModelError(where + ": the encoder is for patch " + std::to_string(a.patch) + " and " +
                       std::to_string(a.latent_channels) + " latent channels, the decoder for " + std::to_string(p) +
                       " and " + std::to_string(c));
    }
    a.patch = p;
    a.latent_channels = c;
  }
  if (a.latent_channels <= 0) throw ModelError(where + ": the latent channels cannot be read (encoder.17.weight)");
  return a;
}

// What the latent caps call the space: TAEHV makes and reads the latents of the VAE it was trained against, so
// that VAE's id, where the shape names one. A file can name its own in __metadata__ "model_id" (the Hunyuan and
// CogVideoX files share taew2_1's shapes and cannot be told apart from it otherwise).
std::string space_of(const WeightSource& src, const Arch& a) {
  auto it = src.metadata.find("model_id");
  if (it != src.metadata.end() && !it->second.empty()) return it->second;
  if (a.patch == 1 && a.latent_channels == 16) return "wan2.1";
  if (a.patch == 2 && a.latent_channels == 48) return "wan2.2";
  return "taehv-p" + std::to_string(a.patch) + "-c" + std::to_string(a.latent_channels);
}

class Taehv : public Vae {
 public:
  Taehv(const Arch& a, const WeightSource& src, const LoadOptions& opt)
      : Vae(VaeSpec{}, opt), arch_(a), where_(src.weights.string()) {
    WeightReader r(src, opt.device, opt.dtype);
    int64_t down = 1, up = 1;
    if (a.encoder) down = load_encoder(r, src);
    if (a.decoder) up = a.super ? load_super_decoder(r, src) : load_decoder(r, src);
    r.finish();
    if (a.encoder && a.decoder && down != up) {
      throw ModelError(where_ + ": the encoder pools " + std::to_string(down) +
                       " frames into a latent, the decoder "
                       "grows one into " +
                       std::to_string(up));
    }
    trim_ = (a.decoder ? up : down) - 1;
    spec_.family = "taehv";
    spec_.model_id = space_of(src, a);
    spec_.in_channels = 3;
    spec_.latent_channels = a.latent_channels;
    spec_.temporal_factor = a.decoder ? up : down;
    spec_.spatial_factor = 8 * a.patch;
    spec_.size_multiple = spec_.spatial_factor;
    const ChunkRules rules = taehv_chunks(spec_.temporal_factor);
    spec_.encode_chunks = rules.encode;
    spec_.decode_chunks = rules.decode;
    spec_.latent_shift = torch::zeros({a.latent_channels});
    spec_.latent_scale = torch::ones({a.latent_channels});
    spec_.clamp_output = true;
  }

 protected:
  std::unique_ptr<VaeState> make_encoder_state() const override {
    return std::make_unique<TaehvState>(encoder_.size());
  }
  std::unique_ptr<VaeState> make_decoder_state() const override {
    return std::make_unique<TaehvState>(decoder_.size());
  }

  Tensor encode_step(VaeState& state, const Tensor& x) const override {
    if (!arch_.encoder) throw ModelError(where_ + ": this TAEHV file holds only a decoder; it cannot encode");
    if (state.shard()) throw std::invalid_argument("TAEHV has no patch-parallel path");
    const int64_t b = x.size(0), t = x.size(2);
    Tensor f = (x * 0.5 + 0.5).permute({0, 2, 1, 3, 4}).reshape({b * t, 3, x.size(3), x.size(4)});
    if (arch_.patch > 1) f = torch::pixel_unshuffle(f, arch_.patch);
    Clip z = run_each_frame(encoder_, static_cast<TaehvState&>(state), {f, b}, 0);
    if (z.frames() == 0) {  // a chunk short of a whole group (the chunk rules give none)
      const int64_t sf = spec_.spatial_factor;
      return torch::zeros({b, 2 * spec_.latent_channels, 0, x.size(3) / sf, x.size(4) / sf}, x.options());
    }
    Tensor mean = z.x.reshape({b, z.frames(), z.x.size(1), z.x.size(2), z.x.size(3)}).permute({0, 2, 1, 3, 4});
    // The encoder is deterministic: a posterior without spread (exp(-15) as a standard deviation).
    return torch::cat({mean, torch::full_like(mean, -30.0)}, 1);
  }

  Tensor decode_step(VaeState& state, const Tensor& z) const override {
    if (!arch_.decoder) throw ModelError(where_ + ": this TAEHV file holds only an encoder; it cannot decode");
    if (state.shard()) throw std::invalid_argument("TAEHV has no patch-parallel path");
    auto& s = static_cast<TaehvState&>(state);
    const int64_t b = z.size(0), t = z.size(2);
    Tensor l = z.permute({0, 2, 1, 3, 4}).reshape({b * t, z.size(1), z.size(3), z.size(4)});
    Clip y = run_each_frame(decoder_, s, {l, b}, 0);
    Tensor f = arch_.patch > 1 ? torch::pixel_shuffle(y.x, arch_.patch) : y.x;
    const int64_t raw = y.frames();
    f = f.clamp(0, 1).reshape({b, raw, 3, f.size(2), f.size(3)});
    // The reference drops its first t_upscale - 1 frames, which align with no source frame.
    const int64_t skip = std::clamp<int64_t>(trim_ - s.raw_frames, 0, raw);
    s.raw_frames += raw;
    return (f.slice(1, skip) * 2 - 1).permute({0, 2, 1, 3, 4}).contiguous();
  }

 private:
  // encoder.<i> as taehv.py numbers them; returns the frames pooled into one latent.
  int64_t load_encoder(WeightReader& r, const WeightSource& src) {
    Builder e{r, "encoder.", {}};
    const int64_t n = 64, p = arch_.patch;
    int64_t down = 1;
    e.conv(3 * p * p, n);
    e.plain(Kind::relu);
    for (int level = 0; level < 3; ++level) {
      const int64_t s = time_stride(src, e.key("conv.weight"), 1, n);
      down *= s;
      e.tpool(n, s);
      e.conv(n, n, false, 2);
      for (int k = 0; k < 3; ++k) e.mem(n);
    }
    e.conv(n, arch_.latent_channels);
    encoder_ = std::move(e.layers);
    return down;
  }

  int64_t load_decoder(WeightReader& r, const WeightSource& src) {
    Builder d{r, "decoder.", {}};
    const int64_t nf[] = {256, 128, 64, 64};
    int64_t up = 1;
    d.plain(Kind::clamp);
    d.conv(arch_.latent_channels, nf[0]);
    d.plain(Kind::relu);
    for (int level = 0; level < 3; ++level) {
      for (int k = 0; k < 3; ++k) d.mem(nf[level]);
      d.plain(Kind::upsample);
      const int64_t s = time_stride(src, d.key("conv.weight"), 0, nf[level]);
      up *= s;
      d.tgrow(nf[level], s);
      d.conv(nf[level], nf[level + 1], false);
    }
    d.plain(Kind::relu);
    d.conv(nf[3], 3 * arch_.patch * arch_.patch);
    decoder_ = std::move(d.layers);
    return up;
  }

  int64_t load_super_decoder(WeightReader& r, const WeightSource& src) {
    Builder d{r, "decoder.", {}};
    const int64_t nf[] = {512, 256, 128, 64};
    int64_t up = 1;
    d.conv(arch_.latent_channels, nf[0], false, 1, 1);
    for (int level = 0; level < 3; ++level) {
      for (int k = 0; k < 3; ++k) d.super_mem(nf[level]);
      d.conv(nf[level], nf[level + 1] * 4);
      d.plain(Kind::relu);
      d.plain(Kind::pixel_shuffle);
      const int64_t s = time_stride(src, d.key("conv.weight"), 0, nf[level + 1]);
      up *= s;
      d.tgrow(nf[level + 1], s);
    }
    d.conv(nf[3], 3 * arch_.patch * arch_.patch);
    decoder_ = std::move(d.layers);
    return up;
  }

  Arch arch_;
  std::string where_;
  std::vector<Layer> encoder_, decoder_;
  int64_t trim_ = 3;
};

}  // namespace

std::shared_ptr<Vae> make_taehv(const WeightSource& src, const LoadOptions& opt) {
  return std::make_shared<Taehv>(arch_of(src), src, opt);
}

bool recognise_taehv(WeightSource& src) {
  return (src.tensors.count("encoder.0.weight") && src.tensors.count("encoder.17.weight")) ||
         src.tensors.count("decoder.22.weight");
}

// Every chunk a whole number of latents' worth of frames, the first included (no lone first frame: frames are
// pooled temporal_factor by temporal_factor), so a clip's tail is padded to one as the reference pads it. Any
// cut gives the same result; the decoder takes any number of latents.
ChunkRules taehv_chunks(int64_t temporal_factor) { return {{temporal_factor, temporal_factor, true}, {1, 1, true}}; }

}  // namespace latent
