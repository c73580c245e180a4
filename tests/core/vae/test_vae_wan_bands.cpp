// Exact spatial bands for the Wan family: a stream computed band by band (each band from a crop with the rows
// its convolutions read, with its own caches) equals the whole-frame stream, for Wan 2.1 and Wan 2.2 configs,
// the shipped default model, and band heights from one latent row (far smaller than the halo) to one band.
#include <gtest/gtest.h>
#include <torch/types.h>
#include <torch/utils.h>

#include "latent/runtime/default_model.h"
#include "latent/vae/sharded_streaming.h"
#include "latent/vae/streaming.h"
#include "latent/vae/vae.h"
#include "vae_fixtures.h"

using namespace latent;
using namespace latent::testing;

namespace {

// Both sides run the same float32 operations on the same values; only convolutions over crops of other heights
// may sum in another order (oneDNN picks blockings by shape), a few ulp per layer.
constexpr double kTol = 1e-5;

// Irregular pushes, so bands meet every chunk shape the stream makes (1 frame, 4k frames, a padded tail).
const std::vector<int64_t> kPushes = {2, 1, 7, 3};

// `ranks` copies of the model make a patch-parallel stream (one thread per rank, CPU store backend).
std::vector<std::shared_ptr<const Vae>> ranks_of(const std::shared_ptr<const Vae>& vae, int ranks) {
  return std::vector<std::shared_ptr<const Vae>>(size_t(ranks), vae);
}

torch::Tensor encode(const std::shared_ptr<const Vae>& vae, const torch::Tensor& frames, BandOptions bands,
                     int ranks = 1) {
  EncoderOptions opt;
  opt.bands = bands;
  auto enc = open_encoder(ranks_of(vae, ranks), opt);
  std::vector<torch::Tensor> parts;
  for (int64_t i = 0, k = 0; i < frames.size(0); ++k) {
    const int64_t n = std::min(kPushes[size_t(k) % kPushes.size()], frames.size(0) - i);
    auto e = enc->push(frames.slice(0, i, i + n));
    if (e.latents.defined()) parts.push_back(e.latents);
    i += n;
  }
  auto e = enc->finish();
  if (e.latents.defined()) parts.push_back(e.latents);
  return torch::cat(parts, 0);
}

torch::Tensor encode(const std::shared_ptr<const Vae>& vae, const torch::Tensor& frames, int64_t band) {
  return encode(vae, frames, BandOptions{band, 0});
}

torch::Tensor decode(const std::shared_ptr<const Vae>& vae, const torch::Tensor& latents, BandOptions bands,
                     int ranks = 1) {
  DecoderOptions opt;
  opt.bands = bands;
  opt.max_chunk_latents = 2;
  auto dec = open_decoder(ranks_of(vae, ranks), opt);
  std::vector<torch::Tensor> parts;
  for (int64_t i = 0, k = 0; i < latents.size(0); ++k) {
    const int64_t n = std::min<int64_t>(1 + k % 2, latents.size(0) - i);
    auto f = dec->push(latents.slice(0, i, i + n));
    if (f.defined()) parts.push_back(f);
    i += n;
  }
  auto f = dec->finish();
  if (f.defined()) parts.push_back(f);
  return torch::cat(parts, 0);
}

torch::Tensor decode(const std::shared_ptr<const Vae>& vae, const torch::Tensor& latents, int64_t band) {
  return decode(vae, latents, BandOptions{band, 0});
}

// Frames with structure at every scale, so rows far apart differ and a band that read the wrong rows shows.
torch::Tensor frames(int64_t t, int64_t h, int64_t w) {
  torch::manual_seed(7);
  return (torch::rand({t, 3, h, w}) * 2 - 1).clamp(-1, 1);
}

void expect_bands_exact(const std::shared_ptr<const Vae>& vae, int64_t h, int64_t w,
                        const std::vector<int64_t>& latent_band_rows) {
  const int64_t sf = vae->spec().spatial_factor;
  const torch::Tensor x = frames(9, h, w);
  const torch::Tensor whole = encode(vae, x, 0);
  const torch::Tensor whole_frames = decode(vae, whole, 0);
  for (int64_t rows : latent_band_rows) {
    SCOPED_TRACE("bands of " + std::to_string(rows) + " latent rows (" + std::to_string(rows * sf) + " px), " +
                 std::to_string(h) + "x" + std::to_string(w));
    const torch::Tensor banded = encode(vae, x, rows * sf);
    EXPECT_LE(rel_err(banded, whole), kTol);
    EXPECT_LE(rel_err(decode(vae, whole, rows * sf), whole_frames), kTol);
  }
}

}  // namespace

