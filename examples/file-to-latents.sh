#!/usr/bin/env bash
# Encodes a video file into a latent file.  usage: file-to-latents.sh MODEL IN.mp4 OUT.safetensors [WIDTH HEIGHT]
# The frames are scaled to WIDTH x HEIGHT (multiples of 8; default 832x480, Wan 2.1's native size).
set -euo pipefail
# MODEL "default" is the built-in default model (no model property); otherwise a folder or weights file.
model=$1 in=$2 out=$3 width=${4:-832} height=${5:-480}
props=(); [ "$model" = default ] || props=(model="$model")
gst-launch-1.0 -e filesrc location="$in" ! decodebin ! videoconvert ! videoscale ! \
  video/x-raw,width="$width",height="$height" ! vaeencode "${props[@]}" ! latentfilesink location="$out"
