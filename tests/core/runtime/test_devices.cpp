#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "latent/runtime/build_info.h"
#include "latent/runtime/devices.h"
#include "latent/runtime/shared_models.h"
#include "vae_fixtures.h"

using namespace latent;

TEST(Registry, ParsesDevicesAndRefusesMissingOnes) {
  EXPECT_EQ(resolve_device("cpu"), torch::Device(torch::kCPU));
  EXPECT_EQ(resolve_device("auto").is_cuda(), cuda_available());
  for (const char* bad : {"gpu", "cuda:", "cuda:x", "cuda0", "cuda:-1", "tpu:0"}) {
    EXPECT_THROW(resolve_device(bad), DeviceError) << bad;
  }
  if (cuda_device_count() < 8) {
    try {
      resolve_device("cuda:7");
      FAIL() << "cuda:7 accepted";
    } catch (const DeviceError& e) {
      EXPECT_NE(std::string(e.what()).find("'cuda:7' requested, but this machine has"), std::string::npos) << e.what();
    }
  }
  if (!cuda_available()) {
    EXPECT_THROW(resolve_device("cuda"), DeviceError);
  }
}

TEST(Registry, ParsesDtypes) {
  EXPECT_EQ(resolve_dtype("auto", torch::kCPU), torch::kFloat);
  EXPECT_EQ(resolve_dtype("auto", torch::Device(torch::kCUDA, 0)), torch::kBFloat16);
  EXPECT_EQ(resolve_dtype("bfloat16", torch::kCPU), torch::kBFloat16);
  EXPECT_EQ(resolve_dtype("fp16", torch::kCPU), torch::kHalf);
  EXPECT_THROW(resolve_dtype("int8", torch::kCPU), std::invalid_argument);
}

TEST(Registry, SharesOneLoadedCopyWhileHeld) {
  LATENT_REQUIRE_FIXTURES();
  auto dir = latent::testing::fixtures_dir() / "wan";
  auto a = shared_vae(dir, {});
  auto b = shared_vae(dir.parent_path() / "." / "wan", {});  // another spelling of the same folder
  EXPECT_EQ(a.get(), b.get());
  auto half = shared_vae(dir, {.dtype = torch::kBFloat16});
  EXPECT_NE(a.get(), half.get());
  const Vae* old = a.get();
  a.reset();
  b.reset();
  auto again = shared_vae(dir, {});
  EXPECT_EQ(again->spec().family, "wan2.1");
  (void)old;  // the address may be reused; what matters is that a fresh load works
}

