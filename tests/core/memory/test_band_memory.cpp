// Exact Wan bands bound activation memory by the band, not the frame, and max_bytes picks bands whose
// activations stay within the budget. Runs in the core-memory test (one process per suite, the CPU heap on), where
// heap_bytes() is the stream's resident activation memory.
#include <gtest/gtest.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <fstream>
#include <string>

#include "latent/runtime/default_model.h"
#include "latent/vae/streaming.h"
#include "vae_fixtures.h"

using namespace latent;
using namespace latent::testing;

namespace {

struct BandRun {
  size_t heap = 0;        // the stream's activation heap after the clip's chunks
  size_t state = 0;       // its carried caches
  int64_t band_rows = 0;  // what the stream ran with (from the options or the budget)
};

constexpr double kMiB = 1 << 20;

// 9 frames (three chunks) encoded, then their latents decoded one chunk of 2 at a time.
BandRun encode(const std::shared_ptr<const Vae>& vae, const torch::Tensor& x, BandOptions bands) {
  EncoderOptions opt;
  opt.bands = bands;
  StreamingEncoder enc(vae, opt);
  enc.push(x.slice(0, 0, 5));
  enc.push(x.slice(0, 5));
  BandRun r;
  r.heap = enc.heap_bytes();
  r.state = enc.state_bytes();
  return r;
}

BandRun decode(const std::shared_ptr<const Vae>& vae, const torch::Tensor& z, BandOptions bands) {
  DecoderOptions opt;
  opt.bands = bands;
  opt.max_chunk_latents = 2;
  StreamingDecoder dec(vae, opt);
  dec.push(z.slice(0, 0, 1));
  dec.push(z.slice(0, 1));
  BandRun r;
  r.heap = dec.heap_bytes();
  r.state = dec.state_bytes();
  return r;
}

}  // namespace

// At 1024x128, bands cut the stream's heap (activations and caches) below the whole frame's, and the estimate that
// max_bytes relies on is an upper bound on the measured heap that is not more than 2.5x it, in both directions
// and for bands from 64 to 256 pixels. A budget gives a heap within it.
TEST(StreamingMemory, WanBandsBoundActivationsByTheBand) {
  auto vae = load_vae(find_default_model());
  torch::manual_seed(5);
  const int64_t h = 1024, w = 128, sf = vae->spec().spatial_factor;
  const auto x = torch::rand({9, 3, h, w}) * 2 - 1;
  const auto z = torch::randn({3, vae->spec().latent_channels, h / sf, w / sf});
  for (auto role : {VaeState::Role::encoder, VaeState::Role::decoder}) {
    const bool enc = role == VaeState::Role::encoder;
    const char* what = enc ? "encode" : "decode";
    auto run = [&](BandOptions b) { return enc ? encode(vae, x, b) : decode(vae, z, b); };
    const int64_t frames = enc ? 8 : 2;  // the chunks' frames (max_chunk_frames) or latents
    auto check = [&](const BandRun& r, int64_t band_px, const char* label) {
      const double est = double(vae->band_chunk_bytes(role, band_px / sf, h / sf, w / sf, frames));
      std::printf("%s %s: heap %.1f MiB (caches %.1f), estimate %.1f MiB\n", what, label, r.heap / kMiB, r.state / kMiB,
                  est / kMiB);
      EXPECT_LE(double(r.heap), est) << what << " " << label;
      EXPECT_LE(est, 2.5 * double(r.heap)) << what << " " << label;
    };
    const BandRun whole = run({});
    check(whole, h, "whole frames");
    for (int64_t band : {64, 128, 256}) {
      BandOptions b;
      b.height = band;
      const BandRun banded = run(b);
      check(banded, band, ("bands of " + std::to_string(band) + " px").c_str());
      EXPECT_LT(banded.heap, whole.heap) << what << " bands of " << band;
    }
    BandOptions budget;  // what bands of 128 px are estimated to need: below whole frames' estimate
    budget.max_bytes = vae->band_chunk_bytes(role, 128 / sf, h / sf, w / sf, frames);
    const BandRun fitted = run(budget);
    std::printf("%s budget %.1f MiB: heap %.1f MiB\n", what, budget.max_bytes / kMiB, fitted.heap / kMiB);
    EXPECT_LE(fitted.heap, budget.max_bytes) << what;
  }
}

