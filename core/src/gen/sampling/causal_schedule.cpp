// The causal schedule: Self-Forcing's block loop (pipeline/causal_inference.py) with LongLive's window, attention
// sink and prompt switches (KV re-cache). Memory is the key/value window and as many clean latents, whatever the
// length.
#include <ATen/CPUGeneratorImpl.h>
#include <torch/types.h>

#include <algorithm>
#include <deque>
#include <mutex>
#include <optional>

#include "gen/models/causal_model.h"
#include "gen/sampling/schedule.h"

namespace latent {
namespace {

// The flow schedule of the references' scheduler (FlowMatchScheduler, 1000 training steps, extra_one_step), in
// float32 as they compute it.
torch::Tensor flow_sigmas(double shift) {
  const torch::Tensor s = torch::linspace(1.0, 0.0, 1001, torch::kFloat).narrow(0, 0, 1000);
  return shift * s / (1 + (shift - 1) * s);
}

// The sigmas at the denoising steps: the grid's entry 1000 - step, step 0 being the clean end (sigma 0).
// Each step's model timestep and sigma. Warped (Self-Forcing, LongLive, CausVid's 4-step model): the grid's entry
// 1000 - step, step 0 being the clean end. Unwarped (CausVid's 3-step model): the step itself is the timestep,
// and its sigma the grid's at the nearest grid timestep (the first of equals), as their scheduler looks it up.
std::vector<std::pair<double, float>> step_levels(const CausalOptions& o) {
  const torch::Tensor sigmas = flow_sigmas(o.shift);
  const torch::Tensor grid = sigmas * 1000;
  std::vector<std::pair<double, float>> out;
  for (int64_t step : o.denoising_steps) {
    if (o.warp) {
      const float sigma = step == 0 ? 0.0f : sigmas[1000 - step].item<float>();
      out.emplace_back(double(sigma * 1000.0f), sigma);
    } else {
      const int64_t nearest = (grid - float(step)).abs().argmin().item<int64_t>();
      out.emplace_back(double(step), sigmas[nearest].item<float>());
    }
  }
  return out;
}

std::vector<float> step_sigmas(const CausalOptions& o) {
  std::vector<float> out;
  for (const auto& level : step_levels(o)) out.push_back(level.second);
  return out;
}

// Words of the generator's stream a draw of `n` float32 normals takes (one 32-bit word each for a draw of at
// least 16 values, which is every draw here: 16 or 48 channels times a frame).
void skip_draws(torch::Generator& g, int64_t n) {
  torch::Tensor sink = torch::empty({std::min<int64_t>(n, int64_t(1) << 20)}, torch::kFloat);
  while (n > 0) {
    const int64_t m = std::min(n, sink.numel());
    sink.narrow(0, 0, m).uniform_(0, 1, g);
    n -= m;
  }
}

class Causal final : public CausalSchedule {
 public:
  Causal(const GeneratorOptions& o, const Denoiser& model, int64_t height, int64_t width)
      : o_(o.causal),
        model_(*causal_model(model)),
        channels_(model.spec().channels),
        height_(height),
        width_(width),
        frames_(o.frames),
        sigmas_(step_sigmas(o.causal)),
        timesteps_(causal_timesteps(o.causal)),
        initial_(at::make_generator<at::CPUGeneratorImpl>(o.seed)),
        renoise_(at::make_generator<at::CPUGeneratorImpl>(o.seed)),
        switches_(o.prompt_switches.begin(), o.prompt_switches.end()) {
    cache_.window = o.causal.kv_window;
    cache_.sink = o.causal.sink_frames;
    for (PromptSwitch& s : switches_) s.text = s.text.to(model.device(), model.dtype());
    if (o.initial_noise.defined()) initial_noise_ = o.initial_noise.to(torch::kCPU, torch::kFloat);
    // The references draw the whole noise [1, T, C, h, w] first, then every re-noise: a finite run skips the
    // first stream's length in the second so that each block's noise can be drawn when its turn comes, in
    // constant memory. An endless run has no end to skip to: its one stream alternates each block's noise and
    // its re-noise draws.
    if (frames_ > 0) skip_draws(renoise_, padded_frames() * channels_ * height_ * width_);
  }

