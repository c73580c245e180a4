// Streaming video-to-video: a causal few-step model regenerates incoming latent frames under a prompt, frame by
// frame, as StreamDiffusionV2 does (its default "stream batch" loop). Each frame is noised to `strength`, then
// denoised over the steps, one step per call, with the frames of the steps in flight in one call: step k of
// frame f runs beside step k - 1 of frame f + 1, each step with its own key/value cache. A frame leaves as many
// calls after it came as there are steps less one; memory is the caches, whatever the length.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "latent/gen/denoiser.h"

namespace latent {

struct RestyleOptions {
  // The input is noised as noise * s + latents * (1 - s); later frames tell the model t = int(1000 s) - 100.
  double strength = 0.8;
  // Integer timesteps on the 1000-step grid, not warped; the first step of the first two frames is the list's,
  // every later frame's first step is the strength's t. Each sigma is the flow grid's (shift `shift`) nearest.
  std::vector<int64_t> denoising_steps{700, 500};
  double shift = 8.0;
  // Latent frames each step's cache holds, the first `sink_frames` the attention sink, refreshed when a new
  // frame's keys and values are less alike than `sink_threshold` (cosine; -1 turns the refresh off).
  int64_t kv_window = 6;
  int64_t sink_frames = 3;
  double sink_threshold = 0.2;
  // Every draw comes from one CPU generator with this seed, in the reference's order.
  uint64_t seed = 0;
  // Prompt embeddings [1, L, text_dim].
  torch::Tensor text;
};

struct RestyledFrame {
  torch::Tensor latent;  // [1, C, 1, h, w] float32 on the model's device
  int64_t index = 0;     // the input frame it restyles (0, 1, ... in push order)
};

class Restyler {
 public:
  // Throws std::invalid_argument naming the option for options that cannot work (a model without a causal form,
  // no steps, a step outside 1..999, strength outside (0, 1], a window that holds no frame after the sink, text
  // of the wrong width or not finite).
  Restyler(std::shared_ptr<const Denoiser> model, RestyleOptions options);
  ~Restyler();
  Restyler(const Restyler&) = delete;
  Restyler& operator=(const Restyler&) = delete;

  // One input latent frame [1, C, 1, h, w] or [C, h, w] (any device and floating dtype) in the model's latent
  // space. `motion`: the change of the pixel frames behind it in [0, 1] (StreamDiffusionV2's measure), which
  // lowers the noise of moving input; none is still input. Returns the frames finished by it, in order: none
  // for the first, the first two for the second, then one per frame once the steps are full.
  // std::invalid_argument for a frame of another shape or with non-finite values, and nothing has changed; a
  // model that throws ends the stream (the restyler is as after reset()).
  std::vector<RestyledFrame> push(const torch::Tensor& latent, std::optional<double> motion = std::nullopt);
  // The frames still in flight, as if the input had ended here; the restyler is then as new.
  std::vector<RestyledFrame> finish();
  // Forgets the stream (a seek): the next push starts a new one, with the seed's draws again.
  void reset();
  // Prompt embeddings for the frames from the next push on.
  void set_text(const torch::Tensor& text);

  int64_t frames_in() const;
  // Calls between a frame's push and its output (steps - 1).
  int64_t latency_frames() const;
  // Bytes the key/value caches hold: flat over a stream.
  size_t cache_bytes() const;
  int64_t model_calls() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace latent
