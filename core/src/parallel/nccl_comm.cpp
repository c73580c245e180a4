#include "parallel/nccl_comm.h"

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "parallel/store_comm.h"
#include "parallel/watchdog.h"

#if LATENT_WITH_CUDA
#include <c10/core/DeviceGuard.h>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

namespace latent::parallel {

// c10d's watchdog thread handles a collective that failed or ran past its timeout as TORCH_NCCL_ASYNC_ERROR_HANDLING
// says (torch 2.11, ProcessGroupNCCL.hpp): 0 NoHandling, 1 TearDown (abort the communicators, end the process),
// 2 CleanUpOnly (abort the communicators, nothing more), 3 SkipCleanUp (end the process without aborting them; the
// default when unset). An element must end a failed stream with an ERROR message and live on, so 1 and 3 are out.
// CleanUpOnly is taken over NoHandling: should our own watchdog (below) not end a collective that never completes,
// c10d's abort frees the stream after c10d's timeout, where NoHandling would leave the thread blocked for good. A
// value the user set that keeps the process alive (0 or 2) is kept. The mode goes on our groups themselves (see
// KeptAliveProcessGroup), never into the environment: setenv in a process whose other threads read the environment
// (any GStreamer application) is undefined behaviour.
int nccl_error_handling_mode(const char* current) {
  if (current && std::strcmp(current, "0") == 0) return 0;
  return 2;
}

int keep_process_on_nccl_errors() {
  static const int mode = [] {
    const char* current = std::getenv("TORCH_NCCL_ASYNC_ERROR_HANDLING");
    const int m = nccl_error_handling_mode(current);
    if (current && *current && std::to_string(m) != current)
      std::fprintf(stderr,
                   "latent: TORCH_NCCL_ASYNC_ERROR_HANDLING=%s would end the process on an NCCL error; its groups "
                   "use %d\n",
                   current, m);
    return m;
  }();
  return mode;
}

#if LATENT_WITH_CUDA
namespace {

// c10d takes the error handling mode from the environment in its constructor, into a protected member; this group
// sets the member instead, before any collective exists that could fail.
class KeptAliveProcessGroup : public c10d::ProcessGroupNCCL {
 public:
  KeptAliveProcessGroup(c10::intrusive_ptr<c10d::Store> store, int rank, int size, c10::intrusive_ptr<Options> options,
                        c10d::ErrorHandlingMode mode)
      : ProcessGroupNCCL(std::move(store), rank, size, std::move(options)) {
    asyncErrorHandling_ = mode;
  }
};

using Clock = std::chrono::steady_clock;

// How often the watchdog looks at the calls in flight and at the store: the deadlines' resolution, and the delay
// before a rank blocked on a kernel learns that another process's rank aborted the group.
constexpr std::chrono::milliseconds kWatchdogTick{50};

class NcclCommunicator : public Communicator {
 public:
  NcclCommunicator(c10::intrusive_ptr<c10d::Store> store, const std::string& name, int rank, int size,
                   const torch::Device& device, std::chrono::milliseconds timeout)
      : store_(store), name_(name), rank_(rank), size_(size), device_(device), timeout_(timeout) {
    c10::DeviceGuard guard(device);
    auto options = c10d::ProcessGroupNCCL::Options::create();
    // Our watchdog gives up first, with a message that names the ranks; c10d's is the backstop.
    options->timeout = 2 * timeout;
#ifdef NCCL_HAS_COMM_NONBLOCKING
    // Non-blocking communicators: ncclCommInitRank returns at once and c10d polls ncclCommGetAsyncError, so an
    // abort from another thread (ours at the deadline, or the group's) ends a formation that waits for a rank that
    // never comes. A blocking init would wait outside every timeout.
    options->config.blocking = 0;
#endif
    pg_ = c10::make_intrusive<KeptAliveProcessGroup>(
        c10::make_intrusive<c10d::PrefixStore>("latent/nccl/" + name, store), rank, size, options,
        c10d::ErrorHandlingMode(keep_process_on_nccl_errors()));
    watchdog_ = std::make_unique<Watchdog>([this](const Watchdog::Fired& f) { end_group(f.kind, f.why); },
                                           kWatchdogTick, [this] { return store_abort(); });
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const char* backend_name() const override { return "nccl"; }

  // Forms the NCCL communicator, which NCCL does at its first collective, needing every rank at once. First every
  // rank counts itself in on the store, a wait that an abort key ends; then the first collective, watched by the
  // watchdog as any call is, so a rank that fails after counting itself in ends the others' formation too.
  void connect() {
    wait_for_all(*store_, "latent/nccl/" + name_ + "/formed", rank_, size_, timeout_,
                 "formed the " + name_ + " NCCL communicator");
    c10::DeviceGuard guard(device_);
    auto formed = std::make_shared<std::atomic<bool>>(false);
    watchdog_->watch([formed] { return formed->load(); }, Clock::now() + timeout_, late("forming the communicator"));
    std::vector<torch::Tensor> v{torch::zeros({1}, torch::TensorOptions().device(device_))};
    c10::intrusive_ptr<c10d::Work> work = pg_->allreduce(v);
    // The one host wait: a communicator is formed only when its first collective has run.
    for (auto pause = std::chrono::microseconds(50); !work->isCompleted();
         pause = std::min(pause * 2, std::chrono::microseconds(2000))) {
      if (cut_) throw_cut();
      std::this_thread::sleep_for(pause);
    }
    formed->store(true);
    if (cut_) throw_cut();
    work->wait();
  }

  void all_reduce_sum(torch::Tensor& t) override {
    check_peers();
    std::vector<torch::Tensor> v{on_device(t)};
    launch(pg_->allreduce(v), "all_reduce");
    if (v[0].data_ptr() != t.data_ptr()) back(t, v[0]);
  }

  std::vector<torch::Tensor> all_gather(const torch::Tensor& t) override {
    check_peers();
    std::vector<torch::Tensor> in{on_device(t)};
    std::vector<std::vector<torch::Tensor>> out(1);
    for (int r = 0; r < size_; ++r) out[0].push_back(torch::empty_like(in[0]));
    launch(pg_->allgather(out, in), "all_gather");
    return out[0];
  }

  torch::Tensor all_to_all(const torch::Tensor& input) override {
    check_peers();
    if (input.dim() < 1 || input.size(0) % size_ != 0)
      throw std::invalid_argument("all_to_all: dim 0 of " + std::to_string(input.dim() ? input.size(0) : 0) +
                                  " rows is not a multiple of the group's " + std::to_string(size_) + " ranks");
    torch::Tensor in = on_device(input), out = torch::empty_like(in);
    std::vector<int64_t> equal_out, equal_in;  // empty: equal splits
    launch(pg_->alltoall_base(out, in, equal_out, equal_in), "all_to_all");
    if (input.device() == device_) return out;
    torch::Tensor there = torch::empty_like(input, torch::MemoryFormat::Contiguous);
    back(there, out);
    return there;
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
    launch(pg_->endCoalescing(), "halo exchange");
    if (!rp.empty() && rp[0].data_ptr() != from_prev.data_ptr()) back(from_prev, rp[0]);
    if (!rn.empty() && rn[0].data_ptr() != from_next.data_ptr()) back(from_next, rn[0]);
  }

  // Safe from any thread, any number of times: a thread group's failing rank calls it on every rank's
  // communicator while their own threads wait on this one's kernels, or in its formation.
  void abort(const std::string& why) noexcept override { end_group(ParallelError::Kind::peer_failed, why); }

  bool was_cut() const { return cut_; }
  ParallelError cut_error() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return ParallelError(kind_, why_);
  }
  [[noreturn]] void throw_cut() const { throw cut_error(); }

