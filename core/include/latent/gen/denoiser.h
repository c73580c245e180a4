// A denoiser: the network of a video diffusion model. It predicts, from noisy latents, one noise level per latent
// frame and the conditioning, the model's target (flow velocity, v or noise). It declares what it needs so a
// caller can check a pipeline before running it: its prediction type, the VAE whose latents it works in, its
// channels, latent size and window, and the sampler its authors use.
#pragma once

#include <torch/types.h>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "latent/gen/sampler.h"
#include "latent/vae/vae.h"

namespace latent {

namespace parallel {
class Communicator;
}

struct DenoiserSpec {
  std::string backend;  // "aoti" (an exported .pt2 package) or a native architecture's name
  Prediction prediction = Prediction::flow;
  std::string latent_space;  // the VAE model id whose latents it takes (VaeSpec::model_id), e.g. "wan2.1"
  int64_t channels = 16;
  // Latent frames per call: at least min_frames, at most window.
  int64_t min_frames = 1;
  int64_t window = 1;
  // The clip length it was trained on, in latent frames: the window a run takes when none is set, so a default run
  // is the model's own (Wan 2.1: 21 latents, 81 frames, where its positions reach 1,024). 0: the window.
  int64_t native_frames = 0;
  // The latent height and width it takes; 0 where any multiple of size_multiple is accepted.
  int64_t height = 0;
  int64_t width = 0;
  int64_t size_multiple = 1;
  // Text conditioning: prompt embeddings [1, text_tokens, text_dim]; 0 where the model takes none.
  int64_t text_tokens = 0;
  int64_t text_dim = 0;
  // The sampler and classifier-free guidance scale its authors recommend.
  SamplerOptions sampler;
  double guidance = 1.0;
  // The VAE's compression: video frames per latent frame (the first latent stands for one frame) and pixels per
  // latent row and column. 4 and 8 where the file does not say: every supported family (Wan 2.1, CogVideoX).
  int64_t temporal_factor = 4;
  int64_t spatial_factor = 8;
  // The latent size it was trained at, which videogen makes when none is set; 0 where the file does not say.
  int64_t native_height = 0;
  int64_t native_width = 0;
  // Whether each latent frame may have its own timestep (Wan, whose time embedding is per token). False for a
  // model conditioned on one timestep per call (CogVideoX): predict() then takes only equal values, and only the
  // clip schedule, whose frames share every step, can drive it.
  bool per_frame_timesteps = true;
  // Whether its pipeline conditions on an image as clean first latent frames at timestep 0 (GeneratorOptions::
  // condition): Wan 2.2 TI2V's per-token timesteps (model_index.json's expand_timesteps).
  bool image_condition = false;
  // Two experts (Wan 2.2 A14B): calls at a timestep >= this run the first (high-noise) network, the others the
  // second, whose guidance scale may differ (GeneratorOptions::guidance_2). 0 for a single network. A call's frames
  // all share one timestep then (per_frame_timesteps is false).
  double expert_boundary = 0.0;
  // The layout its reference pipeline draws noise in from its seeded generator: [1, T, C, h, w] where true
  // (CogVideoXPipeline keeps latents frames first), else [1, C, T, h, w] (Wan). A Generator draws every noise tensor
  // (the start and a stochastic sampler's steps) in this layout, so a seed gives the pipeline's numbers.
  bool noise_frames_first = false;
};

class Denoiser {
 public:
  virtual ~Denoiser() = default;
  const DenoiserSpec& spec() const { return spec_; }
  torch::Device device() const { return options_.device; }
  torch::ScalarType dtype() const { return options_.dtype; }

  // x: [1, channels, T, h, w]; timesteps: [1, T], the model's conditioning value of each latent frame (a
  // sampler's timestep(), 0 for a clean frame), all equal unless spec().per_frame_timesteps; text: [1, text_tokens,
  // text_dim] or undefined for a model without text. Any device and dtype: they are moved to the model's. Returns the
  // prediction [1, channels, T, h, w] in float32 on the model's device. Throws std::invalid_argument naming the input
  // and the accepted shape (or, for unequal timesteps to a model without per-frame timesteps, saying so).
  torch::Tensor predict(const torch::Tensor& x, const torch::Tensor& timesteps, const torch::Tensor& text) const;

  // Sequence parallel (Ulysses): the heads of the model's attention, which a group splits among its ranks; 0 where
  // the model cannot share one prediction over a group.
  virtual int64_t attention_heads() const { return 0; }
  // One prediction shared by the ranks of `sequence_group`: each rank runs a contiguous part of the tokens and,
  // inside attention, a part of the heads. Called on every rank of the group at once with the same inputs (and a
  // model with the same weights); returns on every rank the whole prediction, equal to predict(x, timesteps, text)
  // within float rounding. A null group or a group of one is predict(x, timesteps, text). Throws
  // std::invalid_argument where the group's size does not divide attention_heads() (naming the sizes that do) or
  // the model has no sequence parallel, and ParallelError where the group fails (another rank failed or timed out).
  torch::Tensor predict(const torch::Tensor& x, const torch::Tensor& timesteps, const torch::Tensor& text,
                        parallel::Communicator* sequence_group) const;

 protected:
  Denoiser(DenoiserSpec spec, LoadOptions options) : spec_(std::move(spec)), options_(options) {}
  // Inputs are checked and on the model's device and dtype (timesteps float32) by then.
  virtual torch::Tensor run(const torch::Tensor& x, const torch::Tensor& timesteps,
                            const torch::Tensor& text) const = 0;
  // run() over a group of two or more ranks whose size divides attention_heads(); inputs as run()'s. Only models
  // with attention_heads() > 0 are asked.
  virtual torch::Tensor run_sequence_parallel(const torch::Tensor& x, const torch::Tensor& timesteps,
                                              const torch::Tensor& text, parallel::Communicator& group) const;
  DenoiserSpec spec_;
  LoadOptions options_;

 private:
  // Checks the inputs as predict() documents, runs `body` on them moved to the model's device and dtype, and
  // checks what it returns.
  template <typename Body>
  torch::Tensor checked(const torch::Tensor& x, const torch::Tensor& timesteps, const torch::Tensor& text,
                        Body&& body) const;
};

// A LoRA merged into a transformer's weights at load, applied with weight `scale` (diffusers' set_adapters weight).
struct LoraFile {
  std::filesystem::path path;
  double scale = 1.0;
};

// What replaces or edits the weights a model folder holds for one of its transformers.
struct WeightEdits {
  // Weights in place of the folder's: diffusers or the original (Wan-AI) layout, safetensors (single or sharded
  // with an index) or a torch checkpoint; the folder's config still describes the network.
  std::filesystem::path transformer_weights;
  std::vector<LoraFile> loras;  // merged in order
  bool empty() const { return transformer_weights.empty() && loras.empty(); }
};

// Edits for a folder's `transformer` and, for a two-expert folder (Wan 2.2 A14B), its `transformer_2`.
struct DenoiserFiles {
  WeightEdits first, second;
};

// "FILE:SCALE[,FILE:SCALE...]" (":SCALE" optional, 1) as a list; std::invalid_argument naming the bad entry.
std::vector<LoraFile> parse_lora_list(const std::string& text);

// A `.pt2` package (tools/export_denoiser.py), a diffusers folder or native weights. Throws ModelError naming the
// file and the defect (also for edits a model cannot take).
std::shared_ptr<Denoiser> load_denoiser(const std::filesystem::path& path, const LoadOptions& options = {},
                                        const DenoiserFiles& files = {});

}  // namespace latent
