// Wan 2.1 against diffusers' AutoencoderKLWan (fixtures generated at build time from the real library).
#include <gtest/gtest.h>
#include <torch/types.h>

#include <fstream>

#include "latent/vae/streaming.h"
#include "latent/vae/vae.h"
#include "vae_fixtures.h"

using namespace latent;
using namespace latent::testing;
namespace fs = std::filesystem;

namespace {

// fp32 on the CPU: the engine runs the same operations as diffusers, but convolutions see the frames in
// different batch shapes (chunk sizes, padding by concatenation), which changes summation order. Observed
// differences are around 1e-6 of the output range; 1e-4 leaves room for other CPU kernels (oneDNN/AVX paths).
constexpr double kTol = 1e-4;

std::shared_ptr<Vae> wan() {
  static std::shared_ptr<Vae> model = load_vae(fixtures_dir() / "wan");
  return model;
}

}  // namespace

TEST(WanVae, LoadsTheDiffusersConfig) {
  LATENT_REQUIRE_FIXTURES();
  const VaeSpec& s = wan()->spec();
  EXPECT_EQ(s.family, "wan2.1");
  EXPECT_EQ(s.latent_channels, 8);  // the fixture's z_dim, not Wan 2.1's 16
  EXPECT_EQ(s.temporal_factor, 4);
  EXPECT_EQ(s.spatial_factor, 8);
  EXPECT_NEAR(s.latent_shift[2].item<float>(), 2.4949f, 1e-6);
  EXPECT_NEAR(s.latent_scale[0].item<float>(), 1 / 1.169f, 1e-6);
}

TEST(WanVae, EncodeMatchesDiffusers) {
  LATENT_REQUIRE_FIXTURES();
  auto ref = SafetensorsFile::open(fixtures_dir() / "wan_cases.safetensors");
  for (const Case& c : cases(ref)) {
    auto frames = clip_frames(ref.tensor("input." + c.key()));
    auto got = encode_all(wan(), frames, frames.size(0));
    auto want = to_diffusion(*wan(), ref.tensor("mean." + c.key()));
    double err = rel_err(got.latents, want);
    EXPECT_LE(err, kTol) << c.key();
    std::printf("wan encode %-10s latents %lld  max rel err %.3g\n", c.key().c_str(),
                static_cast<long long>(got.latents.size(0)), err);
  }
}

TEST(WanVae, DecodeMatchesDiffusers) {
  LATENT_REQUIRE_FIXTURES();
  auto ref = SafetensorsFile::open(fixtures_dir() / "wan_cases.safetensors");
  for (const Case& c : cases(ref)) {
    auto latents = to_diffusion(*wan(), ref.tensor("mean." + c.key()));
    auto got = decode_all(wan(), latents);
    auto want = clip_frames(ref.tensor("decoded." + c.key()));
    ASSERT_EQ(got.size(0), c.t) << c.key();
    double err = rel_err(got, want);
    EXPECT_LE(err, kTol) << c.key();
    std::printf("wan decode %-10s frames %lld  max rel err %.3g\n", c.key().c_str(),
                static_cast<long long>(got.size(0)), err);
  }
}

TEST(WanVae, LatentsDoNotDependOnHowFramesArePushed) {
  LATENT_REQUIRE_FIXTURES();
  auto ref = SafetensorsFile::open(fixtures_dir() / "wan_cases.safetensors");
  auto frames = clip_frames(ref.tensor("input.17x48x80"));
  auto whole = encode_all(wan(), frames, 17).latents;
  for (int64_t step : {1, 3, 4, 5}) {
    EXPECT_LE(rel_err(encode_all(wan(), frames, step).latents, whole), 1e-5) << "pushes of " << step;
  }
  // Bigger model calls (several 4-frame steps at once) give the same result too.
  EXPECT_LE(rel_err(encode_all(wan(), frames, 17, {.max_chunk_frames = 16}).latents, whole), 1e-5);
  auto latents = to_diffusion(*wan(), ref.tensor("mean.17x48x80"));
  auto one = decode_all(wan(), latents, {}, 1);
  for (int64_t step : {2, 3, 5}) EXPECT_LE(rel_err(decode_all(wan(), latents, {}, step), one), 1e-5);
}

TEST(WanVae, Uint8FramesEncodeLikeTheirFloatValues) {
  LATENT_REQUIRE_FIXTURES();
  auto rgb = torch::randint(0, 256, {5, 48, 80, 3}, torch::kByte);
  auto as_float = rgb.permute({0, 3, 1, 2}).to(torch::kFloat) / 127.5 - 1;
  EXPECT_LE(rel_err(encode_all(wan(), rgb, 5).latents, encode_all(wan(), as_float, 5).latents), 1e-6);
}

