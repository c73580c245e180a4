// Where a stream's CPU activations live. A chunk's activations are large blocks freed all at once, and the next
// chunk asks for the same sizes again. Left to glibc, they land wherever its arenas have room: what a chunk
// touches varies by tens of MiB with the heap the previous chunks left, so a long stream's peak creeps up, and
// handing the free pages back after each chunk (malloc_trim) makes the next chunk fault them in again.
//
// An ActivationHeap keeps those blocks for its stream instead: while a Scope is open on a thread, CPU
// allocations of 256 KiB and more made there come from the heap's own mappings (first fit in one reserved
// range, split and coalesced), and go back to it when freed, whichever thread frees them. After the first chunks every
// chunk finds the blocks it needs already mapped and resident, so the stream's memory is flat in the clip length and no
// page is faulted in twice. Smaller allocations, other threads and other devices are left to LibTorch's allocator.
// Mappings go back to the system when the heap is destroyed (at once for those fully free, the rest as their last block
// is freed).
//
// LATENT_CPU_HEAP selects the policy, for comparisons: `stream` (the default, this heap), `trim` (glibc, with
// malloc_trim after every chunk) or `glibc` (glibc as it comes).
#pragma once

#include <torch/types.h>

#include <cstddef>
#include <memory>

namespace latent {

// Throws std::invalid_argument naming the variable when LATENT_CPU_HEAP has an unknown value.
void check_cpu_heap_policy();

class ActivationHeap {
 public:
  struct Impl;

  struct Stats {
    size_t mapped = 0;  // bytes mapped now
    size_t in_use = 0;  // bytes of blocks handed out and not yet freed
    size_t peak_in_use = 0;
    size_t touched = 0;  // bytes of the mappings ever handed out: what the heap keeps resident
    size_t segments = 0;
    size_t allocations = 0;  // blocks handed out since creation
    size_t fresh_maps = 0;   // of which needed a new mapping
  };

  // The heap for a stream on `device`, or none where the device is not the CPU or the policy is not `stream`.
  static std::unique_ptr<ActivationHeap> for_device(const torch::Device& device);
  // Always a heap, whatever the policy (for tests).
  static std::unique_ptr<ActivationHeap> create();
  ~ActivationHeap();
  ActivationHeap(const ActivationHeap&) = delete;
  ActivationHeap& operator=(const ActivationHeap&) = delete;

  Stats stats() const;

  // Routes this thread's large CPU allocations to `heap` (none: to LibTorch's allocator) until destroyed;
  // scopes nest. Without a heap, on the CPU, hands glibc's free pages back on leaving (unless the policy is
  // `glibc`).
  class Scope {
   public:
    Scope(ActivationHeap* heap, const torch::Device& device);
    ~Scope();
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    Impl* previous_;
    bool trim_;
  };

 private:
  ActivationHeap();
  Impl* impl_;  // deleted by whoever lets go last: this owner or the last block freed
};

}  // namespace latent
