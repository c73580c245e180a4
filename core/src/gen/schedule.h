// The pieces of a Generator: what every schedule shares (guided model calls, the seeded noise stream) and the
// schedules themselves (gen/schedules.cpp).
#pragma once

#include <torch/types.h>

#include <atomic>
#include <memory>
#include <vector>

#include "latent/gen/generator.h"

namespace latent {

class Denoising {
 public:
  Denoising(const Denoiser& model, const Sampler& sampler, const GeneratorOptions& options, int64_t height,
            int64_t width);
  // The guided prediction for x [1, C, T, h, w] whose frame j is at step steps[j] (sampler.steps() = clean).
  torch::Tensor predict(const torch::Tensor& x, const std::vector<int64_t>& steps);
  // Unit Gaussian noise [1, C, frames, h, w], drawn on the CPU so every device gets the same numbers.
  torch::Tensor noise(int64_t frames);
  // The clip schedule's starting noise: GeneratorOptions::initial_noise where set, else noise(frames).
  torch::Tensor clip_noise(int64_t frames);
  void reseed(uint64_t seed);
  // The noise stream's position, to rewind it when an iteration fails.
  torch::Tensor noise_state() const;
  void restore_noise_state(const torch::Tensor& state);

  const Sampler& sampler() const { return sampler_; }
  int64_t calls() const { return calls_; }
  // predict() throws Interrupted while this is set.
  void set_interrupted(bool on) { interrupted_ = on; }

 private:
  const Denoiser& model_;
  const Sampler& sampler_;
  double guidance_;
  torch::Tensor text_, negative_text_;
  torch::Tensor initial_noise_;
  int64_t channels_, height_, width_;
  torch::Generator cpu_generator_;
  std::atomic<int64_t> calls_{0};  // read by stats from other threads
  std::atomic<bool> interrupted_{false};
  void check_interrupted() const;
};

class Schedule {
 public:
  virtual ~Schedule() = default;
  // One iteration: model calls and steps; returns the frames that became final (possibly none). An iteration
  // that throws changes nothing.
  virtual std::vector<GeneratedFrame> advance(Denoising& d) = 0;
  virtual bool finished() const = 0;
  virtual size_t bytes() const = 0;
};

// `window` is checked against the denoiser by then; `frames` as in GeneratorOptions.
std::unique_ptr<Schedule> make_clip_schedule(int64_t frames);
std::unique_ptr<Schedule> make_fifo_schedule(int64_t frames, int64_t window);
std::unique_ptr<Schedule> make_rolling_schedule(int64_t frames, int64_t window, int64_t context);

}  // namespace latent
