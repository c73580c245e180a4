// The embedded default models, shipped in models/ and loaded when no model is named: a small Wan 2.1-architecture
// VAE (models/recipes/train_default_vae.py) for vaeencode / vaedecode, and a small generator in its latents
// (models/recipes/train_default_generator.py) for videogen.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

namespace latent {

inline constexpr const char* kDefaultModelFile = "latent-tiny-wan.safetensors";
inline constexpr const char* kDefaultGeneratorFile = "latent-gen-small.safetensors";

// Where the default model is looked for, in order: $LATENT_DEFAULT_MODEL (a file; when set it is the only
// candidate, so a wrong value is reported instead of silently replaced), the data directory next to the
// installed library (relocated installs), the configured install data directory, and the source tree's
// models/ (build-tree use).
std::vector<std::filesystem::path> default_model_candidates();

// The first existing candidate. Throws ModelError listing every place looked at when there is none.
std::filesystem::path find_default_model();

// The same places for the default generator, with $LATENT_DEFAULT_GENERATOR in place of $LATENT_DEFAULT_MODEL.
std::vector<std::filesystem::path> default_generator_candidates();
std::filesystem::path find_default_generator();

}  // namespace latent
