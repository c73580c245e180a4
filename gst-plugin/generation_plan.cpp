// Settings to a run: generator options, caps, frame counts.
#include "generation_plan.h"

#include <torch/types.h>

#include <algorithm>
#include <numeric>
#include <sstream>
#include <stdexcept>

#include "generation_image.h"
#include "generation_progress.h"
#include "latent/io/safetensors.h"

namespace latent::gst {

LatentFrameStamp stamp_for(const Run& run, uint64_t k) {
  const uint64_t tf = uint64_t(run.caps.temporal_factor);
  LatentFrameStamp s;
  s.first_frame = k == 0 ? 0 : 1 + tf * (k - 1);
  s.end_frame = k == 0 ? 1 : 1 + tf * k;
  if (run.video_frames > 0) s.end_frame = std::min<uint64_t>(s.end_frame, run.video_frames);
  const Fraction fps = run.caps.video_framerate;
  const auto time_of = [&](uint64_t frame) {
    return gst_util_uint64_scale(frame, GST_SECOND * uint64_t(fps.den), uint64_t(fps.num));
  };
  s.pts = time_of(s.first_frame);
  s.duration = time_of(s.end_frame) - s.pts;
  return s;
}

namespace {

uint64_t latents_for_frames(uint64_t frames, int64_t temporal_factor) {
  return frames == 0 ? 0 : 1 + (frames - 1 + uint64_t(temporal_factor) - 1) / uint64_t(temporal_factor);
}

// A safetensors file with `prompt_embeds` [1, L, D] and, for guidance, `negative_prompt_embeds`; for the causal
// schedule also `prompt_embeds@N`, the prompt from latent frame N on (a scripted switch).
void load_prompt_embeds(const std::string& path, GeneratorOptions& o) {
  SafetensorsFile file = SafetensorsFile::open(path);
  if (!file.contains("prompt_embeds"))
    throw std::invalid_argument("prompt-embeds file " + path +
                                " has no tensor \"prompt_embeds\" (write it with latent-prompt)");
  o.text = file.tensor("prompt_embeds").to(torch::kFloat).clone();
  if (file.contains("negative_prompt_embeds"))
    o.negative_text = file.tensor("negative_prompt_embeds").to(torch::kFloat).clone();
  const std::string tag = "prompt_embeds@";
  for (const std::string& name : file.names()) {
    if (name.rfind(tag, 0) != 0) continue;
    const std::string n = name.substr(tag.size());
    if (n.empty() || n.size() > 12 || n.find_first_not_of("0123456789") != std::string::npos)
      throw std::invalid_argument("prompt-embeds file " + path + ": tensor \"" + name +
                                  "\" is not prompt_embeds@N with N a latent frame");
    if (o.schedule != ScheduleKind::causal)
      throw std::invalid_argument("prompt-embeds file " + path + " holds prompt switches (" + name +
                                  "): they need schedule=causal");
    o.prompt_switches.push_back({std::stoll(n), file.tensor(name).to(torch::kFloat).clone(), name});
  }
  std::sort(o.prompt_switches.begin(), o.prompt_switches.end(),
            [](const PromptSwitch& a, const PromptSwitch& b) { return a.frame < b.frame; });
}

// The guidance a run uses: the property, or the model's recommendation.
double effective_guidance(const DenoiserSpec& spec, const VideoGenSettings& s) {
  return s.guidance == kModelGuidance ? spec.guidance : s.guidance;
}

}  // namespace

std::optional<std::string> negative_to_encode(const DenoiserSpec& spec, const VideoGenSettings& s) {
  // The causal schedule runs without guidance unless told otherwise (and then refuses it).
  if (s.schedule == int(ScheduleKind::causal) && s.guidance == kModelGuidance) return std::nullopt;
  if (effective_guidance(spec, s) <= 1.0) return std::nullopt;
  return s.negative_prompt.value_or("");
}

namespace {

// fifo, endless in constant memory, where the model gives each frame its own timestep; clip for a model that
// takes one timestep per call (CogVideoX), which only the clip schedule can drive.
ScheduleKind schedule_for(const DenoiserSpec& spec, int property) {
  if (property != kScheduleAuto) return ScheduleKind(property);
  return spec.per_frame_timesteps ? ScheduleKind::fifo : ScheduleKind::clip;
}
// Whose layout initial-noise files take: the `latents=` argument of the family's diffusers pipeline, Wan's
// [1, C, T, h, w] or CogVideoX's [1, T, C, h, w].
bool frames_before_channels(const DenoiserSpec& spec) { return spec.latent_space.rfind("cogvideox", 0) == 0; }

// The starting latents of a clip from a safetensors file holding one tensor, in the generator's [1, C, T, h, w].
torch::Tensor load_initial_noise(const std::string& path, const DenoiserSpec& spec,
                                 const GeneratorOptions& o) {
  const bool causal = o.schedule == ScheduleKind::causal;
  if (o.schedule != ScheduleKind::clip && !causal)
    throw std::invalid_argument(
        "initial-noise needs schedule=clip or causal (fifo and rolling draw noise as frames enter)");
  if (causal && o.frames == 0) throw std::invalid_argument("initial-noise needs num-frames: an endless run has no end");
  SafetensorsFile file = SafetensorsFile::open(path);
  const auto names = file.names();
  if (names.size() != 1)
    throw std::invalid_argument("initial-noise file " + path + " holds " + std::to_string(names.size()) +
                                " tensors; it must hold exactly one, the starting latents");
  torch::Tensor t = file.tensor(names.front()).to(torch::kFloat).clone();
  // The causal references draw their noise frames first, as CogVideoX's pipeline; a run of whole blocks.
  const bool tc = frames_before_channels(spec) || causal;
  const int64_t chunk = o.causal.chunk_frames;
  const int64_t frames = causal ? (o.frames + chunk - 1) / chunk * chunk : o.frames;
  std::vector<int64_t> want = {1, spec.channels, frames, o.height, o.width};
  if (tc) std::swap(want[1], want[2]);
  if (t.sizes() != c10::IntArrayRef(want)) {
    std::ostringstream got, expected;
    got << t.sizes();
    expected << c10::IntArrayRef(want);
    throw std::invalid_argument("initial-noise " + path + " has shape " + got.str() + "; these settings need " +
                                expected.str() + (tc ? " ([1, T, C, h, w]" : " ([1, C, T, h, w]") +
                                ", the layout of the pipeline's latents=)");
  }
  // Named here, where the file and the tensor are known; the generator would refuse it too, without them.
  const int64_t nan = torch::isnan(t).sum().item<int64_t>(), inf = torch::isinf(t).sum().item<int64_t>();
  if (nan > 0 || inf > 0)
    throw std::invalid_argument("initial-noise " + path + ": tensor \"" + names.front() + "\" holds " +
                                std::to_string(nan) + " NaN and " + std::to_string(inf) +
                                " infinite values; the starting latents must be finite");
  return tc ? t.permute({0, 2, 1, 3, 4}).contiguous() : t;
}
}  // namespace

std::vector<ScheduledPrompt> parse_prompt_schedule(const std::string& text) {
  std::vector<ScheduledPrompt> out;
  if (text.empty()) return out;
  // Entries split at single '|'; "||" is a '|' of the prompt.
  std::vector<std::string> entries(1);
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '|' && i + 1 < text.size() && text[i + 1] == '|') {
      entries.back() += '|';
      ++i;
    } else if (text[i] == '|') {
      entries.emplace_back();
    } else {
      entries.back() += text[i];
    }
  }
  for (const std::string& e : entries) {
    const size_t colon = e.find(':');
    const std::string n = colon == std::string::npos ? "" : e.substr(0, colon);
    const size_t first = n.find_first_not_of(' '), last = n.find_last_not_of(' ');
    const std::string digits = first == std::string::npos ? "" : n.substr(first, last - first + 1);
    if (digits.empty() || digits.size() > 12 || digits.find_first_not_of("0123456789") != std::string::npos)
      throw std::invalid_argument("prompt-schedule: \"" + e +
                                  "\" is not N:TEXT (N the latent frame the prompt starts at)");
    const int64_t frame = std::stoll(digits);
    if (!out.empty() && frame <= out.back().frame)
      throw std::invalid_argument("prompt-schedule: frame " + std::to_string(frame) + " after frame " +
                                  std::to_string(out.back().frame) + ": frames must ascend");
    out.push_back({frame, e.substr(colon + 1)});
  }
  return out;
}

