#include "parallel/store_comm.h"

#include <cstdio>
#include <cstring>
#include <thread>

namespace latent::parallel {
namespace {

using Clock = std::chrono::steady_clock;

// How often a waiting rank looks for an abort, and its longest pause between looks for its key: short enough
// that an abort is seen at once, long enough that a waiting rank costs nothing.
constexpr std::chrono::milliseconds kSlice{20};
constexpr std::chrono::microseconds kMaxPause{1000};

std::vector<uint8_t> bytes_of(const torch::Tensor& t) {
  torch::Tensor c = t.to(torch::kCPU).contiguous();
  const auto* p = static_cast<const uint8_t*>(c.data_ptr());
  return std::vector<uint8_t>(p, p + c.nbytes());
}

}  // namespace

std::string seconds_text(std::chrono::milliseconds ms) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g s", double(ms.count()) / 1000.0);
  return buf;
}

void throw_if_aborted(c10d::Store& store, int rank) {
  bool aborted = false;
  try {
    aborted = store.check({kAbortKey});
  } catch (const std::exception& e) {
    throw ParallelError(ParallelError::Kind::backend,
                        "rank " + std::to_string(rank) + " lost the group's store (did rank 0 exit?): " + e.what());
  }
  if (!aborted) return;
  const std::vector<uint8_t> why = store.get(kAbortKey);
  throw ParallelError(ParallelError::Kind::peer_failed, std::string(why.begin(), why.end()));
}

void wait_for_all(c10d::Store& store, const std::string& counter, int rank, int size, std::chrono::milliseconds timeout,
                  const std::string& what) {
  const auto deadline = Clock::now() + timeout;
  store.add(counter, 1);
  for (auto pause = std::chrono::microseconds(50);; pause = std::min(pause * 2, std::chrono::microseconds(20000))) {
    throw_if_aborted(store, rank);
    const int64_t arrived = store.add(counter, 0);
    if (arrived >= size) return;
    if (Clock::now() >= deadline) {
      throw ParallelError(ParallelError::Kind::timeout, "rank " + std::to_string(rank) + ": only " +
                                                            std::to_string(arrived) + " of " + std::to_string(size) +
                                                            " ranks " + what + " within " + seconds_text(timeout));
    }
    std::this_thread::sleep_for(pause);
  }
}

StoreCommunicator::StoreCommunicator(c10::intrusive_ptr<c10d::Store> store, std::string name, int rank, int size,
                                     std::chrono::milliseconds timeout)
    : store_(std::move(store)), name_(std::move(name)), rank_(rank), size_(size), timeout_(timeout) {}

std::string StoreCommunicator::key(uint64_t seq, const std::string& what) const {
  return "latent/" + name_ + "/" + std::to_string(seq) + "/" + what;
}

void StoreCommunicator::put(const std::string& k, const torch::Tensor& t) { store_->set(k, bytes_of(t)); }

void StoreCommunicator::wait_for(const std::string& k, int from, const char* op) {
  // Polled with check(), never TCPStore::wait() with a short timeout: a wait that times out on the client leaves
  // the server's late answer in the socket, and the next request reads it instead of its own.
  const auto start = Clock::now(), deadline = start + timeout_;
  auto next_look = start + kSlice;
  for (auto pause = std::chrono::microseconds(10);; pause = std::min(pause * 2, kMaxPause)) {
    if (store_->check({k})) return;
    const auto now = Clock::now();
    if (now >= next_look) {
      throw_if_aborted(*store_, rank_);
      next_look = now + kSlice;
    }
    if (now >= deadline) {
      throw ParallelError(ParallelError::Kind::timeout,
                          "rank " + std::to_string(rank_) + " of " + std::to_string(size_) + " waited " +
                              seconds_text(timeout_) + " for rank " + std::to_string(from) + " in " + op +
                              " (is every rank running? the timeout is an option of the group)");
    }
    std::this_thread::sleep_for(pause);
  }
}

void StoreCommunicator::take(const std::string& k, torch::Tensor& into, int from, const char* op) {
  wait_for(k, from, op);
  const std::vector<uint8_t> data = store_->get(k);
  torch::Tensor cpu = torch::empty(into.sizes(), into.options().device(torch::kCPU));
  if (data.size() != cpu.nbytes()) {
    throw ParallelError(ParallelError::Kind::backend, std::string(op) + ": rank " + std::to_string(from) + " sent " +
                                                          std::to_string(data.size()) + " bytes where rank " +
                                                          std::to_string(rank_) + " expected " +
                                                          std::to_string(cpu.nbytes()) + " (mismatched inputs?)");
  }
  std::memcpy(cpu.data_ptr(), data.data(), data.size());
  into.copy_(cpu);
}

