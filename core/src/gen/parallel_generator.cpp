// Generation across ranks: the executor that shares an iteration's evaluations, the plans, and the thread ranks.
#include "latent/gen/parallel_generator.h"

#include <c10/core/DeviceGuard.h>

#include <algorithm>
#include <optional>
#include <sstream>
#include <stdexcept>

#include "gen/parallel_executor.h"
#include "parallel/rank_threads.h"

namespace latent {
namespace {

[[noreturn]] void bad_plan(const std::string& what) { throw std::invalid_argument("parallel generation: " + what); }

std::string what_of(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& x) {
    return x.what();
  } catch (...) {
    return "unknown error";
  }
}

bool is_peer_report(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const parallel::ParallelError& x) {
    return x.kind() == parallel::ParallelError::Kind::peer_failed;
  } catch (...) {
    return false;
  }
}

bool is_interrupt(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const Interrupted&) {
    return true;
  } catch (...) {
    return false;
  }
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// fifo's model calls per iteration once its queue is full; 0 for the schedules that make one call at a time.
int64_t fifo_calls(ScheduleKind schedule, int64_t steps, int64_t window) {
  return schedule == ScheduleKind::fifo && window > 0 ? ceil_div(std::max<int64_t>(steps, 1), window) : 0;
}

}  // namespace

// ---- the executor --------------------------------------------------------------------------------------------

ParallelExecutor::ParallelExecutor(const ParallelPlan& plan, int rank, torch::Device device)
    : plan_(plan), rank_(rank), device_(device) {}

void ParallelExecutor::join(std::shared_ptr<parallel::Communicator> world,
                            std::shared_ptr<parallel::Communicator> sequence_group) {
  if (!world || world->size() != plan_.world() || world->rank() != rank_)
    bad_plan("rank " + std::to_string(rank_) + " of " + describe_plan(plan_) +
             " needs a world communicator of that size with this rank");
  if (plan_.ulysses > 1 &&
      (!sequence_group || sequence_group->size() != plan_.ulysses || sequence_group->rank() != rank_ % plan_.ulysses))
    bad_plan("rank " + std::to_string(rank_) + " of " + describe_plan(plan_) +
             " needs a sequence group communicator of its call group's " + std::to_string(plan_.ulysses) + " ranks");
  world_ = std::move(world);
  sequence_ = plan_.ulysses > 1 ? std::move(sequence_group) : nullptr;
}

std::vector<torch::Tensor> ParallelExecutor::run(Denoising& d, const std::vector<ModelCall>& calls) {
  // Every rank looks, also one without evaluations this iteration: none of them enters the exchange then.
  d.check_interrupted();
  if (calls.empty()) return {};
  const size_t per_call = d.guided() ? 2 : 1;
  const size_t evaluations = calls.size() * per_call;
  const size_t groups = size_t(plan_.call_groups());
  const size_t mine = size_t(rank_ / plan_.ulysses);
  // Where each evaluation's prediction lies in its call group's buffer. A prediction has its input's shape.
  std::vector<int64_t> offset(evaluations), length(groups, 0);
  for (size_t e = 0; e < evaluations; ++e) {
    const size_t g = e % groups;
    offset[e] = length[g];
    length[g] += calls[e / per_call].x.numel();
  }
  const int64_t longest = *std::max_element(length.begin(), length.end());
  torch::Tensor packed = torch::zeros({longest}, torch::TensorOptions().dtype(torch::kFloat).device(device_));
  for (size_t e = mine; e < evaluations; e += groups) {
    const ModelCall& call = calls[e / per_call];
    const torch::Tensor out = d.evaluate(call, per_call == 2 && e % 2 == 1, sequence_.get());
    packed.narrow(0, offset[e], call.x.numel()).copy_(out.reshape({-1}));
  }
  const std::vector<torch::Tensor> parts = exchange(packed);
  d.count_calls(int64_t(evaluations));
  // Every rank combines the same bits the same way, so every rank steps to the same latents.
  auto prediction = [&](size_t e) {
    const ModelCall& call = calls[e / per_call];
    const torch::Tensor& from = parts[(e % groups) * size_t(plan_.ulysses)];
    return from.narrow(0, offset[e], call.x.numel()).view(call.x.sizes()).to(device_);
  };
  std::vector<torch::Tensor> out;
  out.reserve(calls.size());
  for (size_t c = 0; c < calls.size(); ++c) {
    if (per_call == 1) {
      out.push_back(prediction(c));
      continue;
    }
    out.push_back(d.guide(calls[c], prediction(2 * c), prediction(2 * c + 1)));
  }
  return out;
}

