// The key/value cache of a causal stream: whole frames, a sink in front, the most recent frames after it.
#include <torch/types.h>

#include <algorithm>
#include <stdexcept>
#include <string>

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

namespace {

// The KvCache rule: a call sees the first `keep` frames and its own, and the cache keeps exactly those.
class KeepThenAppend final : public KvStore {
 public:
  KeepThenAppend(KvCache& cache, int64_t keep) : cache_(cache), keep_(keep) {}
  std::pair<torch::Tensor, torch::Tensor> attend(size_t layer, const torch::Tensor& k, const torch::Tensor& v,
                                                 int64_t tokens_per_frame) override {
    torch::Tensor ks = k, vs = v;
    if (keep_ > 0) {
      const torch::Tensor& ck = cache_.k[layer];
      if (!ck.defined() || ck.size(1) != cache_.size() * tokens_per_frame)
        throw std::invalid_argument("causal call: the cache holds frames of another size");
      const int64_t rows = keep_ * tokens_per_frame;
      ks = torch::cat({ck.narrow(1, 0, rows), k}, 1);
      vs = torch::cat({cache_.v[layer].narrow(1, 0, rows), v}, 1);
    }
    cache_.k[layer] = ks;
    cache_.v[layer] = vs;
    return {ks, vs};
  }

 private:
  KvCache& cache_;
  int64_t keep_;
};

}  // namespace

torch::Tensor CausalModel::predict_cached(const torch::Tensor& x, const torch::Tensor& timesteps,
                                          const torch::Tensor& text, KvCache& cache, int64_t first_frame,
                                          int64_t keep) const {
  if (keep < 0 || keep > cache.size() || first_frame < 0)
    throw std::invalid_argument("causal call: keeps " + std::to_string(keep) + " of " + std::to_string(cache.size()) +
                                " cached frames from frame " + std::to_string(first_frame));
  if (cache.k.size() != size_t(layers())) {
    cache.k.assign(size_t(layers()), torch::Tensor());
    cache.v.assign(size_t(layers()), torch::Tensor());
  }
  KeepThenAppend store(cache, keep);
  torch::Tensor out = predict_stored(x, timesteps, text, first_frame, store);
  cache.frames.resize(size_t(keep));
  for (int64_t f = 0; f < x.size(2); ++f) cache.frames.push_back(first_frame + f);
  return out;
}

const CausalModel* causal_model(const Denoiser& model) { return dynamic_cast<const CausalModel*>(&model); }

}  // namespace latent
