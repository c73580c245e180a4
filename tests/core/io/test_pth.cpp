// The torch.save reader: archives torch.save writes (made at test time by the .venv's Python) come back equal,
// as views of the mapped file that share memory where Python's tensors did; hostile archives each end in an
// error naming the file and the defect, never a crash, a runaway allocation or a call of a pickled function.
#include <gtest/gtest.h>
#include <torch/serialize.h>
#include <torch/types.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include "io/json.h"
#include "io/pth_format.h"
#include "latent/io/safetensors.h"
#include "latent/io/weights.h"
#include "memory/residency.h"
#include "vae_fixtures.h"

using namespace latent;
using namespace std::string_literals;
namespace fs = std::filesystem;

namespace {

// ---- archives built by hand ---------------------------------------------------------------------------------

uint32_t crc32(std::string_view data) {
  uint32_t crc = 0xffffffff;
  for (char c : data) {
    crc ^= uint8_t(c);
    for (int k = 0; k < 8; ++k) crc = (crc >> 1) ^ (0xedb88320 & (0 - (crc & 1)));
  }
  return ~crc;
}

template <typename T>
void put(std::string& out, T v) {
  out.append(reinterpret_cast<const char*>(&v), sizeof v);
}

struct ZipOptions {
  uint16_t method = 0;  // 8 marks an entry deflated (its bytes are not: the reader must refuse before)
  bool zip64 = true;    // end records as torch.save writes them
  size_t align = 64;    // data offsets padded like torch.save's, through a local extra field
  size_t misalign = 0;  // then moved this many bytes off the alignment
  uint16_t flags = 0;
};

using Entries = std::vector<std::pair<std::string, std::string>>;

std::string zip(const Entries& entries, const ZipOptions& opt = {}) {
  std::string out, central;
  for (const auto& [name, data] : entries) {
    const uint32_t local = uint32_t(out.size());
    size_t extra = 0;
    if (opt.align) {
      const size_t at = local + 30 + name.size() + 4;
      extra = 4 + (opt.align - at % opt.align) % opt.align + opt.misalign;
    }
    const uint32_t crc = crc32(data), size = uint32_t(data.size());
    put<uint32_t>(out, 0x04034b50);
    put<uint16_t>(out, 20);
    put<uint16_t>(out, opt.flags);
    put<uint16_t>(out, opt.method);
    put<uint32_t>(out, 0);  // time, date
    put(out, crc);
    put(out, size);
    put(out, size);
    put<uint16_t>(out, uint16_t(name.size()));
    put<uint16_t>(out, uint16_t(extra));
    out += name;
    if (extra) {
      put<uint16_t>(out, 0x4246);
      put<uint16_t>(out, uint16_t(extra - 4));
      out.append(extra - 4, 'Z');
    }
    out += data;

    put<uint32_t>(central, 0x02014b50);
    put<uint16_t>(central, 20);
    put<uint16_t>(central, 20);
    put<uint16_t>(central, opt.flags);
    put<uint16_t>(central, opt.method);
    put<uint32_t>(central, 0);
    put(central, crc);
    put(central, size);
    put(central, size);
    put<uint16_t>(central, uint16_t(name.size()));
    put<uint32_t>(central, 0);  // extra, comment length
    put<uint32_t>(central, 0);  // disk, internal attributes
    put<uint32_t>(central, 0);  // external attributes
    put(central, local);
    central += name;
  }
  const uint64_t cd_offset = out.size(), n = entries.size();
  out += central;
  if (opt.zip64) {
    const uint64_t at = out.size();
    put<uint32_t>(out, 0x06064b50);
    put<uint64_t>(out, 44);
    put<uint16_t>(out, 45);
    put<uint16_t>(out, 45);
    put<uint32_t>(out, 0);
    put<uint32_t>(out, 0);
    put(out, n);
    put(out, n);
    put<uint64_t>(out, central.size());
    put(out, cd_offset);
    put<uint32_t>(out, 0x07064b50);
    put<uint32_t>(out, 0);
    put(out, at);
    put<uint32_t>(out, 1);
  }
  put<uint32_t>(out, 0x06054b50);
  put<uint32_t>(out, 0);
  put<uint16_t>(out, uint16_t(n));
  put<uint16_t>(out, uint16_t(n));
  put<uint32_t>(out, uint32_t(central.size()));
  put<uint32_t>(out, uint32_t(cd_offset));
  put<uint16_t>(out, 0);
  return out;
}

// Protocol 2 pickles, written the way Python's pickler writes a state dict.
struct Pickle {
  std::string b = "\x80\x02";

