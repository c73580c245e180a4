// Precompiled for every torch-heavy target: the LibTorch headers dominate compile time on small machines.

#include <torch/torch.h>

#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>