void StoreCommunicator::done_reading(uint64_t seq) {
  // Each rank counts itself out once it has read every other rank's key; whoever comes last deletes them all. A
  // rank cannot delete its own key at its next call instead: that call may be an all_to_all, which deletes only
  // its own point-to-point keys, and the key would stay in the store for good.
  const std::string readers = key(seq, "read");
  if (store_->add(readers, 1) < size_) return;
  for (int r = 0; r < size_; ++r) store_->deleteKey(key(seq, std::to_string(r)));
  store_->deleteKey(readers);
}

void StoreCommunicator::all_reduce_sum(torch::Tensor& t) {
  const uint64_t seq = seq_++;
  put(key(seq, std::to_string(rank_)), t);
  // Summed in rank order on every rank, so every rank gets the same bits.
  torch::Tensor sum, part = torch::empty_like(t);
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) {
      part.copy_(t);
    } else {
      take(key(seq, std::to_string(r)), part, r, "all_reduce");
    }
    sum = r == 0 ? part.clone() : sum.add_(part);
  }
  t.copy_(sum);
  done_reading(seq);
}

std::vector<torch::Tensor> StoreCommunicator::all_gather(const torch::Tensor& t) {
  const uint64_t seq = seq_++;
  put(key(seq, std::to_string(rank_)), t);
  std::vector<torch::Tensor> out;
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) {
      out.push_back(t.clone());
      continue;
    }
    torch::Tensor part = torch::empty_like(t);
    take(key(seq, std::to_string(r)), part, r, "all_gather");
    out.push_back(part);
  }
  done_reading(seq);
  return out;
}

torch::Tensor StoreCommunicator::all_to_all(const torch::Tensor& input) {
  if (input.dim() < 1 || input.size(0) % size_ != 0)
    throw std::invalid_argument("all_to_all: dim 0 of " + std::to_string(input.dim() ? input.size(0) : 0) +
                                " rows is not a multiple of the group's " + std::to_string(size_) + " ranks");
  // Point to point, as exchange(): part j of rank i under its own key, deleted by its one reader.
  const uint64_t seq = seq_++;
  auto link = [&](int from, int to) { return key(seq, std::to_string(from) + ">" + std::to_string(to)); };
  const std::vector<torch::Tensor> parts = input.chunk(size_, 0);
  for (int r = 0; r < size_; ++r)
    if (r != rank_) put(link(rank_, r), parts[size_t(r)]);
  torch::Tensor out = torch::empty_like(input, torch::MemoryFormat::Contiguous);
  const std::vector<torch::Tensor> into = out.chunk(size_, 0);
  for (int r = 0; r < size_; ++r) {
    torch::Tensor part = into[size_t(r)];
    if (r == rank_) {
      part.copy_(parts[size_t(r)]);
      continue;
    }
    take(link(r, rank_), part, r, "all_to_all");
    store_->deleteKey(link(r, rank_));
  }
  return out;
}

void StoreCommunicator::exchange(const torch::Tensor& to_prev, const torch::Tensor& to_next, torch::Tensor& from_prev,
                                 torch::Tensor& from_next) {
  // Point to point: the one reader of each key deletes it.
  const uint64_t seq = seq_++;
  auto link = [&](int from, int to) { return key(seq, std::to_string(from) + ">" + std::to_string(to)); };
  if (to_prev.defined()) put(link(rank_, rank_ - 1), to_prev);
  if (to_next.defined()) put(link(rank_, rank_ + 1), to_next);
  if (from_prev.defined()) {
    take(link(rank_ - 1, rank_), from_prev, rank_ - 1, "halo exchange");
    store_->deleteKey(link(rank_ - 1, rank_));
  }
  if (from_next.defined()) {
    take(link(rank_ + 1, rank_), from_next, rank_ + 1, "halo exchange");
    store_->deleteKey(link(rank_ + 1, rank_));
  }
}

void StoreCommunicator::abort(const std::string& why) noexcept {
  try {
    const std::string msg = why;
    store_->compareSet(kAbortKey, std::vector<uint8_t>{}, std::vector<uint8_t>(msg.begin(), msg.end()));
  } catch (...) {
    // Nothing more to tell anyone: the store is gone, and the others fail on it themselves.
  }
}

}  // namespace latent::parallel