 private:
  // Leaves the cause on the store for the other ranks (their watchdogs look), then ends this rank's communicator.
  void end_group(ParallelError::Kind kind, const std::string& why) noexcept {
    try {
      store_->compareSet(kAbortKey, std::vector<uint8_t>{}, std::vector<uint8_t>(why.begin(), why.end()));
    } catch (...) {
      // The store is gone (rank 0's process ended): the others fail on it themselves.
    }
    cut(kind, why);
  }

  // Ends this rank's NCCL communicator once: ncclCommAbort stops the kernels that wait on it, so a host sync on
  // this device returns, and ends a formation in progress.
  void cut(ParallelError::Kind kind, const std::string& why) noexcept {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (why_.empty()) {
        why_ = why.empty() ? "the group was aborted" : why;
        kind_ = kind;
      }
    }
    if (cut_.exchange(true)) return;
    try {
      pg_->abort();
    } catch (...) {
    }
  }

  std::optional<Watchdog::Fired> store_abort() {
    try {
      throw_if_aborted(*store_, rank_);
    } catch (const ParallelError& e) {
      return Watchdog::Fired{e.kind(), e.what()};
    } catch (...) {
    }
    return std::nullopt;
  }

  std::string late(const char* op) const {
    return "rank " + std::to_string(rank_) + " of " + std::to_string(size_) + " waited " + seconds_text(timeout_) +
           " for the other ranks in " + op + " (NCCL; is every rank running? the timeout is an option of the group)";
  }

