#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <torch/types.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <span>
#include <string>

#include "latent/io/safetensors.h"
#include "latent/io/weights.h"
#include "latent/vae/vae.h"

namespace fs = std::filesystem;
using latent::SafetensorsError;
using latent::SafetensorsFile;
using latent::SafetensorsWriter;

namespace {

class Safetensors : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() / ("latent-st-" + std::to_string(::getpid()) + "-" + info->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  fs::path file(const std::string& name) const { return dir_ / name; }

  // A file with header length `n` (the true JSON length unless given), the JSON text and the data bytes.
  fs::path raw(const std::string& json, const std::string& data, std::optional<uint64_t> n = std::nullopt) {
    fs::path p = file("raw.safetensors");
    std::ofstream out(p, std::ios::binary | std::ios::trunc);
    uint64_t len = n.value_or(json.size());
    out.write(reinterpret_cast<const char*>(&len), 8);
    out << json << data;
    return p;
  }

  // Opening must fail; the message must name the file and contain each fragment.
  void expect_refused(const fs::path& p, std::initializer_list<std::string> fragments) {
    try {
      SafetensorsFile::open(p);
      ADD_FAILURE() << "accepted a defective file";
    } catch (const SafetensorsError& e) {
      std::string msg = e.what();
      EXPECT_NE(msg.find(p.string()), std::string::npos) << "message does not name the file: " << msg;
      for (const auto& f : fragments) EXPECT_NE(msg.find(f), std::string::npos) << "'" << f << "' not in: " << msg;
    }
  }

  static bool same_bytes(const torch::Tensor& a, const torch::Tensor& b) {
    return a.scalar_type() == b.scalar_type() && a.sizes() == b.sizes() && a.nbytes() == b.nbytes() &&
           std::memcmp(a.contiguous().data_ptr(), b.contiguous().data_ptr(), a.nbytes()) == 0;
  }

  fs::path dir_;
};

std::string entry(const std::string& name, const std::string& dtype, const std::string& shape, uint64_t b, uint64_t e) {
  return "\"" + name + "\":{\"dtype\":\"" + dtype + "\",\"shape\":" + shape + ",\"data_offsets\":[" +
         std::to_string(b) + "," + std::to_string(e) + "]}";
}

SafetensorsWriter::Options fast() { return {.header_reserve = 16 * 1024, .durable = false}; }

}  // namespace

// ---- hostile and damaged files ------------------------------------------------------------------------------

TEST_F(Safetensors, RefusesEmptyFile) {
  std::ofstream(file("e.safetensors")).close();
  expect_refused(file("e.safetensors"), {"empty file"});
}

TEST_F(Safetensors, RefusesFileShorterThanTheLengthField) {
  std::ofstream(file("s.safetensors")) << "abc";
  expect_refused(file("s.safetensors"), {"too short"});
}

TEST_F(Safetensors, RefusesHeaderLengthAboveLimit) { expect_refused(raw("{}", "", 100'000'001), {"exceeds", "limit"}); }

TEST_F(Safetensors, RefusesHeaderLengthPastEndOfFile) {
  expect_refused(raw("{}", "", 4096), {"header length 4096 runs past the end"});
}

TEST_F(Safetensors, RefusesHeaderThatIsNotAnObject) {
  expect_refused(raw("[1, 2, 3]", ""), {"does not start with '{'"});
  expect_refused(raw("{\"a\": 1}", ""), {"tensor 'a'", "not an object"});
  expect_refused(raw("{\"a\": ", ""), {"not valid JSON"});
  expect_refused(raw("{}garbage", ""), {"not valid JSON", "after the JSON value"});
}

TEST_F(Safetensors, RefusesUnknownDtype) {
  expect_refused(raw("{" + entry("w", "F128", "[1]", 0, 16) + "}", std::string(16, '\0')),
                 {"tensor 'w'", "unknown dtype \"F128\""});
}