TEST(WanBands, HaloIsStatedPerDirection) {
  LATENT_REQUIRE_FIXTURES();
  auto vae = load_vae(fixtures_dir() / "wan");
  // num_res_blocks 1, four levels: encoder 1 + ((((2 + 2) * 2 + 2) * 2 + 2) * 2 + 2) px above, decoder rows
  // from res1, three up levels and conv_out. Bands of one row must be correct however far this reaches.
  EXPECT_GT(vae->band_halo(VaeState::Role::encoder), 4 * vae->spec().spatial_factor);
  EXPECT_GT(vae->band_halo(VaeState::Role::decoder), 4);
}

TEST(WanBands, Wan21EqualsWholeFrames) {
  LATENT_REQUIRE_FIXTURES();
  // 20 latent rows: bands of 1 (every crop mostly halo), 3 (the last band shorter), 7, 20 (one band).
  expect_bands_exact(load_vae(fixtures_dir() / "wan"), 160, 40, {1, 3, 7, 20});
}

TEST(WanBands, Wan22EqualsWholeFrames) {
  LATENT_REQUIRE_FIXTURES();
  // Spatial factor 16 (2x2 patches): 12 latent rows.
  expect_bands_exact(load_vae(fixtures_dir() / "wan22"), 192, 32, {1, 5, 12});
}

TEST(WanBands, DefaultModelEqualsWholeFrames) { expect_bands_exact(load_vae(find_default_model()), 176, 48, {2, 9}); }

TEST(WanBands, RefusedWhereNotExact) {
  LATENT_REQUIRE_FIXTURES();
  auto cog = load_vae(fixtures_dir() / "cogvideox");
  EncoderOptions opt;
  opt.bands.height = 64;
  try {
    StreamingEncoder enc(cog, opt);
    FAIL() << "CogVideoX accepted bands";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("tile-size"), std::string::npos) << e.what();
  }
  opt.bands.height = 12;
  try {
    StreamingEncoder enc(load_vae(fixtures_dir() / "wan"), opt);
    FAIL() << "a band height off the spatial factor was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("multiple of 8"), std::string::npos) << e.what();
  }
}

// max-memory's automatic default: a budget (on a GPU, 90% of its free memory) that no bands fit takes the bands of
// the least estimate rather than failing the stream; on the CPU it sets no budget, so frames are computed whole.
TEST(WanBands, AutomaticBudgetTakesTheLeastEstimateAndNothingOnTheCpu) {
  LATENT_REQUIRE_FIXTURES();
  auto vae = load_vae(fixtures_dir() / "wan");
  BandOptions b;
  b.max_bytes = 1;
  EXPECT_THROW(budget_band_rows(*vae, VaeState::Role::encoder, b, 20, 5, 8), std::invalid_argument);
  b.automatic = true;
  const int64_t least = budget_band_rows(*vae, VaeState::Role::encoder, b, 20, 5, 8);
  ASSERT_GT(least, 0);
  for (int64_t r = 1; r <= 20; ++r)
    EXPECT_LE(vae->band_chunk_bytes(VaeState::Role::encoder, least, 20, 5, 8),
              vae->band_chunk_bytes(VaeState::Role::encoder, r, 20, 5, 8))
        << r;
  // What a first chunk sets: nothing for an explicit height or automatic on the CPU; whole frames (0) for a budget
  // they fit, but one band for a rank, which was handed a crop; the budget's bands otherwise.
  BandOptions height;
  height.height = 64;
  EXPECT_EQ(first_chunk_band_rows(*vae, VaeState::Role::encoder, height, false, 20, 5, 8), -1);
  b.max_bytes = 0;
  EXPECT_EQ(first_chunk_band_rows(*vae, VaeState::Role::encoder, b, false, 20, 5, 8), -1);
  BandOptions roomy;
  roomy.max_bytes = size_t(1) << 40;
  EXPECT_EQ(first_chunk_band_rows(*vae, VaeState::Role::encoder, roomy, false, 20, 5, 8), 0);
  EXPECT_EQ(first_chunk_band_rows(*vae, VaeState::Role::encoder, roomy, true, 7, 5, 8), 7);
  b.max_bytes = 1;
  EXPECT_EQ(first_chunk_band_rows(*vae, VaeState::Role::encoder, b, false, 20, 5, 8), least);
  const torch::Tensor x = frames(5, 160, 40);
  BandOptions automatic;
  automatic.automatic = true;
  EXPECT_TRUE(torch::equal(encode(vae, x, automatic), encode(vae, x, 0)));  // bands would differ by a few ulp
}

