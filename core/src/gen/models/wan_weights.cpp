// Reading a Wan transformer's weights: the diffusers folder's own files, or a checkpoint given in their place in
// diffusers' or Wan-AI's original layout (as the causal Wan family's trainers publish them), then the LoRAs.
#include "gen/models/wan_weights.h"

#include <charconv>
#include <cmath>
#include <map>
#include <set>
#include <stdexcept>
#include <string_view>

#include "gen/models/wan_lora.h"
#include "io/weight_files.h"
#include "latent/io/safetensors.h"

namespace latent {
namespace {

namespace fs = std::filesystem;

// Trainer checkpoints hold the generator's weights beside its EMA and optimizer state; the EMA is what their authors
// sample with.
constexpr std::string_view kContainers[] = {"generator_ema", "generator", "state_dict"};
// What trainers and ComfyUI put before the network's own names ("model.diffusion_model." stacks both).
constexpr std::string_view kPrefixes[] = {"model.", "diffusion_model."};

bool starts_with(std::string_view s, std::string_view p) { return s.substr(0, p.size()) == p; }
bool ends_with(std::string_view s, std::string_view p) {
  return s.size() >= p.size() && s.substr(s.size() - p.size()) == p;
}

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> parts;
  size_t start = 0;
  for (size_t dot; (dot = s.find('.', start)) != std::string::npos; start = dot + 1)
    parts.push_back(s.substr(start, dot - start));
  parts.push_back(s.substr(start));
  return parts;
}

// ".a.b" of parts[i...], empty past the end.
std::string tail(const std::vector<std::string>& parts, size_t i) {
  std::string out;
  for (; i < parts.size(); ++i) out += "." + parts[i];
  return out;
}

bool is_index(const std::string& s) {
  return !s.empty() && s.size() < 6 && s.find_first_not_of("0123456789") == std::string::npos;
}

enum class Layout { neither, diffusers, original };

// Which layout a name (prefix stripped) belongs to by its first components; patch_embedding and the blocks' norm2
// are spelt alike in both.
Layout layout_of(const std::string& name) {
  const auto p = split(name);
  static const std::set<std::string> original_top = {"text_embedding", "time_embedding", "time_projection", "head",
                                                     "img_emb"};
  static const std::set<std::string> diffusers_top = {"condition_embedder", "proj_out", "scale_shift_table"};
  if (original_top.count(p[0])) return Layout::original;
  if (diffusers_top.count(p[0])) return Layout::diffusers;
  if (p[0] == "blocks" && p.size() >= 3 && is_index(p[1])) {
    const std::string& m = p[2];
    if (m == "self_attn" || m == "cross_attn" || m == "modulation" || m == "norm3") return Layout::original;
    if (m == "ffn" && p.size() >= 4) return p[3] == "net" ? Layout::diffusers : Layout::original;
    if (m == "attn1" || m == "attn2" || m == "scale_shift_table") return Layout::diffusers;
  }
  return Layout::neither;
}

constexpr const char* kImageConditioning =
    "image conditioning (Wan 2.1 image-to-video's CLIP image embedding and image cross-attention) is not supported";

}  // namespace

