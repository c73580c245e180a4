#include "tiling.h"

#include <c10/core/InferenceMode.h>
#include <torch/types.h>

#include <algorithm>
#include <stdexcept>
#include <string>

#include "memory/heap.h"

namespace latent {
namespace {

using torch::Tensor;

void check_model(const Vae& vae, const TileOptions& tile) {
  if (vae.spec().family != "cogvideox") {
    throw std::invalid_argument("spatial tiling is implemented for CogVideoX only (diffusers' enable_tiling); " +
                                vae.spec().family +
                                " takes exact bands instead (band height / max-memory), leave the tile size at 0");
  }
  if (tile.height <= 0 || tile.width <= 0)
    throw std::invalid_argument("tiling needs both a tile height and a tile width in pixels");
  for (double f : {tile.overlap_height, tile.overlap_width}) {
    if (!(f > 0.0 && f < 1.0))
      throw std::invalid_argument("tile overlap must be a fraction in (0, 1); got " + std::to_string(f));
  }
}

// Python's int() of a positive double, which is what diffusers applies to every tile quantity.
int64_t trunc(double v) { return static_cast<int64_t>(v); }

TileAxis axis(int64_t tile, int64_t stride, int64_t blend, int64_t out_tile, const char* what) {
  if (tile <= 0 || stride <= 0 || out_tile <= 0) {
    throw std::invalid_argument(std::string("tile ") + what + " too small for the model's " +
                                "spatial factor and overlap (stride would be 0)");
  }
  // Each tile keeps out_tile - blend of its output and the next starts `stride` later: unless the two agree at the
  // output's scale, the kept pieces overlap or leave gaps and the frame comes out the wrong size (diffusers'
  // enable_tiling does just that with such settings; caps would then lie about the buffers).
  if (stride * out_tile != (out_tile - blend) * tile)
    throw std::invalid_argument(std::string("tiles of ") + std::to_string(tile) + " with this overlap start every " +
                                std::to_string(stride) + " but keep " + std::to_string(out_tile - blend) + " of " +
                                std::to_string(out_tile) + " (" + what +
                                "): the output would not be the frame's size; pick an overlap where tile x (1 - "
                                "overlap) and the kept part agree, e.g. 1/6 for tiles of 48 or 96 pixels");
  return {tile, stride, blend, out_tile - blend};
}

// diffusers' blend_v / blend_h: a linear ramp over the first `extent` rows (or columns) of b from the last ones
// of a, written into b. a has already been blended itself, as in diffusers, which blends the tiles in place.
void blend(const Tensor& a, const Tensor& b, int64_t dim, int64_t extent) {
  const int64_t e = std::min({a.size(dim), b.size(dim), extent});
  for (int64_t y = 0; y < e; ++y) {
    const double w = double(y) / double(e);
    b.select(dim, y).copy_(a.select(dim, a.size(dim) - e + y) * (1.0 - w) + b.select(dim, y) * w);
  }
}

// Tiles [T, C, h, w] in raster order -> the stitched [T, C, H, W].
Tensor stitch(std::vector<std::vector<Tensor>>& grid, const TileGeometry& g) {
  std::vector<Tensor> rows;
  for (size_t i = 0; i < grid.size(); ++i) {
    std::vector<Tensor> row;
    for (size_t j = 0; j < grid[i].size(); ++j) {
      const Tensor& t = grid[i][j];
      if (i > 0) blend(grid[i - 1][j], t, 2, g.rows.blend);
      if (j > 0) blend(grid[i][j - 1], t, 3, g.cols.blend);
      row.push_back(t.slice(2, 0, g.rows.keep).slice(3, 0, g.cols.keep));
    }
    rows.push_back(torch::cat(row, 3));
  }
  return torch::cat(rows, 2);
}

struct Crop {
  int64_t row, rows, col, cols;
};

// The crops of a height x width input, row-major; one crop of everything when it fits in a tile.
std::vector<Crop> crops(const TileGeometry& g, int64_t height, int64_t width, size_t* per_row) {
  if (height <= g.rows.tile && width <= g.cols.tile) {
    *per_row = 1;
    return {{0, height, 0, width}};
  }
  std::vector<Crop> out;
  const auto rs = g.rows.starts(height), cs = g.cols.starts(width);
  for (int64_t r : rs)
    for (int64_t c : cs) out.push_back({r, std::min(g.rows.tile, height - r), c, std::min(g.cols.tile, width - c)});
  *per_row = cs.size();
  return out;
}

std::vector<std::vector<Tensor>> as_grid(std::vector<Tensor> tiles, size_t per_row) {
  std::vector<std::vector<Tensor>> grid;
  for (size_t k = 0; k < tiles.size(); k += per_row)
    grid.emplace_back(tiles.begin() + long(k), tiles.begin() + long(k + per_row));
  return grid;
}

std::string size_changed(int64_t w0, int64_t h0, int64_t w, int64_t h) {
  return "frame size changed from " + std::to_string(w0) + "x" + std::to_string(h0) + " to " + std::to_string(w) + "x" +
         std::to_string(h) + " within a clip; finish() or reset() first";
}

class TiledEncoder : public EncoderStream {
 public:
  TiledEncoder(std::shared_ptr<const Vae> vae, const EncoderOptions& options)
      : vae_(std::move(vae)), geometry_(encoder_tile_geometry(*vae_, options.tile)), inner_(options) {
    if (options.sample) {
      throw std::invalid_argument(
          "tiled encoding gives the posterior mean only; sampling would have to blend the log-variance too");
    }
    if (options.shard) throw std::invalid_argument("spatial tiling and patch parallel cannot be combined");
    inner_.tile = {};
  }

