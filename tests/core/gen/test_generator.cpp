// The schedules: clip equals diffusers' Wan pipeline loop; fifo and rolling give every frame its whole trajectory,
// call the model within its window, carry clean context, repeat themselves for a seed, and keep constant memory.
#include <gtest/gtest.h>
#include <torch/types.h>

#include <malloc.h>

#include <algorithm>
#include <cmath>

#include "gen_fixtures.h"
#include "latent/gen/generator.h"
#include "vae_fixtures.h"

using namespace latent;
using namespace latent::testing;

namespace {

// A denoiser whose prediction for each frame depends on that frame alone: sin(1.3 x) + 0.001 t. Each frame's
// latents then follow the sampler's trajectory for that frame's noise whatever the schedule, which the tests
// recompute frame by frame. It records every call's timesteps.
class PerFrameDenoiser : public Denoiser {
 public:
  // expert_boundary > 0: two experts (one network here) whose guidance the generator picks by timestep.
  PerFrameDenoiser(Prediction prediction, int64_t window, int64_t text_tokens = 0, double expert_boundary = 0.0)
      : Denoiser(spec_for(prediction, window, text_tokens, expert_boundary), LoadOptions{}) {}
  mutable std::vector<std::vector<float>> calls;
  // Throws (as a GPU out of memory would) on this call, once.
  mutable int64_t fail_at = -1;
  // A parameter that tracks gradients, as a model built from torch::nn modules has; 1 by value.
  torch::Tensor weight = torch::ones({1}, torch::requires_grad());

 protected:
  torch::Tensor run(const torch::Tensor& x, const torch::Tensor& timesteps, const torch::Tensor& text) const override {
    if (static_cast<int64_t>(calls.size()) == fail_at) {
      fail_at = -1;
      throw std::runtime_error("out of memory (injected)");
    }
    const torch::Tensor t = timesteps[0];
    calls.emplace_back(t.data_ptr<float>(), t.data_ptr<float>() + t.numel());
    torch::Tensor out = torch::sin(1.3 * x) * weight + 0.001 * t.view({1, 1, -1, 1, 1});
    if (text.defined()) out = out + text.mean();
    return out;
  }

