#include "gen/text/t5_tokenizer.h"

#include <algorithm>
#include <map>

#include "io/json.h"
#include "io/weight_files.h"
#include "latent/io/weights.h"

#ifdef LATENT_HAVE_SENTENCEPIECE
#include <sentencepiece_processor.h>
#endif

namespace fs = std::filesystem;

namespace latent {

std::vector<int64_t> T5Tokenizer::encode_for_model(const std::string& text, int64_t max_length) const {
  if (max_length < 1) throw ModelError("tokenizer: max_length must be at least 1");
  std::vector<int64_t> ids = encode(text);
  if (static_cast<int64_t>(ids.size()) > max_length - 1) ids.resize(max_length - 1);
  ids.push_back(eos_id_);
  return ids;
}

TokenizerInputPrefix raw_input_prefix(const std::string& text, size_t max_bytes) {
  if (max_bytes >= text.size()) return {text, true};
  for (size_t q = max_bytes; q > 1; --q)
    if (text[q] == ' ' && text[q - 1] > ' ' && text[q - 1] < 0x7F) return {text.substr(0, q), false};
  return {{}, false};
}

std::vector<int64_t> T5Tokenizer::encode_for_model(const std::string& text, int64_t max_length,
                                                   const PrefixReader& read, size_t first_window) const {
  if (max_length < 1) throw ModelError("tokenizer: max_length must be at least 1");
  const auto keep = static_cast<size_t>(max_length - 1);
  const size_t first = splits_at_spaces_ ? std::max<size_t>(first_window, 1) : SIZE_MAX;
  auto grow = [](size_t n) { return n > SIZE_MAX / 4 ? SIZE_MAX : n * 4; };
  std::vector<int64_t> ids;
  for (size_t window = first;; window = grow(window)) {
    const TokenizerInputPrefix prefix = read(text, window);
    // Any start of the prefix that is itself cut before a space is as good: tokenise no more than needed.
    bool enough = false;
    for (size_t part = first;; part = grow(part)) {
      const TokenizerInputPrefix sub = raw_input_prefix(prefix.text, part);
      if (sub.whole || !sub.text.empty()) {
        ids = encode(sub.text);
        enough = ids.size() >= keep;
      }
      if (enough || sub.whole) break;
    }
    if (enough || prefix.whole) break;
  }
  if (ids.size() > keep) ids.resize(keep);
  ids.push_back(eos_id_);
  return ids;
}

#ifndef LATENT_HAVE_SENTENCEPIECE

bool T5Tokenizer::available() { return false; }

std::unique_ptr<T5Tokenizer> T5Tokenizer::load(const fs::path& tokenizer_dir) {
  throw ModelError(tokenizer_dir.string() +
                   ": this build has no sentencepiece tokenizer (install libsentencepiece-dev and rebuild)");
}

#else

namespace {

struct AddedToken {
  std::string content;
  int64_t id = 0;
  bool lstrip = false;
  bool rstrip = false;
};

const json::Value& member(const json::Value& v, const char* key) {
  const json::Value* m = v.find(key);
  if (!m) throw json::Error(std::string("an added token has no \"") + key + "\"");
  return *m;
}

bool flag(const json::Value& v, const char* key) {
  const json::Value* f = v.find(key);
  return f && f->is_bool() && f->as_bool();
}

// transformers' AutoTokenizer reads tokenizer.json when there is one; older folders have only
// tokenizer_config.json's "added_tokens_decoder".
std::vector<AddedToken> read_added_tokens(const fs::path& dir) {
  std::vector<AddedToken> out;
  try {
    if (fs::exists(dir / "tokenizer.json")) {
      json::Value doc = json::parse(read_text_file(dir / "tokenizer.json"));
      const json::Value* list = doc.find("added_tokens");
      if (list && list->is_array()) {
        for (const auto& t : list->as_array())
          out.push_back(
              {member(t, "content").as_string(), member(t, "id").as_int64(), flag(t, "lstrip"), flag(t, "rstrip")});
      }
    } else if (fs::exists(dir / "tokenizer_config.json")) {
      json::Value doc = json::parse(read_text_file(dir / "tokenizer_config.json"));
      const json::Value* map = doc.find("added_tokens_decoder");
      if (map && map->is_object()) {
        for (const auto& [id, t] : map->as_object())
          out.push_back({member(t, "content").as_string(), std::stoll(id), flag(t, "lstrip"), flag(t, "rstrip")});
      }
    }
  } catch (const ModelError&) {
    throw;
  } catch (const std::exception& e) {
    throw ModelError(dir.string() + ": unreadable added tokens in tokenizer.json / tokenizer_config.json: " + e.what());
  }
  return out;
}

bool ascii_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

class SentencePieceT5Tokenizer final : public T5Tokenizer {
 public:
  explicit SentencePieceT5Tokenizer(const fs::path& dir) {
    fs::path model = dir / "spiece.model";
    if (!fs::exists(model)) throw ModelError(dir.string() + ": no spiece.model (the T5 sentencepiece model)");
    if (auto status = sp_.Load(model.string()); !status.ok())
      throw ModelError(model.string() + ": not a sentencepiece model: " + status.ToString());
    eos_id_ = sp_.eos_id();
    if (eos_id_ < 0) throw ModelError(model.string() + ": the sentencepiece model has no end-of-sequence piece");
    pad_id_ = sp_.pad_id() >= 0 ? sp_.pad_id() : 0;
    vocab_size_ = sp_.GetPieceSize();
    splits_at_spaces_ = true;
    static const std::string kBoundary = "\xe2\x96\x81";  // sentencepiece's word boundary, U+2581
    for (int i = 0; i < sp_.GetPieceSize(); ++i)
      if (sp_.IdToPiece(i).find(kBoundary, 1) != std::string::npos) splits_at_spaces_ = false;
    for (auto& t : read_added_tokens(dir)) {
      if (t.content.empty()) continue;
      if (std::any_of(t.content.begin(), t.content.end(), ascii_space) ||
          t.content.find("\xc2\xa0") != std::string::npos || t.content.find("\xe3\x80\x80") != std::string::npos)
        splits_at_spaces_ = false;
      vocab_size_ = std::max(vocab_size_, t.id + 1);
      by_first_byte_[static_cast<unsigned char>(t.content[0])].push_back(std::move(t));
    }
    // Leftmost-longest, as the tokenizers library matches added tokens.
    for (auto& [_, list] : by_first_byte_)
      std::stable_sort(list.begin(), list.end(),
                       [](const AddedToken& a, const AddedToken& b) { return a.content.size() > b.content.size(); });
  }

