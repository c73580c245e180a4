// CogVideoX spatial tiling against diffusers' enable_tiling() (cogvideox_tiling.safetensors, made at build time by
// tests/fixtures/gen_vae_fixtures.py with 48x40-pixel tiles and the default overlaps).
#include <gtest/gtest.h>
#include <torch/types.h>

#include "latent/vae/sharded_streaming.h"
#include "latent/vae/streaming.h"
#include "latent/vae/vae.h"
#include "vae/tiling.h"
#include "vae_fixtures.h"

using namespace latent;
using namespace latent::testing;

namespace {

// Only the summation order of the convolutions (tile-sized, as in diffusers) and of GroupNorm can differ.
constexpr double kTol = 1e-5;

std::shared_ptr<Vae> cog() {
  static std::shared_ptr<Vae> model = load_vae(fixtures_dir() / "cogvideox");
  return model;
}

TileOptions fixture_tiles() {
  TileOptions t;
  t.height = 48;
  t.width = 40;
  return t;
}

EncodedLatents encode_tiled(const torch::Tensor& frames, int64_t step, TileOptions tile) {
  EncoderOptions opt;
  opt.tile = tile;
  auto enc = open_encoder({cog()}, opt);
  std::vector<torch::Tensor> parts;
  EncodedLatents all;
  auto add = [&](EncodedLatents e) {
    if (!e.latents.defined()) return;
    parts.push_back(e.latents);
    all.real_frames.insert(all.real_frames.end(), e.real_frames.begin(), e.real_frames.end());
  };
  for (int64_t i = 0; i < frames.size(0); i += step) add(enc->push(frames.slice(0, i, i + step)));
  add(enc->finish());
  all.latents = torch::cat(parts, 0);
  return all;
}

torch::Tensor decode_tiled(const torch::Tensor& latents, int64_t step, TileOptions tile) {
  DecoderOptions opt;
  opt.tile = tile;
  auto dec = open_decoder({cog()}, opt);
  std::vector<torch::Tensor> parts;
  for (int64_t i = 0; i < latents.size(0); i += step) {
    auto f = dec->push(latents.slice(0, i, i + step));
    if (f.defined()) parts.push_back(f);
  }
  auto f = dec->finish();
  if (f.defined()) parts.push_back(f);
  return torch::cat(parts, 0);
}

}  // namespace

TEST(CogVideoXTiling, GeometryFollowsDiffusers) {
  LATENT_REQUIRE_FIXTURES();
  const TileGeometry e = encoder_tile_geometry(*cog(), fixture_tiles());
  EXPECT_EQ(e.rows.stride, 40);  // int(48 * 5/6)
  EXPECT_EQ(e.cols.stride, 32);  // int(40 * 4/5)
  EXPECT_EQ(e.rows.blend, 1);    // int(6 / 6)
  EXPECT_EQ(e.rows.keep, 5);
  EXPECT_EQ(e.cols.keep, 4);
  const TileGeometry d = decoder_tile_geometry(*cog(), fixture_tiles());
  EXPECT_EQ(d.rows.tile, 6);
  EXPECT_EQ(d.rows.stride, 5);
  EXPECT_EQ(d.cols.stride, 4);
  EXPECT_EQ(d.rows.blend, 8);
  EXPECT_EQ(d.cols.keep, 32);
}

TEST(CogVideoXTiling, EncodeMatchesDiffusersEnableTiling) {
  LATENT_REQUIRE_FIXTURES();
  auto ref = SafetensorsFile::open(fixtures_dir() / "cogvideox_tiling.safetensors");
  for (const Case& c : cases(ref)) {
    auto frames = clip_frames(ref.tensor("input." + c.key()));
    auto want = to_diffusion(*cog(), ref.tensor("mean." + c.key()));
    for (int64_t step : {int64_t(1), c.t}) {
      auto got = encode_tiled(frames, step, fixture_tiles());
      const double err = rel_err(got.latents, want);
      EXPECT_LE(err, kTol) << c.key() << " pushes of " << step;
      if (step == 1) std::printf("cogvideox tiled encode %-9s max rel err %.3g\n", c.key().c_str(), err);
    }
  }
}

TEST(CogVideoXTiling, DecodeMatchesDiffusersEnableTiling) {
  LATENT_REQUIRE_FIXTURES();
  auto ref = SafetensorsFile::open(fixtures_dir() / "cogvideox_tiling.safetensors");
  for (const Case& c : cases(ref)) {
    auto latents = to_diffusion(*cog(), ref.tensor("mean." + c.key()));
    auto want = clip_frames(ref.tensor("decoded." + c.key()));
    for (int64_t step : {int64_t(1), latents.size(0)}) {
      auto got = decode_tiled(latents, step, fixture_tiles());
      const double err = rel_err(got, want);
      EXPECT_LE(err, kTol) << c.key() << " pushes of " << step;
      if (step == 1) std::printf("cogvideox tiled decode %-9s max rel err %.3g\n", c.key().c_str(), err);
    }
  }
}

// A frame that fits in one tile is coded untiled, as diffusers does: the plain fixture is the reference.
TEST(CogVideoXTiling, FrameWithinOneTileIsUntiled) {
  LATENT_REQUIRE_FIXTURES();
  auto ref = SafetensorsFile::open(fixtures_dir() / "cogvideox_cases.safetensors");
  const std::string key = "9x32x64";
  TileOptions tile;
  tile.height = 48;
  tile.width = 80;
  auto latents = to_diffusion(*cog(), ref.tensor("mean." + key));
  EXPECT_LE(rel_err(encode_tiled(clip_frames(ref.tensor("input." + key)), 9, tile).latents, latents), 1e-4);
  EXPECT_LE(rel_err(decode_tiled(latents, 3, tile), clip_frames(ref.tensor("decoded." + key))), 1e-4);
}

TEST(CogVideoXTiling, RefusedWhereNotExact) {
  LATENT_REQUIRE_FIXTURES();
  auto wan = load_vae(fixtures_dir() / "wan");
  DecoderOptions d;
  d.tile = fixture_tiles();
  EXPECT_THROW(open_decoder({wan}, d), std::invalid_argument);
  EncoderOptions e;
  e.tile = fixture_tiles();
  e.sample = true;
  EXPECT_THROW(open_encoder({cog()}, e), std::invalid_argument);
  e.sample = false;
  e.tile.width = 48;  // starts every 38 pixels: crops the port would refuse
  EXPECT_THROW(open_encoder({cog()}, e), std::invalid_argument);
  e.tile.width = 0;
  EXPECT_THROW(open_encoder({cog()}, e), std::invalid_argument);
}
