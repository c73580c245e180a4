#include "parallel/nccl_comm.h"

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>

#include "parallel/store_comm.h"

#if LATENT_WITH_CUDA
#include <c10/core/DeviceGuard.h>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

namespace latent::parallel {

// c10d's watchdog thread handles a collective that failed or ran past its timeout as TORCH_NCCL_ASYNC_ERROR_HANDLING
// says (torch 2.11, ProcessGroupNCCL.hpp): 0 NoHandling, 1 TearDown (abort the communicators, end the process),
// 2 CleanUpOnly (abort the communicators, nothing more), 3 SkipCleanUp (end the process without aborting them; the
// default when unset). An element must end a failed stream with an ERROR message and live on, so 1 and 3 are out.
// CleanUpOnly is taken over NoHandling: for a wait that is not ours (a host sync in a layer on a collective that
// never completes), the watchdog's abort frees the stream after c10d's timeout, where NoHandling would leave the
// thread blocked for good. The mode is read from the environment by each ProcessGroupNCCL's constructor; 2.11 has
// no per-group option for it (ProcessGroupNCCL::Options has none), so it is set once per process, before the first
// group forms; a value already set that keeps the process alive (0 or 2) is left as the user chose it.
const char* nccl_error_handling_to_set(const char* current) {
  if (current && (std::strcmp(current, "0") == 0 || std::strcmp(current, "2") == 0)) return nullptr;
  return "2";
}

void keep_process_on_nccl_errors() {
  static std::once_flag once;
  std::call_once(once, [] {
    const char* current = std::getenv("TORCH_NCCL_ASYNC_ERROR_HANDLING");
    const char* value = nccl_error_handling_to_set(current);
    if (!value) return;
    if (current && *current)
      std::fprintf(stderr,
                   "latent: TORCH_NCCL_ASYNC_ERROR_HANDLING=%s would end the process on an NCCL error; using %s\n",
                   current, value);
    // Once, before any ProcessGroupNCCL of this process reads the environment (every caller waits on the once).
    ::setenv("TORCH_NCCL_ASYNC_ERROR_HANDLING", value, 1);
  });
}

#if LATENT_WITH_CUDA
namespace {

using Clock = std::chrono::steady_clock;

class NcclCommunicator : public Communicator {
 public:
  NcclCommunicator(c10::intrusive_ptr<c10d::Store> store, const std::string& name, int rank, int size,
                   const torch::Device& device, std::chrono::milliseconds timeout)
      : store_(store), name_(name), rank_(rank), size_(size), device_(device), timeout_(timeout) {
    c10::DeviceGuard guard(device);
    auto options = c10d::ProcessGroupNCCL::Options::create();
    // Our own waits give up first, with a message that names the ranks; c10d's watchdog is the backstop for a
    // wait that is not ours.
    options->timeout = 2 * timeout;
    pg_ = c10::make_intrusive<c10d::ProcessGroupNCCL>(
        c10::make_intrusive<c10d::PrefixStore>("latent/nccl/" + name, store), rank, size, options);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const char* backend_name() const override { return "nccl"; }

  // NCCL forms a communicator at its first collective, blocking in ncclCommInitRank until every rank arrives,
  // where no abort reaches. Forming it here, while every rank joins, keeps a rank that fails before its first
  // collective from leaving the others there.
  void connect() {
    torch::Tensor t = torch::zeros({1}, torch::TensorOptions().device(device_));
    all_reduce_sum(t);
  }

  void all_reduce_sum(torch::Tensor& t) override {
    check_peers();
    std::vector<torch::Tensor> v{on_device(t)};
    finish(pg_->allreduce(v), "all_reduce");
    if (v[0].data_ptr() != t.data_ptr()) t.copy_(v[0]);
  }

  std::vector<torch::Tensor> all_gather(const torch::Tensor& t) override {
    check_peers();
    std::vector<torch::Tensor> in{on_device(t)};
    std::vector<std::vector<torch::Tensor>> out(1);
    for (int r = 0; r < size_; ++r) out[0].push_back(torch::empty_like(in[0]));
    finish(pg_->allgather(out, in), "all_gather");
    return out[0];
  }

  torch::Tensor all_to_all(const torch::Tensor& input) override {
    check_peers();
    if (input.dim() < 1 || input.size(0) % size_ != 0)
      throw std::invalid_argument("all_to_all: dim 0 of " + std::to_string(input.dim() ? input.size(0) : 0) +
                                  " rows is not a multiple of the group's " + std::to_string(size_) + " ranks");
    torch::Tensor in = on_device(input), out = torch::empty_like(in);
    std::vector<int64_t> equal_out, equal_in;  // empty: equal splits
    finish(pg_->alltoall_base(out, in, equal_out, equal_in), "all_to_all");
    return input.device() == device_ ? out : out.to(input.device());
  }

  void exchange(const torch::Tensor& to_prev, const torch::Tensor& to_next, torch::Tensor& from_prev,
                torch::Tensor& from_next) override {
    check_peers();
    // One NCCL group: the sends and receives of every rank proceed together, whatever order they were posted in.
    std::vector<torch::Tensor> sp, sn, rp, rn;
    pg_->startCoalescing();
    if (to_prev.defined()) pg_->send(sp = {on_device(to_prev)}, rank_ - 1, 0);
    if (to_next.defined()) pg_->send(sn = {on_device(to_next)}, rank_ + 1, 0);
    if (from_prev.defined()) pg_->recv(rp = {recv_buffer(from_prev)}, rank_ - 1, 0);
    if (from_next.defined()) pg_->recv(rn = {recv_buffer(from_next)}, rank_ + 1, 0);
    finish(pg_->endCoalescing(), "halo exchange");
    if (!rp.empty() && rp[0].data_ptr() != from_prev.data_ptr()) from_prev.copy_(rp[0]);
    if (!rn.empty() && rn[0].data_ptr() != from_next.data_ptr()) from_next.copy_(rn[0]);
  }

  // Safe from any thread, any number of times: a thread group's failing rank calls it on every rank's
  // communicator while their own threads wait in finish().
  void abort(const std::string& why) noexcept override {
    try {
      store_->compareSet(kAbortKey, std::vector<uint8_t>{}, std::vector<uint8_t>(why.begin(), why.end()));
    } catch (...) {
      // The store is gone (rank 0's process ended): the others fail on it themselves.
    }
    cut(why);
  }

 private:
  // Ends this rank's NCCL communicator once: ncclCommAbort stops the kernels that wait on it, so a host sync on
  // this device returns.
  void cut(const std::string& why) noexcept {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (why_.empty()) why_ = why.empty() ? "the group was aborted" : why;
    }
    if (cut_.exchange(true)) return;
    try {
      pg_->abort();
    } catch (...) {
    }
  }
  [[noreturn]] void throw_cut() const {
    std::lock_guard<std::mutex> lock(mutex_);
    throw ParallelError(ParallelError::Kind::peer_failed, why_);
  }

