// The device a process takes when torchrun started it. torchrun starts one process per GPU of a machine and tells
// each its index there (LOCAL_RANK); PyTorch programs then call torch.cuda.set_device(LOCAL_RANK). Elements whose
// device is left to them do the same, so the processes of one machine spread over its GPUs instead of all
// computing on the first one.
#pragma once

#include <string>

namespace latent::gst {

// The variables torchrun sets that bear on the device; empty when unset.
struct LaunchVariables {
  std::string world_size, rank, local_rank;

  static LaunchVariables from_environment();
  // Whether the process was started by torchrun (or a launcher like it).
  bool present() const { return !world_size.empty() || !local_rank.empty(); }
};

// The device `requested` (a device property: auto, cpu, cuda, cuda:N) stands for in this process. Under torchrun,
// on a machine with CUDA devices, "auto" (or empty) and "cuda", which name no GPU, become cuda:LOCAL_RANK (RANK
// where LOCAL_RANK is unset). Everything else is returned as it is: a named device (never overridden), any request
// outside torchrun, and auto on a machine without CUDA (which stays the CPU). Throws std::invalid_argument when the
// rank it would use is not a whole number, or names a GPU the machine does not have.
std::string device_for_process(const std::string& requested, const LaunchVariables& env, int cuda_devices);

}  // namespace latent::gst
