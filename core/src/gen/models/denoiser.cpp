// The checked entry of every denoiser and the choice of backend by file.
#include "latent/gen/denoiser.h"

#include <torch/utils.h>

#include <sstream>

#include "gen/models/backends.h"
#include "io/numbers.h"
#include "latent/io/weights.h"
#include "latent/parallel/comm.h"

namespace latent {
namespace {

std::string shape_text(const torch::Tensor& t) {
  std::ostringstream s;
  s << t.sizes();
  return s.str();
}

[[noreturn]] void reject(const std::string& what, const torch::Tensor& got, const std::string& expected) {
  throw std::invalid_argument("denoiser input " + what + ": got " + (got.defined() ? shape_text(got) : "none") +
                              ", expected " + expected);
}

void check_latents(const DenoiserSpec& spec, const torch::Tensor& x) {
  const std::string expected =
      "[1, " + std::to_string(spec.channels) + ", T, h, w] with " + std::to_string(spec.min_frames) +
      " <= T <= " + std::to_string(spec.window) +
      (spec.height > 0 ? ", h = " + std::to_string(spec.height) + ", w = " + std::to_string(spec.width)
                       : ", h and w multiples of " + std::to_string(spec.size_multiple));
  if (!x.defined() || x.dim() != 5 || x.size(0) != 1 || x.size(1) != spec.channels) reject("latents", x, expected);
  const int64_t t = x.size(2), h = x.size(3), w = x.size(4);
  if (t < spec.min_frames || t > spec.window) reject("latents", x, expected);
  if (spec.height > 0 ? (h != spec.height || w != spec.width)
                      : (h <= 0 || w <= 0 || h % spec.size_multiple != 0 || w % spec.size_multiple != 0))
    reject("latents", x, expected);
  if (!x.is_floating_point()) reject("latents (not floating point)", x, expected);
}

// The native diffusers transformers by their config's "_class_name".
struct DiffusersFamily {
  const char* config_class;
  std::shared_ptr<Denoiser> (*load)(const DiffusersFolder&, const LoadOptions&, const DenoiserFiles&);
};
constexpr DiffusersFamily kDiffusersFamilies[] = {
    {"WanTransformer3DModel", load_wan_transformer},
    {"CogVideoXTransformer3DModel", load_cogvideox_transformer},
};

}  // namespace

void read_optional_contract(DenoiserSpec& spec, const MetadataLookup& find, const std::string& where,
                            const std::string& prefix) {
  const auto integer = [&](const std::string& name, int64_t fallback, int64_t lo, int64_t hi) {
    const std::string* text = find(prefix + name);
    if (!text) return fallback;
    if (auto v = bounded_integer(*text, lo, hi)) return *v;
    throw ModelError(where + ": metadata \"" + prefix + name + "\" = \"" + *text + "\" is not an integer in [" +
                     std::to_string(lo) + ", " + std::to_string(hi) + "]");
  };
  spec.temporal_factor = integer("temporal_factor", spec.temporal_factor, 1, 64);
  spec.spatial_factor = integer("spatial_factor", spec.spatial_factor, 1, 64);
  constexpr int64_t kMaxSide = 1 << 16;
  spec.native_height = integer("native_height", spec.native_height, 1, kMaxSide);
  spec.native_width = integer("native_width", spec.native_width, 1, kMaxSide);
  if ((spec.native_height > 0) != (spec.native_width > 0))
    throw ModelError(where + ": metadata has one of \"" + prefix + "native_height\" and \"" + prefix +
                     "native_width\" without the other");
}

template <typename Body>
torch::Tensor Denoiser::checked(const torch::Tensor& x, const torch::Tensor& timesteps, const torch::Tensor& text,
                                Body&& body) const {
  // Inference only: a model whose parameters track gradients would otherwise chain every frame's graph to the
  // frames before it, and memory would grow with the length.
  torch::NoGradGuard no_grad;
  check_latents(spec_, x);
  const int64_t frames = x.size(2);
  if (!timesteps.defined() || timesteps.dim() != 2 || timesteps.size(0) != 1 || timesteps.size(1) != frames)
    reject("timesteps", timesteps, "[1, " + std::to_string(frames) + "], one per latent frame");
  // A model conditioned on one timestep for the whole clip would silently take one frame's for all of them.
  if (!spec_.per_frame_timesteps && frames > 1) {
    const torch::Tensor t = timesteps.to(torch::kCPU, torch::kDouble);
    if (!torch::equal(t, t.select(1, 0).unsqueeze(1).expand_as(t)))
      throw std::invalid_argument("denoiser input timesteps: this model (" + spec_.backend +
                                  ") takes one timestep for all its frames, got different values per frame");
  }
  if (spec_.text_tokens > 0) {
    const std::string expected =
        "[1, " + std::to_string(spec_.text_tokens) + ", " + std::to_string(spec_.text_dim) + "] prompt embeddings";
    if (!text.defined() || text.dim() != 3 || text.size(0) != 1 || text.size(1) != spec_.text_tokens ||
        text.size(2) != spec_.text_dim || !text.is_floating_point())
      reject("text", text, expected);
  } else if (text.defined()) {
    reject("text", text, "none: this model takes no text conditioning");
  }
  const auto on_model = [&](const torch::Tensor& t, torch::ScalarType dtype) {
    return t.to(options_.device, dtype).contiguous();
  };
  torch::Tensor out = body(on_model(x, options_.dtype), on_model(timesteps, torch::kFloat),
                           text.defined() ? on_model(text, options_.dtype) : text);
  if (!out.defined() || out.sizes() != x.sizes())
    throw std::runtime_error("denoiser (" + spec_.backend + ") returned " + (out.defined() ? shape_text(out) : "none") +
                             " for latents " + shape_text(x));
  return out.to(torch::kFloat);
}

torch::Tensor Denoiser::predict(const torch::Tensor& x, const torch::Tensor& timesteps,
                                const torch::Tensor& text) const {
  return checked(x, timesteps, text, [&](const torch::Tensor& xm, const torch::Tensor& tm, const torch::Tensor& cm) {
    return run(xm, tm, cm);
  });
}

torch::Tensor Denoiser::predict(const torch::Tensor& x, const torch::Tensor& timesteps, const torch::Tensor& text,
                                parallel::Communicator* sequence_group) const {
  if (!sequence_group || sequence_group->size() == 1) return predict(x, timesteps, text);
  const int64_t degree = sequence_group->size(), heads = attention_heads();
  if (heads <= 0)
    throw std::invalid_argument("sequence parallel: this model (" + spec_.backend +
                                ") cannot share a prediction over a group; use a group of one");
  if (heads % degree != 0) {
    std::string valid;
    for (int64_t d = 1; d <= heads; ++d)
      if (heads % d == 0) valid += (valid.empty() ? "" : ", ") + std::to_string(d);
    throw std::invalid_argument("sequence parallel over " + std::to_string(degree) + " ranks: the ranks split the " +
                                std::to_string(heads) + " attention heads of this model (" + spec_.backend +
                                "), so their number must divide it; valid: " + valid);
  }
  return checked(x, timesteps, text, [&](const torch::Tensor& xm, const torch::Tensor& tm, const torch::Tensor& cm) {
    return run_sequence_parallel(xm, tm, cm, *sequence_group);
  });
}

torch::Tensor Denoiser::run_sequence_parallel(const torch::Tensor&, const torch::Tensor&, const torch::Tensor&,
                                              parallel::Communicator&) const {
  throw std::logic_error("denoiser (" + spec_.backend + ") declares attention heads but has no sequence parallel run");
}

std::shared_ptr<Denoiser> load_denoiser(const std::filesystem::path& path, const LoadOptions& options,
                                        const DenoiserFiles& files) {
  if (is_diffusers_folder(path)) {
    const DiffusersFolder folder = read_diffusers_folder(path);
    std::string known;
    for (const auto& family : kDiffusersFamilies) {
      if (folder.transformer_class == family.config_class) return family.load(folder, options, files);
      known += (known.empty() ? "" : ", ") + std::string(family.config_class);
    }
    throw ModelError(folder.config_file.string() + ": transformer \"" + folder.transformer_class +
                     "\" is not supported natively (supported: " + known + ")");
  }
  if (!files.first.empty() || !files.second.empty())
    throw ModelError(path.string() + ": transformer weights and LoRAs apply to diffusers Wan folders only");
  if (path.extension() == ".pt2") return load_aoti_denoiser(path, options);
  WeightSource src = read_weights(path);
  if (is_small_denoiser(src)) return make_small_denoiser(src, options);
  throw ModelError(path.string() +
                   ": not a denoiser gst-latent knows: expected a .pt2 package (tools/export_denoiser.py), a diffusers "
                   "Wan 2.1 or CogVideoX folder (model_index.json + transformer/) or native weights with __metadata__ "
                   "\"architecture\" = \"latent-gen-small\"");
}

}  // namespace latent
