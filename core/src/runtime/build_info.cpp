#include "latent/runtime/build_info.h"

#include <torch/cuda.h>
#include <torch/version.h>

namespace latent {

bool built_with_cuda() {
#ifdef LATENT_WITH_CUDA
  return true;
#else
  return false;
#endif
}

bool cuda_available() { return torch::cuda::is_available(); }

int cuda_device_count() { return cuda_available() ? int(torch::cuda::device_count()) : 0; }

std::string runtime_summary() {
  std::string s = "LibTorch " TORCH_VERSION;
  s += built_with_cuda() ? ", CUDA build, " : ", CPU build, ";
  int n = cuda_device_count();
  s += std::to_string(n) + (n == 1 ? " GPU" : " GPUs");
  return s;
}

}  // namespace latent
