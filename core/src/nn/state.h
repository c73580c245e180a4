// What a stream carries through a model from chunk to chunk: one slot per stateful layer, numbered when the model
// is built, so the model's weights stay immutable and shared.
#pragma once

#include <torch/types.h>

#include <cstddef>
#include <vector>

namespace latent::parallel {
class RowShard;
}

namespace latent::layers {

using torch::Tensor;

// Takes what a layer carries in place of its slot: spatial bands keep their caches once for the frame
// (vae/band_caches.h). `origin` is the first row of `frames` in the frame.
struct CarrySink {
  virtual ~CarrySink() = default;
  virtual void carry(int slot, const Tensor& frames, int64_t origin) = 0;
};

// Per-stream carried tensors, one slot per stateful layer.
struct StateSlots {
  std::vector<Tensor> tensors;
  std::vector<bool> started;  // for layers whose first chunk differs (Wan's temporal resamplers)
  // Set when the stream holds one band of rows of a patch-parallel group: layers that look across rows (convs,
  // group norms, attention) then fetch what they need from the other ranks.
  const parallel::RowShard* shard = nullptr;
  // Spatial bands: carry() hands the carried frames to `sink` with their first row in the frame, from where the
  // rows the layers see now sit (their first row at width `band_width`; a cache at half the width, a
  // downsampler's, starts at half the row: band edges are aligned to its phase). The slot itself keeps nothing.
  CarrySink* sink = nullptr;
  int64_t band_first = 0, band_width = 0;
  explicit StateSlots(size_t n = 0) : tensors(n), started(n, false) {}
  size_t bytes() const;
  void at_rows(int64_t first, int64_t width) {
    band_first = first;
    band_width = width;
  }
  // Makes slot i hold a copy of `frames` (never a view: it would pin the whole chunk), or hands it to `sink`. From the
  // second chunk on the copy goes into the slot's own buffer: a cache that stays where it is leaves the stream's heap
  // (memory/heap.h) the same shape chunk after chunk, where a fresh copy would land somewhere new every time.
  void carry(int i, const Tensor& frames);
};

// Hands out slot indices in construction order.
struct SlotAllocator {
  int next = 0;
  int take() { return next++; }
};

}  // namespace latent::layers
