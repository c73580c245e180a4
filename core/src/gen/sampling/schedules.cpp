// The three schedules. Each keeps only its window of latents (and the sampler's per-frame history), so memory is
// the same at frame 10 and at frame 10 million.
#include <algorithm>
#include <deque>

#include "gen/sampling/schedule.h"

namespace latent {
namespace {

size_t bytes_of(const torch::Tensor& t) { return t.defined() ? t.nbytes() : 0; }

// Splits x [1, C, T, h, w] into frames numbered from `first`.
std::vector<GeneratedFrame> frames_of(const torch::Tensor& x, int64_t first) {
  std::vector<GeneratedFrame> out;
  for (int64_t t = 0; t < x.size(2); ++t) out.push_back({x.narrow(2, t, 1).clone(), first + t});
  return out;
}

// Every frame at the same step from pure noise to clean: diffusers' pipeline loop.
class ClipSchedule final : public Schedule {
 public:
  explicit ClipSchedule(int64_t frames) : frames_(frames) {}

  std::vector<GeneratedFrame> advance(Denoising& d) override {
    if (done_) return {};
    const Sampler& sampler = d.sampler();
    torch::Tensor x = d.clip_noise(frames_);
    SamplerHistory history;
    for (int64_t i = 0; i < sampler.steps(); ++i) {
      torch::Tensor out = d.predict(x, std::vector<int64_t>(frames_, i));
      x = sampler.step(x, out, i, history, d.step_noise(x));
    }
    done_ = true;
    return frames_of(d.conditioned(x), 0);
  }
  bool finished() const override { return done_; }
  size_t bytes() const override { return 0; }
  int64_t iterations(int64_t steps) const override { return steps; }

 private:
  int64_t frames_;
  bool done_ = false;
};

// FIFO-Diffusion's queue. Slot s holds the frame at step s of a `steps`-step schedule, newest (noisiest) at 0;
// each iteration every frame takes its own step, the one reaching `steps` is clean and leaves, and a noise frame
// enters at step 0. Model calls span the frames of `window` adjacent steps (latent partitioning), in time order.
// The queue fills by entry: the first frames start alone at step 0 rather than from a noised clip, so each frame
// gets its whole trajectory and no separate clip pass is needed (the first steps-1 iterations emit nothing).
class FifoSchedule final : public Schedule {
 public:
  FifoSchedule(int64_t frames, int64_t window) : frames_(frames), window_(window) {}

  std::vector<GeneratedFrame> advance(Denoising& d) override {
    const Sampler& sampler = d.sampler();
    // The iteration works on a copy (tensor handles and histories, not data) and commits at the end, so a
    // model call that throws leaves the queue as it was.
    std::deque<Slot> queue = queue_;
    const bool enter = frames_ == 0 || entered_ < frames_;
    if (enter) queue.push_back({d.noise(1), 0, {}, entered_});
    if (queue.empty()) return {};
    // The queue runs oldest first, so steps fall from front to back; a partition is a run of steps [k*w, (k+1)*w).
    // Every partition is predicted before any of them steps (a partition's step touches only its own slots), so
    // an executor over several ranks has the iteration's calls at once.
    std::vector<ModelCall> calls;
    std::vector<size_t> starts;
    for (size_t begin = 0; begin < queue.size();) {
      const int64_t partition = queue[begin].step / window_;
      std::vector<torch::Tensor> xs;
      ModelCall call;
      size_t end = begin;
      for (; end < queue.size() && queue[end].step / window_ == partition; ++end) {
        xs.push_back(queue[end].x);
        call.steps.push_back(queue[end].step);
      }
      call.x = torch::cat(xs, 2);
      calls.push_back(std::move(call));
      starts.push_back(begin);
      begin = end;
    }
    const std::vector<torch::Tensor> outs = d.predict(calls);
    for (size_t c = 0; c < calls.size(); ++c) {
      for (size_t j = 0; j < calls[c].steps.size(); ++j) {
        Slot& s = queue[starts[c] + j];
        s.x = sampler.step(s.x, outs[c].narrow(2, static_cast<int64_t>(j), 1), s.step, s.history, d.step_noise(s.x));
        ++s.step;
      }
    }
    std::vector<GeneratedFrame> clean;
    while (!queue.empty() && queue.front().step == sampler.steps()) {
      clean.push_back({queue.front().x, queue.front().index});
      queue.pop_front();
    }
    queue_.swap(queue);
    if (enter) ++entered_;
    return clean;
  }
  bool finished() const override { return frames_ > 0 && entered_ == frames_ && queue_.empty(); }
  // A frame enters every iteration and leaves `steps` iterations later.
  int64_t iterations(int64_t steps) const override { return frames_ > 0 ? frames_ + steps - 1 : 0; }
  size_t bytes() const override {
    size_t total = 0;
    for (const Slot& s : queue_) total += bytes_of(s.x) + s.history.bytes();
    return total;
  }