TEST_F(Safetensors, RefusesShapeOffsetMismatch) {
  expect_refused(raw("{" + entry("w", "F32", "[2,2]", 0, 12) + "}", std::string(12, '\0')),
                 {"tensor 'w'", "need 16 bytes", "span 12"});
}

TEST_F(Safetensors, RefusesShapeOverflowAndBadDimensions) {
  expect_refused(raw("{" + entry("w", "F32", "[4294967296,4294967296]", 0, 0) + "}", ""), {"tensor 'w'", "overflow"});
  expect_refused(raw("{" + entry("w", "F32", "[-1]", 0, 0) + "}", ""), {"tensor 'w'", "shape"});
  expect_refused(raw("{" + entry("w", "F32", "[1.5]", 0, 0) + "}", ""), {"tensor 'w'", "shape"});
  expect_refused(raw("{" + entry("w", "F32", "\"4\"", 0, 0) + "}", ""), {"tensor 'w'", "shape"});
  std::string rank33 = "[" + std::string(32 * 2, ' ') + "1";
  for (int i = 0; i < 32; ++i) rank33 += ",1";
  expect_refused(raw("{" + entry("w", "F32", rank33 + "]", 0, 4) + "}", std::string(4, '\0')), {"rank 33"});
}

TEST_F(Safetensors, RefusesOverlappingTensors) {
  expect_refused(
      raw("{" + entry("a", "F32", "[2]", 0, 8) + "," + entry("b", "F32", "[2]", 4, 12) + "}", std::string(12, '\0')),
      {"tensor 'b'", "overlaps tensor 'a'"});
}

TEST_F(Safetensors, RefusesOutOfRangeOffsets) {
  expect_refused(raw("{" + entry("a", "F32", "[2]", 0, 8) + "}", std::string(4, '\0')),
                 {"tensor 'a'", "past the end of the data buffer"});
  expect_refused(raw("{" + entry("a", "U8", "[0]", 18446744073709551615ull, 18446744073709551615ull) + "}", ""),
                 {"tensor 'a'", "past the end"});
  expect_refused(raw("{" + entry("a", "U8", "[2]", 8, 6) + "}", std::string(8, '\0')), {"end before begin"});
  expect_refused(raw("{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0]}}", "x"), {"data_offsets"});
}

TEST_F(Safetensors, RefusesHoles) {
  expect_refused(
      raw("{" + entry("a", "F32", "[2]", 0, 8) + "," + entry("b", "F32", "[2]", 12, 20) + "}", std::string(20, '\0')),
      {"tensor 'b'", "hole of 4"});
  expect_refused(raw("{" + entry("a", "F32", "[2]", 0, 8) + "}", std::string(9, '\0')),
                 {"1 bytes after the last tensor"});
}

TEST_F(Safetensors, RefusesDuplicateNames) {
  expect_refused(raw("{" + entry("w", "U8", "[1]", 0, 1) + "," + entry("w", "U8", "[1]", 1, 2) + "}", "ab"),
                 {"duplicate key \"w\""});
}

TEST_F(Safetensors, RefusesTruncatedData) {
  fs::path p = file("t.safetensors");
  {
    SafetensorsWriter w(p, fast());
    w.write("weight", torch::ones({64, 64}));
    w.commit();
  }
  fs::resize_file(p, fs::file_size(p) - 100);
  expect_refused(p, {"tensor 'weight'", "truncated"});
}

TEST_F(Safetensors, RefusesBadMetadata) {
  expect_refused(raw("{\"__metadata__\":{\"a\":1}}", ""), {"__metadata__", "\"a\"", "not a string"});
  expect_refused(raw("{\"__metadata__\":[]}", ""), {"__metadata__ is not an object"});
}

TEST_F(Safetensors, RefusesDeepNestingAndInvalidUtf8) {
  expect_refused(raw("{\"a\":" + std::string(5000, '[') + "}", ""), {"nesting"});
  expect_refused(raw("{" + entry("w\xC0\xAF", "U8", "[1]", 0, 1) + "}", "a"), {"UTF-8"});
}

