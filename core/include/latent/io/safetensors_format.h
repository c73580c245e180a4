// The safetensors container format without LibTorch: dtypes, header parsing and validation, header writing.
// Kept free of torch so the fuzzer can instrument exactly the code that sees untrusted bytes.
//
// File layout: u64 little-endian N, N bytes of JSON (an object, space padded), then the data buffer. Each
// tensor entry names a dtype, a shape and [begin, end) offsets into the data buffer; the entries tile the data
// buffer exactly (no holes, no overlaps, nothing left over), as the reference implementation requires.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace latent::st {

// Thrown for every defect of a file; the message names the file and, where it applies, the tensor.
class FormatError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

enum class Dtype {
  BOOL,
  U8,
  I8,
  I16,
  U16,
  F16,
  BF16,
  I32,
  U32,
  F32,
  F64,
  I64,
  U64,
  C64,
  F8_E4M3,
  F8_E5M2,
  F8_E8M0,
};

std::optional<Dtype> dtype_from_name(std::string_view name);
const char* dtype_name(Dtype dtype);
size_t dtype_size(Dtype dtype);

struct TensorEntry {
  std::string name;
  Dtype dtype = Dtype::F32;
  std::vector<uint64_t> shape;
  uint64_t begin = 0;  // offsets relative to the start of the data buffer
  uint64_t end = 0;

  uint64_t numel() const;
  uint64_t nbytes() const { return end - begin; }
};

struct Header {
  uint64_t data_offset = 0;          // 8 + N: where the data buffer starts in the file
  std::vector<TensorEntry> tensors;  // sorted by offset, i.e. in data order
  std::map<std::string, std::string> metadata;
  // Indices into `tensors` sorted by name, so a lookup is a binary search: a 100 MB header holds ~2 M entries,
  // and a linear find per tensor made loading one quadratic.
  std::vector<size_t> by_name;

  // O(log n); needs by_name, which parse() fills (call index_names() after editing `tensors` by hand).
  const TensorEntry* find(std::string_view name) const;
  void index_names();
};

// Reference implementation's cap on N; a larger header is refused before anything is allocated for it.
inline constexpr uint64_t kMaxHeaderSize = 100'000'000;
// Highest rank accepted; LibTorch and every model here stay far below it.
inline constexpr size_t kMaxRank = 32;

// Validates a whole file held in memory. `label` (usually the path) prefixes every error message.
Header parse(std::span<const std::byte> file, std::string_view label);

// The JSON header text for these entries (offsets as given) and metadata, unpadded.
std::string header_json(const std::vector<TensorEntry>& tensors, const std::map<std::string, std::string>& metadata);

}  // namespace latent::st
