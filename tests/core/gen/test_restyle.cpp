// Streaming video-to-video against StreamDiffusionV2's own stream-batch loop (tests/fixtures/gen_restyle_fixtures.py:
// its code run on the CPU in float32 with the tiny causal model of the causal fixtures; inputs handed to its DiT
// directly, seed 7). Tolerance: 1e-4 of the largest output value (float32 and float64 arithmetic in the same order;
// the reference batches the step rows into one call, here they are separate calls).
#include <gtest/gtest.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "forwarding_causal_model.h"
#include "latent/gen/denoiser.h"
#include "latent/gen/restyler.h"
#include "latent/io/weights.h"
#include "vae_fixtures.h"

using latent::Denoiser;
using latent::DenoiserFiles;
using latent::load_denoiser;
using latent::read_weights;
using latent::RestyledFrame;
using latent::RestyleOptions;
using latent::Restyler;
using latent::WeightSource;
namespace fs = std::filesystem;

namespace {

constexpr double kRelTolerance = 1e-4;

fs::path data() { return fs::path(LATENT_TEST_SOURCE_ROOT) / "tests" / "fixtures" / "data"; }

const WeightSource& cases() {
  static const WeightSource c = read_weights(data() / "restyle" / "restyle-cases.safetensors");
  return c;
}

torch::Tensor tensor(const std::string& name) {
  auto it = cases().tensors.find(name);
  if (it == cases().tensors.end()) throw std::runtime_error("fixture tensor " + name + " missing");
  return it->second;
}

std::shared_ptr<const Denoiser> model() {
  static std::shared_ptr<const Denoiser> m = [] {
    DenoiserFiles files;
    files.first.transformer_weights = data() / "causal" / "causal-model.safetensors";
    return std::shared_ptr<const Denoiser>(load_denoiser(data() / "causal" / "pipeline", {}, files));
  }();
  return m;
}

double rel_error(const torch::Tensor& got, const torch::Tensor& want) {
  const auto g = got.to(torch::kDouble), w = want.to(torch::kDouble);
  return (g - w).abs().max().item<double>() / w.abs().max().item<double>();
}

RestyleOptions options(double strength) {
  RestyleOptions o;
  o.strength = strength;
  o.seed = 7;
  o.text = tensor("prompt.A").to(torch::kFloat);
  return o;
}

// StreamDiffusionV2's motion measure (streamv2v/inference.py compute_noise_scale_and_step) of stream chunk j (the
// 4 pixel frames after the first 5 + 4 j) over the fixture's stand-in video of per-frame constants.
double motion(const torch::Tensor& pixel_values, int64_t chunk) {
  const int64_t n = pixel_values.numel(), end = 9 + 4 * chunk;
  const torch::Tensor video = pixel_values.to(torch::kFloat).view({1, 1, n, 1, 1}).expand({1, 3, n, 48, 64});
  const torch::Tensor d = video.narrow(2, end - 4, 4) - video.narrow(2, end - 5, 4);
  return (torch::sqrt((d * d).mean({0, 1, 3, 4})).max() / 0.2).clamp(0, 1).item<double>();
}

struct Restyled {
  std::vector<torch::Tensor> frames;  // [1, C, 1, h, w] in output order
  std::vector<int64_t> index;
  std::vector<int64_t> pushes_before;  // per output: how many frames had been pushed when it came
};

// Pushes the case's inputs one latent frame at a time, then finishes.
Restyled restyle(Restyler& r, const std::string& name, bool with_motion) {
  const torch::Tensor in = tensor(name + ".input").to(torch::kFloat);  // [1, T, C, h, w]
  const torch::Tensor pixels = tensor(name + ".pixel_motion");
  Restyled run;
  const auto take = [&](std::vector<RestyledFrame> done, int64_t pushed) {
    for (RestyledFrame& f : done) {
      run.frames.push_back(f.latent.cpu());
      run.index.push_back(f.index);
      run.pushes_before.push_back(pushed);
    }
  };
  for (int64_t t = 0; t < in.size(1); ++t) {
    std::optional<double> m;
    if (with_motion && t >= 2) m = motion(pixels, t - 2);
    take(r.push(in.select(1, t).unsqueeze(2), m), t + 1);
  }
  take(r.finish(), in.size(1));
  return run;
}

// [1, T, C, h, w] as the reference keeps them.
torch::Tensor frames_first(const std::vector<torch::Tensor>& frames) {
  return torch::cat(frames, 2).permute({0, 2, 1, 3, 4});
}

void expect_case(const std::string& name, double strength, bool with_motion) {
  SCOPED_TRACE(name);
  Restyler r(model(), options(strength));
  const Restyled run = restyle(r, name, with_motion);
  const torch::Tensor want = tensor(name + ".output").to(torch::kFloat);
  ASSERT_EQ(int64_t(run.frames.size()), want.size(1));
  for (size_t i = 0; i < run.index.size(); ++i) EXPECT_EQ(run.index[i], int64_t(i));
  const double err = rel_error(frames_first(run.frames), want);
  EXPECT_LE(err, kRelTolerance);
  ::testing::Test::RecordProperty(name + "_rel_error", [&] {
    char b[32];
    std::snprintf(b, sizeof b, "%.2e", err);
    return std::string(b);
  }());
}

}  // namespace

