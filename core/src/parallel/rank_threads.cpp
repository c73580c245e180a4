#include "parallel/rank_threads.h"

#include "latent/parallel/comm.h"

namespace latent::parallel {
namespace {

bool is_echo(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const ParallelError& p) {
    return p.kind() == ParallelError::Kind::peer_failed;
  } catch (...) {
    return false;
  }
}

}  // namespace

RankThreads::RankThreads(int ranks) : errors_(size_t(ranks)), failed_at_(size_t(ranks)) {
  for (int r = 0; r < ranks; ++r) threads_.emplace_back([this, r] { loop(r); });
}

RankThreads::~RankThreads() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  for (auto& t : threads_) t.join();
}

void RankThreads::loop(int rank) {
  uint64_t seen = 0;
  for (;;) {
    std::unique_lock<std::mutex> lock(mutex_);
    wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
    if (stop_) return;
    seen = generation_;
    const auto* job = job_;
    const auto* fail = fail_;
    lock.unlock();
    std::exception_ptr error;
    uint64_t failed_at = 0;
    try {
      (*job)(rank);
    } catch (...) {
      error = std::current_exception();
      {
        // Counted before fail() tells the others, so their reports come later.
        std::lock_guard<std::mutex> count(mutex_);
        failed_at = ++failures_;
      }
      (*fail)(rank, error);
    }
    lock.lock();
    errors_[size_t(rank)] = error;
    failed_at_[size_t(rank)] = failed_at;
    if (--pending_ == 0) done_.notify_all();
  }
}

void RankThreads::run(const std::function<void(int)>& job, const std::function<void(int, std::exception_ptr)>& fail) {
  std::unique_lock<std::mutex> lock(mutex_);
  job_ = &job;
  fail_ = &fail;
  pending_ = size();
  std::fill(errors_.begin(), errors_.end(), nullptr);
  failures_ = 0;
  ++generation_;
  wake_.notify_all();
  done_.wait(lock, [&] { return pending_ == 0; });
  std::exception_ptr root, echo;
  uint64_t root_at = 0, echo_at = 0;
  for (size_t r = 0; r < errors_.size(); ++r) {
    const auto& e = errors_[r];
    if (!e) continue;
    const bool report = is_echo(e);
    std::exception_ptr& first = report ? echo : root;
    uint64_t& at = report ? echo_at : root_at;
    if (!first || failed_at_[r] < at) first = e, at = failed_at_[r];
  }
  if (root) std::rethrow_exception(root);
  if (echo) std::rethrow_exception(echo);
}

}  // namespace latent::parallel
