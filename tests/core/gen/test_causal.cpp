// The causal schedule (core/src/gen/sampling/causal_schedule.cpp) and the Wan transformer run over a key/value
// cache, against Self-Forcing's and LongLive's inference on a tiny random causal Wan model
// (tests/fixtures/gen_causal_fixtures.py ran their code; its outputs are in tests/fixtures/data/causal/).
//
// Tolerance: 1e-4 of the reference's largest value. The references rotate RoPE in float64 and this code in
// float32, a few 1e-7 per call; across the 4 steps and context passes of 5 blocks the latents stay within ~1e-6.
// A wrong window, sink, RoPE position, timestep or re-cache moves a block by 1e-2 or more (the fixture script
// checks that a block differs by 0.08 without its context pass and by 0.09 with another window).
#include <gtest/gtest.h>
#include <torch/types.h>

#include <unistd.h>
#include <atomic>
#include <cmath>
#include <filesystem>
#include <fstream>

#include "forwarding_causal_model.h"
#include "gen/layer_interrupt.h"
#include "gen/models/causal_model.h"
#include "gen/sampling/schedule.h"
#include "latent/gen/denoiser.h"
#include "latent/gen/generator.h"
#include "latent/io/weights.h"

// Not the whole namespace: latent::CausalSchedule (the schedule) would clash with this suite's fixture.
using latent::causal_model;
using latent::causal_sigmas;
using latent::causal_timesteps;
using latent::CausalModel;
using latent::CausalOptions;
using latent::Denoiser;
using latent::DenoiserFiles;
using latent::GeneratedFrame;
using latent::Generator;
using latent::GeneratorOptions;
using latent::Interrupted;
using latent::KvCache;
using latent::load_denoiser;
using latent::LoadOptions;
using latent::read_weights;
using latent::ScheduleKind;
using latent::WeightSource;
namespace fs = std::filesystem;

namespace {

constexpr double kRelTolerance = 1e-4;

fs::path data() { return fs::path(LATENT_TEST_SOURCE_ROOT) / "tests" / "fixtures" / "data" / "causal"; }

const WeightSource& cases() {
  static const WeightSource c = read_weights(data() / "causal-cases.safetensors");
  return c;
}

torch::Tensor tensor(const std::string& name) {
  auto it = cases().tensors.find(name);
  if (it == cases().tensors.end()) throw std::runtime_error("fixture tensor " + name + " missing");
  return it->second.to(torch::kFloat);
}

// [1, T, C, h, w] as the references keep latents -> [1, C, T, h, w] as the generator makes them.
torch::Tensor channels_first(const torch::Tensor& t) { return t.permute({0, 2, 1, 3, 4}).contiguous(); }

double rel_error(const torch::Tensor& got, const torch::Tensor& want) {
  const auto g = got.to(torch::kDouble), w = want.to(torch::kDouble);
  return (g - w).abs().max().item<double>() / w.abs().max().item<double>();
}

std::shared_ptr<Denoiser> model(const fs::path& weights = data() / "causal-model.pt",
                                const fs::path& folder = data() / "pipeline") {
  static std::map<std::string, std::shared_ptr<Denoiser>> loaded;
  const std::string key = weights.string() + "|" + folder.string();
  auto& m = loaded[key];
  if (!m) {
    DenoiserFiles files;
    files.first.transformer_weights = weights;
    m = load_denoiser(folder, {}, files);
  }
  return m;
}

struct Case {
  std::string name;
  int64_t frames, window, sink;
  int64_t switch_frame = -1;
  bool global_sink = true;
};

GeneratorOptions options(const Case& c) {
  GeneratorOptions o;
  o.schedule = ScheduleKind::causal;
  o.frames = c.frames;
  o.height = 6;
  o.width = 8;
  o.seed = 42;
  o.text = tensor("prompt.A");
  o.causal.chunk_frames = 3;
  o.causal.kv_window = c.window;
  o.causal.sink_frames = c.sink;
  o.causal.global_sink = c.global_sink;
  if (c.switch_frame >= 0) o.prompt_switches.push_back({c.switch_frame, tensor("prompt.B")});
  return o;
}

torch::Tensor run(std::shared_ptr<const Denoiser> m, const GeneratorOptions& o, Generator** out = nullptr) {
  Generator g(std::move(m), o);
  std::vector<torch::Tensor> frames;
  while (!g.finished())
    for (const GeneratedFrame& f : g.next()) frames.push_back(f.latent);
  return torch::cat(frames, 2);
}

void expect_case(const Case& c) {
  SCOPED_TRACE(c.name);
  const torch::Tensor got = run(model(), options(c));
  const torch::Tensor want = channels_first(tensor(c.name + ".latents"));
  ASSERT_EQ(got.sizes(), want.sizes());
  EXPECT_LE(rel_error(got, want), kRelTolerance);
}

}  // namespace

