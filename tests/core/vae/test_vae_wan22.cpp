// Wan 2.2 (the TI2V-5B VAE: residual levels, 2x2 patchify) against diffusers' AutoencoderKLWan with
// is_residual=True, on a tiny random model of the published layout (tests/fixtures/gen_vae_fixtures.py).
#include <gtest/gtest.h>
#include <torch/types.h>

#include <fstream>
#include <sstream>

#include "io/json.h"
#include "latent/io/safetensors.h"
#include "latent/vae/sharded_streaming.h"
#include "latent/vae/streaming.h"
#include "latent/vae/vae.h"
#include "vae/families.h"
#include "vae_fixtures.h"

using namespace latent;
using namespace latent::testing;
namespace fs = std::filesystem;

namespace {

// Latents in fp32 on the CPU: the same operations as diffusers in other batch shapes (summation order only).
constexpr double kLatentTol = 1e-5;

std::shared_ptr<Vae> wan22() {
  static std::shared_ptr<Vae> model = load_vae(fixtures_dir() / "wan22");
  return model;
}

// Irregular push sizes, none of them the model's 1 + 4k chunking.
const std::vector<int64_t> kPushes = {2, 1, 7, 3, 6, 5};

EncodedLatents encode_mixed(const std::shared_ptr<Vae>& vae, const torch::Tensor& frames,
                            const std::vector<int64_t>& pushes, EncoderOptions opt = {}) {
  StreamingEncoder enc(vae, opt);
  std::vector<torch::Tensor> parts;
  EncodedLatents all;
  auto add = [&](EncodedLatents e) {
    if (!e.latents.defined()) return;
    parts.push_back(e.latents);
    all.real_frames.insert(all.real_frames.end(), e.real_frames.begin(), e.real_frames.end());
    all.first_frame.insert(all.first_frame.end(), e.first_frame.begin(), e.first_frame.end());
  };
  for (int64_t i = 0, k = 0; i < frames.size(0); i += pushes[size_t(k++) % pushes.size()])
    add(enc.push(frames.slice(0, i, i + pushes[size_t(k) % pushes.size()])));
  add(enc.finish());
  all.latents = torch::cat(parts, 0);
  return all;
}

torch::Tensor decode_mixed(const std::shared_ptr<Vae>& vae, const torch::Tensor& latents,
                           const std::vector<int64_t>& pushes, const std::vector<int64_t>& real = {}) {
  StreamingDecoder dec(vae);
  std::vector<torch::Tensor> parts;
  for (int64_t i = 0, k = 0; i < latents.size(0); ++k) {
    const int64_t n = std::min(pushes[size_t(k) % pushes.size()], latents.size(0) - i);
    std::vector<int64_t> r;
    if (!real.empty()) r.assign(real.begin() + i, real.begin() + i + n);
    auto f = dec.push(latents.slice(0, i, i + n), r);
    if (f.defined()) parts.push_back(f);
    i += n;
  }
  auto f = dec.finish();
  if (f.defined()) parts.push_back(f);
  return torch::cat(parts, 0);
}

// The largest difference in 8-bit levels once both are written as frames.
int max_level_diff(const torch::Tensor& a, const torch::Tensor& b) {
  return (frames_to_rgb8(a).to(torch::kInt) - frames_to_rgb8(b).to(torch::kInt)).abs().max().item<int>();
}

std::string read_text(const fs::path& p) {
  std::ifstream f(p);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

}  // namespace

TEST(Wan22Vae, LoadsTheDiffusersConfig) {
  LATENT_REQUIRE_FIXTURES();
  const VaeSpec& s = wan22()->spec();
  EXPECT_EQ(s.family, "wan2.2");
  EXPECT_EQ(s.model_id, "wan2.2");
  EXPECT_EQ(s.in_channels, 3);       // RGB frames; the 2x2 patchify to 12 channels happens inside
  EXPECT_EQ(s.latent_channels, 12);  // the fixture's z_dim, not the published 48
  EXPECT_EQ(s.temporal_factor, 4);
  EXPECT_EQ(s.spatial_factor, 16);
  EXPECT_EQ(s.size_multiple, 16);
  EXPECT_TRUE(s.clamp_output);
  const json::Value cfg = json::parse(read_text(fixtures_dir() / "wan22" / "config.json"));
  const auto& mean = cfg.find("latents_mean")->as_array();
  const auto& std = cfg.find("latents_std")->as_array();
  ASSERT_EQ(int64_t(mean.size()), s.latent_channels);
  for (size_t c = 0; c < mean.size(); ++c) {
    EXPECT_NEAR(s.latent_shift[int64_t(c)].item<double>(), mean[c].as_double(), 1e-6) << c;
    EXPECT_NEAR(s.latent_scale[int64_t(c)].item<double>(), 1 / std[c].as_double(), 1e-5) << c;
  }
}

TEST(Wan22Vae, EncodeMatchesDiffusersAtMixedPushes) {
  LATENT_REQUIRE_FIXTURES();
  auto ref = SafetensorsFile::open(fixtures_dir() / "wan22_cases.safetensors");
  for (const Case& c : cases(ref)) {
    auto frames = clip_frames(ref.tensor("input." + c.key()));
    auto want = to_diffusion(*wan22(), ref.tensor("mean." + c.key()));
    double worst = 0;
    for (const auto& pushes : std::vector<std::vector<int64_t>>{{c.t}, {1}, kPushes}) {
      auto got = encode_mixed(wan22(), frames, pushes);
      const double err = rel_err(got.latents, want);
      EXPECT_LE(err, kLatentTol) << c.key() << " pushes of " << pushes[0] << "...";
      worst = std::max(worst, err);
    }
    std::printf("wan2.2 encode %-9s latents %lld  max rel err %.3g\n", c.key().c_str(),
                static_cast<long long>(want.size(0)), worst);
  }
}

TEST(Wan22Vae, DecodeMatchesDiffusersAtMixedPushes) {
  LATENT_REQUIRE_FIXTURES();
  auto ref = SafetensorsFile::open(fixtures_dir() / "wan22_cases.safetensors");
  for (const Case& c : cases(ref)) {
    auto latents = to_diffusion(*wan22(), ref.tensor("mean." + c.key()));
    auto want = clip_frames(ref.tensor("decoded." + c.key()));
    double worst = 0;
    int levels = 0;
    // One latent per push is the reference's own cut; the 17-frame case checks it, the others mixed ones.
    auto plans = c.t == 17 ? std::vector<std::vector<int64_t>>{{1}, {2, 1, 3}}
                           : std::vector<std::vector<int64_t>>{{1000}, {3, 1}};
    for (const auto& pushes : plans) {
      auto got = decode_mixed(wan22(), latents, pushes);
      ASSERT_EQ(got.size(0), c.t) << c.key();
      worst = std::max(worst, rel_err(got, want));
      levels = std::max(levels, max_level_diff(got, want));
    }
    EXPECT_LE(worst, 1e-4) << c.key();
    EXPECT_LE(levels, 1) << c.key();
    std::printf("wan2.2 decode %-9s frames %lld  max rel err %.3g, 8-bit levels %d\n", c.key().c_str(),
                static_cast<long long>(c.t), worst, levels);
  }
}

TEST(Wan22Vae, FramesInEqualFramesOut) {
  LATENT_REQUIRE_FIXTURES();
  for (int64_t n : {1, 2, 4, 5, 6, 17, 20}) {
    auto frames = torch::rand({n, 3, 32, 48}) * 2 - 1;
    auto enc = encode_mixed(wan22(), frames, kPushes);
    const int64_t latents = 1 + (n - 1 + 3) / 4;
    ASSERT_EQ(enc.latents.size(0), latents) << n;
    EXPECT_EQ(enc.latents.sizes().slice(1), (std::vector<int64_t>{12, 2, 3}));
    int64_t real = 0;
    for (int64_t r : enc.real_frames) real += r;
    EXPECT_EQ(real, n);
    auto out = decode_mixed(wan22(), enc.latents, {2, 1}, enc.real_frames);
    EXPECT_EQ(out.size(0), n) << n << " frames in";
    EXPECT_EQ(out.sizes().slice(1), frames.sizes().slice(1));
  }
}

TEST(Wan22Vae, Uint8FramesAndSizeChecks) {
  LATENT_REQUIRE_FIXTURES();
  auto rgb = torch::randint(0, 256, {5, 32, 48, 3}, torch::kByte);
  auto as_float = rgb.permute({0, 3, 1, 2}).to(torch::kFloat) / 127.5 - 1;
  EXPECT_LE(rel_err(encode_all(wan22(), rgb, 5).latents, encode_all(wan22(), as_float, 5).latents), 1e-6);
  StreamingEncoder enc(wan22());
  try {
    enc.push(torch::zeros({1, 3, 40, 48}));  // a multiple of 8, not of 16
    FAIL() << "40x48 accepted";
  } catch (const ModelError& e) {
    EXPECT_NE(std::string(e.what()).find("multiples of 16"), std::string::npos) << e.what();
  }
}

TEST(Wan22Vae, OriginalCheckpointAndSingleFileLoadTheSameModel) {
  LATENT_REQUIRE_FIXTURES();
  auto frames = torch::rand({5, 3, 32, 48}) * 2 - 1;
  auto want = encode_all(wan22(), frames, 5).latents;
  // The .pth has no config: the widths, depth, patch and time levels come from the tensors, and a z_dim other
  // than the published 48 gets identity statistics; compare in VAE space.
  auto original = load_vae(fixtures_dir() / "wan22_original.pth");
  EXPECT_EQ(original->spec().family, "wan2.2");
  EXPECT_EQ(original->spec().spatial_factor, 16);
  auto raw = [](const std::shared_ptr<Vae>& v, const torch::Tensor& z) {
    return z / v->spec().latent_scale.reshape({1, -1, 1, 1}) + v->spec().latent_shift.reshape({1, -1, 1, 1});
  };
  EXPECT_LE(rel_err(raw(original, encode_all(original, frames, 5).latents), raw(wan22(), want)), 1e-6);
  auto z = encode_all(wan22(), frames, 5);
  EXPECT_LE(
      rel_err(decode_all(original, raw(wan22(), z.latents) * original->spec().latent_scale.reshape({1, -1, 1, 1})),
              decode_all(wan22(), z.latents)),
      1e-5);
  // bf16 weights with the config in __metadata__.
  auto single = load_vae(fixtures_dir() / "wan22_single_bf16.safetensors");
  EXPECT_EQ(single->spec().family, "wan2.2");
  EXPECT_LE(rel_err(encode_all(single, frames, 5).latents, want), 0.1);
}

TEST(Wan22Vae, DamagedWeightsAreAModelError) {
  LATENT_REQUIRE_FIXTURES();
  const fs::path dir = fs::temp_directory_path() / ("latent-wan22-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir / "folder");
  fs::copy_file(fixtures_dir() / "wan22" / "config.json", dir / "folder" / "config.json");
  auto src = SafetensorsFile::open(fixtures_dir() / "wan22" / "diffusion_pytorch_model.safetensors");
  auto error_of = [](const fs::path& p) -> std::string {
    try {
      load_vae(p);
    } catch (const ModelError& e) {
      return e.what();
    } catch (const std::exception& e) {
      return std::string("not a ModelError: ") + e.what();
    }
    return "loaded";
  };
  {  // a tensor missing, one of another shape
    SafetensorsWriter w(dir / "folder" / "diffusion_pytorch_model.safetensors");
    for (const auto& n : src.names()) {
      if (n == "decoder.up_blocks.1.upsampler.time_conv.weight") continue;
      w.write(
          n, n == "encoder.down_blocks.1.downsampler.resample.1.weight" ? torch::zeros({16, 16, 3, 1}) : src.tensor(n));
    }
    w.commit();
  }
  const std::string msg = error_of(dir / "folder");
  EXPECT_NE(msg.find("weights do not match the model"), std::string::npos) << msg;
  EXPECT_NE(msg.find("decoder.up_blocks.1.upsampler.time_conv.weight"), std::string::npos) << msg;
  EXPECT_NE(msg.find("encoder.down_blocks.1.downsampler.resample.1.weight is [16, 16, 3, 1]"), std::string::npos)
      << msg;
  // Files cut short: an original checkpoint is a ModelError, a safetensors file the reader's own error; both name
  // the file.
  fs::copy_file(fixtures_dir() / "wan22_original.pth", dir / "cut.pth");
  fs::resize_file(dir / "cut.pth", fs::file_size(dir / "cut.pth") / 2);
  const std::string cut_pth = error_of(dir / "cut.pth");
  EXPECT_NE(cut_pth.find("cut.pth: not a readable torch.save checkpoint"), std::string::npos) << cut_pth;
  fs::copy_file(fixtures_dir() / "wan22_single_bf16.safetensors", dir / "cut.safetensors");
  fs::resize_file(dir / "cut.safetensors", fs::file_size(dir / "cut.safetensors") / 2);
  try {
    load_vae(dir / "cut.safetensors");
    ADD_FAILURE() << "a truncated file loaded";
  } catch (const SafetensorsError& e) {
    EXPECT_NE(std::string(e.what()).find("cut.safetensors"), std::string::npos) << e.what();
  }
  // A Wan 2.2 config over Wan 2.1 weights.
  fs::create_directories(dir / "mixed");
  fs::copy_file(fixtures_dir() / "wan22" / "config.json", dir / "mixed" / "config.json");
  fs::copy_file(fixtures_dir() / "wan" / "diffusion_pytorch_model.safetensors",
                dir / "mixed" / "diffusion_pytorch_model.safetensors");
  const std::string mixed = error_of(dir / "mixed");
  EXPECT_NE(mixed.find("weights do not match the model"), std::string::npos) << mixed;
  fs::remove_all(dir);
}

// The shortcuts carry nothing between chunks: what a stream holds stays the same however long the clip runs.
TEST(Wan22Vae, StateDoesNotGrowWithTheClip) {
  LATENT_REQUIRE_FIXTURES();
  StreamingEncoder enc(wan22());
  StreamingDecoder dec(wan22());
  std::vector<size_t> enc_bytes, dec_bytes;
  for (int i = 0; i < 6; ++i) {
    auto e = enc.push(torch::rand({4, 3, 32, 48}) * 2 - 1);
    if (e.latents.defined()) dec.push(e.latents);
    if (i >= 2) {
      enc_bytes.push_back(enc.state_bytes());
      dec_bytes.push_back(dec.state_bytes());
    }
  }
  EXPECT_GT(enc_bytes[0], 0u);
  EXPECT_GT(dec_bytes[0], 0u);
  for (size_t i = 1; i < enc_bytes.size(); ++i) {
    EXPECT_EQ(enc_bytes[i], enc_bytes[0]);
    EXPECT_EQ(dec_bytes[i], dec_bytes[0]);
  }
}

// Bands of latent rows stay whole 2x2 blocks at every level, so the patchify and the shortcuts need no halo; the
// convolutions and the attention exchange rows as for Wan 2.1.
TEST(Wan22Vae, PatchParallelEqualsOneDevice) {
  LATENT_REQUIRE_FIXTURES();
  auto frames = torch::rand({9, 3, 48, 32}) * 2 - 1;  // 3 latent rows
  auto want = encode_mixed(wan22(), frames, kPushes);
  auto want_x = decode_mixed(wan22(), want.latents, {2, 1});
  for (int ranks : {2, 3}) {
    std::vector<std::shared_ptr<const Vae>> models(size_t(ranks), wan22());
    ShardedEncoder enc(models);
    std::vector<torch::Tensor> parts;
    for (int64_t i = 0; i < frames.size(0); i += 4)
      if (auto e = enc.push(frames.slice(0, i, i + 4)); e.latents.defined()) parts.push_back(e.latents);
    if (auto e = enc.finish(); e.latents.defined()) parts.push_back(e.latents);
    EXPECT_LE(rel_err(torch::cat(parts, 0), want.latents), 1e-5) << ranks << " ranks";
    ShardedDecoder dec(models);
    std::vector<torch::Tensor> out;
    for (int64_t i = 0; i < want.latents.size(0); ++i)
      if (auto f = dec.push(want.latents.slice(0, i, i + 1)); f.defined()) out.push_back(f);
    if (auto f = dec.finish(); f.defined()) out.push_back(f);
    EXPECT_LE(rel_err(torch::cat(out, 0), want_x), 1e-5) << ranks << " ranks";
  }
}

TEST(Wan22Vae, ConfigSelectsTheFamily) {
  WeightSource src;
  src.config = ModelConfig{"AutoencoderKLWan", R"({"is_residual": true, "z_dim": 48})"};
  EXPECT_STREQ(detect_family(src).name, "wan2.2");
  src.config = ModelConfig{"AutoencoderKLWan", R"({"is_residual": false})"};
  EXPECT_STREQ(detect_family(src).name, "wan2.1");
  src.config = ModelConfig{"AutoencoderKLWan", R"({"z_dim": 16})"};
  EXPECT_STREQ(detect_family(src).name, "wan2.1");
}
