// Sequence parallel (Ulysses) in the native Wan 2.1 and CogVideoX transformers: one prediction shared by 2, 3 and
// 4 ranks (threads on the CPU, store backend) against the same model on one device. The models are random-weight
// diffusers folders written here, with 12 heads so that every one of those degrees divides them.
#include <gtest/gtest.h>
#include <torch/types.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <tuple>

#include "latent/gen/denoiser.h"
#include "latent/io/safetensors.h"
#include "latent/parallel/comm.h"
#include "parallel/rank_threads.h"

using namespace latent;
using namespace std::chrono_literals;
namespace fs = std::filesystem;

namespace {

// fp32 on the CPU. Every rank computes what one device computes, but the linear maps see fewer rows (a slice of
// the tokens) and attention fewer heads per call, so the GEMM and SDPA kernels block and order their sums
// differently: each result may move by an ulp or so. Through 2 blocks of random weights that stays near 1e-7 of the
// output's largest value; 1e-5 leaves a wide margin, while one misplaced head or token moves the output by 1e-2.
constexpr double kTol = 1e-5;

constexpr int64_t kHeads = 12;

// max |a - b| / max |b|
double rel_err(const torch::Tensor& a, const torch::Tensor& b) {
  const torch::Tensor af = a.to(torch::kDouble), bf = b.to(torch::kDouble);
  EXPECT_EQ(af.sizes(), bf.sizes());
  if (af.sizes() != bf.sizes()) return 1e9;
  return (af - bf).abs().max().item<double>() / std::max(bf.abs().max().item<double>(), 1e-30);
}

// A random transformer folder: `shapes` are its tensors; weight matrices scaled by 1/sqrt(fan-in) and norm
// weights near 1 so that activations stay of order 1 through the blocks.
fs::path write_folder(const std::string& name, const std::string& config,
                      const std::vector<std::pair<std::string, std::vector<int64_t>>>& shapes) {
  struct Scratch {
    fs::path dir = fs::temp_directory_path() / ("latent-sp-" + std::to_string(::getpid()));
    ~Scratch() {
      std::error_code ec;
      fs::remove_all(dir, ec);
    }
  };
  static const Scratch scratch;
  const fs::path dir = scratch.dir / name;
  fs::create_directories(dir / "transformer");
  std::ofstream(dir / "transformer" / "config.json") << config;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(1234);
  SafetensorsWriter w(dir / "transformer" / "diffusion_pytorch_model.safetensors", {.durable = false});
  for (const auto& [key, shape] : shapes) {
    torch::Tensor t = torch::randn(shape, gen);
    const bool norm = key.find("norm") != std::string::npos && key.find("linear") == std::string::npos;
    if (norm && key.ends_with(".weight"))
      t = 1 + 0.1 * t;
    else if (key.ends_with(".bias") || key.find("scale_shift_table") != std::string::npos)
      t = 0.1 * t;
    else
      t = t / std::sqrt(double(t[0].numel()));
    w.write(key, t);
  }
  w.commit();
  return dir;
}

using Shapes = std::vector<std::pair<std::string, std::vector<int64_t>>>;

void linear(Shapes& s, const std::string& p, int64_t in, int64_t out) {
  s.push_back({p + ".weight", {out, in}});
  s.push_back({p + ".bias", {out}});
}

// WanTransformer3DModel: 12 heads of 8, 2 layers, 4 latent channels.
fs::path wan_folder() {
  const int64_t d = kHeads * 8, c = 4, text = 24, freq = 32, ffn = 64;
  Shapes s;
  s.push_back({"patch_embedding.weight", {d, c, 1, 2, 2}});
  s.push_back({"patch_embedding.bias", {d}});
  linear(s, "condition_embedder.time_embedder.linear_1", freq, d);
  linear(s, "condition_embedder.time_embedder.linear_2", d, d);
  linear(s, "condition_embedder.time_proj", d, 6 * d);
  linear(s, "condition_embedder.text_embedder.linear_1", text, d);
  linear(s, "condition_embedder.text_embedder.linear_2", d, d);
  for (int i = 0; i < 2; ++i) {
    const std::string b = "blocks." + std::to_string(i);
    for (const char* a : {".attn1", ".attn2"}) {
      for (const char* m : {".to_q", ".to_k", ".to_v", ".to_out.0"}) linear(s, b + a + m, d, d);
      s.push_back({b + a + ".norm_q.weight", {d}});
      s.push_back({b + a + ".norm_k.weight", {d}});
    }
    s.push_back({b + ".norm2.weight", {d}});
    s.push_back({b + ".norm2.bias", {d}});
    linear(s, b + ".ffn.net.0.proj", d, ffn);
    linear(s, b + ".ffn.net.2", ffn, d);
    s.push_back({b + ".scale_shift_table", {1, 6, d}});
  }
  linear(s, "proj_out", d, c * 4);
  s.push_back({"scale_shift_table", {1, 2, d}});
  const std::string config = R"({"_class_name": "WanTransformer3DModel", "patch_size": [1, 2, 2],
    "num_attention_heads": 12, "attention_head_dim": 8, "in_channels": 4, "out_channels": 4, "text_dim": 24,
    "freq_dim": 32, "ffn_dim": 64, "num_layers": 2, "cross_attn_norm": true, "qk_norm": "rms_norm_across_heads",
    "eps": 1e-6, "rope_max_seq_len": 1024})";
  return write_folder("wan", config, s);
}

