// The carried caches of one stage of a stream computed in spatial bands, kept once for the rows the bands cover
// instead of once per band: neighbouring bands' crops overlap by their halos, so caches per crop hold the overlap
// again for every band (1.1-3x the frame's at useful band heights, most of the state at 4K).
//
// Band k reads views of the rows its crop covers. What it carries is correct on the rows it owns (its kept rows
// at each cache's resolution; for the first and last band also the crop's rows beyond them): every row a kept
// row depends on is, and the owned rows are among them. Owned rows that no band still to run reads are written
// back as they are carried; the others wait until the next band's crop starts below them. So beyond the frame's
// caches only the halos' rows are held twice (and in the first chunk the last band's, which runs first to size
// the shared tensors). Rows a band reads but does not own may hold another chunk's values;
// they only reach rows no band keeps.
#pragma once

#include <torch/types.h>

#include <cstddef>
#include <vector>

#include "nn/state.h"

namespace latent {

class BandCaches : public layers::CarrySink {
 public:
  // The order to run `count` bands in: top to bottom, except in the first chunk.
  std::vector<size_t> order(size_t count) const;
  // Band k of `count`, owning latent rows [own_lo, own_hi) of a frame `latent_width` latents wide, is to run with
  // `band`: its slots get views of the shared rows its crop covers (none in the first chunk, or for a cache first
  // carried in this one), and what its layers carry comes here.
  void begin(size_t k, size_t count, layers::StateSlots& band, int64_t own_lo, int64_t own_hi, int64_t latent_width);
  void carry(int slot, const torch::Tensor& frames, int64_t origin) override;
  // After the band ran: writes back what no band still to run reads.
  void end(layers::StateSlots& band);
  // After the last band of a chunk: everything carried is written back.
  void finish();
  size_t bytes() const;

 private:
  struct Crop {
    int64_t origin = 0, rows = 0;  // rows 0: the band carried nothing in this slot yet
  };
  struct Piece {
    size_t slot = 0;
    int64_t first = 0;
    torch::Tensor rows;
  };
  const Crop* crop(size_t k, size_t slot) const;
  // Whether the first and last bands' crops, and so the shared tensor's rows, are known.
  bool sized(size_t slot) const;
  // Whether no band reads the slot's old values in this chunk (none were kept yet).
  bool fresh(size_t slot) const;
  // Rows of `slot` above this one no band from `next` on reads the old values of (INT64_MIN: none yet).
  int64_t free_until(size_t slot, size_t next) const;
  // Writes the pieces that no band from `next` on reads.
  void flush(size_t next);
  torch::Tensor& target(size_t slot, const torch::Tensor& like);

  size_t band_ = 0, count_ = 0;
  int64_t own_lo_ = 0, own_hi_ = 0, latent_width_ = 1;
  std::vector<std::vector<Crop>> crops_;  // [band][slot], as in the first chunk that carried the slot
  std::vector<torch::Tensor> shared_;     // [slot]: rows [first_[slot], first_ + rows) of the frame
  std::vector<torch::Tensor> next_;       // a slot whose cache changes shape (more frames) fills a new tensor
  std::vector<int64_t> first_;
  std::vector<Piece> pending_;
};

}  // namespace latent
