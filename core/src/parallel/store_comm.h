// The CPU backend: tensors travel as bytes through a c10d store. Every wait is cut into short slices so that an
// aborted group or an expired timeout is noticed, never a hang.
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include "latent/parallel/comm.h"

namespace latent::parallel {

class StoreCommunicator : public Communicator {
 public:
  // `name` keeps this communicator's keys apart from the others' on the same store.
  StoreCommunicator(c10::intrusive_ptr<c10d::Store> store, std::string name, int rank, int size,
                    std::chrono::milliseconds timeout);
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const char* backend_name() const override { return "store"; }
  void all_reduce_sum(torch::Tensor& t) override;
  std::vector<torch::Tensor> all_gather(const torch::Tensor& t) override;
  torch::Tensor all_to_all(const torch::Tensor& input) override;
  void exchange(const torch::Tensor& to_prev, const torch::Tensor& to_next, torch::Tensor& from_prev,
                torch::Tensor& from_next) override;
  void abort(const std::string& why) noexcept override;

 private:
  std::string key(uint64_t seq, const std::string& what) const;
  void put(const std::string& key, const torch::Tensor& t);
  // Waits for `key`, then copies its bytes into `into` (whose shape and dtype say what to expect).
  void take(const std::string& key, torch::Tensor& into, int from, const char* op);
  void wait_for(const std::string& key, int from, const char* op);
  // Ends a collective whose keys every rank reads: the last rank to finish reading deletes them.
  void done_reading(uint64_t seq);

  c10::intrusive_ptr<c10d::Store> store_;
  std::string name_;
  int rank_, size_;
  std::chrono::milliseconds timeout_;
  uint64_t seq_ = 0;
};

// The key under which a failing rank leaves its cause for the others.
inline const char* kAbortKey = "latent/abort";

// "60 s", "0.5 s": timeouts in messages.
std::string seconds_text(std::chrono::milliseconds ms);

// Throws ParallelError(peer_failed) when some rank has aborted the group on `store`.
void throw_if_aborted(c10d::Store& store, int rank);

// Counts this rank in under `counter`, then waits until `size` ranks have, as NCCL's communicator init waits for
// every rank; unlike that, the wait ends with ParallelError where a rank aborts the group on `store` (peer_failed)
// or `timeout` passes (timeout: "rank r: only j of n ranks <what> within T").
void wait_for_all(c10d::Store& store, const std::string& counter, int rank, int size, std::chrono::milliseconds timeout,
                  const std::string& what);

}  // namespace latent::parallel
