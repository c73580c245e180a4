// libFuzzer target for the torch.save reader (zip layer and pickle machine), the code that sees untrusted
// bytes of a .pth file. Beyond "no crash, no out-of-bounds read, no leak", every accepted tensor must lie
// inside its storage record and every record inside the file, recomputed here in 128-bit arithmetic.
//
// Each input is read twice: as a whole archive, and, when it starts like a pickle (PROTO), as data.pkl against
// storage records synthesised over the input itself, so mutations reach the pickle machine without having to
// keep a zip archive consistent.
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "io/pth_format.h"

namespace pth = latent::pth;

namespace {

void check(const pth::Checkpoint& c, const std::vector<std::byte>& file) {
  if (c.tensors.empty()) __builtin_trap();
  unsigned sum = 0;
  for (const auto& t : c.tensors) {
    auto it = c.storages.find(t.storage);
    if (it == c.storages.end()) __builtin_trap();
    const pth::Storage& s = it->second;
    if (s.record.offset > file.size() || s.record.size > file.size() - s.record.offset) __builtin_trap();
    if ((unsigned __int128)s.numel * pth::dtype_size(s.dtype) != s.record.size) __builtin_trap();
    if (t.shape.size() != t.strides.size() || t.shape.size() > pth::kMaxRank) __builtin_trap();
    bool empty = false;
    for (int64_t d : t.shape) empty = empty || d == 0;
    if (empty) {
      if (t.extent_bytes != 0) __builtin_trap();
      continue;
    }
    const size_t es = pth::dtype_size(t.dtype);
    unsigned __int128 last = t.storage_offset;
    for (size_t i = 0; i < t.shape.size(); ++i) {
      if (t.shape[i] < 0 || t.strides[i] < 0) __builtin_trap();
      last += (unsigned __int128)(t.shape[i] - 1) * (unsigned __int128)t.strides[i];
    }
    const unsigned __int128 first_byte = (unsigned __int128)t.storage_offset * es, end_byte = (last + 1) * es;
    if (end_byte > s.record.size || end_byte - first_byte != t.extent_bytes) __builtin_trap();
    // Touch both ends of the extent: AddressSanitizer sees any read outside the input.
    sum += unsigned(file[s.record.offset + size_t(first_byte)]);
    sum += unsigned(file[s.record.offset + size_t(end_byte) - 1]);
  }
  (void)sum;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // An exact-size heap copy lets AddressSanitizer catch any read past the end of the "file".
  std::vector<std::byte> file(size);
  if (size) std::memcpy(file.data(), data, size);
  try {
    check(pth::parse(file, "fuzz"), file);
  } catch (const pth::FormatError&) {
  }

  if (size < 2 || data[0] != 0x80) return 0;
  pth::Archive archive;
  archive.folder = "fuzz";
  // Keys "0".."7" name records of 0, 1, 2, 4, ... 64 bytes (clipped to the input): storages of every small size
  // a mutated numel may land on.
  for (int i = 0; i < 8; ++i) {
    const uint64_t n = i == 0 ? 0 : uint64_t(1) << (i - 1);
    archive.records.emplace("data/" + std::to_string(i), pth::Record{0, n < size ? n : size});
  }
  try {
    check(pth::read_pickle(file, archive, "fuzz-pickle"), file);
  } catch (const pth::FormatError&) {
  }
  return 0;
}
