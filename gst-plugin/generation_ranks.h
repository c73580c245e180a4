// videogen's generator over one device, several devices (ranks as threads) or a group of processes (torchrun):
// the parallel property's plan, and the one object create(), unlock() and seeks drive whatever the ranks are.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "latent/gen/generator.h"
#include "latent/gen/parallel_generator.h"
#include "model_glue.h"

namespace latent::gst {

// One device's Generator or a ParallelGenerator over the devices' ranks: what create(), unlock() and seeks drive.
class Frames {
 public:
  explicit Frames(std::unique_ptr<Generator> one) : one_(std::move(one)) {}
  explicit Frames(std::unique_ptr<ParallelGenerator> many) : many_(std::move(many)) {}
  // This process's rank of a group of processes (torchrun): `comms` keep the group (and rank 0's store) alive.
  Frames(std::unique_ptr<Generator> rank, parallel::RankComms comms)
      : one_(std::move(rank)), comms_(std::move(comms)) {}
  std::vector<GeneratedFrame> next() { return one_ ? one_->next() : many_->next(); }
  bool finished() const { return one_ ? one_->finished() : many_->finished(); }
  void reset() { one_ ? one_->reset() : many_->reset(); }
  void interrupt() { one_ ? one_->interrupt() : many_->interrupt(); }
  void clear_interrupt() { one_ ? one_->clear_interrupt() : many_->clear_interrupt(); }
  int64_t model_calls() const { return one_ ? one_->model_calls() : many_->model_calls(); }
  // The causal schedule's prompt from the next block on (one device only: the causal schedule has no ranks).
  void switch_prompt(const torch::Tensor& text, const std::string& label) {
    if (!one_ || comms_.collectives) throw std::invalid_argument("prompts switch while playing on one device only");
    one_->switch_prompt(text, label);
  }
  // Ranks as processes (torchrun), where every process runs a pipeline of its own in step with the others.
  bool process_rank() const { return comms_.collectives != nullptr; }
  // A process rank that stops before its run is over tells the other processes, which would otherwise wait for it
  // in their next exchange until rank-timeout.
  void leave(const std::string& why) {
    if (process_rank() && !finished())
      comms_.collectives->abort("rank " + std::to_string(comms_.collectives->rank()) + " " + why);
  }
  // What the element was doing when next() threw: with ranks, the failing rank's error says nothing of its rank.
  std::string doing() const {
    return many_ && !many_->failed_rank().empty() ? "generating on " + many_->failed_rank() : "generating";
  }

 private:
  std::unique_ptr<Generator> one_;
  std::unique_ptr<ParallelGenerator> many_;
  parallel::RankComms comms_;
};

// "auto" (nullopt), or how the ranks share the work: "cfg=2,ulysses=2,partitions=1" (any subset; missing ones are
// 1). Throws std::invalid_argument naming the bad item.
std::optional<ParallelPlan> parse_plan(const std::string& text);

// The generator for the options over `ranks` (each rank's denoiser, rank 0's first; one without devices): one
// device's, a ParallelGenerator under the `parallel` property's plan (auto: choose_plan), or under torchrun this
// process's rank. `described` receives the plan for the log ("" for one device). Throws std::invalid_argument
// naming the setting.
std::unique_ptr<Frames> make_frames(const std::vector<std::shared_ptr<const Denoiser>>& ranks,
                                    const GeneratorOptions& o, const std::string& plan_text,
                                    const ModelSettings& model, std::string& described);

}  // namespace latent::gst
