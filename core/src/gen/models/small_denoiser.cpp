// latent-gen-small: the native architecture of gst-latent's default generator, a small factorised video denoiser
// (per-frame 2-D residual blocks with FiLM from each frame's noise level, causal temporal convs, one U-Net skip per
// level). models/recipes/gen_small_model.py is its PyTorch definition and says why each piece is there; this file
// runs the same network from the .safetensors file that script's save() writes, and
// tests/core/gen/test_small_denoiser.cpp compares the two.
//
// Activations are kept frame-major, [B*T, C, H, W], from the stem to the output: every 2-D layer and every
// GroupNorm then works on frames as a batch with no copies, and only the temporal convs look across frames.
//
// Output frame t depends on input frames <= t only (per-frame layers, causal temporal convs with zero padding in
// front). A run over a whole window is therefore already what a frame-by-frame run with carried caches would give,
// so this version carries no cache between calls: callers that slide windows re-run the overlap.
#include <torch/types.h>

#include <cmath>
#include <optional>
#include <set>

#include "gen/models/backends.h"
#include "io/json.h"
#include "io/numbers.h"
#include "memory/residency.h"
#include "nn/layers.h"
#include "nn/winograd.h"

namespace latent {
namespace {

using namespace layers;
using torch::Tensor;

constexpr const char* kArchitecture = "latent-gen-small";
// The sinusoid's longest period, in timestep units (gen_small_model.MAX_PERIOD).
constexpr double kMaxPeriod = 10000.0;
// torch.nn.GroupNorm's default.
constexpr double kNormEps = 1e-5;

struct SmallConfig {
  int64_t in_channels = 0;
  std::vector<int64_t> widths;
  int64_t blocks_per_level = 0;
  int64_t temporal_kernel = 0;
  int64_t groups = 0;
  int64_t freq_dim = 0;
  int64_t embed_dim = 0;
};

// Bounds far above any model this architecture is meant for, and low enough that no product of them overflows
// or asks for an absurd allocation before the tensor shapes are checked against the file.
constexpr int64_t kMaxChannels = 8192;
constexpr int64_t kMaxLevels = 4;
constexpr int64_t kMaxBlocks = 32;
constexpr int64_t kMaxTemporalKernel = 16;
constexpr int64_t kMaxWindow = 4096;

// Reads the config object with every key required and every number bounded: the error names the key.
class ConfigReader {
 public:
  ConfigReader(const json::Value& obj, std::string where) : obj_(obj), where_(std::move(where)) {}

  int64_t integer(const std::string& key, int64_t lo, int64_t hi) { return checked(key, get(key), lo, hi); }

  std::vector<int64_t> integers(const std::string& key, size_t min_len, size_t max_len, int64_t lo, int64_t hi) {
    const json::Value& v = get(key);
    if (!v.is_array() || v.as_array().size() < min_len || v.as_array().size() > max_len)
      fail(key, "is not a list of " + std::to_string(min_len) + " to " + std::to_string(max_len) + " integers");
    std::vector<int64_t> out;
    for (const auto& e : v.as_array()) out.push_back(checked(key, e, lo, hi));
    return out;
  }

  // Keys this version does not know change the network in ways it would silently ignore: refuse them.
  void no_other_keys() const {
    for (const auto& [k, v] : obj_.as_object())
      if (!seen_.count(k))
        throw ModelError(where_ + ": " + kArchitecture + " config has the unknown key \"" + k +
                         "\" (a newer version of the architecture?)");
  }

  [[noreturn]] void fail(const std::string& key, const std::string& what) const {
    throw ModelError(where_ + ": " + kArchitecture + " config \"" + key + "\" " + what);
  }

 private:
  const json::Value& get(const std::string& key) {
    const json::Value* v = obj_.find(key);
    if (!v) throw ModelError(where_ + ": " + kArchitecture + " config has no \"" + key + "\"");
    seen_.insert(key);
    return *v;
  }