TEST(WanVae, FramesInEqualFramesOut) {
  LATENT_REQUIRE_FIXTURES();
  for (int64_t n : {1, 2, 4, 5, 17, 20}) {
    auto frames = torch::rand({n, 3, 32, 64}) * 2 - 1;
    auto enc = encode_all(wan(), frames, 3);
    const int64_t latents = 1 + (n - 1 + 3) / 4;
    ASSERT_EQ(enc.latents.size(0), latents) << n;
    int64_t real = 0;
    for (int64_t r : enc.real_frames) real += r;
    EXPECT_EQ(real, n);
    EXPECT_EQ(enc.first_frame.back(), latents == 1 ? 0 : 4 * (latents - 2) + 1);
    auto out = decode_all(wan(), enc.latents, enc.real_frames, 2);
    EXPECT_EQ(out.size(0), n) << n << " frames in";
    EXPECT_EQ(out.sizes().slice(1), frames.sizes().slice(1));
  }
}

TEST(WanVae, TailPaddingRepeatsTheLastFrame) {
  LATENT_REQUIRE_FIXTURES();
  auto frames = torch::rand({6, 3, 32, 64}) * 2 - 1;
  auto padded = torch::cat({frames, frames.slice(0, 5).expand({3, -1, -1, -1})}, 0);  // 6 -> 9 frames
  EXPECT_LE(rel_err(encode_all(wan(), frames, 6).latents, encode_all(wan(), padded, 9).latents), 1e-6);
}

TEST(WanVae, SampleIsSeededAndNearTheMean) {
  LATENT_REQUIRE_FIXTURES();
  auto frames = torch::rand({5, 3, 32, 64}) * 2 - 1;
  auto mean = encode_all(wan(), frames, 5).latents;
  auto a = encode_all(wan(), frames, 5, {.sample = true, .seed = 7}).latents;
  auto b = encode_all(wan(), frames, 1, {.sample = true, .seed = 7}).latents;
  auto c = encode_all(wan(), frames, 5, {.sample = true, .seed = 8}).latents;
  EXPECT_TRUE(torch::allclose(a, b, 1e-5, 1e-5)) << "same seed, different pushes";
  EXPECT_FALSE(torch::allclose(a, c)) << "different seeds gave the same sample";
  EXPECT_FALSE(torch::allclose(a, mean));
}

TEST(WanVae, OriginalCheckpointLoadsToTheSameModel) {
  LATENT_REQUIRE_FIXTURES();
  auto original = load_vae(fixtures_dir() / "wan_original.pth");
  EXPECT_EQ(original->spec().latent_channels, 8);
  auto frames = torch::rand({5, 3, 32, 64}) * 2 - 1;
  // The .pth has no config, so its latents are normalised with Wan 2.1's published statistics (or identity for
  // other widths); compare in VAE space.
  auto raw = [](const std::shared_ptr<Vae>& v, const torch::Tensor& z) {
    return z / v->spec().latent_scale.reshape({1, -1, 1, 1}) + v->spec().latent_shift.reshape({1, -1, 1, 1});
  };
  EXPECT_LE(
      rel_err(raw(original, encode_all(original, frames, 5).latents), raw(wan(), encode_all(wan(), frames, 5).latents)),
      1e-6);
}

TEST(WanVae, SingleFileBf16WithConfigInMetadata) {
  LATENT_REQUIRE_FIXTURES();
  auto single = load_vae(fixtures_dir() / "wan_single_bf16.safetensors");
  EXPECT_EQ(single->spec().latent_channels, 8);
  auto ref = SafetensorsFile::open(fixtures_dir() / "wan_cases.safetensors");
  auto frames = clip_frames(ref.tensor("input.9x48x80"));
  auto want = to_diffusion(*wan(), ref.tensor("mean.9x48x80"));
  // bf16 weights keep 8 bits of mantissa: a relative error of a few 1e-2 through ~20 layers is expected.
  EXPECT_LE(rel_err(encode_all(single, frames, 9).latents, want), 0.1);
  auto bf16 = load_vae(fixtures_dir() / "wan", {.dtype = torch::kBFloat16});
  auto got = encode_all(bf16, frames, 9).latents;
  EXPECT_EQ(got.scalar_type(), torch::kBFloat16);
  EXPECT_LE(rel_err(got, want), 0.1);
}

TEST(WanVae, RefusesSizesThatAreNotMultiplesOf8) {
  LATENT_REQUIRE_FIXTURES();
  StreamingEncoder enc(wan());
  try {
    enc.push(torch::zeros({1, 3, 44, 80}));
    FAIL() << "44x80 accepted";
  } catch (const ModelError& e) {
    EXPECT_NE(std::string(e.what()).find("multiples of 8"), std::string::npos) << e.what();
  }
  StreamingEncoder ok(wan());
  ok.push(torch::zeros({1, 3, 48, 80}));
  EXPECT_THROW(ok.push(torch::zeros({1, 3, 48, 88})), std::invalid_argument);  // size change mid-clip
  EXPECT_THROW(ok.push(torch::zeros({1, 4, 48, 80})), std::invalid_argument);  // 4 channels
  EXPECT_NO_THROW(ok.push(torch::zeros({0, 3, 48, 80})));                      // zero frames
  EXPECT_EQ(ok.finish().size(), 0);
}
