#include "nn/state.h"

namespace latent::layers {

size_t StateSlots::bytes() const {
  size_t n = 0;
  for (const auto& t : tensors)
    if (t.defined()) n += t.nbytes();
  return n;
}

void StateSlots::carry(int i, const Tensor& frames) {
  Tensor& t = tensors[size_t(i)];
  if (sink) {
    sink->carry(i, frames, band_width > 0 ? band_first * frames.size(-1) / band_width : 0);
    t = Tensor();
    return;
  }
  if (t.defined() && t.sizes() == frames.sizes() && t.options().type_equal(frames.options()) && t.is_contiguous()) {
    t.copy_(frames);
  } else {
    t = frames.clone(at::MemoryFormat::Contiguous);
  }
}

}  // namespace latent::layers
