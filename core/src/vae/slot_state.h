// The per-stream state of a family whose layers carry their tensors in numbered slots (nn/state.h).
#pragma once

#include "latent/vae/vae.h"
#include "nn/state.h"

namespace latent {

class SlotState : public VaeState {
 public:
  explicit SlotState(size_t n) : slots(n) {}
  size_t bytes() const override {
    size_t n = slots.bytes();
    for (const auto& b : bands) n += b.bytes();
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
  // With VaeState::band_rows(): band k's own caches, for the layers that run in bands (made at the first chunk).
  std::vector<layers::StateSlots> bands;
};

}  // namespace latent