  // Waits on the host for `work` to complete, always with a way out: an abort of this communicator (from this
  // group's threads), another rank's abort key on the store, or the group's timeout. work->wait() alone only
  // orders streams; a later host sync (reading a result) would then block on a kernel that waits for a failed
  // rank, and only c10d's watchdog could end that.
  void finish(const c10::intrusive_ptr<c10d::Work>& work, const char* op) {
    if (!work) return;
    const auto deadline = Clock::now() + timeout_;
    // Short pauses: a chunk makes hundreds of exchanges, and each pause past the work's end is added to it.
    for (auto pause = std::chrono::microseconds(5);; pause = std::min(pause * 2, std::chrono::microseconds(100))) {
      if (cut_) throw_cut();
      if (work->isCompleted()) break;
      check_peers();
      if (Clock::now() >= deadline) {
        const std::string why = "rank " + std::to_string(rank_) + " of " + std::to_string(size_) + " waited " +
                                seconds_text(timeout_) + " for the other ranks in " + op +
                                " (NCCL; is every rank running? the timeout is an option of the group)";
        cut(why);
        throw ParallelError(ParallelError::Kind::timeout, why);
      }
      std::this_thread::sleep_for(pause);
    }
    if (cut_) throw_cut();
    work->wait();  // complete: orders this thread's stream after NCCL's, and throws the work's own error
  }

  // A look at the store is a round trip to rank 0's TCPStore: at most every 50 ms, not on each of the hundreds of
  // exchanges a chunk makes.
  void check_peers() {
    if (cut_) throw_cut();
    const auto now = Clock::now();
    if (now - last_check_ < std::chrono::milliseconds(50)) return;
    last_check_ = now;
    try {
      throw_if_aborted(*store_, rank_);
    } catch (const ParallelError& e) {
      cut(e.what());
      throw;
    }
  }
  torch::Tensor on_device(const torch::Tensor& t) const { return t.to(device_).contiguous(); }
  torch::Tensor recv_buffer(const torch::Tensor& t) const {
    return t.device() == device_ && t.is_contiguous() ? t : torch::empty(t.sizes(), t.options().device(device_));
  }

  c10::intrusive_ptr<c10d::Store> store_;
  std::string name_;
  int rank_, size_;
  torch::Device device_;
  std::chrono::milliseconds timeout_;
  c10::intrusive_ptr<c10d::ProcessGroupNCCL> pg_;
  Clock::time_point last_check_{};
  std::atomic<bool> cut_{false};
  mutable std::mutex mutex_;
  std::string why_;
};

}  // namespace

std::shared_ptr<Communicator> make_nccl_communicator(c10::intrusive_ptr<c10d::Store> store, const std::string& name,
                                                     int rank, int size, const torch::Device& device,
                                                     std::chrono::milliseconds timeout) {
  keep_process_on_nccl_errors();
  try {
    auto c = std::make_shared<NcclCommunicator>(std::move(store), name, rank, size, device, timeout);
    c->connect();
    return c;
  } catch (const c10::Error& e) {
    throw ParallelError(ParallelError::Kind::backend, "rank " + std::to_string(rank) + ": NCCL on " + device.str() +
                                                          " failed: " + e.what_without_backtrace());
  }
}

#else

std::shared_ptr<Communicator> make_nccl_communicator(c10::intrusive_ptr<c10d::Store>, const std::string&, int rank, int,
                                                     const torch::Device&, std::chrono::milliseconds) {
  throw ParallelError(ParallelError::Kind::backend, "rank " + std::to_string(rank) +
                                                        ": this build has no CUDA, so no NCCL backend (use the store "
                                                        "backend or a CUDA build)");
}

#endif

}  // namespace latent::parallel
