// The embedded default model: a small Wan 2.1-architecture VAE trained by tools/train_default_vae.py and
// shipped in models/. It is what the elements load when no model is named.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

namespace latent {

inline constexpr const char* kDefaultModelFile = "latent-tiny-wan.safetensors";

// Where the default model is looked for, in order: $LATENT_DEFAULT_MODEL (a file; when set it is the only
// candidate, so a wrong value is reported instead of silently replaced), the data directory next to the
// installed library (relocated installs), the configured install data directory, and the source tree's
// models/ (build-tree use).
std::vector<std::filesystem::path> default_model_candidates();

// The first existing candidate. Throws ModelError listing every place looked at when there is none.
std::filesystem::path find_default_model();

}  // namespace latent
