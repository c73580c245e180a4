#include "memory/residency.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <utility>

namespace latent {
namespace {

using PageRange = std::pair<uintptr_t, uintptr_t>;  // [first, last) byte addresses, page-aligned

uintptr_t page_down(uintptr_t a, uintptr_t page) { return a / page * page; }
uintptr_t page_up(uintptr_t a, uintptr_t page) { return (a + page - 1) / page * page; }

// Sorted, overlapping and touching ranges merged.
std::vector<PageRange> merged(std::vector<PageRange> ranges) {
  std::sort(ranges.begin(), ranges.end());
  std::vector<PageRange> out;
  for (const auto& r : ranges) {
    if (!out.empty() && r.first <= out.back().second)
      out.back().second = std::max(out.back().second, r.second);
    else
      out.push_back(r);
  }
  return out;
}

// `from` without any byte of `keep` (both merged).
std::vector<PageRange> subtract(const std::vector<PageRange>& from, const std::vector<PageRange>& keep) {
  std::vector<PageRange> out;
  size_t k = 0;
  for (auto [lo, hi] : from) {
    while (k < keep.size() && keep[k].second <= lo) ++k;
    for (size_t j = k; j < keep.size() && keep[j].first < hi; ++j) {
      if (keep[j].first > lo) out.emplace_back(lo, keep[j].first);
      lo = std::max(lo, keep[j].second);
    }
    if (lo < hi) out.emplace_back(lo, hi);
  }
  return out;
}

// Faults the pages in; MADV_POPULATE_READ (Linux 5.14) does it in one call, older kernels get a read per page.
int64_t populate(const PageRange& r, uintptr_t page) {
#ifndef MADV_POPULATE_READ
  constexpr int MADV_POPULATE_READ = 22;
#endif
  void* addr = reinterpret_cast<void*>(r.first);
  const size_t len = r.second - r.first;
  if (::madvise(addr, len, MADV_POPULATE_READ) != 0) {
    volatile unsigned char sink = 0;
    for (uintptr_t p = r.first; p < r.second; p += page)
      sink = sink + *reinterpret_cast<volatile const unsigned char*>(p);
    (void)sink;
  }
  return int64_t(len);
}

// Bytes from a tensor's first element to one past the last one it reaches (nbytes() for a contiguous tensor).
int64_t extent_bytes(const torch::Tensor& t) {
  if (t.numel() == 0) return 0;
  int64_t last = 0;
  for (int64_t i = 0; i < t.dim(); ++i) last += (t.size(i) - 1) * t.stride(i);
  return (last + 1) * int64_t(t.element_size());
}

}  // namespace

Residency settle_residency(const WeightSource& source) {
  Residency out;
  if (source.mapped.empty()) return out;
  const uintptr_t page = uintptr_t(::sysconf(_SC_PAGESIZE));
  std::vector<PageRange> kept, dropped;
  for (const auto& entry : source.tensors) {
    // Not a structured binding: the lambda below captures it, which clang 14 (the fuzz build) refuses.
    const torch::Tensor& t = entry.second;
    if (!t.defined() || !t.device().is_cpu()) continue;
    // A .pth tensor may be a strided view of a storage: its pages are those of its extent, not of nbytes().
    const int64_t extent = extent_bytes(t);
    if (extent == 0) continue;
    const auto* data = static_cast<const std::byte*>(t.data_ptr());
    const bool in_mapping = std::any_of(source.mapped.begin(), source.mapped.end(), [&](const auto& m) {
      return data >= m.data() && data + extent <= m.data() + m.size();
    });
    if (!in_mapping) continue;
    const uintptr_t lo = reinterpret_cast<uintptr_t>(data), hi = lo + uintptr_t(extent);
    // Another user of the storage than the source's own tensor means a model holds it.
    // Kept: every page the tensor touches. Dropped: only the pages it fills alone.
    if (t.storage().use_count() > 1)
      kept.emplace_back(page_down(lo, page), page_up(hi, page));
    else if (page_up(lo, page) < page_down(hi, page))
      dropped.emplace_back(page_up(lo, page), page_down(hi, page));
  }
  kept = merged(std::move(kept));
  for (const auto& r : subtract(merged(std::move(dropped)), kept)) {
    // Failure only leaves the pages where they were: memory, not correctness.
    if (::madvise(reinterpret_cast<void*>(r.first), r.second - r.first, MADV_DONTNEED) == 0)
      out.released_bytes += int64_t(r.second - r.first);
  }
  for (const auto& r : kept) out.resident_bytes += populate(r, page);
  return out;
}

}  // namespace latent
