// Wan's prompt cleaning against diffusers' WanPipeline prompt_clean run with ftfy installed, as the Wan pipelines
// are: ftfy.fix_text, html.unescape twice, whitespace (tests/fixtures/gen_prompt_clean_fixtures.py). And a long
// prompt read only as far as the ids kept depend on, with the tokenizers of the umT5 and T5 fixtures.

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <memory>
#include <sstream>

#include "gen/text/prompt_clean.h"
#include "gen/text/t5_tokenizer.h"
#include "io/json.h"
#include "latent/io/weights.h"

namespace fs = std::filesystem;
using namespace latent;

namespace {

// The fixture's document, or the reason there is none.
struct Fixture {
  json::Value doc;
  std::string missing;
};

const Fixture& fixture() {
  static const Fixture f = [] {
    Fixture out;
    const char* d = std::getenv("LATENT_PROMPT_CLEAN_FIXTURES");
    if (!d || !fs::exists(fs::path(d) / "stamp")) {
      out.missing = "no prompt cleaning fixtures (LATENT_PROMPT_CLEAN_FIXTURES unset: build without the .venv)";
      return out;
    }
    std::ifstream in(fs::path(d) / "cases.json", std::ios::binary);
    std::ostringstream ss;
    ss << in.rdbuf();
    out.doc = json::parse(ss.str());
    if (!out.doc.find("ftfy")->is_string()) out.missing = out.doc.find("reason")->as_string();
    return out;
  }();
  return f;
}

#define REQUIRE_FIXTURE()                                              \
  do {                                                                 \
    if (!fixture().missing.empty()) GTEST_SKIP() << fixture().missing; \
  } while (0)

const json::Array& cases() { return fixture().doc.find("cases")->as_array(); }

}  // namespace

TEST(PromptClean, FixTextMatchesFtfy) {
  REQUIRE_FIXTURE();
  for (const auto& c : cases()) {
    const std::string& text = c.find("text")->as_string();
    EXPECT_EQ(ftfy_fix_text(text), c.find("fix_text")->as_string()) << "input: " << text;
  }
}

TEST(PromptClean, MatchesDiffusersPromptClean) {
  REQUIRE_FIXTURE();
  for (const auto& c : cases()) {
    const std::string& text = c.find("text")->as_string();
    EXPECT_EQ(wan_prompt_clean(text), c.find("clean")->as_string()) << "input: " << text;
  }
  EXPECT_THROW(wan_prompt_clean("bad \xff utf-8"), ModelError);
}

// ---- reading a long prompt no further than its kept tokens depend on -----------------------------------------

namespace {

// A tokenizer folder of the umT5 (Wan) or T5 (CogVideoX) fixtures, or empty with the reason in `why`.
std::unique_ptr<T5Tokenizer> fixture_tokenizer(const char* env, std::string& why) {
  const char* d = std::getenv(env);
  if (!d || !fs::exists(fs::path(d) / "stamp")) {
    why = std::string("no tokenizer fixtures (") + env + " unset: build without the .venv's transformers)";
    return nullptr;
  }
  if (!T5Tokenizer::available()) {
    why = "built without the sentencepiece library (Debian libsentencepiece-dev): no tokenizer";
    return nullptr;
  }
  return T5Tokenizer::load(fs::path(d) / "pipeline" / "tokenizer");
}

// Prompts of a few kB whose kept ids end somewhere inside: html references, mojibake, quotes, long lines and
// short ones, runs of whitespace, tabs, literal special tokens, words with no space for a while, and a '<' at the
// end of a long line that changes how ftfy fixes all of it.
std::vector<std::string> long_prompts() {
  std::vector<std::string> out;
  std::string a, b, c, d, e;
  for (int i = 0; i < 60; ++i) {
    // ftfy decodes "&EACUTE;" and the mojibake "&Atilde;&copy;" only on lines without a '<': here the line's '<'
    // comes last.
    e += "P&EACUTE;REZ word caf&Atilde;&copy; " + std::to_string(i) + " ";
    a += "A red fox &amp;amp; a \xe2\x80\x9c"
         "caf\xc3\x83\xc2\xa9\xe2\x80\x9d runs </s> through snow &lt;b&gt; ";
    b += "line " + std::to_string(i) +
         " \xef\xac\x81sh\tand   \xef\xbc\xa8\xef\xbd\x85\xef\xbd\x8c\xef\xbd\x8c\xef\xbd\x8f\r\n";
    c += "zzqqjxyzzzqq" + std::string(i % 7, 'x') + (i % 5 ? " " : "  \xc2\xa0 ") + "<pad>e\xcc\x81 &#x263A;";
    d += std::string(37, 'q') + "&eacute" + (i % 3 ? " " : "\n") + "<b>" + std::to_string(i * 7919) + " ";
  }
  e += "<end>";
  return {a, b, c, d, e};
}

void expect_prefix_reading_exact(const T5Tokenizer& tok, const PrefixReader& read,
                                 const std::function<std::string(const std::string&)>& whole) {
  for (const std::string& prompt : long_prompts()) {
    for (int64_t max_length : {16, 64}) {
      const std::vector<int64_t> want = tok.encode_for_model(whole(prompt), max_length);
      ASSERT_EQ(want.size(), static_cast<size_t>(max_length)) << "the prompt should be longer than the ids kept";
      // Every window up to well past the bytes the kept ids come from, so some stop exactly at that point.
      for (size_t window = 1; window < prompt.size(); window += window < 600 ? 1 : 97)
        ASSERT_EQ(tok.encode_for_model(prompt, max_length, read, window), want)
            << "window " << window << ", max_length " << max_length << ", prompt: " << prompt.substr(0, 120);
    }
  }
}

// Peak resident set (VmHWM) in MiB: printed for the record, not compared (other tests ran in this process).
double peak_rss_mib() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("VmHWM:", 0) == 0) return std::stod(line.substr(6)) / 1024.0;
  return -1;
}