  EncodedLatents push(const Tensor& frames) override {
    if (frames.dim() != 4) {
      throw std::invalid_argument("frames must be uint8 [T, H, W, 3] or float [T, 3, H, W]; got " +
                                  std::to_string(frames.dim()) + " dimensions");
    }
    if (frames.size(0) == 0) return {};
    const bool rgb8 = frames.scalar_type() == torch::kByte;
    const int64_t hd = rgb8 ? 1 : 2, wd = rgb8 ? 2 : 3, h = frames.size(hd), w = frames.size(wd);
    if (tiles_.empty()) {
      vae_->check_frame_size(w, h);
      crops_ = crops(geometry_, h, w, &per_row_);
      // The tiles run one after another on this thread, so one heap serves them all: each tile's chunk reuses the
      // blocks the previous tile's chunk freed, and the stream keeps one tile's activations resident, not one per tile.
      heap_ = ActivationHeap::for_device(vae_->device());
      for (size_t k = 0; k < crops_.size(); ++k)
        tiles_.push_back(std::make_unique<StreamingEncoder>(vae_, inner_, heap_));
      height_ = h;
      width_ = w;
    } else if (h != height_ || w != width_) {
      throw std::invalid_argument(size_changed(width_, height_, w, h));
    }
    std::vector<EncodedLatents> outs;
    for (size_t k = 0; k < tiles_.size(); ++k) {
      const Crop& c = crops_[k];
      outs.push_back(tiles_[k]->push(frames.narrow(hd, c.row, c.rows).narrow(wd, c.col, c.cols)));
    }
    return combine(std::move(outs));
  }

  EncodedLatents finish() override {
    std::vector<EncodedLatents> outs;
    for (auto& t : tiles_) outs.push_back(t->finish());
    EncodedLatents out = tiles_.empty() ? EncodedLatents{} : combine(std::move(outs));
    reset();
    return out;
  }

  void reset() override {
    tiles_.clear();
    heap_.reset();  // after the tiles, whose caches live in it
    crops_.clear();
    height_ = width_ = 0;
  }

