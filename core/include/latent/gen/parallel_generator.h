// Generation across devices. Every rank holds its own Generator with identical options and its own denoiser on its
// device, and the ranks run in lockstep: the model evaluations of an iteration (a guided call is two, with the text
// and with the negative text; fifo has one call per partition of its queue) are dealt to "call groups" of ranks,
// each group evaluates its share, and one all-gather over the ranks gives every rank every prediction. Guidance
// and the sampler then run on every rank alike, so every rank holds the same latents and makes the same frames
// (the seeded noise is drawn on the CPU, the same everywhere).
//
//   cfg         2: the text and the negative text evaluations of a call on different ranks (exact; needs
//               guidance > 1)
//   partitions  fifo's partitions (one model call per window of adjacent noise levels) spread over call groups
//               (exact). An iteration with fewer evaluations than call groups leaves the rest idle: the clip and
//               rolling schedules make one call at a time, fifo fewer while its queue fills.
//   ulysses     ranks of one call group that run each of its evaluations together, splitting the sequence
//               (Denoiser::predict with a sequence group; the degree divides Denoiser::attention_heads()). Within
//               float rounding of one device: each rank's layers see fewer rows and heads, which kernels may
//               sum in another order.
//
// world = cfg * ulysses * partitions. Rank r is Ulysses rank r % ulysses of call group r / ulysses; evaluation e of
// an iteration (call e / 2's text or negative text when guided, call e otherwise) goes to call group
// e % (cfg * partitions). With ranks on devices of one kind the ranks' latents agree bit for bit. Without Ulysses
// they equal one device's run too: an evaluation has the same inputs and shapes on whichever rank runs it, and its
// prediction travels unchanged.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "latent/gen/generator.h"
#include "latent/parallel/comm.h"

namespace latent {

namespace parallel {
class RankThreads;
}

struct ParallelPlan {
  int cfg = 1;
  int ulysses = 1;
  int partitions = 1;
  int world() const { return cfg * ulysses * partitions; }
  int call_groups() const { return cfg * partitions; }
};

// "4 ranks: cfg 2 x ulysses 1 x 2 partitions", for logs.
std::string describe_plan(const ParallelPlan& plan);

// Throws std::invalid_argument naming what does not fit: a degree below 1, cfg other than 1 or 2, cfg 2 without
// guidance, Ulysses where `heads` (Denoiser::attention_heads(): 0 for a model that cannot share a prediction) is 0
// or not a multiple of the degree, more fifo call groups than its iteration has evaluations.
void check_plan(const ParallelPlan& plan, const GeneratorOptions& options, const DenoiserSpec& spec, int64_t heads = 0);

// A plan for `devices` ranks: CFG 2 where guidance is on (and the model takes text), the other half split into fifo
// partitions where fifo has that many (ceil(steps / window); `steps` and `window` 0 take the spec's), else into a
// Ulysses degree dividing `heads` (Denoiser::attention_heads(); 0: none). Without CFG, all the devices split the same
// way. fifo prefers partitions to Ulysses: one exchange per iteration against two all-to-alls per layer. Throws
// std::invalid_argument listing the device counts that work.
ParallelPlan choose_plan(int devices, const DenoiserSpec& spec, double guidance, int64_t heads, ScheduleKind schedule,
                         int64_t steps = 0, int64_t window = 0);

// One rank of a plan for ranks as processes (torchrun): a Generator whose model calls are shared through `world`
// (a communicator over all plan.world() ranks, e.g. parallel::join_tcp(...).collectives, whose rank() is this
// rank's) and, where plan.ulysses > 1, `sequence_group` (over this rank's call group: ranks
// [g * ulysses, (g + 1) * ulysses)). Every rank makes one with identical options and calls next(), reset() and
// the rest in the same order. A rank whose next() throws aborts `world`, so the others throw ParallelError with its
// cause instead of waiting; the group is then spent: form a new one and new generators. A sequence group of processes
// is a TCP group of its own (join_tcp on another port); Communicator has no split.
std::unique_ptr<Generator> make_rank_generator(std::shared_ptr<const Denoiser> denoiser, GeneratorOptions options,
                                               const ParallelPlan& plan, std::shared_ptr<parallel::Communicator> world,
                                               std::shared_ptr<parallel::Communicator> sequence_group = nullptr);

class ParallelExecutor;

// The ranks of a plan as threads of this process: per_rank[r] is rank r's denoiser, on its device (ranks may share
// one). The Generator's interface; frames come from rank 0, on its device.
class ParallelGenerator {
 public:
  // Throws std::invalid_argument where the plan does not fit (check_plan), the ranks' denoisers differ in kind, or
  // the options do not fit them (as Generator does). A rank with less work waits for the others in the exchange:
  // group.timeout must exceed the longest share of an iteration's evaluations (a guided call of a large model at a
  // large size takes tens of seconds).
  ParallelGenerator(std::vector<std::shared_ptr<const Denoiser>> per_rank, GeneratorOptions options, ParallelPlan plan,
                    parallel::GroupOptions group = {});
  ~ParallelGenerator();
  ParallelGenerator(const ParallelGenerator&) = delete;
  ParallelGenerator& operator=(const ParallelGenerator&) = delete;

  // As Generator::next(). A rank that fails ends the call on every rank with the root cause (the failing rank's
  // error, not the others' reports of it) and leaves the generator to be reset() before it runs again; reset()
  // forms a new group. Interrupted is the exception: it comes before an iteration's exchange on every rank, so the
  // ranks are as they were and the next call goes on (on a new group).
  std::vector<GeneratedFrame> next();
  bool finished() const;
  void reset();
  void reset(uint64_t seed);
  void interrupt();
  void clear_interrupt();

  const GeneratorOptions& options() const;
  const ParallelPlan& plan() const { return plan_; }
  int ranks() const { return int(denoisers_.size()); }
  const Sampler& sampler() const;
  // Rank 0's; every rank keeps the same.
  size_t state_bytes() const;
  // Model evaluations of the whole group as one device would count them (a Ulysses group's counts once); may be
  // read from any thread, also during next().
  int64_t model_calls() const;
  // Whose error the last failed call rethrew, "rank 1 (cuda:1)": the error itself is that rank's, unchanged, so a
  // caller that reports it must name the rank. Empty before a failure and once a new group has formed.
  const std::string& failed_rank() const { return failed_rank_; }

 private:
  void regroup();
  void run(const std::function<void(int)>& job);

  std::vector<std::shared_ptr<const Denoiser>> denoisers_;
  ParallelPlan plan_;
  parallel::GroupOptions group_;
  std::unique_ptr<parallel::RankThreads> threads_;
  std::vector<std::unique_ptr<Generator>> generators_;
  std::vector<ParallelExecutor*> executors_;  // owned by generators_
  bool broken_ = false;
  bool regroup_ = false;
  std::string failed_rank_;
};

}  // namespace latent
