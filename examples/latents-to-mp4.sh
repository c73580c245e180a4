#!/usr/bin/env bash
# Decodes a latent file (or a numbered series, OUT-%05d.safetensors) into an mp4 with gst-libav's MPEG-4 encoder.
# usage: latents-to-mp4.sh MODEL IN.safetensors OUT.mp4
set -euo pipefail
# MODEL "default" is the built-in default model (no model property); otherwise a folder or weights file.
model=$1 in=$2 out=$3
props=(); [ "$model" = default ] || props=(model="$model")
gst-launch-1.0 -e latentfilesrc location="$in" ! vaedecode "${props[@]}" ! videoconvert ! \
  avenc_mpeg4 bitrate=4000000 ! mp4mux ! filesink location="$out"
