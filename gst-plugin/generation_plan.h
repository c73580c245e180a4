// What videogen's properties make of a run: the settings as the element holds them, and plan_run(), which turns
// them and the loaded model into generator options, caps and frame counts, checking every setting against the
// model. No GObject code: the element (elements/videogen.cpp) calls it from start().
#pragma once

#include <gst/gst.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "generation_ranks.h"
#include "latent/gen/prompts.h"
#include "latent_caps.h"
#include "model_glue.h"

namespace latent::gst {

// The sampler choice: the model's own, or one of the core's samplers.
enum SamplerChoice { SAMPLER_DEFAULT, SAMPLER_EULER, SAMPLER_UNIPC, SAMPLER_DDIM, SAMPLER_DPM };

constexpr double kModelGuidance = -1.0;
constexpr gint kAutoContext = -1;
// The schedule property's default: the one every model the element loads can run (see schedule_for).
constexpr int kScheduleAuto = 100;

struct VideoGenSettings {
  ModelSettings model;
  int schedule = kScheduleAuto;  // a ScheduleKind or kScheduleAuto
  SamplerChoice sampler = SAMPLER_DEFAULT;
  guint steps = 0;     // 0: the model's
  double shift = 0.0;  // 0: the model's
  double guidance = kModelGuidance;
  guint64 seed = 0;
  gint64 num_frames = -1;  // video frames; -1 endless
  gint width = 0, height = 0;
  Fraction framerate{16, 1};
  guint window = 0;  // 0: the model's
  gint context = kAutoContext;
  std::string prompt_embeds;
  std::optional<std::string> prompt, negative_prompt;  // unset: none
  std::string text_device;                             // empty: the model's device
  std::string initial_noise;
  double guidance_2 = -1.0;  // < 0: guidance's
  std::string image;         // image to video: the first frame's picture
  // Read at NULL->READY: weights in place of the folder's transformer's, LoRAs ("FILE:SCALE,...") for it and for a
  // second expert's.
  std::string transformer_weights, lora, lora_2;
  std::string parallel = "auto";  // with devices: how the ranks share the work
  // The latents' wire format: the sampler's float32 by default, whatever the model computes in.
  LatentFormat format = LatentFormat::F32;
  // schedule=causal (CausalOptions): kv_window 0 is the model's clip; denoising_steps "1000,750,500,250".
  guint chunk_frames = 3, kv_window = 0, sink_frames = 0;
  bool global_sink = true;
  std::string denoising_steps = "1000,750,500,250";
  double context_noise = 0.0;
  bool warp_denoising_steps = true;
  // "N:TEXT|N:TEXT": from latent frame N on, TEXT (encoded by the folder's text encoder).
  std::string prompt_schedule;
};

// A scripted prompt: from latent frame `frame` on.
struct ScheduledPrompt {
  int64_t frame = 0;
  std::string text;
};

// "N:TEXT|N:TEXT" (prompt-schedule) as a list in ascending frames; std::invalid_argument naming the bad entry. A
// '|' inside a prompt is written "||".
std::vector<ScheduledPrompt> parse_prompt_schedule(const std::string& text);
// "1000,750,500,250" (denoising-steps); std::invalid_argument naming the bad entry.
std::vector<int64_t> parse_denoising_steps(const std::string& text);

// What start() decided for a run: the generator, the caps it makes and how many latents and frames.
struct Run {
  std::unique_ptr<Frames> generator;
  LatentCapsInfo caps;
  std::string plan;  // how ranks share the work, for the log; "" for one device
  uint64_t video_frames = 0;  // 0: endless
  bool causal = false;        // schedule=causal: prompts may switch while it plays
};

// Latent frame k stands for video frames [first, end): the first latent for one frame, every later one for
// temporal_factor, the last for what remains of num-frames.
LatentFrameStamp stamp_for(const Run& run, uint64_t k);

// The negative prompt a run encodes: none without guidance; the empty prompt when guided and unset, as diffusers'
// pipelines do.
std::optional<std::string> negative_to_encode(const DenoiserSpec& spec, const VideoGenSettings& s);

// The edits of the model's weights the settings ask for; std::invalid_argument naming the property.
DenoiserFiles denoiser_files(const VideoGenSettings& s);

// The generator options and caps for the settings; throws std::invalid_argument naming the setting. `encoded` holds
// the prompts' embeddings when the prompt property is set; `ranks` the denoiser of each device (one without
// devices), loaded from `model_dir` (where image= finds the VAE); `element` receives the progress messages.
// `scheduled`: the embeddings of prompt-schedule's prompts, in its order (encoded where prompt is).
Run plan_run(const std::vector<std::shared_ptr<const Denoiser>>& ranks, const VideoGenSettings& s,
             const PromptEmbeddings* encoded, const std::string& model_dir, GstElement* element,
             const std::vector<torch::Tensor>& scheduled = {});

}  // namespace latent::gst
