#include "latent/gen/text_encoder.h"

#include <torch/torch.h>

#include "gen/prompt_clean.h"
#include "gen/t5_tokenizer.h"
#include "gen/umt5_encoder.h"
#include "latent/io/weights.h"

namespace fs = std::filesystem;

namespace latent {
namespace {

class WanTextEncoder final : public TextEncoder {
 public:
  WanTextEncoder(const fs::path& dir, const Options& options)
      : max_length_(options.max_length), run_padding_(options.run_padding) {
    if (max_length_ < 1) throw ModelError("text encoder: max_length must be at least 1");
    tokenizer_ = T5Tokenizer::load(dir / "tokenizer");
    encoder_ = std::make_unique<Umt5Encoder>(dir / "text_encoder", options.device, options.dtype);
    dim_ = encoder_->config().d_model;
    if (tokenizer_->vocab_size() > encoder_->config().vocab_size)
      throw ModelError(dir.string() + ": the tokenizer has " + std::to_string(tokenizer_->vocab_size()) +
                       " tokens, the text encoder's vocab_size is " + std::to_string(encoder_->config().vocab_size));
  }

  std::vector<int64_t> tokenize(const std::string& prompt) const override {
    return tokenizer_->encode_for_model(wan_prompt_clean(prompt), max_length_);
  }

  torch::Tensor encode(const std::string& prompt) override {
    auto ids = tokenize(prompt);
    const auto n = static_cast<int64_t>(ids.size());
    // By default only the prompt's own tokens go through the encoder: the pipeline pads to max_length, but the
    // padding keys are masked out, so the real rows do not depend on them, and it zeroes the padding rows after.
    auto t = torch::tensor(ids, torch::kLong).view({1, n});
    torch::Tensor h;
    if (run_padding_) {
      auto padded = torch::full({1, max_length_}, tokenizer_->pad_id(), torch::kLong);
      padded.narrow(1, 0, n).copy_(t);
      auto mask = torch::zeros({1, max_length_}, torch::kLong);
      mask.narrow(1, 0, n).fill_(1);
      h = encoder_->forward(padded, mask).narrow(1, 0, n);
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

 private:
  int64_t max_length_;
  bool run_padding_;
  int64_t dim_ = 0;
  std::unique_ptr<T5Tokenizer> tokenizer_;
  std::unique_ptr<Umt5Encoder> encoder_;
};

}  // namespace

bool TextEncoder::tokenizer_available() { return T5Tokenizer::available(); }

std::unique_ptr<TextEncoder> TextEncoder::load(const fs::path& dir, const Options& options) {
  if (!fs::is_directory(dir)) throw ModelError(dir.string() + ": no such folder");
  if (!fs::is_directory(dir / "text_encoder")) throw ModelError(dir.string() + ": no text_encoder/ folder");
  if (!fs::is_directory(dir / "tokenizer")) throw ModelError(dir.string() + ": no tokenizer/ folder");
  return std::make_unique<WanTextEncoder>(dir, options);
}

}  // namespace latent
