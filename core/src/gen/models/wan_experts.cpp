// Wan 2.2 A14B: two Wan transformers of one interface, the high-noise expert for the early steps and the low-noise
// expert for the rest, as diffusers' WanPipeline switches between `transformer` and `transformer_2`: the expert is
// chosen per call by its (integer) timestep against boundary_ratio x num_train_timesteps, and the sampler's state
// runs on across the switch because the generator never sees it.
//
// Where the device cannot hold both (each is ~27 GiB in bf16), only the expert in use is resident: the switch
// releases one and loads the other from its files. A clip switches once (high noise first), so that costs one load
// per clip.
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "gen/models/backends.h"
#include "latent/parallel/comm.h"
#include "latent/runtime/devices.h"

namespace latent {
namespace {

class WanExperts final : public Denoiser {
 public:
  WanExperts(ExpertLoader high, ExpertLoader low, DenoiserSpec spec, LoadOptions options, bool both_resident)
      : Denoiser(std::move(spec), options), load_{std::move(high), std::move(low)}, both_(both_resident) {
    resident_[0] = load_[0]();
    if (both_) resident_[1] = load_[1]();
  }

  int64_t attention_heads() const override { return held()->attention_heads(); }

 protected:
  torch::Tensor run(const torch::Tensor& x, const torch::Tensor& timesteps, const torch::Tensor& text) const override {
    return expert(timesteps)->predict(x, timesteps, text);
  }
  torch::Tensor run_sequence_parallel(const torch::Tensor& x, const torch::Tensor& timesteps, const torch::Tensor& text,
                                      parallel::Communicator& group) const override {
    return expert(timesteps)->predict(x, timesteps, text, &group);
  }

 private:
  std::shared_ptr<const Denoiser> held() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return resident_[0] ? resident_[0] : resident_[1];
  }

  // Every frame of a call has the same timestep (per_frame_timesteps is false, which predict() checks).
  std::shared_ptr<const Denoiser> expert(const torch::Tensor& timesteps) const {
    const double t = timesteps.select(1, 0).to(torch::kCPU, torch::kDouble).item<double>();
    const int which = t >= spec_.expert_boundary ? 0 : 1;
    std::lock_guard<std::mutex> lock(mutex_);
    if (!resident_[which]) {
      // The other is released before this one loads: both at once is what the device could not hold.
      resident_[1 - which].reset();
      resident_[which] = load_[which]();
    }
    return resident_[which];
  }

  ExpertLoader load_[2];
  bool both_;
  mutable std::mutex mutex_;
  mutable std::shared_ptr<const Denoiser> resident_[2];
};

}  // namespace

bool keep_both_experts(torch::Device device, size_t expert_bytes) {
  if (const char* policy = std::getenv("LATENT_RESIDENT_EXPERTS")) {
    if (std::strcmp(policy, "1") == 0) return false;
    if (std::strcmp(policy, "2") == 0) return true;
    throw ModelError(std::string("LATENT_RESIDENT_EXPERTS=") + policy + ": expected 1 or 2");
  }
  if (!device.is_cuda()) return true;
  // Both experts, with a quarter of one on top for the activations of a call.
  const size_t available = available_memory(device);
  return available == 0 || available > 2 * expert_bytes + expert_bytes / 4;
}

std::shared_ptr<Denoiser> make_wan_experts(ExpertLoader high, ExpertLoader low, DenoiserSpec spec,
                                           const LoadOptions& options, bool both_resident) {
  return std::make_shared<WanExperts>(std::move(high), std::move(low), std::move(spec), options, both_resident);
}

}  // namespace latent
