// Prompt embeddings computed natively from a diffusers pipeline folder, as the pipeline itself computes them.
//
// Two families, told apart by model_index.json's "_class_name" or, without one, text_encoder/config.json's
// "model_type"; both tokenise with the folder's tokenizer/spiece.model through the sentencepiece library as
// transformers' tokenizer does (added tokens such as </s> recognised, end of sequence appended, cut to max_length):
//  - Wan (Wan*Pipeline, text_encoder/ UMT5EncoderModel): the prompt is cleaned as diffusers' prompt_clean does
//    without ftfy (html.unescape twice, whitespace runs to one space), encoded with the padding keys masked, and
//    the rows past the prompt's tokens set to zero.
//  - CogVideoX (CogVideoX*Pipeline, text_encoder/ T5EncoderModel): the prompt is taken as written, padded to
//    max_length and the whole padded sequence encoded with no mask, so the padding is attended and its rows are
//    kept, as CogVideoXPipeline._get_t5_prompt_embeds does.
#pragma once
#include <torch/types.h>

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

namespace latent {

class TextEncoder {
 public:
  enum class Family { Wan, CogVideoX };

  struct Options {
    // Where the encoder runs and the dtype of its weights and output. The pipelines run their text encoders in
    // the weights' dtype; float32 on the CPU gives embeddings within float32 rounding of transformers'.
    torch::Device device = torch::kCPU;
    torch::ScalarType dtype = torch::kFloat32;
    // The pipeline's max_sequence_length; 0 for the pipeline's default: 512 for Wan, 226 for CogVideoX.
    int64_t max_length = 0;
    // Wan only: run the padding tokens through the encoder too, as the pipeline does. Their keys are masked, so
    // the prompt's rows do not depend on them mathematically; running them only changes rounding, which matters
    // in bf16 and fp16 (identical to transformers with it, about one bf16 step apart without) at max_length /
    // tokens times the compute. In float32 both agree with transformers to ~1e-6. CogVideoX always runs them:
    // there the prompt's rows do depend on the padding.
    bool run_padding = false;
  };

  // Whether this build can tokenise (it links the sentencepiece library); load() throws where it cannot.
  static bool tokenizer_available();

  // `pipeline_dir` is a diffusers pipeline folder (model_index.json optional) with text_encoder/ and tokenizer/.
  // Throws ModelError naming the folder, file and key of each problem, and what was found where the folder is
  // neither family's.
  static std::unique_ptr<TextEncoder> load(const std::filesystem::path& pipeline_dir, const Options& options);
  static std::unique_ptr<TextEncoder> load(const std::filesystem::path& pipeline_dir) {
    return load(pipeline_dir, Options{});
  }

  // Encoders loaded by this process so far: loading umT5-XXL reads 11 GB, which a live element does once.
  static uint64_t loads() { return loads_.load(std::memory_order_relaxed); }

  virtual ~TextEncoder() = default;

  // The prompt's ids: cleaned (Wan), tokenised, cut to max_length() with the end of sequence last; no padding.
  virtual std::vector<int64_t> tokenize(const std::string& prompt) const = 0;

  // [1, max_length(), dim()] in the options' dtype, on its device.
  virtual torch::Tensor encode(const std::string& prompt) = 0;

  // Frees the weights (and their file mappings), e.g. once the prompts are encoded and before denoising starts;
  // encode() throws afterwards, tokenize() still works.
  virtual void release() = 0;

  virtual int64_t dim() const = 0;
  // The max_length in use: the option's, or the family's default where it is 0.
  virtual int64_t max_length() const = 0;
  virtual Family family() const = 0;

 private:
  static std::atomic<uint64_t> loads_;
};

}  // namespace latent