  Pickle& raw(std::string_view s) {
    b += s;
    return *this;
  }
  Pickle& str(std::string_view s) {
    b += 'X';
    put<uint32_t>(b, uint32_t(s.size()));
    b += s;
    return *this;
  }
  Pickle& integer(int64_t v) {
    if (v >= 0 && v < 256) {
      b += 'K';
      b += char(v);
    } else {
      b += "\x8a\x08";  // LONG1, 8 bytes
      put(b, v);
    }
    return *this;
  }
  Pickle& global(std::string_view module, std::string_view name) {
    b += 'c';
    b += module;
    b += '\n';
    b += name;
    b += '\n';
    return *this;
  }
  Pickle& ints(const std::vector<int64_t>& v) {
    b += '(';
    for (int64_t x : v) integer(x);
    b += 't';
    return *this;
  }
  Pickle& tensor(std::string_view key, int64_t numel, const std::vector<int64_t>& shape,
                 const std::vector<int64_t>& stride, int64_t offset = 0, std::string_view type = "FloatStorage") {
    global("torch._utils", "_rebuild_tensor_v2").raw("((").str("storage").global("torch", type);
    str(key).str("cpu").integer(numel).raw("tQ").integer(offset).ints(shape).ints(stride);
    return raw("\x89").global("collections", "OrderedDict").raw(")RtR");
  }
  std::string done() const { return b + "."; }
};

std::string floats(std::initializer_list<float> v) {
  std::string out;
  for (float f : v) put(out, f);
  return out;
}

std::string archive(const std::string& pkl, const Entries& records = {}, const ZipOptions& opt = {}) {
  Entries e{{"archive/data.pkl", pkl}, {"archive/byteorder", "little"}};
  for (const auto& [key, data] : records) e.emplace_back("archive/data/" + key, data);
  e.emplace_back("archive/version", "3\n");
  return zip(e, opt);
}

// {"w": 2x3 view of storage "0", "v": every other element from offset 1} over the floats 0..5
std::string two_views_pickle() {
  return Pickle()
      .raw("}(")
      .str("w")
      .tensor("0", 6, {2, 3}, {3, 1})
      .str("v")
      .tensor("0", 6, {3}, {2}, 1)
      .raw("u")
      .done();
}
const Entries kSixFloats{{"0", floats({0, 1, 2, 3, 4, 5})}};

std::span<const std::byte> bytes_of(const std::string& s) {
  return {reinterpret_cast<const std::byte*>(s.data()), s.size()};
}

std::string parse_error(const std::string& file) {
  try {
    pth::parse(bytes_of(file), "t.pth");
  } catch (const pth::FormatError& e) {
    return e.what();
  }
  ADD_FAILURE() << "parsed";
  return {};
}

std::string pickle_error(const std::string& pkl) { return parse_error(archive(pkl, kSixFloats)); }

void expect_has(const std::string& msg, const std::string& part) {
  EXPECT_NE(msg.find(part), std::string::npos) << "'" << part << "' not in: " << msg;
}

bool inside(const torch::Tensor& t, std::span<const std::byte> m) {
  const auto* p = static_cast<const std::byte*>(t.data_ptr());
  return p >= m.data() && p < m.data() + m.size();
}

class Pth : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("latent-pth-" + std::to_string(::getpid()) + "-" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  fs::path write(const std::string& name, const std::string& data) {
    fs::path p = dir_ / name;
    std::ofstream(p, std::ios::binary) << data;
    return p;
  }
  static std::string load_error(const fs::path& p) {
    try {
      read_weights(p);
    } catch (const ModelError& e) {
      return e.what();
    }
    ADD_FAILURE() << "loaded " << p;
    return {};
  }

  fs::path dir_;
};

}  // namespace

// ---- archives built by hand ---------------------------------------------------------------------------------