  int64_t checked(const std::string& key, const json::Value& v, int64_t lo, int64_t hi) const {
    const std::string range = "[" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
    if (!v.is_number()) fail(key, "is a JSON " + std::string(v.kind_name()) + ", not an integer in " + range);
    int64_t i = 0;
    try {
      i = v.as_int64();
    } catch (const json::Error&) {
      fail(key, "= " + v.number_text() + " is not an integer in " + range);
    }
    if (i < lo || i > hi) fail(key, "= " + std::to_string(i) + " is out of range " + range);
    return i;
  }

  const json::Value& obj_;
  std::string where_;
  std::set<std::string> seen_;
};

SmallConfig parse_config(const std::string& text, const std::string& where) {
  json::Value v;
  try {
    v = json::parse(text);
  } catch (const json::Error& e) {
    throw ModelError(where + ": " + kArchitecture + " config is not valid JSON: " + e.what());
  }
  if (!v.is_object()) throw ModelError(where + ": " + kArchitecture + " config is not a JSON object");
  ConfigReader r(v, where);
  SmallConfig c;
  c.in_channels = r.integer("in_channels", 1, kMaxChannels);
  c.widths = r.integers("widths", 1, size_t(kMaxLevels), 1, kMaxChannels);
  c.blocks_per_level = r.integer("blocks_per_level", 1, kMaxBlocks);
  c.temporal_kernel = r.integer("temporal_kernel", 1, kMaxTemporalKernel);
  c.groups = r.integer("groups", 1, kMaxChannels);
  c.freq_dim = r.integer("freq_dim", 2, kMaxChannels);
  c.embed_dim = r.integer("embed_dim", 1, kMaxChannels);
  r.no_other_keys();
  for (int64_t w : c.widths)
    if (w % c.groups != 0)
      r.fail("widths", "entry " + std::to_string(w) + " is not a multiple of groups = " + std::to_string(c.groups));
  if (c.freq_dim % 2 != 0) r.fail("freq_dim", "= " + std::to_string(c.freq_dim) + " is not even");
  return c;
}

// ---- metadata -----------------------------------------------------------------------------------------------

class MetadataReader {
 public:
  explicit MetadataReader(const WeightSource& src) : src_(src) {}

