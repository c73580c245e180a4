#include "memory/heap.h"

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <sys/mman.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <unordered_map>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace latent {
namespace {

// Below this, glibc serves from its arenas without the creep described in heap.h, and a chunk's small tensors
// are not worth a lock.
constexpr size_t kMinBlock = size_t(256) << 10;
constexpr size_t kPage = 4096;
// Mappings come in multiples of this.
constexpr size_t kGranule = size_t(2) << 20;
// Address space reserved at once: a page costs memory only once touched, and one large range lets every
// block of a chunk be carved from and coalesced back into it, so first fit keeps the touched pages packed.
// With 32 MiB mappings instead, Wan 2.1 at 64x64 touched 94 MiB for 47 MiB live; with this, 56 MiB.
constexpr size_t kReserve = size_t(1) << 30;

size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

enum class Policy { stream, trim, glibc };

Policy policy() {
  static const Policy p = [] {
    const char* v = std::getenv("LATENT_CPU_HEAP");
    if (!v || !*v || std::strcmp(v, "stream") == 0) return Policy::stream;
    if (std::strcmp(v, "trim") == 0) return Policy::trim;
    if (std::strcmp(v, "glibc") == 0) return Policy::glibc;
    throw std::invalid_argument(std::string("LATENT_CPU_HEAP must be stream, trim or glibc; got ") + v);
  }();
  return p;
}

struct Segment;

struct Block {
  char* ptr;
  size_t size;
  bool free = true;
  Block* prev = nullptr;  // neighbours in address order within the segment
  Block* next = nullptr;
  Segment* segment;
};

// First fit in address order: blocks pile up at the low end of the mappings, so the pages a stream ever touches
// stay close to its most live bytes at once, and a chunk that repeats the previous one's requests gets the same
// blocks back.
struct ByAddress {
  bool operator()(const Block* a, const Block* b) const { return a->ptr < b->ptr; }
};

// Every live mapping by its start, to find a block's heap from its address alone: LibTorch's raw deleter and
// frees on other threads carry nothing else. Leaked on purpose: tensors may be freed during static destruction.
struct Registry {
  std::mutex mutex;
  std::map<char*, Segment*> segments;
};
Registry& registry() {
  static Registry* r = new Registry;
  return *r;
}

thread_local ActivationHeap::Impl* t_heap = nullptr;

}  // namespace

struct ActivationHeap::Impl {
  std::mutex mutex;
  std::set<Block*, ByAddress> free_blocks;
  std::unordered_map<char*, Block*> used;
  size_t segment_count = 0;
  bool closed = false;  // the owner is gone: mappings go back as soon as they are fully free
  Stats stats;

  // nullptr when no mapping could be made (the caller falls back to LibTorch's allocator).
  char* allocate(size_t n);
  // Returns true when this was the last block of a closed heap, which the caller then deletes.
  bool release(char* p);
  // Unmaps the mappings that are fully free and drops the pages of free blocks in the others.
  void release_free();

 private:
  Block* map_segment(size_t size);
  // Merges a's successor into a (both free) and returns a, out of the free index.
  Block* absorb_next(Block* a);
  void unmap(Segment* s);
};

namespace {

struct Segment {
  char* base;
  size_t size;
  ActivationHeap::Impl* owner;
  Block* first;
  size_t touched = 0;
};

Segment* find_segment(const void* p) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  auto it = r.segments.upper_bound(static_cast<char*>(const_cast<void*>(p)));
  if (it == r.segments.begin()) return nullptr;
  --it;
  return static_cast<const char*>(p) < it->first + it->second->size ? it->second : nullptr;
}

void release_block(void* p) {
  Segment* s = find_segment(p);
  // The segment cannot go away meanwhile: the block being freed keeps it mapped.
  ActivationHeap::Impl* heap = s->owner;
  if (heap->release(static_cast<char*>(p))) delete heap;
}

// What LibTorch's own allocator frees raw pointers with (raw_allocate / raw_deallocate).
c10::DeleterFnPtr g_fallback_raw = nullptr;

void raw_release(void* p) {
  if (find_segment(p)) {
    release_block(p);
  } else {
    g_fallback_raw(p);
  }
}

// LibTorch's CPU allocator, with large allocations of threads inside a Scope sent to that scope's heap.
class RoutingAllocator final : public c10::Allocator {
 public:
  explicit RoutingAllocator(c10::Allocator* fallback) : fallback_(fallback) {
    g_fallback_raw = fallback->raw_deleter();
  }

  c10::DataPtr allocate(size_t n) override {
    if (ActivationHeap::Impl* heap = t_heap; heap && n >= kMinBlock) {
      if (char* p = heap->allocate(n)) return {p, p, &release_block, c10::Device(c10::DeviceType::CPU)};
    }
    return fallback_->allocate(n);
  }

  c10::DeleterFnPtr raw_deleter() const override { return g_fallback_raw ? &raw_release : nullptr; }

  void copy_data(void* dest, const void* src, std::size_t count) const override { std::memcpy(dest, src, count); }

  // nullptr where another allocator, installed with a higher priority, keeps LibTorch's CPU allocations.
  static RoutingAllocator* installed() {
    static RoutingAllocator* instance = [] {
      auto* r = new RoutingAllocator(c10::GetCPUAllocator());
      c10::SetCPUAllocator(r, 0);  // priority 0 replaces LibTorch's default
      return r;
    }();
    return c10::GetCPUAllocator() == instance ? instance : nullptr;
  }

 private:
  c10::Allocator* fallback_;
};

}  // namespace

