// The table of model families: how each is recognised, built and cut into chunks. Adding a family is one file with
// its modules and these functions, plus one row in families.cpp; load_vae() knows no family by name.
#pragma once

#include <memory>
#include <span>
#include <string_view>

#include "latent/vae/vae.h"

namespace latent {

// How a family cuts time, for a given temporal compression.
struct ChunkRules {
  ChunkRule encode;
  ChunkRule decode;
};

struct Family {
  const char* name;          // VaeSpec::family and the "family" key of a weights file's __metadata__
  const char* config_class;  // diffusers' _class_name in config.json
  // Where several families share a config class (Wan 2.1 and 2.2 are both AutoencoderKLWan), which configs are
  // this row's; null when the class alone decides.
  bool (*takes_config)(const ModelConfig& config);
  // Recognises weights that come without a config by their tensor names. May rename the tensors of another
  // published layout (e.g. the original Wan 2.1 checkpoint) to the names the constructor reads.
  bool (*recognise)(WeightSource& src);
  std::shared_ptr<Vae> (*make)(const WeightSource& src, const LoadOptions& opt);
  ChunkRules (*chunks)(int64_t temporal_factor);
};

std::span<const Family> families();

// The family of `src`: its config's class, else __metadata__ "family", else the first family that recognises the
// tensor names (which may rename them). Throws ModelError naming what was found and what is supported.
const Family& detect_family(WeightSource& src);

// ---- the rows' functions, one file per family ---------------------------------------------------------------

// vae/wan.cpp, vae/wan_original_keys.cpp: Wan 2.1, and Wan 2.2 (is_residual: the TI2V-5B VAE) on the same code
std::shared_ptr<Vae> make_wan(const WeightSource& src, const LoadOptions& opt);
std::shared_ptr<Vae> make_wan22(const WeightSource& src, const LoadOptions& opt);
bool wan21_takes_config(const ModelConfig& config);
bool wan22_takes_config(const ModelConfig& config);
bool recognise_wan(WeightSource& src);
bool recognise_wan22(WeightSource& src);
ChunkRules wan_chunks(int64_t temporal_factor);
// True when the tensors use the original Wan 2.1 checkpoint names (Wan2.1_VAE.pth, ComfyUI); renames them to
// the diffusers names in place.
bool rename_original_wan_keys(WeightSource& src);
// The same for the original Wan 2.2 checkpoint (Wan2.2_VAE.pth, whose levels are nested Sequentials).
bool rename_original_wan22_keys(WeightSource& src);

// vae/cogvideox.cpp
std::shared_ptr<Vae> make_cogvideox(const WeightSource& src, const LoadOptions& opt);
bool recognise_cogvideox(WeightSource& src);
ChunkRules cogvideox_chunks(int64_t temporal_factor);

// vae/taehv.cpp: the TAEHV tiny autoencoders (taew2_1, taew2_2, taew2_2_super), in the latent space of the VAE
// each imitates
std::shared_ptr<Vae> make_taehv(const WeightSource& src, const LoadOptions& opt);
bool recognise_taehv(WeightSource& src);
ChunkRules taehv_chunks(int64_t temporal_factor);

}  // namespace latent