TEST_F(Safetensors, RefusesMissingFileAndDirectory) {
  expect_refused(file("absent.safetensors"), {"cannot open", "No such file"});
  expect_refused(dir_, {"not a regular file"});
}

TEST_F(Safetensors, NamesMissingTensor) {
  fs::path p = file("m.safetensors");
  SafetensorsWriter w(p, fast());
  w.write("a", torch::zeros({1}));
  w.commit();
  auto f = SafetensorsFile::open(p);
  EXPECT_THROW(
      {
        try {
          f.tensor("encoder.conv_in.weight");
        } catch (const SafetensorsError& e) {
          EXPECT_NE(std::string(e.what()).find("no tensor named 'encoder.conv_in.weight'"), std::string::npos);
          throw;
        }
      },
      SafetensorsError);
}

// ---- round trips --------------------------------------------------------------------------------------------

TEST_F(Safetensors, RoundTripsEveryDtype) {
  std::vector<std::pair<std::string, torch::Tensor>> tensors;
  auto base = torch::arange(-6, 18, torch::kFloat).reshape({2, 3, 4});
  for (auto type :
       {torch::kFloat, torch::kHalf, torch::kBFloat16, torch::kDouble, torch::kLong, torch::kInt, torch::kShort,
        torch::kChar, torch::kByte, torch::kBool, torch::kUInt16, torch::kUInt32, torch::kUInt64, torch::kFloat8_e4m3fn,
        torch::kFloat8_e5m2, torch::kFloat8_e8m0fnu, torch::kComplexFloat}) {
    auto src = (type == torch::kByte || type == torch::kUInt16 || type == torch::kUInt32 || type == torch::kUInt64 ||
                type == torch::kFloat8_e8m0fnu)
                   ? base.abs()
                   : base;
    tensors.emplace_back(c10::toString(type), src.to(type));
  }
  fs::path p = file("all.safetensors");
  {
    SafetensorsWriter w(p, fast());
    for (const auto& [name, t] : tensors) w.write(name, t);
    w.commit();
  }
  auto f = SafetensorsFile::open(p);
  ASSERT_EQ(f.entries().size(), tensors.size());
  for (const auto& [name, t] : tensors) {
    EXPECT_TRUE(same_bytes(f.tensor(name), t)) << name;
  }
}

TEST_F(Safetensors, RoundTripsMetadataScalarsAndEmptyTensors) {
  fs::path p = file("meta.safetensors");
  {
    SafetensorsWriter w(p, fast());
    w.set_metadata("format", "pt");
    w.set_metadata("caps", "video/x-latent, model=(string)\"wan2.1\", note=\"\xC3\xA9\\\n\"");
    w.write("scalar", torch::tensor(3.5));
    w.write("empty", torch::zeros({0, 3}));
    w.write("after_empty", torch::arange(5, torch::kLong));
    w.commit();
  }
  auto f = SafetensorsFile::open(p);
  EXPECT_EQ(f.metadata().at("format"), "pt");
  EXPECT_EQ(f.metadata().at("caps"), "video/x-latent, model=(string)\"wan2.1\", note=\"\xC3\xA9\\\n\"");
  EXPECT_EQ(f.tensor("scalar").dim(), 0);
  EXPECT_EQ(f.tensor("scalar").item<double>(), 3.5);
  EXPECT_EQ(f.tensor("empty").sizes(), (std::vector<int64_t>{0, 3}));
  EXPECT_TRUE(torch::equal(f.tensor("after_empty"), torch::arange(5, torch::kLong)));
}