Block* ActivationHeap::Impl::map_segment(size_t size) {
  size_t bytes = round_up(std::max(size, kReserve), kGranule);
  void* base = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (base == MAP_FAILED) {
    // Where the system accounts every mapped byte (vm.overcommit_memory=2), map only what is asked for.
    bytes = round_up(size, kGranule);
    base = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (base == MAP_FAILED) return nullptr;
  }
  auto* s = new Segment{static_cast<char*>(base), bytes, this, nullptr, 0};
  s->first = new Block{s->base, bytes, true, nullptr, nullptr, s};
  {
    Registry& r = registry();
    std::lock_guard<std::mutex> lock(r.mutex);
    r.segments.emplace(s->base, s);
  }
  ++segment_count;
  stats.segments = segment_count;
  stats.mapped += bytes;
  ++stats.fresh_maps;
  return s->first;
}

void ActivationHeap::Impl::unmap(Segment* s) {
  {
    Registry& r = registry();
    std::lock_guard<std::mutex> lock(r.mutex);
    r.segments.erase(s->base);
  }
  ::munmap(s->base, s->size);
  stats.mapped -= s->size;
  stats.touched -= s->touched;
  --segment_count;
  stats.segments = segment_count;
  delete s->first;
  delete s;
}

char* ActivationHeap::Impl::allocate(size_t n) {
  const size_t size = round_up(n, kPage);
  std::lock_guard<std::mutex> lock(mutex);
  Block* b = nullptr;
  auto it = free_blocks.begin();
  while (it != free_blocks.end() && (*it)->size < size) ++it;
  if (it != free_blocks.end()) {
    b = *it;
    free_blocks.erase(it);
  } else if (!(b = map_segment(size))) {
    return nullptr;
  }
  if (b->size - size >= kMinBlock) {
    auto* rest = new Block{b->ptr + size, b->size - size, true, b, b->next, b->segment};
    if (b->next) b->next->prev = rest;
    b->next = rest;
    b->size = size;
    free_blocks.insert(rest);
  }
  b->free = false;
  used.emplace(b->ptr, b);
  stats.in_use += b->size;
  if (const size_t end = size_t(b->ptr + b->size - b->segment->base); end > b->segment->touched) {
    stats.touched += end - b->segment->touched;
    b->segment->touched = end;
  }
  stats.peak_in_use = std::max(stats.peak_in_use, stats.in_use);
  ++stats.allocations;
  return b->ptr;
}

Block* ActivationHeap::Impl::absorb_next(Block* a) {
  Block* b = a->next;
  free_blocks.erase(a);
  free_blocks.erase(b);
  a->size += b->size;
  a->next = b->next;
  if (b->next) b->next->prev = a;
  delete b;
  return a;
}

bool ActivationHeap::Impl::release(char* p) {
  std::lock_guard<std::mutex> lock(mutex);
  auto it = used.find(p);
  Block* b = it->second;
  used.erase(it);
  stats.in_use -= b->size;
  b->free = true;
  // Merge with free neighbours so the range can serve a larger request later.
  if (Block* prev = b->prev; prev && prev->free) b = absorb_next(prev);
  if (Block* next = b->next; next && next->free) b = absorb_next(b);
  if (closed && !b->prev && !b->next) {
    unmap(b->segment);
    return segment_count == 0;
  }
  free_blocks.insert(b);
  return false;
}

void ActivationHeap::Impl::release_free() {
  for (auto it = free_blocks.begin(); it != free_blocks.end();) {
    Block* b = *it;
    if (!b->prev && !b->next) {
      it = free_blocks.erase(it);
      unmap(b->segment);
    } else {
      // A block still in use keeps its mapping; the free pages around it need not stay resident.
      ::madvise(b->ptr, b->size, MADV_DONTNEED);
      ++it;
    }
  }
}

ActivationHeap::ActivationHeap() : impl_(new Impl) {}

ActivationHeap::~ActivationHeap() {
  bool dead;
  {
    std::lock_guard<std::mutex> lock(impl_->mutex);
    impl_->closed = true;
    impl_->release_free();
    dead = impl_->segment_count == 0;
  }
  // Otherwise the last block freed deletes it (release_block).
  if (dead) delete impl_;
}

void check_cpu_heap_policy() { policy(); }

std::unique_ptr<ActivationHeap> ActivationHeap::create() {
  RoutingAllocator* routing = RoutingAllocator::installed();
  if (!routing) return nullptr;
  return std::unique_ptr<ActivationHeap>(new ActivationHeap());
}

std::unique_ptr<ActivationHeap> ActivationHeap::for_device(const torch::Device& device) {
  if (!device.is_cpu() || policy() != Policy::stream) return nullptr;
  return create();
}

ActivationHeap::Stats ActivationHeap::stats() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  return impl_->stats;
}

ActivationHeap::Scope::Scope(ActivationHeap* heap, const torch::Device& device)
    : previous_(t_heap), trim_(!heap && device.is_cpu() && policy() != Policy::glibc) {
  t_heap = heap ? heap->impl_ : nullptr;
}

ActivationHeap::Scope::~Scope() {
  t_heap = previous_;
#if defined(__GLIBC__)
  if (trim_) ::malloc_trim(0);
#endif
}

}  // namespace latent
