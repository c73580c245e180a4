// Streaming encode and decode: frames in, latents out as soon as they are complete, and back. Memory is the
// model's carried caches plus at most one chunk of frames, whatever the length of the clip.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "latent/vae/vae.h"

namespace latent {

class ActivationHeap;
namespace parallel {
class RowShard;
}

// Latent frames with the source frames each one stands for. Latent i covers source frames
// [first_frame[i], first_frame[i] + real_frames[i]); the padded tail of a clip covers fewer than
// temporal_factor real frames, which is how the decoder knows what to trim.
struct EncodedLatents {
  torch::Tensor latents;  // [T', C, h, w] in diffusion space, on the model's device, in its dtype
  std::vector<int64_t> first_frame;
  std::vector<int64_t> real_frames;
  int64_t size() const { return latents.defined() ? latents.size(0) : 0; }
};

// Spatial tiling as diffusers' AutoencoderKLCogVideoX.enable_tiling(): the frame is cut into overlapping tiles of
// height x width pixels, each coded by its own stream (own temporal caches, own GroupNorm statistics), and the
// tiles' outputs are blended linearly over the overlap and stitched. CogVideoX's GroupNorm spans the whole frame,
// so this changes the result exactly as diffusers' tiling does; what it buys is activation memory bounded by a
// tile. Frames no larger than one tile take the untiled path. Honoured by open_encoder() and open_decoder();
// CogVideoX only.
struct TileOptions {
  int64_t height = 0, width = 0;  // tile_sample_min_height/width in pixels; 0 = no tiling
  // Fractions of a tile that neighbours share (tile_overlap_factor_height/width); diffusers' defaults.
  double overlap_height = 1.0 / 6, overlap_width = 1.0 / 5;
  bool enabled() const { return height > 0 || width > 0; }
};

// Exact spatial bands (families with Vae::exact_bands(): Wan 2.1 and 2.2). Each chunk is computed depth-first in
// bands of `height` pixel rows: the layers before the mid-block attention and those after it run band by band,
// each band from its own rows plus the context its convolutions read (recomputed, not exchanged), the temporal
// caches kept once for the frame; only the attention, at latent resolution, sees the whole frame. The result equals
// whole frames' (to float rounding), with activation memory that follows the band, not the frame.
struct BandOptions {
  int64_t height = 0;  // pixel rows per band, a multiple of the model's spatial factor; 0 = whole frames
  // Without a height: the tallest bands whose estimated activations per chunk (Vae::band_chunk_bytes) stay within
  // this many bytes, chosen when the first chunk's size is known (whole frames when they fit). 0 = no bound.
  size_t max_bytes = 0;
  // Neither set, on a GPU, for a family with exact bands and one device: max_bytes becomes 90% of the memory the
  // device has free at the first chunk (runtime/devices.h), and a budget below the least estimate takes the bands
  // of the least estimate instead of failing. Nothing on the CPU, whose memory the whole system shares.
  bool automatic = false;
  bool enabled() const { return height > 0 || max_bytes > 0; }
};

// The band height in latent rows for `vae`; 0 when `bands` sets none. Throws std::invalid_argument for a family
// without exact bands or a height that is not a positive multiple of the spatial factor.
int64_t band_latent_rows(const Vae& vae, const BandOptions& bands);
// The band height in latent rows that `bands.max_bytes` allows for chunks of `frames` (input frames when encoding,
// latents when decoding) over frames of rows x cols latents: 0 (whole frames) when they fit. With
// `bands.automatic`, a budget no bands fit gives the bands of the least estimate; otherwise it throws
// std::invalid_argument naming the least budget when even one-row bands do not fit.
int64_t budget_band_rows(const Vae& vae, VaeState::Role role, const BandOptions& bands, int64_t rows, int64_t cols,
                         int64_t frames);
// What a stream's first chunk sets its band height to (latent rows; -1: leave what `bands.height` set): the
// budget's choice (budget_band_rows, with BandOptions::automatic resolved), and for a rank of a patch-parallel
// stream (`sharded`, `rows` its own) one band where whole frames would fit, since it was given a crop.
int64_t first_chunk_band_rows(const Vae& vae, VaeState::Role role, BandOptions bands, bool sharded, int64_t rows,
                              int64_t cols, int64_t frames);

struct EncoderOptions {
  // Draw z = mean + std * noise instead of the posterior mean; the noise comes from a CPU generator seeded
  // with `seed`, so a sample is the same on every device.
  bool sample = false;
  uint64_t seed = 0;
  // Frames per model call after the first where the family allows batching; bounds activation memory.
  int64_t max_chunk_frames = 8;
  // Patch parallel: this stream is one rank's band of rows. push() still takes whole frames and keeps its band
  // (with `bands`, also the rows its bands' halos read); what comes out is that band of the latents.
  std::shared_ptr<const parallel::RowShard> shard;
  // Spatial tiles (open_encoder() only). Tiled encoding gives the posterior mean; `sample` is refused with it.
  TileOptions tile;
  BandOptions bands;
  // Pad a clip's end so that its latents decode to all of its frames. For a family whose first chunk is a whole
  // step (TAEHV) the reference's ceil(N / 4) latents decode to 4 ceil(N / 4) - 3 frames, fewer than N unless N =
  // 4k + 1; with this the clip ends with one latent more where needed, coding copies of the last frame, so it has
  // the Wan count, 1 + ceil((N - 1) / 4), and a decoder gives N frames back. The latents before it are the
  // reference's. Other families already end so.
  bool decodable_tail = false;
};

// A stream of frames in, latents out: one device (StreamingEncoder) or a patch-parallel group of threads
// (ShardedEncoder, latent/vae/sharded_streaming.h).
class EncoderStream {
 public:
  virtual ~EncoderStream() = default;
  // frames: uint8 [T, H, W, 3] (RGB) or floating [T, 3, H, W] in [-1, 1], any device. T may be 0.
  virtual EncodedLatents push(const torch::Tensor& frames) = 0;
  // Encodes what is pending, padding the tail by repeating the last frame. The clip is over afterwards.
  virtual EncodedLatents finish() = 0;
  // Forgets the clip (caches and pending frames) without encoding anything.
  virtual void reset() = 0;
  virtual int64_t frames_in() const = 0;
  virtual int64_t latents_out() const = 0;
  virtual int64_t pending_frames() const = 0;
  // Frames that must arrive before the next latent can be emitted, at most (for latency reporting).
  virtual int64_t max_delay_frames() const = 0;
  // Bytes of every tensor kept between calls: the carried caches and the pending frames.
  virtual size_t state_bytes() const = 0;
  // Bytes of activation memory the stream keeps resident from chunk to chunk so that no chunk allocates anew
  // (core/src/heap.h); 0 off the CPU or with LATENT_CPU_HEAP other than `stream`. Given back by finish(),
  // reset() and the destructor.
  virtual size_t heap_bytes() const = 0;
  virtual const Vae& vae() const = 0;
};

class StreamingEncoder : public EncoderStream {
 public:
  explicit StreamingEncoder(std::shared_ptr<const Vae> vae, EncoderOptions options = {});
  // Streams that take turns on one thread (the tiles of a tiled stream) can share one heap: each chunk reuses
  // the blocks the previous stream's chunk freed, so they keep one chunk's activations resident, not one each.
  // `heap` may be null (no heap: the policy's fallback); reset() keeps it.
  StreamingEncoder(std::shared_ptr<const Vae> vae, EncoderOptions options, std::shared_ptr<ActivationHeap> heap);
  ~StreamingEncoder() override;

