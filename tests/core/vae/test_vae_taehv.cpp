// TAEHV (core/src/vae/taehv.cpp) against the published taehv.py, run sequentially on random float16 weights with
// the published key names: weights and inputs regenerated at build time and checked, the reference's outputs
// committed in tests/fixtures/data/taehv/ (tests/fixtures/gen_taehv_fixtures.py).
#include <gtest/gtest.h>
#include <torch/types.h>

#include <cstdlib>
#include <fstream>

#include "latent/vae/streaming.h"
#include "latent/vae/vae.h"
#include "vae_fixtures.h"

using namespace latent;
using namespace latent::testing;
namespace fs = std::filesystem;

namespace {

// fp32 on the CPU from the same float16 values; the engine convolves a chunk's frames as one batch where the
// reference goes frame by frame, which changes summation order only (observed ~1e-6).
constexpr double kTol = 1e-4;

const char* const kModels[] = {"taew2_1", "taew2_2", "taew2_2_super"};

fs::path taehv_dir() {
  const char* d = std::getenv("LATENT_TAEHV_FIXTURES");
  return d ? fs::path(d) : fs::path();
}

#define REQUIRE_TAEHV_FIXTURES()                                                                  \
  do {                                                                                            \
    if (taehv_dir().empty() || !fs::exists(taehv_dir() / "stamp"))                                \
      GTEST_SKIP() << "no TAEHV fixtures (LATENT_TAEHV_FIXTURES unset: build without the .venv)"; \
  } while (0)

std::shared_ptr<Vae> model(const std::string& name, const char* ext = ".pth") {
  return load_vae(taehv_dir() / (name + ext));
}

// Frames pushed in pieces of these sizes, cycling, then finish().
EncodedLatents encode_pattern(const std::shared_ptr<Vae>& vae, const torch::Tensor& frames,
                              const std::vector<int64_t>& sizes) {
  StreamingEncoder enc(vae);
  std::vector<torch::Tensor> parts;
  EncodedLatents all;
  auto add = [&](EncodedLatents e) {
    if (!e.latents.defined()) return;
    parts.push_back(e.latents);
    all.real_frames.insert(all.real_frames.end(), e.real_frames.begin(), e.real_frames.end());
  };
  for (int64_t i = 0, k = 0; i < frames.size(0); i += sizes[size_t(k++) % sizes.size()])
    add(enc.push(frames.slice(0, i, i + sizes[size_t(k) % sizes.size()])));
  add(enc.finish());
  all.latents = torch::cat(parts, 0);
  return all;
}

const std::vector<std::vector<int64_t>> kPushPatterns = {{1}, {1000}, {3, 1, 5, 2}};

std::string describe(const std::vector<int64_t>& sizes) {
  std::string s;
  for (int64_t v : sizes) s += (s.empty() ? "" : ",") + std::to_string(v);
  return "pushes of " + s;
}

std::string load_error(const WeightSource& src) {
  try {
    load_vae(src);
  } catch (const ModelError& e) {
    return e.what();
  }
  return "no error";
}

}  // namespace

TEST(TaehvVae, ArchitectureComesFromTheShapes) {
  REQUIRE_TAEHV_FIXTURES();
  struct Want {
    const char* name;
    int64_t channels, spatial;
    const char* space;
  };
  for (const Want& w :
       {Want{"taew2_1", 16, 8, "wan2.1"}, Want{"taew2_2", 48, 16, "wan2.2"}, Want{"taew2_2_super", 48, 16, "wan2.2"}}) {
    auto vae = model(w.name);
    const VaeSpec& s = vae->spec();
    EXPECT_EQ(s.family, "taehv") << w.name;
    EXPECT_EQ(s.model_id, w.space) << w.name;
    EXPECT_EQ(s.latent_channels, w.channels) << w.name;
    EXPECT_EQ(s.spatial_factor, w.spatial) << w.name;
    EXPECT_EQ(s.temporal_factor, 4) << w.name;
    EXPECT_EQ(s.latent_shift.abs().max().item<float>(), 0.f);
    EXPECT_EQ(s.latent_scale.min().item<float>(), 1.f);
  }
  // The reference would build taew2_1's architecture for this name; the tensors say taew2_2 super.
  const fs::path renamed = fs::temp_directory_path() / ("taew2_1-" + std::to_string(::getpid()) + ".pth");
  fs::copy_file(taehv_dir() / "taew2_2_super.pth", renamed, fs::copy_options::overwrite_existing);
  auto renamed_vae = load_vae(renamed);
  fs::remove(renamed);
  EXPECT_EQ(renamed_vae->spec().latent_channels, 48);
  auto ref = SafetensorsFile::open(taehv_dir() / "taew2_2_super_cases.safetensors");
  auto got = decode_all(renamed_vae, ref.tensor("dec_in.2")[0]);
  EXPECT_LE((got.add(1).div(2) - ref.tensor("decoded.2")[0]).abs().max().item<double>(), kTol);
}

