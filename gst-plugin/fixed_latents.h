// Sources whose latents are fixed (videogen's run, a latent file) negotiate by offering exactly those; where
// downstream takes none of them the error says what the source has and which latent spaces downstream takes,
// instead of basesrc's bare not-negotiated ("Internal data stream error").
#pragma once

#include <gst/base/gstbasesrc.h>

#include <string>

#include "latent_caps.h"

namespace latent::gst {

// Sets `ours` as the source's caps; false, with an ERROR message, where downstream accepts none of them. `has`
// starts the message: "The generator makes", "Latent file \"x.safetensors\" holds".
bool negotiate_fixed_latents(GstBaseSrc* src, const LatentCapsInfo& ours, const std::string& has);

// The latent spaces `caps` name, for a message: "'wan2.2'", "'a' or 'b'", or "latents of any model".
std::string latent_spaces_of(const GstCaps* caps);

}  // namespace latent::gst