// The bands' caches are kept once for the frame (vae/band_caches.h): after each chunk the state holds exactly
// what whole frames' does, however much the bands' crops overlap, and so stays flat over the clip as theirs does
// (StreamingMemory.EncoderAndDecoderHoldConstantStateOverALongClip).
TEST(WanBands, StateHoldsTheWholeFramesCachesOnce) {
  LATENT_REQUIRE_FIXTURES();
  auto vae = load_vae(fixtures_dir() / "wan");
  EncoderOptions opt;
  opt.bands.height = 16;  // 10 bands over 160 rows, each crop mostly halo
  StreamingEncoder banded(vae, opt), whole(vae);
  const torch::Tensor x = frames(21, 160, 40);
  DecoderOptions dopt;
  dopt.bands.height = 16;
  StreamingDecoder banded_dec(vae, dopt), whole_dec(vae);
  for (int64_t i = 0; i < x.size(0); ++i) {
    banded.push(x.slice(0, i, i + 1));
    const EncodedLatents e = whole.push(x.slice(0, i, i + 1));
    EXPECT_EQ(banded.state_bytes(), whole.state_bytes()) << "encoder, after frame " << i;
    if (e.size() == 0) continue;
    banded_dec.push(e.latents);
    whole_dec.push(e.latents);
    EXPECT_EQ(banded_dec.state_bytes(), whole_dec.state_bytes()) << "decoder, after frame " << i;
  }
  banded.reset();
  EXPECT_EQ(banded.state_bytes(), 0u);
}

// Bands with patch parallel: each rank computes the bands of its own rows from a crop of the frames (whole
// latents when decoding) and recomputes their halos; the ranks exchange only the attention's keys and values and
// its output. The result is one device's whole frames, for ranks thinner than the halo too.
void expect_ranks_of_bands_exact(const std::shared_ptr<const Vae>& vae, int64_t h, int64_t w,
                                 const std::vector<std::pair<int, BandOptions>>& cases) {
  const torch::Tensor x = frames(9, h, w);
  const torch::Tensor whole = encode(vae, x, 0);
  const torch::Tensor whole_frames = decode(vae, whole, 0);
  for (const auto& [ranks, bands] : cases) {
    SCOPED_TRACE(std::to_string(ranks) + " ranks, band height " + std::to_string(bands.height) + ", budget " +
                 std::to_string(bands.max_bytes >> 20) + " MiB");
    EXPECT_LE(rel_err(encode(vae, x, bands, ranks), whole), kTol);
    EXPECT_LE(rel_err(decode(vae, whole, bands, ranks), whole_frames), kTol);
  }
}

TEST(WanBands, RanksOfBandsEqualWholeFrames) {
  LATENT_REQUIRE_FIXTURES();
  // 20 latent rows: 2 ranks of 10 in bands of 1 and 4; 3 ranks (7, 7, 6 rows, each thinner than the encoder's
  // halo) in bands of 2; a budget each rank's rows fit whole (one band per rank), and one that 3 ranks' encoders
  // fit whole and their decoders only in bands of 2 rows (estimates of 7.0 and 9.6 MiB at 40 px wide).
  expect_ranks_of_bands_exact(
      load_vae(fixtures_dir() / "wan"), 160, 40,
      {{2, {8, 0}}, {2, {32, 0}}, {3, {16, 0}}, {2, {0, size_t(1) << 40}}, {3, {0, size_t(10) << 20}}});
}

TEST(WanBands, RanksOfBandsEqualWholeFramesWan22) {
  LATENT_REQUIRE_FIXTURES();
  expect_ranks_of_bands_exact(load_vae(fixtures_dir() / "wan22"), 192, 32, {{2, {16, 0}}, {3, {32, 0}}});
}
