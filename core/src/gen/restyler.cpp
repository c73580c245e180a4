// StreamDiffusionV2's streaming video-to-video in its default stream-batch mode (streamv2v/inference.py
// run_inference; models/wan/causal_stream_inference.py prepare and inference_stream), with one model call per step
// row: the rows of its batched call never meet (each has its own cache), so they are run one after another.
#include "latent/gen/restyler.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include "gen/models/causal_model.h"
#include "gen/models/sink_ring_cache.h"
#include "gen/sampling/schedule.h"

namespace latent {
namespace {

[[noreturn]] void bad_option(const std::string& what) { throw std::invalid_argument("restyle: " + what); }

void check_text(const DenoiserSpec& spec, const torch::Tensor& text) {
  if (!text.defined() || text.dim() != 3 || text.size(0) != 1 || text.size(2) != spec.text_dim ||
      !text.is_floating_point())
    bad_option("text must be prompt embeddings [1, L, " + std::to_string(spec.text_dim) + "]");
  if (!torch::isfinite(text).all().item<bool>()) bad_option("text holds NaN or infinite values");
}

// One step row: the frame it holds, its position and its cache.
struct Row {
  torch::Tensor x;     // [1, C, 1, h, w]
  int64_t frame = -1;  // the input frame it holds; -1 before the first reaches it
  int64_t start = 0;   // its RoPE frame
  SinkRingCache cache;
};

}  // namespace

struct Restyler::Impl {
  std::shared_ptr<const Denoiser> model_ref;
  const CausalModel& model;
  RestyleOptions o;
  std::vector<float> sigmas;  // of the step list
  torch::Tensor text;
  at::Generator gen;
  std::vector<torch::Tensor> first;  // the first chunk's frames, until there are two
  std::vector<Row> rows;             // empty until the first chunk is made
  double noise_scale = 0;
  int64_t first_step = 0;  // row 0's timestep
  int64_t in = 0, position = 0, calls = 0;

  Impl(std::shared_ptr<const Denoiser> m, RestyleOptions opt)
      : model_ref(std::move(m)), model(checked_model(*model_ref)), o(std::move(opt)) {
    const DenoiserSpec& spec = model_ref->spec();
    if (o.denoising_steps.empty()) bad_option("denoising_steps is empty");
    for (int64_t s : o.denoising_steps)
      if (s < 1 || s > 999) bad_option("denoising_steps must be in 1..999 (" + std::to_string(s) + " given)");
    if (!(o.strength > 0 && o.strength <= 1)) bad_option("strength must be in (0, 1]");
    if (!(o.shift > 0) || !std::isfinite(o.shift)) bad_option("shift must be a finite number > 0");
    if (o.kv_window < 2 || o.sink_frames < 0 || o.sink_frames >= o.kv_window)
      bad_option("kv_window " + std::to_string(o.kv_window) + " with " + std::to_string(o.sink_frames) +
                 " sink frames leaves no room for a frame (kv_window >= 2, sink_frames < kv_window)");
    if (!std::isfinite(o.sink_threshold)) bad_option("sink_threshold must be finite (-1 turns the refresh off)");
    check_text(spec, o.text);
    text = o.text.to(model_ref->device(), model_ref->dtype());
    for (int64_t s : o.denoising_steps) sigmas.push_back(flow_grid_sigma(o.shift, double(s)));
    reset();
  }

  static const CausalModel& checked_model(const Denoiser& m) {
    const CausalModel* c = causal_model(m);
    if (!c) bad_option("the model has no causal form (a Wan transformer is needed)");
    return *c;
  }

  void reset() {
    gen = at::make_generator<at::CPUGeneratorImpl>(o.seed);
    first.clear();
    rows.clear();
    noise_scale = o.strength;
    first_step = o.denoising_steps[0];
    in = position = 0;
  }

  // [1, C, n, h, w] drawn frame-major ([1, n, C, h, w]) as the reference draws.
  torch::Tensor draw(int64_t n, const torch::Tensor& like) {
    return torch::randn({1, n, like.size(1), like.size(3), like.size(4)}, gen, torch::kFloat)
        .permute({0, 2, 1, 3, 4})
        .to(like.device());
  }

