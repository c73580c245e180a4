#!/usr/bin/env bash
# Generates video with videogen and decodes it into an mp4 as it is generated.
# usage: generate-to-mp4.sh GENERATOR VAE FRAMES OUT.mp4 [videogen properties...]
set -euo pipefail
# videogen posts "videogen-progress" messages from its first step; gst-launch -m prints every message, of which
# these become one line each ("progress: step 12 of 50, 1:24 left") and the rest are left out.
show_progress() {
  sed -u -E '/videogen-progress/{s/.*text=\(string\)"([^"]*)".*/progress: \1/;s/\\//g;b};/^Got message/d'
}
# GENERATOR and VAE "default" are the built-in default generator and VAE; otherwise a .pt2 package or
# latent-gen-small weights, and the VAE whose latent space the generator names.
gen=$1 vae=$2 frames=$3 out=$4
shift 4
gen_props=(); [ "$gen" = default ] || gen_props=(model="$gen")
vae_props=(); [ "$vae" = default ] || vae_props=(model="$vae")
gst-launch-1.0 -m -e videogen num-frames="$frames" "${gen_props[@]}" "$@" ! vaedecode "${vae_props[@]}" ! \
  videoconvert ! avenc_mpeg4 bitrate=2000000 ! mp4mux ! filesink location="$out" 2>&1 | show_progress
