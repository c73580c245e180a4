// Video generation as a stream: a Generator runs a denoiser under a schedule and hands out latent frames as they
// become final, each with its frame number. Memory is bounded by the schedule's window, never by the length:
//   clip     a fixed number of frames denoised together (diffusers' pipelines; equals their loop)
//   fifo     FIFO-Diffusion's diagonal queue: `steps` frames at rising noise levels, denoised `window` adjacent
//            levels per model call; every iteration each frame takes one step, the cleanest leaves, fresh noise
//            enters; endless
//   rolling  windows of `window` frames whose first `context` frames are clean ones carried from the window before
//            (diffusion-forcing style); endless
//   causal   blocks of frames made one after another by a causal few-step model (Self-Forcing, LongLive): each
//            block sees the cached keys and values of the frames before it, within a window; endless
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "latent/gen/denoiser.h"
#include "latent/gen/sampler.h"

namespace latent {

enum class ScheduleKind { clip, fifo, rolling, causal };

// How an iteration's model calls are run; the core's own (gen/schedule.h).
class CallExecutor;

// The latent frames per model call of a run that sets none: the model's trained clip where it declares one.
int64_t default_window(const DenoiserSpec& spec);

// "clip", "fifo", "rolling", "causal"; throws std::invalid_argument listing the names.
ScheduleKind parse_schedule_kind(const std::string& name);
const char* schedule_kind_name(ScheduleKind kind);

// How far a run is, after each of its denoising iterations: a step of the clip, an iteration of fifo's queue, a
// step of a rolling window.
struct GeneratorProgress {
  int64_t iteration = 0;   // iterations done since the start or the last reset
  int64_t iterations = 0;  // in the whole run; 0 for an endless one
};

// The causal schedule: Self-Forcing's and LongLive's inference. Each block of chunk_frames latent frames starts
// from noise and takes a few steps: the model's x0 = x - sigma v (in float64), re-noised with fresh noise to the
// next step's sigma; the last x0 is the block, which one more call at timestep context_noise writes into the key
// and value cache the later blocks attend to. No guidance.
struct CausalOptions {
  int64_t chunk_frames = 3;  // latent frames per block: 3 (Self-Forcing, LongLive, Krea), 1 (StreamDiffusionV2)
  // Latent frames of keys and values each block sees, its own included (LongLive's local_attn_size); 0 takes the
  // model's trained clip (DenoiserSpec::native_frames: Wan's 21, the whole cache Self-Forcing has).
  int64_t kv_window = 0;
  // The first frames of the stream, kept in the window forever (the attention sink; LongLive: 3 of 12).
  int64_t sink_frames = 0;
  // The steps, on the 1000-step grid, warped through the flow schedule of `shift` (sigma = shift s / (1 + (shift
  // - 1) s) on s = linspace(1, 0, 1001)[:-1], timestep 1000 sigma, taken at 1000 - step).
  std::vector<int64_t> denoising_steps{1000, 750, 500, 250};
  double shift = 5.0;
  // false: the steps are the model's timesteps themselves, each with the sigma of the nearest grid timestep
  // (CausVid's 3-step model: steps 1000, 757, 522 at shift 8).
  bool warp = true;
  double context_noise = 0.0;
  // A prompt switch past the window keeps the old sink (LongLive's global_sink); else the sink is made again
  // under the new prompt.
  bool global_sink = true;
};

// The prompt from latent frame `frame` on (LongLive's switch_frame_indices): it takes effect at the first block
// that starts at or after it.
struct PromptSwitch {
  int64_t frame = 0;
  torch::Tensor text;  // embeddings as GeneratorOptions::text
  std::string label;   // what the prompt was made from, handed back with the first frame made under it
};

struct GeneratorOptions {
  ScheduleKind schedule = ScheduleKind::clip;
  // steps, shift, ... For fifo, steps is also the queue length (FIFO-Diffusion's n * f).
  SamplerOptions sampler;
  // Latent frames to make: clip's length (at most the window); for fifo and rolling 0 means endless.
  int64_t frames = 0;
  // Latent height and width; 0 takes the denoiser's.
  int64_t height = 0;
  int64_t width = 0;
  // Latent frames per model call; 0 takes default_window(the denoiser's spec).
  int64_t window = 0;
  int64_t context = 0;  // rolling: clean frames carried into each window (< window)
  // Classifier-free guidance: prediction = uncond + guidance * (cond - uncond), uncond from negative_text. On only
  // above 1, as in diffusers' pipelines (do_classifier_free_guidance = guidance_scale > 1): a scale of 1 or less
  // runs the prompt alone, one model call per step, and never extrapolates away from the prompt.
  double guidance = 1.0;
  // A two-expert model's (DenoiserSpec::expert_boundary > 0) scale for the calls its second expert runs (timesteps
  // below the boundary), as diffusers' guidance_scale_2; < 0: guidance. Guidance is on or off for the whole run by
  // `guidance` alone, as in diffusers: with guidance <= 1 this is ignored.
  double guidance_2 = -1.0;
  torch::Tensor text;           // [1, L, D] prompt embeddings, for a model that takes text
  torch::Tensor negative_text;  // the same shape; needed when guidance > 1
  // The noise comes from a CPU generator with this seed: the same seed gives the same latents on every device.
  uint64_t seed = 0;
  // clip and causal: the starting noise [1, C, frames, h, w] (causal: frames rounded up to whole blocks) instead of the
  // seeded draw, e.g. a reference pipeline's latents= to reproduce its run. Any device and floating dtype; it is copied
  // to float32 on the model's device.
  torch::Tensor initial_noise;
  // clip only, image to video: the latents [1, C, k, h, w] of the clip's first k frames (an image encoded by the
  // VAE, in diffusion space). Every model input has them in place of its first k frames, at timestep 0, and the
  // clip ends with them, as diffusers' WanImageToVideoPipeline with expand_timesteps (Wan 2.2 TI2V). The sampler
  // still steps those frames; their values never reach the output. Needs a model with per-frame timesteps.
  torch::Tensor condition;
  // The causal schedule's settings and scripted prompt switches (ascending frames).
  CausalOptions causal;
  std::vector<PromptSwitch> prompt_switches;
  // Called on the generating thread after every iteration, so a run of minutes shows how far it is before its
  // first frame. Ranks of a group call it on rank 0 only.
  std::function<void(const GeneratorProgress&)> progress;
};

// Thrown by Generator::next() when interrupt() stopped it; the generator is as it was before that call.
class Interrupted : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct GeneratedFrame {
  // [1, C, 1, h, w] float32 on the denoiser's device, in the VAE's diffusion space (what its encoder hands out
  // and its decoder takes: VaeSpec::latent_shift / latent_scale applied).
  torch::Tensor latent;
  int64_t index = 0;  // latent frame number from 0
  // causal: the first frame made under a switched prompt (scripted or switch_prompt()); `prompt_index` counts
  // the prompts of the run, 0 being GeneratorOptions::text.
  bool prompt_switch = false;
  int64_t prompt_index = 0;
  std::string prompt_label;  // the switch's PromptSwitch::label, on the prompt_switch frame
};

class Generator {
 public:
  // Throws std::invalid_argument naming the option when the options do not fit the denoiser (fifo and rolling
  // need a denoiser with per-frame timesteps), or when the latents the schedule keeps alone would not fit in the
  // device's available memory.
  Generator(std::shared_ptr<const Denoiser> denoiser, GeneratorOptions options);
  // The same, with the iteration's model calls run by `executor` (made in the core: one rank of a group,
  // latent/gen/parallel_generator.h); null runs them here.
  Generator(std::shared_ptr<const Denoiser> denoiser, GeneratorOptions options, std::unique_ptr<CallExecutor> executor);
  ~Generator();
  Generator(const Generator&) = delete;
  Generator& operator=(const Generator&) = delete;

