// Precompiled for every torch-heavy target: the LibTorch headers dominate compile time on small machines.
// The tensor API only (torch/types.h: ATen, the factory functions, dtypes; torch/utils.h: NoGradGuard,
// manual_seed), not torch/torch.h: its C++ frontend (nn, optim, data, serialization) is used by no source here, and
// loading it cost every translation unit 6.2 s even precompiled, against 2.8 s for these two (an empty source on
// this machine, GCC 12). Sources include what they use beyond them (torch/cuda.h, torch/serialize.h).

#include <torch/types.h>
#include <torch/utils.h>

#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>