TEST(Restyle, EqualsStreamDiffusionV2AtTheDefaultStrength) { expect_case("s080", 0.8, false); }
TEST(Restyle, EqualsStreamDiffusionV2AtAnotherStrength) { expect_case("s070", 0.7, false); }
TEST(Restyle, EqualsStreamDiffusionV2WithPixelMotion) { expect_case("s080_motion", 0.8, true); }

// The first two frames come out together at the second push, every later frame one push after it came.
TEST(Restyle, EachFrameLeavesOneCallLater) {
  Restyler r(model(), options(0.8));
  const Restyled run = restyle(r, "s080", false);
  ASSERT_EQ(run.pushes_before.size(), 14u);
  EXPECT_EQ(run.pushes_before[0], 2);
  EXPECT_EQ(run.pushes_before[1], 2);
  for (size_t i = 2; i + 1 < run.pushes_before.size(); ++i) EXPECT_EQ(run.pushes_before[i], int64_t(i) + 2);
  EXPECT_EQ(r.latency_frames(), 1);
}

// The adaptive sink's ring is what the reference does from the first eviction on: turned off, the first six
// frames (the cache not yet full) stay the same and every later one differs.
TEST(Restyle, TheAdaptiveSinkActsFromTheFirstEviction) {
  RestyleOptions o = options(0.8);
  o.sink_threshold = -1;
  Restyler r(model(), o);
  const torch::Tensor got = frames_first(restyle(r, "s080", false).frames);
  const torch::Tensor want = tensor("s080.output").to(torch::kFloat);
  EXPECT_LE(rel_error(got.narrow(1, 0, 6), want.narrow(1, 0, 6)), kRelTolerance);
  for (int64_t f = 6; f < want.size(1); ++f)
    EXPECT_GT(rel_error(got.select(1, f), want.select(1, f)), 1e-3) << "frame " << f;
}

// The caches are allocated whole at the first chunk: a long stream holds no more.
TEST(Restyle, MemoryStaysFlatOverALongStream) {
  // Frames of 48x64 latents: each holds ~0.8 MB of keys and values over the two steps' caches, so a cache that
  // kept its frames instead of evicting them (or any per-frame leak of that size) adds 80 MB over the stream,
  // well past the bound. cache_bytes() alone is constant by construction: the process's resident memory says.
  Restyler r(model(), options(0.8));
  torch::manual_seed(3);
  const torch::Tensor frame = torch::randn({1, 16, 1, 48, 64});
  for (int i = 0; i < 30; ++i) r.push(frame);
  const double warm = latent::testing::rss_mib();
  for (int i = 0; i < 100; ++i) r.push(frame);
  const double grown = latent::testing::rss_mib() - warm;
  EXPECT_LT(grown, 48.0) << "the process grew " << grown << " MiB over 100 frames after the window filled";
}

// reset() and finish() start the seed's stream again.
TEST(Restyle, AResetStreamRepeatsTheSeedsFrames) {
  Restyler r(model(), options(0.8));
  const torch::Tensor in = tensor("s080.input").to(torch::kFloat);
  for (int64_t t = 0; t < 5; ++t) r.push(in.select(1, t).unsqueeze(2));
  r.reset();
  const Restyled run = restyle(r, "s080", false);
  EXPECT_LE(rel_error(frames_first(run.frames), tensor("s080.output").to(torch::kFloat)), kRelTolerance);
  const Restyled again = restyle(r, "s080", false);
  EXPECT_TRUE(torch::equal(frames_first(again.frames), frames_first(run.frames)));
}