std::vector<int64_t> parse_denoising_steps(const std::string& text) {
  std::vector<int64_t> out;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    const size_t a = item.find_first_not_of(' '), b = item.find_last_not_of(' ');
    const std::string v = a == std::string::npos ? "" : item.substr(a, b - a + 1);
    if (v.empty() || v.size() > 4 || v.find_first_not_of("0123456789") != std::string::npos || std::stoll(v) > 1000)
      throw std::invalid_argument("denoising-steps: \"" + item + "\" is not a step in [0, 1000]");
    out.push_back(std::stoll(v));
  }
  if (out.empty()) throw std::invalid_argument("denoising-steps is empty");
  return out;
}

DenoiserFiles denoiser_files(const VideoGenSettings& s) {
  const auto loras = [](const std::string& property, const std::string& text) {
    try {
      return parse_lora_list(text);
    } catch (const std::invalid_argument& e) {
      throw std::invalid_argument(property + ": " + e.what());
    }
  };
  DenoiserFiles files;
  files.first.transformer_weights = s.transformer_weights;
  files.first.loras = loras("lora", s.lora);
  files.second.loras = loras("lora-2", s.lora_2);
  return files;
}

Run plan_run(const std::vector<std::shared_ptr<const Denoiser>>& ranks, const VideoGenSettings& s,
             const PromptEmbeddings* encoded, const std::string& model_dir, GstElement* element,
             const std::vector<torch::Tensor>& scheduled) {
  const std::shared_ptr<const Denoiser>& model = ranks.front();
  const DenoiserSpec& spec = model->spec();
  GeneratorOptions o;
  if (!s.image.empty() && !spec.image_condition)
    throw std::invalid_argument("image: this model (" + spec.backend +
                                ") does not take an image; image to video needs a Wan 2.2 TI2V folder "
                                "(model_index.json's expand_timesteps)");
  // Image to video conditions a clip's first frame: the clip schedule, as the reference pipeline runs it.
  o.schedule = s.image.empty() || s.schedule != kScheduleAuto ? schedule_for(spec, s.schedule)
                                                               : ScheduleKind::clip;
  if (!s.image.empty() && o.schedule != ScheduleKind::clip)
    throw std::invalid_argument("image needs schedule=clip (the image is the first frame of one clip)");
  if (s.guidance_2 >= 0.0 && spec.expert_boundary <= 0.0)
    throw std::invalid_argument("guidance-scale-2 is the second expert's guidance (Wan 2.2 A14B); this model (" +
                                spec.backend + ") has one network");
  o.sampler = spec.sampler;
  if (s.sampler != SAMPLER_DEFAULT)
    o.sampler.kind = s.sampler == SAMPLER_EULER   ? SamplerKind::euler
                     : s.sampler == SAMPLER_UNIPC ? SamplerKind::unipc
                     : s.sampler == SAMPLER_DPM   ? SamplerKind::dpm
                                                  : SamplerKind::ddim;
  if (s.steps > 0) o.sampler.steps = s.steps;
  if (s.shift > 0.0) o.sampler.shift = s.shift;
  o.guidance = effective_guidance(spec, s);
  o.guidance_2 = s.guidance_2;
  if (o.schedule == ScheduleKind::causal) {
    // Causal few-step models are distilled without guidance: the folder's scale is its base pipeline's.
    if (s.guidance == kModelGuidance) o.guidance = 1.0;
    o.causal.chunk_frames = s.chunk_frames;
    o.causal.kv_window = s.kv_window;
    o.causal.sink_frames = s.sink_frames;
    o.causal.global_sink = s.global_sink;
    o.causal.denoising_steps = parse_denoising_steps(s.denoising_steps);
    o.causal.context_noise = s.context_noise;
    o.causal.warp = s.warp_denoising_steps;
    if (s.shift > 0.0) o.causal.shift = s.shift;
  }
  o.seed = s.seed;
  o.window = s.window;
  o.progress = progress_poster(element);

  const int64_t sf = spec.spatial_factor;
  if ((s.width == 0) != (s.height == 0)) throw std::invalid_argument("set both width and height, or neither");
  if (s.width > 0) {
    const int64_t unit = sf * spec.size_multiple;
    if (s.width % unit != 0 || s.height % unit != 0)
      throw std::invalid_argument("width and height must be multiples of " + std::to_string(unit) +
                                  " pixels for this model (" + std::to_string(sf) +
                                  " per latent, latents in multiples of " + std::to_string(spec.size_multiple) +
                                  "); got " + std::to_string(s.width) + "x" + std::to_string(s.height));
    o.width = s.width / sf;
    o.height = s.height / sf;
  } else if (spec.native_height > 0) {
    o.width = spec.native_width;
    o.height = spec.native_height;
  } else {
    throw std::invalid_argument("this model declares no size: set width and height");
  }
  const int64_t window = o.window > 0 ? o.window : default_window(spec);
  if (o.schedule == ScheduleKind::rolling)
    o.context = s.context == kAutoContext ? std::max<int64_t>(1, window / 4) : s.context;

  Run run;
  uint64_t latents = 0;
  if (s.num_frames >= 0) {
    run.video_frames = uint64_t(s.num_frames);
    latents = latents_for_frames(run.video_frames, spec.temporal_factor);
  } else if (o.schedule == ScheduleKind::clip) {
    latents = uint64_t(window);  // an endless clip is one window
    run.video_frames = 1 + uint64_t(spec.temporal_factor) * (latents - 1);
  }
  if (o.schedule == ScheduleKind::clip && latents > uint64_t(window))
    throw std::invalid_argument("num-frames " + std::to_string(s.num_frames) + " needs " + std::to_string(latents) +
                                " latents; the clip schedule makes at most " + std::to_string(window) + " (" +
                                std::to_string(1 + spec.temporal_factor * (window - 1)) +
                                " frames): use schedule=fifo or rolling for longer videos");
  o.frames = int64_t(latents);
  if (s.prompt && !s.prompt_embeds.empty()) throw std::invalid_argument("set prompt or prompt-embeds, not both");
  if (s.negative_prompt && !s.prompt)
    throw std::invalid_argument("negative-prompt needs prompt (precomputed embeddings carry their own negative)");
  if (!s.prompt_embeds.empty()) load_prompt_embeds(s.prompt_embeds, o);
  const std::vector<ScheduledPrompt> schedule = parse_prompt_schedule(s.prompt_schedule);
  if (!schedule.empty()) {
    if (o.schedule != ScheduleKind::causal) throw std::invalid_argument("prompt-schedule needs schedule=causal");
    if (!s.prompt)
      throw std::invalid_argument(
          "prompt-schedule's prompts are encoded by the folder's text encoder: set prompt "
          "(with prompt-embeds, put prompt_embeds@N tensors in its file instead)");
    if (scheduled.size() != schedule.size())
      throw std::invalid_argument("prompt-schedule: its prompts were not encoded");
    for (size_t i = 0; i < schedule.size(); ++i)
      o.prompt_switches.push_back({schedule[i].frame, scheduled[i].to(torch::kFloat), schedule[i].text});
  }
  if (spec.text_tokens == 0 && s.prompt) throw std::invalid_argument("this model takes no text: unset prompt");
  if (s.prompt && encoded && encoded->prompt.defined()) {
    o.text = encoded->prompt.to(torch::kFloat);
    if (encoded->negative.defined()) o.negative_text = encoded->negative.to(torch::kFloat);
  }
  if (spec.text_tokens > 0 && !o.text.defined())
    throw std::invalid_argument("this model needs text: set prompt (or prompt-embeds, [1, " +
                                std::to_string(spec.text_tokens) + ", " + std::to_string(spec.text_dim) +
                                "] embeddings from latent-prompt)");
  if (!s.initial_noise.empty()) o.initial_noise = load_initial_noise(s.initial_noise, spec, o);
  if (!s.image.empty())
    o.condition = encode_image(read_image(s.image, int(o.width * sf), int(o.height * sf)), model_dir, spec,
                               model->device());
  if (latents > 0 || s.num_frames < 0) run.generator = make_frames(ranks, o, s.parallel, s.model, run.plan);

  run.causal = o.schedule == ScheduleKind::causal;
  LatentCapsInfo& c = run.caps;
  c.model = spec.latent_space;
  c.format = s.format;
  c.channels = int(spec.channels);
  c.width = int(o.width);
  c.height = int(o.height);
  c.temporal_factor = int(spec.temporal_factor);
  c.spatial_factor = int(sf);
  c.video_width = int(o.width * sf);
  c.video_height = int(o.height * sf);
  c.video_framerate = s.framerate;
  const int g = std::gcd(s.framerate.num, s.framerate.den * c.temporal_factor);
  c.framerate = {s.framerate.num / g, s.framerate.den * c.temporal_factor / g};
  return run;
}

}  // namespace latent::gst
