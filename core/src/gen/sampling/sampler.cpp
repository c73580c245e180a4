// The samplers, ported from diffusers 0.42 operation by operation: every quantity has the dtype diffusers gives it
// (fp32 flow sigmas, float64 DDIM and DPM alpha_bars, fp32 UniPC coefficients) and is rounded where diffusers rounds
// it, so trajectories agree to the last bit on the CPU rather than merely to the formula. Where diffusers computes a
// value with a LibTorch kernel (log, expm1, linspace, cumprod, a 2x2 solve), the same kernel computes it here.
#include "latent/gen/sampler.h"

#include <torch/types.h>

#include <algorithm>
#include <cmath>
#include <sstream>

namespace latent {
namespace {

constexpr int64_t kUniPcOrder = 2;

[[noreturn]] void fail(const std::string& what) { throw SamplerError("sampler: " + what); }

bool is_flow(SamplerKind kind) { return kind == SamplerKind::euler || kind == SamplerKind::unipc; }

// A product rounded before it is used: diffusers rounds each operation, so a compiler must not fuse this one into a
// multiply-add with the next.
double rounded_product(double a, double b) {
  volatile double p = a * b;
  return p;
}

torch::Tensor cpu_f32(double v) { return torch::scalar_tensor(v, torch::TensorOptions().dtype(torch::kFloat)); }
torch::Tensor cpu_f64(double v) { return torch::scalar_tensor(v, torch::TensorOptions().dtype(torch::kDouble)); }

// diffusers' `x ** 0.5` on a CPU tensor. LibTorch's CPU square root is not correctly rounded (it differs from
// std::sqrt in about 1% of doubles and 20% of floats), so it takes the same kernel here.
double sqrt_f64(double v) {
  return torch::pow(torch::scalar_tensor(v, torch::TensorOptions().dtype(torch::kDouble)), 0.5).item<double>();
}
float sqrt_f32(float v) { return torch::pow(cpu_f32(v), 0.5).item<float>(); }
std::vector<double> to_vector(const torch::Tensor& t) {
  torch::Tensor c = t.to(torch::kDouble).contiguous();
  return std::vector<double>(c.data_ptr<double>(), c.data_ptr<double>() + c.numel());
}

// numpy.linspace(start, stop, num) in float64: i * step + start with two roundings, the last entry set to stop.
// torch.linspace computes the upper half from the end instead, so it would not reproduce diffusers' numpy values.
torch::Tensor numpy_linspace(double start, double stop, int64_t num) {
  const auto f64 = torch::TensorOptions().dtype(torch::kDouble);
  torch::Tensor y = torch::arange(num, f64);
  const int64_t div = num - 1;
  const double delta = stop - start;
  if (div > 0) {
    const double step = delta / static_cast<double>(div);
    y = step == 0 ? y / div * delta : y * step;
  } else {
    y = y * delta;
  }
  y = y + start;
  if (num > 1) y[num - 1] = stop;
  return y;
}

// s * sigma / (1 + (s - 1) * sigma) elementwise, in the tensor's dtype.
torch::Tensor flow_shift(const torch::Tensor& sigma, double s) { return s * sigma / (1 + (s - 1) * sigma); }

// Flow sigmas and timesteps of FlowMatchEulerDiscreteScheduler(shift).set_timesteps(steps). The training sigmas
// are shifted in fp32 at construction; set_timesteps spaces the inference ones between the extremes in float64,
// shifts them a second time, and rounds to fp32 only at the end.
void euler_schedule(const SamplerOptions& o, std::vector<double>& timesteps, std::vector<double>& sigmas) {
  const double train = static_cast<double>(o.train_timesteps);
  torch::Tensor extremes = torch::tensor({train, 1.0}, torch::TensorOptions().dtype(torch::kFloat));
  extremes = flow_shift(extremes / o.train_timesteps, o.shift);
  const double sigma_max = extremes[0].item<double>(), sigma_min = extremes[1].item<double>();
  torch::Tensor s = numpy_linspace(sigma_max * train, sigma_min * train, o.steps) / o.train_timesteps;
  s = flow_shift(s, o.shift).to(torch::kFloat);
  timesteps = to_vector(s * o.train_timesteps);
  sigmas = to_vector(s);
  sigmas.push_back(0.0);
}

// UniPCMultistepScheduler(use_flow_sigmas, flow_shift).set_timesteps(steps): float64 sigmas from 1 to 1/train,
// shifted, the first pulled 1e-6 below 1 (where log(1 - sigma) would be -inf), then rounded to fp32. The
// timesteps come from the float64 sigmas, truncated to integers.
void unipc_schedule(const SamplerOptions& o, std::vector<double>& timesteps, std::vector<double>& sigmas) {
  const double train = static_cast<double>(o.train_timesteps);
  torch::Tensor s = numpy_linspace(1.0, 1.0 / train, o.steps + 1).narrow(0, 0, o.steps);
  s = flow_shift(s, o.shift);
  const double eps = 1e-6;
  const double first = s[0].item<double>();
  if (std::fabs(first - 1) < eps) s[0] = first - eps;
  timesteps = to_vector((s * train).to(torch::kLong));
  sigmas = to_vector(s.to(torch::kFloat));
  sigmas.push_back(0.0);
}

// CogVideoXDDIMScheduler's alpha_bar table in float64: scaled-linear betas, the SNR shift
// alpha_bar / (s + (1 - s) * alpha_bar), then the zero-terminal-SNR rescale of sqrt(alpha_bar).
torch::Tensor ddim_alpha_bars(const SamplerOptions& o) {
  const auto f64 = torch::TensorOptions().dtype(torch::kDouble);
  // Python rounds beta_start ** 0.5 correctly, as std::sqrt does.
  torch::Tensor betas = torch::pow(torch::linspace(std::sqrt(0.00085), std::sqrt(0.012), o.train_timesteps, f64), 2);
  torch::Tensor ac = torch::cumprod(1.0 - betas, 0);
  const double s = o.snr_shift_scale;
  ac = ac / (s + (1 - s) * ac);
  torch::Tensor root = ac.sqrt();
  torch::Tensor first = root[0].clone(), last = root[-1].clone();
  root -= last;
  root *= first / (first - last);
  return torch::pow(root, 2);
}

// Trailing spacing: numpy.round(numpy.arange(train, 0, -train / steps)) - 1. numpy's arange fills start + i * d
// with d = (start - step) - start. For some counts (61, 103, 121, ...) its length rounds up to steps + 1, the extra
// entry being -1, which diffusers then runs as one more step at alpha_bar[-1]; only the first `steps` are taken.
std::vector<int64_t> trailing_timesteps(int64_t train, int64_t steps) {
  const double start = static_cast<double>(train);
  const double d = (start + -(start / static_cast<double>(steps))) - start;
  torch::Tensor t = torch::arange(steps, torch::TensorOptions().dtype(torch::kDouble)) * d + start;
  t = torch::round(t).to(torch::kLong) - 1;
  std::vector<int64_t> out(t.data_ptr<int64_t>(), t.data_ptr<int64_t>() + steps);
  return out;
}

// alpha, sigma and lambda = log(alpha) - log(sigma) at a flow sigma, as UniPC computes them: fp32 0-d tensors on
// the CPU (diffusers indexes its fp32 sigma tensor and does the scalar arithmetic with tensor operations).
struct FlowPoint {
  torch::Tensor alpha, sigma, lambda;
};

FlowPoint flow_point(double sigma) {
  FlowPoint p;
  p.sigma = cpu_f32(sigma);
  p.alpha = torch::rsub(p.sigma, 1);
  p.lambda = torch::log(p.alpha) - torch::log(p.sigma);
  return p;
}

void check_pair(const torch::Tensor& x, const torch::Tensor& model_output) {
  if (!x.defined() || !model_output.defined()) fail("undefined latents or model output");
  if (x.sizes() != model_output.sizes()) {
    std::ostringstream s;
    s << "latents " << x.sizes() << " and model output " << model_output.sizes() << " differ in shape";
    fail(s.str());
  }
}

}  // namespace

SamplerKind parse_sampler_kind(const std::string& name) {
  if (name == "euler") return SamplerKind::euler;
  if (name == "unipc") return SamplerKind::unipc;
  if (name == "ddim") return SamplerKind::ddim;
  if (name == "dpm") return SamplerKind::dpm;
  fail("unknown sampler '" + name + "' (euler, unipc, ddim, dpm)");
}

const char* sampler_kind_name(SamplerKind kind) {
  switch (kind) {
    case SamplerKind::euler: return "euler";
    case SamplerKind::unipc: return "unipc";
    case SamplerKind::ddim: return "ddim";
    case SamplerKind::dpm: return "dpm";
  }
  return "?";
}

Prediction parse_prediction(const std::string& name) {
  if (name == "flow") return Prediction::flow;
  if (name == "v") return Prediction::v;
  if (name == "epsilon") return Prediction::epsilon;
  fail("unknown prediction '" + name + "' (flow, v, epsilon)");
}

const char* prediction_name(Prediction prediction) {
  switch (prediction) {
    case Prediction::flow: return "flow";
    case Prediction::v: return "v";
    case Prediction::epsilon: return "epsilon";
  }
  return "?";
}

size_t SamplerHistory::bytes() const {
  size_t total = last_sample.defined() ? last_sample.nbytes() : 0;
  for (const auto& t : outputs) total += t.defined() ? t.nbytes() : 0;
  return total;
}

void SamplerHistory::clear() { *this = SamplerHistory{}; }

Sampler::Sampler(const SamplerOptions& options, Prediction prediction) : options_(options), prediction_(prediction) {
  const auto& o = options_;
  if (o.train_timesteps < 1) fail("train_timesteps must be at least 1, got " + std::to_string(o.train_timesteps));
  if (o.steps < 1 || o.steps > o.train_timesteps)
    fail("steps must be in [1, " + std::to_string(o.train_timesteps) + "], got " + std::to_string(o.steps));
  if (!(o.shift > 0) || !std::isfinite(o.shift)) fail("shift must be positive, got " + std::to_string(o.shift));
  if (!(o.snr_shift_scale > 0) || !std::isfinite(o.snr_shift_scale))
    fail("snr_shift_scale must be positive, got " + std::to_string(o.snr_shift_scale));
  if (is_flow(o.kind) != (prediction == Prediction::flow))
    fail(std::string(sampler_kind_name(o.kind)) + " cannot take " + prediction_name(prediction) + " prediction (" +
         (is_flow(o.kind) ? "it needs flow" : "it takes v or epsilon") + ")");

  switch (o.kind) {
    case SamplerKind::euler: euler_schedule(o, timesteps_, sigmas_); break;
    case SamplerKind::unipc:
      unipc_schedule(o, timesteps_, sigmas_);
      unipc_ = unipc_intervals(sigmas_);
      break;
    case SamplerKind::ddim:
    case SamplerKind::dpm: {
      const std::vector<double> table = to_vector(ddim_alpha_bars(o));
      const int64_t stride = o.train_timesteps / o.steps;
      for (int64_t t : trailing_timesteps(o.train_timesteps, o.steps)) {
        const double ab = table[static_cast<size_t>(t)];
        timesteps_.push_back(static_cast<double>(t));
        alpha_bars_.push_back(ab);
        sigmas_.push_back(sqrt_f64(1.0 - ab));
        // set_alpha_to_one: below timestep 0 the step lands on clean latents.
        target_alpha_bars_.push_back(t - stride >= 0 ? table[static_cast<size_t>(t - stride)] : 1.0);
        lands_clean_.push_back(t - stride < 0);
      }
      // Step `steps` is the clean end. diffusers' last step lands on alpha_bar[0] instead of 1 when
      // train / steps has a fraction of at least 1/2 (e.g. 6 steps: 166 - 166); step() does as diffusers does.
      alpha_bars_.push_back(1.0);
      sigmas_.push_back(0.0);
      break;
    }
  }
}

// diffusers' multistep_uni_p_bh_update / multistep_uni_c_bh_update coefficients for each interval, each scalar
// operation in its order. The corrector's weights solve R rhos = b, R's rows the powers of (rk, 1) and b built
// from the phi functions of hh; its order-2 form is needed on intervals 1 .. steps - 2 only.
std::vector<Sampler::UniPcInterval> Sampler::unipc_intervals(const std::vector<double>& sigmas) {
  const size_t n = sigmas.size() - 1;
  std::vector<Sampler::UniPcInterval> out(n);
  for (size_t k = 0; k < n; ++k) {
    UniPcInterval& c = out[k];
    const FlowPoint t = flow_point(sigmas[k + 1]), s0 = flow_point(sigmas[k]);
    const torch::Tensor h = t.lambda - s0.lambda;
    const torch::Tensor hh = -h;
    const torch::Tensor h_phi_1 = torch::expm1(hh);
    const torch::Tensor b_h = torch::expm1(hh);
    c.x = (t.sigma / s0.sigma).item<float>();
    c.m0 = (t.alpha * h_phi_1).item<float>();
    c.res = (t.alpha * b_h).item<float>();
    if (k == 0) continue;
    const FlowPoint si = flow_point(sigmas[k - 1]);
    const torch::Tensor rk = (si.lambda - s0.lambda) / h;
    c.rk = rk.item<float>();
    if (k + 2 > n) continue;
    const torch::Tensor rks = torch::stack({rk, torch::ones({}, torch::kFloat)});
    std::vector<torch::Tensor> r_rows, b_entries;
    torch::Tensor h_phi_k = h_phi_1 / hh - 1;
    int64_t factorial = 1;
    for (int64_t order = 1; order <= kUniPcOrder; ++order) {
      r_rows.push_back(torch::pow(rks, order - 1));
      b_entries.push_back(h_phi_k * factorial / b_h);
      factorial *= order + 1;
      h_phi_k = h_phi_k / hh - 1.0 / static_cast<double>(factorial);
    }
    const torch::Tensor rhos = torch::linalg_solve(torch::stack(r_rows), torch::stack(b_entries));
    c.rho_prev = rhos[0].item<float>();
    c.rho_new = rhos[1].item<float>();
  }
  return out;
}

double Sampler::timestep(int64_t i) const {
  if (i < 0 || i >= steps()) fail("timestep " + std::to_string(i) + " outside [0, " + std::to_string(steps()) + ")");
  return timesteps_[static_cast<size_t>(i)];
}

double Sampler::sigma(int64_t i) const {
  if (i < 0 || i > steps()) fail("sigma " + std::to_string(i) + " outside [0, " + std::to_string(steps()) + "]");
  return sigmas_[static_cast<size_t>(i)];
}

torch::Tensor Sampler::noise_to(const torch::Tensor& x0, const torch::Tensor& noise, int64_t i) const {
  check_pair(x0, noise);
  if (i < 0 || i > steps())
    fail("noise_to step " + std::to_string(i) + " outside [0, " + std::to_string(steps()) + "]");
  if (is_flow(options_.kind)) {
    // scale_noise and add_noise both take the fp32 sigma and its fp32 complement; the sum is the same either way
    // round.
    const float s = static_cast<float>(sigmas_[static_cast<size_t>(i)]);
    const float a = 1.0f - s;
    return x0 * a + noise * s;
  }
  // add_noise rounds alpha_bar to the latents' fp32 before taking the square roots.
  const float ab = static_cast<float>(alpha_bars_[static_cast<size_t>(i)]);
  return x0 * sqrt_f32(ab) + noise * sqrt_f32(1.0f - ab);
}

torch::Tensor Sampler::predict_x0(const torch::Tensor& x, const torch::Tensor& model_output, int64_t i) const {
  check_pair(x, model_output);
  if (i < 0 || i >= steps()) fail("step " + std::to_string(i) + " outside [0, " + std::to_string(steps()) + ")");
  if (is_flow(options_.kind)) return x - cpu_f32(sigmas_[static_cast<size_t>(i)]) * model_output;
  // The float64 coefficients meet fp32 latents as scalars, so each is rounded to fp32 before the product.
  const double ab = alpha_bars_[static_cast<size_t>(i)];
  const double beta = 1.0 - ab;
  if (prediction_ == Prediction::v) return sqrt_f64(ab) * x - sqrt_f64(beta) * model_output;
  if (ab == 0)
    fail("epsilon prediction cannot give x0 at timestep " +
         std::to_string(static_cast<int64_t>(timesteps_[static_cast<size_t>(i)])) +
         ", where alpha_bar is 0 (zero terminal SNR); use v prediction or start at step 1");
  return (x - sqrt_f64(beta) * model_output) / sqrt_f64(ab);
}

torch::Tensor Sampler::step(const torch::Tensor& x, const torch::Tensor& model_output, int64_t i,
                            SamplerHistory& history, const StepNoise& noise) const {
  check_pair(x, model_output);
  const int64_t n = steps();
  if (i < 0 || i >= n) fail("step " + std::to_string(i) + " outside [0, " + std::to_string(n) + ")");
  const size_t u = static_cast<size_t>(i);

  if (options_.kind == SamplerKind::euler) {
    // diffusers upcasts the sample to fp32 and takes the step size as an fp32 difference.
    const float dt = static_cast<float>(sigmas_[u + 1]) - static_cast<float>(sigmas_[u]);
    return (x.to(torch::kFloat) + dt * model_output).to(x.scalar_type());
  }

  if (options_.kind == SamplerKind::dpm) return dpm_step(x, model_output, i, history, noise);

  if (options_.kind == SamplerKind::ddim) {
    const torch::Tensor x0 = predict_x0(x, model_output, i);
    const double ab = alpha_bars_[u], ab_prev = target_alpha_bars_[u];
    const double a = sqrt_f64((1.0 - ab_prev) / (1.0 - ab));
    // The clean end is an fp32 1 in diffusers (final_alpha_cumprod); its root is 1 in either precision.
    const double root_prev = ab_prev == 1.0 ? 1.0 : sqrt_f64(ab_prev);
    const double b = root_prev - rounded_product(sqrt_f64(ab), a);
    return a * x + b * x0;
  }

  // UniPC: the corrector (UniC) refines the sample this call receives with the new x0 prediction, then the
  // predictor (UniP) moves it to step i + 1; each is of order 1 or 2 in the x0 predictions.
  const bool fresh = history.next_step < 0;
  if (!fresh && history.next_step != i)
    fail("unipc history expects step " + std::to_string(history.next_step) + ", got " + std::to_string(i) +
         " (steps must be consecutive; clear() the history to restart)");
  if (!fresh && (history.outputs.empty() || !history.last_sample.defined()))
    fail("unipc history at step " + std::to_string(i) + " holds no earlier step");

  const torch::Tensor model_x0 = predict_x0(x, model_output, i);
  torch::Tensor sample = x;
  if (!fresh) {
    // The order the previous call's predictor used (diffusers keeps it as this_order).
    const int64_t order = std::min({kUniPcOrder, n - (i - 1), history.lower_order_count});
    const UniPcInterval& c = unipc_[u - 1];
    const torch::Tensor& m0 = history.outputs.back();
    const torch::Tensor& last = history.last_sample;
    torch::Tensor x_t = c.x * last - c.m0 * m0;
    const torch::Tensor d1_t = model_x0 - m0;
    if (order == 1) {
      x_t = x_t - c.res * (0.5 * d1_t);  // rhos_c = [0.5]
    } else {
      // diffusers sums rhos_c[:-1] against the stacked earlier differences: an einsum over one term, this product.
      const torch::Tensor d1 = (history.outputs[history.outputs.size() - 2] - m0) / c.rk;
      x_t = x_t - c.res * (c.rho_prev * d1 + c.rho_new * d1_t);
    }
    sample = x_t.to(last.scalar_type());
  }

  // lower_order_final: the last steps drop to the order there are steps left for; a history only starting warms
  // up one order per step.
  const int64_t order = std::min({kUniPcOrder, n - i, (fresh ? 0 : history.lower_order_count) + 1});
  const UniPcInterval& c = unipc_[u];
  torch::Tensor x_next = c.x * sample - c.m0 * model_x0;
  if (order == 2) {
    // rhos_p = [0.5]; the einsum over one term is this product.
    const torch::Tensor d1 = (history.outputs.back() - model_x0) / c.rk;
    x_next = x_next - c.res * (0.5 * d1);
  }
  x_next = x_next.to(sample.scalar_type());

  if (fresh) history.clear();
  history.lower_order_count = std::min(history.lower_order_count + 1, kUniPcOrder);
  history.next_step = i + 1;
  if (i + 1 == n) {
    // Nothing can follow the last step: release the tensors now rather than when the history goes.
    history.outputs.clear();
    history.output_steps.clear();
    history.last_sample = torch::Tensor();
    return x_next;
  }
  history.outputs.push_back(model_x0);
  history.output_steps.push_back(i);
  if (static_cast<int64_t>(history.outputs.size()) > kUniPcOrder) {
    history.outputs.erase(history.outputs.begin());
    history.output_steps.erase(history.output_steps.begin());
  }
  // The caller's latents may be a view into a larger buffer or be overwritten later: keep a copy of our own.
  history.last_sample = sample.is_same(x) ? x.clone() : sample;
  return x_next;
}

// CogVideoXDPMScheduler.step as CogVideoXPipeline calls it: the x0 prediction of the previous step and its
// timestep (timesteps[i - 1]) make the second-order update. diffusers works out the coefficients on float64 0-d
// tensors (its alpha_bar table is float64), so they are 0-d float64 tensors here too and meet the fp32 latents
// through the same kernels. At timestep 999, where zero terminal SNR gives alpha_bar 0, lambda is -inf and h, r
// infinite: IEEE arithmetic turns that into the first-order step from pure noise, as in diffusers.
torch::Tensor Sampler::dpm_step(const torch::Tensor& x, const torch::Tensor& model_output, int64_t i,
                                SamplerHistory& history, const StepNoise& noise) const {
  if (!noise) fail("dpm adds noise at every step: step() needs a StepNoise");
  const bool fresh = history.next_step < 0;
  if (!fresh && history.next_step != i)
    fail("dpm history expects step " + std::to_string(history.next_step) + ", got " + std::to_string(i) +
         " (steps must be consecutive; clear() the history to restart)");
  if (!fresh && history.outputs.empty()) fail("dpm history at step " + std::to_string(i) + " holds no earlier step");
  const size_t u = static_cast<size_t>(i);
  const auto draw = [&] {
    torch::Tensor n = noise();
    if (!n.defined() || n.sizes() != x.sizes()) {
      std::ostringstream s;
      s << "dpm step noise must have the latents' shape " << x.sizes() << ", got "
        << (n.defined() ? n.sizes() : c10::IntArrayRef{});
      fail(s.str());
    }
    return n;
  };
  const auto lambda = [](const torch::Tensor& ab) { return torch::pow(ab / (1 - ab), 0.5).log(); };

  const torch::Tensor x0 = predict_x0(x, model_output, i);
  const torch::Tensor ab = cpu_f64(alpha_bars_[u]), ab_prev = cpu_f64(target_alpha_bars_[u]);
  const torch::Tensor lamb = lambda(ab);
  const torch::Tensor h = lambda(ab_prev) - lamb;
  const torch::Tensor mult1 = torch::pow((1 - ab_prev) / (1 - ab), 0.5) * (-h).exp();
  const torch::Tensor mult2 = (-2 * h).expm1() * torch::pow(ab_prev, 0.5);
  const torch::Tensor mult_noise = torch::pow(1 - ab_prev, 0.5) * torch::pow(1 - (-2 * h).exp(), 0.5);
  // diffusers always takes the first-order step's draw, and keeps its result only on the first step (no earlier
  // prediction) and on the step to the clean end.
  torch::Tensor next = mult1 * x - mult2 * x0 + mult_noise * draw();
  if (!fresh && !lands_clean_[u]) {
    const torch::Tensor r = (lamb - lambda(cpu_f64(alpha_bars_[u - 1]))) / h;
    const torch::Tensor mult3 = 1 + 1 / (2 * r), mult4 = 1 / (2 * r);
    const torch::Tensor denoised = mult3 * x0 - mult4 * history.outputs.back();
    next = mult1 * x - mult2 * denoised + mult_noise * draw();
  }

  if (fresh) history.clear();
  history.next_step = i + 1;
  history.outputs.clear();
  history.output_steps.clear();
  // Nothing can follow the last step: the prediction is not kept.
  if (i + 1 < steps()) {
    history.outputs.push_back(x0);
    history.output_steps.push_back(i);
  }
  return next;
}

}  // namespace latent