TEST_F(Safetensors, AlignedTensorsAreZeroCopyAndOutliveTheFile) {
  fs::path p = file("zc.safetensors");
  {
    SafetensorsWriter w(p, fast());
    w.write("w", torch::arange(1024, torch::kFloat));
    w.commit();
  }
  torch::Tensor t;
  {
    auto f = SafetensorsFile::open(p);
    t = f.tensor("w");
    EXPECT_EQ(t.data_ptr(), static_cast<const void*>(f.bytes("w").data())) << "aligned data was copied";
  }
  EXPECT_EQ(t[1023].item<float>(), 1023.0f);  // the mapping lives as long as the tensor
  t.mul_(2);                                  // copy-on-write: the file keeps its values
  EXPECT_EQ(SafetensorsFile::open(p).tensor("w")[1023].item<float>(), 1023.0f);
}

TEST_F(Safetensors, MisalignedTensorsAreCopied) {
  // One byte of U8 first puts the F32 data at an odd address; the reader must copy it rather than alias it.
  std::string data(1, '\x07');
  float vals[3] = {1.5f, -2.0f, 3.25f};
  data.append(reinterpret_cast<const char*>(vals), sizeof vals);
  std::string json = "{" + entry("b", "U8", "[1]", 0, 1) + "," + entry("f", "F32", "[3]", 1, 13) + "}";
  json.resize(((json.size() + 7) / 8) * 8, ' ');
  auto f = SafetensorsFile::open(raw(json, data));
  auto t = f.tensor("f");
  EXPECT_NE(t.data_ptr(), static_cast<const void*>(f.bytes("f").data()));
  EXPECT_TRUE(torch::equal(t, torch::tensor({1.5f, -2.0f, 3.25f})));
  EXPECT_EQ(f.tensor("b").item<uint8_t>(), 7);
}

TEST_F(Safetensors, AppendGrowsOneTensorAlongTime) {
  fs::path p = file("stream.safetensors");
  auto frames = torch::randn({7, 16, 4, 6});
  {
    SafetensorsWriter w(p, fast());
    for (int64_t i = 0; i < 7; i += 2) w.append("latents", frames.slice(0, i, std::min<int64_t>(i + 2, 7)));
    w.set_metadata("frames", "7");
    w.commit();
  }
  auto f = SafetensorsFile::open(p);
  EXPECT_TRUE(torch::equal(f.tensor("latents"), frames));
}

TEST_F(Safetensors, AppendRefusesMismatchedRowsAndReusedNames) {
  SafetensorsWriter w(file("bad.safetensors"), fast());
  w.append("x", torch::zeros({1, 4}));
  EXPECT_THROW(w.append("x", torch::zeros({1, 5})), SafetensorsError);
  EXPECT_THROW(w.append("x", torch::zeros({1, 4}, torch::kHalf)), SafetensorsError);
  EXPECT_THROW(w.append("x", torch::tensor(1.0)), SafetensorsError);
  w.write("y", torch::zeros({2}));
  EXPECT_THROW(w.append("x", torch::zeros({1, 4})), SafetensorsError);  // x is closed once y follows
  EXPECT_THROW(w.write("y", torch::zeros({2})), SafetensorsError);
  EXPECT_THROW(w.write("__metadata__", torch::zeros({2})), SafetensorsError);
  EXPECT_THROW(w.write("z", torch::Tensor()), SafetensorsError);
}

TEST_F(Safetensors, HeaderLargerThanTheReserveIsMovedAhead) {
  fs::path p = file("big-header.safetensors");
  {
    SafetensorsWriter w(p, {.header_reserve = 8, .durable = true});
    for (int i = 0; i < 200; ++i) w.write("blocks." + std::to_string(i) + ".weight", torch::full({3}, float(i)));
    w.commit();
    EXPECT_FALSE(fs::exists(w.temp_path()));
  }
  auto f = SafetensorsFile::open(p);
  EXPECT_EQ(f.entries().size(), 200u);
  EXPECT_EQ(f.tensor("blocks.199.weight")[2].item<float>(), 199.0f);
  for (const auto& e : fs::directory_iterator(dir_)) EXPECT_EQ(e.path(), p) << "left behind: " << e.path();
}