TEST_F(Pth, ReadsViewsOfOneStorageInPlace) {
  for (bool zip64 : {true, false}) {
    auto src = read_weights(write("w.pth", archive(two_views_pickle(), kSixFloats, {.zip64 = zip64})));
    ASSERT_EQ(src.tensors.size(), 2u);
    const auto& w = src.tensors.at("w");
    const auto& v = src.tensors.at("v");
    EXPECT_TRUE(torch::equal(w, torch::arange(6, torch::kFloat).view({2, 3})));
    EXPECT_TRUE(torch::equal(v, torch::tensor({1.f, 3.f, 5.f})));
    EXPECT_EQ(v.strides(), (std::vector<int64_t>{2}));
    // Views of the mapped file, one storage as in Python: v starts one float after w.
    ASSERT_EQ(src.mapped.size(), 1u);
    EXPECT_TRUE(inside(w, src.mapped[0]));
    EXPECT_EQ(static_cast<const char*>(v.data_ptr()) - static_cast<const char*>(w.data_ptr()), 4);
    // The mapping is private: writing into a tensor leaves the file alone.
    w.fill_(9);
    EXPECT_EQ(v[0].item<float>(), 9);
    auto again = read_weights(dir_ / "w.pth");
    EXPECT_TRUE(torch::equal(again.tensors.at("w"), torch::arange(6, torch::kFloat).view({2, 3})));
  }
}

TEST_F(Pth, CopiesMisalignedData) {
  auto src = read_weights(write("m.pth", archive(two_views_pickle(), kSixFloats, {.misalign = 1})));
  const auto& w = src.tensors.at("w");
  EXPECT_TRUE(torch::equal(w, torch::arange(6, torch::kFloat).view({2, 3})));
  EXPECT_TRUE(torch::equal(src.tensors.at("v"), torch::tensor({1.f, 3.f, 5.f})));
  EXPECT_FALSE(inside(w, src.mapped[0]));
  EXPECT_EQ(reinterpret_cast<uintptr_t>(w.data_ptr()) % 4, 0u);
}

TEST_F(Pth, SettlesResidencyOfViews) {
  // 64 KiB per tensor: whole pages a model may keep or drop.
  std::string data;
  for (int i = 0; i < 3 * 16384; ++i) put(data, float(i));
  auto pkl = Pickle().raw("}(");
  for (int i = 0; i < 3; ++i) pkl.str("t" + std::to_string(i)).tensor("0", 3 * 16384, {128, 128}, {128, 1}, i * 16384);
  auto src = read_weights(write("r.pth", archive(pkl.raw("u").done(), {{"0", data}})));
  // t1 is kept as a view; t0 and t2 are replaced by converted copies, so their pages can go.
  WeightReader as_is(src, torch::kCPU, torch::kFloat), converted(src, torch::kCPU, torch::kDouble);
  auto kept = as_is.take("t1", {128, 128});
  (void)converted.take("t0", {128, 128});
  (void)converted.take("t2", {128, 128});
  const Residency r = settle_residency(src);
  EXPECT_GE(r.resident_bytes, 64 << 10);
  EXPECT_GT(r.released_bytes, 0);
  // Released pages come back from the file unchanged.
  for (int i = 0; i < 3; ++i)
    EXPECT_TRUE(torch::equal(src.tensors.at("t" + std::to_string(i)).flatten(),
                             torch::arange(i * 16384, (i + 1) * 16384, torch::kFloat)));
  EXPECT_TRUE(torch::equal(kept.flatten(), torch::arange(16384, 2 * 16384, torch::kFloat)));
}