// 100 MB of the same words: one line (ftfy reads it in segments of a million characters), or many.
std::string huge_prompt(bool lines) {
  const std::string unit = lines ? "A red fox &amp; a \xe2\x80\x9c"
                                   "cat\xe2\x80\x9d </s> runs\n"
                                 : "A red fox &amp; a \xe2\x80\x9c"
                                   "cat\xe2\x80\x9d </s> runs ";
  std::string out;
  out.reserve(100u << 20);
  while (out.size() + unit.size() <= (100u << 20)) out += unit;
  return out;
}

}  // namespace

TEST(PromptCap, WanPrefixReadingIsExact) {
  std::string why;
  auto tok = fixture_tokenizer("LATENT_UMT5_FIXTURES", why);
  if (!tok) GTEST_SKIP() << why;
  ASSERT_TRUE(tok->splits_at_spaces());
  expect_prefix_reading_exact(*tok, wan_prompt_clean_prefix, wan_prompt_clean);
}

TEST(PromptCap, RawPrefixReadingIsExact) {
  std::string why;
  auto tok = fixture_tokenizer("LATENT_T5_FIXTURES", why);
  if (!tok) GTEST_SKIP() << why;
  ASSERT_TRUE(tok->splits_at_spaces());
  expect_prefix_reading_exact(*tok, raw_input_prefix, [](const std::string& s) { return s; });
}

// A 100 MB prompt gives the ids of its first 64 kB, and is not cleaned or tokenised whole to get them (its peak
// memory is printed: the whole text widened to UTF-32 alone would be 400 MB).
TEST(PromptCap, HugePromptGivesItsStartsIds) {
  std::string why;
  auto tok = fixture_tokenizer("LATENT_UMT5_FIXTURES", why);
  if (!tok) GTEST_SKIP() << why;
  for (bool lines : {false, true}) {
    const std::string huge = huge_prompt(lines);
    const std::string start = huge.substr(0, huge.rfind(' ', 64 << 10));
    for (int64_t max_length : {16, 512}) {
      EXPECT_EQ(tok->encode_for_model(huge, max_length, wan_prompt_clean_prefix),
                tok->encode_for_model(wan_prompt_clean(start), max_length))
          << (lines ? "lines" : "one line") << ", max_length " << max_length;
      EXPECT_EQ(tok->encode_for_model(huge, max_length, raw_input_prefix), tok->encode_for_model(start, max_length));
    }
    std::cout << "100 MB prompt (" << (lines ? "many lines" : "one line") << "): peak RSS of the process "
              << peak_rss_mib() << " MiB\n";
  }
  // A broken byte past what is read is still an error, as when the whole text was read.
  std::string broken = huge_prompt(false);
  broken.back() = '\xff';
  EXPECT_THROW(tok->encode_for_model(broken, 16, wan_prompt_clean_prefix), ModelError);
}
