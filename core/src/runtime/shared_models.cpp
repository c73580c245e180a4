#include "latent/runtime/shared_models.h"

#include <map>
#include <mutex>
#include <tuple>

namespace latent {

std::shared_ptr<const Vae> shared_vae(const std::filesystem::path& path, const LoadOptions& options) {
  using Key = std::tuple<std::string, std::string, int>;
  static std::mutex mutex;
  static std::map<Key, std::weak_ptr<const Vae>> models;
  std::error_code ec;
  auto canonical = std::filesystem::weakly_canonical(path, ec);
  Key key{(ec ? path : canonical).string(), options.device.str(), static_cast<int>(options.dtype)};
  // Loading under the lock: a second stream asking for the same model waits instead of loading a copy.
  std::lock_guard<std::mutex> lock(mutex);
  if (auto it = models.find(key); it != models.end()) {
    if (auto model = it->second.lock()) return model;
  }
  std::shared_ptr<const Vae> model = load_vae(path, options);
  models[key] = model;
  return model;
}

}  // namespace latent
