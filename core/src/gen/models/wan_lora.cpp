// A LoRA file's tensors grouped by the module of diffusers' WanTransformer3DModel they edit, checked against the
// weights, then merged. The arithmetic is what diffusers 0.42 with PEFT computes at run time with
// set_adapters(weight=scale): y = W x + b + scale * (alpha / rank) * B (A x + ...) + scale * (alpha / rank) * bias_B,
// where the original format folds alpha / rank into A and B (not into diff_b) and a diffusers file without adapter
// metadata has alpha = rank. Merging gives the same numbers up to float32 rounding.
//
// LongLive's LoRA (NVlabs/LongLive utils/lora_utils.py, inference.py) is PEFT over Wan's original module names: a
// torch.save dict {"generator_lora": get_peft_model_state_dict(...), "critic_lora": ..., "step"} or the bare state
// dict, keys "base_model.model.<module>.lora_A/lora_B.weight". It stores no alpha; its configs set alpha = rank, so
// the factor is 1 as for a diffusers file without metadata.
#include "gen/models/wan_lora.h"

#include <torch/types.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <span>
#include <string_view>

#include "gen/models/wan_weights.h"
#include "io/json.h"
#include "io/pth_format.h"
#include "io/weight_files.h"
#include "latent/io/safetensors.h"

