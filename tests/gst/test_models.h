// The models the VAE element tests run: the shipped default and the diffusers-generated CogVideoX fixture.
// Needs LATENT_TEST_SOURCE_ROOT; include after the C++ standard headers and gst/check/gstcheck.h.
#pragma once

#include <filesystem>
#include <string>

namespace latent_test {

// Where the diffusers fixtures are (empty when the build had no .venv).
inline std::string fixtures() {
  const char* d = g_getenv("LATENT_VAE_FIXTURES");
  return d ? d : "";
}
inline bool have_fixtures() { return !fixtures().empty() && std::filesystem::exists(fixtures() + "/stamp"); }
// The shipped default model (Wan 2.1 architecture, 16 latent channels) is the Wan-family model of these tests;
// the unset model property means the same file.
inline std::string wan() { return LATENT_TEST_SOURCE_ROOT "/models/latent-tiny-wan.safetensors"; }
inline std::string cog() { return fixtures() + "/cogvideox"; }

}  // namespace latent_test
