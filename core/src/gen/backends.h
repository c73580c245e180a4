// The denoiser backends load_denoiser() chooses from (core/src/gen/denoiser.cpp).
#pragma once

#include <filesystem>
#include <memory>

#include "latent/gen/denoiser.h"
#include "latent/io/weights.h"

namespace latent {

// gen/aoti_denoiser.cpp: a .pt2 package from tools/export_denoiser.py.
std::shared_ptr<Denoiser> load_aoti_denoiser(const std::filesystem::path& path, const LoadOptions& opt);

// gen/small_denoiser.cpp: latent-gen-small, the native default generator's architecture.
bool is_small_denoiser(const WeightSource& src);
std::shared_ptr<Denoiser> make_small_denoiser(const WeightSource& src, const LoadOptions& opt);

}  // namespace latent
