#include "latent/io/safetensors_format.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cstring>
#include <unordered_map>

#include "io/json.h"

namespace latent::st {
namespace {

static_assert(std::endian::native == std::endian::little, "safetensors data is little-endian");

struct DtypeInfo {
  Dtype dtype;
  const char* name;
  size_t size;
};

constexpr std::array<DtypeInfo, 17> kDtypes{{
    {Dtype::BOOL, "BOOL", 1},
    {Dtype::U8, "U8", 1},
    {Dtype::I8, "I8", 1},
    {Dtype::I16, "I16", 2},
    {Dtype::U16, "U16", 2},
    {Dtype::F16, "F16", 2},
    {Dtype::BF16, "BF16", 2},
    {Dtype::I32, "I32", 4},
    {Dtype::U32, "U32", 4},
    {Dtype::F32, "F32", 4},
    {Dtype::F64, "F64", 8},
    {Dtype::I64, "I64", 8},
    {Dtype::U64, "U64", 8},
    {Dtype::C64, "C64", 8},
    {Dtype::F8_E4M3, "F8_E4M3", 1},
    {Dtype::F8_E5M2, "F8_E5M2", 1},
    {Dtype::F8_E8M0, "F8_E8M0", 1},
}};

const DtypeInfo& info(Dtype d) {
  for (const auto& i : kDtypes)
    if (i.dtype == d) return i;
  throw FormatError("unknown safetensors dtype enumerator");
}

[[noreturn]] void fail(std::string_view label, const std::string& what) {
  throw FormatError(std::string(label) + ": " + what);
}

[[noreturn]] void fail_tensor(std::string_view label, const std::string& name, const std::string& what) {
  fail(label, "tensor '" + name + "': " + what);
}

uint64_t read_u64_le(const std::byte* p) {
  uint64_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

TensorEntry parse_entry(std::string_view label, const std::string& name, const json::Value& v) {
  if (!v.is_object()) fail_tensor(label, name, std::string("entry is a JSON ") + v.kind_name() + ", not an object");
  TensorEntry e;
  e.name = name;
  const json::Value* dtype = v.find("dtype");
  const json::Value* shape = v.find("shape");
  const json::Value* offsets = v.find("data_offsets");
  if (!dtype || !shape || !offsets) fail_tensor(label, name, "entry needs \"dtype\", \"shape\" and \"data_offsets\"");
  if (!dtype->is_string()) fail_tensor(label, name, "dtype is not a string");
  auto d = dtype_from_name(dtype->as_string());
  if (!d) fail_tensor(label, name, "unknown dtype \"" + dtype->as_string() + "\"");
  e.dtype = *d;
  try {
    const auto& dims = shape->as_array();
    if (dims.size() > kMaxRank)
      fail_tensor(label, name, "rank " + std::to_string(dims.size()) + " above " + std::to_string(kMaxRank));
    for (const auto& dim : dims) {
      uint64_t n = dim.as_uint64();
      if (n > uint64_t(INT64_MAX)) throw json::Error("dimension too large");
      e.shape.push_back(n);
    }
  } catch (const json::Error& err) {
    fail_tensor(label, name, std::string("shape must be an array of non-negative integers (") + err.what() + ")");
  }
  try {
    const auto& off = offsets->as_array();
    if (off.size() != 2) throw json::Error("not two numbers");
    e.begin = off[0].as_uint64();
    e.end = off[1].as_uint64();
  } catch (const json::Error& err) {
    fail_tensor(label, name, std::string("data_offsets must be [begin, end] (") + err.what() + ")");
  }
  if (e.end < e.begin)
    fail_tensor(label, name,
                "data_offsets [" + std::to_string(e.begin) + ", " + std::to_string(e.end) + "] end before begin");

  uint64_t bytes = dtype_size(e.dtype);
  for (uint64_t n : e.shape) {
    if (__builtin_mul_overflow(bytes, n, &bytes)) fail_tensor(label, name, "shape overflows 64-bit byte count");
  }
  if (bytes != e.nbytes()) {
    fail_tensor(
        label, name,
        "shape and dtype need " + std::to_string(bytes) + " bytes but data_offsets span " + std::to_string(e.nbytes()));
  }
  return e;
}

std::map<std::string, std::string> parse_metadata(std::string_view label, const json::Value& v) {
  if (!v.is_object()) fail(label, "__metadata__ is not an object");
  std::map<std::string, std::string> out;
  for (const auto& [k, val] : v.as_object()) {
    if (!val.is_string()) fail(label, "__metadata__ value of \"" + k + "\" is not a string");
    out.emplace(k, val.as_string());
  }
  return out;
}

// Entries sorted by offset must cover [0, data_size) exactly: a gap is a hole, a step back an overlap.
void check_tiling(std::string_view label, const std::vector<TensorEntry>& sorted, uint64_t data_size) {
  uint64_t cursor = 0;
  const TensorEntry* previous = nullptr;
  for (const auto& e : sorted) {
    if (e.end > data_size) {
      fail_tensor(label, e.name,
                  "data [" + std::to_string(e.begin) + ", " + std::to_string(e.end) +
                      ") lies past the end of the data buffer (" + std::to_string(data_size) +
                      " bytes): file truncated or offsets out of range");
    }
    if (e.begin < cursor) {
      fail_tensor(label, e.name,
                  "data [" + std::to_string(e.begin) + ", " + std::to_string(e.end) + ") overlaps tensor '" +
                      previous->name + "'");
    }
    if (e.begin > cursor) {
      fail_tensor(label, e.name,
                  "hole of " + std::to_string(e.begin - cursor) + " unused bytes before its data at offset " +
                      std::to_string(e.begin));
    }
    cursor = e.end;
    previous = &e;
  }
  if (cursor != data_size) {
    fail(label, std::to_string(data_size - cursor) + " bytes after the last tensor belong to no tensor");
  }
}

}  // namespace

std::optional<Dtype> dtype_from_name(std::string_view name) {
  for (const auto& i : kDtypes)
    if (name == i.name) return i.dtype;
  return std::nullopt;
}

const char* dtype_name(Dtype dtype) { return info(dtype).name; }
size_t dtype_size(Dtype dtype) { return info(dtype).size; }

uint64_t TensorEntry::numel() const {
  uint64_t n = 1;
  for (uint64_t d : shape) n *= d;  // bounded: parse() proved numel * size fits
  return n;
}

const TensorEntry* Header::find(std::string_view name) const {
  auto it = std::lower_bound(by_name.begin(), by_name.end(), name,
                             [this](size_t i, std::string_view n) { return tensors[i].name < n; });
  return it != by_name.end() && tensors[*it].name == name ? &tensors[*it] : nullptr;
}

void Header::index_names() {
  by_name.resize(tensors.size());
  for (size_t i = 0; i < by_name.size(); ++i) by_name[i] = i;
  std::sort(by_name.begin(), by_name.end(), [this](size_t a, size_t b) { return tensors[a].name < tensors[b].name; });
}

Header parse(std::span<const std::byte> file, std::string_view label) {
  if (file.empty()) fail(label, "empty file, not a safetensors file");
  if (file.size() < 8) fail(label, "file of " + std::to_string(file.size()) + " bytes is too short for a header");
  const uint64_t n = read_u64_le(file.data());
  if (n > kMaxHeaderSize) {
    fail(label, "header length " + std::to_string(n) + " exceeds the " + std::to_string(kMaxHeaderSize) +
                    "-byte limit (not a safetensors file?)");
  }
  if (n > file.size() - 8) {
    fail(label, "header length " + std::to_string(n) + " runs past the end of the " + std::to_string(file.size()) +
                    "-byte file");
  }
  if (n < 2) fail(label, "header of " + std::to_string(n) + " bytes cannot hold a JSON object");
  std::string_view text(reinterpret_cast<const char*>(file.data() + 8), n);
  if (text.front() != '{') fail(label, "header does not start with '{' (not a safetensors file?)");

  json::Value root;
  try {
    root = json::parse(text);
  } catch (const json::Error& e) {
    fail(label, std::string("header is not valid JSON: ") + e.what());
  }
  if (!root.is_object()) fail(label, std::string("header is a JSON ") + root.kind_name() + ", not an object");

  Header h;
  h.data_offset = 8 + n;
  for (const auto& [key, value] : root.as_object()) {
    if (key == "__metadata__") {
      h.metadata = parse_metadata(label, value);
    } else {
      h.tensors.push_back(parse_entry(label, key, value));
    }
  }
  std::stable_sort(h.tensors.begin(), h.tensors.end(), [](const TensorEntry& a, const TensorEntry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  check_tiling(label, h.tensors, file.size() - h.data_offset);
  h.index_names();
  return h;
}

std::string header_json(const std::vector<TensorEntry>& tensors, const std::map<std::string, std::string>& metadata) {
  json::Object root;
  if (!metadata.empty()) {
    json::Object meta;
    for (const auto& [k, v] : metadata) meta.emplace_back(k, json::Value(v));
    root.emplace_back("__metadata__", json::Value(std::move(meta)));
  }
  for (const auto& t : tensors) {
    json::Array shape;
    for (uint64_t d : t.shape) shape.push_back(json::Value::unsigned_integer(d));
    json::Object entry;
    entry.emplace_back("dtype", json::Value(dtype_name(t.dtype)));
    entry.emplace_back("shape", json::Value(std::move(shape)));
    entry.emplace_back("data_offsets", json::Value(json::Array{json::Value::unsigned_integer(t.begin),
                                                               json::Value::unsigned_integer(t.end)}));
    root.emplace_back(t.name, json::Value(std::move(entry)));
  }
  return json::dump(json::Value(std::move(root)));
}

}  // namespace latent::st
