// Reading a model's files as diffusers and transformers lay them out: a JSON or text file whole, and the tensors of
// a folder stored as one safetensors file or as the shards its index names.
#pragma once

#include <filesystem>
#include <span>
#include <string>
#include <string_view>

#include "latent/io/weights.h"

namespace latent {

// The whole file; ModelError naming it when it cannot be read.
std::string read_text_file(const std::filesystem::path& path);

// `dir`/STEM.safetensors, or the shards `dir`/STEM.safetensors.index.json names (every shard a file in `dir`, each
// tensor in the shard the index says, none in two), as mapped views. ModelError naming the file otherwise.
WeightSource read_safetensors_folder(const std::filesystem::path& dir, const std::string& stem);

// The tensors of a torch.save() checkpoint, found in the top-level dict or descended into each of `containers` in
// turn where the dict at hand holds it (pth::read_pickle); `container` receives the keys taken, "." between, empty
// for the top level. ModelError naming the file otherwise.
WeightSource read_torch_checkpoint(const std::filesystem::path& file, std::span<const std::string_view> containers,
                                   std::string* container = nullptr);

}  // namespace latent
