// Access to the diffusers reference fixtures (tests/fixtures/gen_vae_fixtures.py, run by the build from the .venv).
#pragma once

#include <gtest/gtest.h>
#include <torch/types.h>

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "io/json.h"
#include "latent/io/safetensors.h"
#include "latent/vae/streaming.h"

namespace latent::testing {

// Resident memory of this process, MiB.
inline double rss_mib() {
  std::ifstream statm("/proc/self/statm");
  long pages_total = 0, pages_resident = 0;
  statm >> pages_total >> pages_resident;
  return double(pages_resident) * double(::sysconf(_SC_PAGESIZE)) / (1 << 20);
}

// Scale runs (minutes on 2 cores) run where asked for: LATENT_SCALE_TESTS=1, which `meson test --suite scale`
// sets. Elsewhere they skip as "[opt-in]"; a smaller run of the same path is in the default suites.
inline bool scale_tests_enabled() {
  const char* v = std::getenv("LATENT_SCALE_TESTS");
  return v && std::string(v) == "1";
}

// A line of /proc/self/status ("VmHWM:", "VmRSS:"), MiB; -1 when absent.
inline double status_mib(const char* key) {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line))
    if (line.rfind(key, 0) == 0) return std::stod(line.substr(std::string(key).size())) / 1024.0;
  return -1;
}

// Resets the kernel's peak-RSS mark to the current RSS (Linux >= 4.0); false where that is not allowed.
inline bool reset_peak_rss() {
  std::ofstream clear("/proc/self/clear_refs");
  clear << "5";
  clear.flush();
  return bool(clear);
}

inline std::filesystem::path fixtures_dir() {
  const char* d = std::getenv("LATENT_VAE_FIXTURES");
  return d ? std::filesystem::path(d) : std::filesystem::path();
}

#define LATENT_REQUIRE_FIXTURES()                                                                   \
  do {                                                                                              \
    if (latent::testing::fixtures_dir().empty() ||                                                  \
        !std::filesystem::exists(latent::testing::fixtures_dir() / "stamp"))                        \
      GTEST_SKIP() << "no diffusers fixtures (LATENT_VAE_FIXTURES unset: build without the .venv)"; \
  } while (0)

struct Case {
  int64_t t, h, w;
  std::string key() const { return std::to_string(t) + "x" + std::to_string(h) + "x" + std::to_string(w); }
};

inline std::vector<Case> cases(const SafetensorsFile& f) {
  std::vector<Case> out;
  const json::Value list = json::parse(f.metadata().at("cases"));
  for (const auto& c : list.as_array()) {
    const auto& a = c.as_array();
    out.push_back({a[0].as_int64(), a[1].as_int64(), a[2].as_int64()});
  }
  return out;
}

// max |a - b| / max |b|: one number that does not blow up where the reference is near zero.
inline double rel_err(const torch::Tensor& a, const torch::Tensor& b) {
  auto af = a.to(torch::kDouble).cpu(), bf = b.to(torch::kDouble).cpu();
  EXPECT_EQ(af.sizes(), bf.sizes());
  if (af.sizes() != bf.sizes()) return 1e9;
  return (af - bf).abs().max().item<double>() / std::max(bf.abs().max().item<double>(), 1e-30);
}

// [1, 3, T, H, W] -> [T, 3, H, W]
inline torch::Tensor clip_frames(const torch::Tensor& x) { return x[0].permute({1, 0, 2, 3}).contiguous(); }

// The diffusers mean mapped into diffusion space, as the engine emits it.
inline torch::Tensor to_diffusion(const Vae& vae, const torch::Tensor& mean) {
  auto shift = vae.spec().latent_shift.reshape({1, -1, 1, 1, 1});
  auto scale = vae.spec().latent_scale.reshape({1, -1, 1, 1, 1});
  return ((mean - shift) * scale)[0].permute({1, 0, 2, 3});
}

// Encodes a whole clip through the streaming encoder, `step` frames per push.
inline EncodedLatents encode_all(const std::shared_ptr<Vae>& vae, const torch::Tensor& frames, int64_t step,
                                 EncoderOptions opt = {}) {
  StreamingEncoder enc(vae, opt);
  std::vector<torch::Tensor> parts;
  EncodedLatents all;
  auto add = [&](EncodedLatents e) {
    if (!e.latents.defined()) return;
    parts.push_back(e.latents);
    all.first_frame.insert(all.first_frame.end(), e.first_frame.begin(), e.first_frame.end());
    all.real_frames.insert(all.real_frames.end(), e.real_frames.begin(), e.real_frames.end());
  };
  for (int64_t i = 0; i < frames.size(0); i += step) add(enc.push(frames.slice(0, i, i + step)));
  add(enc.finish());
  all.latents = torch::cat(parts, 0);
  return all;
}

inline torch::Tensor decode_all(const std::shared_ptr<Vae>& vae, const torch::Tensor& latents,
                                const std::vector<int64_t>& real = {}, int64_t step = 1000) {
  StreamingDecoder dec(vae);
  std::vector<torch::Tensor> parts;
  for (int64_t i = 0; i < latents.size(0); i += step) {
    std::vector<int64_t> r;
    if (!real.empty()) r.assign(real.begin() + i, real.begin() + std::min<int64_t>(i + step, latents.size(0)));
    auto f = dec.push(latents.slice(0, i, i + step), r);
    if (f.defined()) parts.push_back(f);
  }
  auto f = dec.finish();
  if (f.defined()) parts.push_back(f);
  return torch::cat(parts, 0);
}

}  // namespace latent::testing