  torch::Tensor noised(const torch::Tensor& latents) {
    return draw(latents.size(2), latents) * float(noise_scale) + latents * float(1.0 - noise_scale);
  }

  torch::Tensor x0(const torch::Tensor& x, const torch::Tensor& v, float sigma) const {
    return (x.to(torch::kDouble) - double(sigma) * v.to(torch::kDouble)).to(torch::kFloat);
  }

  torch::Tensor call(const torch::Tensor& x, double t, int64_t start, SinkRingCache& cache) {
    cache.begin_call(start, x.size(2));
    torch::Tensor v = model.predict_stored(x, torch::full({1, x.size(2)}, float(t)), text, start, cache);
    ++calls;
    return v;
  }

  // The first chunk, denoised together on one cache that every step row then starts from.
  std::vector<RestyledFrame> prepare() {
    const torch::Tensor latents = torch::cat(first, 2);
    const int64_t n = latents.size(2), steps = int64_t(sigmas.size());
    SinkRingCache cache(model.layers(), o.kv_window, o.sink_frames, o.sink_threshold);
    torch::Tensor x = noised(latents), out;
    for (int64_t k = 0; k < steps; ++k) {
      out = x0(x, call(x, double(o.denoising_steps[size_t(k)]), 0, cache), sigmas[size_t(k)]);
      if (k + 1 < steps) x = (1.0f - sigmas[size_t(k + 1)]) * out + sigmas[size_t(k + 1)] * draw(n, out);
    }
    for (int64_t k = 0; k < steps; ++k)
      rows.push_back(
          Row{torch::zeros_like(latents.narrow(2, 0, 1)), -1, n, k == 0 ? std::move(cache) : rows[0].cache.copy()});
    position = n;
    std::vector<RestyledFrame> done;
    for (int64_t f = 0; f < n; ++f) done.push_back({out.narrow(2, f, 1).clone(), f});
    first.clear();
    return done;
  }