  int64_t frames_in() const override { return tiles_.empty() ? 0 : tiles_[0]->frames_in(); }
  int64_t latents_out() const override { return tiles_.empty() ? 0 : tiles_[0]->latents_out(); }
  int64_t pending_frames() const override { return tiles_.empty() ? 0 : tiles_[0]->pending_frames(); }
  int64_t max_delay_frames() const override {
    const ChunkRule& r = vae_->spec().encode_chunks;
    return std::max<int64_t>(r.first, r.step) - 1;
  }
  size_t state_bytes() const override {
    size_t n = 0;
    for (const auto& t : tiles_) n += t->state_bytes();
    return n;
  }
  size_t heap_bytes() const override { return heap_ ? heap_->stats().touched : 0; }
  const Vae& vae() const override { return *vae_; }

 private:
  EncodedLatents combine(std::vector<EncodedLatents> outs) {
    if (outs.size() == 1 || !outs[0].latents.defined()) return std::move(outs[0]);
    c10::InferenceMode inference;
    std::vector<Tensor> tiles;
    for (auto& o : outs) tiles.push_back(o.latents);
    auto grid = as_grid(std::move(tiles), per_row_);
    EncodedLatents out = std::move(outs[0]);
    out.latents = stitch(grid, geometry_);
    return out;
  }

  std::shared_ptr<const Vae> vae_;
  TileGeometry geometry_;
  EncoderOptions inner_;
  std::shared_ptr<ActivationHeap> heap_;
  std::vector<std::unique_ptr<StreamingEncoder>> tiles_;
  std::vector<Crop> crops_;
  size_t per_row_ = 1;
  int64_t height_ = 0, width_ = 0;
};

class TiledDecoder : public DecoderStream {
 public:
  TiledDecoder(std::shared_ptr<const Vae> vae, const DecoderOptions& options)
      : vae_(std::move(vae)), geometry_(decoder_tile_geometry(*vae_, options.tile)), inner_(options) {
    if (options.shard) throw std::invalid_argument("spatial tiling and patch parallel cannot be combined");
    inner_.tile = {};
  }

  using DecoderStream::push;
  Tensor push(const Tensor& latents, const std::vector<int64_t>& real_frames = {}) override {
    if (!latents.defined()) return {};
    if (latents.dim() != 4) {
      throw std::invalid_argument("latents must be [T', C, h, w]; got " + c10::str(latents.sizes()));
    }
    if (latents.size(0) == 0) return {};
    const int64_t h = latents.size(2), w = latents.size(3);
    if (tiles_.empty()) {
      crops_ = crops(geometry_, h, w, &per_row_);
      // The tiles run one after another on this thread, so one heap serves them all: each tile's chunk reuses the
      // blocks the previous tile's chunk freed, and the stream keeps one tile's activations resident, not one per tile.
      heap_ = ActivationHeap::for_device(vae_->device());
      for (size_t k = 0; k < crops_.size(); ++k)
        tiles_.push_back(std::make_unique<StreamingDecoder>(vae_, inner_, heap_));
      height_ = h;
      width_ = w;
    } else if (h != height_ || w != width_) {
      throw std::invalid_argument("latent size changed from " + std::to_string(width_) + "x" + std::to_string(height_) +
                                  " to " + std::to_string(w) + "x" + std::to_string(h) +
                                  " within a clip; finish() or reset() first");
    }
    std::vector<Tensor> outs;
    for (size_t k = 0; k < tiles_.size(); ++k) {
      const Crop& c = crops_[k];
      outs.push_back(tiles_[k]->push(latents.narrow(2, c.row, c.rows).narrow(3, c.col, c.cols), real_frames));
    }
    return combine(std::move(outs));
  }

  Tensor finish() override {
    std::vector<Tensor> outs;
    for (auto& t : tiles_) outs.push_back(t->finish());
    Tensor out = tiles_.empty() ? Tensor{} : combine(std::move(outs));
    reset();
    return out;
  }

  void reset() override {
    tiles_.clear();
    heap_.reset();  // after the tiles, whose caches live in it
    crops_.clear();
    height_ = width_ = 0;
  }