// ---- atomic writes ------------------------------------------------------------------------------------------

TEST_F(Safetensors, NothingAppearsUnderTheFinalNameBeforeCommit) {
  fs::path p = file("atomic.safetensors");
  SafetensorsWriter w(p, fast());
  w.write("a", torch::ones({128}));
  EXPECT_FALSE(fs::exists(p));
  EXPECT_TRUE(fs::exists(w.temp_path()));
  EXPECT_EQ(w.temp_path().parent_path(), p.parent_path()) << "rename must stay within one filesystem";
  w.commit();
  EXPECT_TRUE(fs::exists(p));
  EXPECT_FALSE(fs::exists(w.temp_path()));
  EXPECT_THROW(w.write("b", torch::ones({1})), SafetensorsError);
}

TEST_F(Safetensors, AbandonedWriterLeavesNoFileAndKeepsTheOldOne) {
  fs::path p = file("keep.safetensors");
  {
    SafetensorsWriter w(p, fast());
    w.write("old", torch::ones({2}));
    w.commit();
  }
  fs::path temp;
  {
    SafetensorsWriter w(p, fast());
    temp = w.temp_path();
    w.write("new", torch::zeros({4}));
  }  // destroyed without commit
  EXPECT_FALSE(fs::exists(temp));
  auto f = SafetensorsFile::open(p);
  EXPECT_TRUE(f.contains("old"));
  EXPECT_FALSE(f.contains("new"));
}

TEST_F(Safetensors, CrashMidWriteNeverLeavesAPartialFinalFile) {
  fs::path p = file("crash.safetensors");
  pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    // No torch operation in the child: a fork of a process whose OpenMP pool is running can deadlock in it.
    std::vector<float> data(1 << 16, 1.0f);
    SafetensorsWriter w(p, fast());
    w.write_bytes("a", latent::st::Dtype::F32, {data.size()}, std::as_bytes(std::span(data)));
    std::_Exit(0);  // dies without unwinding, like a crash: no destructor, no commit
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  EXPECT_FALSE(fs::exists(p));
}

// ---- interoperability with the reference implementation (Python safetensors, run at test time) ------------

namespace {

std::vector<std::pair<std::string, torch::Tensor>> interop_tensors() {
  return {
      {"f32", torch::arange(24, torch::kFloat).reshape({2, 3, 4})},
      {"f16", (torch::arange(6, torch::kFloat) / 4).to(torch::kHalf)},
      {"bf16", (torch::arange(10, torch::kFloat) * 0.5).to(torch::kBFloat16)},
      {"i64", torch::arange(-5, 5, torch::kLong)},
      {"u8", torch::arange(256, torch::kInt).to(torch::kByte)},
      {"bool", torch::tensor({true, false, true})},
      {"f8", torch::tensor({0.5f, 1.0f, 2.0f}).to(torch::kFloat8_e4m3fn)},
  };
}

int run_python(const std::string& mode, const fs::path& p) {
  std::string cmd = std::string("'") + std::getenv("LATENT_PYTHON") + "' '" + std::getenv("LATENT_SOURCE_DIR") +
                    "/tests/core/safetensors_interop.py' " + mode + " '" + p.string() + "'";
  return std::system(cmd.c_str());
}

}  // namespace

TEST_F(Safetensors, ReadsFilesOfTheReferenceImplementation) {
  if (!std::getenv("LATENT_PYTHON") || !std::getenv("LATENT_SOURCE_DIR")) GTEST_SKIP() << "no .venv python";
  fs::path p = file("py.safetensors");
  ASSERT_EQ(run_python("write", p), 0);
  auto f = SafetensorsFile::open(p);
  EXPECT_EQ(f.metadata().at("origin"), "python-safetensors");
  for (const auto& [name, t] : interop_tensors()) EXPECT_TRUE(same_bytes(f.tensor(name), t)) << name;
}

