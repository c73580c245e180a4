// Spatially tiled streams for CogVideoX, the way diffusers' enable_tiling() codes a clip (TileOptions in
// latent/vae/streaming.h). Every tile is a plain stream over its crop; all tiles take the same pushes, so they
// emit the same chunks at the same time and each chunk is blended and stitched as soon as it is out.
#pragma once

#include <memory>
#include <vector>

#include "latent/vae/streaming.h"

namespace latent {

// Where tiles start along one axis and how their outputs are stitched, in diffusers' integer arithmetic.
struct TileAxis {
  int64_t tile = 0;    // tile length in input units (pixels when encoding, latents when decoding)
  int64_t stride = 0;  // distance between tile starts, input units
  int64_t blend = 0;   // overlap blended with the previous tile, output units
  int64_t keep = 0;    // output rows or columns each tile contributes
  std::vector<int64_t> starts(int64_t size) const;
};

struct TileGeometry {
  TileAxis rows, cols;
};

// Throws std::invalid_argument for a non-CogVideoX model or settings diffusers could not run.
TileGeometry encoder_tile_geometry(const Vae& vae, const TileOptions& tile);
TileGeometry decoder_tile_geometry(const Vae& vae, const TileOptions& tile);

std::unique_ptr<EncoderStream> open_tiled_encoder(std::shared_ptr<const Vae> vae, const EncoderOptions& options);
std::unique_ptr<DecoderStream> open_tiled_decoder(std::shared_ptr<const Vae> vae, const DecoderOptions& options);

}  // namespace latent
