#include "latent/gen/prompts.h"

#include <torch/types.h>
#include <torch/utils.h>

#include "latent/io/weights.h"

namespace fs = std::filesystem;

namespace latent {

fs::path text_pipeline_folder(const fs::path& model) {
  const auto has_text = [](const fs::path& dir) {
    return fs::is_directory(dir / "text_encoder") || fs::exists(dir / "model_index.json");
  };
  std::error_code ec;
  if (fs::is_directory(model, ec) && has_text(model)) return model;
  // model=DIR/transformer names the transformer alone; its pipeline is the folder above. Any other part of a
  // pipeline (vae/, scheduler/) is refused: its text encoder would be taken from the folder above unasked.
  const fs::path dir = model.has_filename() ? model : model.parent_path();
  const fs::path parent = dir.parent_path();
  if (fs::is_directory(model, ec) && !parent.empty() && has_text(parent)) {
    const std::string part = dir.filename().string();
    if (part == "transformer" || part == "transformer_2") return parent;
    throw ModelError(model.string() + ": a prompt is encoded by the pipeline's text encoder, and this is its " + part +
                     "/ folder: give the pipeline folder " + parent.string() + " (or its transformer/)");
  }
  throw ModelError(model.string() +
                   ": a prompt needs a diffusers pipeline folder with text_encoder/ and tokenizer/ (e.g. "
                   "Wan2.1-T2V-1.3B-Diffusers); with any other model, give precomputed embeddings (prompt-embeds)");
}

PromptEmbeddings encode_prompts(const fs::path& model, const std::string& prompt,
                                const std::optional<std::string>& negative, const TextEncoder::Options& options) {
  torch::NoGradGuard no_grad;
  auto encoder = TextEncoder::load(text_pipeline_folder(model), options);
  PromptEmbeddings out;
  out.prompt = encoder->encode(prompt).to(torch::kCPU);
  if (negative) out.negative = encoder->encode(*negative).to(torch::kCPU);
  encoder->release();
  return out;
}

}  // namespace latent