TEST_F(Pth, FindsTheStateDictInsideACheckpoint) {
  for (const char* key : {"state_dict", "model"}) {
    auto pkl = Pickle()
                   .raw("}(")
                   .str("epoch")
                   .integer(3)
                   .str(key)
                   .raw("}(")
                   .str("w")
                   .tensor("0", 6, {6}, {1})
                   .str("step")
                   .integer(int64_t(1) << 40)
                   .raw("u")
                   .str("lr")
                   .raw("G\x3f\xb9\x99\x99\x99\x99\x99\x9a")
                   .str("best")
                   .tensor("0", 6, {2}, {1})
                   .raw("u")
                   .done();
    auto c = pth::parse(bytes_of(archive(pkl, kSixFloats)), "t.pth");
    ASSERT_EQ(c.tensors.size(), 1u) << key;
    EXPECT_EQ(c.tensors[0].name, "w");
  }
  // A repeated key replaces the earlier value in place, as in a Python dict.
  auto pkl = Pickle()
                 .raw("}(")
                 .str("a")
                 .tensor("0", 6, {1}, {1})
                 .str("b")
                 .tensor("0", 6, {2}, {1})
                 .str("a")
                 .tensor("0", 6, {3}, {1})
                 .raw("u")
                 .done();
  auto c = pth::parse(bytes_of(archive(pkl, kSixFloats)), "t.pth");
  ASSERT_EQ(c.tensors.size(), 2u);
  EXPECT_EQ(c.tensors[0].name, "a");
  EXPECT_EQ(c.tensors[0].shape, (std::vector<int64_t>{3}));
  expect_has(load_error(write("none.pth", archive(Pickle().raw("}(").str("epoch").integer(3).raw("u").done()))),
             "none.pth: not a readable torch.save checkpoint: no tensors in the checkpoint's dict");
}

TEST_F(Pth, RefusesEveryTruncation) {
  const std::string good = archive(two_views_pickle(), kSixFloats);
  ASSERT_NO_THROW(pth::parse(bytes_of(good), "t.pth"));
  for (size_t n = 0; n < good.size(); ++n) {
    const std::string cut = good.substr(0, n);
    EXPECT_THROW(pth::parse(bytes_of(cut), "t.pth"), pth::FormatError) << "truncated to " << n;
  }
  expect_has(parse_error(good.substr(0, good.size() - 1)), "t.pth: no zip end-of-central-directory record");
  expect_has(load_error(write("cut.pth", good.substr(0, good.size() / 2))),
             "cut.pth: not a readable torch.save checkpoint: no zip end-of-central-directory record: the file is "
             "truncated");
  expect_has(load_error(write("empty.pth", "")), "empty.pth: not a readable torch.save checkpoint: empty file");
}

TEST_F(Pth, RefusesDamagedZipStructures) {
  expect_has(parse_error(archive(two_views_pickle(), kSixFloats, {.method = 8})),
             "zip entry 'archive/data.pkl' is compressed (zip method 8)");
  expect_has(parse_error(archive(two_views_pickle(), kSixFloats, {.flags = 1})), "is encrypted");
  expect_has(parse_error(zip({{"archive/data.pkl", two_views_pickle()}, {"other/data.pkl", "x"}})),
             "holds two pickles");
  expect_has(parse_error(zip({{"archive/data.pkl", two_views_pickle()}, {"archive/data.pkl", "x"}})),
             "'archive/data.pkl' appears twice");
  expect_has(parse_error(zip({{"data.pkl", two_views_pickle()}})), "has no <folder>/data.pkl entry");
  expect_has(parse_error("PK not really a zip"), "not a zip archive");
  expect_has(parse_error(two_views_pickle()), "a bare pickle stream (torch.save before PyTorch 1.6");

  std::string good = archive(two_views_pickle(), kSixFloats, {.zip64 = false});
  auto patched = [&](size_t at, uint32_t v) {
    std::string s = good;
    std::memcpy(s.data() + at, &v, 4);
    return s;
  };
  const size_t end = good.size() - 22;
  uint32_t cd_offset;
  std::memcpy(&cd_offset, good.data() + end + 16, 4);
  expect_has(parse_error(patched(end + 16, cd_offset - 1)), "zip central directory entry 0 is missing or damaged");
  expect_has(parse_error(patched(end + 16, 0x7fffffff)), "lies outside the file");
  expect_has(parse_error(patched(cd_offset + 42, 1)), "local header at offset 1 is missing or damaged");
  expect_has(parse_error(patched(cd_offset + 20, 1u << 30)), "is stored with 1073741824 bytes for");
  expect_has(parse_error(patched(cd_offset + 20, 1u << 30).replace(cd_offset + 24, 4, "\0\0\0\x40", 4)),
             "run past the end of the data area");
  std::string big_endian = archive(two_views_pickle(), kSixFloats);
  big_endian.replace(big_endian.find("little"), 6, "big\0\0\0", 6);
  expect_has(parse_error(big_endian), "byteorder record holds");
  expect_has(parse_error(zip({{"archive/data.pkl", two_views_pickle()}, {"archive/byteorder", "big"}})),
             "saved on a big-endian machine");
}