TEST_F(Safetensors, WritesFilesTheReferenceImplementationReads) {
  if (!std::getenv("LATENT_PYTHON") || !std::getenv("LATENT_SOURCE_DIR")) GTEST_SKIP() << "no .venv python";
  for (size_t reserve : {size_t(8), size_t(16 * 1024)}) {
    fs::path p = file("cpp-" + std::to_string(reserve) + ".safetensors");
    SafetensorsWriter w(p, {.header_reserve = reserve, .durable = false});
    w.set_metadata("origin", "gst-latent");
    for (const auto& [name, t] : interop_tensors()) w.write(name, t);
    w.commit();
    EXPECT_EQ(run_python("check", p), 0) << "reserve " << reserve;
  }
}

// A 100 MB header (the format's limit) holds ~2 M entries. Name lookups were a linear scan, so loading was
// quadratic: 80,000 zero-size tensors took 10 s to refuse, a million would take hours. Now each lookup is a binary
// search and the whole load linear; this file takes seconds. No time is asserted: the test's timeout is the bound.
TEST_F(Safetensors, AMillionEntriesLoadAndAreRefusedInLinearTime) {
  constexpr int kEntries = 1'000'000;
  std::string json = "{";
  json.reserve(size_t(kEntries) * 64);
  char name[16];
  // Names in descending order, so neither the data order nor the order of appearance is the sorted one.
  for (int i = kEntries - 1; i >= 0; --i) {
    std::snprintf(name, sizeof name, "t%07d", i);
    json += entry(name, "F32", "[0]", 0, 0) + ",";
  }
  json += entry("last", "U8", "[1]", 0, 1) + "}";
  const fs::path p = raw(json, std::string(1, '\x7f'));

  SafetensorsFile f = SafetensorsFile::open(p);
  ASSERT_EQ(f.entries().size(), size_t(kEntries) + 1);
  for (int i = 0; i < kEntries; i += 997) {
    std::snprintf(name, sizeof name, "t%07d", i);
    ASSERT_TRUE(f.contains(name)) << name;
    EXPECT_EQ(f.tensor(name).numel(), 0);
  }
  EXPECT_EQ(f.tensor("last").item<uint8_t>(), 0x7f);
  EXPECT_FALSE(f.contains("t1000000"));
  EXPECT_FALSE(f.contains(""));

  // The whole weight-loading path: every tensor read, then the family detection refuses the file.
  try {
    latent::load_vae(p);
    ADD_FAILURE() << "a file of no known family was loaded";
  } catch (const latent::ModelError& e) {
    EXPECT_NE(std::string(e.what()).find("cannot recognise the model family"), std::string::npos) << e.what();
  }
}

// A FIFO named where a weights file, a checkpoint or a folder's config is expected is refused at once, naming it:
// opening a FIFO for reading waits for a writer, so without the check a state change hangs for good. An alarm
// ends the test binary if any open waits (a hang fails in seconds, not at the suite's timeout).
TEST_F(Safetensors, AFifoIsRefusedWithoutWaiting) {
  const fs::path weights = file("w.safetensors"), checkpoint = file("m.pth"), folder = file("vae");
  fs::create_directories(folder);
  for (const fs::path& p : {weights, checkpoint, folder / "config.json"}) ASSERT_EQ(::mkfifo(p.c_str(), 0600), 0) << p;
  const auto refused = [](const fs::path& p, const std::function<void()>& open) {
    try {
      open();
      ADD_FAILURE() << p << " was opened";
    } catch (const std::exception& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find(p.string() + ": not a regular file (a FIFO)"), std::string::npos) << what;
    }
  };
  ::alarm(20);
  refused(weights, [&] { SafetensorsFile::open(weights); });
  refused(checkpoint, [&] { latent::load_vae(checkpoint, {}); });
  refused(folder / "config.json", [&] { latent::load_vae(folder, {}); });
  ::alarm(0);
}
