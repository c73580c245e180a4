// A model call's layers see the interrupt of the generator that runs it: a long call (one at 16384x16384 takes
// minutes) then stops between two layers, so a stop waits for one layer, not for the whole call. The flag is the
// generator's (Generator::interrupt); the scope puts it where the layers of calls on this thread can see it,
// without every model's interface carrying it.
#pragma once

#include <atomic>

namespace latent {

class LayerInterrupt {
 public:
  explicit LayerInterrupt(const std::atomic<bool>& flag);
  ~LayerInterrupt();
  LayerInterrupt(const LayerInterrupt&) = delete;
  LayerInterrupt& operator=(const LayerInterrupt&) = delete;
  // Throws Interrupted where the flag of this thread's innermost scope is set; nothing outside a scope.
  static void check();

 private:
  const std::atomic<bool>* previous_;
};

}  // namespace latent
