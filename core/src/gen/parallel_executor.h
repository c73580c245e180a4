// The executor of one rank of a ParallelPlan (latent/gen/parallel_generator.h): deals an iteration's evaluations to
// call groups, runs this rank's, and gathers everyone's.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "gen/sampling/schedule.h"
#include "latent/gen/parallel_generator.h"

namespace latent {

class ParallelExecutor : public CallExecutor {
 public:
  ParallelExecutor(const ParallelPlan& plan, int rank, torch::Device device);
  // The group's communicators, before the first run and again after a group failed (an aborted one stays so).
  void join(std::shared_ptr<parallel::Communicator> world, std::shared_ptr<parallel::Communicator> sequence_group);
  std::vector<torch::Tensor> run(Denoising& d, const std::vector<ModelCall>& calls) override;
  void failed(const std::exception_ptr& error) noexcept override;
  // Releases every rank waiting on this one: their exchanges throw ParallelError (peer_failed) with `why`.
  void abort(const std::string& why) noexcept;
  int rank() const { return rank_; }

 protected:
  // Every rank's packed predictions, in rank order: an all-gather over the world.
  virtual std::vector<torch::Tensor> exchange(const torch::Tensor& mine);

 private:
  ParallelPlan plan_;
  int rank_;
  torch::Device device_;
  std::shared_ptr<parallel::Communicator> world_, sequence_;
};

}  // namespace latent