namespace {

namespace fs = std::filesystem;

// A fake file system root with the /proc and /sys/fs/cgroup files host_available_memory() reads.
class FakeRoot {
 public:
  FakeRoot() : dir_(fs::temp_directory_path() / ("latent-fake-root-" + std::to_string(::getpid()) + "-" + name())) {
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  ~FakeRoot() { fs::remove_all(dir_); }
  const fs::path& path() const { return dir_; }
  void write(const std::string& relative, const std::string& text) const {
    fs::create_directories((dir_ / relative).parent_path());
    std::ofstream(dir_ / relative) << text;
  }
  void meminfo(uint64_t available_kib) const {
    write("proc/meminfo", "MemTotal:       65536000 kB\nMemFree:         1000000 kB\nMemAvailable:   " +
                              std::to_string(available_kib) + " kB\n");
  }

 private:
  static std::string name() { return ::testing::UnitTest::GetInstance()->current_test_info()->name(); }
  fs::path dir_;
};

constexpr uint64_t kGiB = uint64_t(1) << 30;

}  // namespace

TEST(HostMemory, WithoutALimitIsMemAvailable) {
  FakeRoot root;
  root.meminfo(8 * (kGiB >> 10));
  root.write("proc/self/cgroup", "0::/user.slice/session-1.scope\n");
  root.write("sys/fs/cgroup/user.slice/session-1.scope/memory.max", "max\n");
  root.write("sys/fs/cgroup/user.slice/session-1.scope/memory.current", std::to_string(30 * kGiB) + "\n");
  root.write("sys/fs/cgroup/user.slice/memory.max", "max\n");
  EXPECT_EQ(host_available_memory(root.path()), 8 * kGiB);
}

TEST(HostMemory, ACgroupV2LimitBelowMemAvailableWins) {
  FakeRoot root;
  root.meminfo(8 * (kGiB >> 10));
  root.write("proc/self/cgroup", "0::/\n");  // a container's own cgroup namespace: its cgroup is the mount point
  root.write("sys/fs/cgroup/memory.max", std::to_string(4 * kGiB) + "\n");
  root.write("sys/fs/cgroup/memory.current", std::to_string(3 * kGiB) + "\n");
  // Inactive page cache is dropped before the OOM killer runs: it counts as room.
  root.write("sys/fs/cgroup/memory.stat", "anon 100\nfile 600\ninactive_file " + std::to_string(kGiB / 2) + "\n");
  EXPECT_EQ(host_available_memory(root.path()), kGiB + kGiB / 2);
}

TEST(HostMemory, AnAncestorsLimitHoldsItsChildren) {
  FakeRoot root;
  root.meminfo(64 * (kGiB >> 10));
  root.write("proc/self/cgroup", "0::/kubepods/pod1/ctr\n");
  root.write("sys/fs/cgroup/kubepods/pod1/ctr/memory.max", "max\n");
  root.write("sys/fs/cgroup/kubepods/pod1/ctr/memory.current", std::to_string(kGiB) + "\n");
  root.write("sys/fs/cgroup/kubepods/pod1/memory.max", std::to_string(6 * kGiB) + "\n");
  root.write("sys/fs/cgroup/kubepods/pod1/memory.current", std::to_string(4 * kGiB) + "\n");
  root.write("sys/fs/cgroup/kubepods/memory.max", std::to_string(16 * kGiB) + "\n");
  root.write("sys/fs/cgroup/kubepods/memory.current", std::to_string(10 * kGiB) + "\n");
  EXPECT_EQ(host_available_memory(root.path()), 2 * kGiB);
}

TEST(HostMemory, ACgroupV1LimitCounts) {
  FakeRoot root;
  root.meminfo(8 * (kGiB >> 10));
  root.write("proc/self/cgroup", "4:memory:/process_api/abc\n3:cpu,cpuacct:/\n0::/\n");
  root.write("sys/fs/cgroup/memory/process_api/abc/memory.limit_in_bytes", std::to_string(3 * kGiB) + "\n");
  root.write("sys/fs/cgroup/memory/process_api/abc/memory.usage_in_bytes", std::to_string(2 * kGiB) + "\n");
  root.write("sys/fs/cgroup/memory/process_api/abc/memory.stat",
             "cache 5\ninactive_file 1\ntotal_inactive_file " + std::to_string(kGiB / 4) + "\n");
  // v1 writes "no limit" as the largest page count.
  root.write("sys/fs/cgroup/memory/memory.limit_in_bytes", "9223372036854771712\n");
  root.write("sys/fs/cgroup/memory/memory.usage_in_bytes", std::to_string(40 * kGiB) + "\n");
  EXPECT_EQ(host_available_memory(root.path()), kGiB + kGiB / 4);
}

TEST(HostMemory, AFullCgroupHasNoRoom) {
  FakeRoot root;
  root.meminfo(8 * (kGiB >> 10));
  root.write("proc/self/cgroup", "0::/\n");
  root.write("sys/fs/cgroup/memory.max", std::to_string(kGiB) + "\n");
  root.write("sys/fs/cgroup/memory.current", std::to_string(kGiB + 4096) + "\n");
  EXPECT_EQ(host_available_memory(root.path()), 0u);
}

TEST(HostMemory, UnreadableFilesAreNoLimit) {
  FakeRoot root;
  root.meminfo(8 * (kGiB >> 10));
  root.write("proc/self/cgroup", "0::/a\n7:memory:/b\n");
  // v2: the limit is not a file; v1: a limit without its usage, and garbage in the parent's.
  fs::create_directories(root.path() / "sys/fs/cgroup/a/memory.max");
  root.write("sys/fs/cgroup/a/memory.current", std::to_string(kGiB) + "\n");
  root.write("sys/fs/cgroup/memory/b/memory.limit_in_bytes", std::to_string(kGiB) + "\n");
  root.write("sys/fs/cgroup/memory/memory.limit_in_bytes", "lots\n");
  root.write("sys/fs/cgroup/memory/memory.usage_in_bytes", "1\n");
  EXPECT_EQ(host_available_memory(root.path()), 8 * kGiB);
  // No cgroup file at all, then not even /proc/meminfo: MemAvailable, then unknown.
  fs::remove_all(root.path() / "sys");
  fs::remove(root.path() / "proc/self/cgroup");
  EXPECT_EQ(host_available_memory(root.path()), 8 * kGiB);
  fs::remove(root.path() / "proc/meminfo");
  EXPECT_EQ(host_available_memory(root.path()), 0u);
  // A limit alone, without MemAvailable, is still known.
  root.write("proc/self/cgroup", "0::/\n");
  root.write("sys/fs/cgroup/memory.max", std::to_string(2 * kGiB) + "\n");
  root.write("sys/fs/cgroup/memory.current", std::to_string(kGiB) + "\n");
  EXPECT_EQ(host_available_memory(root.path()), kGiB);
}
