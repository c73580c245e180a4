#include "latent/parallel/row_shard.h"

#include <stdexcept>

namespace latent::parallel {

std::vector<Band> split_rows(int64_t rows, int world) {
  if (world < 1) throw std::invalid_argument("a split needs at least one rank");
  if (rows < world) {
    throw std::invalid_argument(std::to_string(world) + " ranks need at least " + std::to_string(world) +
                                " latent rows (frame height / spatial factor); this frame has " + std::to_string(rows));
  }
  std::vector<Band> out;
  int64_t first = 0;
  for (int k = 0; k < world; ++k) {
    const int64_t count = rows / world + (k < rows % world ? 1 : 0);
    out.push_back({first, count});
    first += count;
  }
  return out;
}

RowShard::RowShard(RankComms comms) : comms_(std::move(comms)) {
  if (!comms_.halo || !comms_.collectives) throw std::invalid_argument("a RowShard needs both communicators");
  rank_ = comms_.halo->rank();
  world_ = comms_.halo->size();
}

torch::Tensor RowShard::with_halo(const torch::Tensor& x, int64_t top_rows, int64_t bottom_rows) const {
  const int64_t dim = x.dim() - 2, h = x.size(dim);
  if (top_rows > h || bottom_rows > h)
    throw std::invalid_argument("a halo taller than a rank's band (" + std::to_string(h) + " rows)");
  // The rank above takes this band's first rows as its bottom halo; the rank below its last rows as its top.
  torch::Tensor to_prev, to_next, from_prev, from_next;
  if (!top() && bottom_rows > 0) to_prev = x.narrow(dim, 0, bottom_rows);
  if (!bottom() && top_rows > 0) to_next = x.narrow(dim, h - top_rows, top_rows);
  auto sized = [&](int64_t n) {
    auto s = x.sizes().vec();
    s[size_t(dim)] = n;
    return s;
  };
  if (!top() && top_rows > 0) from_prev = torch::empty(sized(top_rows), x.options());
  if (!bottom() && bottom_rows > 0) from_next = torch::empty(sized(bottom_rows), x.options());
  comms_.halo->exchange(to_prev, to_next, from_prev, from_next);
  if (top_rows > 0 && !from_prev.defined()) from_prev = torch::zeros(sized(top_rows), x.options());
  if (bottom_rows > 0 && !from_next.defined()) from_next = torch::zeros(sized(bottom_rows), x.options());
  std::vector<torch::Tensor> parts;
  if (from_prev.defined()) parts.push_back(from_prev);
  parts.push_back(x);
  if (from_next.defined()) parts.push_back(from_next);
  return parts.size() == 1 ? x : torch::cat(parts, dim);
}

void RowShard::all_reduce(torch::Tensor& t) const { comms_.collectives->all_reduce_sum(t); }

torch::Tensor RowShard::gather_rows(const torch::Tensor& x) const {
  const int64_t dim = x.dim() - 2;
  // Bands differ by at most a row or so: each is padded to the tallest, gathered, and cut back. The heights come
  // from the others (a band's height alone does not tell the frame's): reading them is a host sync, which on a
  // device waits for nothing, since every communicator returns only once its call has completed on the device
  // (its own waits end on an abort or the timeout).
  torch::Tensor mine = torch::tensor({x.size(dim)}, torch::TensorOptions().dtype(torch::kLong).device(x.device()));
  std::vector<torch::Tensor> heights = comms_.collectives->all_gather(mine);
  std::vector<int64_t> h;
  int64_t tallest = 0;
  for (const auto& t : heights) {
    h.push_back(t.item<int64_t>());
    tallest = std::max(tallest, h.back());
  }
  torch::Tensor padded = x;
  if (x.size(dim) < tallest) {
    auto s = x.sizes().vec();
    s[size_t(dim)] = tallest - x.size(dim);
    padded = torch::cat({x, torch::zeros(s, x.options())}, dim);
  }
  std::vector<torch::Tensor> parts = comms_.collectives->all_gather(padded.contiguous());
  for (size_t k = 0; k < parts.size(); ++k) parts[k] = parts[k].narrow(dim, 0, h[k]);
  return torch::cat(parts, dim);
}

void RowShard::abort(const std::string& why) const {
  comms_.halo->abort(why);
  comms_.collectives->abort(why);
}

}  // namespace latent::parallel
