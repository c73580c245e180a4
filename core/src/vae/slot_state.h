// The per-stream state of a family whose layers carry their tensors in numbered slots (nn/state.h).
#pragma once

#include <array>

#include "latent/vae/vae.h"
#include "nn/state.h"
#include "vae/band_caches.h"

namespace latent {

class SlotState : public VaeState {
 public:
  explicit SlotState(size_t n) : slots(n) {}
  size_t bytes() const override {
    size_t n = slots.bytes();
    for (const auto& b : bands) n += b.bytes();
    for (const auto& c : band_caches) n += c.bytes();
    return n;
  }
  // Vae::encode_chunk/decode_chunk have checked that the state is this model's, which makes only SlotStates.
  static layers::StateSlots& of(VaeState& state) {
    layers::StateSlots& s = static_cast<SlotState&>(state).slots;
    s.shard = state.shard();
    return s;
  }
  static SlotState& from(VaeState& state) { return static_cast<SlotState&>(state); }
  layers::StateSlots slots;
  // With VaeState::band_rows(): band k's slots (its started flags, and its caches while it runs), made at the
  // first chunk, and the caches of the stages before and after the attention, kept once for all bands.
  std::vector<layers::StateSlots> bands;
  std::array<BandCaches, 2> band_caches;
};

}  // namespace latent
