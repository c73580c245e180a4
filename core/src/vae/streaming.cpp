#include "latent/vae/streaming.h"

#include <c10/core/DeviceGuard.h>
#include <c10/core/InferenceMode.h>
#include <torch/types.h>

#include <stdexcept>

#include "latent/parallel/row_shard.h"
#include "latent/runtime/devices.h"
#include "memory/heap.h"

namespace latent {
namespace {

using torch::Tensor;

// Latent g stands for source frames starting here: latent 0 for frame 0 alone, later ones for tf frames each.
int64_t first_frame_of(int64_t g, int64_t tf) { return g == 0 ? 0 : tf * (g - 1) + 1; }
int64_t span_of(int64_t g, int64_t tf) { return g == 0 ? 1 : tf; }

Tensor cat_time(std::vector<Tensor>& pieces, int64_t n, int64_t* count) {
  Tensor all = pieces.size() == 1 ? pieces[0] : torch::cat(pieces, 2);
  pieces.clear();
  Tensor head = all.slice(2, 0, n);
  if (all.size(2) > n) pieces.push_back(all.slice(2, n).clone());  // the rest must not pin `all`
  *count -= n;
  return head;
}

Tensor repeat_last_frame(const Tensor& x, int64_t target) {
  if (x.size(2) >= target) return x;
  Tensor last = x.slice(2, x.size(2) - 1);
  return torch::cat({x, last.expand({-1, -1, target - x.size(2), -1, -1})}, 2);
}

void append(EncodedLatents& out, EncodedLatents&& more) {
  if (!more.latents.defined()) return;
  out.latents = out.latents.defined() ? torch::cat({out.latents, more.latents}, 0) : more.latents;
  out.first_frame.insert(out.first_frame.end(), more.first_frame.begin(), more.first_frame.end());
  out.real_frames.insert(out.real_frames.end(), more.real_frames.begin(), more.real_frames.end());
}

Tensor append_frames(const Tensor& a, const Tensor& b) {
  if (!a.defined()) return b;
  if (!b.defined()) return a;
  return torch::cat({a, b}, 0);
}

// Per-channel broadcast of a [C] tensor over [B, C, T, H, W].
Tensor per_channel(const Tensor& v, const Tensor& like) {
  return v.to(like.device(), like.scalar_type()).reshape({1, -1, 1, 1, 1});
}

// A rank's share of a frame's latent rows (patch parallel).
parallel::Band own_rows(const parallel::RowShard& shard, int64_t rows) {
  return parallel::split_rows(rows, shard.world())[size_t(shard.rank())];
}

}  // namespace

int64_t first_chunk_band_rows(const Vae& vae, VaeState::Role role, BandOptions bands, bool sharded, int64_t rows,
                              int64_t cols, int64_t frames) {
  if (bands.height > 0) return -1;
  // Automatic: 90% of a GPU's free memory. Not for a patch-parallel stream, which cuts its crops before the first
  // chunk and so needs its choice made up front.
  if (bands.max_bytes == 0 && bands.automatic && !sharded && vae.exact_bands() && !vae.device().is_cpu())
    bands.max_bytes = available_memory(vae.device()) / 10 * 9;
  if (bands.max_bytes == 0) return -1;
  const int64_t r = budget_band_rows(vae, role, bands, rows, cols, frames);
  // A rank was given the crop its bands read, so it computes one band where whole frames would fit.
  return r == 0 && sharded ? rows : r;
}

int64_t band_latent_rows(const Vae& vae, const BandOptions& bands) {
  if (!bands.enabled()) return 0;
  const int64_t sf = vae.spec().spatial_factor;
  if (!vae.exact_bands()) {
    throw std::invalid_argument(vae.spec().family +
                                " cannot be computed in exact bands (its norms see the whole frame); use tiles "
                                "(tile-size) instead, or leave the band height at 0");
  }
  if (bands.height % sf != 0) {
    throw std::invalid_argument("band height must be a multiple of " + std::to_string(sf) + " pixels for " +
                                vae.spec().family + "; got " + std::to_string(bands.height));
  }
  return bands.height / sf;
}

int64_t budget_band_rows(const Vae& vae, VaeState::Role role, const BandOptions& bands, int64_t rows, int64_t cols,
                         int64_t frames) {
  auto bytes = [&](int64_t r) { return vae.band_chunk_bytes(role, r, rows, cols, frames); };
  if (bands.max_bytes == 0 || bytes(rows) <= bands.max_bytes) return 0;
  // Not monotonic: thinner bands hold fewer activations, but bands at all add copies of a crop's caches. The
  // tallest bands that fit recompute the fewest rows.
  size_t least = bytes(rows);
  int64_t least_rows = rows;
  for (int64_t r = rows - 1; r >= 1; --r) {
    const size_t b = bytes(r);
    if (b <= bands.max_bytes) return r;
    if (b < least) least = b, least_rows = r;
  }
  if (bands.automatic) return least_rows == rows ? 0 : least_rows;
  auto mib = [](size_t b) { return std::to_string((b + (1 << 20) - 1) >> 20); };
  const int64_t sf = vae.spec().spatial_factor;
  throw std::invalid_argument("a memory budget of " + mib(bands.max_bytes) + " MiB is below the least estimate, " +
                              mib(least) + " MiB (bands of " + std::to_string(least_rows * sf) + " px), for " +
                              std::to_string(cols * sf) + "x" + std::to_string(rows * sf) + " frames; raise it");
}

// ---- encoder ------------------------------------------------------------------------------------------------

StreamingEncoder::StreamingEncoder(std::shared_ptr<const Vae> vae, EncoderOptions options)
    : vae_(std::move(vae)), options_(options) {
  if (!vae_) throw std::invalid_argument("StreamingEncoder needs a model");
  reset();
}

StreamingEncoder::StreamingEncoder(std::shared_ptr<const Vae> vae, EncoderOptions options,
                                   std::shared_ptr<ActivationHeap> heap)
    : vae_(std::move(vae)), options_(options), heap_(std::move(heap)), shared_heap_(true) {
  if (!vae_) throw std::invalid_argument("StreamingEncoder needs a model");
  reset();
}

StreamingEncoder::~StreamingEncoder() = default;

void StreamingEncoder::reset() {
  state_ = vae_->new_encoder_state();
  state_->set_shard(options_.shard);
  state_->set_band_rows(band_latent_rows(*vae_, options_.bands));
  pending_.clear();
  // After the caches that live in it: the old heap's mappings go back to the system at once.
  if (!shared_heap_) heap_ = ActivationHeap::for_device(vae_->device());
  pending_count_ = frames_in_ = frames_coded_ = latents_out_ = 0;
  last_frame_ = Tensor();
  width_ = height_ = 0;
  band_first_ = band_rows_ = 0;
  generator_ = at::make_generator<at::CPUGeneratorImpl>(options_.seed);
}

size_t StreamingEncoder::heap_bytes() const { return heap_ ? heap_->stats().touched : 0; }

int64_t StreamingEncoder::max_delay_frames() const {
  const ChunkRule& r = vae_->spec().encode_chunks;
  return std::max<int64_t>(r.first, r.step) - 1;
}

size_t StreamingEncoder::state_bytes() const {
  size_t n = state_->bytes();
  for (const auto& p : pending_) n += p.nbytes();
  return n;
}

Tensor StreamingEncoder::to_model_input(const Tensor& frames) {
  if (frames.dim() != 4) {
    throw std::invalid_argument("frames must be uint8 [T, H, W, 3] or float [T, 3, H, W]; got " +
                                std::to_string(frames.dim()) + " dimensions");
  }
  const bool rgb8 = frames.scalar_type() == torch::kByte;
  const int64_t channels = rgb8 ? frames.size(3) : frames.size(1);
  if (channels != vae_->spec().in_channels) {
    throw std::invalid_argument("frames have " + std::to_string(channels) + " channels, the model takes " +
                                std::to_string(vae_->spec().in_channels) +
                                (rgb8 ? " (uint8 frames are [T, H, W, 3])" : " (float frames are [T, 3, H, W])"));
  }
  if (!rgb8 && !at::isFloatingType(frames.scalar_type()))
    throw std::invalid_argument("frames must be uint8 or floating point");
  const int64_t h = rgb8 ? frames.size(1) : frames.size(2), w = rgb8 ? frames.size(2) : frames.size(3);
  if (width_ == 0) {
    vae_->check_frame_size(w, h);
    width_ = w;
    height_ = h;
    if (options_.shard) {
      const parallel::Band band = own_rows(*options_.shard, h / vae_->spec().spatial_factor);
      band_first_ = band.first;
      band_rows_ = band.count;
    }
  } else if (w != width_ || h != height_) {
    throw std::invalid_argument("frame size changed from " + std::to_string(width_) + "x" + std::to_string(height_) +
                                " to " + std::to_string(w) + "x" + std::to_string(h) +
                                " within a clip; finish() or reset() first");
  }
  Tensor x = frames;
  if (options_.shard) {  // this rank's band, cut before it travels to the device
    const int64_t sf = vae_->spec().spatial_factor;
    int64_t first = band_first_ * sf, rows = band_rows_ * sf;
    if (options_.bands.enabled()) {
      // Its bands recompute the rows their convolutions read (a crop aligned to the downsamplers' phase).
      const int64_t halo = (vae_->band_halo(VaeState::Role::encoder) + sf - 1) / sf * sf;
      const int64_t last = std::min(height_, first + rows + halo);
      first = std::max<int64_t>(0, first - halo);
      rows = last - first;
      state_->set_input_rows(first, height_);
    }
    x = x.narrow(rgb8 ? 1 : 2, first, rows);
  }
  x = x.to(vae_->device());
  if (rgb8) {
    // Scale in float32 whatever the compute dtype: 8-bit levels are exact there.
    x = x.permute({3, 0, 1, 2}).to(torch::kFloat).div(127.5).sub(1.0);
  } else {
    x = x.permute({1, 0, 2, 3});
  }
  return x.to(vae_->dtype()).unsqueeze(0).contiguous();
}

int64_t StreamingEncoder::next_chunk_frames() const {
  const ChunkRule& r = vae_->spec().encode_chunks;
  if (frames_coded_ == 0) return pending_count_ >= r.first ? r.first : 0;
  if (pending_count_ < r.step) return 0;
  if (!r.batchable) return r.step;
  const int64_t most = std::max<int64_t>(1, options_.max_chunk_frames / r.step);
  return std::min(pending_count_ / r.step, most) * r.step;
}

Tensor StreamingEncoder::take_pending(int64_t n) { return cat_time(pending_, n, &pending_count_); }

EncodedLatents StreamingEncoder::encode(const Tensor& x, int64_t frames) {
  const VaeSpec& spec = vae_->spec();
  Tensor moments;
  if (frames_coded_ == 0) {
    const int64_t sf = spec.spatial_factor;
    const int64_t r = first_chunk_band_rows(*vae_, VaeState::Role::encoder, options_.bands, options_.shard != nullptr,
                                            options_.shard ? band_rows_ : x.size(3) / sf, x.size(4) / sf,
                                            std::max(options_.max_chunk_frames, spec.encode_chunks.step));
    if (r >= 0) state_->set_band_rows(r);
  }
  {
    ActivationHeap::Scope scope(heap_.get(), vae_->device());
    moments = vae_->encode_chunk(*state_, x);
  }
  frames_coded_ += frames;
  const int64_t c = spec.latent_channels;
  Tensor z = moments.slice(1, 0, c);
  if (options_.sample) {
    Tensor logvar = moments.slice(1, c, 2 * c).to(torch::kFloat).clamp(-30.0, 20.0);
    // Drawn for the whole frame and cut to the band, so every rank count gives the same sample.
    auto whole = z.sizes().vec();
    if (options_.shard) whole[3] = height_ / spec.spatial_factor;
    Tensor noise = torch::randn(whole, generator_, torch::TensorOptions().dtype(torch::kFloat));
    if (options_.shard) noise = noise.narrow(3, band_first_, band_rows_);
    z = (z.to(torch::kFloat) + torch::exp(0.5 * logvar) * noise.to(z.device())).to(z.scalar_type());
  }
  Tensor zf = z.to(torch::kFloat);
  z = ((zf - per_channel(spec.latent_shift, zf)) * per_channel(spec.latent_scale, zf)).to(vae_->dtype());

  EncodedLatents out;
  out.latents = z[0].permute({1, 0, 2, 3}).contiguous();  // [T', C, h, w]
  for (int64_t j = 0; j < out.latents.size(0); ++j) {
    const int64_t g = latents_out_ + j, first = first_frame_of(g, spec.temporal_factor);
    out.first_frame.push_back(first);
    out.real_frames.push_back(std::clamp<int64_t>(frames_in_ - first, 0, span_of(g, spec.temporal_factor)));
  }
  latents_out_ += out.latents.size(0);
  return out;
}

EncodedLatents StreamingEncoder::push(const Tensor& frames) {
  c10::InferenceMode inference;
  c10::DeviceGuard device(vae_->device());
  EncodedLatents out;
  if (frames.dim() == 4 && frames.size(0) == 0) return out;
  Tensor x = to_model_input(frames);
  pending_.push_back(x);
  pending_count_ += x.size(2);
  frames_in_ += x.size(2);
  if (options_.decodable_tail) last_frame_ = x.slice(2, x.size(2) - 1).clone();
  for (int64_t n; (n = next_chunk_frames()) > 0;) append(out, encode(take_pending(n), n));
  return out;
}

EncodedLatents StreamingEncoder::finish() {
  c10::InferenceMode inference;
  c10::DeviceGuard device(vae_->device());
  EncodedLatents out;
  const ChunkRule& r = vae_->spec().encode_chunks;
  const int64_t tf = vae_->spec().temporal_factor;
  // The padded frames the clip's end needs so that its latents decode to every frame (decodable_tail).
  const int64_t decodable = options_.decodable_tail && r.first == r.step && frames_in_ > 0
                                ? tf * (1 + (frames_in_ - 1 + tf - 1) / tf) - frames_coded_
                                : 0;
  if (pending_count_ > 0 || decodable > 0) {
    const int64_t have = pending_count_;
    Tensor rest = have > 0 ? take_pending(have) : last_frame_;
    if (frames_coded_ == 0 && r.first != r.step) {
      // A clip shorter than the first chunk is coded as one chunk of 1 + k*tf frames, as the reference does. (A
      // family whose first chunk is an ordinary step, TAEHV, pads to whole steps below instead.)
      const int64_t n = rest.size(2), target = 1 + (n - 1 + tf - 1) / tf * tf;
      append(out, encode(repeat_last_frame(rest, target), target));
    } else {
      const int64_t target = std::max((have + r.step - 1) / r.step * r.step, decodable);
      pending_.push_back(repeat_last_frame(rest, target));
      pending_count_ = target;
      for (int64_t n; (n = next_chunk_frames()) > 0;) append(out, encode(take_pending(n), n));
    }
  }
  reset();
  return out;
}

// ---- decoder ------------------------------------------------------------------------------------------------

StreamingDecoder::StreamingDecoder(std::shared_ptr<const Vae> vae, DecoderOptions options)
    : vae_(std::move(vae)), options_(options) {
  if (!vae_) throw std::invalid_argument("StreamingDecoder needs a model");
  reset();
}

StreamingDecoder::StreamingDecoder(std::shared_ptr<const Vae> vae, DecoderOptions options,
                                   std::shared_ptr<ActivationHeap> heap)
    : vae_(std::move(vae)), options_(options), heap_(std::move(heap)), shared_heap_(true) {
  if (!vae_) throw std::invalid_argument("StreamingDecoder needs a model");
  reset();
}

StreamingDecoder::~StreamingDecoder() = default;

void StreamingDecoder::reset() {
  state_ = vae_->new_decoder_state();
  state_->set_shard(options_.shard);
  state_->set_band_rows(band_latent_rows(*vae_, options_.bands));
  pending_.clear();
  if (!shared_heap_) heap_ = ActivationHeap::for_device(vae_->device());
  pending_real_.clear();
  latents_in_ = latents_done_ = frames_out_ = 0;
}

size_t StreamingDecoder::heap_bytes() const { return heap_ ? heap_->stats().touched : 0; }

size_t StreamingDecoder::state_bytes() const {
  size_t n = state_->bytes();
  for (const auto& p : pending_) n += p.nbytes();
  return n;
}

Tensor StreamingDecoder::decode(int64_t n) {
  const int64_t tf = vae_->spec().temporal_factor;
  int64_t count = int64_t(pending_real_.size());
  Tensor z = cat_time(pending_, n, &count);
  std::vector<int64_t> real(pending_real_.begin(), pending_real_.begin() + n);
  pending_real_.erase(pending_real_.begin(), pending_real_.begin() + n);

  if (latents_done_ == 0) {
    // A rank holds whole latents only with bands (push()); otherwise z is its rows already.
    const bool whole = options_.shard && options_.bands.enabled();
    const int64_t rows = whole ? own_rows(*options_.shard, z.size(3)).count : z.size(3);
    const int64_t r = first_chunk_band_rows(*vae_, VaeState::Role::decoder, options_.bands, options_.shard != nullptr,
                                            rows, z.size(4), std::max<int64_t>(options_.max_chunk_latents, 1));
    if (r >= 0) state_->set_band_rows(r);
  }
  Tensor frames;  // [3, F, H, W]; what is handed out is copied from it, outside the heap
  {
    ActivationHeap::Scope scope(heap_.get(), vae_->device());
    frames = vae_->decode_chunk(*state_, z)[0];
  }
  const int64_t f = frames.size(1);
  // Which output frames belong to which latent: a chunk that starts the clip expands its first latent to one
  // frame; otherwise every latent gives tf frames (CogVideoX's even first chunks included).
  std::vector<int64_t> spans(size_t(n), tf);
  if (f == 1 + tf * (n - 1)) {
    spans[0] = 1;
  } else if (f != tf * n) {
    throw std::runtime_error("decoder produced " + std::to_string(f) + " frames for " + std::to_string(n) + " latents");
  }
  std::vector<int64_t> keep;
  int64_t start = 0;
  for (int64_t j = 0; j < n; ++j) {
    for (int64_t k = 0; k < std::min(spans[size_t(j)], real[size_t(j)]); ++k) keep.push_back(start + k);
    start += spans[size_t(j)];
  }
  latents_done_ += n;
  if (int64_t(keep.size()) != f) {
    frames =
        frames.index_select(1, torch::tensor(keep, torch::TensorOptions().dtype(torch::kLong)).to(frames.device()));
  }
  frames_out_ += frames.size(1);
  return frames.permute({1, 0, 2, 3}).contiguous();
}

Tensor StreamingDecoder::push(const Tensor& latents, const std::vector<int64_t>& real_frames) {
  c10::InferenceMode inference;
  c10::DeviceGuard device(vae_->device());
  const VaeSpec& spec = vae_->spec();
  if (!latents.defined()) return {};
  if (latents.dim() != 4 || latents.size(1) != spec.latent_channels) {
    throw std::invalid_argument("latents must be [T', " + std::to_string(spec.latent_channels) + ", h, w]; got " +
                                c10::str(latents.sizes()));
  }
  const int64_t t = latents.size(0);
  if (!real_frames.empty() && int64_t(real_frames.size()) != t)
    throw std::invalid_argument("real_frames needs one entry per latent");
  if (t == 0) return {};
  Tensor band = latents;
  if (options_.shard && options_.bands.enabled()) {
    // Latents are small: every rank takes them whole and its bands crop the rows they read.
    state_->set_input_rows(0, latents.size(2));
  } else if (options_.shard) {
    const parallel::Band mine = own_rows(*options_.shard, latents.size(2));
    band = latents.narrow(2, mine.first, mine.count);
  }
  Tensor z = band.to(vae_->device(), torch::kFloat).permute({1, 0, 2, 3}).unsqueeze(0);
  z = (z / per_channel(spec.latent_scale, z) + per_channel(spec.latent_shift, z)).to(vae_->dtype());
  pending_.push_back(z.contiguous());
  for (int64_t j = 0; j < t; ++j) {
    const int64_t span = span_of(latents_in_ + j, spec.temporal_factor);
    pending_real_.push_back(real_frames.empty() ? span : std::clamp<int64_t>(real_frames[size_t(j)], 0, span));
  }
  latents_in_ += t;

  const ChunkRule& r = spec.decode_chunks;
  Tensor out;
  for (;;) {
    const int64_t have = int64_t(pending_real_.size());
    int64_t n = 0;
    if (latents_done_ == 0) {
      n = have >= r.first ? r.first : 0;
    } else if (have >= r.step) {
      n = r.batchable ? std::min(have / r.step, std::max<int64_t>(1, options_.max_chunk_latents / r.step)) * r.step
                      : r.step;
    }
    if (n == 0) break;
    out = append_frames(out, decode(n));
  }
  return out;
}

Tensor StreamingDecoder::finish() {
  c10::InferenceMode inference;
  c10::DeviceGuard device(vae_->device());
  Tensor out;
  // What remains is shorter than a chunk: decoded as one, the way the reference treats a short clip.
  if (!pending_real_.empty()) out = decode(int64_t(pending_real_.size()));
  reset();
  return out;
}

Tensor frames_to_rgb8(const Tensor& frames) {
  return frames.to(torch::kFloat)
      .clamp(-1, 1)
      .add(1)
      .mul(127.5)
      .round()
      .to(torch::kByte)
      .permute({0, 2, 3, 1})
      .cpu()
      .contiguous();
}

}  // namespace latent