// One intra-op thread: the model is tiny, so a call is a few microseconds of arithmetic between thread pool
// barriers, and beside another test process a barrier waits for a core (a test of 0.1 s took 16 s so). The
// results do not depend on it.
class CausalSchedule : public ::testing::Test {
 protected:
  void SetUp() override {
    threads_ = at::get_num_threads();
    at::set_num_threads(1);
  }
  void TearDown() override { at::set_num_threads(threads_); }

 private:
  int threads_ = 1;
};

TEST_F(CausalSchedule, TimestepsAreTheReferencesFloat32Values) {
  const CausalOptions o;
  const std::vector<double> t = causal_timesteps(o), s = causal_sigmas(o);
  const std::vector<double> want_t{1000.0, 937.5, 833.3333129882812, 625.0},
      want_s{1.0, 0.9375, 0.8333333134651184, 0.625};
  ASSERT_EQ(t.size(), 4u);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(t[i], want_t[i]) << i;  // exact: 833.3333129882812, never 833
    EXPECT_EQ(s[i], want_s[i]) << i;
  }
}

// CausVid's 3-step model takes its steps unwarped at shift 8: the model sees 757 itself, and the sigma is the grid's
// nearest to it, sigma(757) on the shift-8 grid being 0.9613 (a warped step 757 would be timestep 961.3).
TEST_F(CausalSchedule, UnwarpedStepsAreTimestepsWithTheNearestGridSigma) {
  CausalOptions o;
  o.denoising_steps = {1000, 757, 522};
  o.shift = 8.0;
  o.warp = false;
  const std::vector<double> t = causal_timesteps(o), s = causal_sigmas(o);
  EXPECT_EQ(t, (std::vector<double>{1000.0, 757.0, 522.0}));
  const torch::Tensor grid = torch::linspace(1.0, 0.0, 1001, torch::kFloat).narrow(0, 0, 1000);
  const torch::Tensor sig = 8.0 * grid / (1 + 7.0 * grid), ts = sig * 1000;
  for (size_t i = 0; i < 3; ++i) {
    const int64_t k = (ts - float(t[i])).abs().argmin().item<int64_t>();
    EXPECT_EQ(s[i], double(sig[k].item<float>())) << i;
    EXPECT_LT(std::abs(ts[k].item<float>() - t[i]), 1.0) << i;
  }
  o.warp = true;
  EXPECT_NE(causal_timesteps(o)[1], 757.0);
}

TEST_F(CausalSchedule, GlobalCacheEqualsSelfForcing) { expect_case({"self_forcing", 9, 0, 0}); }
TEST_F(CausalSchedule, WindowEvictingAWholeBlockWithASinkEqualsLongLive) { expect_case({"window6_sink3", 9, 6, 3}); }
TEST_F(CausalSchedule, WindowEvictingPartOfABlockEqualsLongLive) { expect_case({"window5_sink1", 9, 5, 1}); }
TEST_F(CausalSchedule, LongerRunThroughAWindowEqualsLongLive) { expect_case({"window9_sink3_15f", 15, 9, 3}); }

