// What the streaming engine does with the C heap between chunks.
#pragma once

#include <torch/types.h>

namespace latent {

// Called after every model call. On the CPU, a chunk's activations are large blocks freed all at once; glibc
// keeps freed blocks below its (self-raising) mmap threshold in its arenas, and over a long stream the
// fragments it keeps make a process's memory creep up with the clip length although the live memory is flat.
// Handing the free pages back after each chunk keeps the process's memory flat: the next chunk faults them in
// again, which costs a few percent of a chunk's time.
void after_chunk(const torch::Device& device);

}  // namespace latent