  const std::string& text(const std::string& key) const {
    auto it = src_.metadata.find(key);
    if (it == src_.metadata.end())
      throw ModelError(src_.weights.string() + ": " + kArchitecture + " weights lack __metadata__ \"" + key + "\"");
    return it->second;
  }
  int64_t integer(const std::string& key, int64_t lo, int64_t hi) const {
    const std::string& s = text(key);
    if (auto v = bounded_integer(s, lo, hi)) return *v;
    fail(key, "\"" + s + "\" is not an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
  }
  double number(const std::string& key, double lo, double hi) const {
    const std::string& s = text(key);
    if (auto v = bounded_number(s, lo, hi)) return *v;
    fail(key, "\"" + s + "\" is not a number in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
  }
  template <class F>
  auto parsed(const std::string& key, F parse) const {
    try {
      return parse(text(key));
    } catch (const SamplerError& e) {
      fail(key, e.what());
    }
  }
  [[noreturn]] void fail(const std::string& key, const std::string& what) const {
    throw ModelError(src_.weights.string() + ": __metadata__ \"" + key + "\": " + what);
  }

 private:
  const WeightSource& src_;
};

DenoiserSpec spec_from(const WeightSource& src, const SmallConfig& cfg) {
  MetadataReader md(src);
  DenoiserSpec s;
  s.backend = kArchitecture;
  s.prediction = md.parsed("prediction", parse_prediction);
  s.latent_space = md.text("latent_space");
  if (s.latent_space.empty()) md.fail("latent_space", "is empty: it must name the VAE whose latents it takes");
  s.channels = cfg.in_channels;
  s.min_frames = 1;
  s.window = md.integer("window", 1, kMaxWindow);
  s.height = 0;
  s.width = 0;
  s.size_multiple = int64_t(1) << (cfg.widths.size() - 1);
  s.sampler.kind = md.parsed("sampler", parse_sampler_kind);
  s.sampler.steps = md.integer("steps", 1, s.sampler.train_timesteps);
  s.sampler.shift = md.number("shift", 1e-3, 1e3);
  // No text: classifier-free guidance has nothing to drop.
  s.guidance = 1.0;
  try {
    Sampler check(s.sampler, s.prediction);  // a sampler that cannot run this prediction fails here, not mid-stream
  } catch (const SamplerError& e) {
    md.fail("sampler", e.what());
  }
  read_optional_contract(
      s,
      [&](const std::string& key) -> const std::string* {
        auto it = src.metadata.find(key);
        return it == src.metadata.end() ? nullptr : &it->second;
      },
      src.weights.string(), "");
  return s;
}

// ---- layers -------------------------------------------------------------------------------------------------

struct Linear {
  Tensor w, b;
  static Linear load(WeightReader& r, const std::string& p, int64_t in, int64_t out) {
    return {r.take(p + ".weight", {out, in}), r.take(p + ".bias", {out})};
  }
  Tensor forward(const Tensor& x) const { return torch::addmm(b, x, w.t()); }
};

struct GroupNorm {
  Tensor w, b;  // undefined where the norm has no affine (FiLM supplies it)
  int64_t groups = 1;
  static GroupNorm load(WeightReader& r, const std::string& p, int64_t c, int64_t groups) {
    return {r.take(p + ".weight", {c}), r.take(p + ".bias", {c}), groups};
  }
  // Statistics per frame: the input is [frames, C, H, W], so no frame sees another's.
  Tensor forward(const Tensor& x) const { return torch::group_norm(x, groups, w, b, kNormEps); }
};

// [N, C, H, W] by a 3x3 (or 1x1) kernel, through Winograd where the project's policy picks it.
Tensor conv2d(const Tensor& x, const Conv& c, int64_t stride, int64_t padding) {
  if (c.wino.defined()) return winograd_conv3d(x.unsqueeze(2), c.wino, c.b).squeeze(2);
  return conv_direct(x, c.w, c.b, {stride, stride}, {padding, padding});
}

Conv load_conv3x3(WeightReader& r, const std::string& p, int64_t cin, int64_t cout) {
  Conv c = Conv::load(r, p, {cout, cin, 3, 3});
  c.prefer_winograd();
  return c;
}

Tensor upsample2x(const Tensor& x) {  // nearest, [N, C, H, W]: pure repetition, exact in any dtype
  auto s = x.sizes();
  return x.unsqueeze(3).unsqueeze(5).expand({s[0], s[1], s[2], 2, s[3], 2}).reshape({s[0], s[1], 2 * s[2], 2 * s[3]});
}

// A causal convolution over time with kernel [k, 1, 1]: for each tap a batch of per-frame matrix products,
// accumulated in place into the output frames that tap reaches. The zero frames in front of the clip are never
// made (a tap that looks s frames back just skips the first s outputs), and in the frame-major layout no
// transpose of the activations is needed, where a conv3d would need two.
struct TemporalConv {
  std::vector<Tensor> taps;  // k kernels [Co, Ci]; taps[k-1] weighs the frame itself, taps[j] the one k-1-j back
  Tensor b;                  // [Co, 1]

  static TemporalConv load(WeightReader& r, const std::string& p, int64_t c, int64_t k) {
    TemporalConv t;
    Tensor w = r.take(p + ".weight", {c, c, k, 1, 1});
    Tensor b = r.take(p + ".bias", {c});
    if (w.defined())
      for (int64_t j = 0; j < k; ++j) t.taps.push_back(w.select(2, j).reshape({c, c}).contiguous());
    if (b.defined()) t.b = b.reshape({c, 1});
    return t;
  }

  // x [B*T, C, H, W] frame-major. Returns conv(x) + bias, same layout.
  Tensor forward(const Tensor& x, int64_t batch) const {
    const int64_t n = x.size(0), c = x.size(1), h = x.size(2), w = x.size(3), t = n / batch;
    const int64_t k = int64_t(taps.size()), co = taps.back().size(0);
    const Tensor frames = x.reshape({batch, t, c, h * w});
    Tensor y = torch::matmul(taps.back(), frames).add_(b);  // [B, T, Co, HW]
    for (int64_t j = 0; j + 1 < k; ++j) {
      const int64_t back = k - 1 - j;
      if (back >= t) continue;
      for (int64_t i = 0; i < batch; ++i)
        y.select(0, i)
            .narrow(0, back, t - back)
            .baddbmm_(taps[size_t(j)].expand({t - back, co, c}), frames.select(0, i).narrow(0, 0, t - back));
    }
    return y.view({n, co, h, w});
  }
};

struct Block {
  GroupNorm norm1, norm2, tnorm;
  Conv conv1, conv2;
  std::optional<Conv> skip;
  Linear film;
  TemporalConv tconv;
  int64_t cout = 0;

  static Block load(WeightReader& r, const std::string& p, int64_t cin, int64_t cout, const SmallConfig& cfg) {
    Block b;
    b.cout = cout;
    b.norm1 = GroupNorm::load(r, p + ".norm1", cin, cfg.groups);
    b.conv1 = load_conv3x3(r, p + ".conv1", cin, cout);
    b.film = Linear::load(r, p + ".film", cfg.embed_dim, 2 * cout);
    b.norm2 = GroupNorm{Tensor(), Tensor(), cfg.groups};
    b.conv2 = load_conv3x3(r, p + ".conv2", cout, cout);
    if (cin != cout) b.skip = Conv::load(r, p + ".skip", {cout, cin, 1, 1});
    b.tnorm = GroupNorm::load(r, p + ".tnorm", cout, cfg.groups);
    b.tconv = TemporalConv::load(r, p + ".tconv", cout, cfg.temporal_kernel);
    return b;
  }

  // x [B*T, Cin, H, W]; emb [B*T, E], SiLU already applied.
  Tensor forward(const Tensor& x, const Tensor& emb, int64_t batch) const {
    Tensor h = conv2d(silu_owned(norm1.forward(x)), conv1, 1, 1);
    Tensor ss = film.forward(emb);  // [B*T, 2*Co]: scale then shift
    Tensor scale = ss.narrow(1, 0, cout).add(1).reshape({-1, cout, 1, 1});
    Tensor shift = ss.narrow(1, cout, cout).reshape({-1, cout, 1, 1});
    h = torch::addcmul(shift, norm2.forward(h), scale);
    h = conv2d(silu_owned(h), conv2, 1, 1);
    h.add_(skip ? conv_direct(x, skip->w, skip->b, {1, 1}, {0, 0}) : x);
    return tconv.forward(silu_owned(tnorm.forward(h)), batch).add_(h);
  }
};

struct Level {
  std::vector<Block> blocks;
  std::optional<Conv> resample;  // down: 3x3 stride 2; up: 3x3 after nearest x2
};

class SmallDenoiser : public Denoiser {
 public:
  SmallDenoiser(const SmallConfig& cfg, DenoiserSpec spec, const WeightSource& src, const LoadOptions& opt)
      : Denoiser(std::move(spec), opt) {
    WeightReader r(src, opt.device, opt.dtype);
    const auto& w = cfg.widths;
    const size_t levels = w.size();
    time_in_ = Linear::load(r, "time_in", cfg.freq_dim, cfg.embed_dim);
    time_out_ = Linear::load(r, "time_out", cfg.embed_dim, cfg.embed_dim);
    stem_ = load_conv3x3(r, "stem", cfg.in_channels, w[0]);
    for (size_t i = 0; i < levels; ++i) {
      const std::string p = "down." + std::to_string(i);
      Level lvl;
      for (int64_t j = 0; j < cfg.blocks_per_level; ++j)
        lvl.blocks.push_back(
            Block::load(r, p + ".blocks." + std::to_string(j), j == 0 ? w[i == 0 ? 0 : i - 1] : w[i], w[i], cfg));
      // Stride 2: not a Winograd candidate.
      if (i + 1 < levels) lvl.resample = Conv::load(r, p + ".downsample", {w[i], w[i], 3, 3});
      down_.push_back(std::move(lvl));
    }
    for (size_t i = 0; i + 1 < levels; ++i) {
      const std::string p = "up." + std::to_string(i);
      Level lvl;
      lvl.resample = load_conv3x3(r, p + ".upsample", w[i + 1], w[i]);
      for (int64_t j = 0; j < cfg.blocks_per_level; ++j)
        lvl.blocks.push_back(Block::load(r, p + ".blocks." + std::to_string(j), j == 0 ? 2 * w[i] : w[i], w[i], cfg));
      up_.push_back(std::move(lvl));
    }
    norm_out_ = GroupNorm::load(r, "norm_out", w[0], cfg.groups);
    conv_out_ = load_conv3x3(r, "conv_out", w[0], cfg.in_channels);
    r.finish();
    // Timesteps arrive as float32 on the model's device; so are the sinusoid's frequencies.
    const int64_t half = cfg.freq_dim / 2;
    freqs_ = torch::exp(torch::arange(half, torch::TensorOptions().dtype(torch::kFloat)) *
                        float(-std::log(kMaxPeriod) / double(half)))
                 .to(opt.device);
  }

 protected:
  Tensor run(const Tensor& x, const Tensor& timesteps, const Tensor&) const override {
    const int64_t b = x.size(0), c = x.size(1), t = x.size(2), h = x.size(3), w = x.size(4);
    const int64_t n = b * t;
    const Tensor emb = embed(timesteps.reshape({n}));
    Tensor y = conv2d(x.permute({0, 2, 1, 3, 4}).reshape({n, c, h, w}), stem_, 1, 1);
    std::vector<Tensor> skips;
    for (const Level& lvl : down_) {
      for (const Block& blk : lvl.blocks) y = blk.forward(y, emb, b);
      if (lvl.resample) {
        skips.push_back(y);
        y = conv2d(y, *lvl.resample, 2, 1);
      }
    }
    for (auto it = up_.rbegin(); it != up_.rend(); ++it) {
      y = torch::cat({conv2d(upsample2x(y), *it->resample, 1, 1), skips.back()}, 1);
      skips.pop_back();
      for (const Block& blk : it->blocks) y = blk.forward(y, emb, b);
    }
    y = conv2d(silu_owned(norm_out_.forward(y)), conv_out_, 1, 1);
    return y.reshape({b, t, c, h, w}).permute({0, 2, 1, 3, 4}).contiguous();
  }

 private:
  // [N] float32 timesteps -> [N, E] in the compute dtype, SiLU applied (every FiLM layer takes it so).
  Tensor embed(const Tensor& ts) const {
    // The sinusoid in float32 whatever the compute dtype: half precision cannot resolve t * freq near t = 1000.
    const Tensor args = ts.to(torch::kFloat).unsqueeze(1) * freqs_.unsqueeze(0);
    Tensor e = torch::cat({torch::cos(args), torch::sin(args)}, 1).to(dtype());
    e = time_out_.forward(silu_owned(time_in_.forward(e)));
    return silu_owned(std::move(e));
  }

  Linear time_in_, time_out_;
  Conv stem_, conv_out_;
  GroupNorm norm_out_;
  std::vector<Level> down_, up_;
  Tensor freqs_;
};

}  // namespace

bool is_small_denoiser(const WeightSource& src) {
  auto it = src.metadata.find("architecture");
  return it != src.metadata.end() && it->second == kArchitecture;
}

std::shared_ptr<Denoiser> make_small_denoiser(const WeightSource& src, const LoadOptions& opt) {
  const std::string where = src.weights.string();
  // The config that belongs to the weights is the one written beside them in __metadata__; a config.json that
  // happens to lie in the same folder describes something else.
  std::string text;
  if (auto it = src.metadata.find("config"); it != src.metadata.end())
    text = it->second;
  else if (src.config)
    text = src.config->text;
  else
    throw ModelError(where + ": " + kArchitecture + " weights lack their config (__metadata__ \"config\")");
  const SmallConfig cfg = parse_config(text, where);
  auto model = std::make_shared<SmallDenoiser>(cfg, spec_from(src, cfg), src, opt);
  settle_residency(src);
  return model;
}

}  // namespace latent
