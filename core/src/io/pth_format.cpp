#include "io/pth_format.h"

#include <array>
#include <bit>
#include <cstring>
#include <deque>
#include <unordered_map>
#include <utility>

namespace latent::pth {
namespace {

static_assert(std::endian::native == std::endian::little, "tensor records are read in place as little-endian");

struct DtypeInfo {
  Dtype dtype;
  const char* name;  // torch.<name> is the dtype object a pickle may name
  size_t size;
  const char* storage;  // torch.<storage> is its typed storage class; null where torch has none
};

constexpr std::array<DtypeInfo, 18> kDtypes{{
    {Dtype::F64, "float64", 8, "DoubleStorage"},
    {Dtype::F32, "float32", 4, "FloatStorage"},
    {Dtype::F16, "float16", 2, "HalfStorage"},
    {Dtype::BF16, "bfloat16", 2, "BFloat16Storage"},
    {Dtype::C64, "complex64", 8, "ComplexFloatStorage"},
    {Dtype::C128, "complex128", 16, "ComplexDoubleStorage"},
    {Dtype::I64, "int64", 8, "LongStorage"},
    {Dtype::I32, "int32", 4, "IntStorage"},
    {Dtype::I16, "int16", 2, "ShortStorage"},
    {Dtype::I8, "int8", 1, "CharStorage"},
    {Dtype::U8, "uint8", 1, "ByteStorage"},
    {Dtype::BOOL, "bool", 1, "BoolStorage"},
    {Dtype::U16, "uint16", 2, nullptr},
    {Dtype::U32, "uint32", 4, nullptr},
    {Dtype::U64, "uint64", 8, nullptr},
    {Dtype::F8_E4M3, "float8_e4m3fn", 1, nullptr},
    {Dtype::F8_E5M2, "float8_e5m2", 1, nullptr},
    {Dtype::F8_E8M0, "float8_e8m0fnu", 1, nullptr},
}};

const DtypeInfo& info(Dtype d) {
  for (const auto& i : kDtypes)
    if (i.dtype == d) return i;
  throw FormatError("unknown pth dtype enumerator");
}

[[noreturn]] void fail(std::string_view label, const std::string& what) {
  throw FormatError(std::string(label) + ": " + what);
}

uint16_t u16(const std::byte* p) {
  uint16_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
uint32_t u32(const std::byte* p) {
  uint32_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
uint64_t u64(const std::byte* p) {
  uint64_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

std::string printable(std::string_view s) {
  std::string out = "'";
  for (char c : s.substr(0, 200)) {
    if (c >= 0x20 && c < 0x7f) {
      out += c;
    } else {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", unsigned(static_cast<unsigned char>(c)));
      out += buf;
    }
  }
  if (s.size() > 200) out += "...";
  return out + "'";
}

// ---- zip --------------------------------------------------------------------------------------------------

constexpr uint32_t kLocalSig = 0x04034b50;
constexpr uint32_t kCentralSig = 0x02014b50;
constexpr uint32_t kEndSig = 0x06054b50;
constexpr uint32_t kEnd64Sig = 0x06064b50;
constexpr uint32_t kLocator64Sig = 0x07064b50;
constexpr size_t kEndSize = 22, kLocator64Size = 20, kEnd64Size = 56, kCentralSize = 46, kLocalSize = 30;

// [offset, offset + size) lies inside [0, limit).
bool fits(uint64_t offset, uint64_t size, uint64_t limit) { return offset <= limit && size <= limit - offset; }

struct CentralDirectory {
  uint64_t offset = 0, size = 0, entries = 0;
  uint64_t limit = 0;  // where the records after the directory begin: nothing of an entry may reach past it
};

CentralDirectory find_central_directory(std::span<const std::byte> file, std::string_view label) {
  const uint64_t n = file.size();
  // The end record sits at the very end, after a comment of up to 65535 bytes; the last candidate whose comment
  // length lands exactly on the end of the file is it.
  uint64_t end = UINT64_MAX;
  const uint64_t lowest = n > kEndSize + 0xffff ? n - kEndSize - 0xffff : 0;
  for (uint64_t p = n - kEndSize + 1; p-- > lowest;) {
    if (u32(file.data() + p) == kEndSig && p + kEndSize + u16(file.data() + p + 20) == n) {
      end = p;
      break;
    }
  }
  if (end == UINT64_MAX) fail(label, "no zip end-of-central-directory record: the file is truncated or not a zip");
  const std::byte* e = file.data() + end;
  CentralDirectory cd;
  uint32_t disk = u16(e + 4), cd_disk = u16(e + 6);
  uint64_t disk_entries = u16(e + 8);
  cd.entries = u16(e + 10);
  cd.size = u32(e + 12);
  cd.offset = u32(e + 16);
  cd.limit = end;
  if (end >= kLocator64Size && u32(e - kLocator64Size) == kLocator64Sig) {
    // torch.save always writes the zip64 records; past 4 GiB they hold the only valid sizes.
    const std::byte* loc = e - kLocator64Size;
    const uint64_t at = u64(loc + 8);
    if (u32(loc + 4) != 0 || u32(loc + 16) > 1) fail(label, "zip archive spans several disks; not supported");
    if (!fits(at, kEnd64Size, end - kLocator64Size) || u32(file.data() + at) != kEnd64Sig)
      fail(label, "zip64 locator points at no zip64 end-of-central-directory record: the file is damaged");
    const std::byte* z = file.data() + at;
    if (u64(z + 4) < kEnd64Size - 12) fail(label, "zip64 end-of-central-directory record is too short");
    disk = u32(z + 16);
    cd_disk = u32(z + 20);
    disk_entries = u64(z + 24);
    cd.entries = u64(z + 32);
    cd.size = u64(z + 40);
    cd.offset = u64(z + 48);
    cd.limit = at;
  } else if (cd.entries == 0xffff || cd.size == 0xffffffff || cd.offset == 0xffffffff) {
    fail(label, "zip end record defers to a zip64 record that is missing: the file is truncated or damaged");
  }
  if (disk != 0 || cd_disk != 0 || disk_entries != cd.entries)
    fail(label, "zip archive spans several disks; not supported");
  if (!fits(cd.offset, cd.size, cd.limit)) {
    fail(label, "zip central directory [" + std::to_string(cd.offset) + ", +" + std::to_string(cd.size) +
                    ") lies outside the file: the file is truncated or damaged");
  }
  if (cd.entries > cd.size / kCentralSize) {
    fail(label, "zip central directory of " + std::to_string(cd.size) + " bytes cannot hold the " +
                    std::to_string(cd.entries) + " entries it declares");
  }
  return cd;
}

// Replaces the 32-bit fields that hold the zip64 sentinel by their values from the zip64 extra field, which
// lists exactly those, in this order.
void apply_zip64_extra(std::span<const std::byte> extra, uint64_t& uncompressed, uint64_t& compressed,
                       uint64_t& local_offset, const std::string& name, std::string_view label) {
  size_t p = 0;
  while (p + 4 <= extra.size()) {
    const uint16_t id = u16(extra.data() + p), size = u16(extra.data() + p + 2);
    p += 4;
    if (size > extra.size() - p) fail(label, "zip entry " + printable(name) + ": extra field runs past its entry");
    if (id == 0x0001) {
      size_t q = p;
      for (uint64_t* field : {&uncompressed, &compressed, &local_offset}) {
        if (*field != 0xffffffff) continue;
        if (q + 8 > p + size) fail(label, "zip entry " + printable(name) + ": zip64 extra field is too short");
        *field = u64(extra.data() + q);
        q += 8;
      }
      return;
    }
    p += size;
  }
}

}  // namespace

const char* dtype_name(Dtype dtype) { return info(dtype).name; }
size_t dtype_size(Dtype dtype) { return info(dtype).size; }

uint64_t Tensor::numel() const {
  uint64_t n = 1;
  for (int64_t d : shape) n *= uint64_t(d);  // bounded: read_pickle() proved the extent fits its storage
  return n;
}

const Record* Archive::find(std::string_view name) const {
  auto it = records.find(std::string(name));
  return it == records.end() ? nullptr : &it->second;
}

Archive read_archive(std::span<const std::byte> file, std::string_view label) {
  if (file.empty()) fail(label, "empty file, not a torch.save checkpoint");
  if (file.size() >= 2 && file[0] == std::byte{0x80} && uint8_t(file[1]) <= 5) {
    fail(label,
         "a bare pickle stream (torch.save before PyTorch 1.6, or pickle.dump): not supported; "
         "load it in Python and save it again with a current torch.save, or convert it to safetensors");
  }
  if (file.size() < 4 || u32(file.data()) != kLocalSig)
    fail(label, "not a zip archive, so not a torch.save checkpoint (.pth/.pt/.ckpt)");
  if (file.size() < kEndSize) fail(label, "file of " + std::to_string(file.size()) + " bytes is truncated");

  const CentralDirectory cd = find_central_directory(file, label);
  std::map<std::string, Record> entries;
  uint64_t p = cd.offset;
  const uint64_t cd_end = cd.offset + cd.size;
  for (uint64_t k = 0; k < cd.entries; ++k) {
    const std::string where = "zip central directory entry " + std::to_string(k);
    if (!fits(p, kCentralSize, cd_end) || u32(file.data() + p) != kCentralSig)
      fail(label, where + " is missing or damaged (bad signature or past the directory's end)");
    const std::byte* c = file.data() + p;
    const uint16_t flags = u16(c + 8), method = u16(c + 10);
    uint64_t compressed = u32(c + 20), uncompressed = u32(c + 24), local = u32(c + 42);
    const uint64_t name_len = u16(c + 28), extra_len = u16(c + 30), comment_len = u16(c + 32);
    const uint64_t total = kCentralSize + name_len + extra_len + comment_len;
    if (!fits(p, total, cd_end)) fail(label, where + " runs past the end of the central directory");
    std::string name(reinterpret_cast<const char*>(c + kCentralSize), name_len);
    apply_zip64_extra(file.subspan(p + kCentralSize + name_len, extra_len), uncompressed, compressed, local, name,
                      label);
    p += total;

    const std::string entry = "zip entry " + printable(name);
    if (name.empty()) fail(label, where + " has an empty name");
    if (flags & 0x1) fail(label, entry + " is encrypted");
    if (method != 0) {
      fail(label, entry + " is compressed (zip method " + std::to_string(method) +
                      "); torch.save stores entries uncompressed, so the file was repacked by a zip tool: "
                      "repack it without compression (zip -0) or save it again with torch.save");
    }
    if (compressed != uncompressed)
      fail(label, entry + " is stored with " + std::to_string(compressed) + " bytes for " +
                      std::to_string(uncompressed) + " bytes of content");
    // The local header repeats the name; its extra field (torch pads it to align the data) may differ.
    if (!fits(local, kLocalSize, cd.offset) || u32(file.data() + local) != kLocalSig)
      fail(label, entry + ": local header at offset " + std::to_string(local) + " is missing or damaged");
    const std::byte* l = file.data() + local;
    const uint64_t local_name = u16(l + 26), local_extra = u16(l + 28);
    const uint64_t data = local + kLocalSize + local_name + local_extra;
    if (!fits(local, kLocalSize + local_name + local_extra, cd.offset) || local_name != name_len ||
        std::memcmp(l + kLocalSize, name.data(), name_len) != 0)
      fail(label, entry + ": local header does not match the central directory");
    if (!fits(data, uncompressed, cd.offset)) {
      fail(label, entry + ": its " + std::to_string(uncompressed) + " bytes at offset " + std::to_string(data) +
                      " run past the end of the data area: the file is truncated or damaged");
    }
    if (!entries.emplace(name, Record{data, uncompressed}).second) fail(label, entry + " appears twice");
  }

  // The folder name is the saved file's stem (or "archive"): only data.pkl's path tells it.
  Archive a;
  for (const auto& [name, r] : entries) {
    const size_t slash = name.find('/');
    if (slash == std::string::npos || slash == 0 || name.substr(slash + 1) != "data.pkl") continue;
    if (!a.folder.empty())
      fail(label, "zip archive holds two pickles, " + printable(a.folder + "/data.pkl") + " and " + printable(name));
    a.folder = name.substr(0, slash);
  }
  if (a.folder.empty()) fail(label, "zip archive has no <folder>/data.pkl entry: not a torch.save checkpoint");
  const std::string prefix = a.folder + "/";
  for (const auto& [name, r] : entries)
    if (name.compare(0, prefix.size(), prefix) == 0) a.records.emplace(name.substr(prefix.size()), r);
  return a;
}

// ---- pickle -----------------------------------------------------------------------------------------------

namespace {

enum class Kind : uint8_t { None, Bool, Int, Float, String, Bytes, Tuple, List, Dict, Global, Storage, Tensor };

// With its article, for messages: "is a tuple, not a dict".
const char* kind_name(Kind k) {
  switch (k) {
    case Kind::None: return "None";
    case Kind::Bool: return "a bool";
    case Kind::Int: return "an int";
    case Kind::Float: return "a float";
    case Kind::String: return "a str";
    case Kind::Bytes: return "a bytes object";
    case Kind::Tuple: return "a tuple";
    case Kind::List: return "a list";
    case Kind::Dict: return "a dict";
    case Kind::Global: return "a global";
    case Kind::Storage: return "a storage";
    case Kind::Tensor: return "a tensor";
  }
  return "?";
}

// The globals a state dict may name; anything else is refused when its name is read.
enum class Callable : uint8_t {
  OrderedDict,
  RebuildTensorV2,
  RebuildTensorV3,
  RebuildParameter,
  RebuildParameterWithState,
  TypedStorage,    // torch.<X>Storage: only a tag inside a persistent id
  UntypedStorage,  // likewise, bytes
  DtypeObject,     // torch.<dtype>: an argument of _rebuild_tensor_v3
  CodecsEncode,    // _codecs.encode(str, 'latin1'): how protocol 2 pickles a bytes object
};

// Containers, strings and tensors live in the machine's pools and values refer to them by index. Nothing is
// reference counted or walked recursively, so neither a self-referencing list (via the memo) nor a million
// nested lists can exhaust the stack when the machine is torn down.
struct Value {
  Kind kind = Kind::None;
  uint8_t tag = 0;     // a Global's Callable
  uint32_t ref = 0;    // pool index of a String, Bytes, Tuple, List, Dict, Storage or Tensor
  int64_t number = 0;  // Bool, Int; a Float's bits; the Dtype a storage class or dtype Global names
};
static_assert(sizeof(Value) == 16);

struct Dict {
  std::vector<std::pair<Value, Value>> items;
  std::unordered_map<uint32_t, size_t> by_name;  // interned string key -> item, so a repeated key replaces
};

struct StorageValue {
  uint32_t key;  // string pool index
  Dtype dtype;
  uint64_t numel;
  Record record;
};

struct TupleSpan {
  size_t begin, size;
};

struct OpName {
  uint8_t code;
  const char* name;
};

// Every opcode of pickle protocols 0-5, so a refusal can name what it met.
constexpr OpName kOpNames[] = {
    {'(', "MARK"},
    {'.', "STOP"},
    {'0', "POP"},
    {'1', "POP_MARK"},
    {'2', "DUP"},
    {'F', "FLOAT"},
    {'I', "INT"},
    {'J', "BININT"},
    {'K', "BININT1"},
    {'L', "LONG"},
    {'M', "BININT2"},
    {'N', "NONE"},
    {'P', "PERSID"},
    {'Q', "BINPERSID"},
    {'R', "REDUCE"},
    {'S', "STRING"},
    {'T', "BINSTRING"},
    {'U', "SHORT_BINSTRING"},
    {'V', "UNICODE"},
    {'X', "BINUNICODE"},
    {'a', "APPEND"},
    {'b', "BUILD"},
    {'c', "GLOBAL"},
    {'d', "DICT"},
    {'}', "EMPTY_DICT"},
    {'e', "APPENDS"},
    {'g', "GET"},
    {'h', "BINGET"},
    {'i', "INST"},
    {'j', "LONG_BINGET"},
    {'l', "LIST"},
    {']', "EMPTY_LIST"},
    {'o', "OBJ"},
    {'p', "PUT"},
    {'q', "BINPUT"},
    {'r', "LONG_BINPUT"},
    {'s', "SETITEM"},
    {'t', "TUPLE"},
    {')', "EMPTY_TUPLE"},
    {'u', "SETITEMS"},
    {'G', "BINFLOAT"},
    {0x80, "PROTO"},
    {0x81, "NEWOBJ"},
    {0x82, "EXT1"},
    {0x83, "EXT2"},
    {0x84, "EXT4"},
    {0x85, "TUPLE1"},
    {0x86, "TUPLE2"},
    {0x87, "TUPLE3"},
    {0x88, "NEWTRUE"},
    {0x89, "NEWFALSE"},
    {0x8a, "LONG1"},
    {0x8b, "LONG4"},
    {'B', "BINBYTES"},
    {'C', "SHORT_BINBYTES"},
    {0x8c, "SHORT_BINUNICODE"},
    {0x8d, "BINUNICODE8"},
    {0x8e, "BINBYTES8"},
    {0x8f, "EMPTY_SET"},
    {0x90, "ADDITEMS"},
    {0x91, "FROZENSET"},
    {0x92, "NEWOBJ_EX"},
    {0x93, "STACK_GLOBAL"},
    {0x94, "MEMOIZE"},
    {0x95, "FRAME"},
    {0x96, "BYTEARRAY8"},
    {0x97, "NEXT_BUFFER"},
    {0x98, "READONLY_BUFFER"},
};

std::string op_label(uint8_t code) {
  char hex[8];
  std::snprintf(hex, sizeof hex, "0x%02x", unsigned(code));
  for (const auto& o : kOpNames)
    if (o.code == code) return std::string(o.name) + " (" + hex + ")";
  return std::string("unknown opcode ") + hex;
}

class Machine {
 public:
  Machine(std::span<const std::byte> pkl, const Archive& archive, std::string_view label,
          std::span<const std::string_view> containers)
      : pkl_(pkl), archive_(archive), label_(label), containers_(containers) {}

  Checkpoint run();

 private:
  [[noreturn]] void error(const std::string& what) const {
    fail(label_, "data.pkl: " + op_label(op_) + " at offset " + std::to_string(op_at_) + ": " + what);
  }

  // -- reading the opcode stream
  const std::byte* take(uint64_t n) {
    if (n > pkl_.size() - pos_) error("needs " + std::to_string(n) + " bytes but the pickle ends first");
    const std::byte* p = pkl_.data() + pos_;
    pos_ += n;
    return p;
  }
  uint8_t byte() { return uint8_t(*take(1)); }
  std::string_view line() {
    const size_t start = pos_;
    while (pos_ < pkl_.size() && pkl_[pos_] != std::byte{'\n'})
      if (++pos_ - start > 1024) error("name longer than 1024 bytes");
    if (pos_ == pkl_.size()) error("name not terminated by a newline before the pickle ends");
    ++pos_;
    return {reinterpret_cast<const char*>(pkl_.data() + start), pos_ - 1 - start};
  }

  // -- building values
  void count(uint64_t n = 1) {
    built_ += n;
    if (built_ > kMaxValues) error("pickle builds more than " + std::to_string(kMaxValues) + " values");
  }
  // Text is interned: equal strings share one index, so dict keys and storage keys compare in constant time
  // however long they are and however often a pickle repeats them.
  Value make_string(Kind kind, uint64_t size) {
    const std::string_view text(reinterpret_cast<const char*>(take(size)), size);
    if (kind == Kind::String)
      if (auto it = interned_.find(text); it != interned_.end()) return Value{kind, 0, it->second, 0};
    count();
    strings_.emplace_back(text);
    const uint32_t ref = uint32_t(strings_.size() - 1);
    if (kind == Kind::String) interned_.emplace(strings_.back(), ref);
    return Value{kind, 0, ref, 0};
  }
  Value make_int(int64_t v) { return Value{Kind::Int, 0, 0, v}; }
  Value make_tuple(std::span<const Value> items) {
    count(1 + items.size());
    tuples_.push_back({tuple_items_.size(), items.size()});
    tuple_items_.insert(tuple_items_.end(), items.begin(), items.end());
    return Value{Kind::Tuple, 0, uint32_t(tuples_.size() - 1), 0};
  }
  Value make_list() {
    count();
    lists_.emplace_back();
    return Value{Kind::List, 0, uint32_t(lists_.size() - 1), 0};
  }
  Value make_dict() {
    count();
    dicts_.emplace_back();
    return Value{Kind::Dict, 0, uint32_t(dicts_.size() - 1), 0};
  }
  std::span<const Value> tuple(const Value& v) const {
    const TupleSpan& t = tuples_[v.ref];
    return {tuple_items_.data() + t.begin, t.size};
  }
  const std::string& str(const Value& v) const { return strings_[v.ref]; }

  void set_item(Value dict, Value key, Value value) {
    Dict& d = dicts_[dict.ref];
    if (key.kind == Kind::String) {
      auto [it, added] = d.by_name.emplace(key.ref, d.items.size());
      if (!added) {
        d.items[it->second].second = value;
        return;
      }
    }
    count();
    d.items.emplace_back(key, value);
  }

  // -- the stack; a MARK fences off what lies below it, as in CPython's unpickler
  size_t fence() const { return marks_.empty() ? 0 : marks_.back(); }
  void push(Value v) {
    if (stack_.size() >= kMaxStack) error("stack deeper than " + std::to_string(kMaxStack) + " values");
    stack_.push_back(v);
  }
  Value pop() {
    if (stack_.size() <= fence()) error("stack underflow");
    Value v = stack_.back();
    stack_.pop_back();
    return v;
  }
  Value& top() {
    if (stack_.size() <= fence()) error("stack underflow");
    return stack_.back();
  }
  // The values above the innermost MARK, which is removed; they stay in place until the caller drops them.
  std::span<const Value> pop_mark() {
    if (marks_.empty()) error("no MARK to close");
    const size_t m = marks_.back();
    marks_.pop_back();
    return {stack_.data() + m, stack_.size() - m};
  }
  void drop_from(std::span<const Value> items) { stack_.resize(size_t(items.data() - stack_.data())); }
  // The value just under a MARK that pop_mark() closed: the container APPENDS and SETITEMS fill.
  Value& below(std::span<const Value> items) {
    const size_t m = size_t(items.data() - stack_.data());
    if (m <= fence()) error("stack underflow");
    return stack_[m - 1];
  }
  Value& expect(Value& v, Kind kind, const char* what) {
    if (v.kind != kind) error(std::string(what) + " is " + kind_name(v.kind) + ", not " + kind_name(kind));
    return v;
  }

  void memo_put(uint64_t index) {
    if (memo_.size() >= kMaxMemo && !memo_.count(index))
      error("memo holds more than " + std::to_string(kMaxMemo) + " entries");
    memo_[index] = top();
  }
  void memo_get(uint64_t index) {
    auto it = memo_.find(index);
    if (it == memo_.end()) error("memo entry " + std::to_string(index) + " was never stored");
    push(it->second);
  }

  // -- the allowed globals
  Value global(std::string_view module, std::string_view name);
  Value call(const Value& callable, const Value& args);
  Value persistent_load(const Value& pid);
  Value rebuild_tensor(std::span<const Value> args, bool v3);
  int64_t as_int(const Value& v, const char* what) {
    if (v.kind != Kind::Int) error(std::string(what) + " is " + kind_name(v.kind) + ", not an int");
    return v.number;
  }
  std::vector<int64_t> int_tuple(const Value& v, const char* what);

  Checkpoint result(Value root);

  std::span<const std::byte> pkl_;
  const Archive& archive_;
  std::string_view label_;
  std::span<const std::string_view> containers_;
  size_t pos_ = 0;
  size_t op_at_ = 0;
  uint8_t op_ = 0;
  uint64_t built_ = 0;

  std::vector<Value> stack_;
  std::vector<size_t> marks_;
  std::unordered_map<uint64_t, Value> memo_;

  std::deque<std::string> strings_;  // a deque: interned_ views them, so they must not move
  std::unordered_map<std::string_view, uint32_t> interned_;
  std::vector<TupleSpan> tuples_;
  std::vector<Value> tuple_items_;
  std::vector<std::vector<Value>> lists_;
  std::deque<Dict> dicts_;
  std::vector<StorageValue> storages_;
  std::unordered_map<uint32_t, uint32_t> storage_by_key_;  // interned key -> storages_ index
  std::vector<Tensor> tensors_;
  std::vector<uint32_t> tensor_storage_;  // storages_ index of each of tensors_
};

Value Machine::global(std::string_view module, std::string_view name) {
  auto make = [](Callable c, Dtype d = Dtype::F32) { return Value{Kind::Global, uint8_t(c), 0, int64_t(d)}; };
  if (module == "collections" && name == "OrderedDict") return make(Callable::OrderedDict);
  if (module == "_codecs" && name == "encode") return make(Callable::CodecsEncode);
  if (module == "torch._utils") {
    if (name == "_rebuild_tensor_v2") return make(Callable::RebuildTensorV2);
    if (name == "_rebuild_tensor_v3") return make(Callable::RebuildTensorV3);
    if (name == "_rebuild_parameter") return make(Callable::RebuildParameter);
    if (name == "_rebuild_parameter_with_state") return make(Callable::RebuildParameterWithState);
  }
  if ((module == "torch" || module == "torch.storage") && name == "UntypedStorage")
    return make(Callable::UntypedStorage, Dtype::U8);
  if (module == "torch") {
    for (const auto& d : kDtypes) {
      if (d.storage && name == d.storage) return make(Callable::TypedStorage, d.dtype);
      if (name == d.name) return make(Callable::DtypeObject, d.dtype);
    }
  }
  error("global " + printable(std::string(module) + "." + std::string(name)) +
        " refused: a checkpoint is read as a dict of tensors, and naming any other callable is how a pickle runs "
        "code (this may be a malicious file; if it is not, convert it to safetensors in Python)");
}

std::vector<int64_t> Machine::int_tuple(const Value& v, const char* what) {
  if (v.kind != Kind::Tuple) error(std::string(what) + " is " + kind_name(v.kind) + ", not a tuple");
  const auto items = tuple(v);
  if (items.size() > kMaxRank)
    error(std::string(what) + " has " + std::to_string(items.size()) + " dimensions, above " +
          std::to_string(kMaxRank));
  std::vector<int64_t> out;
  for (const auto& i : items) {
    const int64_t n = as_int(i, what);
    if (n < 0) error(std::string(what) + " holds the negative value " + std::to_string(n));
    out.push_back(n);
  }
  return out;
}

Value Machine::persistent_load(const Value& pid) {
  if (pid.kind != Kind::Tuple) error(std::string("persistent id is ") + kind_name(pid.kind) + ", not a tuple");
  const auto t = tuple(pid);
  if (t.size() != 5 || t[0].kind != Kind::String || str(t[0]) != "storage")
    error("persistent id is not ('storage', type, key, location, numel)");
  if (t[1].kind != Kind::Global ||
      (Callable(t[1].tag) != Callable::TypedStorage && Callable(t[1].tag) != Callable::UntypedStorage))
    error("persistent id's storage type is not a torch storage class");
  if (t[2].kind != Kind::String) error("persistent id's storage key is not a string");
  if (t[3].kind != Kind::String) error("persistent id's location is not a string");
  const Dtype dtype = Dtype(t[1].number);
  const int64_t numel = as_int(t[4], "storage size");
  if (numel < 0) error("storage size " + std::to_string(numel) + " is negative");
  const std::string& key = str(t[2]);
  // torch.save numbers its storages; a long key only makes every tensor descriptor that copies it larger.
  if (key.size() > kMaxStorageKey)
    error("storage key of " + std::to_string(key.size()) + " bytes, above " + std::to_string(kMaxStorageKey));
  uint64_t bytes = 0;
  if (__builtin_mul_overflow(uint64_t(numel), dtype_size(dtype), &bytes))
    error("storage " + printable(key) + " of " + std::to_string(numel) + " elements overflows a 64-bit byte count");

  if (auto it = storage_by_key_.find(t[2].ref); it != storage_by_key_.end()) {
    const StorageValue& s = storages_[it->second];
    if (s.dtype != dtype || s.numel != uint64_t(numel))
      error("storage " + printable(key) + " is declared twice with different types or sizes");
    return Value{Kind::Storage, 0, it->second, 0};
  }
  Record record{};
  if (const Record* r = archive_.find("data/" + key)) {
    record = *r;
  } else if (numel != 0) {
    error("storage " + printable(key) + " has no record data/" + key + " in the archive: the file is damaged");
  }
  if (record.size != bytes) {
    error("storage " + printable(key) + " declares " + std::to_string(numel) + " elements of " + dtype_name(dtype) +
          " (" + std::to_string(bytes) + " bytes) but its record holds " + std::to_string(record.size) + " bytes");
  }
  count();
  storages_.push_back({t[2].ref, dtype, uint64_t(numel), record});
  storage_by_key_.emplace(t[2].ref, uint32_t(storages_.size() - 1));
  return Value{Kind::Storage, 0, uint32_t(storages_.size() - 1), 0};
}

// _rebuild_tensor_v2(storage, storage_offset, size, stride, requires_grad, backward_hooks[, metadata])
// _rebuild_tensor_v3(storage, storage_offset, size, stride, requires_grad, backward_hooks, dtype[, metadata])
Value Machine::rebuild_tensor(std::span<const Value> args, bool v3) {
  const size_t need = v3 ? 7 : 6;
  if (args.size() != need && args.size() != need + 1)
    error(std::string(v3 ? "_rebuild_tensor_v3" : "_rebuild_tensor_v2") + " called with " +
          std::to_string(args.size()) + " arguments");
  if (args[0].kind != Kind::Storage) error(std::string("tensor's storage is ") + kind_name(args[0].kind));
  if (tensors_.size() >= kMaxTensors) error("more than " + std::to_string(kMaxTensors) + " tensors");
  const StorageValue& s = storages_[args[0].ref];
  Dtype dtype = s.dtype;
  if (v3) {
    if (args[6].kind != Kind::Global || Callable(args[6].tag) != Callable::DtypeObject)
      error("_rebuild_tensor_v3's dtype argument is not a torch dtype");
    dtype = Dtype(args[6].number);
  }
  const int64_t offset = as_int(args[1], "storage offset");
  if (offset < 0) error("storage offset " + std::to_string(offset) + " is negative");
  Tensor t;
  t.dtype = dtype;
  t.shape = int_tuple(args[2], "tensor size");
  t.strides = int_tuple(args[3], "tensor stride");
  if (t.shape.size() != t.strides.size())
    error("tensor size has " + std::to_string(t.shape.size()) + " dimensions but its stride " +
          std::to_string(t.strides.size()));
  t.storage = strings_[s.key];
  t.storage_offset = uint64_t(offset);

  // The highest element the view reaches must lie inside the storage's bytes, all in 64-bit arithmetic.
  const uint64_t es = dtype_size(dtype);
  const uint64_t storage_bytes = s.numel * dtype_size(s.dtype);
  bool empty = false;
  for (int64_t d : t.shape) empty = empty || d == 0;
  if (!empty) {
    uint64_t last = uint64_t(offset), first_byte = 0, end_byte = 0;
    bool overflow = false;
    for (size_t i = 0; i < t.shape.size(); ++i) {
      uint64_t step = 0;
      overflow = overflow || __builtin_mul_overflow(uint64_t(t.shape[i] - 1), uint64_t(t.strides[i]), &step) ||
                 __builtin_add_overflow(last, step, &last);
    }
    overflow = overflow || __builtin_add_overflow(last, 1, &end_byte) ||
               __builtin_mul_overflow(end_byte, es, &end_byte) ||
               __builtin_mul_overflow(uint64_t(offset), es, &first_byte);
    if (overflow || end_byte > storage_bytes) {
      std::string shape;
      for (size_t i = 0; i < t.shape.size(); ++i) shape += (i ? ", " : "") + std::to_string(t.shape[i]);
      error("tensor of " + std::string(dtype_name(dtype)) + " [" + shape + "] at storage offset " +
            std::to_string(offset) + " reaches " +
            (overflow ? "past 2^64 bytes" : std::to_string(end_byte) + " bytes") + ", beyond its storage " +
            printable(t.storage) + " of " + std::to_string(storage_bytes) + " bytes");
    }
    t.extent_bytes = end_byte - first_byte;
  }
  count(1 + t.shape.size() + t.strides.size());
  tensors_.push_back(std::move(t));
  tensor_storage_.push_back(args[0].ref);
  return Value{Kind::Tensor, 0, uint32_t(tensors_.size() - 1), 0};
}

Value Machine::call(const Value& callable, const Value& args_value) {
  if (callable.kind != Kind::Global) error(std::string("calls ") + kind_name(callable.kind));
  if (args_value.kind != Kind::Tuple) error(std::string("arguments are ") + kind_name(args_value.kind));
  const auto args = tuple(args_value);
  switch (Callable(callable.tag)) {
    case Callable::OrderedDict:
      if (!args.empty()) error("OrderedDict called with arguments");
      return make_dict();
    case Callable::RebuildTensorV2: return rebuild_tensor(args, false);
    case Callable::RebuildTensorV3: return rebuild_tensor(args, true);
    case Callable::RebuildParameter:
    case Callable::RebuildParameterWithState: {
      const size_t need = Callable(callable.tag) == Callable::RebuildParameter ? 3 : 4;
      if (args.size() != need || args[0].kind != Kind::Tensor)
        error("_rebuild_parameter needs (tensor, requires_grad, hooks[, state])");
      return args[0];
    }
    case Callable::CodecsEncode:
      if (args.size() != 2 || args[0].kind != Kind::String || args[1].kind != Kind::String || str(args[1]) != "latin1")
        error("_codecs.encode needs (str, 'latin1')");
      // Only ever skipped, so the text stands in for its encoding.
      return Value{Kind::Bytes, 0, args[0].ref, 0};
    case Callable::TypedStorage:
    case Callable::UntypedStorage:
    case Callable::DtypeObject: break;
  }
  error("a storage class or dtype is called; state dicts never do that");
}

Checkpoint Machine::result(Value root) {
  // Trainer checkpoints wrap the weights; the caller says which keys, in which order.
  std::string taken;
  for (std::string_view key : containers_) {
    auto name = interned_.find(key);
    if (root.kind != Kind::Dict || name == interned_.end()) continue;
    const Dict& d = dicts_[root.ref];
    if (auto it = d.by_name.find(name->second);
        it != d.by_name.end() && d.items[it->second].second.kind == Kind::Dict) {
      root = d.items[it->second].second;
      taken += (taken.empty() ? "" : ".") + std::string(key);
    }
  }
  if (root.kind != Kind::Dict)
    fail(label_, std::string("the pickled object is ") + kind_name(root.kind) + ", not a dict of tensors");
  Checkpoint out;
  for (const auto& [key, value] : dicts_[root.ref].items) {
    if (key.kind != Kind::String || value.kind != Kind::Tensor) continue;
    // One tensor may sit under many names; each copy counts.
    if (out.tensors.size() >= kMaxTensors) fail(label_, "more than " + std::to_string(kMaxTensors) + " tensors");
    Tensor t = tensors_[value.ref];
    t.name = str(key);
    const StorageValue& s = storages_[tensor_storage_[value.ref]];
    out.storages.try_emplace(t.storage, Storage{t.storage, s.dtype, s.numel, s.record});
    out.tensors.push_back(std::move(t));
  }
  if (out.tensors.empty()) fail(label_, "no tensors in the checkpoint's dict");
  out.container = std::move(taken);
  return out;
}

Checkpoint Machine::run() {
  while (true) {
    op_at_ = pos_;
    if (pos_ >= pkl_.size()) {
      op_ = 0;
      fail(label_, "data.pkl: pickle ends at offset " + std::to_string(pos_) + " without a STOP opcode");
    }
    op_ = byte();
    switch (op_) {
      case 0x80: {  // PROTO
        const uint8_t proto = byte();
        if (proto < 2 || proto > 5) error("pickle protocol " + std::to_string(proto) + " not supported");
        break;
      }
      case 0x95: take(8); break;  // FRAME: a hint for buffered readers; the whole pickle is in memory anyway
      case '}': push(make_dict()); break;
      case ']': push(make_list()); break;
      case ')': push(make_tuple({})); break;
      case '(':
        if (marks_.size() >= kMaxMarks) error("more than " + std::to_string(kMaxMarks) + " nested MARKs");
        marks_.push_back(stack_.size());
        break;
      case 'X': push(make_string(Kind::String, u32(take(4)))); break;
      case 0x8c: push(make_string(Kind::String, byte())); break;
      case 0x8d: push(make_string(Kind::String, u64(take(8)))); break;
      case 'C': push(make_string(Kind::Bytes, byte())); break;
      case 'B': push(make_string(Kind::Bytes, u32(take(4)))); break;
      case 0x8e: push(make_string(Kind::Bytes, u64(take(8)))); break;
      case 'J': push(make_int(int32_t(u32(take(4))))); break;
      case 'K': push(make_int(byte())); break;
      case 'M': push(make_int(u16(take(2)))); break;
      case 0x8a: {  // LONG1: little-endian two's complement of n bytes
        const uint8_t n = byte();
        if (n > 8) error("integer of " + std::to_string(n) + " bytes does not fit 64 bits");
        const std::byte* p = take(n);
        uint64_t v = 0;
        for (uint8_t i = 0; i < n; ++i) v |= uint64_t(uint8_t(p[i])) << (8 * i);
        if (n > 0 && n < 8 && (uint8_t(p[n - 1]) & 0x80)) v |= ~uint64_t(0) << (8 * n);
        push(make_int(int64_t(v)));
        break;
      }
      case 'G': {  // BINFLOAT: big-endian
        const std::byte* p = take(8);
        uint64_t bits = 0;
        for (int i = 0; i < 8; ++i) bits = bits << 8 | uint8_t(p[i]);
        push(Value{Kind::Float, 0, 0, int64_t(bits)});
        break;
      }
      case 0x88: push(Value{Kind::Bool, 0, 0, 1}); break;
      case 0x89: push(Value{Kind::Bool, 0, 0, 0}); break;
      case 'N': push(Value{}); break;
      case 't': {
        const auto items = pop_mark();
        const Value t = make_tuple(items);
        drop_from(items);
        push(t);
        break;
      }
      case 0x85:
      case 0x86:
      case 0x87: {
        const size_t n = size_t(op_ - 0x84);
        if (stack_.size() < fence() + n) error("stack underflow");
        const Value t = make_tuple(std::span<const Value>(stack_).last(n));
        stack_.resize(stack_.size() - n);
        push(t);
        break;
      }
      case 'l': {
        const auto items = pop_mark();
        const Value l = make_list();
        count(items.size());
        lists_[l.ref].assign(items.begin(), items.end());
        drop_from(items);
        push(l);
        break;
      }
      case 'a': {
        const Value v = pop();
        const Value l = expect(top(), Kind::List, "APPEND target");
        count();
        lists_[l.ref].push_back(v);
        break;
      }
      case 'e': {
        const auto items = pop_mark();
        const Value l = expect(below(items), Kind::List, "APPENDS target");
        count(items.size());
        lists_[l.ref].insert(lists_[l.ref].end(), items.begin(), items.end());
        drop_from(items);
        break;
      }
      case 's': {
        const Value v = pop(), k = pop();
        set_item(expect(top(), Kind::Dict, "SETITEM target"), k, v);
        break;
      }
      case 'u': {
        const auto items = pop_mark();
        if (items.size() % 2) error("odd number of values (" + std::to_string(items.size()) + ") for key/value pairs");
        const Value d = expect(below(items), Kind::Dict, "SETITEMS target");
        for (size_t i = 0; i < items.size(); i += 2) set_item(d, items[i], items[i + 1]);
        drop_from(items);
        break;
      }
      case 'q': memo_put(byte()); break;
      case 'r': memo_put(u32(take(4))); break;
      case 0x94: memo_put(memo_.size()); break;
      case 'h': memo_get(byte()); break;
      case 'j': memo_get(u32(take(4))); break;
      case 'c': {
        const std::string_view module = line();
        push(global(module, line()));
        break;
      }
      case 0x93: {  // STACK_GLOBAL
        const Value name = pop(), module = pop();
        if (name.kind != Kind::String || module.kind != Kind::String) error("module or name is not a string");
        push(global(str(module), str(name)));
        break;
      }
      case 'R': {
        const Value args = pop(), callable = pop();
        push(call(callable, args));
        break;
      }
      case 'Q': push(persistent_load(pop())); break;
      case 'b': {
        // state_dict()'s OrderedDict carries _metadata (per-module versions) as state; nothing else may.
        pop();
        expect(top(), Kind::Dict, "BUILD target");
        break;
      }
      case '0': pop(); break;
      case '1': drop_from(pop_mark()); break;
      case '.': {
        if (stack_.empty()) error("stack is empty");
        return result(stack_.back());
      }
      default: error("not part of the pickle subset a state dict uses (dicts, lists, tuples, scalars, tensors)");
    }
  }
}

}  // namespace

Checkpoint read_pickle(std::span<const std::byte> pkl, const Archive& archive, std::string_view label,
                       std::span<const std::string_view> containers) {
  return Machine(pkl, archive, label, containers).run();
}

Checkpoint parse(std::span<const std::byte> file, std::string_view label,
                 std::span<const std::string_view> containers) {
  const Archive archive = read_archive(file, label);
  if (const Record* r = archive.find("byteorder")) {
    const std::string_view order(reinterpret_cast<const char*>(file.data() + r->offset), r->size);
    if (order == "big") fail(label, "checkpoint was saved on a big-endian machine; only little-endian is read");
    if (order != "little") fail(label, "byteorder record holds " + printable(order) + ", not 'little' or 'big'");
  }
  const Record* pkl = archive.find("data.pkl");
  return read_pickle(file.subspan(pkl->offset, pkl->size), archive, label, containers);
}

}  // namespace latent::pth