// Bad frames are refused by name and change nothing: the stream goes on as if they never came.
TEST(Restyle, BadFramesAreRefusedAndLoseNothing) {
  Restyler r(model(), options(0.8));
  const torch::Tensor in = tensor("s080.input").to(torch::kFloat);
  std::vector<torch::Tensor> out;
  const auto expect_refused = [&](const torch::Tensor& bad, const std::string& word) {
    try {
      r.push(bad);
      ADD_FAILURE() << "accepted; expected an error naming " << word;
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(word), std::string::npos) << e.what();
    }
  };
  for (int64_t t = 0; t < in.size(1); ++t) {
    const torch::Tensor f = in.select(1, t).unsqueeze(2);
    if (t == 1 || t == 7) {
      torch::Tensor nan = f.clone();
      nan.view(-1)[5] = NAN;
      expect_refused(nan, "NaN");
      expect_refused(torch::zeros({1, 16, 1, 4, 8}), "4x8");
      expect_refused(torch::zeros({1, 12, 1, 6, 8}), "[1, 16, 1, h, w]");
    }
    for (RestyledFrame& d : r.push(f)) out.push_back(d.latent);
  }
  for (RestyledFrame& d : r.finish()) out.push_back(d.latent);
  EXPECT_LE(rel_error(frames_first(out), tensor("s080.output").to(torch::kFloat)), kRelTolerance);
}

TEST(Restyle, EndsWithWhateverCame) {
  Restyler r(model(), options(0.8));
  EXPECT_TRUE(r.finish().empty());
  const torch::Tensor in = tensor("s080.input").to(torch::kFloat);
  EXPECT_TRUE(r.push(in.select(1, 0).unsqueeze(2)).empty());
  const auto one = r.finish();  // a single frame is a first chunk of one
  ASSERT_EQ(one.size(), 1u);
  EXPECT_EQ(one[0].index, 0);
  EXPECT_TRUE(torch::isfinite(one[0].latent).all().item<bool>());
}

// A low strength gives the model no negative timestep: the first row's step, int(1000 s) - 100 as the reference
// computes it, is held at 1 or more (the reference would pass -50 at a strength of 0.05; a flow model has no
// timestep below 0), and the frames come out finite.
TEST(Restyle, ALowStrengthNeverGivesANegativeTimestep) {
  struct Spy : latent_test::ForwardingCausalModel {
    using ForwardingCausalModel::ForwardingCausalModel;
    mutable double lowest = 1e9;
    void before_call(const torch::Tensor& timesteps) const override {
      lowest = std::min(lowest, timesteps.min().item<double>());
    }
  };
  const auto spy = std::make_shared<Spy>(model());
  Restyler r(spy, options(0.05));
  const Restyled run = restyle(r, "s080", false);
  ASSERT_FALSE(run.frames.empty());
  EXPECT_GE(spy->lowest, 1.0);
  for (const torch::Tensor& f : run.frames) EXPECT_TRUE(torch::isfinite(f).all().item<bool>());
}

TEST(Restyle, OptionsThatCannotWorkAreRefusedByName) {
  const auto refused = [&](RestyleOptions o, const std::string& word) {
    try {
      Restyler r(model(), o);
      ADD_FAILURE() << "accepted; expected an error naming " << word;
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(word), std::string::npos) << e.what();
    }
  };
  RestyleOptions o = options(0.8);
  RestyleOptions bad = o;
  bad.denoising_steps = {};
  refused(bad, "denoising_steps");
  bad = o;
  bad.denoising_steps = {1000, 500};
  refused(bad, "denoising_steps");
  bad = o;
  bad.strength = 0;
  refused(bad, "strength");
  bad = o;
  bad.kv_window = 3;
  refused(bad, "kv_window");
  bad = o;
  bad.text = torch::zeros({1, 512, 7});
  refused(bad, "text");
  bad = o;
  bad.text = torch::full({1, 512, 24}, NAN);
  refused(bad, "text");
}
