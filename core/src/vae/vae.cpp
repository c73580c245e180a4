#include "latent/vae/vae.h"

#include <stdexcept>

#include "memory/heap.h"
#include "memory/residency.h"
#include "vae/families.h"

namespace latent {
namespace {

const char* role_name(VaeState::Role role) { return role == VaeState::Role::encoder ? "encoder" : "decoder"; }

}  // namespace

std::unique_ptr<VaeState> Vae::stamped(std::unique_ptr<VaeState> state, VaeState::Role role) const {
  state->role_ = role;
  state->model_ = this;
  return state;
}

std::unique_ptr<VaeState> Vae::new_encoder_state() const {
  return stamped(make_encoder_state(), VaeState::Role::encoder);
}

std::unique_ptr<VaeState> Vae::new_decoder_state() const {
  return stamped(make_decoder_state(), VaeState::Role::decoder);
}

void Vae::check_call(const VaeState& state, VaeState::Role role, const torch::Tensor& input, int64_t channels,
                     const char* call) const {
  if (state.model() != this) {
    throw std::invalid_argument(std::string(call) + ": the state was made by another model (" + spec_.family +
                                " states come from this model's new_" + role_name(role) + "_state())");
  }
  if (state.role() != role) {
    const char* given = state.role() == VaeState::Role::encoder ? "an encoder" : "a decoder";
    throw std::invalid_argument(std::string(call) + ": given " + given + "'s state; it needs the " + role_name(role) +
                                "'s (new_" + role_name(role) + "_state())");
  }
  if (!input.defined() || input.dim() != 5 || input.size(1) != channels) {
    throw std::invalid_argument(std::string(call) + ": input must be [B, " + std::to_string(channels) +
                                ", T, H, W]; got " + (input.defined() ? c10::str(input.sizes()) : "no tensor"));
  }
}

torch::Tensor Vae::encode_chunk(VaeState& state, const torch::Tensor& x) const {
  check_call(state, VaeState::Role::encoder, x, spec_.in_channels, "encode_chunk");
  return encode_step(state, x);
}

torch::Tensor Vae::decode_chunk(VaeState& state, const torch::Tensor& z) const {
  check_call(state, VaeState::Role::decoder, z, spec_.latent_channels, "decode_chunk");
  return decode_step(state, z);
}

void Vae::check_frame_size(int64_t width, int64_t height) const {
  const int64_t m = spec_.size_multiple;
  if (width <= 0 || height <= 0 || width % m != 0 || height % m != 0) {
    throw ModelError(spec_.family + " encodes frames whose width and height are positive multiples of " +
                     std::to_string(m) + "; got " + std::to_string(width) + "x" + std::to_string(height) +
                     " (nearest accepted: " + std::to_string(std::max(m, width / m * m)) + "x" +
                     std::to_string(std::max(m, height / m * m)) + ")");
  }
}

std::string model_id_of(const WeightSource& source, const std::string& family) {
  auto it = source.metadata.find("model_id");
  return it != source.metadata.end() && !it->second.empty() ? it->second : family;
}

std::shared_ptr<Vae> load_vae(const WeightSource& source, const LoadOptions& options) {
  WeightSource src = source;  // shares tensor storage; renaming keys must not touch the caller's copy
  std::shared_ptr<Vae> vae = detect_family(src).make(src, options);
  settle_residency(src);
  // A wrong LATENT_CPU_HEAP fails here, where callers expect setting errors, not when a stream starts.
  if (vae->device().is_cpu()) check_cpu_heap_policy();
  return vae;
}

std::shared_ptr<Vae> load_vae(const std::filesystem::path& path, const LoadOptions& options) {
  return load_vae(read_weights(path), options);
}

}  // namespace latent
