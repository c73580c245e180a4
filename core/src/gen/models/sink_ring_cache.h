// StreamDiffusionV2's key/value cache of one stream: `window` frame slots, the first `sink` an attention sink. New
// frames fill the slots in order; once full, each is written over the slot at the head of a ring of eviction
// targets, and a frame whose keys and values are unlike every sink frame pushes the least alike sink slot to the
// head of the ring (the adaptive sink). The ring keeps its reference's quirks, which its outputs depend on: an
// unwritten sink slot counts as unlike (cosine 0), a refreshed sink slot leaves the ring after one write, and the
// list is never reset.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <deque>
#include <vector>

#include "gen/models/causal_model.h"

namespace latent {

class SinkRingCache final : public KvStore {
 public:
  SinkRingCache(int64_t layers, int64_t window, int64_t sink, double threshold);
  // Before each call: its first absolute frame and frame count.
  void begin_call(int64_t first_frame, int64_t frames);
  std::pair<torch::Tensor, torch::Tensor> attend(size_t layer, const torch::Tensor& k, const torch::Tensor& v,
                                                 int64_t tokens_per_frame) override;
  // An independent copy (tensors cloned): a second step's cache starts as the first's.
  SinkRingCache copy() const;
  size_t bytes() const;

 private:
  struct Layer {
    torch::Tensor k, v;         // [1, window * tokens, heads, head_dim], zeros until written
    std::deque<int64_t> evict;  // eviction targets: a frame slot's end (slot + 1)
    int64_t global_end = 0;     // the absolute end frame of the last call
    int64_t local_end = 0;      // the slots in use after the last call
  };
  std::vector<Layer> layers_;
  int64_t window_, sink_;
  float threshold_;
  int64_t first_ = 0, frames_ = 0;
};

}  // namespace latent
