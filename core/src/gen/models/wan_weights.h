// Where a Wan transformer's weights come from: the diffusers folder's own files, or a checkpoint in another
// layout given in their place (transformer-weights), with LoRAs merged in at load.
#pragma once

#include <filesystem>

#include "latent/gen/denoiser.h"
#include "latent/io/weights.h"

namespace latent {

// The tensors of the transformer in `folder` (diffusion_pytorch_model safetensors, single or sharded) or of
// edits.transformer_weights, under diffusers' WanTransformer3DModel names, with edits.loras merged in. Throws
// ModelError naming the file and the defect.
WeightSource wan_transformer_weights(const std::filesystem::path& folder, const WeightEdits& edits);

}  // namespace latent
