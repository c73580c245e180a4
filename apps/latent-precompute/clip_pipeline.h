// One clip through GStreamer: decode, (resample the rate), resize + centre crop, vaeencode, latentfilesink, so the
// latent file has exactly latentfilesink's layout, with the clip's caption and source in its __metadata__.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>

#include "manifest.h"

namespace latent::precompute {

struct EncodeSettings {
  std::string model;  // a path; the caller resolves the default model, so every pipeline shares one loaded copy
  std::string device = "auto";
  std::string dtype = "auto";
  int width = 0, height = 0;  // 0: the source size (rounded to what the model takes)
  double fps = 0;             // 0: the source rate; a row's fps column overrides it
  uint64_t max_frames = 0;    // video frames per clip, 0: all
  double timeout_seconds = 3600;
  bool seek = true;  // seek near a clip's start where the source can; false: decode from the video's start
};

struct ClipResult {
  bool ok = false;
  std::string reason;    // why it failed, for errors.jsonl
  uint64_t frames = 0;   // video frames encoded
  uint64_t latents = 0;  // latent frames written
  double seconds = 0;
  std::string seek;            // where the clip seeked, or why it did not (for --verbose)
  uint64_t frames_before = 0;  // frames decoded before the clip's start that reached the pipeline
};

// Encodes `clip` into `out_file` (written under a temporary name and renamed into place by latentfilesink at EOS).
// A failed clip leaves no file of its own and removes none: out_file is only ever written whole.
ClipResult encode_clip(const ClipEntry& clip, const EncodeSettings& settings, const std::filesystem::path& out_file);

}  // namespace latent::precompute
