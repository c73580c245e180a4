#!/usr/bin/env bash
# Text to video from a diffusers pipeline folder in one pipeline: the folder's text encoder, transformer and VAE,
# all run natively (no Python).
# usage: text-to-mp4.sh MODEL_DIR PROMPT FRAMES OUT.mp4 [videogen properties...]
#   e.g. text-to-mp4.sh /models/Wan2.1-T2V-1.3B-Diffusers "a red fox running through snow" 81 fox.mp4 \
#          width=832 height=480 device=cuda dtype=bfloat16
# FRAMES follows the VAE's rule (4k+1 for Wan 2.1 and CogVideoX; others are cut to exactly FRAMES). The clip
# schedule denoises all frames together, as diffusers' pipelines do; schedule=fifo or rolling makes longer videos
# in constant memory.
set -euo pipefail
# videogen posts "videogen-progress" messages from its first step; gst-launch -m prints every message, of which
# these become one line each ("progress: step 12 of 50, 1:24 left") and the rest are left out.
show_progress() {
  sed -u -E '/videogen-progress/{s/.*text=\(string\)"([^"]*)".*/progress: \1/;s/\\//g;b};/^Got message/d'
}
model=$1 prompt=$2 frames=$3 out=$4
shift 4
gst-launch-1.0 -m -e videogen model="$model" prompt="$prompt" schedule=clip num-frames="$frames" "$@" ! \
  vaedecode model="$model/vae" ! videoconvert ! avenc_mpeg4 bitrate=2000000 ! mp4mux ! filesink location="$out" 2>&1 | show_progress
