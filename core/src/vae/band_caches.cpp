#include "vae/band_caches.h"

#include <algorithm>
#include <stdexcept>

namespace latent {

using torch::Tensor;

std::vector<size_t> BandCaches::order(size_t count) const {
  std::vector<size_t> out(count);
  for (size_t k = 0; k < count; ++k) out[k] = k;
  // The first chunk reads no caches, so any order gives the same result; the last band first, then the first,
  // sizes every shared cache before the others carry theirs, which then go straight into it.
  if (crops_.size() != count && count > 1) std::rotate(out.begin(), out.end() - 1, out.end());
  return out;
}

void BandCaches::begin(size_t k, size_t count, layers::StateSlots& band, int64_t own_lo, int64_t own_hi,
                       int64_t latent_width) {
  band_ = k;
  count_ = count;
  own_lo_ = own_lo;
  own_hi_ = own_hi;
  latent_width_ = latent_width;
  if (crops_.size() != count) crops_.resize(count);
  for (size_t i = 0; i < crops_[k].size() && i < shared_.size(); ++i) {
    const Crop& c = crops_[k][i];
    // Each layer reads its cache before it carries the next: the rows written back meanwhile are past reading.
    if (c.rows != 0 && shared_[i].defined()) band.tensors[i] = shared_[i].narrow(3, c.origin - first_[i], c.rows);
  }
  band.sink = this;
}

const BandCaches::Crop* BandCaches::crop(size_t k, size_t slot) const {
  if (k >= crops_.size() || slot >= crops_[k].size() || crops_[k][slot].rows == 0) return nullptr;
  return &crops_[k][slot];
}

bool BandCaches::sized(size_t slot) const { return crop(0, slot) && crop(count_ - 1, slot); }

bool BandCaches::fresh(size_t slot) const { return slot >= shared_.size() || !shared_[slot].defined(); }

int64_t BandCaches::free_until(size_t slot, size_t next) const {
  // A cache no band reads in this chunk (its first) is free once its shared tensor can be sized. Otherwise crops
  // start further down band after band: rows above the next band's crop are read by no band still to run.
  if (fresh(slot)) return sized(slot) ? INT64_MAX : INT64_MIN;
  if (next >= count_) return INT64_MAX;
  const Crop* c = crop(next, slot);
  return c ? c->origin : INT64_MIN;
}

void BandCaches::carry(int slot_index, const Tensor& t, int64_t origin) {
  const size_t i = size_t(slot_index);
  std::vector<Crop>& crops = crops_[band_];
  if (crops.size() <= i) crops.resize(i + 1);
  const int64_t rows = t.size(3), scale = t.size(4) / latent_width_;
  Crop& c = crops[i];
  if (c.rows != 0 && (c.origin != origin || c.rows != rows))
    throw std::logic_error("a band's crop moved between chunks");
  c = {origin, rows};
  const int64_t lo = band_ == 0 ? origin : own_lo_ * scale;
  const int64_t hi = band_ + 1 == count_ ? origin + rows : own_hi_ * scale;
  if (lo < origin || hi > origin + rows || lo >= hi) throw std::logic_error("a band does not hold the rows it owns");
  const int64_t now = std::clamp(free_until(i, band_ + 1), lo, hi);
  if (now > lo) target(i, t).narrow(3, lo - first_[i], now - lo).copy_(t.narrow(3, lo - origin, now - lo));
  if (hi > now) pending_.push_back({i, now, t.narrow(3, now - origin, hi - now).clone(at::MemoryFormat::Contiguous)});
}

void BandCaches::end(layers::StateSlots& band) {
  band.sink = nullptr;
  for (auto& t : band.tensors) t = Tensor();  // views of slots the band did not carry
  flush(band_ + 1);
}

void BandCaches::finish() {
  flush(count_);
  if (!pending_.empty()) throw std::logic_error("band caches left unwritten");
  for (size_t i = 0; i < next_.size(); ++i) {
    if (next_[i].defined()) shared_[i] = std::move(next_[i]);
    next_[i] = Tensor();
  }
}

Tensor& BandCaches::target(size_t slot, const Tensor& like) {
  if (shared_.size() <= slot) {
    shared_.resize(slot + 1);
    next_.resize(slot + 1);
    first_.resize(slot + 1);
  }
  int64_t lo = INT64_MAX, hi = 0;
  for (size_t k = 0; k < crops_.size(); ++k) {
    if (const Crop* c = crop(k, slot)) {
      lo = std::min(lo, c->origin);
      hi = std::max(hi, c->origin + c->rows);
    }
  }
  auto sizes = like.sizes().vec();
  sizes[3] = hi - lo;
  Tensor& s = shared_[slot];
  if (s.defined() && s.sizes() == c10::IntArrayRef(sizes) && first_[slot] == lo &&
      s.options().type_equal(like.options()))
    return s;
  // Bands still to run read the old tensor: the new one replaces it after the chunk.
  Tensor& n = next_[slot];
  if (!n.defined()) {
    n = torch::zeros(sizes, like.options());  // rows no band owns are read only for rows no band keeps
    first_[slot] = lo;
  }
  return n;
}

void BandCaches::flush(size_t next) {
  std::vector<Piece> kept;
  for (Piece& p : pending_) {
    if (free_until(p.slot, next) < p.first + p.rows.size(3)) {
      kept.push_back(std::move(p));
      continue;
    }
    target(p.slot, p.rows).narrow(3, p.first - first_[p.slot], p.rows.size(3)).copy_(p.rows);
    p.rows = Tensor();  // freed as it goes
  }
  pending_ = std::move(kept);
}

size_t BandCaches::bytes() const {
  size_t n = 0;
  for (const auto& t : shared_)
    if (t.defined()) n += t.nbytes();
  for (const auto& t : next_)
    if (t.defined()) n += t.nbytes();
  for (const auto& p : pending_) n += p.rows.nbytes();
  return n;
}

}  // namespace latent
