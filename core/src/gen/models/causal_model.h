// Block-causal running of a video transformer over a key/value cache: what causal few-step models (Self-Forcing,
// CausVid, LongLive, Krea Realtime) are. They keep the weights and layers of their bidirectional model; what makes
// them causal is that each call sees only its own frames and the cached keys and values of frames made before.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <utility>
#include <vector>

#include "latent/gen/denoiser.h"

namespace latent {

// The self-attention keys (after RoPE) and values of the latent frames a stream keeps, every layer's, in slot
// order: slots [0, sink) hold the attention sink, which no eviction removes; the slots after it the most recent
// frames. Frames are whole: a model call writes all tokens of its frames.
struct KvCache {
  int64_t window = 0;               // frames it may hold (>= 1)
  int64_t sink = 0;                 // leading slots kept forever (< window)
  std::vector<int64_t> frames;      // the absolute latent frame of each slot
  std::vector<torch::Tensor> k, v;  // per layer: [1, slots * tokens per frame, heads, head_dim]

  int64_t size() const { return int64_t(frames.size()); }
  // Before the first call of a block of `incoming` frames: drops the oldest frames after the sink until the block
  // fits in the window, as Self-Forcing and LongLive evict (the sink and the most recent frames stay).
  void make_room(int64_t incoming);
  // Keeps slots [0, n) only.
  void truncate(int64_t n);
  void clear() { truncate(0); }
  size_t bytes() const;
};

// A model that can run causally. Every call attends to the cache's first `keep` slots and to its own frames (all
// of them, both ways), and leaves the cache holding those `keep` slots followed by its frames: a denoising step
// keeps the frames before its block, the block's later steps overwrite what its first wrote, and a re-cache keeps
// the sink or nothing.
// Where a causal call's keys and values go and what its queries see. Called once per layer, in order, with the
// call's own keys (rotated at their absolute frames) and values, [1, frames * tokens_per_frame, heads, head_dim];
// returns the keys and values the call's queries attend to (its own among them).
class KvStore {
 public:
  virtual ~KvStore() = default;
  virtual std::pair<torch::Tensor, torch::Tensor> attend(size_t layer, const torch::Tensor& k, const torch::Tensor& v,
                                                         int64_t tokens_per_frame) = 0;
};

class CausalModel {
 public:
  virtual ~CausalModel() = default;
  virtual int64_t layers() const = 0;
  // The bytes a KvCache holds for one latent frame of `height` x `width` latents: every layer's keys and values of
  // its tokens in the model's dtype. What a stream's window costs is this times the frames it keeps.
  virtual size_t kv_bytes_per_frame(int64_t height, int64_t width) const = 0;
  // A lower bound on what one call over `frames` latent frames holds while it runs, beside the cache: per token the
  // feed-forward layer's hidden values in the model's dtype and the float32 residual stream. Attention itself is
  // fused (no tokens x tokens scores), so it adds the keys and values the cache already counts.
  virtual size_t call_bytes(int64_t frames, int64_t height, int64_t width) const = 0;
  // x: [1, C, F, h, w], latent frames first_frame .. first_frame + F - 1 (their absolute positions: RoPE is taken
  // there, whatever was evicted); timesteps [1, F] float32, each frame's value passed to the sinusoid in float64;
  // text as Denoiser::predict's. Self-attention goes through `store`. Returns the prediction [1, C, F, h, w]
  // float32. std::invalid_argument for inputs that do not fit (a size the patch does not divide, a store that
  // refuses).
  virtual torch::Tensor predict_stored(const torch::Tensor& x, const torch::Tensor& timesteps,
                                       const torch::Tensor& text, int64_t first_frame, KvStore& store) const = 0;
  // predict_stored over a KvCache: the call attends to the cache's first `keep` frames and its own; the cache then
  // holds those followed by the call's frames. std::invalid_argument where keep > the cache's slots.
  torch::Tensor predict_cached(const torch::Tensor& x, const torch::Tensor& timesteps, const torch::Tensor& text,
                               KvCache& cache, int64_t first_frame, int64_t keep) const;
};

const CausalModel* causal_model(const Denoiser& model);

}  // namespace latent