TEST_F(CausalSchedule, PromptSwitchWithinTheWindowReencodesTheSink) {
  expect_case({"switch3_window6_sink3", 9, 6, 3, 3, true});
  expect_case({"switch3_window6_sink3_gs0", 9, 6, 3, 3, false});
}

TEST_F(CausalSchedule, PromptSwitchPastTheWindowKeepsOrRemakesTheSink) {
  expect_case({"switch12_window9_sink3", 15, 9, 3, 12, true});
  expect_case({"switch12_window9_sink3_gs0", 15, 9, 3, 12, false});
}

TEST_F(CausalSchedule, FramesBeforeASwitchAreBitIdenticalToTheRunWithout) {
  const torch::Tensor plain = run(model(), options({"", 15, 9, 3}));
  const torch::Tensor switched = run(model(), options({"", 15, 9, 3, 12, true}));
  EXPECT_TRUE(torch::equal(plain.narrow(2, 0, 12), switched.narrow(2, 0, 12)));
  EXPECT_FALSE(torch::equal(plain.narrow(2, 12, 3), switched.narrow(2, 12, 3)));
}

TEST_F(CausalSchedule, SafetensorsWeightsEqualTheTorchCheckpoint) {
  const Case c{"window6_sink3", 9, 6, 3};
  EXPECT_TRUE(torch::equal(run(model(data() / "causal-model.safetensors"), options(c)), run(model(), options(c))));
}

TEST_F(CausalSchedule, SwitchPromptWhilePlayingEqualsTheScriptedSwitch) {
  const Case c{"switch12_window9_sink3", 15, 9, 3};
  Generator g(model(), options(c));
  std::vector<torch::Tensor> frames;
  std::vector<int64_t> switched_at;
  while (!g.finished()) {
    if (frames.size() == 12) g.switch_prompt(tensor("prompt.B"));
    for (const GeneratedFrame& f : g.next()) {
      frames.push_back(f.latent);
      if (f.prompt_switch) switched_at.push_back(f.index);
    }
  }
  EXPECT_LE(rel_error(torch::cat(frames, 2), channels_first(tensor("switch12_window9_sink3.latents"))), kRelTolerance);
  EXPECT_EQ(switched_at, std::vector<int64_t>{12});
  EXPECT_THROW(g.switch_prompt(torch::zeros({1, 7, 24})), std::invalid_argument);
}

TEST_F(CausalSchedule, ASwitchInsideABlockTakesEffectAtTheNextBlock) {
  GeneratorOptions o = options({"", 15, 9, 3, 10, true});
  Generator g(model(), o);
  std::vector<torch::Tensor> frames;
  int64_t switched = -1;
  while (!g.finished())
    for (const GeneratedFrame& f : g.next()) {
      frames.push_back(f.latent);
      if (f.prompt_switch) switched = f.index;
    }
  EXPECT_EQ(switched, 12);
  EXPECT_LE(rel_error(torch::cat(frames, 2), channels_first(tensor("switch12_window9_sink3.latents"))), kRelTolerance);
}

TEST_F(CausalSchedule, InitialNoiseOfTheSeedGivesTheSeedsRun) {
  GeneratorOptions o = options({"", 9, 6, 3});
  const torch::Tensor seeded = run(model(), o);
  o.initial_noise = channels_first(tensor("window6_sink3.noise"));
  EXPECT_TRUE(torch::equal(run(model(), o), seeded));
  o.initial_noise = o.initial_noise.narrow(2, 0, 6);
  EXPECT_THROW(Generator(model(), o), std::invalid_argument);
}

