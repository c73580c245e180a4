// A tiled CogVideoX decode keeps one tile's activations, however many tiles the frame has: the tiles run one
// after another and share one activation heap (core/src/vae/tiling.cpp). Runs in the core-memory test, alone in a
// fresh process with glibc returning freed blocks at once, so RSS follows live memory.
#include <gtest/gtest.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <fstream>
#include <string>

#include "latent/vae/sharded_streaming.h"
#include "latent/vae/streaming.h"
#include "vae_fixtures.h"

using namespace latent;
using namespace latent::testing;

namespace {

struct DecodeMemory {
  double peak_mib = 0;   // peak RSS above RSS before the stream was opened
  double heap_mib = 0;   // the stream's heap (touched bytes) after its last chunk
  double state_mib = 0;  // the carried caches, most after any push
  double out_mib = 0;    // the most frames one push or finish() returned
};

// Decodes `latents` [T', C, h, w] one latent per push and drops the frames as they come out.
DecodeMemory decode(const std::shared_ptr<const Vae>& vae, const torch::Tensor& latents, TileOptions tile) {
  DecodeMemory run;
  reset_peak_rss();
  const double before = status_mib("VmRSS:");
  {
    DecoderOptions opt;
    opt.tile = tile;
    auto dec = open_decoder({vae}, opt);
    for (int64_t i = 0; i < latents.size(0); ++i) {
      const auto frames = dec->push(latents.slice(0, i, i + 1));
      if (frames.defined()) run.out_mib = std::max(run.out_mib, double(frames.nbytes()) / (1 << 20));
      run.heap_mib = std::max(run.heap_mib, double(dec->heap_bytes()) / (1 << 20));
      run.state_mib = std::max(run.state_mib, double(dec->state_bytes()) / (1 << 20));
    }
    const auto frames = dec->finish();
    if (frames.defined()) run.out_mib = std::max(run.out_mib, double(frames.nbytes()) / (1 << 20));
  }
  run.peak_mib = status_mib("VmHWM:") - before;
  return run;
}

}  // namespace

TEST(StreamingMemory, TiledCogVideoXDecodeKeepsOneTilesActivations) {
  LATENT_REQUIRE_FIXTURES();
  if (!reset_peak_rss()) GTEST_SKIP() << "/proc/self/clear_refs is not writable: no way to measure peak RSS";
  auto vae = load_vae(fixtures_dir() / "cogvideox");
  torch::manual_seed(3);
  // 64x64-pixel tiles (8x8 latents) starting every 6 latents: 20x20 latents (160x160 pixels) are 3x3 tiles.
  TileOptions tile;
  tile.height = tile.width = 64;
  tile.overlap_height = tile.overlap_width = 0.25;
  const auto clip = torch::randn({3, 8, 20, 20});  // 9 frames
  const auto one_tile = clip.slice(2, 0, 8).slice(3, 0, 8);

  decode(vae, one_tile, tile);  // first use: LibTorch's and oneDNN's own caches, kept for the process
  const DecodeMemory one = decode(vae, one_tile, tile);
  const DecodeMemory tiled = decode(vae, clip, tile);
  const DecodeMemory whole = decode(vae, clip, {});
  for (auto [name, r] : {std::pair{"one tile", one}, {"3x3 tiles", tiled}, {"untiled", whole}}) {
    std::printf("%-9s peak RSS +%.1f MiB, heap %.1f MiB, carried caches %.1f MiB, frames out %.1f MiB\n", name,
                r.peak_mib, r.heap_mib, r.state_mib, r.out_mib);
  }
  // Each tile carries its own caches from chunk to chunk (partly in the shared heap), so what a tiled stream holds
  // is one tile's activations and every tile's caches; the rest (the tiles' frames, the stitched ones, the blend's
  // temporaries) is small beside them. Measured 47.6 MiB heap and +78.4 MiB peak for 22.8 / +23.9 MiB one tile
  // and 42.6 MiB of caches; with a heap per tile, as before, the peak was +269.8 MiB.
  EXPECT_LT(tiled.heap_mib, one.heap_mib + tiled.state_mib);
  EXPECT_LT(tiled.peak_mib, 1.5 * (one.peak_mib + tiled.state_mib));
  // The frame's activations, 6.25 times a tile's, are what tiling saves (measured +149.0 MiB).
  EXPECT_GT(whole.peak_mib, 1.5 * tiled.peak_mib);
}