TEST(TaehvVae, EncodeMatchesTheReference) {
  REQUIRE_TAEHV_FIXTURES();
  for (const char* name : kModels) {
    auto vae = model(name);
    auto ref = SafetensorsFile::open(taehv_dir() / (std::string(name) + "_cases.safetensors"));
    for (const Case& c : cases(ref)) {
      auto frames = ref.tensor("input." + c.key())[0].mul(2).sub(1);  // [T, 3, H, W] in [-1, 1]
      auto want = ref.tensor("latents." + c.key())[0];                // [ceil(T/4), C, h, w]
      for (const auto& pattern : kPushPatterns) {
        auto got = encode_pattern(vae, frames, pattern);
        ASSERT_EQ(got.latents.size(0), (c.t + 3) / 4) << name << " " << c.key() << " " << describe(pattern);
        const double err = rel_err(got.latents, want);
        EXPECT_LE(err, kTol) << name << " " << c.key() << " " << describe(pattern);
        std::printf("%-14s encode %-9s %-20s latents %lld  max rel err %.3g\n", name, c.key().c_str(),
                    describe(pattern).c_str(), static_cast<long long>(got.latents.size(0)), err);
      }
    }
  }
}

TEST(TaehvVae, DecodeMatchesTheReference) {
  REQUIRE_TAEHV_FIXTURES();
  for (const char* name : kModels) {
    auto vae = model(name);
    auto ref = SafetensorsFile::open(taehv_dir() / (std::string(name) + "_cases.safetensors"));
    for (int64_t n : {1, 2, 3}) {
      auto latents = ref.tensor("dec_in." + std::to_string(n))[0];
      auto want = ref.tensor("decoded." + std::to_string(n))[0];  // [4n - 3, 3, H, W] in [0, 1]
      for (int64_t step : {1, 2, 1000}) {
        auto got = decode_all(vae, latents, {}, step).add(1).div(2);
        ASSERT_EQ(got.size(0), 4 * n - 3) << name << " " << n << " latents, pushes of " << step;
        const double err = (got - want).abs().max().item<double>();
        EXPECT_LE(err, kTol) << name << " " << n << " latents, pushes of " << step;
        std::printf("%-14s decode %lld latents, pushes of %-4lld frames %lld  max abs err %.3g\n", name,
                    static_cast<long long>(n), static_cast<long long>(step), static_cast<long long>(got.size(0)), err);
      }
    }
  }
}

TEST(TaehvVae, RoundTripKeepsFrameCounts) {
  REQUIRE_TAEHV_FIXTURES();
  auto vae = model("taew2_1");
  auto ref = SafetensorsFile::open(taehv_dir() / "taew2_1_cases.safetensors");
  // 4k + 1 frames come back whole; others lose what the reference loses (N -> ceil(N/4) -> 4 ceil(N/4) - 3).
  for (const Case& c : cases(ref)) {
    auto frames = ref.tensor("input." + c.key())[0].mul(2).sub(1);
    auto enc = encode_all(vae, frames, 2);
    auto out = decode_all(vae, enc.latents, enc.real_frames);
    EXPECT_EQ(out.size(0), 4 * ((c.t + 3) / 4) - 3) << c.key();
  }
}

// vaeencode's setting: the clip ends with the latents a decoder needs to give every frame back (the Wan count,
// 1 + ceil((N - 1) / 4)), the latents before the padding one the reference's, whatever the pushes.
TEST(TaehvVae, DecodableTailGivesEveryFrameBack) {
  REQUIRE_TAEHV_FIXTURES();
  auto vae = model("taew2_1");
  const torch::Tensor clip = torch::rand({13, 3, 16, 16}).mul(2).sub(1);
  EncoderOptions opt;
  opt.decodable_tail = true;
  for (int64_t n : {1, 4, 5, 8, 10, 11}) {
    const torch::Tensor frames = clip.slice(0, 0, n);
    const EncodedLatents plain = encode_all(vae, frames, 1000);
    for (int64_t step : {1, 1000}) {
      const EncodedLatents enc = encode_all(vae, frames, step, opt);
      const int64_t wan = 1 + (n - 1 + 3) / 4;
      ASSERT_EQ(enc.latents.size(0), wan) << n << " frames, pushes of " << step;
      EXPECT_LE((enc.latents.slice(0, 0, plain.latents.size(0)) - plain.latents).abs().max().item<double>(), 1e-5)
          << n << " frames, pushes of " << step;
      const torch::Tensor out = decode_all(vae, enc.latents, enc.real_frames);
      EXPECT_EQ(out.size(0), n) << n << " frames, pushes of " << step;
    }
  }
}