TEST_F(CausalSchedule, FramesNotAMultipleOfTheBlockAreHonouredExactly) {
  GeneratorOptions o = options({"", 8, 6, 3});
  const torch::Tensor got = run(model(), o);
  ASSERT_EQ(got.size(2), 8);
  EXPECT_LE(rel_error(got, channels_first(tensor("window6_sink3.latents")).narrow(2, 0, 8)), kRelTolerance);
}

TEST_F(CausalSchedule, MemoryStaysFlatOverAnEndlessRun) {
  GeneratorOptions o = options({"", 0, 6, 3});
  Generator g(model(), o);
  std::vector<size_t> bytes;
  for (int block = 0; block < 12; ++block) {
    ASSERT_EQ(g.next().size(), 3u);
    bytes.push_back(g.state_bytes());
  }
  EXPECT_FALSE(g.finished());
  EXPECT_GT(bytes[1], 0u);
  for (size_t i = 2; i < bytes.size(); ++i) EXPECT_EQ(bytes[i], bytes[1]) << "block " << i;
}

// Forwards to a causal model and, once armed, interrupts the generator from inside the model call it counts to:
// the generator sees the interrupt before its next call whatever the threads' timing (a watcher thread polling
// model_calls() could wake after the block had ended on a busy machine).
class InterruptingModel : public latent_test::ForwardingCausalModel {
 public:
  using ForwardingCausalModel::ForwardingCausalModel;
  void interrupt_after(int64_t calls, Generator& g) const {
    countdown_ = calls;
    target_ = &g;
  }

 protected:
  void after_call() const override {
    if (countdown_ > 0 && --countdown_ == 0) target_->interrupt();
  }

 private:
  mutable int64_t countdown_ = 0;
  mutable Generator* target_ = nullptr;
};

// The key/value cache counts in the memory check before the first block: the model's bytes a frame are what a
// cache holds (measured on a call), and a window whose cache cannot fit is refused with the figure, not accepted
// to die minutes later.
// A generator's interrupt reaches the layers of a call in progress: the call stops at its next layer instead of
// running to its end (one call at 16384x16384 takes minutes, and a stop waited for all of it). Outside a
// generator's scope, or with the flag clear, the call runs as before.
TEST_F(CausalSchedule, AnInterruptStopsACallBetweenItsLayers) {
  const auto inner = model();
  const latent::CausalModel& causal = *causal_model(*inner);
  const GeneratorOptions o = options({"", 9, 6, 3});
  const torch::Tensor x = torch::randn({1, inner->spec().channels, 3, o.height, o.width});
  const auto call = [&] {
    latent::KvCache cache;
    cache.window = 6;
    return causal.predict_cached(x, torch::full({1, 3}, 500.0), o.text, cache, 0, 0);
  };
  std::atomic<bool> flag{false};
  {
    const latent::LayerInterrupt scope(flag);
    EXPECT_NO_THROW(call());
    flag = true;
    EXPECT_THROW(call(), Interrupted);
  }
  EXPECT_NO_THROW(call());  // the scope ended: a call outside a generator is not interrupted
}

TEST_F(CausalSchedule, TheKeyValueCacheIsCountedBeforeTheFirstBlock) {
  const auto inner = model();
  const latent::CausalModel& causal = *causal_model(*inner);
  const GeneratorOptions o = options({"", 9, 6, 3});
  latent::KvCache cache;
  cache.window = 6;
  causal.predict_cached(torch::randn({1, inner->spec().channels, 3, o.height, o.width}), torch::full({1, 3}, 500.0),
                        o.text, cache, 0, 0);
  EXPECT_EQ(cache.bytes(), 3 * causal.kv_bytes_per_frame(o.height, o.width));

  const auto big = std::make_shared<latent_test::ForwardingCausalModel>(inner);
  EXPECT_NO_THROW(Generator(big, o));
  big->scale_kv_bytes(size_t(1) << 40);
  try {
    Generator g(big, o);
    ADD_FAILURE() << "a window of " << o.causal.kv_window << " frames of a petabyte each was accepted";
  } catch (const std::invalid_argument& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("for the key/value cache"), std::string::npos) << what;
    EXPECT_NE(what.find("choose a smaller kv_window"), std::string::npos) << what;
  }
  // A size whose one call does not fit (16384x16384 with the smallest window ran for minutes) is refused too.
  const auto wide = std::make_shared<latent_test::ForwardingCausalModel>(inner);
  wide->scale_call_bytes(size_t(1) << 40);
  try {
    Generator g(wide, o);
    ADD_FAILURE() << "a call of a petabyte of activations was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("for one model call's activations"), std::string::npos) << e.what();
  }
}

