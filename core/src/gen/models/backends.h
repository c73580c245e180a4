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
// gen/models/wan_experts.cpp: Wan 2.2 A14B's two experts as one denoiser, `high` for the calls at timesteps >=
// spec.expert_boundary, `low` for the others. Each loader makes its expert on options.device; with
// `both_resident` false only the expert in use is kept, the other made again when its turn comes.
using ExpertLoader = std::function<std::shared_ptr<Denoiser>()>;
std::shared_ptr<Denoiser> make_wan_experts(ExpertLoader high, ExpertLoader low, DenoiserSpec spec,
                                           const LoadOptions& options, bool both_resident);
// Whether `device` holds two experts of `expert_bytes` each with room for a call: always on the CPU (the weights
// are mapped from their files), on a GPU by its free memory. LATENT_RESIDENT_EXPERTS=1 or 2 decides instead.
bool keep_both_experts(torch::Device device, size_t expert_bytes);
// The position tables a native CogVideoX denoiser keeps for latents of frames x height x width (the sin-cos
// positions, or RoPE's cos and sin), without making them: empty where it keeps none. For tests of the cache.
std::vector<torch::Tensor> cogvideox_cached_tables(const Denoiser& model, int64_t frames, int64_t height,
                                                   int64_t width);

}  // namespace latent