  EncodedLatents push(const torch::Tensor& frames) override;
  EncodedLatents finish() override;
  void reset() override;

  int64_t frames_in() const override { return frames_in_; }
  int64_t latents_out() const override { return latents_out_; }
  int64_t pending_frames() const override { return pending_count_; }
  int64_t max_delay_frames() const override;
  size_t state_bytes() const override;
  size_t heap_bytes() const override;
  const Vae& vae() const override { return *vae_; }

 private:
  torch::Tensor to_model_input(const torch::Tensor& frames);
  EncodedLatents encode(const torch::Tensor& x, int64_t real);
  torch::Tensor take_pending(int64_t n);
  int64_t next_chunk_frames() const;

  std::shared_ptr<const Vae> vae_;
  EncoderOptions options_;
  std::unique_ptr<VaeState> state_;
  std::shared_ptr<ActivationHeap> heap_;  // the model's activations and caches, per clip (core/src/heap.h)
  bool shared_heap_ = false;              // heap_ came from the caller and outlives the clip
  std::vector<torch::Tensor> pending_;    // [1, C, t, H, W] pieces
  int64_t pending_count_ = 0;
  int64_t frames_in_ = 0;     // real frames accepted since reset
  torch::Tensor last_frame_;  // with decodable_tail: the clip's last frame, [1, C, 1, H, W], for its padding
  int64_t frames_coded_ = 0;  // frames (real or padding) sent through the model
  int64_t latents_out_ = 0;
  int64_t width_ = 0, height_ = 0;
  int64_t band_first_ = 0, band_rows_ = 0;  // this rank's latent rows (patch parallel)
  torch::Generator generator_;
};

struct DecoderOptions {
  // Latents per model call after the first where the family allows batching. One keeps the decoder's peak
  // (activations of 4 full-size frames per latent) lowest; more gives larger convolutions, which pays on GPUs.
  int64_t max_chunk_latents = 1;
  // Patch parallel: push() takes whole latents, keeps this rank's band (with `bands`, all of them: its bands crop
  // what they read) and returns that band of the frames.
  std::shared_ptr<const parallel::RowShard> shard;
  // Spatial tiles (open_decoder() only).
  TileOptions tile;
  BandOptions bands;
};

// Latents in, frames out: one device (StreamingDecoder) or a patch-parallel group (ShardedDecoder).
class DecoderStream {
 public:
  virtual ~DecoderStream() = default;
  // latents: [T', C, h, w] in diffusion space, any device and dtype. real_frames (optional, one per latent)
  // says how many frames each latent stands for; frames past that are dropped. Returns the frames that became
  // complete: [T, 3, H, W] in [-1, 1], on the model's device, in its dtype.
  virtual torch::Tensor push(const torch::Tensor& latents, const std::vector<int64_t>& real_frames = {}) = 0;
  virtual torch::Tensor finish() = 0;
  virtual void reset() = 0;
  virtual int64_t latents_in() const = 0;
  virtual int64_t frames_out() const = 0;
  virtual int64_t pending_latents() const = 0;
  virtual size_t state_bytes() const = 0;
  // Bytes of activation memory the stream keeps resident from chunk to chunk so that no chunk allocates anew
  // (core/src/heap.h); 0 off the CPU or with LATENT_CPU_HEAP other than `stream`. Given back by finish(),
  // reset() and the destructor.
  virtual size_t heap_bytes() const = 0;
  virtual const Vae& vae() const = 0;
};

class StreamingDecoder : public DecoderStream {
 public:
  explicit StreamingDecoder(std::shared_ptr<const Vae> vae, DecoderOptions options = {});
  // One heap for several streams, as for StreamingEncoder.
  StreamingDecoder(std::shared_ptr<const Vae> vae, DecoderOptions options, std::shared_ptr<ActivationHeap> heap);
  ~StreamingDecoder() override;

  using DecoderStream::push;
  torch::Tensor push(const torch::Tensor& latents, const std::vector<int64_t>& real_frames = {}) override;
  torch::Tensor finish() override;
  void reset() override;

  int64_t latents_in() const override { return latents_in_; }
  int64_t frames_out() const override { return frames_out_; }
  int64_t pending_latents() const override { return int64_t(pending_real_.size()); }
  size_t state_bytes() const override;
  size_t heap_bytes() const override;
  const Vae& vae() const override { return *vae_; }

 private:
  torch::Tensor decode(int64_t n);

  std::shared_ptr<const Vae> vae_;
  DecoderOptions options_;
  std::unique_ptr<VaeState> state_;
  std::shared_ptr<ActivationHeap> heap_;
  bool shared_heap_ = false;
  std::vector<torch::Tensor> pending_;  // [1, C, t, h, w] pieces in VAE space
  std::vector<int64_t> pending_real_;
  int64_t latents_in_ = 0;
  int64_t latents_done_ = 0;
  int64_t frames_out_ = 0;
};

// [T, 3, H, W] in [-1, 1] -> uint8 [T, H, W, 3] on the CPU.
torch::Tensor frames_to_rgb8(const torch::Tensor& frames);

}  // namespace latent