// CogVideoXTransformer3DModel: 12 heads of 16 (RoPE needs 16 per head), 2 layers, 4 latent channels, 7 text
// tokens; up to 4 latent frames.
fs::path cogvideox_folder(bool rope) {
  const int64_t d = kHeads * 16, c = 4, text = 20, te = 24, hd = 16;
  Shapes s;
  s.push_back({"patch_embed.proj.weight", {d, c, 2, 2}});
  s.push_back({"patch_embed.proj.bias", {d}});
  linear(s, "patch_embed.text_proj", text, d);
  linear(s, "time_embedding.linear_1", d, te);
  linear(s, "time_embedding.linear_2", te, te);
  for (int i = 0; i < 2; ++i) {
    const std::string b = "transformer_blocks." + std::to_string(i);
    for (const char* n : {".norm1", ".norm2"}) {
      linear(s, b + n + ".linear", te, 6 * d);
      s.push_back({b + n + ".norm.weight", {d}});
      s.push_back({b + n + ".norm.bias", {d}});
    }
    for (const char* m : {".to_q", ".to_k", ".to_v", ".to_out.0"}) linear(s, b + ".attn1" + m, d, d);
    for (const char* n : {".norm_q", ".norm_k"}) {
      s.push_back({b + ".attn1" + n + ".weight", {hd}});
      s.push_back({b + ".attn1" + n + ".bias", {hd}});
    }
    linear(s, b + ".ff.net.0.proj", d, 4 * d);
    linear(s, b + ".ff.net.2", 4 * d, d);
  }
  s.push_back({"norm_final.weight", {d}});
  s.push_back({"norm_final.bias", {d}});
  linear(s, "norm_out.linear", te, 2 * d);
  s.push_back({"norm_out.norm.weight", {d}});
  s.push_back({"norm_out.norm.bias", {d}});
  linear(s, "proj_out", d, 4 * c);
  const std::string config = std::string(R"({"_class_name": "CogVideoXTransformer3DModel",
    "num_attention_heads": 12, "attention_head_dim": 16, "in_channels": 4, "out_channels": 4, "time_embed_dim": 24,
    "text_embed_dim": 20, "num_layers": 2, "sample_width": 10, "sample_height": 6, "sample_frames": 13,
    "patch_size": 2, "max_text_seq_length": 7, "use_rotary_positional_embeddings": )") +
                             (rope ? "true" : "false") + "}";
  return write_folder(rope ? "cogvideox-rope" : "cogvideox-sincos", config, s);
}

enum class Family { wan, cogvideox_rope, cogvideox_sincos };

const char* name_of(Family f) {
  return f == Family::wan ? "wan" : f == Family::cogvideox_rope ? "cogvideox-rope" : "cogvideox-sincos";
}

// Rank r's model: each rank loads its own, as the ranks of an element do.
std::shared_ptr<Denoiser> model(Family f, int rank = 0, torch::ScalarType dtype = torch::kFloat) {
  static std::map<std::tuple<Family, int, torch::ScalarType>, std::shared_ptr<Denoiser>> cache;
  static std::map<Family, fs::path> folders;
  auto& m = cache[{f, rank, dtype}];
  if (!m) {
    auto& dir = folders[f];
    if (dir.empty()) dir = f == Family::wan ? wan_folder() : cogvideox_folder(f == Family::cogvideox_rope);
    m = load_denoiser(dir, {.dtype = dtype});
  }
  return m;
}

struct Inputs {
  torch::Tensor x, timesteps, text;
};

// Latents of `frames` x h x w; Wan gets a different timestep per frame, CogVideoX one for the clip.
Inputs inputs(Family f, int64_t frames, int64_t h, int64_t w, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  const DenoiserSpec& spec = model(f)->spec();
  Inputs in;
  in.x = torch::randn({1, spec.channels, frames, h, w}, gen);
  in.timesteps = f == Family::wan ? torch::linspace(900, 300, frames).unsqueeze(0) : torch::full({1, frames}, 700.0);
  in.text = torch::randn({1, spec.text_tokens, spec.text_dim}, gen);
  return in;
}

