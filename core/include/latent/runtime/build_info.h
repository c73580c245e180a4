// What this build of the core library can do and what the machine offers.
#pragma once

#include <string>

namespace latent {

// True when the library was linked against the CUDA build of LibTorch (libtorch_cuda).
bool built_with_cuda();
// True when CUDA kernels are registered and at least one GPU answers.
bool cuda_available();
int cuda_device_count();
// "LibTorch 2.11.0, CUDA build, 0 GPUs": one line for logs and gst-inspect.
std::string runtime_summary();

}  // namespace latent
