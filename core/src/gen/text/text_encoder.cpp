#include "latent/gen/text_encoder.h"

#include <torch/types.h>

#include <optional>

#include "gen/text/prompt_clean.h"
#include "gen/text/t5_encoder.h"
#include "gen/text/t5_tokenizer.h"
#include "io/json.h"
#include "io/weight_files.h"
#include "latent/io/weights.h"

namespace fs = std::filesystem;

namespace latent {
namespace {

using Family = TextEncoder::Family;

// The pipelines' max_sequence_length defaults (WanPipeline.__call__, CogVideoXPipeline.__call__).
int64_t default_max_length(Family f) { return f == Family::Wan ? 512 : 226; }

bool starts_ends(const std::string& s, const std::string& head, const std::string& tail) {
  return s.size() >= head.size() + tail.size() && s.compare(0, head.size(), head) == 0 &&
         s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

json::Value read_json(const fs::path& path) {
  try {
    json::Value doc = json::parse(read_text_file(path));
    if (!doc.is_object()) throw json::Error("not a JSON object");
    return doc;
  } catch (const json::Error& e) {
    throw ModelError(path.string() + ": " + e.what());
  }
}

// The string at `key`, or "" where it is absent; anything else there is an error naming the key.
std::string string_at(const json::Value& doc, const char* key, const fs::path& where) {
  const json::Value* v = doc.find(key);
  if (!v) return {};
  if (!v->is_string()) throw ModelError(where.string() + ": \"" + key + "\" is not a string");
  return v->as_string();
}

// model_index.json names the pipeline; folders without one (a bare text_encoder/ + tokenizer/ pair) are told
// apart by the encoder they hold. Where both are there they must agree: a Wan prompt path over a T5 encoder, or
// the reverse, is a mixed-up folder, not a model either pipeline runs.
Family detect_family(const fs::path& dir) {
  const fs::path config = dir / "text_encoder" / "config.json";
  if (!fs::exists(config)) throw ModelError((dir / "text_encoder").string() + ": folder has no config.json");
  const std::string model_type = string_at(read_json(config), "model_type", config);
  std::optional<Family> by_encoder;
  if (model_type == "umt5") by_encoder = Family::Wan;
  if (model_type == "t5") by_encoder = Family::CogVideoX;

  const fs::path index = dir / "model_index.json";
  std::string class_name;
  if (fs::exists(index)) class_name = string_at(read_json(index), "_class_name", index);
  if (class_name.empty()) {
    if (!by_encoder)
      throw ModelError(config.string() + ": \"model_type\" is " +
                       (model_type.empty() ? std::string("absent") : "\"" + model_type + "\"") +
                       "; the text encoders read are \"umt5\" (Wan) and \"t5\" (CogVideoX)");
    return *by_encoder;
  }
  std::optional<Family> by_pipeline;
  if (starts_ends(class_name, "Wan", "Pipeline")) by_pipeline = Family::Wan;
  if (starts_ends(class_name, "CogVideoX", "Pipeline")) by_pipeline = Family::CogVideoX;
  if (!by_pipeline)
    throw ModelError(index.string() + ": \"_class_name\" is \"" + class_name +
                     "\"; the text encoders read are those of the Wan*Pipeline and CogVideoX*Pipeline folders");
  if (by_encoder != by_pipeline)
    throw ModelError(dir.string() + ": model_index.json's \"_class_name\" is \"" + class_name +
                     "\" but text_encoder/config.json's \"model_type\" is \"" + model_type + "\" (expected \"" +
                     (*by_pipeline == Family::Wan ? "umt5" : "t5") + "\")");
  return *by_pipeline;
}

class PipelineTextEncoder final : public TextEncoder {
 public:
  PipelineTextEncoder(const fs::path& dir, Family family, const Options& options)
      : family_(family),
        max_length_(options.max_length == 0 ? default_max_length(family) : options.max_length),
        run_padding_(options.run_padding) {
    if (max_length_ < 1) throw ModelError("text encoder: max_length must be at least 1 (or 0 for the pipeline's)");
    tokenizer_ = T5Tokenizer::load(dir / "tokenizer");
    encoder_ = std::make_unique<T5Encoder>(dir / "text_encoder", options.device, options.dtype);
    dim_ = encoder_->config().d_model;
    if (tokenizer_->vocab_size() > encoder_->config().vocab_size)
      throw ModelError(dir.string() + ": the tokenizer has " + std::to_string(tokenizer_->vocab_size()) +
                       " tokens, the text encoder's vocab_size is " + std::to_string(encoder_->config().vocab_size));
  }

  // Reads no more of a long prompt than the max_length - 1 ids kept depend on (T5Tokenizer::encode_for_model).
  std::vector<int64_t> tokenize(const std::string& prompt) const override {
    if (family_ == Family::CogVideoX) return tokenizer_->encode_for_model(prompt, max_length_, raw_input_prefix);
    return tokenizer_->encode_for_model(prompt, max_length_, wan_prompt_clean_prefix);
  }

  torch::Tensor encode(const std::string& prompt) override {
    auto ids = tokenize(prompt);
    const auto n = static_cast<int64_t>(ids.size());
    auto t = torch::tensor(ids, torch::kLong).view({1, n});
    auto padded = [&] {
      auto p = torch::full({1, max_length_}, tokenizer_->pad_id(), torch::kLong);
      p.narrow(1, 0, n).copy_(t);
      return p;
    };
    // CogVideoX attends to its padding, so every row depends on it: the full padded sequence, unmasked.
    if (family_ == Family::CogVideoX) return encoder_->forward(padded());
    // Wan: by default only the prompt's own tokens go through the encoder: the pipeline pads to max_length, but
    // the padding keys are masked out, so the real rows do not depend on them, and it zeroes the padding rows.
    torch::Tensor h;
    if (run_padding_) {
      auto mask = torch::zeros({1, max_length_}, torch::kLong);
      mask.narrow(1, 0, n).fill_(1);
      h = encoder_->forward(padded(), mask).narrow(1, 0, n);
    } else {
      h = encoder_->forward(t);
    }
    auto out = torch::zeros({1, max_length_, dim_}, h.options());
    out.narrow(1, 0, n).copy_(h);
    return out;
  }

  void release() override { encoder_->release(); }
  int64_t dim() const override { return dim_; }
  int64_t max_length() const override { return max_length_; }
  Family family() const override { return family_; }

 private:
  Family family_;
  int64_t max_length_;
  bool run_padding_;
  int64_t dim_ = 0;
  std::unique_ptr<T5Tokenizer> tokenizer_;
  std::unique_ptr<T5Encoder> encoder_;
};

}  // namespace

bool TextEncoder::tokenizer_available() { return T5Tokenizer::available(); }

std::unique_ptr<TextEncoder> TextEncoder::load(const fs::path& dir, const Options& options) {
  if (!fs::is_directory(dir)) throw ModelError(dir.string() + ": no such folder");
  if (!fs::is_directory(dir / "text_encoder")) throw ModelError(dir.string() + ": no text_encoder/ folder");
  if (!fs::is_directory(dir / "tokenizer")) throw ModelError(dir.string() + ": no tokenizer/ folder");
  auto encoder = std::make_unique<PipelineTextEncoder>(dir, detect_family(dir), options);
  loads_.fetch_add(1, std::memory_order_relaxed);
  return encoder;
}

std::atomic<uint64_t> TextEncoder::loads_{0};

}  // namespace latent
