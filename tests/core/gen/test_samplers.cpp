// The samplers against diffusers' schedulers (tests/fixtures/gen_sampler_fixtures.py), and their contract without
// fixtures.
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "io/json.h"
#include "latent/gen/sampler.h"
#include "latent/io/weights.h"

namespace latent {
namespace {

std::filesystem::path sampler_fixtures_dir() {
  const char* d = std::getenv("LATENT_GEN_FIXTURES");
  return d ? std::filesystem::path(d) : std::filesystem::path();
}

#define LATENT_REQUIRE_SAMPLER_FIXTURES()                                                                 \
  do {                                                                                                    \
    const auto dir = sampler_fixtures_dir();                                                              \
    if (dir.empty() || !std::filesystem::exists(dir / "stamp"))                                           \
      GTEST_SKIP() << "no sampler fixtures (LATENT_GEN_FIXTURES unset or without a stamp: build without " \
                      "the .venv)";                                                                       \
  } while (0)

const WeightSource& fixtures() {
  static const WeightSource source = read_weights(sampler_fixtures_dir() / "samplers.safetensors");
  return source;
}

const torch::Tensor& fixture(const std::string& name) {
  const auto& t = fixtures().tensors;
  auto it = t.find(name);
  if (it == t.end()) throw std::runtime_error("fixture tensor " + name + " missing");
  return it->second;
}

struct Case {
  std::string name;
  SamplerOptions options;
  Prediction prediction;
  int64_t start;
  int64_t noised_step;
  int64_t noise_seed;  // dpm: the seed of the CPU generator the scheduler drew from; -1 for the others
  int64_t draws;       // how many noise tensors the run drew
};

std::vector<Case> fixture_cases() {
  std::vector<Case> out;
  const json::Value list = json::parse(fixtures().metadata.at("cases"));
  for (const auto& v : list.as_array()) {
    auto field = [&](const char* key) -> const json::Value& {
      const json::Value* f = v.find(key);
      if (!f) throw std::runtime_error(std::string("fixture case without ") + key);
      return *f;
    };
    Case c;
    c.name = field("name").as_string();
    c.options.kind = parse_sampler_kind(field("kind").as_string());
    c.options.steps = field("steps").as_int64();
    c.options.shift = field("shift").as_double();
    c.options.snr_shift_scale = field("snr_shift_scale").as_double();
    c.prediction = parse_prediction(field("prediction").as_string());
    c.start = field("start").as_int64();
    c.noised_step = field("noised_step").as_int64();
    c.noise_seed = field("noise_seed").as_int64();
    c.draws = field("draws").as_int64();
    out.push_back(c);
  }
  return out;
}

double max_abs_diff(const torch::Tensor& a, const torch::Tensor& b) {
  EXPECT_EQ(a.sizes(), b.sizes());
  if (a.sizes() != b.sizes()) return 1e9;
  return (a.to(torch::kDouble) - b.to(torch::kDouble)).abs().max().item<double>();
}

// The made-up denoiser of the fixtures.
torch::Tensor model(const torch::Tensor& x, double t) { return torch::sin(1.3 * x) + 0.001 * t; }

torch::Tensor latents(int64_t seed) {
  torch::manual_seed(static_cast<uint64_t>(seed));
  return torch::randn({1, 4, 3, 6, 8});
}

Sampler make(SamplerKind kind, int64_t steps, Prediction prediction = Prediction::flow) {
  SamplerOptions o;
  o.kind = kind;
  o.steps = steps;
  return Sampler(o, prediction);
}

// The port repeats diffusers' roundings, so schedules come out identical; 1e-6 admits at most a last-bit
// difference of an fp32 sigma near 1 (an ulp there is 6e-8) and none in the timesteps, whose fp32 ulp is up to
// 6e-5.
TEST(SamplerFixtures, SchedulesMatchDiffusers) {
  LATENT_REQUIRE_SAMPLER_FIXTURES();
  for (const Case& c : fixture_cases()) {
    SCOPED_TRACE(c.name);
    const Sampler s(c.options, c.prediction);
    const torch::Tensor sigmas = torch::tensor(s.sigmas(), torch::kDouble);
    const torch::Tensor timesteps = torch::tensor(s.timesteps(), torch::kDouble);
    const double ds = max_abs_diff(sigmas, fixture(c.name + ".sigmas"));
    const double dt = max_abs_diff(timesteps, fixture(c.name + ".timesteps"));
    EXPECT_LE(ds, 1e-6);
    EXPECT_LE(dt, 1e-6);
    std::cout << "[ schedule ] " << c.name << ": sigmas " << ds << ", timesteps " << dt << "\n";
  }
}

// Every step runs the same fp32 kernels as diffusers on the same values: the trajectories agree to rounding, and
// 1e-6 on samples of magnitude ~4 leaves room for only a few ulps. dpm draws its step noise from a CPU generator
// seeded as the fixture's, so the same draws in the same order give the same noise.
TEST(SamplerFixtures, TrajectoriesMatchDiffusers) {
  LATENT_REQUIRE_SAMPLER_FIXTURES();
  for (const Case& c : fixture_cases()) {
    SCOPED_TRACE(c.name);
    const Sampler s(c.options, c.prediction);
    EXPECT_EQ(s.needs_noise(), c.noise_seed >= 0);
    const torch::Tensor& expected = fixture(c.name + ".trajectory");
    ASSERT_EQ(expected.size(0), c.options.steps + 1 - c.start);
    torch::Tensor x = expected[0].clone();
    at::Generator gen =
        at::make_generator<at::CPUGeneratorImpl>(static_cast<uint64_t>(std::max<int64_t>(c.noise_seed, 0)));
    int64_t draws = 0;
    const StepNoise noise = [&] {
      ++draws;
      return torch::randn(x.sizes(), gen, torch::kFloat);
    };
    SamplerHistory history;
    double worst = 0;
    for (int64_t i = c.start; i < c.options.steps; ++i) {
      x = s.step(x, model(x, s.timestep(i)), i, history, noise);
      const double d = max_abs_diff(x, expected[i + 1 - c.start]);
      EXPECT_LE(d, 1e-6) << "after step " << i;
      worst = std::max(worst, d);
    }
    EXPECT_EQ(draws, c.draws);
    std::cout << "[ trajectory ] " << c.name << ": max |diff| " << worst << "\n";
  }
}

TEST(SamplerFixtures, NoiseToMatchesDiffusers) {
  LATENT_REQUIRE_SAMPLER_FIXTURES();
  for (const Case& c : fixture_cases()) {
    SCOPED_TRACE(c.name);
    const Sampler s(c.options, c.prediction);
    const torch::Tensor noised = s.noise_to(fixture("clean"), fixture("noise"), c.noised_step);
    const double d = max_abs_diff(noised, fixture(c.name + ".noised"));
    EXPECT_LE(d, 1e-6);
    std::cout << "[ noised ] " << c.name << ": max |diff| " << d << "\n";
  }
}

// generation.md's reference values for shift 3, 10 steps, to the digits given there.
TEST(SamplerSchedule, EulerGoldenSigmas) {
  SamplerOptions o;
  o.kind = SamplerKind::euler;
  o.steps = 10;
  o.shift = 3.0;
  const Sampler s(o, Prediction::flow);
  const std::vector<double> golden = {1.0,     0.96013, 0.91335, 0.85769,   0.79037, 0.70728,
                                      0.60215, 0.46488, 0.27805, 0.0089286, 0.0};
  ASSERT_EQ(s.sigmas().size(), golden.size());
  for (size_t i = 0; i < golden.size(); ++i) {
    const double tol = golden[i] == 0.0089286 ? 5e-8 : 5e-6;
    EXPECT_NEAR(s.sigmas()[i], golden[i], tol) << "sigma " << i;
  }
  for (int64_t i = 0; i < o.steps; ++i) EXPECT_FLOAT_EQ(s.timestep(i), 1000 * s.sigma(i));
}

TEST(SamplerSchedule, DdimTrailingZeroTerminalSnr) {
  const Sampler s = make(SamplerKind::ddim, 50, Prediction::v);
  for (int64_t i = 0; i < 50; ++i) EXPECT_EQ(s.timestep(i), 999 - 20 * i);
  EXPECT_EQ(s.sigma(0), 1.0);  // alpha_bar(999) = 0 after the rescale
  EXPECT_EQ(s.sigma(50), 0.0);
  for (int64_t i = 0; i < 50; ++i) EXPECT_GT(s.sigma(i), s.sigma(i + 1));
  // numpy's arange yields 62 entries for 61 steps (the last -1); the sampler keeps 61 valid ones.
  const Sampler odd = make(SamplerKind::ddim, 61, Prediction::v);
  EXPECT_EQ(odd.timesteps().size(), 61u);
  EXPECT_GE(odd.timestep(60), 0);
}

TEST(SamplerSchedule, UnipcFlowSigmas) {
  const Sampler s = make(SamplerKind::unipc, 50);
  EXPECT_NEAR(s.sigma(0), 1 - 1e-6, 1e-7);
  EXPECT_EQ(s.timestep(0), 999);
  EXPECT_EQ(s.sigma(50), 0.0);
  for (int64_t i = 0; i < 50; ++i) EXPECT_EQ(s.timestep(i), std::trunc(s.timestep(i)));
}

TEST(SamplerNames, RoundTripAndReject) {
  for (auto k : {SamplerKind::euler, SamplerKind::unipc, SamplerKind::ddim, SamplerKind::dpm})
    EXPECT_EQ(parse_sampler_kind(sampler_kind_name(k)), k);
  for (auto p : {Prediction::flow, Prediction::v, Prediction::epsilon})
    EXPECT_EQ(parse_prediction(prediction_name(p)), p);
  EXPECT_THROW(parse_sampler_kind("dpm++"), SamplerError);
  EXPECT_THROW(parse_sampler_kind(""), SamplerError);
  EXPECT_THROW(parse_prediction("sample"), SamplerError);
  try {
    parse_sampler_kind("heun");
  } catch (const SamplerError& e) {
    EXPECT_NE(std::string(e.what()).find("euler, unipc, ddim, dpm"), std::string::npos) << e.what();
  }
}

TEST(SamplerErrors, BadOptions) {
  auto build = [](auto change, Prediction p = Prediction::flow) {
    SamplerOptions o;
    change(o);
    return Sampler(o, p);
  };
  EXPECT_THROW(build([](SamplerOptions& o) { o.steps = 0; }), SamplerError);
  EXPECT_THROW(build([](SamplerOptions& o) { o.steps = 1001; }), SamplerError);
  EXPECT_NO_THROW(build([](SamplerOptions& o) { o.steps = 1000; }));
  EXPECT_THROW(build([](SamplerOptions& o) { o.shift = 0; }), SamplerError);
  EXPECT_THROW(build([](SamplerOptions& o) { o.shift = -2; }), SamplerError);
  EXPECT_THROW(build([](SamplerOptions& o) { o.shift = std::nan(""); }), SamplerError);
  EXPECT_THROW(build([](SamplerOptions& o) { o.snr_shift_scale = 0; }), SamplerError);
  EXPECT_THROW(build([](SamplerOptions& o) { o.train_timesteps = 0; }), SamplerError);
}

TEST(SamplerErrors, PredictionMustFitKind) {
  EXPECT_THROW(make(SamplerKind::euler, 10, Prediction::v), SamplerError);
  EXPECT_THROW(make(SamplerKind::unipc, 10, Prediction::epsilon), SamplerError);
  EXPECT_THROW(make(SamplerKind::ddim, 10, Prediction::flow), SamplerError);
  EXPECT_NO_THROW(make(SamplerKind::ddim, 10, Prediction::v));
  EXPECT_NO_THROW(make(SamplerKind::ddim, 10, Prediction::epsilon));
  EXPECT_THROW(make(SamplerKind::dpm, 10, Prediction::flow), SamplerError);
  EXPECT_NO_THROW(make(SamplerKind::dpm, 10, Prediction::v));
  EXPECT_NO_THROW(make(SamplerKind::dpm, 10, Prediction::epsilon));
}

// A seeded stream of unit Gaussian noise shaped like `like`, counting its draws.
struct CountedNoise {
  at::Generator gen;
  int64_t draws = 0;
  explicit CountedNoise(uint64_t seed) : gen(at::make_generator<at::CPUGeneratorImpl>(seed)) {}
  StepNoise of(const torch::Tensor& like) {
    return [this, sizes = like.sizes().vec()] {
      ++draws;
      return torch::randn(sizes, gen, torch::kFloat);
    };
  }
};

TEST(SamplerDpm, SharesDdimSchedule) {
  for (double snr : {1.0, 3.0}) {
    SamplerOptions o;
    o.kind = SamplerKind::ddim;
    o.steps = 50;
    o.snr_shift_scale = snr;
    const Sampler ddim(o, Prediction::v);
    o.kind = SamplerKind::dpm;
    const Sampler dpm(o, Prediction::v);
    EXPECT_EQ(ddim.timesteps(), dpm.timesteps());
    EXPECT_EQ(ddim.sigmas(), dpm.sigmas());
    EXPECT_FALSE(ddim.needs_noise());
    EXPECT_TRUE(dpm.needs_noise());
  }
}

TEST(SamplerDpm, NeedsNoiseOfTheLatentsShape) {
  const Sampler s = make(SamplerKind::dpm, 10, Prediction::v);
  const torch::Tensor x = latents(11);
  SamplerHistory h;
  EXPECT_THROW(s.step(x, model(x, s.timestep(0)), 0, h), SamplerError);
  EXPECT_THROW(s.step(x, model(x, s.timestep(0)), 0, h, [] { return torch::zeros({1, 4, 3, 6}); }), SamplerError);
  EXPECT_THROW(s.step(x, model(x, s.timestep(0)), 0, h, [] { return torch::Tensor(); }), SamplerError);
  EXPECT_EQ(h.next_step, -1);  // a refused step leaves the history alone
}

// One draw at the first step and at the step to the clean end, two at each second-order step between.
TEST(SamplerDpm, DrawsAsDiffusers) {
  for (int64_t steps : {1, 2, 6, 10}) {
    SCOPED_TRACE(steps);
    const Sampler s = make(SamplerKind::dpm, steps, Prediction::v);
    CountedNoise noise(5);
    torch::Tensor x = latents(12);
    SamplerHistory h;
    for (int64_t i = 0; i < steps; ++i) x = s.step(x, model(x, s.timestep(i)), i, h, noise.of(x));
    // 6 steps (stride 166) end on alpha_bar[0], not the clean end: that last step is second order too.
    const int64_t expected = steps == 1 ? 1 : steps == 6 ? 2 * steps - 1 : 2 * steps - 2;
    EXPECT_EQ(noise.draws, expected);
    EXPECT_TRUE(x.isfinite().all().item<bool>());
  }
}

// The same seed gives the same trajectory; another gives another.
TEST(SamplerDpm, SeedDecides) {
  const Sampler s = make(SamplerKind::dpm, 8, Prediction::v);
  auto run = [&](uint64_t seed) {
    CountedNoise noise(seed);
    torch::Tensor x = latents(13);
    SamplerHistory h;
    for (int64_t i = 0; i < 8; ++i) x = s.step(x, model(x, s.timestep(i)), i, h, noise.of(x));
    return x;
  };
  EXPECT_TRUE(torch::equal(run(1), run(1)));
  EXPECT_FALSE(torch::equal(run(1), run(2)));
}

TEST(SamplerDpm, StepsMustBeConsecutive) {
  const Sampler s = make(SamplerKind::dpm, 10, Prediction::v);
  torch::Tensor x = latents(14);
  CountedNoise noise(3);
  SamplerHistory h;
  x = s.step(x, model(x, s.timestep(0)), 0, h, noise.of(x));
  EXPECT_EQ(h.next_step, 1);
  EXPECT_EQ(h.output_steps, (std::vector<int64_t>{0}));
  EXPECT_THROW(s.step(x, model(x, s.timestep(2)), 2, h, noise.of(x)), SamplerError);
  EXPECT_NO_THROW(s.step(x, model(x, s.timestep(1)), 1, h, noise.of(x)));
  h.clear();
  EXPECT_NO_THROW(s.step(x, model(x, s.timestep(5)), 5, h, noise.of(x)));  // cleared: fresh again
}

// The deterministic samplers never ask for noise, whatever is passed.
TEST(SamplerStep, DeterministicSamplersDrawNothing) {
  for (auto [kind, p] :
       {std::pair{SamplerKind::euler, Prediction::flow}, std::pair{SamplerKind::unipc, Prediction::flow},
        std::pair{SamplerKind::ddim, Prediction::v}}) {
    SCOPED_TRACE(sampler_kind_name(kind));
    const Sampler s = make(kind, 5, p);
    torch::Tensor with = latents(15), without = with.clone();
    SamplerHistory h1, h2;
    CountedNoise noise(1);
    for (int64_t i = 0; i < 5; ++i) {
      with = s.step(with, model(with, s.timestep(i)), i, h1, noise.of(with));
      without = s.step(without, model(without, s.timestep(i)), i, h2);
    }
    EXPECT_EQ(noise.draws, 0);
    EXPECT_TRUE(torch::equal(with, without));
  }
}

TEST(SamplerErrors, StepOutOfRangeAndShapes) {
  for (auto [kind, p] :
       {std::pair{SamplerKind::euler, Prediction::flow}, std::pair{SamplerKind::unipc, Prediction::flow},
        std::pair{SamplerKind::ddim, Prediction::v}, std::pair{SamplerKind::dpm, Prediction::v}}) {
    SCOPED_TRACE(sampler_kind_name(kind));
    const Sampler s = make(kind, 8, p);
    const torch::Tensor x = latents(1);
    SamplerHistory h;
    EXPECT_THROW(s.step(x, x, -1, h), SamplerError);
    EXPECT_THROW(s.step(x, x, 8, h), SamplerError);
    EXPECT_THROW(s.step(x, x.narrow(2, 0, 2), 0, h), SamplerError);
    EXPECT_THROW(s.predict_x0(x, x.narrow(2, 0, 2), 0), SamplerError);
    EXPECT_THROW(s.noise_to(x, x.narrow(2, 0, 2), 0), SamplerError);
    EXPECT_THROW(s.timestep(8), SamplerError);
    EXPECT_THROW(s.sigma(9), SamplerError);
    EXPECT_THROW(s.noise_to(x, x, 9), SamplerError);
    EXPECT_NO_THROW(s.sigma(8));
    EXPECT_TRUE(torch::allclose(s.noise_to(x, latents(2), 8), x));  // step `steps` is clean
  }
}

TEST(SamplerErrors, UnipcStepsMustBeConsecutive) {
  const Sampler s = make(SamplerKind::unipc, 10);
  torch::Tensor x = latents(3);
  SamplerHistory h;
  x = s.step(x, model(x, s.timestep(0)), 0, h);
  EXPECT_THROW(s.step(x, model(x, s.timestep(2)), 2, h), SamplerError);
  EXPECT_THROW(s.step(x, model(x, s.timestep(0)), 0, h), SamplerError);
  EXPECT_NO_THROW(s.step(x, model(x, s.timestep(1)), 1, h));
  h.clear();
  EXPECT_EQ(h.next_step, -1);
  EXPECT_EQ(h.bytes(), 0u);
  EXPECT_NO_THROW(s.step(x, model(x, s.timestep(5)), 5, h));  // cleared: fresh again
}

TEST(SamplerErrors, EpsilonAtZeroSnr) {
  const Sampler s = make(SamplerKind::ddim, 20, Prediction::epsilon);
  const torch::Tensor x = latents(4);
  SamplerHistory h;
  EXPECT_THROW(s.step(x, model(x, s.timestep(0)), 0, h), SamplerError);
  const torch::Tensor y = s.step(x, model(x, s.timestep(1)), 1, h);
  EXPECT_TRUE(y.isfinite().all().item<bool>());
}

// A fresh history at step i takes a first-order step, which for flow is exactly Euler's x + (sigma' - sigma) v;
// the fp32 log/expm1 coefficients leave a few ulps.
TEST(SamplerUnipc, FreshHistoryAtMiddleStep) {
  const Sampler unipc = make(SamplerKind::unipc, 50);
  torch::Tensor x = latents(5);
  SamplerHistory h;
  const torch::Tensor v = model(x, unipc.timestep(20));
  const torch::Tensor y = unipc.step(x, v, 20, h);
  const torch::Tensor euler = x + (unipc.sigma(21) - unipc.sigma(20)) * v;
  EXPECT_LE(max_abs_diff(y, euler), 1e-5);
  EXPECT_EQ(h.next_step, 21);
  EXPECT_EQ(h.lower_order_count, 1);
  x = y;
  for (int64_t i = 21; i < 50; ++i) x = unipc.step(x, model(x, unipc.timestep(i)), i, h);
  EXPECT_TRUE(x.isfinite().all().item<bool>());
  EXPECT_EQ(h.next_step, 50);
  EXPECT_EQ(h.lower_order_count, 2);
}

TEST(SamplerHistoryBytes, OnlyMultistepSamplersRemember) {
  const torch::Tensor x = latents(6);
  const size_t one = static_cast<size_t>(x.nbytes());
  {
    const Sampler s = make(SamplerKind::unipc, 4);
    SamplerHistory h;
    torch::Tensor y = s.step(x, model(x, s.timestep(0)), 0, h);
    EXPECT_EQ(h.bytes(), 2 * one);  // one x0 prediction and the sample
    y = s.step(y, model(y, s.timestep(1)), 1, h);
    EXPECT_EQ(h.bytes(), 3 * one);  // two x0 predictions: no more are ever kept
    y = s.step(y, model(y, s.timestep(2)), 2, h);
    EXPECT_EQ(h.bytes(), 3 * one);
    EXPECT_EQ(h.output_steps, (std::vector<int64_t>{1, 2}));
    y = s.step(y, model(y, s.timestep(3)), 3, h);
    EXPECT_EQ(h.bytes(), 0u);  // nothing can follow the last step
  }
  {
    const Sampler s = make(SamplerKind::dpm, 4, Prediction::v);
    CountedNoise noise(2);
    SamplerHistory h;
    torch::Tensor y = x;
    for (int64_t i = 0; i < 3; ++i) {
      y = s.step(y, model(y, s.timestep(i)), i, h, noise.of(y));
      EXPECT_EQ(h.bytes(), one);  // the one x0 prediction
    }
    y = s.step(y, model(y, s.timestep(3)), 3, h, noise.of(y));
    EXPECT_EQ(h.bytes(), 0u);
  }
  for (auto [kind, p] :
       {std::pair{SamplerKind::euler, Prediction::flow}, std::pair{SamplerKind::ddim, Prediction::v}}) {
    const Sampler s = make(kind, 4, p);
    SamplerHistory h;
    torch::Tensor y = x;
    for (int64_t i = 0; i < 3; ++i) y = s.step(y, model(y, s.timestep(i)), i, h);
    EXPECT_EQ(h.bytes(), 0u) << sampler_kind_name(kind);
  }
}

TEST(SamplerStep, LeavesInputsAlone) {
  for (auto [kind, p] :
       {std::pair{SamplerKind::euler, Prediction::flow}, std::pair{SamplerKind::unipc, Prediction::flow},
        std::pair{SamplerKind::ddim, Prediction::v}, std::pair{SamplerKind::ddim, Prediction::epsilon},
        std::pair{SamplerKind::dpm, Prediction::v}, std::pair{SamplerKind::dpm, Prediction::epsilon}}) {
    SCOPED_TRACE(std::string(sampler_kind_name(kind)) + " " + prediction_name(p));
    const Sampler s = make(kind, 6, p);
    SamplerHistory h;
    CountedNoise noise(7);
    torch::Tensor x = latents(7);
    for (int64_t i = 1; i < 6; ++i) {  // from step 1: epsilon has no x0 at step 0
      const torch::Tensor out = model(x, s.timestep(i));
      const torch::Tensor x_before = x.clone(), out_before = out.clone();
      torch::Tensor y = s.step(x, out, i, h, noise.of(x));
      EXPECT_TRUE(torch::equal(x, x_before)) << "step " << i;
      EXPECT_TRUE(torch::equal(out, out_before)) << "step " << i;
      const torch::Tensor x0 = s.predict_x0(x, out, i);
      const torch::Tensor noised = s.noise_to(x0, out, i);
      EXPECT_TRUE(torch::equal(x, x_before));
      EXPECT_TRUE(torch::equal(out, out_before));
      EXPECT_FALSE(y.is_same(x));
      (void)noised;
      x = y;
    }
  }
}

// The caller may overwrite its latents after a step: the history keeps its own copy.
TEST(SamplerUnipc, HistoryDoesNotAliasLatents) {
  const Sampler s = make(SamplerKind::unipc, 6);
  auto two_steps = [&](bool overwrite) {
    SamplerHistory h;
    torch::Tensor x = latents(10);
    torch::Tensor y = s.step(x, model(x, s.timestep(0)), 0, h);
    if (overwrite) x.fill_(123.0);
    return s.step(y, model(y, s.timestep(1)), 1, h);
  };
  EXPECT_TRUE(torch::equal(two_steps(false), two_steps(true)));
}

// The noise level sigma(i) is what noise_to applies: a flow sample at step i is (1 - sigma) x0 + sigma n; a DDIM one
// sqrt(1 - sigma^2) x0 + sigma n.
TEST(SamplerStep, NoiseToFollowsSigma) {
  const torch::Tensor x0 = latents(8), n = latents(9);
  for (auto [kind, p] :
       {std::pair{SamplerKind::euler, Prediction::flow}, std::pair{SamplerKind::unipc, Prediction::flow},
        std::pair{SamplerKind::ddim, Prediction::v}, std::pair{SamplerKind::dpm, Prediction::v}}) {
    SCOPED_TRACE(sampler_kind_name(kind));
    const Sampler s = make(kind, 10, p);
    for (int64_t i = 0; i <= 10; ++i) {
      const double sg = s.sigma(i);
      const double a = kind == SamplerKind::ddim || kind == SamplerKind::dpm ? std::sqrt(1 - sg * sg) : 1 - sg;
      EXPECT_LE(max_abs_diff(s.noise_to(x0, n, i), a * x0 + sg * n), 1e-5) << "step " << i;
    }
  }
}

}  // namespace
}  // namespace latent
