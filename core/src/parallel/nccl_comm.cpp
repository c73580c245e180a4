#include "parallel/nccl_comm.h"

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include "parallel/store_comm.h"

#if LATENT_WITH_CUDA
#include <c10/core/DeviceGuard.h>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

namespace latent::parallel {

#if LATENT_WITH_CUDA
namespace {

class NcclCommunicator : public Communicator {
 public:
  NcclCommunicator(c10::intrusive_ptr<c10d::Store> store, const std::string& name, int rank, int size,
                   const torch::Device& device, std::chrono::milliseconds timeout)
      : store_(store), rank_(rank), size_(size), device_(device) {
    c10::DeviceGuard guard(device);
    auto options = c10d::ProcessGroupNCCL::Options::create();
    options->timeout = timeout;
    pg_ = c10::make_intrusive<c10d::ProcessGroupNCCL>(
        c10::make_intrusive<c10d::PrefixStore>("latent/nccl/" + name, store), rank, size, options);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const char* backend_name() const override { return "nccl"; }

  void all_reduce_sum(torch::Tensor& t) override {
    check_peers();
    std::vector<torch::Tensor> v{on_device(t)};
    pg_->allreduce(v)->wait();
    if (v[0].data_ptr() != t.data_ptr()) t.copy_(v[0]);
  }

  std::vector<torch::Tensor> all_gather(const torch::Tensor& t) override {
    check_peers();
    std::vector<torch::Tensor> in{on_device(t)};
    std::vector<std::vector<torch::Tensor>> out(1);
    for (int r = 0; r < size_; ++r) out[0].push_back(torch::empty_like(in[0]));
    pg_->allgather(out, in)->wait();
    return out[0];
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
    auto work = pg_->endCoalescing();
    if (work) work->wait();
    if (!rp.empty() && rp[0].data_ptr() != from_prev.data_ptr()) from_prev.copy_(rp[0]);
    if (!rn.empty() && rn[0].data_ptr() != from_next.data_ptr()) from_next.copy_(rn[0]);
  }

  void abort(const std::string& why) noexcept override {
    try {
      store_->compareSet(kAbortKey, std::vector<uint8_t>{}, std::vector<uint8_t>(why.begin(), why.end()));
      pg_->abort();
    } catch (...) {
    }
  }

 private:
  // A look at the store is a round trip to rank 0's TCPStore: at most every 50 ms, not on each of the hundreds of
  // exchanges a chunk makes. A peer that fails between looks is caught by NCCL's own timeout.
  void check_peers() {
    const auto now = std::chrono::steady_clock::now();
    if (now - last_check_ < std::chrono::milliseconds(50)) return;
    last_check_ = now;
    throw_if_aborted(*store_, rank_);
  }
  torch::Tensor on_device(const torch::Tensor& t) const { return t.to(device_).contiguous(); }
  torch::Tensor recv_buffer(const torch::Tensor& t) const {
    return t.device() == device_ && t.is_contiguous() ? t : torch::empty(t.sizes(), t.options().device(device_));
  }

  c10::intrusive_ptr<c10d::Store> store_;
  int rank_, size_;
  torch::Device device_;
  c10::intrusive_ptr<c10d::ProcessGroupNCCL> pg_;
  std::chrono::steady_clock::time_point last_check_{};
};

}  // namespace

std::shared_ptr<Communicator> make_nccl_communicator(c10::intrusive_ptr<c10d::Store> store, const std::string& name,
                                                     int rank, int size, const torch::Device& device,
                                                     std::chrono::milliseconds timeout) {
  try {
    return std::make_shared<NcclCommunicator>(std::move(store), name, rank, size, device, timeout);
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
