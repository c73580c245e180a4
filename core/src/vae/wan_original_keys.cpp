// The original Wan 2.1 and 2.2 checkpoints (Wan2.1_VAE.pth, also what ComfyUI ships, and Wan2.2_VAE.pth) name
// their modules differently from diffusers; the Wan families read diffusers' names, so the original ones are mapped
// onto them. Wan 2.2's names follow the module tree of the original vae2_2.py (each level a Sequential of its
// residual blocks and then its resampler) and agree with diffusers' convert_wan_to_diffusers.py.
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

// Wan 2.2: "{i}.downsamples.{j}.<tail>" (or upsamples) inside level i: a resampler's tail starts with resample or
// time_conv, a residual block's with residual or shortcut.
std::string rename_nested(const std::string& side, const std::string& list, const std::string& rest) {
  const size_t dot = rest.find('.');
  const std::string level = rest.substr(0, dot), inner = rest.substr(dot + 1);
  std::string tail = inner;
  if (!swap_prefix(tail, list, "")) return side + list + rest;
  const size_t dot2 = tail.find('.');
  const std::string j = tail.substr(0, dot2);
  tail = tail.substr(dot2 + 1);
  const bool down = list == "downsamples.";
  const std::string p = side + (down ? "down_blocks." : "up_blocks.") + level + ".";
  if (starts_with(tail, "resample.") || starts_with(tail, "time_conv."))
    return p + (down ? "downsampler." : "upsampler.") + tail;
  return p + "resnets." + j + "." + residual_suffix(tail);
}

// `nested`: the Wan 2.2 layout.
std::string rename_original(const std::string& key, int64_t res_blocks, bool nested) {
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
      if (nested) return rename_nested(s, list, rest);
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
  for (auto& [k, t] : src.tensors) renamed.emplace(rename_original(k, res_blocks, false), t);
  src.tensors = std::move(renamed);
  return true;
}

bool rename_original_wan22_keys(WeightSource& src) {
  if (!src.tensors.count("encoder.conv1.weight") ||
      !src.tensors.count("encoder.downsamples.0.downsamples.0.residual.0.gamma"))
    return false;
  std::map<std::string, torch::Tensor> renamed;
  for (auto& [k, t] : src.tensors) renamed.emplace(rename_original(k, 0, true), t);
  src.tensors = std::move(renamed);
  return true;
}

}  // namespace latent
