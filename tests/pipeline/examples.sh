#!/usr/bin/env bash
# The example scripts run as documented: file -> latents -> mp4, generation -> mp4, and the live round trip to a
# (fake) screen.
# usage: examples.sh SOURCE_DIR MODEL
set -euo pipefail
src=$1 model=$2
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
gst-launch-1.0 -q videotestsrc num-buffers=9 ! video/x-raw,width=64,height=48 ! videoconvert ! x264enc ! mp4mux ! \
  filesink location="$dir/in.mp4" 2>/dev/null || \
gst-launch-1.0 -q videotestsrc num-buffers=9 ! video/x-raw,width=64,height=48 ! videoconvert ! avenc_mpeg4 ! mp4mux ! \
  filesink location="$dir/in.mp4"
"$src/examples/file-to-latents.sh" "$model" "$dir/in.mp4" "$dir/clip.safetensors" 64 48
[ -f "$dir/clip.safetensors" ] || { echo "FAIL: no latent file"; exit 1; }
"$src/examples/latents-to-mp4.sh" "$model" "$dir/clip.safetensors" "$dir/out.mp4"
[ -s "$dir/out.mp4" ] || { echo "FAIL: no mp4"; exit 1; }
# Nine frames in, nine out.
n=$(gst-launch-1.0 -v filesrc location="$dir/out.mp4" ! qtdemux ! avdec_mpeg4 ! fakesink silent=false 2>&1 | grep -c 'chain' || true)
[ "$n" -eq 9 ] || { echo "FAIL: $n frames decoded from the mp4, 9 expected"; exit 1; }
# Generation: exactly the frames asked for, through the default generator and VAE.
"$src/examples/generate-to-mp4.sh" default default 10 "$dir/gen.mp4" steps=2 seed=1
n=$(gst-launch-1.0 -v filesrc location="$dir/gen.mp4" ! qtdemux ! avdec_mpeg4 ! fakesink silent=false 2>&1 | grep -c 'chain' || true)
[ "$n" -eq 10 ] || { echo "FAIL: $n frames generated into the mp4, 10 expected"; exit 1; }
# A live source never ends by itself: the sink stops after 6 frames and the script must then exit cleanly.
timeout 120 "$src/examples/round-trip-to-screen.sh" "$model" "fakesink num-buffers=6" >"$dir/live.log" 2>&1 \
  || { cat "$dir/live.log"; echo "FAIL: live round trip"; exit 1; }
echo PASS
