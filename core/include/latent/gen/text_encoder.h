// Prompt embeddings computed natively from a diffusers pipeline folder, as the pipeline itself computes them.
//
// Today: the Wan 2.1 pipelines (text_encoder/ UMT5EncoderModel, tokenizer/spiece.model): the prompt is cleaned
// as diffusers' prompt_clean does without ftfy (html.unescape twice, whitespace runs to one space), tokenised by
// the sentencepiece library as transformers' tokenizer does (added tokens such as </s> recognised, end of
// sequence appended, cut to max_length), encoded, and the rows past the prompt's tokens set to zero.
#pragma once
#include <torch/types.h>

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

namespace latent {

class TextEncoder {
 public:
  struct Options {
    // Where the encoder runs and the dtype of its weights and output. The pipelines run their text encoders in
    // the weights' dtype; float32 on the CPU gives embeddings within float32 rounding of transformers'.
    torch::Device device = torch::kCPU;
    torch::ScalarType dtype = torch::kFloat32;
    // The pipeline's max_sequence_length: 512 for Wan 2.1.
    int64_t max_length = 512;
    // Run the padding tokens through the encoder too, as the pipeline does. Their keys are masked, so the prompt's
    // rows do not depend on them mathematically; running them only changes rounding, which matters in bf16 and
    // fp16 (identical to transformers with it, about one bf16 step apart without) at max_length / tokens times
    // the compute. In float32 both agree with transformers to ~1e-6.
    bool run_padding = false;
  };

  // Whether this build can tokenise (it links the sentencepiece library); load() throws where it cannot.
  static bool tokenizer_available();

  // `pipeline_dir` is a diffusers pipeline folder (model_index.json optional) with text_encoder/ and tokenizer/.
  // Throws ModelError naming the folder, file and key of each problem.
  static std::unique_ptr<TextEncoder> load(const std::filesystem::path& pipeline_dir, const Options& options);
  static std::unique_ptr<TextEncoder> load(const std::filesystem::path& pipeline_dir) {
    return load(pipeline_dir, Options{});
  }

  virtual ~TextEncoder() = default;

  // The ids the model sees for `prompt`: cleaned, tokenised, cut, end of sequence appended; no padding.
  virtual std::vector<int64_t> tokenize(const std::string& prompt) const = 0;

  // [1, max_length, dim()] in the options' dtype, on its device.
  virtual torch::Tensor encode(const std::string& prompt) = 0;

  // Frees the weights (and their file mappings), e.g. once the prompts are encoded and before denoising starts;
  // encode() throws afterwards, tokenize() still works.
  virtual void release() = 0;

  virtual int64_t dim() const = 0;
  virtual int64_t max_length() const = 0;
};

}  // namespace latent
