// The Wan text encoder (umT5 + sentencepiece tokenizer + the pipeline's prompt cleaning) against transformers and
// diffusers' WanPipeline._get_t5_prompt_embeds, on the tiny pipeline folder of tests/fixtures/gen_umt5_fixtures.py.

#include <gtest/gtest.h>
#include <torch/types.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "gen/text/prompt_clean.h"
#include "io/json.h"
#include "latent/gen/text_encoder.h"
#include "latent/io/weights.h"

namespace fs = std::filesystem;
using namespace latent;

namespace {

fs::path fixtures() {
  const char* d = std::getenv("LATENT_UMT5_FIXTURES");
  return d ? fs::path(d) : fs::path();
}

#define REQUIRE_FIXTURES()                                                                                     \
  do {                                                                                                         \
    if (fixtures().empty() || !fs::exists(fixtures() / "stamp"))                                               \
      GTEST_SKIP() << "no umT5 fixtures (LATENT_UMT5_FIXTURES unset: build without the .venv's transformers)"; \
  } while (0)

#define REQUIRE_TOKENIZER()                                                                                  \
  do {                                                                                                       \
    REQUIRE_FIXTURES();                                                                                      \
    if (!TextEncoder::tokenizer_available())                                                                 \
      GTEST_SKIP() << "built without the sentencepiece library (Debian libsentencepiece-dev): no tokenizer"; \
  } while (0)

json::Value text_cases() {
  std::ifstream in(fixtures() / "text.json", std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return json::parse(ss.str());
}

const WeightSource& cases() {
  static const WeightSource c = read_weights(fixtures() / "cases.safetensors");
  return c;
}

torch::Tensor fixture(const std::string& name) {
  auto it = cases().tensors.find(name);
  if (it == cases().tensors.end()) throw std::runtime_error("fixture tensor " + name + " missing");
  return it->second;
}

std::vector<std::string> prompts() {
  std::vector<std::string> out;
  const json::Value doc = json::parse(cases().metadata.at("prompts"));
  for (const auto& p : doc.as_array()) out.push_back(p.as_string());
  return out;
}

void copy_tree(const fs::path& from, const fs::path& to) {
  fs::remove_all(to);
  fs::create_directories(to);
  fs::copy(from, to, fs::copy_options::recursive);
}

std::string load_error(const fs::path& dir) {
  try {
    TextEncoder::load(dir);
  } catch (const ModelError& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

// diffusers' prompt_clean (html.unescape twice, Python's whitespace), character for character.
TEST(Umt5, PromptCleanMatchesPython) {
  REQUIRE_FIXTURES();
  const json::Value doc = text_cases();
  for (const auto& pair : doc.find("clean")->as_array()) {
    const auto& in = pair.as_array()[0].as_string();
    EXPECT_EQ(wan_prompt_clean(in), pair.as_array()[1].as_string()) << "input: " << in;
  }
  EXPECT_THROW(wan_prompt_clean("bad \xff utf-8"), ModelError);
}

// AutoTokenizer's ids: NFKC-changed unicode, emoji, literal special tokens, long and empty texts.
TEST(Umt5, TokenIdsMatchTransformers) {
  REQUIRE_TOKENIZER();
  auto enc = TextEncoder::load(fixtures() / "pipeline");
  const json::Value doc = text_cases();
  for (const auto& pair : doc.find("tokens")->as_array()) {
    std::vector<int64_t> want;
    for (const auto& v : pair.as_array()[1].as_array()) want.push_back(v.as_int64());
    EXPECT_EQ(enc->tokenize(pair.as_array()[0].as_string()), want) << "text: " << pair.as_array()[0].as_string();
  }
}

// The pipeline's embeddings, padding rows zero. float32 on both sides: transformers' own float32 result is ~3e-6
// (relative to the largest value) from the float64 one, so two float32 implementations that order their sums
// differently agree to a few 1e-6; 1e-5 leaves room for that and nothing more.
TEST(Umt5, EmbeddingsMatchPipeline) {
  REQUIRE_TOKENIZER();
  auto ps = prompts();
  const json::Value lengths = json::parse(cases().metadata.at("max_lengths"));
  for (const auto& L_v : lengths.as_array()) {
    int64_t L = L_v.as_int64();
    TextEncoder::Options opt;
    opt.max_length = L;
    auto enc = TextEncoder::load(fixtures() / "pipeline", opt);
    EXPECT_EQ(enc->max_length(), L);
    EXPECT_EQ(enc->dim(), 32);
    for (size_t i = 0; i < ps.size(); ++i) {
      std::string key = "p" + std::to_string(i) + ".L" + std::to_string(L);
      SCOPED_TRACE(key);
      auto want_ids = fixture(key + ".ids");
      auto ids = enc->tokenize(ps[i]);
      const auto n = static_cast<int64_t>(ids.size());
      ASSERT_LE(n, L);
      auto got_ids = torch::full({L}, 0, torch::kLong);
      got_ids.narrow(0, 0, n).copy_(torch::tensor(ids, torch::kLong));
      EXPECT_TRUE(torch::equal(got_ids, want_ids)) << got_ids << want_ids;

      auto got = enc->encode(ps[i]);
      auto want = fixture(key + ".embeds");
      ASSERT_EQ(got.sizes(), want.sizes());
      EXPECT_EQ(got.scalar_type(), torch::kFloat32);
      double scale = want.abs().max().item<double>();
      double err = (got - want).abs().max().item<double>() / scale;
      double err64 = (got.to(torch::kDouble) - fixture(key + ".embeds64")).abs().max().item<double>() / scale;
      std::cout << key << ": " << n << " tokens, max error " << err << " relative (" << err64 << " from float64)\n";
      EXPECT_LE(err, 1e-5);
      EXPECT_TRUE(torch::all(got.narrow(1, n, L - n) == 0).item<bool>());
    }
  }
}

// bfloat16 weights and compute, as the pipelines usually load the encoder. bf16 itself is 0.6-9% of the output
// scale from float64 here (random weights of std 0.5 amplify every rounding). Run as the pipeline runs it (padding
// included) the same ops in the same dtype give transformers' result (1e-3: a quarter of one bf16 step); run on
// the prompt's tokens only, some roundings differ by one step and grow through the layers (1-2% seen; 4% bound).
TEST(Umt5, Bfloat16MatchesTransformers) {
  REQUIRE_TOKENIZER();
  auto ps = prompts();
  for (bool run_padding : {true, false}) {
    TextEncoder::Options opt;
    opt.dtype = torch::kBFloat16;
    opt.run_padding = run_padding;
    auto enc = TextEncoder::load(fixtures() / "pipeline", opt);
    for (size_t i = 0; i < ps.size(); ++i) {
      std::string key = "p" + std::to_string(i) + ".L512";
      auto got = enc->encode(ps[i]);
      ASSERT_EQ(got.scalar_type(), torch::kBFloat16);
      auto want = fixture(key + ".embeds_bf16").to(torch::kFloat);
      auto want64 = fixture(key + ".embeds64");
      double scale = want64.abs().max().item<double>();
      double err = (got.to(torch::kFloat) - want).abs().max().item<double>() / scale;
      double err_bf16 = (want.to(torch::kDouble) - want64).abs().max().item<double>() / scale;
      std::cout << key << " bf16" << (run_padding ? " (padding run)" : "") << ": max error " << err
                << " relative to transformers' bf16, which is " << err_bf16 << " from float64\n";
      EXPECT_LE(err, run_padding ? 1e-3 : 4e-2) << key;
    }
  }
}

// float16, as some Wan folders are run: transformers keeps each feed-forward output projection in float32, and with
// it the residual stream from the first one on. With the padding run the same ops in the same dtypes give its
// result up to the accumulation order of the matrix products (1e-3: a fraction of one float16 step).
TEST(Umt5, Float16MatchesTransformers) {
  REQUIRE_TOKENIZER();
  if (!cases().tensors.count("p0.L512.embeds_fp16")) GTEST_SKIP() << "fixtures predate the float16 references";
  auto ps = prompts();
  TextEncoder::Options opt;
  opt.dtype = torch::kFloat16;
  opt.run_padding = true;
  auto enc = TextEncoder::load(fixtures() / "pipeline", opt);
  for (size_t i = 0; i < ps.size(); ++i) {
    std::string key = "p" + std::to_string(i) + ".L512";
    auto got = enc->encode(ps[i]);
    ASSERT_EQ(got.scalar_type(), torch::kFloat16);
    auto want = fixture(key + ".embeds_fp16").to(torch::kFloat);
    auto want64 = fixture(key + ".embeds64");
    double scale = want64.abs().max().item<double>();
    double err = (got.to(torch::kFloat) - want).abs().max().item<double>() / scale;
    double err_fp16 = (want.to(torch::kDouble) - want64).abs().max().item<double>() / scale;
    std::cout << key << " fp16: max error " << err << " relative to transformers' fp16, which is " << err_fp16
              << " from float64\n";
    EXPECT_LE(err, 1e-3) << key;
  }
}

TEST(Umt5, ReleaseFreesWeights) {
  REQUIRE_TOKENIZER();
  auto enc = TextEncoder::load(fixtures() / "pipeline");
  auto before = enc->encode("a red fox");
  auto t0 = std::chrono::steady_clock::now();
  auto again = enc->encode("A red fox runs through fresh snow at dawn, its breath rising in small clouds.");
  auto ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  std::cout << "tiny model encode: " << ms << " ms\n";
  enc->release();
  EXPECT_THROW(enc->encode("a red fox"), ModelError);
  EXPECT_EQ(enc->tokenize("a red fox").back(), 1);
}

// A 100 kB prompt is cut, not refused; broken UTF-8 is an error, not a crash.
TEST(Umt5, HugeAndBrokenPrompts) {
  REQUIRE_TOKENIZER();
  TextEncoder::Options opt;
  opt.max_length = 16;
  auto enc = TextEncoder::load(fixtures() / "pipeline", opt);
  std::string huge;
  while (huge.size() < 100 * 1024) huge += "a red fox &amp; </s> ";
  auto ids = enc->tokenize(huge);
  ASSERT_EQ(ids.size(), 16u);
  EXPECT_EQ(ids.back(), 1);
  EXPECT_EQ(enc->encode(huge).sizes(), (std::vector<int64_t>{1, 16, 32}));
  EXPECT_EQ(enc->tokenize(""), std::vector<int64_t>{1});
  EXPECT_THROW(enc->encode("fox \xc3"), ModelError);
}

TEST(Umt5, BadFoldersGiveClearErrors) {
  REQUIRE_TOKENIZER();
  fs::path base = fs::temp_directory_path() / ("latent-umt5-" + std::to_string(::getpid()));
  fs::path dir = base / "pipeline";
  auto fresh = [&] { copy_tree(fixtures() / "pipeline", dir); };

  EXPECT_NE(load_error(base / "nowhere").find("no such folder"), std::string::npos);

  fresh();
  fs::remove_all(dir / "tokenizer");
  EXPECT_NE(load_error(dir).find("no tokenizer/ folder"), std::string::npos) << load_error(dir);

  fresh();
  fs::remove(dir / "tokenizer" / "spiece.model");
  EXPECT_NE(load_error(dir).find("spiece.model"), std::string::npos) << load_error(dir);

  fresh();
  std::ofstream(dir / "tokenizer" / "spiece.model", std::ios::trunc) << "not a model";
  EXPECT_NE(load_error(dir).find("not a sentencepiece model"), std::string::npos) << load_error(dir);

  fresh();
  fs::remove(dir / "text_encoder" / "config.json");
  EXPECT_NE(load_error(dir).find("config.json"), std::string::npos) << load_error(dir);

  fresh();
  {
    std::ifstream in(dir / "text_encoder" / "config.json");
    std::stringstream ss;
    ss << in.rdbuf();
    std::string cfg = ss.str();
    auto pos = cfg.find("\"d_kv\"");
    ASSERT_NE(pos, std::string::npos);
    cfg.replace(pos, 6, "\"d_kv_\"");
    std::ofstream(dir / "text_encoder" / "config.json", std::ios::trunc) << cfg;
  }
  EXPECT_NE(load_error(dir).find("config has no \"d_kv\""), std::string::npos) << load_error(dir);

  // A sharded folder whose index names a shard that is not there.
  fresh();
  fs::rename(dir / "text_encoder" / "model.safetensors", dir / "text_encoder" / "model-00001-of-00002.safetensors");
  std::ofstream(dir / "text_encoder" / "model.safetensors.index.json")
      << R"({"metadata": {}, "weight_map": {"shared.weight": "model-00001-of-00002.safetensors",)"
      << R"( "encoder.final_layer_norm.weight": "model-00002-of-00002.safetensors"}})";
  EXPECT_NE(load_error(dir).find("shard model-00002-of-00002.safetensors is missing"), std::string::npos)
      << load_error(dir);

  // Weights that do not match the config: every key named, with the file.
  fresh();
  {
    std::ifstream in(dir / "text_encoder" / "config.json");
    std::stringstream ss;
    ss << in.rdbuf();
    std::string cfg = ss.str();
    auto pos = cfg.find("\"num_layers\": 2");
    ASSERT_NE(pos, std::string::npos);
    cfg.replace(pos, 15, "\"num_layers\": 3");
    pos = cfg.find("\"d_ff\": 64");
    ASSERT_NE(pos, std::string::npos);
    cfg.replace(pos, 10, "\"d_ff\": 48");
    std::ofstream(dir / "text_encoder" / "config.json", std::ios::trunc) << cfg;
  }
  std::string e = load_error(dir);
  EXPECT_NE(e.find("model.safetensors: weights do not match"), std::string::npos) << e;
  EXPECT_NE(e.find("encoder.block.2.layer.0.SelfAttention.q.weight"), std::string::npos) << e;
  EXPECT_NE(e.find("encoder.block.0.layer.1.DenseReluDense.wi_0.weight is [64, 32], expected [48, 32]"),
            std::string::npos)
      << e;

  fs::remove_all(base);
}