namespace {

// An h x w clip of uint8 frames streams through the default model in bands chosen by a budget: 5 frames encoded
// (the 1-frame first chunk and a 4-frame one) and their 2 latents decoded, with the process's peak RSS above what
// it held before within the budget. The budget is below the whole frames' estimates in both directions, so it is
// the bands that keep the stream inside it. Most of the peak is what no band height removes: the carried caches
// (two frames of every causal conv's input, kept once for all bands) and the chunk's frames in float.
void expect_streams_in_bands_within(int64_t h, int64_t w, double budget_mib) {
  auto vae = load_vae(find_default_model());
  const int64_t sf = vae->spec().spatial_factor;
  BandOptions bands;
  bands.max_bytes = size_t(budget_mib * kMiB);
  for (auto role : {VaeState::Role::encoder, VaeState::Role::decoder}) {
    const bool enc = role == VaeState::Role::encoder;
    const int64_t frames = enc ? 4 : 1;
    const double whole = double(vae->band_chunk_bytes(role, h / sf, h / sf, w / sf, frames));
    const int64_t rows = budget_band_rows(*vae, role, bands, h / sf, w / sf, frames);
    std::printf("whole-frame %s estimate: %.0f MiB; the budget's bands: %lld px\n", enc ? "encoder" : "decoder",
                whole / kMiB, static_cast<long long>(rows * sf));
    ASSERT_GT(whole, double(bands.max_bytes)) << "the budget must need bands to mean anything";
    ASSERT_GT(rows, 0);
    ASSERT_LT(rows, h / sf);
  }
  torch::manual_seed(9);
  const auto frames = torch::randint(0, 256, {5, h, w, 3}, torch::kByte);
  const double before = status_mib("VmRSS:");
  EncoderOptions eo;
  eo.bands = bands;
  eo.max_chunk_frames = 4;
  DecoderOptions dopt;
  dopt.bands = bands;
  torch::Tensor latents;
  int64_t decoded = 0;
  {
    StreamingEncoder enc(vae, eo);
    auto a = enc.push(frames.slice(0, 0, 1));
    auto b = enc.push(frames.slice(0, 1));
    latents = torch::cat({a.latents, b.latents}, 0);
  }
  {
    StreamingDecoder dec(vae, dopt);
    for (int64_t i = 0; i < latents.size(0); ++i) decoded += dec.push(latents.slice(0, i, i + 1)).size(0);
    auto rest = dec.finish();
    if (rest.defined()) decoded += rest.size(0);
  }
  const double peak = status_mib("VmHWM:") - before;
  std::printf("%lldx%lld through the default model in bands (budget %.0f MiB): peak RSS +%.0f MiB\n",
              static_cast<long long>(h), static_cast<long long>(w), budget_mib, peak);
  EXPECT_EQ(latents.size(0), 2);
  EXPECT_EQ(decoded, 5);
  EXPECT_LE(peak, budget_mib);
}

}  // namespace

// The CI-sized run of the 4K one below: a sixteenth of its pixels and of its budget, the same code path.
TEST(StreamingMemory, StreamsThroughTheDefaultModelInBandsWithinABudget) {
  if (!reset_peak_rss()) GTEST_SKIP() << "/proc/self/clear_refs is not writable: no way to measure peak RSS";
  expect_streams_in_bands_within(544, 960, 512);
}

// 2160x3840 with an 8 GiB budget (measured: +7.1-7.2 GiB on the 2-core CI machine; +9.3 GiB while every band kept
// caches of its own crop; the decoder's whole-frame caches alone are 4.7 GiB). About 4 minutes on 2 cores: opt-in.
TEST(StreamingMemory, Wan4KStreamsThroughTheDefaultModelInBands) {
  if (!scale_tests_enabled())
    GTEST_SKIP() << "[opt-in] a 4K scale run: LATENT_SCALE_TESTS=1 (meson test --suite scale)";
  if (!reset_peak_rss()) GTEST_SKIP() << "/proc/self/clear_refs is not writable: no way to measure peak RSS";
  expect_streams_in_bands_within(2160, 3840, 8192);
}
