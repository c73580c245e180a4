#include "latent/runtime/devices.h"

#include <algorithm>
#include <fstream>
#include <string>

#if LATENT_WITH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#endif

#include "latent/runtime/build_info.h"

namespace latent {

torch::Device resolve_device(const std::string& spec) {
  if (spec.empty() || spec == "auto") return cuda_available() ? torch::Device(torch::kCUDA, 0) : torch::kCPU;
  if (spec == "cpu") return torch::kCPU;
  if (spec.rfind("cuda", 0) == 0) {
    int index = 0;
    if (spec.size() > 4) {
      if (spec[4] != ':' || spec.size() == 5 || spec.find_first_not_of("0123456789", 5) != std::string::npos)
        throw DeviceError("device '" + spec + "' is not one of auto, cpu, cuda, cuda:N");
      if (spec.size() > 7) throw DeviceError("device '" + spec + "': no such CUDA device");
      index = std::stoi(spec.substr(5));
    }
    const int count = cuda_device_count();
    if (index >= count) {
      throw DeviceError("device '" + spec + "' requested, but this machine has " + std::to_string(count) +
                        (count == 1 ? " CUDA device" : " CUDA devices") +
                        (built_with_cuda() ? "" : " (gst-latent was built without CUDA)"));
    }
    return torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(index));
  }
  throw DeviceError("device '" + spec + "' is not one of auto, cpu, cuda, cuda:N");
}

torch::ScalarType resolve_dtype(const std::string& spec, torch::Device device) {
  if (spec.empty() || spec == "auto") return device.is_cuda() ? torch::kBFloat16 : torch::kFloat;
  if (spec == "float32" || spec == "f32" || spec == "fp32") return torch::kFloat;
  if (spec == "float16" || spec == "f16" || spec == "fp16") return torch::kHalf;
  if (spec == "bfloat16" || spec == "bf16") return torch::kBFloat16;
  throw std::invalid_argument("dtype '" + spec + "' is not one of auto, float32, float16, bfloat16");
}

size_t available_memory(torch::Device device) {
#if LATENT_WITH_CUDA
  if (device.is_cuda()) {
    namespace alloc = c10::cuda::CUDACachingAllocator;
    const c10::DeviceIndex index = device.has_index() ? device.index() : 0;
    // The driver's free memory, and the blocks the caching allocator holds that no tensor uses: those are free
    // to this process too.
    const size_t free = alloc::get()->getMemoryInfo(index).first;
    const auto stats = alloc::getDeviceStats(index);
    const auto agg = size_t(c10::CachingAllocator::StatType::AGGREGATE);
    return free + size_t(std::max<int64_t>(0, stats.reserved_bytes[agg].current - stats.allocated_bytes[agg].current));
  }
#endif
  if (!device.is_cpu()) return 0;
  std::ifstream meminfo("/proc/meminfo");
  std::string key, unit;
  size_t kib = 0;
  while (meminfo >> key >> kib >> unit)
    if (key == "MemAvailable:") return kib * 1024;
  return 0;
}

}  // namespace latent
