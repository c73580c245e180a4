// latent-prompt: a prompt to the embeddings file videogen's prompt-embeds takes, computed by a diffusers pipeline
// folder's own text encoder exactly as videogen's prompt property computes them (both call latent::encode_prompts).
// For .pt2 models, which carry no text encoder, and for encoding a prompt once for many runs.
#include <cstdio>
#include <cstring>
#include <exception>
#include <optional>
#include <string>
#include <vector>

#include "latent/gen/prompts.h"
#include "latent/io/safetensors.h"
#include "latent/runtime/devices.h"

namespace {

constexpr const char* kUsage =
    "usage: latent-prompt MODEL_DIR PROMPT [--negative TEXT] [--device DEV] [--dtype T] OUT.safetensors\n"
    "  MODEL_DIR   a diffusers pipeline folder with text_encoder/ and tokenizer/ (Wan 2.1, CogVideoX)\n"
    "  --negative  also write negative_prompt_embeds for TEXT (\"\" is the empty prompt diffusers uses)\n"
    "  --device    where the text encoder runs: cpu (default), cuda, cuda:N\n"
    "  --dtype     float32 (default on the CPU), bfloat16 or float16; what videogen uses with the same\n"
    "              device and dtype. Writes prompt_embeds [1, L, D] (+ negative_prompt_embeds) in that dtype.\n";

struct Args {
  std::string model, prompt, out;
  std::optional<std::string> negative;
  std::string device = "cpu", dtype = "auto";
};

// Parses the command line; nullopt (after printing why) when it does not fit the usage.
std::optional<Args> parse(int argc, char** argv) {
  Args a;
  std::vector<std::string> positional;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const auto value = [&](const char* flag) -> std::optional<std::string> {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "latent-prompt: %s needs a value\n", flag);
        return std::nullopt;
      }
      return std::string(argv[++i]);
    };
    if (arg == "--negative" || arg == "--device" || arg == "--dtype") {
      auto v = value(arg.c_str());
      if (!v) return std::nullopt;
      if (arg == "--negative")
        a.negative = *v;
      else if (arg == "--device")
        a.device = *v;
      else
        a.dtype = *v;
    } else if (arg.size() > 2 && arg.rfind("--", 0) == 0) {
      std::fprintf(stderr, "latent-prompt: unknown option %s\n", arg.c_str());
      return std::nullopt;
    } else {
      positional.push_back(arg);
    }
  }
  if (positional.size() != 3) {
    std::fprintf(stderr, "latent-prompt: expected MODEL_DIR, PROMPT and OUT, got %zu arguments\n", positional.size());
    return std::nullopt;
  }
  a.model = positional[0];
  a.prompt = positional[1];
  a.out = positional[2];
  return a;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 2 && (std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0)) {
    std::fputs(kUsage, stdout);
    return 0;
  }
  const std::optional<Args> args = parse(argc, argv);
  if (!args) {
    std::fputs(kUsage, stderr);
    return 2;
  }
  try {
    latent::TextEncoder::Options options;
    options.device = latent::resolve_device(args->device);
    options.dtype = latent::resolve_dtype(args->dtype, options.device);
    const latent::PromptEmbeddings e = latent::encode_prompts(args->model, args->prompt, args->negative, options);
    latent::SafetensorsWriter writer(args->out);
    writer.set_metadata("model", args->model);
    writer.set_metadata("prompt", args->prompt);
    if (args->negative) writer.set_metadata("negative_prompt", *args->negative);
    writer.write("prompt_embeds", e.prompt);
    if (e.negative.defined()) writer.write("negative_prompt_embeds", e.negative);
    writer.commit();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "latent-prompt: %s\n", e.what());
    return 1;
  }
  return 0;
}
