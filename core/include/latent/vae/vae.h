// A loaded causal video VAE: immutable weights plus the per-chunk encode/decode steps. Per-stream state (the
// carried temporal caches) lives in VaeState objects, so one loaded model serves many streams at once.
#pragma once

#include <torch/types.h>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "latent/io/weights.h"

namespace latent {

namespace parallel {
class RowShard;
}

class Vae;

// The carried caches of one stream through one encoder or decoder. A state knows which model made it and for which
// direction: handing it to the other direction or another model is an error, not a read past its slots.
class VaeState {
 public:
  enum class Role { encoder, decoder };
  virtual ~VaeState() = default;
  // Bytes of every tensor the state keeps (what bounded memory is about).
  virtual size_t bytes() const = 0;
  Role role() const { return role_; }
  const Vae* model() const { return model_; }
  // Patch parallel: the state then holds one band of rows (latent/parallel/row_shard.h), and the chunks given to
  // encode_chunk/decode_chunk are that band of the frames. Null for whole frames.
  void set_shard(std::shared_ptr<const parallel::RowShard> shard) { shard_ = std::move(shard); }
  const parallel::RowShard* shard() const { return shard_.get(); }
  // Spatial bands (Vae::exact_bands()): each chunk is computed depth-first in bands of this many latent rows,
  // each band from a crop of its input wide enough for every row it keeps, the caches kept once for the frame; the
  // result is the whole frame's. 0 (the default) computes whole frames.
  void set_band_rows(int64_t latent_rows) { band_rows_ = latent_rows; }
  int64_t band_rows() const { return band_rows_; }
  // Bands with a shard: each rank computes the bands of its own rows from a crop of the frames that holds them
  // and the rows they read (recomputed there, not exchanged): the chunks hold rows [first, first + their rows)
  // of frames `frame` rows tall, at the input's resolution.
  void set_input_rows(int64_t first, int64_t frame) {
    input_first_ = first;
    input_frame_ = frame;
  }
  int64_t input_first() const { return input_first_; }
  int64_t input_frame() const { return input_frame_; }

 private:
  friend class Vae;
  Role role_ = Role::encoder;
  const Vae* model_ = nullptr;
  std::shared_ptr<const parallel::RowShard> shard_;
  int64_t band_rows_ = 0;
  int64_t input_first_ = 0, input_frame_ = 0;
};

// How a family cuts time into chunks. The first chunk holds `first` frames (latents when decoding); every
// later chunk a multiple of `step`. Where `batchable` is false each later chunk is exactly `step` (the result
// depends on the cut, as with CogVideoX's GroupNorm); otherwise several steps may be run together.
struct ChunkRule {
  int64_t first = 1;
  int64_t step = 1;
  bool batchable = true;
};

struct VaeSpec {
  std::string family;    // "wan2.1", "cogvideox"
  std::string model_id;  // what the latent caps call the model, e.g. "wan2.1"
  int64_t in_channels = 3;
  int64_t latent_channels = 16;
  int64_t temporal_factor = 4;
  int64_t spatial_factor = 8;
  // Width and height must be multiples of this.
  int64_t size_multiple = 8;
  ChunkRule encode_chunks;
  ChunkRule decode_chunks;
  // Diffusion space: z = (mean_vae - shift) * scale, per channel ([C] tensors on the CPU, float32).
  torch::Tensor latent_shift;
  torch::Tensor latent_scale;
  bool clamp_output = false;
};

struct LoadOptions {
  torch::Device device = torch::kCPU;
  torch::ScalarType dtype = torch::kFloat;
};

class Vae {
 public:
  virtual ~Vae() = default;
  const VaeSpec& spec() const { return spec_; }
  torch::Device device() const { return options_.device; }
  torch::ScalarType dtype() const { return options_.dtype; }

  std::unique_ptr<VaeState> new_encoder_state() const;
  std::unique_ptr<VaeState> new_decoder_state() const;
  // x: [B, in_channels, T, H, W] in [-1, 1], on the device in the compute dtype. Returns the posterior moments
  // [B, 2 * latent_channels, T', H/8, W/8] (mean then logvar) in VAE space. Throws std::invalid_argument for a
  // state made for decoding or by another model, or an input of the wrong rank or channels.
  torch::Tensor encode_chunk(VaeState& state, const torch::Tensor& x) const;
  // z: [B, latent_channels, T', h, w] in VAE space. Returns frames [B, out_channels, T, 8h, 8w]. Checks as
  // encode_chunk does.
  torch::Tensor decode_chunk(VaeState& state, const torch::Tensor& z) const;

  // Throws ModelError with the accepted sizes when width or height cannot be encoded.
  void check_frame_size(int64_t width, int64_t height) const;

  // Whether VaeState::set_band_rows() computes the same result as whole frames (the Wan family, whose only
  // layer that sees the whole frame is the latent-resolution attention); families without it ignore bands.
  virtual bool exact_bands() const { return false; }
  // Rows of context a band needs beyond its own on each side, in the input of the stages that run in bands
  // (pixels when encoding, latent rows when decoding); 0 where exact_bands() is false. For documentation
  // and memory estimates.
  virtual int64_t band_halo(VaeState::Role /*role*/) const { return 0; }
  // Activation bytes one chunk of `frames` (input frames when encoding, latents when decoding) over frames of
  // rows x cols latents is estimated to need when computed in bands of `band_rows` latent rows (all rows: whole
  // frames); for choosing a band height under a memory budget (BandOptions::max_bytes). 0 where
  // exact_bands() is false.
  virtual size_t band_chunk_bytes(VaeState::Role /*role*/, int64_t /*band_rows*/, int64_t /*rows*/, int64_t /*cols*/,
                                  int64_t /*frames*/) const {
    return 0;
  }

 protected:
  Vae(VaeSpec spec, LoadOptions options) : spec_(std::move(spec)), options_(options) {}
  // What a family implements; the public calls have checked the state and the input by then.
  virtual std::unique_ptr<VaeState> make_encoder_state() const = 0;
  virtual std::unique_ptr<VaeState> make_decoder_state() const = 0;
  virtual torch::Tensor encode_step(VaeState& state, const torch::Tensor& x) const = 0;
  virtual torch::Tensor decode_step(VaeState& state, const torch::Tensor& z) const = 0;
  VaeSpec spec_;
  LoadOptions options_;

 private:
  std::unique_ptr<VaeState> stamped(std::unique_ptr<VaeState> state, VaeState::Role role) const;
  void check_call(const VaeState& state, VaeState::Role role, const torch::Tensor& input, int64_t channels,
                  const char* call) const;
};

// What the latent caps call a model: the family, unless the weights file names its own latent space in
// __metadata__ "model_id" (a model of a family's architecture trained apart, whose latents another model of the
// family cannot decode).
std::string model_id_of(const WeightSource& source, const std::string& family);

// The published per-channel mean and standard deviation of a latent space's raw encoder means (the VAE's
// posterior mean before z = (mean_vae - mean) / std makes it diffusion space): "wan2.1" (16 channels) and
// "wan2.2" (48). Code trained on raw means (StreamDiffusionV2) needs them to take this project's latents.
// std::invalid_argument naming the known spaces for another id.
struct LatentStatistics {
  std::vector<double> mean, std;
};
LatentStatistics published_latent_statistics(const std::string& model_id);

// Recognises the family from the config (or, without one, from the tensor names; core/src/vae/families.cpp) and
// builds the model.
std::shared_ptr<Vae> load_vae(const std::filesystem::path& path, const LoadOptions& options = {});
std::shared_ptr<Vae> load_vae(const WeightSource& source, const LoadOptions& options = {});

}  // namespace latent
