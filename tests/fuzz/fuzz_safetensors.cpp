// libFuzzer target for the safetensors header parser, the code that sees untrusted bytes first.
// Beyond "no crash, no out-of-bounds read", every accepted file must survive a rewrite: its entries written
// back with header_json() and parsed again must come out identical.
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "latent/io/safetensors_format.h"

namespace st = latent::st;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // An exact-size heap copy lets AddressSanitizer catch any read past the end of the "file".
  std::vector<std::byte> file(size);
  if (size) std::memcpy(file.data(), data, size);
  st::Header h;
  try {
    h = st::parse(file, "fuzz");
  } catch (const st::FormatError&) {
    return 0;
  }
  uint64_t data_size = size - h.data_offset;
  uint64_t sum = 0;
  for (const auto& t : h.tensors) {
    if (t.end > data_size || t.begin > t.end) __builtin_trap();
    if (t.numel() * st::dtype_size(t.dtype) != t.nbytes()) __builtin_trap();
    if (t.nbytes()) sum += uint64_t(file[h.data_offset + t.end - 1]);  // touch the last byte of each tensor
  }
  (void)sum;

  std::string json = st::header_json(h.tensors, h.metadata);
  std::vector<std::byte> again(8 + json.size() + data_size);
  uint64_t n = json.size();
  std::memcpy(again.data(), &n, 8);
  std::memcpy(again.data() + 8, json.data(), json.size());
  if (data_size) std::memcpy(again.data() + 8 + json.size(), file.data() + h.data_offset, data_size);
  st::Header h2 = st::parse(again, "fuzz-rewrite");  // must not throw: a valid file rewritten stays valid
  if (h2.tensors.size() != h.tensors.size() || h2.metadata != h.metadata) __builtin_trap();
  for (size_t i = 0; i < h.tensors.size(); ++i) {
    const auto &a = h.tensors[i], &b = h2.tensors[i];
    if (a.name != b.name || a.dtype != b.dtype || a.shape != b.shape || a.begin != b.begin || a.end != b.end)
      __builtin_trap();
  }
  return 0;
}
