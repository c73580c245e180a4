// The embedded default models (models/latent-tiny-wan.safetensors, models/latent-gen-small.safetensors): found
// where the elements look for them, within the size budget; the VAE runs exactly as diffusers runs its weights.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <torch/types.h>

#include <algorithm>
#include <optional>

#include "latent/gen/denoiser.h"
#include "latent/io/weights.h"
#include "latent/runtime/default_model.h"
#include "latent/vae/streaming.h"
#include "latent/vae/vae.h"
#include "vae_fixtures.h"

using namespace latent;
using namespace latent::testing;
namespace fs = std::filesystem;

namespace {

// Same reasoning as the random-weight Wan fixture (test_vae_wan.cpp): fp32 CPU, summation order differs.
constexpr double kTol = 1e-4;

std::shared_ptr<Vae> default_vae() {
  static std::shared_ptr<Vae> model = load_vae(find_default_model());
  return model;
}

// Restores an environment variable when the test ends, whatever happens in it.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    setenv(name, value, 1);
  }
  ~ScopedEnv() { old_ ? setenv(name_, old_->c_str(), 1) : unsetenv(name_); }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

}  // namespace

TEST(DefaultModel, IsShippedAndFound) {
  const fs::path p = find_default_model();
  EXPECT_EQ(p.filename(), kDefaultModelFile);
  EXPECT_LE(fs::file_size(p), 20u << 20) << "the default model must stay within 20 MB";
  const VaeSpec& s = default_vae()->spec();
  EXPECT_EQ(s.family, "wan2.1");
  EXPECT_EQ(s.model_id, "latent-tiny-wan");  // its own latent space, named in the caps
  EXPECT_EQ(s.latent_channels, 16);          // streams shaped like Wan 2.1's
  EXPECT_EQ(s.temporal_factor, 4);
  EXPECT_EQ(s.spatial_factor, 8);
}

TEST(DefaultModel, ExplicitLocationIsTheOnlyCandidate) {
  ScopedEnv env("LATENT_DEFAULT_MODEL", "/nonexistent/tiny.safetensors");
  EXPECT_EQ(default_model_candidates(), std::vector<fs::path>{"/nonexistent/tiny.safetensors"});
  try {
    find_default_model();
    FAIL() << "a missing default model must be an error";
  } catch (const ModelError& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/tiny.safetensors"), std::string::npos) << e.what();
  }
}

TEST(DefaultModel, LooksInTheInstallAndSourceDirectories) {
  ScopedEnv env("LATENT_DEFAULT_MODEL", "");
  auto c = default_model_candidates();
  ASSERT_GE(c.size(), 2u);
  for (const auto& p : c) EXPECT_EQ(p.filename(), kDefaultModelFile);
  EXPECT_NE(std::find(c.begin(), c.end(), fs::path(LATENT_TEST_SOURCE_ROOT) / "models" / kDefaultModelFile), c.end());
}

TEST(DefaultModel, MatchesDiffusersOnTheTrainedWeights) {
  LATENT_REQUIRE_FIXTURES();
  const fs::path cases_file = fixtures_dir() / "default_cases.safetensors";
  ASSERT_TRUE(fs::exists(cases_file)) << "the fixture generator did not see models/" << kDefaultModelFile;
  auto ref = SafetensorsFile::open(cases_file);
  for (const Case& c : cases(ref)) {
    auto frames = clip_frames(ref.tensor("input." + c.key()));
    auto enc = encode_all(default_vae(), frames, 4);
    double enc_err = rel_err(enc.latents, to_diffusion(*default_vae(), ref.tensor("mean." + c.key())));
    EXPECT_LE(enc_err, kTol) << c.key();
    auto dec = decode_all(default_vae(), to_diffusion(*default_vae(), ref.tensor("mean." + c.key())));
    double dec_err = rel_err(dec, clip_frames(ref.tensor("decoded." + c.key())));
    EXPECT_LE(dec_err, kTol) << c.key();
    std::printf("default model %-10s encode max rel err %.3g, decode %.3g\n", c.key().c_str(), enc_err, dec_err);
  }
}

// The default generator (models/latent-gen-small.safetensors) makes latents the default VAE decodes.
TEST(DefaultGenerator, IsShippedAndFound) {
  const fs::path p = find_default_generator();
  EXPECT_EQ(p.filename(), kDefaultGeneratorFile);
  EXPECT_LE(fs::file_size(p), 20u << 20) << "the default generator must stay within 20 MB";
  const DenoiserSpec s = load_denoiser(p)->spec();
  EXPECT_EQ(s.latent_space, default_vae()->spec().model_id);
  EXPECT_EQ(s.channels, default_vae()->spec().latent_channels);
  EXPECT_EQ(s.temporal_factor, default_vae()->spec().temporal_factor);
  EXPECT_EQ(s.spatial_factor, default_vae()->spec().spatial_factor);
  EXPECT_GT(s.native_height, 0) << "videogen needs a size to make when none is set";
}

TEST(DefaultGenerator, HasItsOwnVariable) {
  ScopedEnv model("LATENT_DEFAULT_MODEL", "/nonexistent/tiny.safetensors");
  ScopedEnv env("LATENT_DEFAULT_GENERATOR", "/nonexistent/gen.safetensors");
  EXPECT_EQ(default_generator_candidates(), std::vector<fs::path>{"/nonexistent/gen.safetensors"});
  try {
    find_default_generator();
    FAIL() << "a missing default generator must be an error";
  } catch (const ModelError& e) {
    EXPECT_NE(std::string(e.what()).find("default generator"), std::string::npos) << e.what();
  }
}
