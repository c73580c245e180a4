#include "gen/layer_interrupt.h"

#include "latent/gen/generator.h"

namespace latent {
namespace {
thread_local const std::atomic<bool>* current = nullptr;
}  // namespace

LayerInterrupt::LayerInterrupt(const std::atomic<bool>& flag) : previous_(current) { current = &flag; }

LayerInterrupt::~LayerInterrupt() { current = previous_; }

void LayerInterrupt::check() {
  if (current && current->load(std::memory_order_relaxed)) throw Interrupted("generation interrupted");
}

}  // namespace latent