  // One stream call: the rows move down one step, row 0 takes `x` (frame -1: a flush frame of noise after the
  // input ended), every row takes its step; the last row's frame is done.
  std::vector<RestyledFrame> stream(const torch::Tensor& x, int64_t frame) {
    const bool draining = frame < 0;
    const int64_t steps = int64_t(rows.size());
    for (int64_t k = steps - 1; k > 0; --k) {
      rows[size_t(k)].x = rows[size_t(k - 1)].x;
      rows[size_t(k)].frame = rows[size_t(k - 1)].frame;
      rows[size_t(k)].start = rows[size_t(k - 1)].start;
    }
    rows[0].x = x;
    rows[0].frame = frame;
    rows[0].start = position++;
    for (int64_t k = 0; k < steps; ++k) {
      Row& r = rows[size_t(k)];
      // Draining, a row without a frame of the stream has nothing to give (the reference runs it all the same).
      if (draining && r.frame < 0) continue;
      const double t = k == 0 ? double(first_step) : double(o.denoising_steps[size_t(k)]);
      const float sigma = k == 0 ? flow_grid_sigma(o.shift, t) : sigmas[size_t(k)];
      // Before the rows fill, the reference runs zeros at the next frame's position: their keys count in the
      // adaptive sink's test.
      r.x = x0(r.x, call(r.x, t, r.start, r.cache), sigma);
    }
    for (int64_t k = 0; k + 1 < steps; ++k) {
      Row& r = rows[size_t(k)];
      r.x = (1.0f - sigmas[size_t(k + 1)]) * r.x + sigmas[size_t(k + 1)] * draw(1, r.x);
    }
    std::vector<RestyledFrame> done;
    if (rows.back().frame >= 0) done.push_back({rows.back().x.clone(), rows.back().frame});
    return done;
  }
};

Restyler::Restyler(std::shared_ptr<const Denoiser> model, RestyleOptions options)
    : impl_(std::make_unique<Impl>(std::move(model), std::move(options))) {}
Restyler::~Restyler() = default;

std::vector<RestyledFrame> Restyler::push(const torch::Tensor& latent, std::optional<double> motion) {
  Impl& s = *impl_;
  torch::NoGradGuard no_grad;
  const DenoiserSpec& spec = s.model_ref->spec();
  torch::Tensor x = latent.defined() && latent.dim() == 3 ? latent.unsqueeze(0).unsqueeze(2) : latent;
  if (!x.defined() || x.dim() != 5 || x.size(0) != 1 || x.size(1) != spec.channels || x.size(2) != 1 ||
      !x.is_floating_point())
    throw std::invalid_argument("restyle: a latent frame must be [1, " + std::to_string(spec.channels) +
                                ", 1, h, w] or [" + std::to_string(spec.channels) + ", h, w]");
  const torch::Tensor& shape_of = !s.first.empty() ? s.first[0] : s.rows.empty() ? torch::Tensor() : s.rows[0].x;
  if (shape_of.defined() && (x.size(3) != shape_of.size(3) || x.size(4) != shape_of.size(4)))
    throw std::invalid_argument("restyle: a latent frame of " + std::to_string(x.size(3)) + "x" +
                                std::to_string(x.size(4)) + " in a stream of " + std::to_string(shape_of.size(3)) +
                                "x" + std::to_string(shape_of.size(4)));
  if (!torch::isfinite(x).all().item<bool>())
    throw std::invalid_argument("restyle: a latent frame holds NaN or infinite values");
  if (motion && !(*motion >= 0 && *motion <= 1)) throw std::invalid_argument("restyle: motion must be in [0, 1]");
  x = x.to(s.model_ref->device(), torch::kFloat);
  const int64_t frame = s.in;
  if (s.rows.empty()) {
    // The first chunk: StreamDiffusionV2's first 5 pixel frames, which the Wan VAE makes 2 latent frames.
    s.first.push_back(x);
    ++s.in;
    if (s.first.size() < 2) return {};
    try {
      return s.prepare();
    } catch (...) {
      s.reset();
      throw;
    }
  }
  // compute_noise_scale_and_step (streamv2v/inference.py), in doubles as there.
  s.noise_scale = (s.o.strength - 0.1 * motion.value_or(0.0)) * 0.9 + s.noise_scale * 0.1;
  // Held at 1 or more: below a strength of about 0.1 the reference's formula gives a negative timestep, which a
  // flow model was never trained on (its outputs there are meaningless); at and above it nothing changes.
  s.first_step = std::max<int64_t>(1, int64_t(1000 * s.noise_scale) - 100);
  ++s.in;
  try {
    return s.stream(s.noised(x), frame);
  } catch (...) {
    s.reset();  // the caches took part of the call
    throw;
  }
}

std::vector<RestyledFrame> Restyler::finish() {
  Impl& s = *impl_;
  torch::NoGradGuard no_grad;
  std::vector<RestyledFrame> out;
  if (s.rows.empty()) {
    if (!s.first.empty()) out = s.prepare();
  } else {
    // The reference's flush: frames of pure noise drawn where the input would be, at the current first step.
    for (size_t k = 1; k < s.rows.size(); ++k)
      for (RestyledFrame& f : s.stream(s.draw(1, s.rows[0].x), -1)) out.push_back(std::move(f));
  }
  s.reset();
  return out;
}

void Restyler::reset() { impl_->reset(); }

void Restyler::set_text(const torch::Tensor& text) {
  check_text(impl_->model_ref->spec(), text);
  impl_->text = text.to(impl_->model_ref->device(), impl_->model_ref->dtype());
}

int64_t Restyler::frames_in() const { return impl_->in; }
int64_t Restyler::latency_frames() const { return int64_t(impl_->o.denoising_steps.size()) - 1; }
size_t Restyler::cache_bytes() const {
  size_t b = 0;
  for (const Row& r : impl_->rows) b += r.cache.bytes();
  return b;
}
int64_t Restyler::model_calls() const { return impl_->calls; }

}  // namespace latent
