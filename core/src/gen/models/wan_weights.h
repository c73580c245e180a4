// Where a Wan transformer's weights come from: the diffusers folder's own files, or a checkpoint in another
// layout given in their place (transformer-weights), with LoRAs merged in at load.
#pragma once

#include <filesystem>
#include <string>

#include "latent/gen/denoiser.h"
#include "latent/io/weights.h"

namespace latent {

// The tensors of the transformer in `folder` (diffusion_pytorch_model safetensors, single or sharded) or of
// edits.transformer_weights, under diffusers' WanTransformer3DModel names, with edits.loras merged in. Throws
// ModelError naming the file and the defect.
WeightSource wan_transformer_weights(const std::filesystem::path& folder, const WeightEdits& edits);

// A dotted name of Wan-AI's original layout (a tensor, "blocks.3.self_attn.q.weight", or a module,
// "blocks.3.ffn.0") under diffusers' spelling; or, where it has none, an empty name and the reason.
struct Renamed {
  std::string name;
  std::string problem;
};
Renamed original_to_diffusers(const std::string& path);

}  // namespace latent
