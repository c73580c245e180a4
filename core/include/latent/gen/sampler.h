// Samplers: the noise schedule of a diffusion model and the update that moves latents one step down it. The
// arithmetic follows diffusers' schedulers step by step (tests/core/gen/test_samplers.cpp compares them).
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

namespace latent {

// What a denoiser predicts: the flow velocity (noise - x0, Wan), v (CogVideoX) or the noise itself.
enum class Prediction { flow, v, epsilon };

enum class SamplerKind {
  euler,  // flow matching, Euler (diffusers FlowMatchEulerDiscreteScheduler)
  unipc,  // UniPC for flow: order 2, bh2, x0 prediction, lower order final (UniPCMultistepScheduler, flow sigmas)
  ddim,   // CogVideoX's DDIM: v or epsilon, trailing spacing, zero terminal SNR (CogVideoXDDIMScheduler)
  dpm,    // CogVideoX-5B's SDE DPM-Solver++(2M) on ddim's schedule and timesteps (CogVideoXDPMScheduler): stochastic,
          // it adds fresh noise at every step
};

class SamplerError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

// "euler", "unipc", "ddim", "dpm"; throws SamplerError listing the names.
SamplerKind parse_sampler_kind(const std::string& name);
const char* sampler_kind_name(SamplerKind kind);
// "flow", "v", "epsilon"; throws SamplerError listing the names.
Prediction parse_prediction(const std::string& name);
const char* prediction_name(Prediction prediction);

struct SamplerOptions {
  SamplerKind kind = SamplerKind::euler;
  int64_t steps = 50;
  double shift = 5.0;            // flow shift (euler, unipc): sigma <- s*sigma / (1 + (s-1)*sigma)
  double snr_shift_scale = 3.0;  // ddim, dpm: CogVideoX-2b 3.0, 5b 1.0
  int64_t train_timesteps = 1000;
};

// What a multistep sampler remembers between the steps of one set of latents: UniPC keeps its previous x0
// predictions and the sample it last saw, dpm its previous x0 prediction. Latents that step together share one history;
// FIFO's queue slots each keep their own, since each slot is at its own step. Empty for single-step samplers.
struct SamplerHistory {
  std::vector<torch::Tensor> outputs;  // x0 predictions, most recent last
  std::vector<int64_t> output_steps;   // the step index of each
  torch::Tensor last_sample;
  int64_t lower_order_count = 0;
  int64_t next_step = -1;  // the step the next call must be; -1 before the first
  size_t bytes() const;
  void clear();
};

// Unit Gaussian noise of the latents' shape, on their device and in their dtype, for a stochastic step. Each call
// is a fresh draw; the caller owns the stream (a seeded generator), so a run is reproducible.
using StepNoise = std::function<torch::Tensor()>;

// One noise schedule (fixed by the options) and its update rule. Immutable once built; many streams share one.
class Sampler {
 public:
  // Throws SamplerError when the options are out of range or the prediction does not fit the kind (euler and
  // unipc need flow; ddim and dpm take v or epsilon).
  Sampler(const SamplerOptions& options, Prediction prediction);

  const SamplerOptions& options() const { return options_; }
  Prediction prediction() const { return prediction_; }
  int64_t steps() const { return options_.steps; }
  // The model's conditioning value at step i < steps (diffusers' scheduler.timesteps[i]).
  double timestep(int64_t i) const;
  // The noise level of step i <= steps: flow sigma, or sqrt(1 - alpha_bar) for ddim. Step `steps` is clean (0).
  double sigma(int64_t i) const;
  const std::vector<double>& timesteps() const { return timesteps_; }
  const std::vector<double>& sigmas() const { return sigmas_; }

  // Clean latents x0 brought to the noise of step i with unit Gaussian `noise` (diffusers' scale_noise/add_noise).
  torch::Tensor noise_to(const torch::Tensor& x0, const torch::Tensor& noise, int64_t i) const;
  // The model's estimate of the clean latents from x at step i and its output there.
  torch::Tensor predict_x0(const torch::Tensor& x, const torch::Tensor& model_output, int64_t i) const;
  // Moves x from step i to step i + 1 given the model's output at step i. A fresh history may start at any step
  // (FIFO's initial diagonal); afterwards it must be called for consecutive steps (SamplerError otherwise).
  // A sampler that needs_noise() draws from `noise` (SamplerError when it is empty), as often as diffusers' step
  // draws from its generator: dpm once at every step and a second time at each second-order one. The others never
  // call it.
  torch::Tensor step(const torch::Tensor& x, const torch::Tensor& model_output, int64_t i, SamplerHistory& history,
                     const StepNoise& noise = {}) const;
  // Whether step() draws noise (dpm).
  bool needs_noise() const { return options_.kind == SamplerKind::dpm; }

 private:
  SamplerOptions options_;
  Prediction prediction_;
  std::vector<double> timesteps_;   // steps entries
  std::vector<double> sigmas_;      // steps + 1 entries, the last 0
  std::vector<double> alpha_bars_;  // ddim, dpm: alpha_bar at each timestep, plus the final one
  // ddim, dpm: the alpha_bar each step moves to. diffusers takes it at timestep - train_timesteps / steps (integer
  // division), which is not always the next timestep: for 30 steps 966 goes to 933, the next timestep is 932.
  std::vector<double> target_alpha_bars_;
  // dpm: whether step i moves below timestep 0 (to the fp32 1 of set_alpha_to_one), where diffusers takes the
  // first-order result even with an earlier prediction at hand.
  std::vector<bool> lands_clean_;
  torch::Tensor dpm_step(const torch::Tensor& x, const torch::Tensor& model_output, int64_t i, SamplerHistory& history,
                         const StepNoise& noise) const;
  // unipc: the fp32 coefficients of the move from step k to k + 1, shared by the predictor at k and the corrector
  // at k + 1. They depend only on the schedule, so they are worked out once rather than at every call.
  struct UniPcInterval {
    float x = 0, m0 = 0, res = 0;     // next = x * sample - m0 * newest x0 - res * (weighted x0 differences)
    float rk = 0;                     // (lambda_{k-1} - lambda_k) / h_k, for k >= 1
    float rho_prev = 0, rho_new = 0;  // the order-2 corrector's weights, for 1 <= k <= steps - 2
  };
  std::vector<UniPcInterval> unipc_;
  static std::vector<UniPcInterval> unipc_intervals(const std::vector<double>& sigmas);
};

}  // namespace latent
