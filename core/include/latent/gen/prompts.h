// A prompt (and, for guidance, a negative prompt) to the embeddings a diffusers pipeline folder's own text encoder
// computes: what videogen's `prompt` property and the latent-prompt tool share, so both give the same tensors.
#pragma once

#include <torch/types.h>

#include <filesystem>
#include <optional>
#include <string>

#include "latent/gen/text_encoder.h"

namespace latent {

struct PromptEmbeddings {
  torch::Tensor prompt;    // [1, L, D] in the encoder's dtype, on the CPU
  torch::Tensor negative;  // the same shape, or undefined when none was asked for
};

// The pipeline folder a model path belongs to: the folder itself when it holds text_encoder/ (or
// model_index.json), the parent of a transformer/ (or transformer_2/) folder given directly. Throws ModelError when
// the path is not part of a diffusers pipeline folder with a text encoder and a tokenizer, or is another part of one
// (DIR/vae: naming the pipeline folder to give instead).
std::filesystem::path text_pipeline_folder(const std::filesystem::path& model);

// Loads the folder's text encoder and tokenizer, encodes `prompt` and, when `negative` is set, the negative prompt
// (diffusers' pipelines use the empty prompt when guidance is on and none is given: pass ""), then frees the
// encoder's weights before returning, so the denoiser never shares memory with them.
PromptEmbeddings encode_prompts(const std::filesystem::path& model, const std::string& prompt,
                                const std::optional<std::string>& negative, const TextEncoder::Options& options);

}  // namespace latent
