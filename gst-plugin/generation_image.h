// videogen's image=: a picture decoded by GStreamer, scaled to the run's size and encoded by the model folder's
// VAE into the clip's first latent frame (image to video).
#pragma once

#include <torch/types.h>

#include <filesystem>
#include <string>

#include "latent/gen/denoiser.h"

namespace latent::gst {

// The first picture of `path` (any format GStreamer decodes) as float RGB [1, 3, height, width] in [-1, 1], made
// as diffusers' image processor makes it (2 * (u8 / 255) - 1), scaled with Lanczos where its size differs.
// Throws std::invalid_argument naming the file: missing, not a picture, or no frame in it.
torch::Tensor read_image(const std::string& path, int width, int height);

// The image's latents [1, C, 1, h, w] in diffusion space (the VAE's posterior mean, normalised by its latent shift
// and scale: the clip's first frame) from the VAE in `model_dir`/vae (or `model_dir` itself), run on `device` in
// float32. Throws std::invalid_argument where the VAE's latents are not the model's.
torch::Tensor encode_image(const torch::Tensor& rgb, const std::filesystem::path& model_dir,
                           const DenoiserSpec& spec, torch::Device device);

}  // namespace latent::gst
