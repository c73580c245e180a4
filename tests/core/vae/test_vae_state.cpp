// A stream's state belongs to one model and one direction. Handing a decoder's state to encode_chunk (or a state of
// another model) used to index past the state's slots; now it is a clear error and the state is left as it was.
#include <gtest/gtest.h>
#include <torch/types.h>

#include <string>

#include "latent/runtime/default_model.h"
#include "latent/vae/vae.h"

using namespace latent;

namespace {

std::shared_ptr<Vae> load_default() { return load_vae(find_default_model()); }

torch::Tensor frames(int64_t t) { return torch::rand({1, 3, t, 16, 16}) * 2 - 1; }
torch::Tensor latents(const Vae& vae, int64_t t) { return torch::randn({1, vae.spec().latent_channels, t, 2, 2}); }

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "no error";
}

void expect_has(const std::string& msg, const std::string& part) {
  EXPECT_NE(msg.find(part), std::string::npos) << "'" << part << "' not in: " << msg;
}

}  // namespace

TEST(VaeState, StatesKnowTheirModelAndDirection) {
  auto vae = load_default();
  auto enc = vae->new_encoder_state();
  auto dec = vae->new_decoder_state();
  EXPECT_EQ(enc->role(), VaeState::Role::encoder);
  EXPECT_EQ(dec->role(), VaeState::Role::decoder);
  EXPECT_EQ(enc->model(), vae.get());
  EXPECT_EQ(dec->model(), vae.get());
}

TEST(VaeState, DecoderStateGivenToEncodeIsRefused) {
  auto vae = load_default();
  auto dec = vae->new_decoder_state();
  const std::string msg = error_of([&] { vae->encode_chunk(*dec, frames(1)); });
  expect_has(msg, "encode_chunk: given a decoder's state");
  expect_has(msg, "new_encoder_state()");
  EXPECT_EQ(dec->bytes(), 0u) << "the refused call must not have touched the state";
  // The state still serves its own direction.
  EXPECT_EQ(vae->decode_chunk(*dec, latents(*vae, 1)).size(2), 1);
}

TEST(VaeState, EncoderStateGivenToDecodeIsRefused) {
  auto vae = load_default();
  auto enc = vae->new_encoder_state();
  expect_has(error_of([&] { vae->decode_chunk(*enc, latents(*vae, 1)); }), "decode_chunk: given an encoder's state");
}

TEST(VaeState, StateOfAnotherModelIsRefused) {
  auto a = load_default();
  auto b = load_default();  // same weights, another instance: its slot layout could differ, so it is refused too
  auto state = a->new_encoder_state();
  expect_has(error_of([&] { b->encode_chunk(*state, frames(1)); }), "the state was made by another model");
}

TEST(VaeState, InputOfTheWrongShapeIsRefused) {
  auto vae = load_default();
  auto enc = vae->new_encoder_state();
  expect_has(error_of([&] { vae->encode_chunk(*enc, torch::zeros({3, 1, 16, 16})); }), "input must be [B, 3, T, H, W]");
  expect_has(error_of([&] { vae->encode_chunk(*enc, torch::zeros({1, 4, 1, 16, 16})); }), "got [1, 4, 1, 16, 16]");
  expect_has(error_of([&] { vae->encode_chunk(*enc, torch::Tensor()); }), "got no tensor");
}
