#include "latent/vae.h"

#include "families.h"
#include "heap.h"

namespace latent {
namespace {

std::string config_class(const WeightSource& src) {
  if (!src.config) return {};
  const json::Value* v = src.config->find("_class_name");
  return v && v->is_string() ? v->as_string() : std::string();
}

std::string detect_family(WeightSource& src) {
  const std::string cls = config_class(src);
  if (cls == "AutoencoderKLWan") return "wan2.1";
  if (cls == "AutoencoderKLCogVideoX") return "cogvideox";
  if (!cls.empty()) {
    throw ModelError(src.weights.string() + ": model class '" + cls +
                     "' is not a supported VAE (supported: AutoencoderKLWan, AutoencoderKLCogVideoX)");
  }
  if (auto it = src.metadata.find("family"); it != src.metadata.end()) return it->second;
  if (rename_original_wan_keys(src)) return "wan2.1";
  if (src.tensors.count("encoder.conv_in.conv.weight")) return "cogvideox";
  if (src.tensors.count("encoder.conv_in.weight") && src.tensors.count("encoder.down_blocks.0.norm1.gamma"))
    return "wan2.1";
  std::string names;
  int n = 0;
  for (const auto& [k, t] : src.tensors) {
    if (n++ == 3) break;
    names += (n > 1 ? ", " : "") + k;
  }
  throw ModelError(src.weights.string() +
                   ": cannot recognise the model family (no config naming it, and the tensor names are neither "
                   "Wan 2.1 nor CogVideoX VAE weights; first tensors: " +
                   names + ")");
}

}  // namespace

void Vae::check_frame_size(int64_t width, int64_t height) const {
  const int64_t m = spec_.size_multiple;
  if (width <= 0 || height <= 0 || width % m != 0 || height % m != 0) {
    throw ModelError(spec_.family + " encodes frames whose width and height are positive multiples of " +
                     std::to_string(m) + "; got " + std::to_string(width) + "x" + std::to_string(height) +
                     " (nearest accepted: " + std::to_string(std::max(m, width / m * m)) + "x" +
                     std::to_string(std::max(m, height / m * m)) + ")");
  }
}

std::string model_id_of(const WeightSource& source, const std::string& family) {
  auto it = source.metadata.find("model_id");
  return it != source.metadata.end() && !it->second.empty() ? it->second : family;
}

std::shared_ptr<Vae> load_vae(const WeightSource& source, const LoadOptions& options) {
  WeightSource src = source;  // shares tensor storage; renaming keys must not touch the caller's copy
  const std::string family = detect_family(src);
  std::shared_ptr<Vae> vae;
  if (family == "wan2.1")
    vae = make_wan(src, options);
  else if (family == "cogvideox")
    vae = make_cogvideox(src, options);
  else
    throw ModelError(src.weights.string() + ": unknown model family '" + family + "'");
  settle_residency(src);
  // A wrong LATENT_CPU_HEAP fails here, where callers expect setting errors, not when a stream starts.
  if (vae->device().is_cpu()) check_cpu_heap_policy();
  return vae;
}

std::shared_ptr<Vae> load_vae(const std::filesystem::path& path, const LoadOptions& options) {
  return load_vae(read_weights(path), options);
}

}  // namespace latent
