// The stream's activation heap (core/src/heap.h): what it takes, what it gives back, and that tensors living in
// it behave like any other, whichever thread frees them and however long they outlive the heap.
#include <c10/core/CPUAllocator.h>
#include <gtest/gtest.h>
#include <torch/types.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>

#include "memory/heap.h"
#include "vae_fixtures.h"

using latent::ActivationHeap;
using latent::testing::rss_mib;

namespace {

const torch::Device kCpu(torch::kCPU);

std::unique_ptr<ActivationHeap> heap_or_skip() {
  auto heap = ActivationHeap::create();
  if (!heap) ADD_FAILURE() << "the routing allocator was not installed (another CPU allocator has priority)";
  return heap;
}

torch::Tensor floats_mib(double mib) { return torch::empty({int64_t(mib * (1 << 20) / 4)}, torch::kFloat); }

}  // namespace

TEST(ActivationHeap, TakesLargeAllocationsOnlyInsideItsScope) {
  auto heap = heap_or_skip();
  if (!heap) return;
  torch::Tensor outside = floats_mib(2);
  EXPECT_EQ(heap->stats().in_use, 0u);
  {
    ActivationHeap::Scope scope(heap.get(), kCpu);
    torch::Tensor big = floats_mib(2);
    torch::Tensor small = torch::empty({1000}, torch::kFloat);  // 4 KB: left to LibTorch's allocator
    EXPECT_EQ(heap->stats().in_use, size_t(2) << 20);
    {
      ActivationHeap::Scope none(nullptr, kCpu);  // scopes nest; no heap sends allocations back to LibTorch
      torch::Tensor elsewhere = floats_mib(2);
      EXPECT_EQ(heap->stats().in_use, size_t(2) << 20);
    }
    torch::Tensor again = floats_mib(1);
    EXPECT_EQ(heap->stats().in_use, size_t(3) << 20);
  }
  torch::Tensor after = floats_mib(2);
  EXPECT_EQ(heap->stats().in_use, 0u);
  EXPECT_EQ(heap->stats().allocations, 2u);
}

TEST(ActivationHeap, ARepeatedSequenceOfRequestsReusesTheSameBlocks) {
  auto heap = heap_or_skip();
  if (!heap) return;
  ActivationHeap::Scope scope(heap.get(), kCpu);
  std::vector<void*> first, second;
  for (int round = 0; round < 3; ++round) {
    // A chunk: a carried tensor kept, activations of several sizes made and dropped in a nested order.
    std::vector<void*>& seen = round == 0 ? first : second;
    seen.clear();
    torch::Tensor a = floats_mib(3), b = floats_mib(1.5);
    seen.push_back(a.data_ptr());
    seen.push_back(b.data_ptr());
    a = torch::Tensor();
    torch::Tensor c = floats_mib(2.25);
    seen.push_back(c.data_ptr());
    torch::Tensor d = floats_mib(0.5);
    seen.push_back(d.data_ptr());
  }
  EXPECT_EQ(first, second);
  const ActivationHeap::Stats s = heap->stats();
  EXPECT_EQ(s.fresh_maps, 1u);
  EXPECT_LE(s.touched, size_t(5) << 20) << "first fit keeps the touched range near the most live at once";
  EXPECT_EQ(s.in_use, 0u);
}

TEST(ActivationHeap, FreedNeighboursMergeToServeALargerBlock) {
  auto heap = heap_or_skip();
  if (!heap) return;
  ActivationHeap::Scope scope(heap.get(), kCpu);
  torch::Tensor a = floats_mib(1), b = floats_mib(1), c = floats_mib(1);
  ASSERT_EQ(static_cast<char*>(b.data_ptr()), static_cast<char*>(a.data_ptr()) + (1 << 20));
  void* start = a.data_ptr();
  a = torch::Tensor();
  b = torch::Tensor();
  torch::Tensor ab = floats_mib(2);
  EXPECT_EQ(ab.data_ptr(), start);
  EXPECT_EQ(heap->stats().touched, size_t(3) << 20);
}

TEST(ActivationHeap, TensorsWorkAndCanBeFreedOnAnotherThread) {
  auto heap = heap_or_skip();
  if (!heap) return;
  torch::Tensor x;
  {
    ActivationHeap::Scope scope(heap.get(), kCpu);
    x = torch::arange(1 << 20, torch::kFloat).mul(2);
  }
  EXPECT_GT(heap->stats().in_use, 0u);
  EXPECT_EQ(x.sum().item<double>(), double(1 << 20) * double((1 << 20) - 1));
  std::thread([t = std::move(x)]() mutable { t = torch::Tensor(); }).join();
  EXPECT_EQ(heap->stats().in_use, 0u);
}

TEST(ActivationHeap, RawAllocationsGoBackWhereTheyCameFrom) {
  auto heap = heap_or_skip();
  if (!heap) return;
  c10::Allocator* cpu = c10::GetCPUAllocator();
  void* outside = cpu->raw_allocate(size_t(1) << 20);
  void* inside = nullptr;
  {
    ActivationHeap::Scope scope(heap.get(), kCpu);
    inside = cpu->raw_allocate(size_t(1) << 20);
  }
  EXPECT_EQ(heap->stats().in_use, size_t(1) << 20);
  cpu->raw_deallocate(inside);
  cpu->raw_deallocate(outside);
  EXPECT_EQ(heap->stats().in_use, 0u);
}

TEST(ActivationHeap, MemoryGoesBackWhenTheHeapAndItsLastTensorAreGone) {
  auto heap = heap_or_skip();
  if (!heap) return;
  const double before = rss_mib();
  torch::Tensor kept;
  {
    ActivationHeap::Scope scope(heap.get(), kCpu);
    torch::Tensor dropped = floats_mib(64).fill_(1);
    kept = floats_mib(64).fill_(2);
  }
  EXPECT_GT(rss_mib() - before, 100.0) << "both blocks were touched and stay resident in the heap";
  heap.reset();  // the free 64 MiB go back at once, the kept tensor's block when it is freed
  EXPECT_LT(rss_mib() - before, 80.0);
  EXPECT_EQ(kept[12345].item<float>(), 2.0f);
  kept = torch::Tensor();
  EXPECT_LT(rss_mib() - before, 16.0);
}

// LATENT_CPU_HEAP is read once per process: tests/core/meson.build runs this one alone with a wrong value.
TEST(HeapPolicy, AnUnknownPolicyIsAClearError) {
  const char* v = std::getenv("LATENT_CPU_HEAP");
  if (!v || std::string(v) != "fastest") GTEST_SKIP() << "[elsewhere] runs in core-heap-policy, with LATENT_CPU_HEAP=fastest";
  try {
    ActivationHeap::for_device(kCpu);
    FAIL() << "accepted LATENT_CPU_HEAP=fastest";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("stream, trim or glibc"), std::string::npos) << e.what();
  }
  // Loading a CPU model checks it, so an element fails at start with the message, not in a stream.
  if (latent::testing::fixtures_dir().empty()) return;
  EXPECT_THROW(latent::load_vae(latent::testing::fixtures_dir() / "wan"), std::invalid_argument);
}