TEST(TaehvVae, PthAndSafetensorsLoadTheSame) {
  REQUIRE_TAEHV_FIXTURES();
  for (const char* name : kModels) {
    auto pth = model(name, ".pth"), st = model(name, ".safetensors");
    EXPECT_EQ(pth->spec().model_id, st->spec().model_id);
    auto ref = SafetensorsFile::open(taehv_dir() / (std::string(name) + "_cases.safetensors"));
    auto z = ref.tensor("dec_in.2")[0];
    EXPECT_TRUE(torch::equal(decode_all(pth, z), decode_all(st, z))) << name;
    auto frames = ref.tensor("input." + cases(ref)[2].key())[0].mul(2).sub(1);
    EXPECT_TRUE(torch::equal(encode_all(pth, frames, 4).latents, encode_all(st, frames, 4).latents)) << name;
  }
}

TEST(TaehvVae, HalfFilesCodeOneWay) {
  REQUIRE_TAEHV_FIXTURES();
  WeightSource src = read_weights(taehv_dir() / "taew2_1.safetensors");
  WeightSource encoder = src, decoder = src;
  std::erase_if(encoder.tensors, [](const auto& kv) { return kv.first.rfind("decoder.", 0) == 0; });
  std::erase_if(decoder.tensors, [](const auto& kv) { return kv.first.rfind("encoder.", 0) == 0; });
  auto ref = SafetensorsFile::open(taehv_dir() / "taew2_1_cases.safetensors");
  auto frames = ref.tensor("input.9x32x32")[0].mul(2).sub(1);
  auto enc = load_vae(encoder);
  EXPECT_LE(rel_err(encode_all(enc, frames, 9).latents, ref.tensor("latents.9x32x32")[0]), kTol);
  EXPECT_THROW(decode_all(enc, ref.tensor("dec_in.1")[0]), ModelError);
  auto dec = load_vae(decoder);
  EXPECT_EQ(dec->spec().latent_channels, 16);
  EXPECT_LE((decode_all(dec, ref.tensor("dec_in.2")[0]).add(1).div(2) - ref.tensor("decoded.2")[0])
                .abs()
                .max()
                .item<double>(),
            kTol);
  EXPECT_THROW(encode_all(dec, frames, 9), ModelError);
}

TEST(TaehvVae, DamagedFilesAreModelErrors) {
  REQUIRE_TAEHV_FIXTURES();
  // Truncated: the container cannot be read.
  for (const char* ext : {".pth", ".safetensors"}) {
    const fs::path whole = taehv_dir() / (std::string("taew2_1") + ext);
    const fs::path cut = fs::temp_directory_path() / ("taehv-cut-" + std::to_string(::getpid()) + ext);
    {
      std::ifstream in(whole, std::ios::binary);
      std::string bytes((std::istreambuf_iterator<char>(in)), {});
      std::ofstream(cut, std::ios::binary).write(bytes.data(), std::streamsize(bytes.size() / 2));
    }
    // A .pth reads as ModelError, a .safetensors as SafetensorsError (latent/io/weights.h); both name the file.
    if (std::string(ext) == ".pth") {
      EXPECT_THROW(load_vae(cut), ModelError);
    } else {
      EXPECT_THROW(load_vae(cut), SafetensorsError);
    }
    fs::remove(cut);
  }
  const WeightSource good = read_weights(taehv_dir() / "taew2_1.pth");
  {
    WeightSource src = good;
    src.tensors.erase("encoder.5.conv.2.weight");
    src.tensors.erase("decoder.13.conv.weight");
    const std::string msg = load_error(src);
    EXPECT_NE(msg.find("encoder.5.conv.2.weight"), std::string::npos) << msg;
    EXPECT_NE(msg.find("decoder.13.conv.weight"), std::string::npos) << msg;
  }
  {
    WeightSource src = good;
    src.tensors["decoder.9.conv.0.weight"] = torch::zeros({128, 128, 3, 3}, torch::kHalf);
    const std::string msg = load_error(src);
    EXPECT_NE(msg.find("decoder.9.conv.0.weight"), std::string::npos) << msg;
  }
  {
    WeightSource src = good;  // 5 input channels: no patch size makes 3 p^2 of them
    src.tensors["encoder.0.weight"] = torch::zeros({64, 5, 3, 3}, torch::kHalf);
    const std::string msg = load_error(src);
    EXPECT_NE(msg.find("3 x patch^2"), std::string::npos) << msg;
  }
  {
    WeightSource src = good;  // an encoder for 48 latent channels beside a decoder for 16
    src.tensors["encoder.17.weight"] = torch::zeros({48, 64, 3, 3}, torch::kHalf);
    src.tensors["encoder.17.bias"] = torch::zeros({48}, torch::kHalf);
    const std::string msg = load_error(src);
    EXPECT_NE(msg.find("48 latent channels, the decoder for 1 and 16"), std::string::npos) << msg;
  }
  {
    WeightSource src = good;  // a tensor nobody reads
    src.tensors["decoder.23.weight"] = torch::zeros({1}, torch::kHalf);
    EXPECT_NE(load_error(src).find("decoder.23.weight"), std::string::npos);
  }
}
