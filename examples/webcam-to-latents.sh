#!/usr/bin/env bash
# Encodes a live camera into latent files of 64 latent frames (256 video frames) each, endlessly; stop with Ctrl-C
# (the file being written is committed on stop). usage: webcam-to-latents.sh MODEL [DEVICE] [OUTDIR]
set -euo pipefail
# MODEL "default" is the built-in default model (no model property); otherwise a folder or weights file.
model=$1 device=${2:-/dev/video0} outdir=${3:-.}
props=(); [ "$model" = default ] || props=(model="$model")
gst-launch-1.0 -e v4l2src device="$device" ! videoconvert ! videoscale ! video/x-raw,width=640,height=480 ! \
  vaeencode "${props[@]}" ! latentfilesink location="$outdir/cam-%05d.safetensors" max-frames=64
