// One long-lived thread per rank: the ranks of a group run each call side by side, and a thread keeps its
// LibTorch thread-local state (and its OpenMP team) from call to call.
#pragma once

#include <condition_variable>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace latent::parallel {

class RankThreads {
 public:
  explicit RankThreads(int ranks);
  ~RankThreads();
  RankThreads(const RankThreads&) = delete;
  RankThreads& operator=(const RankThreads&) = delete;

  int size() const { return int(threads_.size()); }
  // Runs job(rank) on every rank's thread and waits for all of them. A rank whose job throws calls
  // fail(rank, exception) on its own thread at once (to release the ranks waiting for it). Afterwards the root
  // cause is rethrown: the earliest failure that is not a report of another rank's (ParallelError peer_failed),
  // or the earliest report where every failure is one.
  void run(const std::function<void(int)>& job, const std::function<void(int, std::exception_ptr)>& fail);

 private:
  void loop(int rank);

  std::mutex mutex_;
  std::condition_variable wake_, done_;
  const std::function<void(int)>* job_ = nullptr;
  const std::function<void(int, std::exception_ptr)>* fail_ = nullptr;
  uint64_t generation_ = 0;
  int pending_ = 0;
  bool stop_ = false;
  std::vector<std::exception_ptr> errors_;
  // When each rank failed, as a count of failures so far in this run: a rank that fails first is the cause of the
  // others' failures, whatever its rank number.
  std::vector<uint64_t> failed_at_;
  uint64_t failures_ = 0;
  std::vector<std::thread> threads_;
};

}  // namespace latent::parallel
