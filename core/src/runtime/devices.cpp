#include "latent/runtime/devices.h"

#include <algorithm>
#include <charconv>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

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
  return host_available_memory();
}

namespace {

namespace fs = std::filesystem;

std::optional<uint64_t> parse_u64(const std::string& text) {
  uint64_t v = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || end != text.data() + text.size()) return std::nullopt;
  return v;
}

// A file holding one number, as the cgroup interface files do; nullopt for "max", a missing or unreadable file and
// anything else that is not a number.
std::optional<uint64_t> read_number(const fs::path& file) {
  std::ifstream in(file);
  std::string text;
  if (!in || !(in >> text)) return std::nullopt;
  return parse_u64(text);
}

// The value of `key` in a file of "key value" lines (memory.stat).
std::optional<uint64_t> read_field(const fs::path& file, const std::string& key) {
  std::ifstream in(file);
  std::string k, v;
  while (in >> k >> v)
    if (k == key) return parse_u64(v);
  return std::nullopt;
}

std::optional<uint64_t> meminfo_available(const fs::path& root) {
  std::ifstream meminfo(root / "proc/meminfo");
  std::string key, unit;
  uint64_t kib = 0;
  while (meminfo >> key >> kib >> unit)
    if (key == "MemAvailable:") return kib * 1024;
  return std::nullopt;
}

// One hierarchy's entry of /proc/self/cgroup ("id:controllers:path"): the path of the process's cgroup in it.
struct OwnCgroups {
  std::optional<std::string> unified;  // cgroup v2, the "0::" line
  std::optional<std::string> memory;   // cgroup v1, the line whose controllers include "memory"
};

OwnCgroups own_cgroups(const fs::path& root) {
  OwnCgroups out;
  std::ifstream in(root / "proc/self/cgroup");
  std::string line;
  while (std::getline(in, line)) {
    const size_t a = line.find(':'), b = a == std::string::npos ? a : line.find(':', a + 1);
    if (b == std::string::npos) continue;
    const std::string id = line.substr(0, a), controllers = line.substr(a + 1, b - a - 1), path = line.substr(b + 1);
    if (id == "0" && controllers.empty()) {
      out.unified = path;
      continue;
    }
    std::stringstream list(controllers);
    std::string c;
    while (std::getline(list, c, ','))
      if (c == "memory") out.memory = path;
  }
  return out;
}

// The names of the cgroups from the hierarchy's root down to `path`, each relative to the mount point.
std::vector<fs::path> cgroup_and_ancestors(const std::string& path) {
  std::vector<fs::path> levels{fs::path()};
  std::stringstream parts(path);
  std::string part;
  fs::path at;
  while (std::getline(parts, part, '/')) {
    if (part.empty() || part == ".") continue;
    if (part == "..") return {fs::path()};  // not a path the kernel writes: only the mount point is trusted
    at /= part;
    levels.push_back(at);
  }
  return levels;
}

struct CgroupFiles {
  const char* limit;     // bytes, or "max"
  const char* usage;     // bytes charged, page cache included
  const char* inactive;  // the memory.stat field of the inactive file cache below this cgroup
};
constexpr CgroupFiles kV2{"memory.max", "memory.current", "inactive_file"};
constexpr CgroupFiles kV1{"memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file"};
// cgroup v1 writes "no limit" as the largest page count in bytes (9223372036854771712 with 4 KiB pages).
constexpr uint64_t kV1Unlimited = uint64_t(1) << 62;

// The least room left under the limits of the cgroup at `path` and of its ancestors (a parent's limit holds its
// children too); nullopt where none of them has a limit that can be read.
std::optional<uint64_t> room_under_limits(const fs::path& mount, const std::string& path, const CgroupFiles& files) {
  std::optional<uint64_t> room;
  for (const fs::path& level : cgroup_and_ancestors(path)) {
    const fs::path dir = mount / level;
    const std::optional<uint64_t> limit = read_number(dir / files.limit);
    if (!limit || *limit >= kV1Unlimited) continue;
    const std::optional<uint64_t> usage = read_number(dir / files.usage);
    if (!usage) continue;
    // Inactive file cache is charged to the cgroup but dropped before anything is killed.
    const uint64_t inactive = std::min(read_field(dir / "memory.stat", files.inactive).value_or(0), *usage);
    const uint64_t used = *usage - inactive;
    const uint64_t left = *limit > used ? *limit - used : 0;
    room = room ? std::min(*room, left) : left;
  }
  return room;
}

}  // namespace

size_t host_available_memory(const fs::path& root) {
  std::optional<uint64_t> have = meminfo_available(root);
  const auto take = [&](std::optional<uint64_t> room) {
    if (room) have = have ? std::min(*have, *room) : *room;
  };
  const OwnCgroups own = own_cgroups(root);
  const fs::path mount = root / "sys/fs/cgroup";
  if (own.unified) take(room_under_limits(mount, *own.unified, kV2));
  if (own.memory) take(room_under_limits(mount / "memory", *own.memory, kV1));
  return have ? size_t(*have) : 0;
}

}  // namespace latent
