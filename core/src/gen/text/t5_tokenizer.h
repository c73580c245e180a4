// T5 / umT5 tokenisation as transformers does it for a diffusers pipeline's tokenizer/ folder: the folder's
// spiece.model through the sentencepiece library, with the added tokens (<pad>, </s>, <extra_id_N>, ...) of
// tokenizer.json (or tokenizer_config.json) recognised in the text first, as transformers' AutoTokenizer does,
// and each stretch between them encoded on its own.
#pragma once
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace latent {

// The start of what a tokenizer is given, read from the start of a longer text: either all of it (`whole`), or a
// prefix that ends where a word does and that the whole input continues with a space.
struct TokenizerInputPrefix {
  std::string text;
  bool whole = false;
};

// What a tokenizer is given for `text`, read from no more than its first `max_bytes` bytes (where that is less
// than its size): a pipeline's prompt cleaning, or the text itself.
using PrefixReader = std::function<TokenizerInputPrefix(const std::string& text, size_t max_bytes)>;

// The text itself up to a space that follows a printable ASCII character, within the first max_bytes bytes.
TokenizerInputPrefix raw_input_prefix(const std::string& text, size_t max_bytes);

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

  // encode_for_model(what `read` makes of all of `text`), reading only as much of `text` as the ids kept depend
  // on: a prefix of 64 KiB (`first_window`), then four times more each time, until it gives max_length - 1 ids.
  // Exact: the prefix ends where a word does and the whole input goes on with a space; where no piece of the
  // vocabulary spans a word boundary (splits_at_spaces()), encode(prefix) is then the start of encode(whole
  // input), so once it has max_length - 1 ids the rest cannot change them. Otherwise the whole text is read.
  std::vector<int64_t> encode_for_model(const std::string& text, int64_t max_length, const PrefixReader& read,
                                        size_t first_window = size_t{64} << 10) const;

  // True when no piece holds a word boundary ("\xe2\x96\x81") past its first character and no added token
  // holds whitespace: sentencepiece's default (split_by_whitespace), which T5's and umT5's models use. Then words
  // are tokenised each on its own.
  bool splits_at_spaces() const { return splits_at_spaces_; }

  int64_t eos_id() const { return eos_id_; }
  int64_t pad_id() const { return pad_id_; }
  int64_t vocab_size() const { return vocab_size_; }

 protected:
  int64_t eos_id_ = 1;
  int64_t pad_id_ = 0;
  int64_t vocab_size_ = 0;  // sentencepiece pieces plus added tokens past them
  bool splits_at_spaces_ = false;
};

}  // namespace latent
