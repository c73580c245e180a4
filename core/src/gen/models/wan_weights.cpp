// Reading a Wan transformer's weights.
#include "gen/models/wan_weights.h"

#include <stdexcept>

#include "io/weight_files.h"

namespace latent {

WeightSource wan_transformer_weights(const std::filesystem::path& folder, const WeightEdits& edits) {
  if (!edits.empty()) throw ModelError(folder.string() + ": transformer weights and LoRAs are not read yet");
  return read_safetensors_folder(folder, "diffusion_pytorch_model");
}

std::vector<LoraFile> parse_lora_list(const std::string& text) {
  if (!text.empty()) throw std::invalid_argument("lora: not read yet");
  return {};
}

}  // namespace latent
