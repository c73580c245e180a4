// What ranks of a patch-parallel group say to each other. Ranks are threads of one process (an element driving
// `devices=cpu,cpu` or `cuda:0,cuda:1`) or processes on one or many machines (torchrun). CUDA ranks talk through
// LibTorch's c10d NCCL process group; CPU ranks, and CUDA ranks that share a GPU, through a small backend over a
// c10d store (an in-memory HashStore for threads, a TCPStore for processes), so CI runs every parallel path without
// a GPU. Halo exchange has a communicator of its own, apart from the collectives, so the two never interleave.
#pragma once

#include <torch/types.h>

#include <chrono>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace latent::parallel {

// A failure of the group rather than of this rank's own work.
class ParallelError : public std::runtime_error {
 public:
  enum class Kind {
    timeout,      // a rank did not arrive in time
    peer_failed,  // another rank failed; what() carries its cause
    backend       // the store or NCCL failed
  };
  ParallelError(Kind kind, const std::string& what) : std::runtime_error(what), kind_(kind) {}
  Kind kind() const { return kind_; }

 private:
  Kind kind_;
};

enum class Backend {
  automatic,  // NCCL where every rank has a CUDA device of its own, the store backend otherwise
  store,      // tensors through the c10d store: any device, any number of ranks per GPU
  nccl        // c10d::ProcessGroupNCCL (CUDA builds)
};

struct GroupOptions {
  // How long a rank waits for another before the group fails with ParallelError::Kind::timeout.
  std::chrono::milliseconds timeout{std::chrono::seconds(60)};
  Backend backend = Backend::automatic;
  // Whether to form the halo communicator. Users that never exchange halos (the generator) leave it out: forming
  // it costs every rank an NCCL communicator (or store keys) for nothing.
  bool halo_exchange = true;
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual const char* backend_name() const = 0;
  // Sums `t` over the ranks in place. Every rank gets the same bits.
  virtual void all_reduce_sum(torch::Tensor& t) = 0;
  // Every rank's `t`, in rank order; `t` has the same shape and dtype on every rank.
  virtual std::vector<torch::Tensor> all_gather(const torch::Tensor& t) = 0;
  // `input` cut into size() equal parts along dim 0, part j sent to rank j; returns, in rank order along dim 0, the
  // parts every rank sent here (c10d's alltoall_base with equal splits): a tensor of input's shape and dtype on
  // input's device. dim 0 must be a multiple of size(), and every rank's input of the same shape.
  virtual torch::Tensor all_to_all(const torch::Tensor& input) = 0;
  // Sends `to_prev` to rank - 1 and `to_next` to rank + 1, and receives into `from_prev` and `from_next` what
  // those ranks sent here. Undefined tensors are skipped; the caller sizes the receive buffers.
  virtual void exchange(const torch::Tensor& to_prev, const torch::Tensor& to_next, torch::Tensor& from_prev,
                        torch::Tensor& from_next) = 0;
  // Tells every rank of the group that this one failed: their pending and later calls throw ParallelError
  // (peer_failed) with `why`.
  virtual void abort(const std::string& why) noexcept = 0;
};

// A rank's two communicators; `halo` is null in groups formed without halo exchange.
struct RankComms {
  std::shared_ptr<Communicator> halo;
  std::shared_ptr<Communicator> collectives;
};

// Ranks as threads of this process, rank i on devices[i]. join() is called once per rank, from any thread; with
// NCCL it returns once every rank has joined (NCCL forms a communicator with all its ranks at once), and throws
// ParallelError where a rank does not join within the timeout or the group is aborted meanwhile. A rank whose join
// fails aborts the group itself.
class ThreadGroup {
 public:
  ThreadGroup(std::vector<torch::Device> devices, GroupOptions options = {});
  ~ThreadGroup();
  int size() const { return int(devices_.size()); }
  RankComms join(int rank);
  // Tells every rank, joined or still joining, that a rank failed: their waits in join() and their calls from then
  // on throw ParallelError(peer_failed) with `why` (the first abort's). For a rank that fails before or while it
  // joins, which would leave the others waiting for it until the timeout.
  void abort(const std::string& why) noexcept;

 private:
  struct Impl;
  std::vector<torch::Device> devices_;
  GroupOptions options_;
  std::shared_ptr<Impl> impl_;
};

// Ranks as processes: rank 0 serves the rendezvous store on host:port, the others connect. Returns once every rank
// has joined; throws ParallelError (timeout) when one has not within options.timeout.
RankComms join_tcp(const std::string& host, int port, int rank, int world, const torch::Device& device,
                   GroupOptions options = {});

// The torchrun environment: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT (and LOCAL_RANK, which the caller uses to
// pick its device). Throws std::invalid_argument naming a variable that is missing or malformed.
struct LaunchEnv {
  int rank = 0, world = 1, local_rank = 0;
  std::string host;
  int port = 0;
  static bool present();  // WORLD_SIZE is set
  static LaunchEnv read();
};

}  // namespace latent::parallel