 private:
  struct Slot {
    torch::Tensor x;  // [1, C, 1, h, w]
    int64_t step;
    SamplerHistory history;
    int64_t index;
  };
  int64_t frames_, window_;
  int64_t entered_ = 0;
  std::deque<Slot> queue_;
};

// Windows of `window` frames: the first `context` are the last clean frames of the window before (timestep 0),
// the rest start from noise and run the whole schedule together.
class RollingSchedule final : public Schedule {
 public:
  RollingSchedule(int64_t frames, int64_t window, int64_t context)
      : frames_(frames), window_(window), context_(context) {}

  std::vector<GeneratedFrame> advance(Denoising& d) override {
    if (finished()) return {};
    const Sampler& sampler = d.sampler();
    const int64_t carried = context_frames_.defined() ? context_frames_.size(2) : 0;
    int64_t fresh = window_ - carried;
    if (frames_ > 0) fresh = std::min(fresh, frames_ - made_);
    torch::Tensor x = d.noise(fresh);
    SamplerHistory history;
    std::vector<int64_t> steps(carried + fresh, sampler.steps());
    for (int64_t i = 0; i < sampler.steps(); ++i) {
      std::fill(steps.begin() + carried, steps.end(), i);
      torch::Tensor input = carried > 0 ? torch::cat({context_frames_, x}, 2) : x;
      torch::Tensor out = d.predict(input, steps);
      x = sampler.step(x, out.narrow(2, carried, fresh), i, history, d.step_noise(x));
    }
    std::vector<GeneratedFrame> made = frames_of(x, made_);
    made_ += fresh;
    if (context_ > 0) {
      torch::Tensor all = carried > 0 ? torch::cat({context_frames_, x}, 2) : x;
      const int64_t keep = std::min(context_, all.size(2));
      context_frames_ = all.narrow(2, all.size(2) - keep, keep).clone();
    }
    return made;
  }
  bool finished() const override { return frames_ > 0 && made_ >= frames_; }
  size_t bytes() const override { return bytes_of(context_frames_); }
  // The first window makes `window` frames, every later one window - context (min(context, window) carried).
  int64_t iterations(int64_t steps) const override {
    if (frames_ <= 0) return 0;
    const int64_t later = window_ - std::min(context_, window_);
    const int64_t rest = std::max<int64_t>(frames_ - window_, 0);
    return steps * (1 + (rest + later - 1) / later);
  }

 private:
  int64_t frames_, window_, context_;
  int64_t made_ = 0;
  torch::Tensor context_frames_;
};

}  // namespace

std::unique_ptr<Schedule> make_clip_schedule(int64_t frames) { return std::make_unique<ClipSchedule>(frames); }
std::unique_ptr<Schedule> make_fifo_schedule(int64_t frames, int64_t window) {
  return std::make_unique<FifoSchedule>(frames, window);
}
std::unique_ptr<Schedule> make_rolling_schedule(int64_t frames, int64_t window, int64_t context) {
  return std::make_unique<RollingSchedule>(frames, window, context);
}

}  // namespace latent
