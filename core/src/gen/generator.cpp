// Generator: checks the options against the denoiser once, then drives a schedule.
#include "latent/gen/generator.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/utils.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <mutex>
#include <optional>
#include <sstream>
#include <stdexcept>

#include "gen/layer_interrupt.h"
#include "gen/models/causal_model.h"
#include "gen/sampling/schedule.h"
#include "latent/runtime/devices.h"

namespace latent {
namespace {

[[noreturn]] void bad_option(const std::string& what) { throw std::invalid_argument("generator: " + what); }

// "" for a tensor of finite values, else how many NaN and infinite values it holds ("3 NaN and 1 infinite values").
std::string non_finite_values(const torch::Tensor& t) {
  const int64_t nan = torch::isnan(t).sum().item<int64_t>(), inf = torch::isinf(t).sum().item<int64_t>();
  if (nan == 0 && inf == 0) return "";
  std::string out;
  if (nan > 0) out = std::to_string(nan) + " NaN";
  if (inf > 0) out += (out.empty() ? "" : " and ") + std::to_string(inf) + " infinite";
  return out + (nan + inf == 1 ? " value" : " values");
}

void check_text(const DenoiserSpec& spec, const GeneratorOptions& o) {
  if (!std::isfinite(o.guidance) || o.guidance < 0.0) bad_option("guidance must be a finite number >= 0");
  if (spec.text_tokens == 0) {
    if (o.text.defined() || o.negative_text.defined())
      bad_option("this model takes no text conditioning; leave text and negative_text unset");
    if (o.guidance > 1.0)
      bad_option("guidance mixes text and negative text predictions; this model takes no text conditioning");
    return;
  }
  const auto fits = [&](const torch::Tensor& t) {
    return t.defined() && t.dim() == 3 && t.size(0) == 1 && t.size(1) == spec.text_tokens &&
           t.size(2) == spec.text_dim && t.is_floating_point();
  };
  const std::string shape = "[1, " + std::to_string(spec.text_tokens) + ", " + std::to_string(spec.text_dim) + "]";
  if (!fits(o.text)) bad_option("text must be prompt embeddings " + shape);
  // One NaN in the embeddings reaches every latent through cross-attention.
  if (const std::string bad = non_finite_values(o.text); !bad.empty()) bad_option("text holds " + bad);
  if (o.guidance > 1.0 && !fits(o.negative_text))
    bad_option("guidance " + std::to_string(o.guidance) + " needs negative_text " + shape +
               " (the embeddings of the negative or empty prompt)");
}

std::string gib(size_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f GiB", double(bytes) / double(size_t(1) << 30));
  return buf;
}

// A size whose latents alone cannot fit is refused before the first allocation, instead of a run that swaps
// or dies minutes later; so is a causal window whose key/value cache cannot, which at real sizes is by far the
// larger (Wan 1.3B at 480x832 in bf16: 0.4 MB of latents a frame against 288 MB of keys and values, so a window
// of 1,024 frames needs about 295 GB).
void check_memory(const GeneratorOptions& o, const Denoiser& model) {
  const torch::Device device = model.device();
  const size_t latents = Generator::latent_bytes_lower_bound(o, model.spec().channels);
  size_t kv = 0, call = 0;
  if (o.schedule == ScheduleKind::causal)
    if (const CausalModel* causal = causal_model(model)) {
      kv = causal->kv_bytes_per_frame(o.height, o.width) * size_t(o.causal.kv_window + o.causal.chunk_frames);
      call = causal->call_bytes(o.causal.chunk_frames, o.height, o.width);
    }
  const size_t have = available_memory(device);
  if (have == 0) return;
  const std::string size = "a latent size of " + std::to_string(o.height) + "x" + std::to_string(o.width);
  if (latents > have)
    bad_option(size + " needs at least " + gib(latents) + " for the latents alone (" + schedule_kind_name(o.schedule) +
               " schedule), and " + device.str() + " has " + gib(have) + " available: choose a smaller size");
  if (latents + kv + call > have)
    bad_option(size + " with kv_window " + std::to_string(o.causal.kv_window) + " needs at least " + gib(kv) +
               " for the key/value cache (the window and a block, every layer's keys and values), " + gib(call) +
               " for one model call's activations and " + gib(latents) + " for the latents, and " + device.str() +
               " has " + gib(have) + " available: choose a smaller kv_window or size");
}

void check_causal(const Denoiser& model, GeneratorOptions& o, bool ranks) {
  const DenoiserSpec& spec = model.spec();
  CausalOptions& c = o.causal;
  if (!causal_model(model))
    bad_option("the causal schedule needs a model that runs over a key/value cache (a native Wan transformer); " +
               spec.backend + " does not");
  if (ranks) bad_option("the causal schedule runs on one device");
  if (o.guidance > 1.0) bad_option("the causal schedule runs without guidance: set guidance to 1");
  if (o.condition.defined()) bad_option("condition (image to video) is for the clip schedule, not causal");
  if (c.chunk_frames < 1 || c.chunk_frames > spec.window)
    bad_option("chunk_frames " + std::to_string(c.chunk_frames) + ": the model takes 1 to " +
               std::to_string(spec.window) + " latent frames per call");
  if (c.sink_frames < 0) bad_option("sink_frames must be >= 0");
  if (c.kv_window == 0) c.kv_window = std::max(default_window(spec), c.sink_frames + c.chunk_frames);
  if (c.kv_window < c.sink_frames + c.chunk_frames || c.kv_window > spec.window)
    bad_option("kv_window " + std::to_string(c.kv_window) + ": must hold the sink (" + std::to_string(c.sink_frames) +
               ") and a block (" + std::to_string(c.chunk_frames) + "), at most " + std::to_string(spec.window) +
               " latent frames");
  if (c.denoising_steps.empty()) bad_option("denoising_steps is empty");
  for (int64_t s : c.denoising_steps)
    if (s < 0 || s > 1000) bad_option("denoising_steps holds " + std::to_string(s) + ": steps are in [0, 1000]");
  if (!std::isfinite(c.shift) || c.shift <= 0) bad_option("shift must be a finite number > 0");
  if (!std::isfinite(c.context_noise) || c.context_noise < 0 || c.context_noise > 1000)
    bad_option("context_noise must be in [0, 1000]");
  int64_t last = -1;
  for (const PromptSwitch& p : o.prompt_switches) {
    if (p.frame < 0 || p.frame < last) bad_option("prompt switches must be at ascending latent frames >= 0");
    last = p.frame;
    GeneratorOptions one = o;
    one.text = p.text;
    try {
      check_text(spec, one);
    } catch (const std::invalid_argument& e) {
      bad_option("the prompt switch at frame " + std::to_string(p.frame) + ": " +
                 std::string(e.what()).substr(std::string("generator: ").size()));
    }
  }
}

}  // namespace

size_t Generator::latent_bytes_lower_bound(const GeneratorOptions& o, int64_t channels) {
  const size_t frame = size_t(std::max<int64_t>(channels, 1)) * size_t(std::max<int64_t>(o.height, 1)) *
                       size_t(std::max<int64_t>(o.width, 1)) * sizeof(float);
  // In flight: clip holds its frames, rolling a window, fifo its queue of `steps` + 1 frames; each frame with its
  // sampler history (UniPC keeps two earlier predictions). What one iteration's calls hold comes on top: their
  // inputs and predictions (two with guidance) for the frames in a call, which for fifo are all of its partitions
  // at once (predicted together so ranks can share them). Counted from the frames a call really has, never from
  // the window alone: a one-frame clip of a model whose window is 1,024 frames holds one frame.
  const int64_t window = std::max<int64_t>(o.window, 1);
  const int64_t queue = std::max<int64_t>(o.sampler.steps, 1) + 1;
  const int64_t finite_or = o.frames > 0 ? o.frames : std::numeric_limits<int64_t>::max();
  const int64_t causal = std::max<int64_t>(o.causal.kv_window, 1) + std::max<int64_t>(o.causal.chunk_frames, 1);
  const int64_t held = o.schedule == ScheduleKind::fifo     ? queue
                       : o.schedule == ScheduleKind::clip   ? std::max<int64_t>(o.frames, 1)
                       : o.schedule == ScheduleKind::causal ? causal
                                                            : std::min(window, finite_or);
  const int64_t outputs = o.guidance > 1.0 ? 2 : 1;
  const size_t per_frame_state = o.sampler.kind == SamplerKind::unipc ? 3 : o.sampler.kind == SamplerKind::dpm ? 2 : 1;
  return frame * size_t(held) * (per_frame_state + 1 + size_t(outputs));
}

int64_t default_window(const DenoiserSpec& spec) {
  return spec.native_frames > 0 ? std::min(spec.native_frames, spec.window) : spec.window;
}

ScheduleKind parse_schedule_kind(const std::string& name) {
  if (name == "clip") return ScheduleKind::clip;
  if (name == "fifo") return ScheduleKind::fifo;
  if (name == "rolling") return ScheduleKind::rolling;
  if (name == "causal") return ScheduleKind::causal;
  throw std::invalid_argument("unknown schedule \"" + name + "\": expected clip, fifo, rolling or causal");
}

const char* schedule_kind_name(ScheduleKind kind) {
  switch (kind) {
    case ScheduleKind::clip: return "clip";
    case ScheduleKind::fifo: return "fifo";
    case ScheduleKind::rolling: return "rolling";
    case ScheduleKind::causal: return "causal";
  }
  return "?";
}

Denoising::Denoising(const Denoiser& model, const Sampler& sampler, const GeneratorOptions& options, int64_t height,
                     int64_t width, std::unique_ptr<CallExecutor> executor)
    : model_(model),
      sampler_(sampler),
      guidance_(options.guidance),
      guidance_2_(options.guidance_2 < 0.0 ? options.guidance : options.guidance_2),
      expert_boundary_(model.spec().expert_boundary),
      channels_(model.spec().channels),
      height_(height),
      width_(width),
      frames_first_(model.spec().noise_frames_first),
      cpu_generator_(at::make_generator<at::CPUGeneratorImpl>(options.seed)),
      executor_(executor ? std::move(executor) : make_local_executor()),
      on_progress_(options.progress) {
  // Moved to the model once, not at every call.
  if (options.text.defined()) text_ = options.text.to(model.device(), model.dtype());
  if (options.negative_text.defined() && guided())
    negative_text_ = options.negative_text.to(model.device(), model.dtype());
  if (options.initial_noise.defined()) initial_noise_ = options.initial_noise.to(model.device(), torch::kFloat);
  if (options.condition.defined()) condition_ = options.condition.to(model.device(), torch::kFloat);
}

double Denoising::level(int64_t step) const {
  return step >= sampler_.steps() ? 0.0 : double(static_cast<float>(sampler_.timestep(step)));
}

torch::Tensor Denoising::conditioned(const torch::Tensor& x) const {
  if (!condition_.defined()) return x;
  // diffusers mixes (1 - mask) * condition + mask * latents with a 0/1 mask: the same values as a copy.
  torch::Tensor out = x.clone();
  out.narrow(2, 0, condition_.size(2)).copy_(condition_);
  return out;
}

std::vector<torch::Tensor> Denoising::predict(const std::vector<ModelCall>& calls) {
  std::vector<torch::Tensor> out = executor_->run(*this, calls);
  iteration_done();
  return out;
}

void Denoising::iteration_done() {
  ++progress_.iteration;
  if (on_progress_) on_progress_(progress_);
}

torch::Tensor Denoising::predict(const torch::Tensor& x, const std::vector<int64_t>& steps) {
  return predict(std::vector<ModelCall>{{x, steps}}).at(0);
}

torch::Tensor Denoising::evaluate(const ModelCall& call, bool uncond, parallel::Communicator* sequence_group) const {
  // Filled on the host and wrapped once: indexing a tensor element by element costs a dispatch per frame.
  std::vector<float> levels(call.steps.size());
  for (size_t j = 0; j < call.steps.size(); ++j) levels[j] = static_cast<float>(level(call.steps[j]));
  // The condition's frames are clean: timestep 0 for their tokens (the clip schedule's calls start at frame 0).
  if (condition_.defined())
    std::fill_n(levels.begin(), std::min<size_t>(levels.size(), size_t(condition_.size(2))), 0.0f);
  const torch::Tensor timesteps = torch::tensor(levels).view({1, -1});
  check_interrupted();
  const torch::Tensor& text = uncond ? negative_text_ : text_;
  // A group's ranks all get here with the same call: they share the one prediction (Ulysses).
  return model_.predict(conditioned(call.x), timesteps, text, sequence_group);
}

torch::Tensor Denoising::guide(const ModelCall& call, const torch::Tensor& cond, const torch::Tensor& uncond) const {
  // The expert is chosen by the call's (integer) timestep, as the denoiser chooses it: every frame of a two-expert
  // model's call shares it.
  const bool second = expert_boundary_ > 0.0 && !call.steps.empty() && level(call.steps.back()) < expert_boundary_;
  // diffusers' order of operations, so a clip matches its pipelines bit for bit where the model does.
  return uncond + (second ? guidance_2_ : guidance_) * (cond - uncond);
}

void Denoising::check_interrupted() const {
  if (interrupted_.load(std::memory_order_relaxed)) throw Interrupted("generation interrupted");
}

torch::Tensor Denoising::noise(int64_t frames) {
  // Drawn by the CPU generator, as diffusers' pipelines draw their seeded noise, so a seed gives their numbers. For
  // a GPU the draw goes straight into pinned memory and is copied without waiting: a stochastic sampler draws at
  // every step, and a blocking copy would stall the host behind the device's queue each time.
  const torch::Device device = model_.device();
  const bool pinned = device.is_cuda();
  const auto host = torch::TensorOptions().dtype(torch::kFloat).pinned_memory(pinned);
  const torch::Tensor drawn =
      frames_first_
          ? torch::randn({1, frames, channels_, height_, width_}, cpu_generator_, host).permute({0, 2, 1, 3, 4})
          : torch::randn({1, channels_, frames, height_, width_}, cpu_generator_, host);
  return drawn.to(device, /*non_blocking=*/pinned);
}

StepNoise Denoising::step_noise(const torch::Tensor& x) {
  return [this, frames = x.size(2)] { return noise(frames); };
}

torch::Tensor Denoising::clip_noise(int64_t frames) {
  return initial_noise_.defined() ? initial_noise_.clone() : noise(frames);
}

void Denoising::reseed(uint64_t seed) { cpu_generator_.set_current_seed(seed); }

torch::Tensor Denoising::noise_state() const { return cpu_generator_.get_state(); }

void Denoising::restore_noise_state(const torch::Tensor& state) { cpu_generator_.set_state(state); }

namespace {

class LocalExecutor final : public CallExecutor {
 public:
  std::vector<torch::Tensor> run(Denoising& d, const std::vector<ModelCall>& calls) override {
    std::vector<torch::Tensor> out;
    out.reserve(calls.size());
    for (const ModelCall& c : calls) {
      torch::Tensor cond = d.evaluate(c, false);
      d.count_calls(1);
      if (!d.guided()) {
        out.push_back(std::move(cond));
        continue;
      }
      torch::Tensor uncond = d.evaluate(c, true);
      d.count_calls(1);
      out.push_back(d.guide(c, cond, uncond));
    }
    return out;
  }
};

}  // namespace

std::unique_ptr<CallExecutor> make_local_executor() { return std::make_unique<LocalExecutor>(); }

struct Generator::Impl {
  Sampler sampler;
  Denoising denoising;
  std::unique_ptr<Schedule> schedule;
  // reset() replaces the schedule while switch_prompt() may reach it from another thread.
  std::mutex schedule_mutex;
  std::optional<PromptSwitch> live_prompt;  // the last switch_prompt(), which reset() keeps
  Impl(const Denoiser& model, const GeneratorOptions& o, int64_t height, int64_t width,
       std::unique_ptr<CallExecutor> executor)
      : sampler(o.sampler, model.spec().prediction), denoising(model, sampler, o, height, width, std::move(executor)) {}
};

Generator::Generator(std::shared_ptr<const Denoiser> denoiser, GeneratorOptions options)
    : Generator(std::move(denoiser), std::move(options), nullptr) {}

Generator::Generator(std::shared_ptr<const Denoiser> denoiser, GeneratorOptions options,
                     std::unique_ptr<CallExecutor> executor)
    : denoiser_(std::move(denoiser)), options_(std::move(options)) {
  if (!denoiser_) bad_option("no denoiser");
  const DenoiserSpec& spec = denoiser_->spec();
  GeneratorOptions& o = options_;
  if (o.height == 0) o.height = spec.height;
  if (o.width == 0) o.width = spec.width;
  if (o.height <= 0 || o.width <= 0) bad_option("set the latent height and width (the model does not fix them)");
  if (spec.height > 0 && (o.height != spec.height || o.width != spec.width))
    bad_option("latent size " + std::to_string(o.height) + "x" + std::to_string(o.width) + ": the model takes " +
               std::to_string(spec.height) + "x" + std::to_string(spec.width));
  if (o.height % spec.size_multiple != 0 || o.width % spec.size_multiple != 0)
    bad_option("latent height and width must be multiples of " + std::to_string(spec.size_multiple));
  if (o.window == 0) o.window = default_window(spec);
  if (o.window < spec.min_frames || o.window > spec.window)
    bad_option("window " + std::to_string(o.window) + ": the model takes " + std::to_string(spec.min_frames) + " to " +
               std::to_string(spec.window) + " latent frames per call");
  if (o.frames < 0) bad_option("frames must be >= 0");
  // fifo's queue and rolling's carried frames put frames of one model call at different noise levels.
  if (o.schedule != ScheduleKind::clip && !spec.per_frame_timesteps)
    bad_option(std::string("the ") + schedule_kind_name(o.schedule) + " schedule gives the frames of one model call " +
               "different timesteps, and this model (" + spec.backend +
               ") takes one timestep per call: use the clip schedule");
  if (o.schedule == ScheduleKind::causal) check_causal(*denoiser_, o, executor != nullptr);
  if (o.initial_noise.defined()) {
    if (o.schedule != ScheduleKind::clip && o.schedule != ScheduleKind::causal)
      bad_option(std::string("initial_noise is for the clip and causal schedules, not ") +
                 schedule_kind_name(o.schedule));
    const int64_t frames = o.schedule == ScheduleKind::causal
                               ? (o.frames + o.causal.chunk_frames - 1) / o.causal.chunk_frames * o.causal.chunk_frames
                               : o.frames;
    const std::vector<int64_t> want{1, spec.channels, frames, o.height, o.width};
    if (o.initial_noise.sizes() != c10::IntArrayRef(want) || !o.initial_noise.is_floating_point()) {
      std::ostringstream s;
      s << "initial_noise: expected a floating point " << c10::IntArrayRef(want) << ", got " << o.initial_noise.sizes()
        << " " << o.initial_noise.scalar_type();
      bad_option(s.str());
    }
    // One NaN or infinity spreads through attention to every latent within a step: refused here, not found later
    // as a video of NaN.
    if (const std::string bad = non_finite_values(o.initial_noise); !bad.empty())
      bad_option("initial_noise holds " + bad + ": the starting latents must be finite");
  }
  switch (o.schedule) {
    case ScheduleKind::clip:
      if (o.frames < spec.min_frames || o.frames > o.window)
        bad_option("a clip of " + std::to_string(o.frames) + " latent frames: the clip schedule makes " +
                   std::to_string(spec.min_frames) + " to " + std::to_string(o.window) +
                   " at once; use fifo or rolling for longer videos");
      break;
    case ScheduleKind::fifo:
      // The queue fills and drains a frame at a time, so partitions of one frame reach the model.
      if (spec.min_frames > 1)
        bad_option("fifo calls the model with a single frame while its queue fills; this model needs " +
                   std::to_string(spec.min_frames));
      break;
    case ScheduleKind::causal: break;
    case ScheduleKind::rolling:
      if (o.context < 0 || o.context >= o.window)
        bad_option("context " + std::to_string(o.context) +
                   ": must be in [0, window - 1 = " + std::to_string(o.window - 1) + "]");
      if (spec.min_frames > 1 && o.frames > 0)
        bad_option("a finite rolling run may end with a short window; this model needs " +
                   std::to_string(spec.min_frames) + " frames per call");
      break;
  }
  if (!std::isfinite(o.guidance_2)) bad_option("guidance_2 must be finite");
  if (o.guidance_2 >= 0.0 && spec.expert_boundary <= 0.0)
    bad_option("guidance_2 is the second expert's guidance; this model (" + spec.backend + ") has one network");
  if (o.condition.defined()) {
    if (o.schedule != ScheduleKind::clip)
      bad_option(std::string("condition (image to video) is for the clip schedule, not ") +
                 schedule_kind_name(o.schedule));
    if (!spec.per_frame_timesteps)
      bad_option("condition (image to video) gives its frames timestep 0; this model (" + spec.backend +
                 ") takes one timestep per call");
    const auto& c = o.condition;
    if (c.dim() != 5 || c.size(0) != 1 || c.size(1) != spec.channels || c.size(2) < 1 || c.size(2) > o.frames ||
        c.size(3) != o.height || c.size(4) != o.width || !c.is_floating_point()) {
      std::ostringstream s;
      s << "condition: expected floating point latents [1, " << spec.channels << ", 1.." << o.frames << ", " << o.height
        << ", " << o.width << "], got " << c.sizes();
      bad_option(s.str());
    }
    if (const std::string bad = non_finite_values(c); !bad.empty()) bad_option("condition holds " + bad);
  }
  check_text(spec, o);
  check_memory(options_, *denoiser_);
  impl_ = std::make_unique<Impl>(*denoiser_, options_, options_.height, options_.width, std::move(executor));
  reset(o.seed);
}

Generator::~Generator() = default;

void Generator::reset() { reset(options_.seed); }

void Generator::reset(uint64_t seed) {
  // One lock for the seed, the schedule and the live prompt: switch_prompt() reads them from another thread.
  std::lock_guard<std::mutex> lock(impl_->schedule_mutex);
  options_.seed = seed;
  impl_->denoising.reseed(seed);
  switch (options_.schedule) {
    case ScheduleKind::clip: impl_->schedule = make_clip_schedule(options_.frames); break;
    case ScheduleKind::fifo: impl_->schedule = make_fifo_schedule(options_.frames, options_.window); break;
    case ScheduleKind::rolling:
      impl_->schedule = make_rolling_schedule(options_.frames, options_.window, options_.context);
      break;
    case ScheduleKind::causal:
      impl_->schedule = make_causal_schedule(options_, *denoiser_, options_.height, options_.width);
      // A stream started again (a seek to the start) plays under the prompt it was switched to last, as a
      // restart with that prompt would, and a switch not yet taken is not lost.
      if (impl_->live_prompt) static_cast<CausalSchedule&>(*impl_->schedule).switch_prompt(*impl_->live_prompt);
      break;
  }
  impl_->denoising.start_progress(impl_->schedule->iterations(impl_->sampler.steps()));
}

std::vector<GeneratedFrame> Generator::next() {
  torch::NoGradGuard no_grad;
  const LayerInterrupt between_layers(impl_->denoising.interrupt_flag());
  while (!impl_->schedule->finished()) {
    // Schedules commit an iteration only when it completes; with the noise stream rewound too, a call that
    // throws (a GPU out of memory) can be retried and gives the frames an uninterrupted run gives.
    const torch::Tensor noise_state = impl_->denoising.noise_state();
    std::vector<GeneratedFrame> made;
    try {
      made = impl_->schedule->advance(impl_->denoising);
    } catch (...) {
      impl_->denoising.restore_noise_state(noise_state);
      impl_->denoising.executor().failed(std::current_exception());
      throw;
    }
    if (!made.empty()) return made;
  }
  return {};
}

bool Generator::finished() const { return impl_->schedule->finished(); }
void Generator::interrupt() { impl_->denoising.set_interrupted(true); }

void Generator::switch_prompt(const torch::Tensor& text, const std::string& label) {
  if (options_.schedule != ScheduleKind::causal)
    bad_option(std::string("prompts switch while playing in the causal schedule, not ") +
               schedule_kind_name(options_.schedule));
  GeneratorOptions o;
  {
    std::lock_guard<std::mutex> lock(impl_->schedule_mutex);
    o = options_;
  }
  o.text = text;
  o.prompt_switches.clear();
  check_text(denoiser_->spec(), o);
  std::lock_guard<std::mutex> lock(impl_->schedule_mutex);
  impl_->live_prompt = PromptSwitch{0, text, label};
  static_cast<CausalSchedule&>(*impl_->schedule).switch_prompt(*impl_->live_prompt);
}
void Generator::clear_interrupt() { impl_->denoising.set_interrupted(false); }
const Sampler& Generator::sampler() const { return impl_->sampler; }
size_t Generator::state_bytes() const { return impl_->schedule->bytes(); }
int64_t Generator::model_calls() const { return impl_->denoising.calls(); }

}  // namespace latent