// Runs g.next() and interrupts it after its second model call (so the block has changed its cache); the generator
// is ready for the retry afterwards.
void interrupt_second_call(Generator& g, const InterruptingModel& m) {
  m.interrupt_after(2, g);
  EXPECT_THROW(g.next(), Interrupted);
  g.clear_interrupt();
}

TEST_F(CausalSchedule, InterruptedBlockResumesAsIfUninterrupted) {
  const GeneratorOptions o = options({"", 9, 6, 3});
  const torch::Tensor want = run(model(), o);
  const auto m = std::make_shared<InterruptingModel>(model());
  Generator g(m, o);
  std::vector<torch::Tensor> frames;
  for (const GeneratedFrame& f : g.next()) frames.push_back(f.latent);
  interrupt_second_call(g, *m);  // in the second block
  while (!g.finished())
    for (const GeneratedFrame& f : g.next()) frames.push_back(f.latent);
  EXPECT_TRUE(torch::equal(torch::cat(frames, 2), want));
}

// A live switch taken by a block that is then interrupted is not lost: the retried block takes it.
TEST_F(CausalSchedule, ASwitchTakenByAnInterruptedBlockIsKept) {
  const Case c{"switch12_window9_sink3", 15, 9, 3};
  const auto m = std::make_shared<InterruptingModel>(model());
  Generator g(m, options(c));
  std::vector<torch::Tensor> frames;
  for (int b = 0; b < 4; ++b)
    for (const GeneratedFrame& f : g.next()) frames.push_back(f.latent);
  g.switch_prompt(tensor("prompt.B"), "B");
  interrupt_second_call(g, *m);
  std::string label;
  for (const GeneratedFrame& f : g.next()) {
    frames.push_back(f.latent);
    if (f.prompt_switch) label = f.prompt_label;
  }
  EXPECT_EQ(label, "B");
  EXPECT_LE(rel_error(torch::cat(frames, 2), channels_first(tensor("switch12_window9_sink3.latents"))), kRelTolerance);
}

