// Weights in memory once a model has been built from a mapped file.
#pragma once

#include <cstdint>

#include "latent/io/weights.h"

namespace latent {

// Page residency of a mapped WeightSource once a model has taken its tensors: the pages of tensors the model still
// holds as views are read in now (the first chunk then pays no page faults, and a process's baseline memory holds
// the whole model), and the pages of tensors it holds no view of (replaced by a transformed copy, converted to
// another dtype or device) are handed back to the kernel, so the weights do not count twice. The pages are clean
// file pages of a private mapping: a later reader of a released tensor gets them again from the file, unchanged.
// Returns {bytes read in, bytes released}.
struct Residency {
  int64_t resident_bytes = 0;
  int64_t released_bytes = 0;
};
Residency settle_residency(const WeightSource& source);

}  // namespace latent