  void switch_prompt(const PromptSwitch& prompt) override {
    std::lock_guard<std::mutex> lock(pending_mutex_);
    pending_ = prompt;
  }

  std::vector<GeneratedFrame> advance(Denoising& d) override {
    if (finished()) return {};
    if (!text_.defined()) text_ = d.text();
    // A block commits only when it completes: the cache, the history and the noise streams are copied (the
    // tensors are never written in place, so copies of the handles are enough) and put back on a throw.
    const KvCache cache = cache_;
    const std::deque<torch::Tensor> history = history_;
    const torch::Tensor initial_state = initial_.get_state(), renoise_state = renoise_.get_state();
    const torch::Tensor text = text_;
    const size_t next_switch = next_switch_;
    const int64_t prompt_index = prompt_index_;
    taken_.reset();
    try {
      return block(d);
    } catch (...) {
      // A switch_prompt() the failed block took waits for the next one, unless a newer one came meanwhile.
      if (taken_) {
        std::lock_guard<std::mutex> lock(pending_mutex_);
        if (!pending_) pending_ = std::move(taken_);
      }
      cache_ = cache;
      history_ = history;
      initial_.set_state(initial_state);
      renoise_.set_state(renoise_state);
      text_ = text;
      next_switch_ = next_switch;
      prompt_index_ = prompt_index;
      throw;
    }
  }

  bool finished() const override { return frames_ > 0 && start_ >= frames_; }

  size_t bytes() const override {
    size_t b = cache_.bytes();
    for (const torch::Tensor& t : history_) b += t.nbytes();
    return b;
  }

  int64_t iterations(int64_t) const override {
    return frames_ > 0 ? (frames_ + o_.chunk_frames - 1) / o_.chunk_frames : 0;
  }

 private:
  int64_t padded_frames() const { return (frames_ + o_.chunk_frames - 1) / o_.chunk_frames * o_.chunk_frames; }

  // [1, C, n, h, w] drawn frame-major ([n, C, h, w]) as the references draw.
  torch::Tensor draw(torch::Generator& g, int64_t n, torch::Device device) const {
    return torch::randn({n, channels_, height_, width_}, g, torch::kFloat)
        .permute({1, 0, 2, 3})
        .unsqueeze(0)
        .to(device);
  }

  torch::Tensor block_noise(int64_t n, torch::Device device) {
    if (initial_noise_.defined()) return initial_noise_.narrow(2, start_, n).to(device);
    return draw(frames_ > 0 ? initial_ : renoise_, n, device);
  }

  // The prompt switch due at this block start, if any: a switch_prompt() call wins over a scripted one.
  std::optional<PromptSwitch> due_switch(const Denoising& d) {
    std::optional<PromptSwitch> due;
    if (next_switch_ < switches_.size() && switches_[next_switch_].frame <= start_) due = switches_[next_switch_++];
    std::lock_guard<std::mutex> lock(pending_mutex_);
    if (pending_) {
      taken_ = std::move(pending_);
      pending_.reset();
      due = *taken_;
      due->text = due->text.to(d.model().device(), d.model().dtype());
    }
    return due;
  }

  // LongLive's re-cache: the clean frames the window holds are run once at timestep context_noise under the new
  // prompt, and their keys and values replace the old ones. Past the window with a global sink, the old sink stays
  // and only the frames after it are made again; otherwise all of them, the sink too.
  void recache(Denoising& d) {
    const int64_t window = cache_.window, sink = cache_.sink;
    const bool keep_sink = start_ > window && o_.global_sink && sink > 0;
    const int64_t n = std::min<int64_t>(keep_sink ? window - sink : std::min(window, start_), history_.size());
    if (n == 0) return;
    std::vector<torch::Tensor> frames(history_.end() - n, history_.end());
    const torch::Tensor x = torch::cat(frames, 2);
    const torch::Tensor t = torch::full({1, n}, float(o_.context_noise));
    d.check_interrupted();
    model_.predict_cached(x, t, text_, cache_, start_ - n, keep_sink ? sink : 0);
    d.count_calls(1);
  }