namespace latent {
namespace {

namespace fs = std::filesystem;

bool starts_with(std::string_view s, std::string_view p) { return s.substr(0, p.size()) == p; }
bool ends_with(std::string_view s, std::string_view p) {
  return s.size() >= p.size() && s.substr(s.size() - p.size()) == p;
}

std::string shape_str(at::IntArrayRef s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

struct Part {
  torch::Tensor t;
  std::string key;  // as in the file
  explicit operator bool() const { return t.defined(); }
};

// What one LoRA does to one module.
struct Delta {
  Part down, up;  // A [rank, in], B [out, rank]
  Part alpha;     // original format: a scalar, the product scaled by alpha / rank
  Part bias;      // added to the module's bias (diff_b, lora_B.bias)
  Part diff;      // added to the whole weight (original format's .diff)
};

struct LoraTensors {
  std::string where;
  std::map<std::string, torch::Tensor> tensors;
  std::map<std::string, std::string> metadata;
};

LoraTensors read_lora(const fs::path& file) {
  std::error_code ec;
  LoraTensors out{file.string(), {}, {}};
  if (!fs::is_regular_file(file, ec)) throw ModelError(out.where + ": no such LoRA file");
  const std::string ext = file.extension().string();
  if (ext == ".pt" || ext == ".pth" || ext == ".ckpt") {
    // LongLive's trainer keeps the generator's LoRA beside the critic's; only the generator's is the model's.
    static constexpr std::string_view kContainers[] = {"generator_lora", "state_dict", "model"};
    WeightSource src = read_torch_checkpoint(file, kContainers);
    out.tensors = std::move(src.tensors);
    return out;
  }
  try {
    auto st = SafetensorsFile::open(file);
    out.metadata = st.metadata();
    for (const auto& n : st.names()) out.tensors.emplace(n, st.tensor(n));
  } catch (const SafetensorsError& e) {
    throw ModelError(std::string(e.what()));
  }
  return out;
}

// PEFT's scaling of a diffusers file: lora_alpha / r from the adapter metadata diffusers writes (its LoraConfig, keys
// prefixed "transformer."), 1 without it.
struct PeftConfig {
  bool given = false;
  int64_t r = 0;
  double alpha = 0;
  bool rslora = false;
  double factor() const { return given ? alpha / (rslora ? std::sqrt(double(r)) : double(r)) : 1.0; }
};

PeftConfig peft_config(const LoraTensors& lora) {
  PeftConfig c;
  auto it = lora.metadata.find("lora_adapter_metadata");
  if (it == lora.metadata.end()) return c;
  const std::string where = lora.where + ": __metadata__ \"lora_adapter_metadata\"";
  try {
    const json::Value v = json::parse(it->second);
    if (!v.is_object()) throw ModelError(where + " is not a JSON object");
    auto get = [&](const char* key) { return v.find(std::string("transformer.") + key); };
    if (!get("r") && !get("lora_alpha")) return c;
    const json::Value *r = get("r"), *alpha = get("lora_alpha");
    if (!r || !alpha) throw ModelError(where + " gives one of transformer.r and transformer.lora_alpha alone");
    c.given = true;
    c.r = r->as_int64();
    c.alpha = alpha->as_double();
    if (c.r <= 0 || !std::isfinite(c.alpha)) throw ModelError(where + ": r must be positive and lora_alpha finite");
    if (const json::Value* rs = get("use_rslora")) c.rslora = rs->as_bool();
    if (const json::Value* d = get("use_dora"); d && d->as_bool())
      throw ModelError(where + ": DoRA adapters are not supported");
    for (const char* pattern : {"rank_pattern", "alpha_pattern"})
      if (const json::Value* p = get(pattern); p && !(p->is_null() || (p->is_object() && p->as_object().empty())))
        throw ModelError(where + ": per-module " + pattern + " is not supported");
  } catch (const json::Error& e) {
    throw ModelError(where + ": " + e.what());
  }
  return c;
}

enum class Format { peft, original };

// How a file spells its modules: the prefix before them and whether they are Wan's original names.
struct Naming {
  Format format = Format::peft;
  std::string prefix;
  bool original_names = false;
};

// diffusers/PEFT "transformer.", the original "diffusion_model.", or PEFT's own wrapping of Wan's original
// network (LongLive) "base_model.model."; the first that any key uses decides.
Naming naming_of(const LoraTensors& lora) {
  auto any = [&](std::string_view prefix) {
    return std::any_of(lora.tensors.begin(), lora.tensors.end(),
                       [&](const auto& kv) { return starts_with(kv.first, prefix); });
  };
  if (any("diffusion_model.")) return {Format::original, "diffusion_model.", true};
  if (any("base_model.model.")) return {Format::peft, "base_model.model.", true};
  return {Format::peft, "transformer.", false};
}

// The file's tensors by diffusers module name. Keys diffusers drops (the norms' .diff/.diff_b, which trainers
// write as zeros) are dropped here too.
std::map<std::string, Delta> group(const LoraTensors& lora, Format& format) {
  const std::string& where = lora.where;
  auto fail = [&](const std::string& key, const std::string& what) -> ModelError {
    return ModelError(where + ": \"" + key + "\": " + what);
  };
  bool any_lora = false;
  for (const auto& [k, t] : lora.tensors) {
    any_lora = any_lora || k.find("lora") != std::string::npos;
    if (starts_with(k, "lora_unet_"))
      throw fail(k, "kohya/musubi-tuner LoRA naming is not read; diffusers/PEFT and the original Wan format are");
  }
  const Naming naming = naming_of(lora);
  format = naming.format;
  const bool original = format == Format::original;
  const std::string& prefix = naming.prefix;
  struct Suffix {
    std::string_view text;
    Part Delta::*part;
  };
  static const Suffix kOriginal[] = {{".lora_down.weight", &Delta::down},
                                     {".lora_A.weight", &Delta::down},
                                     {".lora_up.weight", &Delta::up},
                                     {".lora_B.weight", &Delta::up},
                                     {".alpha", &Delta::alpha},
                                     {".diff_b", &Delta::bias},
                                     {".diff", &Delta::diff}};
  // PEFT's model.state_dict() keeps the adapter's name ("default"); get_peft_model_state_dict drops it.
  static const Suffix kPeft[] = {{".lora_A.weight", &Delta::down},       {".lora_B.weight", &Delta::up},
                                 {".lora_B.bias", &Delta::bias},         {".lora_A.default.weight", &Delta::down},
                                 {".lora_B.default.weight", &Delta::up}, {".lora_B.default.bias", &Delta::bias}};
  std::map<std::string, Delta> out;
  for (const auto& [key, t] : lora.tensors) {
    if (!starts_with(key, prefix)) {
      if (!any_lora && lora.tensors.size() > 0 && !original)
        throw ModelError(where + ": not a LoRA: no lora_A/lora_B or lora_down/lora_up tensors (first key \"" + key +
                         "\")");
      if (naming.prefix != "transformer.")
        throw fail(key, "lacks the \"" + prefix + "\" prefix the file's other keys have (" +
                            (original ? "original Wan format" : "PEFT over Wan's original names, as LongLive's") + ")");
      throw fail(key,
                 "is neither \"transformer.<module>.lora_A/lora_B\" (diffusers), "
                 "\"base_model.model.<module>.lora_A/lora_B\" (PEFT over Wan's original names, as LongLive's) nor "
                 "\"diffusion_model.<module>.lora_down/lora_up\" (original Wan format)");
    }
    if (key.find("dora_scale") != std::string::npos || key.find("lora_magnitude_vector") != std::string::npos)
      throw fail(key, "DoRA adapters are not supported");
    const std::string name = key.substr(prefix.size());
    const Suffix* suffix = nullptr;
    for (const Suffix& s : original ? std::span<const Suffix>(kOriginal) : std::span<const Suffix>(kPeft))
      if (ends_with(name, s.text)) {
        suffix = &s;
        break;
      }
    if (!suffix)
      throw fail(key, "is not a LoRA tensor (lora_A/lora_B" + std::string(original ? ", lora_down/lora_up, "
                                                                                     "alpha, diff, diff_b)"
                                                                                   : ".weight, lora_B.bias)"));
    std::string module = name.substr(0, name.size() - suffix->text.size());
    if (naming.original_names) {
      // diffusers drops them (lora_conversion_utils: "norm layer diff keys are just zeroed values").
      if (original && (suffix->part == &Delta::diff || suffix->part == &Delta::bias) &&
          module.find("norm") != std::string::npos)
        continue;
      // PEFT over the trainers' wrapper rather than its network names the network "model.".
      if (!original && starts_with(module, "model.")) module.erase(0, 6);
      Renamed r = original_to_diffusers(module);
      if (r.name.empty()) throw fail(key, r.problem);
      module = r.name;
    }
    Part& p = out[module].*(suffix->part);
    if (p)
      throw fail(key,
                 "is a second " + std::string(suffix->text.substr(1)) + " for the same module as \"" + p.key + "\"");
    p = {t, key};
  }
  if (out.empty() || std::none_of(out.begin(), out.end(), [](const auto& d) {
        return d.second.down || d.second.up || d.second.diff || d.second.bias;
      }))
    throw ModelError(where + ": not a LoRA: no lora_A/lora_B or lora_down/lora_up tensors");
  return out;
}

// alpha may be stored as an integer; the matrices and differences may not.
void require_finite(const std::string& where, const Part& p, bool integer_allowed) {
  if (integer_allowed && at::isIntegralType(p.t.scalar_type(), /*includeBool=*/false)) return;
  if (!at::isFloatingType(p.t.scalar_type()))
    throw ModelError(where + ": \"" + p.key + "\" has dtype " + std::string(c10::toString(p.t.scalar_type())) +
                     ", not a floating-point type");
  if (!torch::isfinite(p.t).all().item<bool>())
    throw ModelError(where + ": \"" + p.key + "\" holds values that are not finite (NaN or infinity)");
}

}  // namespace

void merge_lora(WeightSource& weights, const LoraFile& lora) {
  const LoraTensors file = read_lora(lora.path);
  const std::string& where = file.where;
  // The updates are made in float32: a scale past its range (1e39, -1e308) would make every one of them infinite.
  if (!std::isfinite(lora.scale) || !std::isfinite(float(lora.scale)))
    throw ModelError(where + ": the LoRA's scale " + std::to_string(lora.scale) + " is not a finite float32 value");
  Format format;
  const std::map<std::string, Delta> deltas = group(file, format);
  const PeftConfig peft = format == Format::peft ? peft_config(file) : PeftConfig{};
  auto fail = [&](const Part& p, const std::string& what) {
    return ModelError(where + ": \"" + p.key + "\": " + what);
  };
  auto target = [&](const Part& p, const std::string& name) -> const torch::Tensor& {
    auto it = weights.tensors.find(name);
    if (it == weights.tensors.end())
      throw fail(p, "edits \"" + name + "\", which the model (" + weights.weights.string() + ") does not have");
    return it->second;
  };

  // Every check before the first change, so a bad file leaves the weights as they were. The products are made
  // later, as the model takes each tensor (WeightReader::take): one float32 product and one merged copy at a time.
  struct Edit {
    std::string name, key;               // the tensor edited, and the LoRA key its update comes from
    std::function<torch::Tensor()> add;  // the new tensor is base + add(), float32
  };
  std::vector<Edit> edits;
  for (const auto& [module, d] : deltas) {
    for (const Part* p : {&d.down, &d.up, &d.alpha, &d.bias, &d.diff})
      if (*p) require_finite(where, *p, p == &d.alpha);
    if (bool(d.down) != bool(d.up)) {
      const Part& has = d.down ? d.down : d.up;
      throw fail(has, std::string("has no ") + (d.down ? "lora_up/lora_B" : "lora_down/lora_A") + " to go with it");
    }
    if (d.alpha && !d.down) throw fail(d.alpha, "is an alpha for a module with no lora_down/lora_up");
    if (d.down) {
      const torch::Tensor &a = d.down.t, &b = d.up.t;
      if (a.dim() != 2) throw fail(d.down, "is " + shape_str(a.sizes()) + ", not a [rank, in] matrix");
      if (b.dim() != 2) throw fail(d.up, "is " + shape_str(b.sizes()) + ", not an [out, rank] matrix");
      const int64_t rank = a.size(0);
      if (b.size(1) != rank)
        throw fail(d.up, "has rank " + std::to_string(b.size(1)) + " but \"" + d.down.key + "\" has rank " +
                             std::to_string(rank));
      if (rank == 0) throw fail(d.down, "has rank 0");
      const torch::Tensor& w = target(d.down, module + ".weight");
      if (w.dim() != 2)
        throw fail(d.down, "edits \"" + module + ".weight\" " + shape_str(w.sizes()) + ", which is not a linear layer");
      if (w.size(0) != b.size(0) || w.size(1) != a.size(1))
        throw fail(d.down, "is a " + shape_str({b.size(0), a.size(1)}) + " update for \"" + module + ".weight\" " +
                               shape_str(w.sizes()) + ": a LoRA for a model of another size");
      double factor = 1.0;
      if (d.alpha) {
        if (d.alpha.t.numel() != 1) throw fail(d.alpha, "is " + shape_str(d.alpha.t.sizes()) + ", not a scalar");
        factor = d.alpha.t.to(torch::kDouble).item<double>() / double(rank);
      } else if (peft.given) {
        if (rank != peft.r)
          throw fail(d.down, "has rank " + std::to_string(rank) +
                                 " but the file's adapter metadata says r=" + std::to_string(peft.r));
        factor = peft.factor();
      }
      const float s = float(lora.scale * factor);
      edits.push_back({module + ".weight", d.up.key,
                       [a, b, s] { return torch::matmul(b.to(torch::kFloat), a.to(torch::kFloat)).mul_(s); }});
    }
    if (d.bias) {
      const torch::Tensor& bias = target(d.bias, module + ".bias");
      if (bias.sizes() != d.bias.t.sizes())
        throw fail(d.bias, "is " + shape_str(d.bias.t.sizes()) + " for \"" + module + ".bias\" " +
                               shape_str(bias.sizes()) + ": a LoRA for a model of another size");
      // PEFT scales lora_B's bias like the product; the original format's alpha is folded into A and B only.
      const double s = lora.scale * (format == Format::peft ? peft.factor() : 1.0);
      const torch::Tensor t = d.bias.t;
      edits.push_back({module + ".bias", d.bias.key, [t, s] { return t.to(torch::kFloat) * float(s); }});
    }
    if (d.diff) {
      // A whole-weight difference: on "<module>.weight", or on the parameter itself (a block's modulation).
      const std::string name = weights.tensors.count(module + ".weight") ? module + ".weight" : module;
      const torch::Tensor& w = target(d.diff, name);
      if (w.sizes() != d.diff.t.sizes())
        throw fail(d.diff, "is " + shape_str(d.diff.t.sizes()) + " for \"" + name + "\" " + shape_str(w.sizes()) +
                               ": a LoRA for a model of another size");
      const torch::Tensor t = d.diff.t;
      const float s = float(lora.scale);
      edits.push_back({name, d.diff.key, [t, s] { return t.to(torch::kFloat) * s; }});
    }
  }
  // Several edits may land on one tensor (a product and a diff, or two LoRAs): each adds to what the previous left.
  for (Edit& e : edits) {
    const std::string from = where + ": \"" + e.key + "\"";
    const double scale = lora.scale;
    weights.updates[e.name].push_back({from, [from, name = e.name, scale, add = std::move(e.add)] {
                                         torch::Tensor t = add();
                                         // Finite factors can still overflow float32 in their product (factors of
                                         // 1e20).
                                         if (!torch::isfinite(t).all().item<bool>())
                                           throw ModelError(from + ": its update of \"" + name +
                                                            "\" overflows float32 at scale " + std::to_string(scale));
                                         return t;
                                       }});
  }
}

}  // namespace latent
