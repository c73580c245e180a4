#!/usr/bin/env bash
# Live text to video with a causal few-step model (Self-Forcing, CausVid, LongLive, Krea Realtime): an endless
# stream, one block of latents at a time, decoded as it comes, on the pipeline clock. Set `prompt` on the element
# named "gen" while it plays (an application, or gst-launch's -m with a script) to switch prompts.
# usage: live-generate.sh MODEL_DIR PROMPT [SINK] [videogen properties...]
#   MODEL_DIR  a diffusers Wan 2.1 T2V folder (text encoder, tokenizer, transformer config, VAE), e.g.
#              /models/Wan2.1-T2V-1.3B-Diffusers for Self-Forcing, CausVid and LongLive
#   SINK       a sink element with its properties (default autovideosink)
#   e.g. live-generate.sh /models/Wan2.1-T2V-1.3B-Diffusers "a red fox running through snow" autovideosink \
#          transformer-weights=/models/self_forcing_dmd.pt device=cuda dtype=bfloat16 width=832 height=480
#        LongLive: transformer-weights=longlive_base.pt lora=lora.pt kv-window=12 sink-frames=3
set -euo pipefail
model=$1 prompt=$2 sink=${3:-autovideosink}
shift $(($# < 3 ? $# : 3))
gst-launch-1.0 videogen name=gen model="$model" prompt="$prompt" schedule=causal is-live=true "$@" ! \
  vaedecode model="$model/vae" ! videoconvert ! $sink  # SINK may carry properties
