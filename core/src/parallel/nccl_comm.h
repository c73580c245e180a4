// CUDA ranks with a GPU each: c10d's ProcessGroupNCCL, one process group per communicator, so halo exchange and
// collectives run on NCCL communicators of their own.
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <functional>

#include "latent/parallel/comm.h"

namespace latent::parallel {

// Called with a communicator before it forms.
using Enlist = std::function<void(const std::shared_ptr<Communicator>&)>;

// Throws ParallelError(backend) in builds without CUDA. Returns once the NCCL communicator is formed, which needs
// every rank of the group to call this at the same time. The wait is bounded: it throws ParallelError where a rank
// has not come within `timeout` (timeout) or the group is aborted meanwhile (peer_failed), through the store's
// abort key or the communicator's abort(), which `enlist` lets the caller reach from another thread.
std::shared_ptr<Communicator> make_nccl_communicator(c10::intrusive_ptr<c10d::Store> store, const std::string& name,
                                                     int rank, int size, const torch::Device& device,
                                                     std::chrono::milliseconds timeout, const Enlist& enlist = {});

// The error handling mode (TORCH_NCCL_ASYNC_ERROR_HANDLING's values) this project's NCCL groups run with, given
// the variable's value (null: unset): one that never ends the process, the user's where theirs does not.
int nccl_error_handling_mode(const char* current);

// The mode of this process's groups, read once (a note on stderr where the user's value is overridden). The
// environment is left as it is.
int keep_process_on_nccl_errors();

}  // namespace latent::parallel