using Wrap = std::function<std::shared_ptr<parallel::Communicator>(std::shared_ptr<parallel::Communicator>)>;

struct RankResults {
  std::vector<torch::Tensor> out;
  std::vector<std::string> errors;  // what each rank threw, empty where it returned
};

// One prediction on `n` CPU thread ranks; a rank that throws aborts the group, as the elements' ranks do. Rethrows
// the root cause after every rank has returned.
void predict_on_ranks(Family f, int n, const Inputs& in, RankResults& results, const Wrap& wrap = {},
                      torch::ScalarType dtype = torch::kFloat) {
  parallel::ThreadGroup group(std::vector<torch::Device>(size_t(n), torch::kCPU), {.timeout = 30s});
  parallel::RankThreads threads(n);
  std::vector<std::shared_ptr<parallel::Communicator>> comms(static_cast<size_t>(n));
  results.out.assign(size_t(n), {});
  results.errors.assign(size_t(n), {});
  threads.run(
      [&](int r) {
        std::shared_ptr<parallel::Communicator> c = group.join(r).collectives;
        comms[size_t(r)] = wrap ? wrap(c) : c;
        results.out[size_t(r)] = model(f, r, dtype)->predict(in.x, in.timesteps, in.text, comms[size_t(r)].get());
      },
      [&](int r, std::exception_ptr e) {
        std::string what = "unknown error";
        try {
          std::rethrow_exception(e);
        } catch (const std::exception& x) {
          what = x.what();
        } catch (...) {
        }
        results.errors[size_t(r)] = what;
        if (comms[size_t(r)]) comms[size_t(r)]->abort("rank " + std::to_string(r) + " (cpu) failed: " + what);
      });
}

// Forwards every call; subclasses change one.
class Forwarding : public parallel::Communicator {
 public:
  explicit Forwarding(std::shared_ptr<parallel::Communicator> inner) : inner_(std::move(inner)) {}
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  const char* backend_name() const override { return inner_->backend_name(); }
  void all_reduce_sum(torch::Tensor& t) override { inner_->all_reduce_sum(t); }
  std::vector<torch::Tensor> all_gather(const torch::Tensor& t) override { return inner_->all_gather(t); }
  torch::Tensor all_to_all(const torch::Tensor& input) override { return inner_->all_to_all(input); }
  void exchange(const torch::Tensor& a, const torch::Tensor& b, torch::Tensor& c, torch::Tensor& d) override {
    inner_->exchange(a, b, c, d);
  }
  void abort(const std::string& why) noexcept override { inner_->abort(why); }

 protected:
  std::shared_ptr<parallel::Communicator> inner_;
};

// The mutation: an all-to-all that sends nothing anywhere, each rank keeping its own parts.
class NoAllToAll : public Forwarding {
 public:
  using Forwarding::Forwarding;
  torch::Tensor all_to_all(const torch::Tensor& input) override { return input.clone(); }
};

// Rank 1 runs out of memory at its `fail_at`-th all-to-all (mid-model), while the others wait in it.
class FailingRank : public Forwarding {
 public:
  FailingRank(std::shared_ptr<parallel::Communicator> inner, int fail_at)
      : Forwarding(std::move(inner)), fail_at_(fail_at) {}
  torch::Tensor all_to_all(const torch::Tensor& input) override {
    if (rank() == 1 && ++calls_ == fail_at_) throw std::runtime_error("out of memory on purpose");
    return inner_->all_to_all(input);
  }

 private:
  int fail_at_, calls_ = 0;
};

struct Case {
  int64_t frames, h, w;  // latent size: tokens = frames * h/2 * w/2
};

// Token counts 15, 20 and 27: each of 2, 3 and 4 ranks meets at least one that it does not divide.
const Case kCases[] = {{1, 6, 10}, {2, 4, 10}, {3, 6, 6}};

class SequenceParallel : public ::testing::TestWithParam<Family> {};

}  // namespace

TEST_P(SequenceParallel, TwoThreeAndFourRanksEqualOneDevice) {
  const Family f = GetParam();
  for (const Case& c : kCases) {
    const Inputs in = inputs(f, c.frames, c.h, c.w, uint64_t(c.frames * 100 + c.h));
    const torch::Tensor want = model(f)->predict(in.x, in.timesteps, in.text);
    for (int n : {2, 3, 4}) {
      SCOPED_TRACE(std::string(name_of(f)) + " " + std::to_string(c.frames) + "x" + std::to_string(c.h) + "x" +
                   std::to_string(c.w) + " on " + std::to_string(n) + " ranks");
      RankResults got;
      predict_on_ranks(f, n, in, got);
      for (int r = 0; r < n; ++r) {
        const double err = rel_err(got.out[size_t(r)], want);
        EXPECT_LE(err, kTol) << "rank " << r;
        if (r == 0)
          std::printf("%-16s %lldx%lldx%lld, %d ranks: max rel diff %.3g\n", name_of(f), (long long)c.frames,
                      (long long)c.h, (long long)c.w, n, err);
      }
    }
  }
}

