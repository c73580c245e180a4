// StreamDiffusionV2's cache rules (models/wan/causal_model.py, CausalWanSelfAttention.forward), in frames.
#include "gen/models/sink_ring_cache.h"

#include <torch/types.h>

#include <stdexcept>
#include <string>

namespace latent {

SinkRingCache::SinkRingCache(int64_t layers, int64_t window, int64_t sink, double threshold)
    : layers_(size_t(layers)), window_(window), sink_(sink), threshold_(float(threshold)) {
  if (window < 1 || sink < 0 || sink >= window)
    throw std::invalid_argument("key/value cache: " + std::to_string(sink) + " sink frames in a window of " +
                                std::to_string(window) + " leave no room for a frame");
}

void SinkRingCache::begin_call(int64_t first_frame, int64_t frames) {
  first_ = first_frame;
  frames_ = frames;
}

std::pair<torch::Tensor, torch::Tensor> SinkRingCache::attend(size_t layer, const torch::Tensor& k,
                                                              const torch::Tensor& v, int64_t tokens_per_frame) {
  Layer& l = layers_.at(layer);
  const int64_t n = frames_, a = first_, e = a + n, tpf = tokens_per_frame;
  if (k.size(1) != n * tpf) throw std::invalid_argument("key/value cache: a call of another frame count");
  if (n > window_ - sink_)
    throw std::invalid_argument("key/value cache: " + std::to_string(n) + " frames do not fit a window of " +
                                std::to_string(window_) + " with " + std::to_string(sink_) + " sink frames");
  if (!l.k.defined()) {
    l.k = torch::zeros({1, window_ * tpf, k.size(2), k.size(3)}, k.options());
    l.v = torch::zeros({1, window_ * tpf, v.size(2), v.size(3)}, v.options());
  } else if (l.k.size(1) != window_ * tpf || l.k.size(2) != k.size(2) || l.k.size(3) != k.size(3)) {
    throw std::invalid_argument("key/value cache: the cache holds frames of another size");
  }
  // The adaptive sink: per-frame means of the sink slots (as they are before this write) against the new frame's.
  if (sink_ > 0 && threshold_ > -1 && n == 1) {
    const auto mean_of = [&](const torch::Tensor& t, int64_t frames) { return t.reshape({frames, tpf, -1}).mean(1); };
    const torch::Tensor ks = mean_of(l.k.narrow(1, 0, sink_ * tpf), sink_),
                        vs = mean_of(l.v.narrow(1, 0, sink_ * tpf), sink_);
    const torch::Tensor sim =
        (torch::cosine_similarity(ks, mean_of(k, 1), -1) + torch::cosine_similarity(vs, mean_of(v, 1), -1)) / 2;
    if (sim.min().item<float>() < threshold_) l.evict.push_front(sim.argmin().item<int64_t>() + 1);
  }
  int64_t end;  // the slot after the call's frames
  if (e > window_ || l.local_end >= window_) {
    if (l.evict.empty()) throw std::logic_error("key/value cache: full with no slot to evict");
    end = l.evict.front();
    l.evict.pop_front();
    if (end > sink_) l.evict.push_back(end);
    l.local_end = window_;
  } else {
    end = l.local_end + e - l.global_end;
    l.local_end = end;
    const int64_t rolling = e + n;
    if (rolling > sink_ && rolling <= window_ && (l.evict.empty() || l.evict.back() != rolling))
      l.evict.push_back(rolling);
  }
  l.k.narrow(1, (end - n) * tpf, n * tpf).copy_(k);
  l.v.narrow(1, (end - n) * tpf, n * tpf).copy_(v);
  l.global_end = e;
  const int64_t seen = l.local_end * tpf;
  return {l.k.narrow(1, 0, seen), l.v.narrow(1, 0, seen)};
}

SinkRingCache SinkRingCache::copy() const {
  SinkRingCache c = *this;
  for (Layer& l : c.layers_) {
    if (l.k.defined()) l.k = l.k.clone();
    if (l.v.defined()) l.v = l.v.clone();
  }
  return c;
}

size_t SinkRingCache::bytes() const {
  size_t b = 0;
  for (const Layer& l : layers_)
    if (l.k.defined()) b += l.k.nbytes() + l.v.nbytes();
  return b;
}

}  // namespace latent
