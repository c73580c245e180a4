// The denoiser backends load_denoiser() chooses from (core/src/gen/models/denoiser.cpp).
#pragma once

#include <filesystem>
#include <functional>
#include <memory>
#include <string>

#include "gen/models/diffusers_folder.h"
#include "latent/gen/denoiser.h"
#include "latent/io/weights.h"

namespace latent {

// A metadata value by key, or null when absent.
using MetadataLookup = std::function<const std::string*(const std::string& key)>;

// Reads the optional part of the contract every backend shares, each key being `prefix` + its name:
// temporal_factor, spatial_factor, native_height, native_width. Throws ModelError naming `where` and the key.
void read_optional_contract(DenoiserSpec& spec, const MetadataLookup& find, const std::string& where,
                            const std::string& prefix);

// gen/models/aoti_denoiser.cpp: a .pt2 package from tools/export_denoiser.py.
std::shared_ptr<Denoiser> load_aoti_denoiser(const std::filesystem::path& path, const LoadOptions& opt);

// gen/models/small_denoiser.cpp: latent-gen-small, the native default generator's architecture.
bool is_small_denoiser(const WeightSource& src);
std::shared_ptr<Denoiser> make_small_denoiser(const WeightSource& src, const LoadOptions& opt);

// Natively run diffusers transformers, chosen by the "_class_name" of the folder's transformer config
// (gen/models/diffusers_folder.h finds it): gen/models/wan_transformer.cpp and gen/models/cogvideox_transformer.cpp.
std::shared_ptr<Denoiser> load_wan_transformer(const DiffusersFolder& folder, const LoadOptions& opt,
                                               const DenoiserFiles& files);
std::shared_ptr<Denoiser> load_cogvideox_transformer(const DiffusersFolder& folder, const LoadOptions& opt,
                                                     const DenoiserFiles& files);
// The position tables a native CogVideoX denoiser keeps for latents of frames x height x width (the sin-cos
// positions, or RoPE's cos and sin), without making them: empty where it keeps none. For tests of the cache.
std::vector<torch::Tensor> cogvideox_cached_tables(const Denoiser& model, int64_t frames, int64_t height,
                                                   int64_t width);

}  // namespace latent