  // Queues `work` and returns without waiting for it on the host: work->wait() orders the caller's current stream
  // after NCCL's (TORCH_NCCL_BLOCKING_WAIT unset), so what the caller does next with the results runs after the
  // collective. The deadline is the watchdog's: it aborts the group when the work has not finished in time, which
  // ends the kernels that wait, and this rank's next call throws.
  void launch(const c10::intrusive_ptr<c10d::Work>& work, const char* op) {
    if (!work) return;
    watchdog_->watch([work] { return work->isCompleted(); }, Clock::now() + timeout_, late(op));
    work->wait();
    if (cut_) throw_cut();
  }

  // Copies a result to a tensor elsewhere (a CPU tensor: a host sync that waits for the collective). An abort
  // while it waited leaves garbage there, so the abort's error comes out instead.
  void back(torch::Tensor& to, const torch::Tensor& from) {
    to.copy_(from);
    if (to.device() != device_ && cut_) throw_cut();
  }

  // A look at the store is a round trip to rank 0's TCPStore: at most every 50 ms, not on each of the hundreds of
  // exchanges a chunk makes. The watchdog looks too, while calls are in flight.
  void check_peers() {
    if (cut_) throw_cut();
    const auto now = Clock::now();
    if (now - last_check_ < std::chrono::milliseconds(50)) return;
    last_check_ = now;
    try {
      throw_if_aborted(*store_, rank_);
    } catch (const ParallelError& e) {
      cut(e.kind(), e.what());
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
  ParallelError::Kind kind_ = ParallelError::Kind::peer_failed;
  std::string why_;
  // Last: it goes first, so its thread never calls into a communicator being destroyed.
  std::unique_ptr<Watchdog> watchdog_;
};

}  // namespace

std::shared_ptr<Communicator> make_nccl_communicator(c10::intrusive_ptr<c10d::Store> store, const std::string& name,
                                                     int rank, int size, const torch::Device& device,
                                                     std::chrono::milliseconds timeout, const Enlist& enlist) {
  keep_process_on_nccl_errors();
  std::shared_ptr<NcclCommunicator> c;
  try {
    c = std::make_shared<NcclCommunicator>(std::move(store), name, rank, size, device, timeout);
    if (enlist) enlist(c);
    c->connect();
    return c;
  } catch (const c10::Error& e) {
    // c10d's error for a formation that an abort ended says less than the abort's cause.
    const ParallelError error =
        c && c->was_cut()
            ? c->cut_error()
            : ParallelError(ParallelError::Kind::backend, "rank " + std::to_string(rank) + ": NCCL on " + device.str() +
                                                              " failed: " + e.what_without_backtrace());
    // A half-formed communicator is aborted, never left to a destructor that would wait for it to finish forming;
    // the abort also tells the other ranks.
    if (c) c->abort(error.what());
    throw error;
  } catch (const std::exception& e) {
    if (c) c->abort(e.what());
    throw;
  }
}

#else

std::shared_ptr<Communicator> make_nccl_communicator(c10::intrusive_ptr<c10d::Store>, const std::string&, int rank, int,
                                                     const torch::Device&, std::chrono::milliseconds, const Enlist&) {
  throw ParallelError(ParallelError::Kind::backend, "rank " + std::to_string(rank) +
                                                        ": this build has no CUDA, so no NCCL backend (use the store "
                                                        "backend or a CUDA build)");
}

#endif

}  // namespace latent::parallel
