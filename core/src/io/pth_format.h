// The torch.save() checkpoint format (.pth/.pt/.ckpt) without LibTorch: a restricted reader of the zip archive
// and of the state-dict subset of its pickle. Kept free of torch so the fuzzer can instrument exactly the code
// that sees untrusted bytes, and small on purpose: a general unpickler runs whatever a file names, this one
// builds nothing but dicts, lists, tuples, scalars and tensor descriptors.
//
// Archive layout (PyTorch >= 1.6): an uncompressed zip whose entries share one top folder, `<a>/data.pkl` (the
// pickled object), `<a>/data/<key>` (one record of raw little-endian bytes per storage), `<a>/byteorder`,
// `<a>/version` and a few more. Tensors in the pickle are calls of torch._utils._rebuild_tensor_v2 whose first
// argument is a persistent id ('storage', torch.<Type>Storage, key, location, numel) naming a record; dtypes
// without a typed storage class (uint16, float8_*, ...) come through _rebuild_tensor_v3 over a
// torch.storage.UntypedStorage (numel in bytes) with the dtype as an extra argument.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace latent::pth {

// Thrown for every defect of a file; the message names the file and the defect.
class FormatError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

enum class Dtype {
  F64,
  F32,
  F16,
  BF16,
  C64,
  C128,
  I64,
  I32,
  I16,
  I8,
  U8,
  BOOL,
  U16,
  U32,
  U64,
  F8_E4M3,
  F8_E5M2,
  F8_E8M0
};

const char* dtype_name(Dtype dtype);  // torch's name: "float32", "bfloat16", ...
size_t dtype_size(Dtype dtype);

// One zip entry's bytes, as offsets into the file.
struct Record {
  uint64_t offset = 0;
  uint64_t size = 0;
};

struct Archive {
  std::string folder;                     // the top folder every entry sits in, from data.pkl's path
  std::map<std::string, Record> records;  // by name below the folder: "data.pkl", "data/0", "byteorder", ...
  const Record* find(std::string_view name) const;
};

struct Storage {
  std::string key;           // the record is data/<key>
  Dtype dtype = Dtype::F32;  // U8 for an untyped storage
  uint64_t numel = 0;
  Record record;  // numel * dtype_size bytes
};

struct Tensor {
  std::string name;
  Dtype dtype = Dtype::F32;
  std::vector<int64_t> shape;
  std::vector<int64_t> strides;  // in elements, all >= 0
  std::string storage;           // key into Checkpoint::storages
  uint64_t storage_offset = 0;   // in elements
  // Bytes from the first element (storage_offset) to one past the last one the shape and strides reach; 0 for
  // an empty tensor. Proven to lie inside the storage.
  uint64_t extent_bytes = 0;

  uint64_t numel() const;
};

struct Checkpoint {
  std::vector<Tensor> tensors;              // in the dict's order
  std::map<std::string, Storage> storages;  // those the tensors use
  std::string container;                    // the keys descended into, "." between; empty for the top level
};

// The keys a state dict is looked for under when none are named: the ones the loader has always used.
inline constexpr std::string_view kDefaultContainers[] = {"state_dict", "model"};

// Bounds on the pickle machine; a file beyond one of them is refused. State dicts stay far below: their
// containers nest a few levels deep, pickle batches at most 1000 items between marks, and a tensor takes
// about 10 memo entries and 40 values. Each bounds memory as well as work: a value costs 16 bytes, a memo entry
// about 40, a tensor descriptor at most about 1 KiB, whatever the pickle repeats by reference.
inline constexpr size_t kMaxStack = 1 << 20;    // values on the stack
inline constexpr size_t kMaxMarks = 256;        // open MARKs, i.e. container nesting within one expression
inline constexpr size_t kMaxMemo = 1 << 21;     // memo entries
inline constexpr size_t kMaxValues = 1 << 23;   // strings, containers and their items, tensor dimensions
inline constexpr size_t kMaxTensors = 1 << 17;  // tensors built, and tensors in the result
inline constexpr size_t kMaxStorageKey = 256;   // bytes; torch.save's keys are decimal numbers
inline constexpr size_t kMaxRank = 32;

// The zip layer alone: every entry located, bounds-checked and stored (not compressed).
Archive read_archive(std::span<const std::byte> file, std::string_view label);

// The pickle `pkl` (data.pkl) run against the storage records of `archive`. The result's tensors are those of
// the top-level dict, descended into each of `containers` in turn where the dict at hand holds that key as a dict
// (by default "state_dict", then "model"); entries that are not string -> tensor (step counters, optimizer state)
// are skipped.
Checkpoint read_pickle(std::span<const std::byte> pkl, const Archive& archive, std::string_view label,
                       std::span<const std::string_view> containers = kDefaultContainers);

// Both, on a whole file held in memory. `label` (usually the path) prefixes every error message.
Checkpoint parse(std::span<const std::byte> file, std::string_view label,
                 std::span<const std::string_view> containers = kDefaultContainers);

}  // namespace latent::pth
