#include "vae/families.h"

#include <array>
#include <string>

namespace latent {
namespace {

// Recognisers run in this order, so a family whose names are a subset of another's comes after it.
constexpr std::array<Family, 4> kFamilies{{
    {"wan2.1", "AutoencoderKLWan", wan21_takes_config, recognise_wan, make_wan, wan_chunks},
    {"wan2.2", "AutoencoderKLWan", wan22_takes_config, recognise_wan22, make_wan22, wan_chunks},
    {"cogvideox", "AutoencoderKLCogVideoX", nullptr, recognise_cogvideox, make_cogvideox, cogvideox_chunks},
    // No config file exists for these (the reference builds them from code), so the class never matches one.
    {"taehv", "TAEHV", nullptr, recognise_taehv, make_taehv, taehv_chunks},
}};

std::string supported(const char* Family::*field) {
  std::string out;
  for (const Family& f : kFamilies) {
    const std::string v = f.*field;
    if ((", " + out + ", ").find(", " + v + ", ") == std::string::npos) out += (out.empty() ? "" : ", ") + v;
  }
  return out;
}

}  // namespace

std::span<const Family> families() { return kFamilies; }

const Family& detect_family(WeightSource& src) {
  if (src.config && !src.config->class_name.empty()) {
    for (const Family& f : kFamilies)
      if (src.config->class_name == f.config_class && (!f.takes_config || f.takes_config(*src.config))) return f;
    throw ModelError(src.weights.string() + ": model class '" + src.config->class_name +
                     "' is not a supported VAE (supported: " + supported(&Family::config_class) + ")");
  }
  if (auto it = src.metadata.find("family"); it != src.metadata.end()) {
    for (const Family& f : kFamilies)
      if (it->second == f.name) return f;
    throw ModelError(src.weights.string() + ": unknown model family '" + it->second +
                     "' in __metadata__ (supported: " + supported(&Family::name) + ")");
  }
  for (const Family& f : kFamilies)
    if (f.recognise(src)) return f;
  std::string names;
  int n = 0;
  for (const auto& [k, t] : src.tensors) {
    if (n++ == 3) break;
    names += (n > 1 ? ", " : "") + k;
  }
  throw ModelError(src.weights.string() +
                   ": cannot recognise the model family (no config naming it, and the tensor names are none of " +
                   supported(&Family::name) + "; first tensors: " + names + ")");
}

}  // namespace latent
