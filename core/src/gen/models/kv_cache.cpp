// The key/value cache of a causal stream: whole frames, a sink in front, the most recent frames after it.
#include <torch/torch.h>

#include <algorithm>

#include "gen/models/causal_model.h"

namespace latent {

namespace {

// Slots [0, a) and [b, size) of one layer's tensor, `rows` tokens per slot.
torch::Tensor without(const torch::Tensor& t, int64_t a, int64_t b, int64_t slots) {
  if (!t.defined()) return t;
  const int64_t rows = t.size(1) / slots;
  return torch::cat({t.narrow(1, 0, a * rows), t.narrow(1, b * rows, (slots - b) * rows)}, 1);
}

}  // namespace

void KvCache::make_room(int64_t incoming) {
  const int64_t slots = size();
  const int64_t excess = std::min(slots + incoming - window, slots - sink);
  if (excess <= 0) return;
  // Copies, never views: a view of the old tensor would keep all of it alive.
  for (size_t l = 0; l < k.size(); ++l) {
    k[l] = without(k[l], sink, sink + excess, slots);
    v[l] = without(v[l], sink, sink + excess, slots);
  }
  frames.erase(frames.begin() + sink, frames.begin() + sink + excess);
}

void KvCache::truncate(int64_t n) {
  const int64_t slots = size();
  if (n >= slots) return;
  for (size_t l = 0; l < k.size(); ++l) {
    k[l] = n == 0 || !k[l].defined() ? torch::Tensor() : k[l].narrow(1, 0, n * (k[l].size(1) / slots)).clone();
    v[l] = n == 0 || !v[l].defined() ? torch::Tensor() : v[l].narrow(1, 0, n * (v[l].size(1) / slots)).clone();
  }
  frames.resize(size_t(n));
}

size_t KvCache::bytes() const {
  size_t b = 0;
  for (const auto* side : {&k, &v})
    for (const torch::Tensor& t : *side)
      if (t.defined()) b += t.nbytes();
  return b;
}

const CausalModel* causal_model(const Denoiser& model) { return dynamic_cast<const CausalModel*>(&model); }

}  // namespace latent