// Past the model's RoPE table (rope_max_seq_len frames) a stream goes on with positions made by the same formula:
// a folder whose table is 8 frames gives the frames of one whose table is 1,024 bit for bit.
TEST_F(CausalSchedule, PositionsPastTheRopeTableFollowTheSameFormula) {
  const fs::path dir = fs::temp_directory_path() / ("causal-rope-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::copy(data() / "pipeline", dir, fs::copy_options::recursive);
  const fs::path config = dir / "transformer" / "config.json";
  std::ifstream in(config);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::string from = "\"rope_max_seq_len\": 1024";
  ASSERT_NE(text.find(from), std::string::npos);
  text.replace(text.find(from), from.size(), "\"rope_max_seq_len\": 8");
  std::ofstream(config) << text;
  const GeneratorOptions o = options({"", 15, 6, 3});
  const torch::Tensor short_table = run(model(data() / "causal-model.pt", dir), o);
  fs::remove_all(dir);
  EXPECT_TRUE(torch::equal(short_table, run(model(), o)));
}

TEST_F(CausalSchedule, OptionsThatCannotWorkAreRefusedByName) {
  const auto refused = [&](GeneratorOptions o, const std::string& word) {
    try {
      Generator g(model(), o);
      ADD_FAILURE() << "accepted; expected an error naming " << word;
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(word), std::string::npos) << e.what();
    }
  };
  const GeneratorOptions o = options({"", 9, 6, 3});
  GeneratorOptions bad = o;
  bad.causal.kv_window = 4;  // sink 3 + block 3 do not fit
  refused(bad, "kv_window");
  bad = o;
  bad.causal.chunk_frames = 0;
  refused(bad, "chunk_frames");
  bad = o;
  bad.guidance = 5.0;
  bad.negative_text = tensor("prompt.B");
  refused(bad, "guidance");
  bad = o;
  bad.causal.denoising_steps = {1000, 1500};
  refused(bad, "denoising_steps");
  bad = o;
  bad.causal.denoising_steps.clear();
  refused(bad, "denoising_steps");
  bad = o;
  bad.prompt_switches = {{6, tensor("prompt.B")}, {3, tensor("prompt.A")}};
  refused(bad, "ascending");
  bad = o;
  bad.prompt_switches = {{6, torch::zeros({1, 512, 7})}};
  refused(bad, "frame 6");
  bad = o;
  bad.prompt_switches = {{6, torch::full({1, 512, 24}, NAN)}};
  refused(bad, "NaN");
  Generator clip(model(), [] {
    GeneratorOptions c;
    c.frames = 2;
    c.height = 6;
    c.width = 8;
    c.text = tensor("prompt.A");
    return c;
  }());
  EXPECT_THROW(clip.switch_prompt(tensor("prompt.B")), std::invalid_argument);
}

TEST(KvCache, EvictionKeepsTheSinkAndTheNewestFrames) {
  KvCache c;
  c.window = 5;
  c.sink = 1;
  const auto fill = [&](std::vector<int64_t> frames) {
    c.frames = frames;
    const int64_t n = int64_t(frames.size());
    c.k = {torch::arange(n).view({1, n, 1, 1}).repeat({1, 1, 2, 1}).view({1, 2 * n, 1, 1}).to(torch::kFloat)};
    c.v = c.k;
  };
  fill({0, 1, 2});
  c.make_room(3);  // 3 + 3 > 5: frame 1 goes
  EXPECT_EQ(c.frames, (std::vector<int64_t>{0, 2}));
  EXPECT_TRUE(torch::equal(c.k[0].flatten(), torch::tensor({0.f, 0.f, 2.f, 2.f})));
  fill({0, 2, 3, 4, 5});
  c.make_room(3);
  EXPECT_EQ(c.frames, (std::vector<int64_t>{0, 5}));
  c.make_room(1);  // fits: nothing goes
  EXPECT_EQ(c.frames, (std::vector<int64_t>{0, 5}));
  c.truncate(1);
  EXPECT_EQ(c.frames, std::vector<int64_t>{0});
  EXPECT_EQ(c.k[0].size(1), 2);
}

// One latent frame per block (the references' num_frame_per_block = 1, as StreamDiffusionV2 runs): one frame per
// call, steps - 1 re-noise draws of [1, 16, h, w] per block, and a window that evicts a single frame at a time.
TEST_F(CausalSchedule, OneFramePerBlockEqualsTheReferences) {
  for (const Case& c : {Case{"chunk1_self_forcing", 6, 0, 0}, Case{"chunk1_window4_sink1", 7, 4, 1}}) {
    SCOPED_TRACE(c.name);
    GeneratorOptions o = options(c);
    o.causal.chunk_frames = 1;
    Generator g(model(), o);
    std::vector<torch::Tensor> frames;
    while (!g.finished()) {
      const std::vector<GeneratedFrame> block = g.next();
      ASSERT_EQ(block.size(), 1u);
      frames.push_back(block.front().latent);
    }
    const torch::Tensor got = torch::cat(frames, 2), want = channels_first(tensor(c.name + ".latents"));
    ASSERT_EQ(got.sizes(), want.sizes());
    EXPECT_LE(rel_error(got, want), kRelTolerance);
  }
}