Renamed original_to_diffusers(const std::string& path) {
  const auto p = split(path);
  const size_t n = p.size();
  auto ok = [](std::string name) { return Renamed{std::move(name), {}}; };
  if (p[0] == "patch_embedding") return ok(path);
  if ((p[0] == "text_embedding" || p[0] == "time_embedding") && n >= 2 && (p[1] == "0" || p[1] == "2"))
    return ok(std::string("condition_embedder.") + (p[0] == "text_embedding" ? "text_embedder" : "time_embedder") +
              ".linear_" + (p[1] == "0" ? "1" : "2") + tail(p, 2));
  if (p[0] == "time_projection" && n >= 2 && p[1] == "1") return ok("condition_embedder.time_proj" + tail(p, 2));
  if (p[0] == "head" && n >= 2 && p[1] == "head") return ok("proj_out" + tail(p, 2));
  if (p[0] == "head" && n == 2 && p[1] == "modulation") return ok("scale_shift_table");
  if (p[0] == "img_emb") return {{}, kImageConditioning};
  if (p[0] == "blocks" && n >= 3 && is_index(p[1])) {
    const std::string block = "blocks." + p[1] + ".";
    const std::string& m = p[2];
    if (m == "modulation" && n == 3) return ok(block + "scale_shift_table");
    // The original calls its norms in the order norm1, norm3 (cross-attention, the only one with parameters),
    // norm2; diffusers numbers them in order of use.
    if (m == "norm3") return ok(block + "norm2" + tail(p, 3));
    if ((m == "self_attn" || m == "cross_attn") && n >= 4) {
      const std::string attn = block + (m == "self_attn" ? "attn1." : "attn2.");
      static const std::map<std::string, std::string> proj = {
          {"q", "to_q"}, {"k", "to_k"}, {"v", "to_v"}, {"o", "to_out.0"}, {"norm_q", "norm_q"}, {"norm_k", "norm_k"}};
      if (auto it = proj.find(p[3]); it != proj.end()) return ok(attn + it->second + tail(p, 4));
      if (m == "cross_attn" && (p[3] == "k_img" || p[3] == "v_img" || p[3] == "norm_k_img"))
        return {{}, kImageConditioning};
    }
    if (m == "ffn" && n >= 4 && p[3] == "0") return ok(block + "ffn.net.0.proj" + tail(p, 4));
    if (m == "ffn" && n >= 4 && p[3] == "2") return ok(block + "ffn.net.2" + tail(p, 4));
  }
  return {{}, "has no counterpart in diffusers' WanTransformer3DModel"};
}

namespace {

// `file` as tensors: safetensors (a *.safetensors.index.json names shards beside it), a torch checkpoint, or a
// diffusers transformer folder. `where` receives how to name the source in errors.
WeightSource read_checkpoint(const fs::path& file, std::string& where) {
  std::error_code ec;
  if (!fs::exists(file, ec)) throw ModelError(file.string() + ": no such file or directory");
  where = file.string();
  const std::string name = file.filename().string();
  const std::string ext = file.extension().string();
  constexpr std::string_view kIndex = ".safetensors.index.json";
  try {
    if (fs::is_directory(file, ec)) return read_safetensors_folder(file, "diffusion_pytorch_model");
    if (ends_with(name, kIndex))
      return read_safetensors_folder(file.parent_path(), name.substr(0, name.size() - kIndex.size()));
    if (ext == ".pt" || ext == ".pth" || ext == ".ckpt") {
      std::string container;
      WeightSource src = read_torch_checkpoint(file, kContainers, &container);
      where += container.empty() ? " (its top-level dict)" : " (its \"" + container + "\" dict)";
      src.weights = where;
      return src;
    }
    if (ext != ".safetensors")
      throw ModelError(where + ": not a weights file (.safetensors, a .safetensors.index.json, .pt, .pth or .ckpt)");
    auto st = SafetensorsFile::open(file);
    WeightSource src;
    src.weights = file;
    src.metadata = st.metadata();
    for (const auto& n : st.names()) src.tensors.emplace(n, st.tensor(n));
    src.mapped.push_back(st.mapping());
    return src;
  } catch (const SafetensorsError& e) {
    throw ModelError(e.what());
  }
}

// The names under diffusers' spelling: prefixes stripped, the original layout renamed. Tensors stay the same
// views, so nothing is copied.
WeightSource to_diffusers_names(WeightSource src, const std::string& where) {
  std::map<std::string, torch::Tensor> stripped;
  std::map<std::string, std::string> from;  // stripped name -> name in the file
  std::string first[3];                     // a name of each layout, for the error
  for (auto& [key, t] : src.tensors) {
    std::string_view k = key;
    for (bool again = true; again;) {
      again = false;
      for (std::string_view pre : kPrefixes)
        if (starts_with(k, pre)) k.remove_prefix(pre.size()), again = true;
    }
    const std::string name(k);
    if (auto [it, fresh] = from.emplace(name, key); !fresh)
      throw ModelError(where + ": \"" + key + "\" and \"" + it->second + "\" are the same tensor \"" + name +
                       "\" once the prefix is stripped");
    auto& f = first[int(layout_of(name))];
    if (f.empty()) f = key;
    stripped.emplace(name, std::move(t));
  }
  const std::string& diff = first[int(Layout::diffusers)];
  const std::string& orig = first[int(Layout::original)];
  if (!diff.empty() && !orig.empty())
    throw ModelError(where + ": mixes diffusers' names (\"" + diff + "\") with Wan's original ones (\"" + orig +
                     "\"); a checkpoint must use one layout");
  src.tensors.clear();
  if (orig.empty()) {
    src.tensors = std::move(stripped);
    return src;
  }
  for (auto& [name, t] : stripped) {
    Renamed r = original_to_diffusers(name);
    if (r.name.empty()) throw ModelError(where + ": \"" + from[name] + "\": " + r.problem);
    if (auto [it, fresh] = src.tensors.emplace(r.name, std::move(t)); !fresh)
      throw ModelError(where + ": \"" + from[name] + "\" is a second tensor for \"" + r.name + "\"");
  }
  return src;
}

}  // namespace