TEST_F(Pth, RefusesGlobalsThatRunCode) {
  const std::vector<std::pair<const char*, const char*>> globals{{"os", "system"},
                                                                 {"posix", "system"},
                                                                 {"builtins", "eval"},
                                                                 {"builtins", "exec"},
                                                                 {"subprocess", "Popen"},
                                                                 {"torch", "load"},
                                                                 {"torch._utils", "_rebuild_from_type_v2"},
                                                                 {"collections", "defaultdict"}};
  for (const auto& [module, name] : globals) {
    const std::string where = std::string(module) + "." + name;
    const std::string msg = pickle_error(Pickle().global(module, name).str("touch /tmp/x").raw("\x85R").done());
    expect_has(msg, "t.pth: data.pkl: GLOBAL (0x63) at offset 2: global '" + where + "' refused");
    // Protocol 4 names globals from the stack.
    expect_has(pickle_error(Pickle().str(module).str(name).raw("\x93").done()), "global '" + where + "' refused");
  }
  expect_has(load_error(write("evil.pth", archive(Pickle().global("os", "system").raw(")R").done()))),
             "evil.pth: not a readable torch.save checkpoint: data.pkl: GLOBAL (0x63) at offset 2: global "
             "'os.system' refused");
}

TEST_F(Pth, RefusesTensorsBeyondTheirStorageWithoutAllocating) {
  const double before = latent::testing::rss_mib();
  const int64_t huge = int64_t(1) << 40;
  auto one = [](int64_t numel, std::vector<int64_t> shape, std::vector<int64_t> stride, int64_t offset = 0) {
    return Pickle().raw("}(").str("w").tensor("0", numel, shape, stride, offset).raw("u").done();
  };
  const Entries one_float{{"0", floats({1.5f})}};
  auto error = [&](const std::string& pkl) { return parse_error(archive(pkl, one_float)); };
  // The storage's size comes from the record, whatever the pickle claims.
  expect_has(error(one(huge, {huge}, {1})),
             "storage '0' declares 1099511627776 elements of float32 (4398046511104 bytes) but its record holds 4 "
             "bytes");
  expect_has(error(one(1 << 20, {1 << 20}, {1})), "declares 1048576 elements");
  expect_has(error(one((int64_t(1) << 62) + 1, {1}, {1})), "overflows a 64-bit byte count");
  // The view must stay inside the storage.
  expect_has(error(one(1, {huge}, {1})),
             "REDUCE (0x52) at offset 142: tensor of float32 [1099511627776] at storage offset 0 reaches "
             "4398046511104 bytes, beyond its storage '0' of 4 bytes");
  expect_has(error(one(1, {1}, {1}, 1)), "at storage offset 1 reaches 8 bytes");
  // Stride 0 (an expanded tensor): every row is the one float, which fits.
  EXPECT_NO_THROW(pth::parse(bytes_of(archive(one(1, {2, 1}, {0, 1}), one_float)), "t.pth"));
  expect_has(error(one(1, {2}, {huge})), "beyond its storage");
  expect_has(error(one(1, {huge, huge, huge}, {huge, huge, huge})), "reaches past 2^64 bytes");
  expect_has(error(one(1, {1}, {1}, int64_t(1) << 62)), "reaches past 2^64 bytes");
  expect_has(error(Pickle().raw("}(").str("w").tensor("0", 1, {-1}, {1}).raw("u").done()),
             "tensor size holds the negative value -1");
  expect_has(error(Pickle().raw("}(").str("w").tensor("0", 1, {1}, {-1}).raw("u").done()),
             "tensor stride holds the negative value -1");
  expect_has(error(one(1, std::vector<int64_t>(33, 1), std::vector<int64_t>(33, 1))), "33 dimensions, above 32");
  expect_has(error(one(1, {1, 1}, {1})), "tensor size has 2 dimensions but its stride 1");
  // A missing or short record.
  expect_has(error(Pickle().raw("}(").str("w").tensor("9", 1, {1}, {1}).raw("u").done()),
             "storage '9' has no record data/9 in the archive");
  expect_has(parse_error(archive(one(2, {2}, {1}), {{"0", "\1\2\3\4\5"}})),
             "declares 2 elements of float32 (8 bytes) but its record holds 5 bytes");
  expect_has(error(Pickle()
                       .raw("}(")
                       .str("a")
                       .tensor("0", 1, {1}, {1})
                       .str("b")
                       .tensor("0", 1, {1}, {1}, 0, "HalfStorage")
                       .raw("u")
                       .done()),
             "storage '0' is declared twice with different types or sizes");
  EXPECT_LT(latent::testing::rss_mib() - before, 64);
}

