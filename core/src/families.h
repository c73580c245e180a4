// Constructors of the model families, used by load_vae().
#pragma once

#include <memory>

#include "latent/vae.h"

namespace latent {

std::shared_ptr<Vae> make_wan(const WeightSource& src, const LoadOptions& opt);
std::shared_ptr<Vae> make_cogvideox(const WeightSource& src, const LoadOptions& opt);

// True when the tensors use the original Wan 2.1 checkpoint names (Wan2.1_VAE.pth, ComfyUI); renames them to
// the diffusers names in place.
bool rename_original_wan_keys(WeightSource& src);

}  // namespace latent