WeightSource wan_transformer_weights(const fs::path& folder, const WeightEdits& edits) {
  WeightSource src;
  if (edits.transformer_weights.empty()) {
    src = read_safetensors_folder(folder, "diffusion_pytorch_model");
  } else {
    std::string where;
    src = read_checkpoint(edits.transformer_weights, where);
    src = to_diffusers_names(std::move(src), where);
  }
  for (const LoraFile& lora : edits.loras) merge_lora(src, lora);
  return src;
}

std::vector<LoraFile> parse_lora_list(const std::string& text) {
  std::vector<LoraFile> out;
  if (text.find_first_not_of(" \t") == std::string::npos) return out;
  size_t start = 0;
  for (int n = 1;; ++n) {
    const size_t comma = text.find(',', start);
    std::string entry = text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    const size_t b = entry.find_first_not_of(" \t"), e = entry.find_last_not_of(" \t");
    entry = b == std::string::npos ? std::string() : entry.substr(b, e - b + 1);
    const std::string label = "lora entry " + std::to_string(n) + " \"" + entry + "\"";
    if (entry.empty()) throw std::invalid_argument(label + " is empty (expected FILE or FILE:SCALE)");
    LoraFile f{entry, 1.0};
    // The last ':' starts a scale only where a number follows, so a path may hold ':' itself.
    if (const size_t colon = entry.rfind(':'); colon != std::string::npos) {
      const std::string scale = entry.substr(colon + 1);
      double v = 0;
      const char* first = scale.data() + (starts_with(scale, "+") ? 1 : 0);
      const auto [end, ec] = std::from_chars(first, scale.data() + scale.size(), v);
      const bool numeric = ec == std::errc() && end == scale.data() + scale.size() && first != end;
      const bool looks_numeric =
          scale.empty() || (scale.find_first_of("0123456789+-.") == 0 && scale.find('/') == std::string::npos);
      if (numeric && !std::isfinite(v)) throw std::invalid_argument(label + ": the scale is not a finite number");
      if (!numeric && looks_numeric) throw std::invalid_argument(label + ": \"" + scale + "\" is not a number");
      if (numeric) {
        f.path = entry.substr(0, colon);
        f.scale = v;
      }
    }
    if (f.path.empty()) throw std::invalid_argument(label + " has no file");
    out.push_back(std::move(f));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

}  // namespace latent
