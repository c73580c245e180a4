// T5 / umT5 tokenisation as transformers does it for a diffusers pipeline's tokenizer/ folder: the folder's
// spiece.model through the sentencepiece library, with the added tokens (<pad>, </s>, <extra_id_N>, ...) of
// tokenizer.json (or tokenizer_config.json) recognised in the text first, as transformers' AutoTokenizer does,
// and each stretch between them encoded on its own.
#pragma once
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

namespace latent {

class T5Tokenizer {
 public:
  // False where the core was built without the sentencepiece library.
  static bool available();
  // Throws ModelError naming the folder and what is missing or unreadable.
  static std::unique_ptr<T5Tokenizer> load(const std::filesystem::path& tokenizer_dir);
  virtual ~T5Tokenizer() = default;

  // Ids without the end-of-sequence token; `text` must be valid UTF-8.
  virtual std::vector<int64_t> encode(const std::string& text) const = 0;
  // encode(), cut to max_length - 1 ids, then the end-of-sequence id: transformers' truncation=True with
  // add_special_tokens=True.
  std::vector<int64_t> encode_for_model(const std::string& text, int64_t max_length) const;

  int64_t eos_id() const { return eos_id_; }
  int64_t pad_id() const { return pad_id_; }
  int64_t vocab_size() const { return vocab_size_; }

 protected:
  int64_t eos_id_ = 1;
  int64_t pad_id_ = 0;
  int64_t vocab_size_ = 0;  // sentencepiece pieces plus added tokens past them
};

}  // namespace latent
