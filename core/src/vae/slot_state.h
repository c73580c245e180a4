// The per-stream state of a family whose layers carry their tensors in numbered slots (nn/state.h).
#pragma once

#include "latent/vae/vae.h"
#include "nn/state.h"

namespace latent {

class SlotState : public VaeState {
 public:
  explicit SlotState(size_t n) : slots(n) {}
  size_t bytes() const override { return slots.bytes(); }
  // Vae::encode_chunk/decode_chunk have checked that the state is this model's, which makes only SlotStates.
  static layers::StateSlots& of(VaeState& state) {
    layers::StateSlots& s = static_cast<SlotState&>(state).slots;
    s.shard = state.shard();
    return s;
  }
  layers::StateSlots slots;
};

}  // namespace latent