  std::vector<int64_t> encode(const std::string& text) const override {
    std::vector<int64_t> ids;
    size_t seg_start = 0;
    size_t i = 0;
    while (i < text.size()) {
      const AddedToken* hit = match(text, i);
      if (!hit) {
        ++i;
        continue;
      }
      size_t seg_end = i;
      if (hit->lstrip)
        while (seg_end > seg_start && ascii_space(text[seg_end - 1])) --seg_end;
      encode_piece(std::string_view(text).substr(seg_start, seg_end - seg_start), ids);
      ids.push_back(hit->id);
      i += hit->content.size();
      if (hit->rstrip)
        while (i < text.size() && ascii_space(text[i])) ++i;
      seg_start = i;
    }
    encode_piece(std::string_view(text).substr(seg_start), ids);
    return ids;
  }

 private:
  const AddedToken* match(const std::string& text, size_t pos) const {
    auto it = by_first_byte_.find(static_cast<unsigned char>(text[pos]));
    if (it == by_first_byte_.end()) return nullptr;
    for (const auto& t : it->second)
      if (text.compare(pos, t.content.size(), t.content) == 0) return &t;
    return nullptr;
  }

  void encode_piece(std::string_view piece, std::vector<int64_t>& ids) const {
    if (piece.empty()) return;
    std::vector<int> out;
    if (auto status = sp_.Encode(absl::string_view(piece.data(), piece.size()), &out); !status.ok())
      throw ModelError("tokenizer: sentencepiece failed: " + status.ToString());
    ids.insert(ids.end(), out.begin(), out.end());
  }

  sentencepiece::SentencePieceProcessor sp_;
  std::map<unsigned char, std::vector<AddedToken> > by_first_byte_;
};

}  // namespace

bool T5Tokenizer::available() { return true; }

std::unique_ptr<T5Tokenizer> T5Tokenizer::load(const fs::path& tokenizer_dir) {
  if (!fs::is_directory(tokenizer_dir)) throw ModelError(tokenizer_dir.string() + ": no tokenizer folder");
  return std::make_unique<SentencePieceT5Tokenizer>(tokenizer_dir);
}

#endif

}  // namespace latent