TEST_F(Pth, BoundsNestingStackAndMemo) {
  const double before = latent::testing::rss_mib();
  // A million nested lists: the structure torch::pickle_load builds and then overflows the stack destroying.
  const size_t deep = 1'000'000;
  expect_has(pickle_error(Pickle().raw(std::string(deep, ']')).raw(std::string(deep - 1, 'a')).done()),
             "t.pth: the pickled object is a list, not a dict of tensors");
  // Dicts nested as deep through SETITEM.
  std::string dicts;
  for (size_t i = 0; i < 100'000; ++i) dicts += "}X\1\0\0\0k"s;
  dicts += '}';
  dicts += std::string(100'000, 's');
  expect_has(pickle_error(Pickle().raw(dicts).done()), "no tensors in the checkpoint's dict");
  // A list holding itself through the memo.
  expect_has(pickle_error(Pickle()
                              .raw("]q\x00h\x00"
                                   "a"s)
                              .done()),
             "the pickled object is a list");
  expect_has(pickle_error(Pickle().raw(std::string(pth::kMaxMarks + 1, '(')).done()),
             "MARK (0x28) at offset 258: more than 256 nested MARKs");
  expect_has(pickle_error(Pickle().raw(std::string(pth::kMaxStack + 1, 'N')).done()),
             "stack deeper than 1048576 values");
  // Memo indices far apart cost one entry each (torch::pickle_load reserved 4.6 GB for 0x10000000).
  expect_has(pickle_error(Pickle().raw("}r\x00\x00\x00\x10r\xff\xff\xff\x7f"s).done()), "no tensors");
  expect_has(pickle_error(Pickle().raw("]h\x05").done()), "BINGET (0x68) at offset 3: memo entry 5 was never stored");
  // One tensor under ever more names: each name is a descriptor, so their number is bounded too.
  Pickle many;
  many.raw("}(").str("t0").tensor("0", 6, {6}, {1}).raw("r\1\0\0\0"s);
  for (size_t i = 1; i <= pth::kMaxTensors; ++i) many.str("t" + std::to_string(i)).raw("j\1\0\0\0"s);
  expect_has(pickle_error(many.raw("u").done()), "t.pth: more than 131072 tensors");
  // A storage key is a number in torch.save's archives; a long one would be copied into every descriptor.
  expect_has(pickle_error(Pickle().raw("}(").str("w").tensor(std::string(300, '7'), 6, {6}, {1}).raw("u").done()),
             "storage key of 300 bytes, above 256");
  EXPECT_LT(latent::testing::rss_mib() - before, 256);
}

TEST_F(Pth, RefusesPickleDefectsByOpcodeAndOffset) {
  const std::vector<std::pair<std::string, std::string>> cases{
      {Pickle().raw("\xff").done(), "unknown opcode 0xff at offset 2: not part of the pickle subset"},
      {Pickle().raw("(i__main__\nX\n").done(), "INST (0x69) at offset 3: not part of the pickle subset"},
      {Pickle().global("collections", "OrderedDict").raw(")\x81").done(), "NEWOBJ (0x81) at offset 28"},
      {Pickle().raw("}").b, "pickle ends at offset 3 without a STOP opcode"},
      {"\x80\x06}.", "PROTO (0x80) at offset 0: pickle protocol 6 not supported"},
      {Pickle().raw("u").done(), "SETITEMS (0x75) at offset 2: no MARK to close"},
      {Pickle().raw("}(K\x01u").done(), "odd number of values (1) for key/value pairs"},
      {Pickle().raw("a").done(), "APPEND (0x61) at offset 2: stack underflow"},
      {Pickle().raw("}N(a").done(), "APPEND (0x61) at offset 5: stack underflow"},
      {Pickle().raw("}Na").done(), "APPEND target is a dict, not a list"},
      {Pickle().raw("]NNs").done(), "SETITEM target is a list, not a dict"},
      {Pickle().raw("]}b").done(), "BUILD target is a list, not a dict"},
      {Pickle().raw(")NR").done(), "REDUCE (0x52) at offset 4: calls a tuple"},
      {Pickle().global("collections", "OrderedDict").raw("NR").done(),
       "REDUCE (0x52) at offset 28: arguments are None"},
      {Pickle().global("collections", "OrderedDict").raw("K\x01\x85R").done(), "OrderedDict called with arguments"},
      {Pickle().global("torch", "FloatStorage").raw(")R").done(), "a storage class or dtype is called"},
      {Pickle().raw("\x8a\x09").raw(std::string(9, '\1')).done(), "LONG1 (0x8a) at offset 2: integer of 9 bytes"},
      {Pickle().raw("X\xff\xff\xff\x7f").done(), "BINUNICODE (0x58) at offset 2: needs 2147483647 bytes"},
      {Pickle().raw("\x8d\xff\xff\xff\xff\xff\xff\xff\xff").done(), "needs 18446744073709551615 bytes"},
      {Pickle().raw("cos\nsys").b, "name not terminated by a newline"},
      {Pickle().raw("NQ").done(), "BINPERSID (0x51) at offset 3: persistent id is None, not a tuple"},
      {Pickle().str("storage").raw("\x85Q").done(), "persistent id is not ('storage', type, key, location, numel)"},
      {Pickle().global("torch._utils", "_rebuild_tensor_v2").raw("NNN\x87R").done(),
       "_rebuild_tensor_v2 called with 3 arguments"},
      {Pickle().global("torch._utils", "_rebuild_parameter").raw("NNN\x87R").done(),
       "_rebuild_parameter needs (tensor, requires_grad, hooks[, state])"},
  };
  for (const auto& [pkl, part] : cases) expect_has(pickle_error(pkl), part);
}

// ---- archives torch.save writes (.venv Python, at test time) ------------------------------------------------

namespace {

const char* python() { return std::getenv("LATENT_PYTHON"); }

int run_python(const std::string& args) {
  const char* src = std::getenv("LATENT_SOURCE_DIR");
  const std::string root = src ? src : LATENT_TEST_SOURCE_ROOT;
  const std::string cmd =
      std::string("'") + python() + "' '" + root + "/tests/core/pth_interop.py' " + args + " >/dev/null 2>&1";
  return std::system(cmd.c_str());
}

c10::ScalarType dtype_named(const std::string& name) {
  static const std::map<std::string, c10::ScalarType> kNames{{"float32", c10::kFloat},
                                                             {"float64", c10::kDouble},
                                                             {"float16", c10::kHalf},
                                                             {"bfloat16", c10::kBFloat16},
                                                             {"complex64", c10::kComplexFloat},
                                                             {"complex128", c10::kComplexDouble},
                                                             {"int64", c10::kLong},
                                                             {"int32", c10::kInt},
                                                             {"int16", c10::kShort},
                                                             {"int8", c10::kChar},
                                                             {"uint8", c10::kByte},
                                                             {"bool", c10::kBool},
                                                             {"uint16", c10::kUInt16},
                                                             {"uint32", c10::kUInt32},
                                                             {"uint64", c10::kUInt64},
                                                             {"float8_e4m3fn", c10::kFloat8_e4m3fn},
                                                             {"float8_e5m2", c10::kFloat8_e5m2},
                                                             {"float8_e8m0fnu", c10::kFloat8_e8m0fnu}};
  return kNames.at(name);
}

std::vector<int64_t> int_list(const json::Value& v) {
  std::vector<int64_t> out;
  for (const auto& i : v.as_array()) out.push_back(i.as_int64());
  return out;
}

}  // namespace

TEST_F(Pth, ReadsWhatTorchSaveWrites) {
  if (!python()) GTEST_SKIP() << "no .venv python (LATENT_PYTHON unset)";
  ASSERT_EQ(run_python("write '" + dir_.string() + "'"), 0);
  for (const char* name :
       {"dtypes", "views", "state_dict", "nested", "model_key", "parameters", "protocol4", "protocol5", "empty"}) {
    SCOPED_TRACE(name);
    const auto src = read_weights(dir_ / (std::string(name) + ".pth"));
    const auto expected = SafetensorsFile::open(dir_ / (std::string(name) + ".expected.safetensors"));
    const json::Value layout = json::parse(expected.metadata().at("layout"));
    EXPECT_EQ(src.tensors.size(), layout.as_object().size());
    ASSERT_EQ(src.mapped.size(), 1u);
    for (const auto& [tname, l] : layout.as_object()) {
      SCOPED_TRACE(tname);
      ASSERT_TRUE(src.tensors.count(tname));
      const torch::Tensor& t = src.tensors.at(tname);
      EXPECT_EQ(t.scalar_type(), dtype_named(l.find("dtype")->as_string()));
      EXPECT_EQ(t.sizes().vec(), int_list(*l.find("shape")));
      const auto bytes = expected.tensor(tname);
      const auto contiguous = t.contiguous();
      ASSERT_EQ(size_t(contiguous.nbytes()), size_t(bytes.numel()));
      if (t.numel() == 0) continue;
      EXPECT_EQ(t.strides().vec(), int_list(*l.find("stride")));
      EXPECT_EQ(std::memcmp(contiguous.data_ptr(), bytes.data_ptr(), bytes.numel()), 0);
      EXPECT_TRUE(inside(t, src.mapped[0])) << "copied rather than mapped";
      if (const json::Value* shares = l.find("shares")) {
        const auto& s = shares->as_array();
        const torch::Tensor& other = src.tensors.at(s[0].as_string());
        EXPECT_EQ(static_cast<const char*>(t.data_ptr()) - static_cast<const char*>(other.data_ptr()), s[1].as_int64());
      }
    }
  }
}

TEST_F(Pth, NeverRunsPickledCode) {
  if (!python()) GTEST_SKIP() << "no .venv python (LATENT_PYTHON unset)";
  const fs::path marker = dir_ / "pickle-ran";
  ASSERT_EQ(run_python("evil '" + (dir_ / "evil.pth").string() + "' '" + marker.string() + "'"), 0);
  const std::string msg = load_error(dir_ / "evil.pth");
  expect_has(msg, "evil.pth: not a readable torch.save checkpoint: data.pkl: GLOBAL (0x63) at offset");
  expect_has(msg, "global 'posix.system' refused");
  EXPECT_FALSE(fs::exists(marker));
}

// A weight converted on load (another dtype or device) is checked on the way: a NaN, or a value past the new
// dtype's range (3e38 as float16), is refused naming the tensor, where it used to give all-NaN latents. A weight
// only viewed (the file's dtype on the CPU) is not read at load; the elements report non-finite output instead.
TEST(WeightReaderChecks, ConvertedNonFiniteValuesAreRefusedByName) {
  WeightSource src;
  src.weights = "model.safetensors";
  src.tensors["fine"] = torch::ones({4, 4});
  src.tensors["nan"] = torch::ones({4, 4});
  src.tensors["nan"][1][2] = std::numeric_limits<float>::quiet_NaN();
  src.tensors["huge"] = torch::full({4}, 3e38f);
  {
    WeightReader r(src, torch::kCPU, torch::kFloat16);
    for (const char* name : {"fine", "nan"}) r.take(name, {4, 4});
    r.take("huge", {4});
    try {
      r.finish();
      ADD_FAILURE() << "non-finite weights were accepted";
    } catch (const ModelError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("weights hold values that are not finite"), std::string::npos) << what;
      EXPECT_NE(what.find("nan holds 1 NaN and 0 infinite values as Half"), std::string::npos) << what;
      EXPECT_NE(what.find("huge holds 0 NaN and 4 infinite values"), std::string::npos) << what;
      EXPECT_EQ(what.find("fine"), std::string::npos) << what;
    }
  }
  WeightReader viewed(src, torch::kCPU, torch::kFloat);
  for (const char* name : {"fine", "nan"}) viewed.take(name, {4, 4});
  viewed.take("huge", {4});
  EXPECT_NO_THROW(viewed.finish());
}
