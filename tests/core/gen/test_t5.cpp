// The CogVideoX text encoder (T5 + sentencepiece tokenizer, prompts as written, padding encoded and attended)
// against transformers and diffusers' CogVideoXPipeline._get_t5_prompt_embeds, on the tiny pipeline folder of
// tests/fixtures/gen_t5_fixtures.py; and how TextEncoder::load tells the families apart.

#include <gtest/gtest.h>
#include <torch/types.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "gen/text/t5_encoder.h"
#include "io/json.h"
#include "latent/gen/text_encoder.h"
#include "latent/io/weights.h"

namespace fs = std::filesystem;
using namespace latent;

namespace {

fs::path fixtures() {
  const char* d = std::getenv("LATENT_T5_FIXTURES");
  return d ? fs::path(d) : fs::path();
}

#define REQUIRE_TOKENIZER()                                                                                  \
  do {                                                                                                       \
    if (fixtures().empty() || !fs::exists(fixtures() / "stamp"))                                             \
      GTEST_SKIP() << "no T5 fixtures (LATENT_T5_FIXTURES unset: build without the .venv's transformers)";   \
    if (!TextEncoder::tokenizer_available())                                                                 \
      GTEST_SKIP() << "built without the sentencepiece library (Debian libsentencepiece-dev): no tokenizer"; \
  } while (0)

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void write_file(const fs::path& p, const std::string& text) { std::ofstream(p, std::ios::trunc) << text; }

void replace_once(const fs::path& p, const std::string& from, const std::string& to) {
  std::string s = read_file(p);
  auto pos = s.find(from);
  ASSERT_NE(pos, std::string::npos) << from << " not in " << p;
  s.replace(pos, from.size(), to);
  write_file(p, s);
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

std::string load_error(const fs::path& dir) {
  try {
    TextEncoder::load(dir);
  } catch (const ModelError& e) {
    return e.what();
  }
  return "(no error)";
}

// A scratch copy of the fixture folder, removed with the object.
struct ScratchFolder {
  fs::path base = fs::temp_directory_path() / ("latent-t5-" + std::to_string(::getpid()));
  fs::path dir = base / "pipeline";
  ScratchFolder() { fresh(); }
  ~ScratchFolder() { fs::remove_all(base); }
  void fresh() const {
    fs::remove_all(dir);
    fs::create_directories(dir);
    fs::copy(fixtures() / "pipeline", dir, fs::copy_options::recursive);
  }
};

}  // namespace

TEST(T5, CogVideoXFolderDefaults) {
  REQUIRE_TOKENIZER();
  auto enc = TextEncoder::load(fixtures() / "pipeline");
  EXPECT_EQ(enc->family(), TextEncoder::Family::CogVideoX);
  EXPECT_EQ(enc->max_length(), 226);
  EXPECT_EQ(enc->dim(), 32);
  EXPECT_EQ(enc->encode("a panda").sizes(), (std::vector<int64_t>{1, 226, 32}));
  TextEncoder::Options opt;
  opt.max_length = 40;
  EXPECT_EQ(TextEncoder::load(fixtures() / "pipeline", opt)->max_length(), 40);
  opt.max_length = -1;
  EXPECT_THROW(TextEncoder::load(fixtures() / "pipeline", opt), ModelError);
}

// The Wan fixture folder has no model_index.json: its umT5 encoder alone makes it Wan, with Wan's 512.
TEST(T5, WanFolderStillWan) {
  REQUIRE_TOKENIZER();
  const char* wan = std::getenv("LATENT_UMT5_FIXTURES");
  if (!wan || !fs::exists(fs::path(wan) / "stamp")) GTEST_SKIP() << "no umT5 fixtures";
  auto enc = TextEncoder::load(fs::path(wan) / "pipeline");
  EXPECT_EQ(enc->family(), TextEncoder::Family::Wan);
  EXPECT_EQ(enc->max_length(), 512);
  // Cleaned, and the rows past the prompt zero.
  EXPECT_EQ(enc->tokenize("a &amp;amp;   fox"), enc->tokenize("a & fox"));
  auto e = enc->encode("a fox");
  auto n = static_cast<int64_t>(enc->tokenize("a fox").size());
  EXPECT_TRUE(torch::all(e.narrow(1, n, 512 - n) == 0).item<bool>());
}

// AutoTokenizer's ids, no cleaning: html references and whitespace stay as written.
TEST(T5, TokenIdsMatchTransformers) {
  REQUIRE_TOKENIZER();
  auto enc = TextEncoder::load(fixtures() / "pipeline");
  const json::Value doc = json::parse(read_file(fixtures() / "text.json"));
  for (const auto& pair : doc.find("tokens")->as_array()) {
    std::vector<int64_t> want;
    for (const auto& v : pair.as_array()[1].as_array()) want.push_back(v.as_int64());
    EXPECT_EQ(enc->tokenize(pair.as_array()[0].as_string()), want) << "text: " << pair.as_array()[0].as_string();
  }
}

// The pipeline's embeddings, padding rows included (they are attended, so every row depends on them). float32 on
// both sides, 1e-5 of the output scale: float32 itself is up to ~1e-5 from float64 here (random weights of std
// 0.5 amplify every rounding), and the native encoder runs transformers' ops in its order, so on the CPU it gives
// the same bits; the bound leaves room for a BLAS that sums the matrix products in another order, and no more.
TEST(T5, EmbeddingsMatchPipeline) {
  REQUIRE_TOKENIZER();
  auto ps = prompts();
  const json::Value lengths = json::parse(cases().metadata.at("max_lengths"));
  for (const auto& L_v : lengths.as_array()) {
    const int64_t L = L_v.as_int64();
    TextEncoder::Options opt;
    opt.max_length = L;
    auto enc = TextEncoder::load(fixtures() / "pipeline", opt);
    ASSERT_EQ(enc->max_length(), L);
    for (size_t i = 0; i < ps.size(); ++i) {
      std::string key = "p" + std::to_string(i) + ".L" + std::to_string(L);
      SCOPED_TRACE(key);
      auto ids = enc->tokenize(ps[i]);
      const auto n = static_cast<int64_t>(ids.size());
      ASSERT_LE(n, L);
      EXPECT_EQ(ids.back(), 1);
      auto got_ids = torch::zeros({L}, torch::kLong);
      got_ids.narrow(0, 0, n).copy_(torch::tensor(ids, torch::kLong));
      EXPECT_TRUE(torch::equal(got_ids, fixture(key + ".ids"))) << got_ids << fixture(key + ".ids");

      auto got = enc->encode(ps[i]);
      auto want = fixture(key + ".embeds");
      ASSERT_EQ(got.sizes(), want.sizes());
      EXPECT_EQ(got.scalar_type(), torch::kFloat32);
      double scale = want.abs().max().item<double>();
      double err = (got - want).abs().max().item<double>() / scale;
      double err64 = (got.to(torch::kDouble) - fixture(key + ".embeds64")).abs().max().item<double>() / scale;
      std::cout << key << ": " << n << " tokens, max error " << err << " relative (" << err64 << " from float64)\n";
      EXPECT_LE(err, 1e-5);
      if (n < L) {
        EXPECT_GT(got.narrow(1, n, L - n).abs().max().item<double>(), 0.0) << "padding rows were zeroed";
      }
    }
  }
}

// Half precision, as the pipelines load the encoder: bfloat16 (CogVideoX 5b) and float16 (2b, where transformers
// keeps each feed-forward output projection in float32, and with it the residual stream). The native encoder runs
// the same ops in the same dtypes on the same padded sequence, so it gives transformers' result up to the
// accumulation order of the matrix products: a fraction of one half-precision step (1e-3 of the output scale).
TEST(T5, HalfPrecisionMatchesTransformers) {
  REQUIRE_TOKENIZER();
  auto ps = prompts();
  for (auto [dtype, suffix] : {std::pair{torch::kBFloat16, "bf16"}, std::pair{torch::kFloat16, "fp16"}}) {
    TextEncoder::Options opt;
    opt.dtype = dtype;
    auto enc = TextEncoder::load(fixtures() / "pipeline", opt);
    for (size_t i = 0; i < ps.size(); ++i) {
      std::string key = "p" + std::to_string(i) + ".L226";
      auto got = enc->encode(ps[i]);
      ASSERT_EQ(got.scalar_type(), dtype);
      auto want = fixture(key + ".embeds_" + suffix).to(torch::kFloat);
      auto want64 = fixture(key + ".embeds64");
      double scale = want64.abs().max().item<double>();
      double err = (got.to(torch::kFloat) - want).abs().max().item<double>() / scale;
      double err_half = (want.to(torch::kDouble) - want64).abs().max().item<double>() / scale;
      std::cout << key << " " << suffix << ": max error " << err << " relative to transformers' " << suffix
                << ", which is " << err_half << " from float64\n";
      EXPECT_LE(err, 1e-3) << key << " " << suffix;
    }
  }
}

TEST(T5, ReleaseFreesWeights) {
  REQUIRE_TOKENIZER();
  auto enc = TextEncoder::load(fixtures() / "pipeline");
  enc->release();
  EXPECT_THROW(enc->encode("a panda"), ModelError);
  EXPECT_EQ(enc->tokenize("a panda").back(), 1);
}

TEST(T5, UnknownModelTypeIsAClearError) {
  // The encoder's own reading, whatever folder it is in.
  try {
    T5EncoderConfig::parse(R"({"model_type": "mt5", "vocab_size": 8})", "cfg.json");
    ADD_FAILURE() << "mt5 accepted";
  } catch (const ModelError& e) {
    EXPECT_NE(std::string(e.what()).find("cfg.json: \"model_type\" is \"mt5\""), std::string::npos) << e.what();
  }
  EXPECT_THROW(T5EncoderConfig::parse(R"({"vocab_size": 8})", "cfg.json"), ModelError);

  REQUIRE_TOKENIZER();
  ScratchFolder f;
  replace_once(f.dir / "text_encoder" / "config.json", R"("model_type": "t5")", R"("model_type": "mt5")");
  std::string e = load_error(f.dir);
  EXPECT_NE(e.find("\"model_type\" is \"mt5\""), std::string::npos) << e;
  EXPECT_NE(e.find("CogVideoXPipeline"), std::string::npos) << e;
  // Without model_index.json the encoder's model_type alone decides, and names the types it knows.
  fs::remove(f.dir / "model_index.json");
  e = load_error(f.dir);
  EXPECT_NE(e.find("config.json: \"model_type\" is \"mt5\""), std::string::npos) << e;
  EXPECT_NE(e.find("\"t5\""), std::string::npos) << e;
}

TEST(T5, FoldersOfNeitherFamilyAreRefused) {
  REQUIRE_TOKENIZER();
  ScratchFolder f;
  replace_once(f.dir / "model_index.json", "\"CogVideoXPipeline\"", "\"StableDiffusion3Pipeline\"");
  std::string e = load_error(f.dir);
  EXPECT_NE(e.find("model_index.json: \"_class_name\" is \"StableDiffusion3Pipeline\""), std::string::npos) << e;

  // Every CogVideoX pipeline class reads the same text encoder.
  f.fresh();
  replace_once(f.dir / "model_index.json", "\"CogVideoXPipeline\"", "\"CogVideoXImageToVideoPipeline\"");
  EXPECT_EQ(TextEncoder::load(f.dir)->family(), TextEncoder::Family::CogVideoX);

  // A Wan pipeline with a T5 encoder is a mixed-up folder.
  f.fresh();
  replace_once(f.dir / "model_index.json", "\"CogVideoXPipeline\"", "\"WanPipeline\"");
  e = load_error(f.dir);
  EXPECT_NE(e.find("\"WanPipeline\""), std::string::npos) << e;
  EXPECT_NE(e.find("\"model_type\" is \"t5\""), std::string::npos) << e;

  f.fresh();
  write_file(f.dir / "model_index.json", "[1, 2]");
  e = load_error(f.dir);
  EXPECT_NE(e.find("model_index.json"), std::string::npos) << e;

  // No model_index.json: the T5 encoder says CogVideoX.
  f.fresh();
  fs::remove(f.dir / "model_index.json");
  EXPECT_EQ(TextEncoder::load(f.dir)->family(), TextEncoder::Family::CogVideoX);

  // A shard the index names, missing.
  f.fresh();
  fs::remove(f.dir / "text_encoder" / "model-00002-of-00004.safetensors");
  e = load_error(f.dir);
  EXPECT_NE(e.find("model-00002-of-00004.safetensors"), std::string::npos) << e;

  // T5 has one relative position table, in the first layer; the others must not need one.
  f.fresh();
  replace_once(f.dir / "text_encoder" / "config.json", R"("num_layers": 3)", R"("num_layers": 4)");
  e = load_error(f.dir);
  EXPECT_NE(e.find("encoder.block.3.layer.0.SelfAttention.q.weight"), std::string::npos) << e;
  EXPECT_EQ(e.find("block.3.layer.0.SelfAttention.relative_attention_bias"), std::string::npos) << e;
}
