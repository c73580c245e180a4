// Ulysses sequence parallel for the native transformers: each rank of a group keeps a contiguous slice of the
// video tokens through every per-token layer, and attention trades the split for one over heads (all-to-all),
// so that each rank attends over the whole sequence with its own heads, which gives the one-device values.
#pragma once

#include <torch/types.h>

#include "latent/parallel/comm.h"

namespace latent {

class TokenSlice {
 public:
  // The `total` tokens cut into group.size() slices of `chunk` rows each; the last slices end in padding rows
  // (there may be no real row at all in a short sequence), so that every all-to-all splits evenly.
  TokenSlice(parallel::Communicator& group, int64_t total, torch::Device device)
      : group_(group),
        ranks_(group.size()),
        total_(total),
        chunk_((total + ranks_ - 1) / ranks_),
        begin_(std::min(total, group.rank() * chunk_)),
        real_(std::min(total, begin_ + chunk_) - begin_) {
    // A padding row takes the last token's position, table rows and modulation: values like any other, so it
    // stays finite, and it never reaches a real row (attention sees the real rows only).
    index_ = (torch::arange(chunk_, torch::TensorOptions().dtype(torch::kLong)) + group.rank() * chunk_)
                 .clamp_max(total - 1)
                 .to(device);
  }

  int64_t chunk() const { return chunk_; }
  int ranks() const { return ranks_; }
  int rank() const { return group_.rank(); }
  // Each row's token: [chunk] int64 on the model's device.
  const torch::Tensor& index() const { return index_; }

  // This rank's rows of a whole sequence [1, total, C] (or [total, ...] with dim 0): [1, chunk, C], padded with
  // zeros.
  torch::Tensor take(const torch::Tensor& seq, int64_t dim = 1) const {
    const torch::Tensor mine = seq.narrow(dim, begin_, real_);
    return pad_rows(mine, dim, chunk_ - real_);
  }

  // Sequence split to head split: x [B, chunk, H, hd], this rank's tokens of every head, to [B, total, H / ranks,
  // hd], every real token of this rank's heads (rank r has heads r H / ranks onwards).
  torch::Tensor to_heads(const torch::Tensor& x) const {
    const int64_t b = x.size(0), h = x.size(2), hd = x.size(3), g = h / ranks_;
    const torch::Tensor send = x.reshape({b, chunk_, ranks_, g, hd}).permute({2, 0, 1, 3, 4}).contiguous();
    const torch::Tensor got = group_.all_to_all(send);  // [ranks (whose tokens), B, chunk, g, hd]
    return got.permute({1, 0, 2, 3, 4}).reshape({b, ranks_ * chunk_, g, hd}).narrow(1, 0, total_);
  }

  // The way back: x [B, total, H / ranks, hd] to [B, chunk, H, hd].
  torch::Tensor to_tokens(const torch::Tensor& x) const {
    const int64_t b = x.size(0), g = x.size(2), hd = x.size(3);
    const torch::Tensor padded = pad_rows(x, 1, ranks_ * chunk_ - total_);
    const torch::Tensor send = padded.reshape({b, ranks_, chunk_, g, hd}).permute({1, 0, 2, 3, 4}).contiguous();
    const torch::Tensor got = group_.all_to_all(send);  // [ranks (whose heads), B, chunk, g, hd]
    return got.permute({1, 2, 0, 3, 4}).reshape({b, chunk_, ranks_ * g, hd});
  }

  // This rank's heads of x along `dim`.
  torch::Tensor my_heads(const torch::Tensor& x, int64_t dim) const {
    const int64_t g = x.size(dim) / ranks_;
    return x.narrow(dim, rank() * g, g);
  }

  // Every rank's x (same shape on each), joined along `dim` in rank order.
  torch::Tensor gather(const torch::Tensor& x, int64_t dim) const {
    return torch::cat(group_.all_gather(x.contiguous()), dim);
  }

  // Every rank's rows [1, chunk, C] to the whole sequence [1, total, C].
  torch::Tensor gather_tokens(const torch::Tensor& x) const { return gather(x, 1).narrow(1, 0, total_); }

 private:
  static torch::Tensor pad_rows(const torch::Tensor& x, int64_t dim, int64_t rows) {
    if (rows == 0) return x;
    std::vector<int64_t> shape = x.sizes().vec();
    shape[size_t(dim)] = rows;
    return torch::cat({x, torch::zeros(shape, x.options())}, dim);
  }

  parallel::Communicator& group_;
  int ranks_;
  int64_t total_, chunk_, begin_, real_;
  torch::Tensor index_;
};

}  // namespace latent
