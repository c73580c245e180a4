#include "heap.h"

#include <cstdlib>
#include <cstring>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace latent {
namespace {

bool trimming_enabled() {
  static const bool enabled = [] {
    const char* v = std::getenv("LATENT_HEAP_TRIM");
    return !(v && std::strcmp(v, "0") == 0);
  }();
  return enabled;
}

}  // namespace

void after_chunk(const torch::Device& device) {
#if defined(__GLIBC__)
  if (device.is_cpu() && trimming_enabled()) ::malloc_trim(0);
#else
  (void)device;
#endif
}

}  // namespace latent
