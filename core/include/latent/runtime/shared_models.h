// Sharing loaded models between streams: an encoder and a decoder of the same model on the same device hold one
// copy of the weights.
#pragma once

#include <filesystem>
#include <memory>

#include "latent/vae/vae.h"

namespace latent {

// The loaded model for (path, device, dtype), shared while anyone holds it and loaded again after the last
// holder let go. Thread-safe; concurrent first requests load once.
std::shared_ptr<const Vae> shared_vae(const std::filesystem::path& path, const LoadOptions& options);

}  // namespace latent