 private:
  static DenoiserSpec spec_for(Prediction prediction, int64_t window, int64_t text_tokens, double expert_boundary) {
    DenoiserSpec s;
    s.expert_boundary = expert_boundary;
    s.per_frame_timesteps = expert_boundary <= 0.0;
    s.backend = "test";
    s.prediction = prediction;
    s.channels = 2;
    s.window = window;
    s.height = 3;
    s.width = 5;
    s.text_tokens = text_tokens;
    s.text_dim = text_tokens > 0 ? 4 : 0;
    return s;
  }
};

// Frame k of a fifo or rolling run: the k-th noise frame of the seeded stream taken down every step alone.
torch::Tensor alone(const Sampler& sampler, const torch::Tensor& noise) {
  SamplerHistory history;
  torch::Tensor x = noise;
  for (int64_t i = 0; i < sampler.steps(); ++i) {
    torch::Tensor t = torch::full({1, 1, 1, 1, 1}, static_cast<float>(sampler.timestep(i)));
    x = sampler.step(x, torch::sin(1.3 * x) + 0.001 * t, i, history);
  }
  return x;
}

std::vector<GeneratedFrame> run_all(Generator& g) {
  std::vector<GeneratedFrame> all;
  while (!g.finished())
    for (auto& f : g.next()) all.push_back(std::move(f));
  return all;
}

GeneratorOptions options(ScheduleKind kind, SamplerKind sampler, int64_t steps, int64_t frames) {
  GeneratorOptions o;
  o.schedule = kind;
  o.sampler.kind = sampler;
  o.sampler.steps = steps;
  o.sampler.shift = 3.0;
  o.frames = frames;
  o.seed = 42;
  return o;
}

std::string option_error(std::shared_ptr<const Denoiser> d, const GeneratorOptions& o) {
  try {
    Generator g(std::move(d), o);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "(accepted)";
}

}  // namespace

// The classic pipeline: the same noise (the fixture drew it with torch.randn from a CPU generator of the same
// seed, so a different noise path would miss by O(1)), the same model and
// sampler, classifier-free guidance 2.5. Tolerance 1e-5 (measured 9.5e-7 euler, 8.1e-7 unipc): the package
// differs from eager PyTorch by ~5e-7 per call (fusion; see AotiDenoiser), and guidance scales that difference
// by 2.5 at each of the 6 steps before the sampler damps it.
TEST(GeneratorClip, EqualsDiffusersWanPipelineLoop) {
  LATENT_REQUIRE_DENOISER_FIXTURES();
  auto model = load_denoiser(denoiser_fixtures_dir() / "wan-tiny.pt2");
  for (auto [name, kind] : {std::pair{"euler", SamplerKind::euler}, std::pair{"unipc", SamplerKind::unipc}}) {
    GeneratorOptions o = options(ScheduleKind::clip, kind, 6, 5);
    o.seed = 7;
    o.guidance = 2.5;
    o.text = denoiser_case("text");
    o.negative_text = denoiser_case("negative_text");
    Generator g(model, o);
    std::vector<GeneratedFrame> frames = g.next();
    ASSERT_EQ(frames.size(), 5u);
    EXPECT_TRUE(g.finished());
    EXPECT_TRUE(g.next().empty());
    std::vector<torch::Tensor> latents;
    for (size_t k = 0; k < frames.size(); ++k) {
      EXPECT_EQ(frames[k].index, static_cast<int64_t>(k));
      latents.push_back(frames[k].latent);
    }
    const double diff = max_abs_diff(torch::cat(latents, 2), denoiser_case(std::string("clip.") + name + ".latents"));
    EXPECT_LE(diff, 1e-5) << name;
    EXPECT_EQ(g.model_calls(), 12);
    std::printf("clip (%s, 6 steps, guidance 2.5): max |C++ - diffusers| = %.3g\n", name, diff);
  }
}

TEST(GeneratorFifo, EveryFrameTakesEveryStepInOrder) {
  for (SamplerKind kind : {SamplerKind::euler, SamplerKind::unipc, SamplerKind::ddim}) {
    const Prediction p = kind == SamplerKind::ddim ? Prediction::v : Prediction::flow;
    auto model = std::make_shared<PerFrameDenoiser>(p, 4);
    Generator g(model, options(ScheduleKind::fifo, kind, 10, 23));
    std::vector<GeneratedFrame> frames = run_all(g);
    ASSERT_EQ(frames.size(), 23u);
    auto noise = at::make_generator<at::CPUGeneratorImpl>(42);
    for (size_t k = 0; k < frames.size(); ++k) {
      ASSERT_EQ(frames[k].index, static_cast<int64_t>(k));
      torch::Tensor expected = alone(g.sampler(), torch::randn({1, 2, 1, 3, 5}, noise, torch::kFloat));
      EXPECT_LE(max_abs_diff(frames[k].latent, expected), 1e-6) << sampler_kind_name(kind) << " frame " << k;
    }
    // Each call spans at most `window` adjacent steps, oldest (cleanest) frame first.
    for (const auto& ts : model->calls) {
      ASSERT_LE(ts.size(), 4u);
      for (size_t j = 1; j < ts.size(); ++j) EXPECT_LT(ts[j - 1], ts[j]);
    }
  }
}

// dpm's clip: the start noise, then the step noise as the sampler asks for it, all from the one seeded CPU stream.
TEST(GeneratorClip, DpmDrawsItsStepNoiseFromTheSeed) {
  auto model = std::make_shared<PerFrameDenoiser>(Prediction::v, 4);
  Generator g(model, options(ScheduleKind::clip, SamplerKind::dpm, 6, 3));
  const torch::Tensor got = g.next().at(0).latent;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(42);
  torch::Tensor x = torch::randn({1, 2, 3, 3, 5}, gen, torch::kFloat);
  const Sampler& s = g.sampler();
  SamplerHistory history;
  for (int64_t i = 0; i < s.steps(); ++i) {
    const torch::Tensor t = torch::full({1, 1, 1, 1, 1}, static_cast<float>(s.timestep(i)));
    x = s.step(x, torch::sin(1.3 * x) + 0.001 * t, i, history, [&] {
      return torch::randn({1, 2, 3, 3, 5}, gen, torch::kFloat);
    });
  }
  EXPECT_TRUE(torch::equal(got, x.narrow(2, 0, 1)));
}

TEST(GeneratorFifo, OneFrameOutPerIterationOnceFull) {
  auto model = std::make_shared<PerFrameDenoiser>(Prediction::flow, 4);
  Generator g(model, options(ScheduleKind::fifo, SamplerKind::euler, 8, 0));
  auto first = g.next();
  ASSERT_EQ(first.size(), 1u);
  // The first frame is clean after 8 iterations: 4 with the frames in one partition, then 4 with two.
  EXPECT_EQ(model->calls.size(), 4u * 1 + 4u * 2);
  for (int i = 0; i < 5; ++i) {
    const size_t before = model->calls.size();
    auto out = g.next();
    ASSERT_EQ(out.size(), 1u);
    EXPECT_EQ(out[0].index, i + 1);
    EXPECT_EQ(model->calls.size() - before, 2u);
  }
  EXPECT_FALSE(g.finished());
}

TEST(GeneratorRolling, CarriesCleanContextAndEveryFrameTakesEveryStep) {
  auto model = std::make_shared<PerFrameDenoiser>(Prediction::flow, 5);
  GeneratorOptions o = options(ScheduleKind::rolling, SamplerKind::unipc, 6, 11);
  o.context = 2;
  Generator g(model, o);
  std::vector<GeneratedFrame> frames;
  std::vector<size_t> per_call;
  while (!g.finished()) {
    auto out = g.next();
    per_call.push_back(out.size());
    for (auto& f : out) frames.push_back(std::move(f));
  }
  // Windows of 5: 5 new, then 3 new after 2 context frames, then 3 (the last 3 of 11).
  EXPECT_EQ(per_call, (std::vector<size_t>{5, 3, 3}));
  ASSERT_EQ(frames.size(), 11u);
  auto noise = at::make_generator<at::CPUGeneratorImpl>(42);
  std::vector<torch::Tensor> expected;
  for (int64_t n : {5, 3, 3}) {
    torch::Tensor block = torch::randn({1, 2, n, 3, 5}, noise, torch::kFloat);
    for (int64_t j = 0; j < n; ++j) expected.push_back(alone(g.sampler(), block.narrow(2, j, 1)));
  }
  for (size_t k = 0; k < frames.size(); ++k) {
    EXPECT_EQ(frames[k].index, static_cast<int64_t>(k));
    EXPECT_LE(max_abs_diff(frames[k].latent, expected[k]), 1e-6) << "frame " << k;
  }
  // Later windows: two context frames at timestep 0, then the fresh frames at the step's timestep.
  ASSERT_EQ(model->calls.size(), 18u);
  for (size_t c = 6; c < model->calls.size(); ++c) {
    const auto& ts = model->calls[c];
    ASSERT_EQ(ts.size(), 5u);
    EXPECT_EQ(ts[0], 0.0f);
    EXPECT_EQ(ts[1], 0.0f);
    EXPECT_GT(ts[2], 0.0f);
  }
}

TEST(Generator, TheSameSeedGivesTheSameFramesAndResetRepeats) {
  auto model = std::make_shared<PerFrameDenoiser>(Prediction::flow, 4);
  Generator a(model, options(ScheduleKind::fifo, SamplerKind::unipc, 8, 12));
  Generator b(model, options(ScheduleKind::fifo, SamplerKind::unipc, 8, 12));
  auto fa = run_all(a), fb = run_all(b);
  a.reset();
  auto fc = run_all(a);
  a.reset(43);
  auto fd = run_all(a);
  ASSERT_EQ(fa.size(), 12u);
  ASSERT_EQ(fc.size(), 12u);
  for (size_t k = 0; k < fa.size(); ++k) {
    EXPECT_TRUE(torch::equal(fa[k].latent, fb[k].latent));
    EXPECT_TRUE(torch::equal(fa[k].latent, fc[k].latent));
    EXPECT_FALSE(torch::equal(fa[k].latent, fd[k].latent));
  }
}

// A model call that throws mid-iteration (the second partition of a full FIFO queue, a window's third step)
// changes nothing: calling again gives the frames of an uninterrupted run. dpm's step noise comes from the
// seeded stream too, which the failed iteration rewinds.
TEST(Generator, AFailedCallCanBeRetried) {
  for (auto [kind, sampler] :
       {std::pair{ScheduleKind::clip, SamplerKind::unipc}, std::pair{ScheduleKind::fifo, SamplerKind::unipc},
        std::pair{ScheduleKind::rolling, SamplerKind::unipc}, std::pair{ScheduleKind::clip, SamplerKind::dpm},
        std::pair{ScheduleKind::fifo, SamplerKind::dpm}}) {
    SCOPED_TRACE(sampler_kind_name(sampler));
    const Prediction p = sampler == SamplerKind::dpm ? Prediction::v : Prediction::flow;
    GeneratorOptions o = options(kind, sampler, 8, kind == ScheduleKind::clip ? 4 : 12);
    o.context = 1;
    auto steady = std::make_shared<PerFrameDenoiser>(p, 4);
    Generator reference(steady, o);
    auto expected = run_all(reference);
    auto flaky = std::make_shared<PerFrameDenoiser>(p, 4);
    flaky->fail_at = kind == ScheduleKind::clip ? 3 : 13;
    Generator g(flaky, o);
    std::vector<GeneratedFrame> got;
    int failures = 0;
    while (!g.finished()) {
      try {
        for (auto& f : g.next()) got.push_back(std::move(f));
      } catch (const std::runtime_error&) {
        ++failures;
      }
    }
    EXPECT_EQ(failures, 1) << schedule_kind_name(kind);
    ASSERT_EQ(got.size(), expected.size()) << schedule_kind_name(kind);
    for (size_t k = 0; k < got.size(); ++k) {
      EXPECT_EQ(got[k].index, expected[k].index);
      EXPECT_TRUE(torch::equal(got[k].latent, expected[k].latent)) << schedule_kind_name(kind) << " frame " << k;
    }
  }
}

TEST(Generator, ResetMidStreamStartsOver) {
  auto model = std::make_shared<PerFrameDenoiser>(Prediction::flow, 4);
  Generator g(model, options(ScheduleKind::fifo, SamplerKind::unipc, 6, 0));
  std::vector<torch::Tensor> first;
  for (int i = 0; i < 3; ++i) first.push_back(g.next().at(0).latent);
  g.next();
  g.reset();
  EXPECT_EQ(g.state_bytes(), 0u);
  for (int i = 0; i < 3; ++i) {
    auto f = g.next().at(0);
    EXPECT_EQ(f.index, i);
    EXPECT_TRUE(torch::equal(f.latent, first[i]));
  }
}

// A model whose parameters track gradients must not chain the frames' graphs (memory would grow with length).
TEST(Generator, FramesCarryNoAutogradGraph) {
  auto model = std::make_shared<PerFrameDenoiser>(Prediction::flow, 4);
  GeneratorOptions o = options(ScheduleKind::rolling, SamplerKind::unipc, 4, 6);
  o.context = 1;
  Generator g(model, o);
  for (const auto& f : run_all(g)) {
    EXPECT_FALSE(f.latent.requires_grad());
    EXPECT_FALSE(f.latent.grad_fn());
  }
}

TEST(Generator, GuidanceMixesConditionalAndUnconditional) {
  auto model = std::make_shared<PerFrameDenoiser>(Prediction::flow, 4, 3);
  GeneratorOptions o = options(ScheduleKind::clip, SamplerKind::euler, 1, 1);
  o.text = torch::full({1, 3, 4}, 0.5);
  o.negative_text = torch::full({1, 3, 4}, 0.1);
  o.guidance = 3.0;
  Generator g(model, o);
  torch::Tensor x = g.next()[0].latent;
  auto noise = at::make_generator<at::CPUGeneratorImpl>(42);
  torch::Tensor n = torch::randn({1, 2, 1, 3, 5}, noise, torch::kFloat);
  torch::Tensor base = torch::sin(1.3 * n) + 0.001 * g.sampler().timestep(0);
  torch::Tensor v = (base + 0.1) + 3.0 * ((base + 0.5) - (base + 0.1));
  EXPECT_LE(max_abs_diff(x, n + (g.sampler().sigma(1) - g.sampler().sigma(0)) * v), 1e-6);
  EXPECT_EQ(g.model_calls(), 2);
}

// diffusers guides only above 1 (do_classifier_free_guidance = guidance_scale > 1): a scale of 1 or less runs the
// prompt alone, one call per step, and gives what guidance 1 gives, never a step away from the prompt.
TEST(Generator, GuidanceOfOneOrLessRunsThePromptAlone) {
  const auto run = [](std::shared_ptr<const Denoiser> model, double guidance, bool negative) {
    GeneratorOptions o = options(ScheduleKind::clip, SamplerKind::euler, 3, 2);
    if (model->spec().text_tokens > 0) {
      o.text = torch::full({1, 3, 4}, 0.5);
      if (negative) o.negative_text = torch::full({1, 3, 4}, -2.0);
    }
    o.guidance = guidance;
    Generator g(std::move(model), o);
    torch::Tensor x = g.next()[0].latent;
    return std::make_pair(x, g.model_calls());
  };
  auto text_model = std::make_shared<PerFrameDenoiser>(Prediction::flow, 4, 3);
  const auto [alone, alone_calls] = run(text_model, 1.0, false);
  EXPECT_EQ(alone_calls, 3);
  for (double guidance : {0.5, 0.0}) {
    const auto [x, calls] = run(text_model, guidance, true);
    EXPECT_EQ(calls, 3) << "guidance " << guidance << " ran the negative prompt";
    EXPECT_TRUE(torch::equal(x, alone)) << "guidance " << guidance << " moved away from the prompt";
    // No negative prompt is needed where there is no guidance.
    EXPECT_TRUE(torch::equal(run(text_model, guidance, false).first, alone));
  }
  EXPECT_EQ(run(text_model, 1.5, true).second, 6);
  // A model without text takes any scale up to 1: there is nothing to guide.
  auto plain = std::make_shared<PerFrameDenoiser>(Prediction::flow, 4);
  EXPECT_TRUE(torch::equal(run(plain, 0.5, false).first, run(plain, 1.0, false).first));
}

// Wan 2.2 A14B: the second expert's guidance for the calls below the boundary; guidance alone switches CFG on.
TEST(Generator, SecondExpertGuidanceBelowTheBoundary) {
  const auto run = [](double boundary, double guidance, double guidance_2) {
    auto model = std::make_shared<PerFrameDenoiser>(Prediction::flow, 4, 3, boundary);
    GeneratorOptions o = options(ScheduleKind::clip, SamplerKind::unipc, 4, 2);
    o.text = torch::full({1, 3, 4}, 0.5);
    o.negative_text = torch::full({1, 3, 4}, -2.0);
    o.guidance = guidance;
    o.guidance_2 = guidance_2;
    Generator g(model, o);
    torch::Tensor x = g.next()[0].latent;
    return std::make_pair(x, g.model_calls());
  };
  auto plain = [](double guidance) {
    auto model = std::make_shared<PerFrameDenoiser>(Prediction::flow, 4, 3);
    GeneratorOptions o = options(ScheduleKind::clip, SamplerKind::unipc, 4, 2);
    o.text = torch::full({1, 3, 4}, 0.5);
    o.negative_text = torch::full({1, 3, 4}, -2.0);
    o.guidance = guidance;
    return Generator(model, o).next()[0].latent;
  };
  // Every timestep above a boundary of 0.5: the first expert's guidance throughout; below 1e6: the second's.
  EXPECT_TRUE(torch::equal(run(0.5, 4.0, 3.0).first, plain(4.0)));
  EXPECT_TRUE(torch::equal(run(1e6, 4.0, 3.0).first, plain(3.0)));
  // A boundary inside the schedule mixes them; unset, the second is the first.
  const torch::Tensor mixed = run(700.0, 4.0, 3.0).first;
  EXPECT_FALSE(torch::equal(mixed, plain(4.0)));
  EXPECT_FALSE(torch::equal(mixed, plain(3.0)));
  EXPECT_TRUE(torch::equal(run(700.0, 4.0, -1.0).first, plain(4.0)));
  // guidance <= 1 runs the prompt alone, whatever guidance_2 says.
  const auto [off, calls] = run(700.0, 1.0, 3.0);
  EXPECT_EQ(calls, 4);
  EXPECT_TRUE(torch::equal(off, plain(1.0)));
  // A model with one network has no second guidance.
  auto one = std::make_shared<PerFrameDenoiser>(Prediction::flow, 4, 3);
  GeneratorOptions o = options(ScheduleKind::clip, SamplerKind::unipc, 4, 2);
  o.text = torch::full({1, 3, 4}, 0.5);
  o.guidance_2 = 2.0;
  EXPECT_NE(option_error(one, o).find("guidance_2 is the second expert's guidance"), std::string::npos);
}

// Image to video: the condition's frames are in every model input at timestep 0 and end the clip; the other
// frames take their own trajectory (this denoiser's frames do not see each other).
TEST(Generator, ConditionFramesStayCleanInEveryCallAndEndTheClip) {
  auto model = std::make_shared<PerFrameDenoiser>(Prediction::flow, 4);
  GeneratorOptions o = options(ScheduleKind::clip, SamplerKind::unipc, 3, 3);
  Generator free_run(model, o);
  const std::vector<GeneratedFrame> free_frames = free_run.next();
  model->calls.clear();
  o.condition = torch::randn({1, 2, 1, 3, 5});
  Generator g(model, o);
  const std::vector<GeneratedFrame> frames = g.next();
  ASSERT_EQ(frames.size(), 3u);
  ASSERT_EQ(model->calls.size(), 3u);
  for (const auto& call : model->calls) {
    EXPECT_EQ(call[0], 0.0f);
    EXPECT_GT(call[1], 0.0f);
  }
  EXPECT_TRUE(torch::equal(frames[0].latent, o.condition));
  for (size_t k = 1; k < 3; ++k) EXPECT_TRUE(torch::equal(frames[k].latent, free_frames[k].latent)) << k;

  o.condition = torch::randn({1, 2, 1, 4, 5});
  EXPECT_NE(option_error(model, o).find("condition: expected"), std::string::npos);
  o.condition = torch::full({1, 2, 1, 3, 5}, std::nan(""));
  EXPECT_NE(option_error(model, o).find("condition holds"), std::string::npos);
  o = options(ScheduleKind::fifo, SamplerKind::unipc, 3, 0);
  o.condition = torch::zeros({1, 2, 1, 3, 5});
  EXPECT_NE(option_error(model, o).find("for the clip schedule"), std::string::npos);
}

// One NaN in a user's starting latents would make every frame NaN without a word: it is refused by name.
TEST(Generator, NonFiniteInitialNoiseIsRefused) {
  auto model = std::make_shared<PerFrameDenoiser>(Prediction::flow, 4);
  GeneratorOptions o = options(ScheduleKind::clip, SamplerKind::euler, 2, 2);
  o.initial_noise = torch::randn({1, 2, 2, 3, 5});
  EXPECT_EQ(option_error(model, o), "(accepted)");
  o.initial_noise[0][1][1][2][4] = std::nan("");
  const std::string nan = option_error(model, o);
  EXPECT_NE(nan.find("initial_noise holds 1 NaN value"), std::string::npos) << nan;
  o.initial_noise[0][0][0][0][0] = -INFINITY;
  o.initial_noise[0][0][0][0][1] = INFINITY;
  const std::string both = option_error(model, o);
  EXPECT_NE(both.find("initial_noise holds 1 NaN and 2 infinite values"), std::string::npos) << both;
}

TEST(Generator, OptionsThatDoNotFitAreNamed) {
  auto model = std::make_shared<PerFrameDenoiser>(Prediction::flow, 4);
  auto o = options(ScheduleKind::clip, SamplerKind::euler, 4, 5);
  EXPECT_NE(option_error(model, o).find("use fifo or rolling"), std::string::npos);
  o.frames = 0;
  EXPECT_NE(option_error(model, o).find("a clip of 0"), std::string::npos);
  o = options(ScheduleKind::rolling, SamplerKind::euler, 4, 0);
  o.context = 4;
  EXPECT_NE(option_error(model, o).find("context 4"), std::string::npos);
  o = options(ScheduleKind::fifo, SamplerKind::euler, 4, 0);
  o.window = 6;
  EXPECT_NE(option_error(model, o).find("window 6"), std::string::npos);
  o = options(ScheduleKind::fifo, SamplerKind::euler, 4, 0);
  o.height = 4;
  EXPECT_NE(option_error(model, o).find("latent size 4x5"), std::string::npos);
  o = options(ScheduleKind::fifo, SamplerKind::ddim, 4, 0);
  EXPECT_NE(option_error(model, o), "(accepted)");  // ddim needs v or epsilon, the model predicts flow
  o = options(ScheduleKind::fifo, SamplerKind::euler, 4, 0);
  o.guidance = 2.0;
  EXPECT_NE(option_error(model, o).find("no text"), std::string::npos);
  o.guidance = std::nan("");
  EXPECT_NE(option_error(model, o).find("finite"), std::string::npos);
  o.guidance = 2.0;
  auto text_model = std::make_shared<PerFrameDenoiser>(Prediction::flow, 4, 3);
  o.text = torch::zeros({1, 3, 4});
  EXPECT_NE(option_error(text_model, o).find("negative_text"), std::string::npos);
  o.guidance = 1.0;
  o.text = torch::zeros({1, 2, 4});
  EXPECT_NE(option_error(text_model, o).find("[1, 3, 4]"), std::string::npos);
  EXPECT_NE(option_error(nullptr, o).find("no denoiser"), std::string::npos);
  EXPECT_EQ(parse_schedule_kind("rolling"), ScheduleKind::rolling);
  EXPECT_THROW(parse_schedule_kind("diagonal"), std::invalid_argument);
}

// Progress comes after every iteration with the run's total, the last one saying the run is complete, and starts
// over after a reset; an endless run has no total.
TEST(Generator, ProgressCountsEveryIterationOfTheRun) {
  auto model = std::make_shared<PerFrameDenoiser>(Prediction::flow, 4);
  struct Run {
    ScheduleKind kind;
    int64_t frames, steps, total;
  } runs[] = {{ScheduleKind::clip, 3, 4, 4},
              {ScheduleKind::fifo, 5, 4, 8},
              {ScheduleKind::rolling, 10, 3, 9},  // windows of 4, 3 and 3 new frames
              {ScheduleKind::rolling, 2, 3, 3}};
  for (const Run& r : runs) {
    GeneratorOptions o = options(r.kind, SamplerKind::euler, r.steps, r.frames);
    o.context = 1;
    std::vector<GeneratorProgress> seen;
    o.progress = [&](const GeneratorProgress& p) { seen.push_back(p); };
    Generator g(model, o);
    run_all(g);
    ASSERT_EQ(int64_t(seen.size()), r.total) << schedule_kind_name(r.kind) << " " << r.frames;
    for (size_t i = 0; i < seen.size(); ++i) {
      EXPECT_EQ(seen[i].iteration, int64_t(i) + 1);
      EXPECT_EQ(seen[i].iterations, r.total);
    }
    seen.clear();
    g.reset();
    g.next();
    ASSERT_FALSE(seen.empty());
    EXPECT_EQ(seen.front().iteration, 1);
  }
  GeneratorOptions endless = options(ScheduleKind::fifo, SamplerKind::euler, 4, 0);
  int64_t total = -1;
  endless.progress = [&](const GeneratorProgress& p) { total = p.iterations; };
  Generator g(model, endless);
  g.next();
  EXPECT_EQ(total, 0);
}

// A model whose positions reach far beyond the clip it was trained on (Wan: 1,024 latent frames, trained on 21)
// runs its trained clip by default, never one call of its whole window.
TEST(Generator, DefaultWindowIsTheTrainedClip) {
  auto model = std::make_shared<PerFrameDenoiser>(Prediction::flow, 1024);
  DenoiserSpec spec = model->spec();
  EXPECT_EQ(default_window(spec), 1024);  // nothing declared: the window
  spec.native_frames = 21;
  EXPECT_EQ(default_window(spec), 21);
  spec.native_frames = 2000;
  EXPECT_EQ(default_window(spec), 1024);  // never past what the model takes

  struct Trained final : PerFrameDenoiser {
    Trained() : PerFrameDenoiser(Prediction::flow, 1024) { spec_.native_frames = 21; }
  };
  auto trained = std::make_shared<Trained>();
  Generator fifo(trained, options(ScheduleKind::fifo, SamplerKind::euler, 4, 0));
  EXPECT_EQ(fifo.options().window, 21);
  GeneratorOptions o = options(ScheduleKind::rolling, SamplerKind::euler, 4, 0);
  o.context = 2;
  Generator rolling(trained, o);
  EXPECT_EQ(rolling.options().window, 21);
}

// The memory pre-check counts the frames a run holds and calls, not the window: a one-frame clip of a model with
// a 1,024-frame window holds one frame, and a long clip more than a short one.
TEST(GeneratorMemory, LowerBoundCountsTheFramesOfTheRun) {
  GeneratorOptions o = options(ScheduleKind::clip, SamplerKind::euler, 4, 1);
  o.height = 60;
  o.width = 104;
  const size_t frame = 16 * 60 * 104 * sizeof(float);
  o.window = 1;
  const size_t one = Generator::latent_bytes_lower_bound(o, 16);
  o.window = 1024;
  EXPECT_EQ(Generator::latent_bytes_lower_bound(o, 16), one);
  EXPECT_LE(one, 4 * frame);  // the latents, their input to the call and one prediction
  o.frames = 1000;
  EXPECT_EQ(Generator::latent_bytes_lower_bound(o, 16), 1000 * one);
  o.guidance = 5.0;  // the unconditional prediction too
  EXPECT_EQ(Generator::latent_bytes_lower_bound(o, 16), 1000 * (one + frame));
  // rolling holds a window; an endless run is not a window of infinity.
  o = options(ScheduleKind::rolling, SamplerKind::euler, 4, 0);
  o.height = 60;
  o.width = 104;
  o.window = 21;
  EXPECT_EQ(Generator::latent_bytes_lower_bound(o, 16), 21 * one);
  o.frames = 3;
  EXPECT_EQ(Generator::latent_bytes_lower_bound(o, 16), 3 * one);
  // fifo: its queue of steps + 1 frames.
  o = options(ScheduleKind::fifo, SamplerKind::euler, 4, 0);
  o.height = 60;
  o.width = 104;
  o.window = 1024;
  EXPECT_EQ(Generator::latent_bytes_lower_bound(o, 16), 5 * one);
}

namespace {

// What malloc has handed out and not had back, in bytes (every arena, mmapped blocks included): exact, where RSS
// moves in pages and lags frees.
double malloc_live_bytes() {
  const struct mallinfo2 m = mallinfo2();
  return double(m.uordblks) + double(m.hblkhd);
}

// `frames` latent frames through the tiny exported Wan transformer, fifo and rolling. After the first quarter (the
// warm-up) the generator's own bytes never grow, and neither the process's RSS nor its live malloc'd bytes peak
// higher over the last half of the run than over the quarter before it. One of these latent frames is 1 KiB: a
// generator that kept one per frame, or anything per model call, would show in the second peak.
void expect_constant_memory(int64_t frames) {
  auto model = load_denoiser(denoiser_fixtures_dir() / "wan-tiny.pt2");
  for (ScheduleKind kind : {ScheduleKind::fifo, ScheduleKind::rolling}) {
    GeneratorOptions o = options(kind, SamplerKind::unipc, 8, frames);
    o.window = 4;
    o.context = 1;
    o.text = denoiser_case("text");
    Generator g(model, o);
    const int64_t warm = frames / 4, half = frames / 2;
    int64_t made = 0;
    size_t bytes_warm = 0, bytes_max = 0;
    double rss[2] = {0, 0}, live[2] = {0, 0};  // peaks over [warm, half) and [half, frames)
    while (!g.finished()) {
      for (auto& f : g.next()) {
        ASSERT_EQ(f.index, made);
        ASSERT_TRUE(torch::isfinite(f.latent).all().item<bool>());
        ++made;
      }
      if (made < warm || g.finished()) continue;
      if (bytes_warm == 0) bytes_warm = g.state_bytes();
      bytes_max = std::max(bytes_max, g.state_bytes());
      const int late = made >= half ? 1 : 0;
      rss[late] = std::max(rss[late], rss_mib());
      live[late] = std::max(live[late], malloc_live_bytes());
    }
    const char* name = schedule_kind_name(kind);
    EXPECT_EQ(made, frames);
    EXPECT_LE(bytes_max, bytes_warm) << name;
    EXPECT_LT(rss[1] - rss[0], 4.0) << name << ": RSS peaked at " << rss[0] << " then " << rss[1] << " MiB";
    EXPECT_LT(live[1] - live[0], 64.0 * 1024)
        << name << ": malloc'd bytes peaked at " << live[0] << " then " << live[1];
    std::printf(
        "%s: %lld latent frames, state %zu bytes, RSS peaks %.1f, %.1f MiB, live heap peaks %.0f, %.0f "
        "bytes, %lld model calls\n",
        name, static_cast<long long>(frames), bytes_warm, rss[0], rss[1], live[0], live[1],
        static_cast<long long>(g.model_calls()));
  }
}

}  // namespace

// Run alone, with glibc returning freed blocks at once (see core-memory).
TEST(GeneratorMemory, FourHundredFramesInConstantMemory) {
  LATENT_REQUIRE_DENOISER_FIXTURES();
  expect_constant_memory(400);
}

// The same over 2,000 frames: minutes on 2 cores, a scale run.
TEST(GeneratorMemory, TwoThousandFramesInConstantMemory) {
  if (!scale_tests_enabled()) GTEST_SKIP() << "[opt-in] a scale run: LATENT_SCALE_TESTS=1 (meson test --suite scale)";
  LATENT_REQUIRE_DENOISER_FIXTURES();
  expect_constant_memory(2000);
}