  int64_t latents_in() const override { return tiles_.empty() ? 0 : tiles_[0]->latents_in(); }
  int64_t frames_out() const override { return tiles_.empty() ? 0 : tiles_[0]->frames_out(); }
  int64_t pending_latents() const override { return tiles_.empty() ? 0 : tiles_[0]->pending_latents(); }
  size_t state_bytes() const override {
    size_t n = 0;
    for (const auto& t : tiles_) n += t->state_bytes();
    return n;
  }
  size_t heap_bytes() const override { return heap_ ? heap_->stats().touched : 0; }
  const Vae& vae() const override { return *vae_; }

 private:
  Tensor combine(std::vector<Tensor> outs) {
    if (outs.size() == 1 || !outs[0].defined()) return outs[0];
    c10::InferenceMode inference;
    auto grid = as_grid(std::move(outs), per_row_);
    return stitch(grid, geometry_);
  }

  std::shared_ptr<const Vae> vae_;
  TileGeometry geometry_;
  DecoderOptions inner_;
  std::shared_ptr<ActivationHeap> heap_;
  std::vector<std::unique_ptr<StreamingDecoder>> tiles_;
  std::vector<Crop> crops_;
  size_t per_row_ = 1;
  int64_t height_ = 0, width_ = 0;
};

}  // namespace

std::vector<int64_t> TileAxis::starts(int64_t size) const {
  std::vector<int64_t> out;
  for (int64_t s = 0; s < size; s += stride) out.push_back(s);
  return out;
}

TileGeometry encoder_tile_geometry(const Vae& vae, const TileOptions& tile) {
  check_model(vae, tile);
  const double sf = double(vae.spec().spatial_factor);
  const int64_t lh = trunc(double(tile.height) / sf), lw = trunc(double(tile.width) / sf);
  // diffusers would floor a crop that is not a multiple of the size multiple; the port refuses such frames
  // everywhere, so the tiles and their starts have to land on it.
  const int64_t m = vae.spec().size_multiple;
  const int64_t sh = trunc(double(tile.height) * (1.0 - tile.overlap_height)),
                sw = trunc(double(tile.width) * (1.0 - tile.overlap_width));
  if (tile.height % m != 0 || tile.width % m != 0 || sh % m != 0 || sw % m != 0) {
    throw std::invalid_argument("encoder tiles of " + std::to_string(tile.width) + "x" + std::to_string(tile.height) +
                                " pixels start every " + std::to_string(sw) + "x" + std::to_string(sh) +
                                " pixels; tile sizes and tile x (1 - overlap) must be multiples of " +
                                std::to_string(m) + " (e.g. diffusers' default 360x240 with its overlaps)");
  }
  return {axis(tile.height, trunc(double(tile.height) * (1.0 - tile.overlap_height)),
               trunc(double(lh) * tile.overlap_height), lh, "height"),
          axis(tile.width, trunc(double(tile.width) * (1.0 - tile.overlap_width)),
               trunc(double(lw) * tile.overlap_width), lw, "width")};
}

TileGeometry decoder_tile_geometry(const Vae& vae, const TileOptions& tile) {
  check_model(vae, tile);
  const double sf = double(vae.spec().spatial_factor);
  const int64_t lh = trunc(double(tile.height) / sf), lw = trunc(double(tile.width) / sf);
  return {axis(lh, trunc(double(lh) * (1.0 - tile.overlap_height)), trunc(double(tile.height) * tile.overlap_height),
               tile.height, "height"),
          axis(lw, trunc(double(lw) * (1.0 - tile.overlap_width)), trunc(double(tile.width) * tile.overlap_width),
               tile.width, "width")};
}

std::unique_ptr<EncoderStream> open_tiled_encoder(std::shared_ptr<const Vae> vae, const EncoderOptions& options) {
  return std::make_unique<TiledEncoder>(std::move(vae), options);
}

std::unique_ptr<DecoderStream> open_tiled_decoder(std::shared_ptr<const Vae> vae, const DecoderOptions& options) {
  return std::make_unique<TiledDecoder>(std::move(vae), options);
}

}  // namespace latent