std::vector<torch::Tensor> ParallelExecutor::exchange(const torch::Tensor& mine) { return world_->all_gather(mine); }

void ParallelExecutor::failed(const std::exception_ptr& error) noexcept {
  // A report of another rank's failure: that rank has told everyone.
  if (is_peer_report(error)) return;
  // An interrupt is no failure of the rank, but the others may wait in an exchange it will not reach: they are
  // released all the same, told that it stopped (thread ranks then form their group again, see run()).
  const std::string rank = "rank " + std::to_string(rank_) + " (" + device_.str() + ")";
  if (is_interrupt(error))
    abort(rank + " stopped: its generation was interrupted (a flush or a state change)");
  else
    abort(rank + " failed: " + what_of(error));
}

void ParallelExecutor::abort(const std::string& why) noexcept {
  if (world_) world_->abort(why);
  if (sequence_) sequence_->abort(why);
}

// ---- plans ---------------------------------------------------------------------------------------------------

std::string describe_plan(const ParallelPlan& plan) {
  std::ostringstream s;
  s << plan.world() << (plan.world() == 1 ? " rank" : " ranks") << ": cfg " << plan.cfg << " x ulysses " << plan.ulysses
    << " x " << plan.partitions << (plan.partitions == 1 ? " partition" : " partitions");
  return s.str();
}

void check_plan(const ParallelPlan& plan, const GeneratorOptions& options, const DenoiserSpec& spec, int64_t heads) {
  if (plan.cfg < 1 || plan.ulysses < 1 || plan.partitions < 1)
    bad_plan("cfg, ulysses and partitions must be >= 1 (" + describe_plan(plan) + ")");
  if (plan.cfg > 2) bad_plan("cfg " + std::to_string(plan.cfg) + ": a guided call has 2 evaluations, so cfg is 1 or 2");
  const bool guided = options.guidance > 1.0;
  if (plan.cfg == 2 && !guided)
    bad_plan(
        "cfg 2 puts the text and the negative text evaluations on different ranks; with guidance <= 1 there is "
        "no negative text evaluation: use cfg 1");
  if (plan.ulysses > 1) {
    if (heads <= 0)
      bad_plan("ulysses " + std::to_string(plan.ulysses) + ": this model (" + spec.backend +
               ") cannot share a prediction over a sequence group; use ulysses 1");
    if (heads % plan.ulysses != 0) {
      std::string valid;
      for (int64_t d = 1; d <= heads; ++d)
        if (heads % d == 0) valid += (valid.empty() ? "" : ", ") + std::to_string(d);
      bad_plan("ulysses " + std::to_string(plan.ulysses) + ": the ranks of a sequence group split the model's " +
               std::to_string(heads) + " attention heads, so it must divide them; valid: " + valid);
    }
  }
  const int64_t window = options.window > 0 ? options.window : default_window(spec);
  const int64_t calls = fifo_calls(options.schedule, options.sampler.steps, window);
  const int64_t evaluations = calls * (guided ? 2 : 1);
  if (options.schedule == ScheduleKind::fifo && plan.partitions > 1 && evaluations < plan.call_groups())
    bad_plan(std::to_string(plan.partitions) + " partitions: fifo with " + std::to_string(options.sampler.steps) +
             " steps and a window of " + std::to_string(window) + " makes " + std::to_string(calls) +
             " model calls per iteration (" + std::to_string(evaluations) + " evaluations), fewer than the " +
             std::to_string(plan.call_groups()) + " call groups of " + describe_plan(plan));
}