// bfloat16, as on GPUs: the same exchanges in the compute dtype. The reordered fp32 sums inside the kernels differ
// far below a bfloat16 ulp (4e-3 relative), so the outputs mostly round to the same values (here: all of them);
// where a sum falls on a rounding boundary it moves by an ulp, and that can grow through the blocks.
TEST_P(SequenceParallel, BFloat16OnThreeRanksAgreesWithOneDevice) {
  const Family f = GetParam();
  const Inputs in = inputs(f, 2, 4, 10, 9);
  const torch::Tensor want = model(f, 0, torch::kBFloat16)->predict(in.x, in.timesteps, in.text);
  RankResults got;
  predict_on_ranks(f, 3, in, got, {}, torch::kBFloat16);
  const double err = rel_err(got.out[0], want);
  EXPECT_LE(err, 2e-2);
  std::printf("%-16s bfloat16, 3 ranks: max rel diff %.3g\n", name_of(f), err);
}

// Without the all-to-all each rank attends over its own tokens only: the comparison above must see it.
TEST_P(SequenceParallel, WithoutTheAllToAllTheResultDiffers) {
  const Family f = GetParam();
  const Inputs in = inputs(f, 2, 4, 10, 7);
  const torch::Tensor want = model(f)->predict(in.x, in.timesteps, in.text);
  RankResults got;
  predict_on_ranks(f, 2, in, got, [](auto c) { return std::make_shared<NoAllToAll>(c); });
  const double err = rel_err(got.out[0], want);
  EXPECT_GT(err, 100 * kTol);
  std::printf("%-16s without the all-to-all: max rel diff %.3g\n", name_of(f), err);
}

TEST_P(SequenceParallel, ADegreeThatDoesNotDivideTheHeadsListsTheValidOnes) {
  const Family f = GetParam();
  const Inputs in = inputs(f, 1, 4, 4, 3);
  EXPECT_EQ(model(f)->attention_heads(), kHeads);
  parallel::ThreadGroup five(std::vector<torch::Device>(5, torch::kCPU));
  auto comm = five.join(0).collectives;
  try {
    model(f)->predict(in.x, in.timesteps, in.text, comm.get());
    FAIL() << "no error";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("valid: 1, 2, 3, 4, 6, 12"), std::string::npos) << e.what();
  }
  // A group of one is the one-device path.
  parallel::ThreadGroup one({torch::kCPU});
  auto alone = one.join(0).collectives;
  EXPECT_TRUE(torch::equal(model(f)->predict(in.x, in.timesteps, in.text, alone.get()),
                           model(f)->predict(in.x, in.timesteps, in.text)));
}

// Rank 1 of 3 fails in the middle of the model: every rank must return, the others with ParallelError carrying
// rank 1's cause, long before the group's timeout, and the caller must see rank 1's own error.
TEST_P(SequenceParallel, ARankThatFailsMidModelEndsEveryRank) {
  const Family f = GetParam();
  const Inputs in = inputs(f, 2, 4, 10, 5);
  RankResults got;
  const auto start = std::chrono::steady_clock::now();
  try {
    predict_on_ranks(f, 3, in, got, [](auto c) { return std::make_shared<FailingRank>(c, 3); });
    FAIL() << "no error";
  } catch (const parallel::ParallelError& e) {
    ADD_FAILURE() << "the root cause, not a report of it, must come out: " << e.what();
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "out of memory on purpose");
  }
  const auto took = std::chrono::steady_clock::now() - start;
  EXPECT_LT(took, 10s) << std::chrono::duration<double>(took).count() << " s";
  for (int r : {0, 2})
    EXPECT_NE(got.errors[size_t(r)].find("rank 1 (cpu) failed: out of memory on purpose"), std::string::npos)
        << "rank " << r << ": " << got.errors[size_t(r)];
}

INSTANTIATE_TEST_SUITE_P(Families, SequenceParallel,
                         ::testing::Values(Family::wan, Family::cogvideox_rope, Family::cogvideox_sincos),
                         [](const ::testing::TestParamInfo<Family>& p) {
                           return std::string(p.param == Family::wan              ? "Wan"
                                              : p.param == Family::cogvideox_rope ? "CogVideoXRope"
                                                                                  : "CogVideoXSinCos");
                         });
