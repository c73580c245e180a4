#include "launch_device.h"

#include <charconv>
#include <cstdlib>
#include <stdexcept>

namespace latent::gst {
namespace {

std::string variable(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

// The whole text must be the number: "1 " or "+1" are as wrong as "one", since the launcher that wrote them is not
// torchrun and its meaning is unknown.
int local_index(const char* name, const std::string& text) {
  int value = -1;
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (text.empty() || ec != std::errc() || ptr != end || value < 0)
    throw std::invalid_argument(std::string(name) + "='" + text +
                                "' is not a whole number; torchrun sets it to the process's index on its machine "
                                "(0, 1, ...). Fix the environment or set the device property");
  return value;
}

}  // namespace

LaunchVariables LaunchVariables::from_environment() {
  return {variable("WORLD_SIZE"), variable("RANK"), variable("LOCAL_RANK")};
}

std::string device_for_process(const std::string& requested, const LaunchVariables& env, int cuda_devices) {
  const bool unnamed = requested.empty() || requested == "auto" || requested == "cuda";
  if (!unnamed || !env.present() || cuda_devices <= 0) return requested;
  const bool local = !env.local_rank.empty();
  if (!local && env.rank.empty()) return requested;
  const char* name = local ? "LOCAL_RANK" : "RANK";
  const int index = local_index(name, local ? env.local_rank : env.rank);
  if (index >= cuda_devices)
    throw std::invalid_argument(std::string(name) + "=" + std::to_string(index) + ", but this machine has " +
                                std::to_string(cuda_devices) + (cuda_devices == 1 ? " CUDA device" : " CUDA devices") +
                                ": start at most that many processes per machine (torchrun --nproc-per-node) or "
                                "set the device property");
  return "cuda:" + std::to_string(index);
}

}  // namespace latent::gst
