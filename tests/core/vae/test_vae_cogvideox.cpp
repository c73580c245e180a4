// CogVideoX against diffusers' AutoencoderKLCogVideoX (fixtures generated at build time from the real library).
#include <gtest/gtest.h>
#include <torch/types.h>

#include "latent/vae/streaming.h"
#include "latent/vae/vae.h"
#include "vae_fixtures.h"

using namespace latent;
using namespace latent::testing;

namespace {

// Same reasoning as for Wan (different convolution batch shapes change summation order in fp32); GroupNorm
// over a chunk adds a reduction of its own. Observed errors are reported by the tests below.
constexpr double kTol = 1e-4;

std::shared_ptr<Vae> cog() {
  static std::shared_ptr<Vae> model = load_vae(fixtures_dir() / "cogvideox");
  return model;
}

// diffusers decodes an even number of latents to 4 frames each, latent 0 included; the engine keeps the
// frames that stand for real source frames: latent 0's first frame, then every later latent's four.
torch::Tensor reference_frames(const torch::Tensor& decoded, int64_t latents) {
  auto frames = clip_frames(decoded);
  if (latents % 2 == 1) return frames;
  return torch::cat({frames.slice(0, 0, 1), frames.slice(0, 4)}, 0);
}

}  // namespace

TEST(CogVideoXVae, LoadsTheDiffusersConfig) {
  LATENT_REQUIRE_FIXTURES();
  const VaeSpec& s = cog()->spec();
  EXPECT_EQ(s.family, "cogvideox");
  EXPECT_EQ(s.latent_channels, 8);
  EXPECT_EQ(s.spatial_factor, 8);
  EXPECT_EQ(s.encode_chunks.first, 9);
  EXPECT_EQ(s.encode_chunks.step, 8);
  EXPECT_FLOAT_EQ(s.latent_scale[0].item<float>(), 0.7f);
}

TEST(CogVideoXVae, EncodeMatchesDiffusersWhateverThePushes) {
  LATENT_REQUIRE_FIXTURES();
  auto ref = SafetensorsFile::open(fixtures_dir() / "cogvideox_cases.safetensors");
  for (const Case& c : cases(ref)) {
    auto frames = clip_frames(ref.tensor("input." + c.key()));
    auto want = to_diffusion(*cog(), ref.tensor("mean." + c.key()));
    for (int64_t step : {int64_t(1), int64_t(3), c.t}) {
      auto got = encode_all(cog(), frames, step);
      double err = rel_err(got.latents, want);
      EXPECT_LE(err, kTol) << c.key() << " pushes of " << step;
      if (step == c.t) {
        std::printf("cogvideox encode %-10s latents %lld  max rel err %.3g\n", c.key().c_str(),
                    static_cast<long long>(got.latents.size(0)), err);
      }
    }
  }
}

TEST(CogVideoXVae, DecodeMatchesDiffusers) {
  LATENT_REQUIRE_FIXTURES();
  auto ref = SafetensorsFile::open(fixtures_dir() / "cogvideox_cases.safetensors");
  for (const Case& c : cases(ref)) {
    auto latents = to_diffusion(*cog(), ref.tensor("mean." + c.key()));
    auto want = reference_frames(ref.tensor("decoded." + c.key()), latents.size(0));
    for (int64_t step : {int64_t(1), latents.size(0)}) {
      auto got = decode_all(cog(), latents, {}, step);
      ASSERT_EQ(got.size(0), c.t) << c.key();
      double err = rel_err(got, want);
      EXPECT_LE(err, kTol) << c.key() << " pushes of " << step;
      if (step == 1) {
        std::printf("cogvideox decode %-10s frames %lld  max rel err %.3g\n", c.key().c_str(),
                    static_cast<long long>(got.size(0)), err);
      }
    }
  }
}

TEST(CogVideoXVae, FramesInEqualFramesOut) {
  LATENT_REQUIRE_FIXTURES();
  for (int64_t n : {1, 2, 4, 5, 17, 20, 49}) {
    auto frames = torch::rand({n, 3, 32, 48}) * 2 - 1;
    auto enc = encode_all(cog(), frames, 5);
    int64_t real = 0;
    for (int64_t r : enc.real_frames) real += r;
    EXPECT_EQ(real, n);
    auto out = decode_all(cog(), enc.latents, enc.real_frames, 2);
    EXPECT_EQ(out.size(0), n) << n << " frames in";
  }
}

TEST(CogVideoXVae, SingleFileBf16WithConfigInMetadata) {
  LATENT_REQUIRE_FIXTURES();
  auto single = load_vae(fixtures_dir() / "cogvideox_single_bf16.safetensors");
  EXPECT_EQ(single->spec().family, "cogvideox");
  auto ref = SafetensorsFile::open(fixtures_dir() / "cogvideox_cases.safetensors");
  auto frames = clip_frames(ref.tensor("input.9x48x80"));
  auto want = to_diffusion(*cog(), ref.tensor("mean.9x48x80"));
  // bf16 weights keep 8 bits of mantissa: a few 1e-2 of relative error after ~20 layers is expected.
  EXPECT_LE(rel_err(encode_all(single, frames, 9).latents, want), 0.1);
}
