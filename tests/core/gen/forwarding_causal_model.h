// A causal model that forwards every call to another and lets a test watch or steer them: what the generator and
// the restyler hand the model (timesteps, calls) and what they do when a call is interrupted or a model claims
// another size, without a model of its own.
#pragma once

#include <torch/types.h>

#include <memory>
#include <utility>

#include "gen/models/causal_model.h"
#include "latent/gen/denoiser.h"

namespace latent_test {

class ForwardingCausalModel : public latent::Denoiser, public latent::CausalModel {
 public:
  explicit ForwardingCausalModel(std::shared_ptr<const latent::Denoiser> inner)
      : Denoiser(inner->spec(), latent::LoadOptions{inner->device(), inner->dtype()}),
        inner_(std::move(inner)),
        causal_(*latent::causal_model(*inner_)) {}
  int64_t layers() const override { return causal_.layers(); }
  size_t kv_bytes_per_frame(int64_t height, int64_t width) const override {
    return causal_.kv_bytes_per_frame(height, width) * kv_scale_;
  }
  size_t call_bytes(int64_t frames, int64_t height, int64_t width) const override {
    return causal_.call_bytes(frames, height, width) * call_scale_;
  }
  // Claims `scale` times the inner model's key/value bytes (a model far larger than the fixture's).
  void scale_kv_bytes(size_t scale) { kv_scale_ = scale; }
  // Claims `scale` times the inner model's bytes of one call (a size whose activations do not fit).
  void scale_call_bytes(size_t scale) { call_scale_ = scale; }
  torch::Tensor predict_stored(const torch::Tensor& x, const torch::Tensor& timesteps, const torch::Tensor& text,
                               int64_t first_frame, latent::KvStore& store) const override {
    before_call(timesteps);
    torch::Tensor out = causal_.predict_stored(x, timesteps, text, first_frame, store);
    after_call();
    return out;
  }

 protected:
  virtual void before_call(const torch::Tensor& /*timesteps*/) const {}
  virtual void after_call() const {}
  torch::Tensor run(const torch::Tensor& x, const torch::Tensor& timesteps, const torch::Tensor& text) const override {
    return inner_->predict(x, timesteps, text);
  }

 private:
  std::shared_ptr<const latent::Denoiser> inner_;
  const latent::CausalModel& causal_;
  size_t kv_scale_ = 1, call_scale_ = 1;
};

}  // namespace latent_test
