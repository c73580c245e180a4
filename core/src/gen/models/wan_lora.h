// LoRAs merged into a Wan transformer's weights at load, read as diffusers reads them: diffusers/PEFT files
// (transformer.<module>.lora_A/lora_B) and the original Wan format of published Wan LoRAs
// (diffusion_model.<module>.lora_down/lora_up, alpha, diff_b); and as LongLive reads its own: PEFT over Wan's
// original names (base_model.model.<module>.lora_A/lora_B) in a torch.save file, under "generator_lora" or bare.
#pragma once

#include "latent/gen/denoiser.h"
#include "latent/io/weights.h"

namespace latent {

// Merges `lora` into `weights` (diffusers' names): each edited matrix becomes W + scale * (alpha / rank) * B @ A
// and each edited bias b + scale * b_delta, computed and kept in float32 (the model's reader casts them). Throws
// ModelError naming the LoRA file and the key: not a LoRA, a key for no module of the model, ranks that differ, a
// shape that does not fit the model, an alpha that is not a scalar, values that are not finite.
void merge_lora(WeightSource& weights, const LoraFile& lora);

}  // namespace latent