ParallelPlan choose_plan(int devices, const DenoiserSpec& spec, double guidance, int64_t heads, ScheduleKind schedule,
                         int64_t steps, int64_t window) {
  if (steps <= 0) steps = spec.sampler.steps;
  if (window <= 0) window = default_window(spec);
  const bool guided = guidance > 1.0 && spec.text_tokens > 0;
  const int64_t calls = fifo_calls(schedule, steps, window);
  // A split of n ranks into Ulysses x partitions that keeps each busy: fifo partitions where there are that many,
  // else a Ulysses degree dividing the head count.
  auto split = [&](int n) -> std::optional<ParallelPlan> {
    if (n == 1) return ParallelPlan{};
    if (calls >= n) return ParallelPlan{1, 1, n};
    if (heads > 0 && heads % n == 0) return ParallelPlan{1, n, 1};
    return std::nullopt;
  };
  auto plan_for = [&](int d) -> std::optional<ParallelPlan> {
    if (guided && d % 2 == 0)
      if (auto p = split(d / 2)) return ParallelPlan{2, p->ulysses, p->partitions};
    return split(d);
  };
  if (devices >= 1)
    if (auto p = plan_for(devices)) return *p;
  std::string valid;
  for (int d = 1; d <= std::max(8, 2 * devices); ++d)
    if (plan_for(d)) valid += (valid.empty() ? "" : ", ") + std::to_string(d);
  std::ostringstream s;
  s << "no plan for " << devices << " devices (" << schedule_kind_name(schedule)
    << (guided ? ", guidance on" : ", guidance off");
  if (heads > 0) s << ", " << heads << " attention heads";
  if (calls > 0) s << ", " << calls << " fifo partitions";
  s << "): " << valid << " devices work";
  bad_plan(s.str());
}

std::unique_ptr<Generator> make_rank_generator(std::shared_ptr<const Denoiser> denoiser, GeneratorOptions options,
                                               const ParallelPlan& plan, std::shared_ptr<parallel::Communicator> world,
                                               std::shared_ptr<parallel::Communicator> sequence_group) {
  if (!denoiser) bad_plan("no denoiser");
  if (!world) bad_plan("no world communicator");
  check_plan(plan, options, denoiser->spec(), denoiser->attention_heads());
  auto executor = std::make_unique<ParallelExecutor>(plan, world->rank(), denoiser->device());
  executor->join(std::move(world), std::move(sequence_group));
  return std::make_unique<Generator>(std::move(denoiser), std::move(options), std::move(executor));
}

// ---- thread ranks --------------------------------------------------------------------------------------------

ParallelGenerator::ParallelGenerator(std::vector<std::shared_ptr<const Denoiser>> per_rank, GeneratorOptions options,
                                     ParallelPlan plan, parallel::GroupOptions group)
    : denoisers_(std::move(per_rank)), plan_(plan), group_(group) {
  if (denoisers_.empty()) bad_plan("no denoisers");
  for (const auto& d : denoisers_)
    if (!d) bad_plan("a denoiser for every rank is needed");
  check_plan(plan_, options, denoisers_[0]->spec(), denoisers_[0]->attention_heads());
  if (int(denoisers_.size()) != plan_.world())
    bad_plan(describe_plan(plan_) + " needs " + std::to_string(plan_.world()) + " denoisers, one per rank; got " +
             std::to_string(denoisers_.size()));
  const DenoiserSpec& spec = denoisers_[0]->spec();
  for (const auto& d : denoisers_)
    if (d->spec().backend != spec.backend || d->spec().channels != spec.channels ||
        d->spec().prediction != spec.prediction || d->dtype() != denoisers_[0]->dtype())
      bad_plan("every rank needs the same model in the same dtype");
  for (int r = 0; r < ranks(); ++r) {
    auto executor = std::make_unique<ParallelExecutor>(plan_, r, denoisers_[size_t(r)]->device());
    executors_.push_back(executor.get());
    GeneratorOptions rank_options = options;
    if (r > 0) rank_options.progress = nullptr;  // every rank makes the same iterations: rank 0 tells them
    generators_.push_back(std::make_unique<Generator>(denoisers_[size_t(r)], rank_options, std::move(executor)));
  }
  threads_ = std::make_unique<parallel::RankThreads>(ranks());
  regroup();
}

