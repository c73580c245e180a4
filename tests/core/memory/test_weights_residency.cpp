// settle_residency: the pages of weights a model keeps are resident after loading, the pages of weights it
// replaced leave the process, and nothing read from the file changes.
#include <gtest/gtest.h>
#include <torch/types.h>
#include <torch/utils.h>
#include <unistd.h>

#include <fstream>
#include <sstream>

#include "latent/io/safetensors.h"
#include "latent/io/weights.h"
#include "latent/vae/vae.h"
#include "memory/residency.h"
#include "vae_fixtures.h"

using namespace latent;
namespace fs = std::filesystem;

namespace {

constexpr int64_t kMiB = 1 << 20;
constexpr int64_t kHeaderReserve = 16 * 1024;

int64_t page_size() { return ::sysconf(_SC_PAGESIZE); }
// What may stay resident besides the kept tensors: the header (read while parsing) and, at each end of the three
// tensors, a page shared with a neighbour.
int64_t slack() { return kHeaderReserve + 6 * page_size(); }

// Resident bytes of the mapping that holds `addr`, from /proc/self/smaps.
int64_t mapping_rss(const void* addr) {
  std::ifstream smaps("/proc/self/smaps");
  std::string line;
  bool inside = false;
  const auto a = reinterpret_cast<uintptr_t>(addr);
  while (std::getline(smaps, line)) {
    const auto dash = line.find('-');
    const auto space = line.find(' ');
    if (dash != std::string::npos && space != std::string::npos && dash < space &&
        line.find_first_not_of("0123456789abcdef") == dash) {
      const uintptr_t lo = std::stoull(line.substr(0, dash), nullptr, 16);
      const uintptr_t hi = std::stoull(line.substr(dash + 1, space - dash - 1), nullptr, 16);
      inside = a >= lo && a < hi;
      continue;
    }
    if (inside && line.rfind("Rss:", 0) == 0) {
      std::istringstream in(line.substr(4));
      int64_t kb = 0;
      in >> kb;
      return kb * 1024;
    }
  }
  ADD_FAILURE() << "no mapping holds " << addr;
  return -1;
}

class WeightsResidency : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("latent-residency-" + std::to_string(::getpid()) + "-" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    // Three 4 MiB tensors with different contents, so a page handed back and read again is checked by value.
    path_ = dir_ / "w.safetensors";
    SafetensorsWriter w(path_, {.header_reserve = kHeaderReserve, .durable = false});
    for (int i = 0; i < 3; ++i) w.write(name(i), expected(i));
    w.commit();
  }
  void TearDown() override { fs::remove_all(dir_); }

  static std::string name(int i) { return "t" + std::to_string(i); }
  static torch::Tensor expected(int i) {
    return torch::arange(kMiB, torch::kFloat).mul_(0.25).add_(1000.0 * i).reshape({1024, 1024});
  }
  static void touch_all(const WeightSource& src) {
    for (const auto& [n, t] : src.tensors) (void)t.sum().item<float>();
  }

  fs::path dir_, path_;
};

TEST_F(WeightsResidency, KeptTensorsStayAndDroppedOnesLeave) {
  WeightSource src = read_weights(path_);
  ASSERT_EQ(src.mapped.size(), 1u);
  touch_all(src);
  const void* map = src.mapped[0].data();
  ASSERT_GE(mapping_rss(map), 12 * kMiB);

  torch::Tensor kept;
  {
    WeightReader r(src, torch::kCPU, torch::kFloat);
    kept = r.take(name(1), {1024, 1024});
    // Taken and then replaced by something else, as a transformed kernel replaces the original.
    torch::Tensor replaced = r.take(name(2), {1024, 1024});
  }
  ASSERT_TRUE(kept.defined());
  EXPECT_EQ(kept.data_ptr(), src.tensors.at(name(1)).data_ptr()) << "a float32 CPU weight should be a view";

  const Residency res = settle_residency(src);
  // t0 and t2 leave but for the pages they share with t1 or the header (one page at each end of a tensor).
  EXPECT_GE(res.released_bytes, 8 * kMiB - 4 * page_size());
  EXPECT_LE(res.released_bytes, 8 * kMiB);
  EXPECT_GE(res.resident_bytes, 4 * kMiB);
  EXPECT_LE(res.resident_bytes, 4 * kMiB + 2 * page_size());
  const int64_t rss = mapping_rss(map);
  EXPECT_LE(rss, 4 * kMiB + slack()) << "released pages are still resident";
  EXPECT_GE(rss, 4 * kMiB) << "kept pages are not resident";

  EXPECT_TRUE(torch::equal(kept, expected(1)));
  // A released tensor read again comes back from the file, unchanged.
  EXPECT_TRUE(torch::equal(src.tensors.at(name(0)), expected(0)));
  EXPECT_TRUE(torch::equal(src.tensors.at(name(2)), expected(2)));
}

TEST_F(WeightsResidency, ConvertedWeightsReleaseTheWholeFile) {
  WeightSource src = read_weights(path_);
  touch_all(src);
  std::vector<torch::Tensor> model;
  {
    WeightReader r(src, torch::kCPU, torch::kBFloat16);
    for (int i = 0; i < 3; ++i) model.push_back(r.take(name(i), {1024, 1024}));
  }
  const Residency res = settle_residency(src);
  EXPECT_EQ(res.resident_bytes, 0);
  EXPECT_GE(res.released_bytes, 12 * kMiB - 6 * page_size());
  EXPECT_LE(mapping_rss(src.mapped[0].data()), slack());
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(torch::equal(model[i], expected(i).to(torch::kBFloat16)));
}

TEST_F(WeightsResidency, CheckpointsInMemoryAreLeftAlone) {
  WeightSource src;
  src.tensors["a"] = expected(0);
  const Residency res = settle_residency(src);
  EXPECT_EQ(res.resident_bytes, 0);
  EXPECT_EQ(res.released_bytes, 0);
  EXPECT_TRUE(torch::equal(src.tensors.at("a"), expected(0)));
}

// A whole model: loading settles the file's pages, and the loaded model still matches diffusers (the model
// tests check the values; here the weights that stayed mapped must still be the file's).
TEST_F(WeightsResidency, LoadedModelKeepsWorking) {
  LATENT_REQUIRE_FIXTURES();
  const fs::path wan = latent::testing::fixtures_dir() / "wan";
  WeightSource src = read_weights(wan);
  auto a = load_vae(src);
  // The second load reads the pages the first one released.
  auto b = load_vae(src);
  torch::manual_seed(0);
  const torch::Tensor x = torch::rand({1, 3, 5, 32, 32}) * 2 - 1;
  auto sa = a->new_encoder_state();
  auto sb = b->new_encoder_state();
  EXPECT_TRUE(torch::equal(a->encode_chunk(*sa, x), b->encode_chunk(*sb, x)));
}

}  // namespace
