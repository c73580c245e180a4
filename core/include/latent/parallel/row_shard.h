// Patch parallel: each rank holds a band of rows of every frame, at every resolution of the model. The band of rank
// k at latent resolution is split_rows(...)[k]; at a resolution f times finer it is f times taller, so bands stay
// aligned through every up- and downsampler. What layers need from the other ranks goes through a RowShard.
#pragma once

#include <torch/types.h>

#include <vector>

#include "latent/parallel/comm.h"

namespace latent::parallel {

// First row and row count of each rank's band when `rows` rows are split over `world` ranks: as even as possible,
// the first ranks taking one more. Throws std::invalid_argument when there are fewer rows than ranks.
struct Band {
  int64_t first = 0, count = 0;
};
std::vector<Band> split_rows(int64_t rows, int world);

class RowShard {
 public:
  explicit RowShard(RankComms comms);
  int rank() const { return rank_; }
  int world() const { return world_; }
  bool top() const { return rank_ == 0; }
  bool bottom() const { return rank_ == world_ - 1; }

  // x: [..., H, W] with this rank's rows. Returns [..., top + H + bottom, W]: the last `top` rows of the rank
  // above, this rank's rows and the first `bottom` rows of the rank below, zeros beyond the frame's edges (what a
  // convolution's zero padding would see). Every rank calls it with the same counts.
  torch::Tensor with_halo(const torch::Tensor& x, int64_t top, int64_t bottom) const;
  // Sums over the ranks, in place (every rank gets the same bits).
  void all_reduce(torch::Tensor& t) const;
  // x: [..., h_rank, W]. Returns the whole frame's rows, [..., H, W], on every rank; bands may differ in height.
  torch::Tensor gather_rows(const torch::Tensor& x) const;
  // Ends the group for every rank with `why`.
  void abort(const std::string& why) const;

  const RankComms& comms() const { return comms_; }

 private:
  RankComms comms_;
  int rank_, world_;
};

}  // namespace latent::parallel