ParallelGenerator::~ParallelGenerator() = default;

void ParallelGenerator::regroup() {
  std::vector<torch::Device> devices;
  for (const auto& d : denoisers_) devices.push_back(d->device());
  // The generator never exchanges halos: its groups form collectives alone.
  parallel::GroupOptions options = group_;
  options.halo_exchange = false;
  parallel::ThreadGroup world(devices, options);
  // Communicators cannot be split: each call group's sequence group is a group of its own.
  std::vector<std::unique_ptr<parallel::ThreadGroup>> sequence;
  const int u = plan_.ulysses;
  if (u > 1)
    for (int g = 0; g < plan_.call_groups(); ++g)
      sequence.push_back(std::make_unique<parallel::ThreadGroup>(
          std::vector<torch::Device>(devices.begin() + g * u, devices.begin() + (g + 1) * u), options));
  // Every rank joins on its own thread: NCCL's rendezvous needs them all at once. A rank that fails on the way
  // aborts every group, or the others would wait in theirs for it until the timeout.
  threads_->run(
      [&](int r) {
        std::shared_ptr<parallel::Communicator> seq;
        if (u > 1) seq = sequence[size_t(r / u)]->join(r % u).collectives;
        executors_[size_t(r)]->join(world.join(r).collectives, std::move(seq));
      },
      [&](int r, std::exception_ptr e) {
        const std::string why = "rank " + std::to_string(r) + " (" + devices[size_t(r)].str() +
                                ") failed while the group formed: " + what_of(e);
        world.abort(why);
        for (auto& s : sequence) s->abort(why);
      });
  broken_ = false;
  regroup_ = false;
  failed_rank_.clear();
}

void ParallelGenerator::run(const std::function<void(int)>& job) {
  if (broken_) throw std::logic_error("this parallel generator failed; reset() it before using it again");
  if (regroup_) regroup();
  std::vector<std::exception_ptr> errors(denoisers_.size());
  try {
    threads_->run(
        [&](int r) {
          c10::DeviceGuard device(denoisers_[size_t(r)]->device());
          job(r);
        },
        [&](int r, std::exception_ptr e) {
          errors[size_t(r)] = e;
          executors_[size_t(r)]->failed(e);
        });
  } catch (...) {
    const std::exception_ptr root = std::current_exception();
    for (size_t r = 0; r < errors.size(); ++r)
      if (errors[r] && errors[r] == root)
        failed_rank_ = "rank " + std::to_string(r) + " (" + denoisers_[r]->device().str() + ")";
    // An interrupt comes before an iteration's exchange, so no rank got past it and every rank rolled the
    // iteration back. Any other failure may have come after a rank's last exchange, leaving the ranks apart.
    bool all_rolled_back = true;
    for (const auto& e : errors)
      if (e && !is_interrupt(e) && !is_peer_report(e)) all_rolled_back = false;
    if (all_rolled_back && is_interrupt(std::current_exception()))
      regroup_ = true;
    else
      broken_ = true;
    throw;
  }
}

std::vector<GeneratedFrame> ParallelGenerator::next() {
  std::vector<std::vector<GeneratedFrame>> made(denoisers_.size());
  run([&](int r) { made[size_t(r)] = generators_[size_t(r)]->next(); });
  return std::move(made[0]);
}

bool ParallelGenerator::finished() const { return generators_[0]->finished(); }

void ParallelGenerator::reset() { reset(options().seed); }

void ParallelGenerator::reset(uint64_t seed) {
  if (broken_ || regroup_) regroup();
  for (auto& g : generators_) g->reset(seed);
}

void ParallelGenerator::interrupt() {
  for (auto& g : generators_) g->interrupt();
}

void ParallelGenerator::clear_interrupt() {
  for (auto& g : generators_) g->clear_interrupt();
}

const GeneratorOptions& ParallelGenerator::options() const { return generators_[0]->options(); }
const Sampler& ParallelGenerator::sampler() const { return generators_[0]->sampler(); }
size_t ParallelGenerator::state_bytes() const { return generators_[0]->state_bytes(); }
int64_t ParallelGenerator::model_calls() const { return generators_[0]->model_calls(); }

}  // namespace latent
