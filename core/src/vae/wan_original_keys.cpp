// The original Wan 2.1 checkpoint (Wan2.1_VAE.pth, also what ComfyUI ships) names its modules differently from
// diffusers; the Wan family reads diffusers' names, so the original ones are mapped onto them.
#include "vae/families.h"

namespace latent {
namespace {

bool starts_with(const std::string& s, const std::string& p) { return s.compare(0, p.size(), p) == 0; }

// Replaces prefix `from` of `name` with `to`; false when `name` does not start with `from`.
bool swap_prefix(std::string& name, const std::string& from, const std::string& to) {
  if (!starts_with(name, from)) return false;
  name = to + name.substr(from.size());
  return true;
}

// The original ResidualBlock is a Sequential: residual.{0 norm, 2 conv, 3 norm, 6 conv}, plus shortcut.
std::string residual_suffix(const std::string& rest) {
  static const std::pair<const char*, const char*> map[] = {{"residual.0.", "norm1."},
                                                            {"residual.2.", "conv1."},
                                                            {"residual.3.", "norm2."},
                                                            {"residual.6.", "conv2."},
                                                            {"shortcut.", "conv_shortcut."}};
  for (const auto& [from, to] : map) {
    std::string r = rest;
    if (swap_prefix(r, from, to)) return r;
  }
  return rest;
}

std::string rename_original(const std::string& key, int64_t res_blocks) {
  std::string k = key;
  if (swap_prefix(k, "conv1.", "quant_conv.") || swap_prefix(k, "conv2.", "post_quant_conv.")) return k;
  for (const char* side : {"encoder.", "decoder."}) {
    std::string s = side;
    if (!starts_with(k, s)) continue;
    std::string rest = k.substr(s.size());
    if (swap_prefix(rest, "conv1.", "conv_in.") || swap_prefix(rest, "head.0.", "norm_out.") ||
        swap_prefix(rest, "head.2.", "conv_out."))
      return s + rest;
    if (swap_prefix(rest, "middle.0.", "")) return s + "mid_block.resnets.0." + residual_suffix(rest);
    if (swap_prefix(rest, "middle.2.", "")) return s + "mid_block.resnets.1." + residual_suffix(rest);
    if (swap_prefix(rest, "middle.1.", "mid_block.attentions.0.")) return s + rest;
    for (const char* list : {"downsamples.", "upsamples."}) {
      if (!swap_prefix(rest, list, "")) continue;
      size_t dot = rest.find('.');
      int64_t n = std::stoll(rest.substr(0, dot));
      std::string tail = rest.substr(dot + 1);
      if (std::string(list) == "downsamples.")  // the same flat index in both layouts
        return s + "down_blocks." + std::to_string(n) + "." + residual_suffix(tail);
      // Decoder levels are flat too: (res_blocks + 1) residual blocks, then the level's upsampler.
      int64_t per_level = res_blocks + 2, level = n / per_level, j = n % per_level;
      std::string p = s + "up_blocks." + std::to_string(level) + ".";
      return j <= res_blocks ? p + "resnets." + std::to_string(j) + "." + residual_suffix(tail)
                             : p + "upsamplers.0." + tail;
    }
  }
  return k;
}

}  // namespace

bool rename_original_wan_keys(WeightSource& src) {
  if (!src.tensors.count("encoder.conv1.weight") || !src.tensors.count("encoder.downsamples.0.residual.0.gamma"))
    return false;
  int64_t res_blocks = 0;
  while (src.tensors.count("encoder.downsamples." + std::to_string(res_blocks) + ".residual.0.gamma")) ++res_blocks;
  std::map<std::string, torch::Tensor> renamed;
  for (auto& [k, t] : src.tensors) renamed.emplace(rename_original(k, res_blocks), t);
  src.tensors = std::move(renamed);
  return true;
}

}  // namespace latent
