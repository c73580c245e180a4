#include "latent/runtime/default_model.h"

#include <dlfcn.h>

#include <cstdlib>

#include "latent/io/weights.h"

#ifndef LATENT_INSTALLED_MODELS_DIR
#error "the build defines LATENT_INSTALLED_MODELS_DIR"
#endif
#ifndef LATENT_SOURCE_MODELS_DIR
#error "the build defines LATENT_SOURCE_MODELS_DIR"
#endif

namespace fs = std::filesystem;

namespace latent {
namespace {

// <prefix>/<libdir>/liblatentcore.so -> <prefix>/share/gst-latent/models, wherever the prefix was moved to.
fs::path models_dir_beside_library() {
  Dl_info info{};
  if (!dladdr(reinterpret_cast<void*>(&find_default_model), &info) || !info.dli_fname) return {};
  // A library found through an $ORIGIN/.. RUNPATH keeps the ".." in its name (plugin dir/../liblatentcore.so),
  // which would otherwise send the walk up the tree from the plugin dir instead of the libdir.
  const fs::path lib = fs::absolute(fs::path(info.dli_fname)).lexically_normal().parent_path();
  // Debian-style multiarch libdirs (lib/x86_64-linux-gnu) sit one level deeper than lib or lib64.
  for (const fs::path& prefix : {lib.parent_path(), lib.parent_path().parent_path()}) {
    fs::path dir = prefix / "share" / "gst-latent" / "models";
    std::error_code ec;
    if (fs::is_directory(dir, ec)) return dir;
  }
  return {};
}

std::vector<fs::path> candidates(const char* env_name, const char* file) {
  if (const char* env = std::getenv(env_name); env && *env) return {fs::path(env)};
  std::vector<fs::path> out;
  if (fs::path dir = models_dir_beside_library(); !dir.empty()) out.push_back(dir / file);
  for (const char* dir : {LATENT_INSTALLED_MODELS_DIR, LATENT_SOURCE_MODELS_DIR}) {
    fs::path p = fs::path(dir) / file;
    bool seen = false;
    for (const auto& q : out) seen = seen || q == p;
    if (!seen) out.push_back(p);
  }
  return out;
}

fs::path first_existing(const std::vector<fs::path>& candidates, const char* what, const char* file) {
  std::string looked;
  for (const auto& p : candidates) {
    std::error_code ec;
    if (fs::is_regular_file(p, ec)) return p;
    looked += (looked.empty() ? "" : ", ") + p.string();
  }
  throw ModelError(std::string("the default ") + what + " " + file + " was not found (looked at " + looked + ")");
}

}  // namespace

std::vector<fs::path> default_model_candidates() { return candidates("LATENT_DEFAULT_MODEL", kDefaultModelFile); }

fs::path find_default_model() { return first_existing(default_model_candidates(), "model", kDefaultModelFile); }

std::vector<fs::path> default_generator_candidates() {
  return candidates("LATENT_DEFAULT_GENERATOR", kDefaultGeneratorFile);
}

fs::path find_default_generator() {
  return first_existing(default_generator_candidates(), "generator", kDefaultGeneratorFile);
}

}  // namespace latent