  std::vector<GeneratedFrame> block(Denoising& d) {
    const torch::Device device = d.model().device();
    const int64_t n = o_.chunk_frames;
    bool switched = false;
    std::string label;
    if (std::optional<PromptSwitch> due = due_switch(d)) {
      text_ = due->text;
      // At the first block there is nothing to switch from: the stream starts under this prompt (a run started
      // again after a live switch), as its first.
      if (start_ > 0) {
        label = due->label;
        ++prompt_index_;
        switched = true;
        recache(d);
      }
    }
    cache_.make_room(n);
    const int64_t keep = cache_.size();
    torch::Tensor x = block_noise(n, device), x0;
    for (size_t k = 0; k < timesteps_.size(); ++k) {
      d.check_interrupted();
      const torch::Tensor v =
          model_.predict_cached(x, torch::full({1, n}, float(timesteps_[k])), text_, cache_, start_, keep);
      d.count_calls(1);
      x0 = (x.to(torch::kDouble) - double(sigmas_[k]) * v.to(torch::kDouble)).to(torch::kFloat);
      if (k + 1 < timesteps_.size()) {
        const float s = sigmas_[k + 1];
        x = (1.0f - s) * x0 + s * draw(renoise_, n, device);
      }
    }
    d.check_interrupted();
    model_.predict_cached(x0, torch::full({1, n}, float(o_.context_noise)), text_, cache_, start_, keep);
    d.count_calls(1);

    std::vector<GeneratedFrame> out;
    for (int64_t f = 0; f < n; ++f) {
      history_.push_back(x0.narrow(2, f, 1).clone());
      if (frames_ == 0 || start_ + f < frames_) {
        GeneratedFrame g{history_.back(), start_ + f};
        g.prompt_switch = switched && f == 0;
        g.prompt_index = prompt_index_;
        if (g.prompt_switch) g.prompt_label = label;
        out.push_back(std::move(g));
      }
    }
    while (int64_t(history_.size()) > cache_.window) history_.pop_front();
    start_ += n;
    d.iteration_done();
    return out;
  }

  const CausalOptions o_;
  const CausalModel& model_;
  const int64_t channels_, height_, width_, frames_;
  const std::vector<float> sigmas_;
  const std::vector<double> timesteps_;
  torch::Generator initial_, renoise_;
  torch::Tensor initial_noise_;
  std::vector<PromptSwitch> switches_;
  size_t next_switch_ = 0;
  int64_t prompt_index_ = 0;
  torch::Tensor text_;
  std::mutex pending_mutex_;
  std::optional<PromptSwitch> pending_;
  std::optional<PromptSwitch> taken_;  // the switch_prompt() the block in progress took
  KvCache cache_;
  std::deque<torch::Tensor> history_;  // the last kv_window clean frames, for a re-cache
  int64_t start_ = 0;                  // the next block's first frame
};

}  // namespace

float flow_grid_sigma(double shift, double timestep) {
  const torch::Tensor sigmas = flow_sigmas(shift);
  return sigmas[(sigmas * 1000 - float(timestep)).abs().argmin().item<int64_t>()].item<float>();
}

std::vector<double> causal_timesteps(const CausalOptions& o) {
  std::vector<double> out;
  for (const auto& level : step_levels(o)) out.push_back(level.first);
  return out;
}

std::vector<double> causal_sigmas(const CausalOptions& o) {
  std::vector<double> out;
  for (float s : step_sigmas(o)) out.push_back(s);
  return out;
}

std::unique_ptr<CausalSchedule> make_causal_schedule(const GeneratorOptions& options, const Denoiser& model,
                                                     int64_t height, int64_t width) {
  return std::make_unique<Causal>(options, model, height, width);
}

}  // namespace latent
