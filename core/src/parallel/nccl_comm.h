// CUDA ranks with a GPU each: c10d's ProcessGroupNCCL, one process group per communicator, so halo exchange and
// collectives run on NCCL communicators of their own.
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include "latent/parallel/comm.h"

namespace latent::parallel {

// Throws ParallelError(backend) in builds without CUDA.
std::shared_ptr<Communicator> make_nccl_communicator(c10::intrusive_ptr<c10d::Store> store, const std::string& name,
                                                     int rank, int size, const torch::Device& device,
                                                     std::chrono::milliseconds timeout);

}  // namespace latent::parallel