  // Runs the model until at least one frame is final and returns the frames that are, in order; empty once
  // finished().
  std::vector<GeneratedFrame> next();
  bool finished() const;
  // Starts again from the first frame: with the same seed the same frames come out. A causal run switched by
  // switch_prompt() starts again under the prompt it was switched to last (as a run started with it would), its
  // scripted switches still to come.
  void reset();
  void reset(uint64_t seed);
  // From any thread: a next() in progress (or the next one) stops before its next model call and throws
  // Interrupted, until clear_interrupt(). A streaming element's unlock, so a state change never waits for a
  // whole clip.
  void interrupt();
  void clear_interrupt();
  // From any thread, causal schedule: the prompt of the blocks from the next one on, as a scripted switch there
  // (the frames made so far are cached again under it). Throws std::invalid_argument for another schedule or
  // embeddings of the wrong shape.
  void switch_prompt(const torch::Tensor& text, const std::string& label = "");

  const GeneratorOptions& options() const { return options_; }
  const Sampler& sampler() const;
  // Bytes of the tensors the generator keeps between calls (queue, context, sampler histories).
  size_t state_bytes() const;
  // A lower bound on what a run keeps in memory: the latents of the schedule's frames in flight with their sampler
  // history, and one guided model call's inputs and outputs (the model's activations come on top).
  static size_t latent_bytes_lower_bound(const GeneratorOptions& options, int64_t channels);
  // Denoiser calls since construction; may be read from any thread, also during next().
  int64_t model_calls() const;

  struct Impl;

 private:
  std::shared_ptr<const Denoiser> denoiser_;
  GeneratorOptions options_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace latent
