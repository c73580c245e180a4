// The pieces of a Generator: what every schedule shares (guided model calls, the seeded noise stream) and the
// schedules themselves (gen/sampling/schedules.cpp).
#pragma once

#include <torch/types.h>

#include <atomic>
#include <exception>
#include <memory>
#include <vector>

#include "latent/gen/generator.h"

namespace latent {

namespace parallel {
class Communicator;
}

// One model call of an iteration: latents x [1, C, T, h, w] whose frame j is at step steps[j] (sampler.steps() =
// clean). Guided, it is two denoiser evaluations (text and negative text).
struct ModelCall {
  torch::Tensor x;
  std::vector<int64_t> steps;
};

class Denoising;

// Runs the model calls of an iteration. All of them are handed over at once so that an executor over several
// ranks can spread them (latent/gen/parallel_generator.h); the local one runs them in order.
class CallExecutor {
 public:
  virtual ~CallExecutor() = default;
  // Each call's guided prediction [1, C, T, h, w] float32 on the model's device, in the order of `calls`.
  virtual std::vector<torch::Tensor> run(Denoising& d, const std::vector<ModelCall>& calls) = 0;
  // Generator::next() failed with `error` (already rethrown to its caller): a rank of a group tells the others,
  // who would otherwise wait for it in the next exchange until the group's timeout.
  virtual void failed(const std::exception_ptr& error) noexcept { (void)error; }
};

// Every evaluation on this device, in order: cond, uncond, guidance, then the next call.
std::unique_ptr<CallExecutor> make_local_executor();

class Denoising {
 public:
  Denoising(const Denoiser& model, const Sampler& sampler, const GeneratorOptions& options, int64_t height,
            int64_t width, std::unique_ptr<CallExecutor> executor);
  // The guided prediction for each call, through the executor.
  std::vector<torch::Tensor> predict(const std::vector<ModelCall>& calls);
  torch::Tensor predict(const torch::Tensor& x, const std::vector<int64_t>& steps);
  // Unit Gaussian noise [1, C, frames, h, w], drawn on the CPU so every device gets the same numbers (in the
  // denoiser's DenoiserSpec::noise_frames_first layout, then permuted).
  torch::Tensor noise(int64_t frames);
  // The sampler's step noise for latents x [1, C, T, h, w], drawn from the same stream when the step asks.
  StepNoise step_noise(const torch::Tensor& x);
  // The clip schedule's starting noise: GeneratorOptions::initial_noise where set, else noise(frames).
  torch::Tensor clip_noise(int64_t frames);
  void reseed(uint64_t seed);
  // The noise stream's position, to rewind it when an iteration fails.
  torch::Tensor noise_state() const;
  void restore_noise_state(const torch::Tensor& state);

  // For executors. Whether a call is two evaluations: only above 1, diffusers' do_classifier_free_guidance (a scale
  // of 1 or less runs the prompt alone, see GeneratorOptions::guidance).
  bool guided() const { return guidance_ > 1.0; }
  // One evaluation of `call`: with the text, or with the negative text when `uncond`. Throws Interrupted while
  // interrupted. `sequence_group`: the ranks that run this evaluation together (Ulysses), null for one.
  torch::Tensor evaluate(const ModelCall& call, bool uncond, parallel::Communicator* sequence_group = nullptr) const;
  // uncond + guidance * (cond - uncond), with the guidance of the expert that runs `call`.
  torch::Tensor guide(const ModelCall& call, const torch::Tensor& cond, const torch::Tensor& uncond) const;
  // x [1, C, T, h, w] with GeneratorOptions::condition in place of its first frames; x itself without one.
  torch::Tensor conditioned(const torch::Tensor& x) const;
  void count_calls(int64_t n) { calls_ += n; }
  // One iteration done, for GeneratorOptions::progress (predict() counts its own).
  void iteration_done();
  // The prompt embeddings on the model's device and dtype (undefined for a model without text).
  const torch::Tensor& text() const { return text_; }
  void check_interrupted() const;
  CallExecutor& executor() { return *executor_; }

  const Denoiser& model() const { return model_; }
  const Sampler& sampler() const { return sampler_; }
  int64_t calls() const { return calls_; }
  // predict() throws Interrupted while this is set.
  void set_interrupted(bool on) { interrupted_ = on; }
  const std::atomic<bool>& interrupt_flag() const { return interrupted_; }
  // Starts counting iterations (predict() of a set of calls) for GeneratorOptions::progress from 0.
  void start_progress(int64_t iterations) { progress_ = {0, iterations}; }

 private:
  const Denoiser& model_;
  const Sampler& sampler_;
  // The model's timestep of `step` (0 once clean).
  double level(int64_t step) const;
  double guidance_, guidance_2_;
  double expert_boundary_;
  torch::Tensor text_, negative_text_;
  torch::Tensor condition_;
  torch::Tensor initial_noise_;
  int64_t channels_, height_, width_;
  bool frames_first_;
  torch::Generator cpu_generator_;
  std::unique_ptr<CallExecutor> executor_;
  std::atomic<int64_t> calls_{0};  // read by stats from other threads
  std::atomic<bool> interrupted_{false};
  std::function<void(const GeneratorProgress&)> on_progress_;
  GeneratorProgress progress_;
};

class Schedule {
 public:
  virtual ~Schedule() = default;
  // One iteration: model calls and steps; returns the frames that became final (possibly none). An iteration
  // that throws changes nothing.
  virtual std::vector<GeneratedFrame> advance(Denoising& d) = 0;
  virtual bool finished() const = 0;
  virtual size_t bytes() const = 0;
  // The iterations (Denoising::predict of an iteration's calls) of the whole run with `steps` sampler steps; 0 for an
  // endless run.
  virtual int64_t iterations(int64_t steps) const = 0;
};

// `window` is checked against the denoiser by then; `frames` as in GeneratorOptions.
std::unique_ptr<Schedule> make_clip_schedule(int64_t frames);
std::unique_ptr<Schedule> make_fifo_schedule(int64_t frames, int64_t window);
std::unique_ptr<Schedule> make_rolling_schedule(int64_t frames, int64_t window, int64_t context);

// gen/sampling/causal_schedule.cpp. The options are checked by then, kv_window resolved (>= 1); the model has a
// CausalModel interface.
class CausalSchedule : public Schedule {
 public:
  // Applied at the next block start (any thread).
  virtual void switch_prompt(const PromptSwitch& prompt) = 0;
};
std::unique_ptr<CausalSchedule> make_causal_schedule(const GeneratorOptions& options, const Denoiser& model,
                                                     int64_t height, int64_t width);
// The timesteps of CausalOptions::denoising_steps as the references compute them: float32 values, and the
// sigma of each (float32 too, held in doubles).
std::vector<double> causal_timesteps(const CausalOptions& o);
std::vector<double> causal_sigmas(const CausalOptions& o);
// The sigma the references' flow scheduler (shift `shift`, 1000 steps, float32) takes for a timestep: its grid's
// at the nearest grid timestep, the first of equals.
float flow_grid_sigma(double shift, double timestep);

}  // namespace latent
