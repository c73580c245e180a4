#!/usr/bin/env bash
# The example scripts run as documented: file -> latents -> mp4, generation -> mp4, and the live round trip to a
# (fake) screen; then the embedding application (examples/embed), built by meson, reads latents from an appsink.
# usage: examples.sh SOURCE_DIR MODEL ENCODE_TO_APPSINK [PIPELINE_FIXTURES]
set -euo pipefail
src=$1 model=$2 embed=$3 pipelines=${4:-}
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
# Text to video from a pipeline folder (a tiny random Wan one): the frames asked for, decoded by its own VAE.
if [ -n "$pipelines" ] && [ -f "$pipelines/stamp" ]; then
  "$src/examples/text-to-mp4.sh" "$pipelines/wan" "a red fox running through snow" 9 "$dir/fox.mp4" \
    width=96 height=64 steps=2 >"$dir/t2v.log" 2>&1 || { cat "$dir/t2v.log"; echo "FAIL: text-to-mp4.sh"; exit 1; }
  n=$(gst-launch-1.0 -v filesrc location="$dir/fox.mp4" ! qtdemux ! avdec_mpeg4 ! fakesink silent=false 2>&1 | grep -c 'chain' || true)
  [ "$n" -eq 9 ] || { echo "FAIL: $n frames in the text-to-video mp4, 9 expected"; exit 1; }
  # Live causal generation from the same folder (random weights run causally): an endless live stream that the
  # sink stops after 6 frames; the script must then exit cleanly.
  timeout 120 "$src/examples/live-generate.sh" "$pipelines/wan" "a red fox running through snow" \
    "fakesink num-buffers=6" width=96 height=64 kv-window=6 >"$dir/causal.log" 2>&1 \
    || { cat "$dir/causal.log"; echo "FAIL: live-generate.sh"; exit 1; }
  # Live video-to-video from the same folder (its random transformer run causally): 9 frames of videotestsrc
  # restyled, every frame back out (9 RGB frames of 96 x 64 in the file).
  timeout 120 "$src/examples/live-restyle.sh" "$pipelines/wan" "oil painting" "videotestsrc num-buffers=9" \
    "video/x-raw,format=RGB ! filesink location=$dir/restyled.rgb" "$pipelines/wan/vae" 96x64 >"$dir/restyle.log" \
    2>&1 || { cat "$dir/restyle.log"; echo "FAIL: live-restyle.sh"; exit 1; }
  n=$(stat -c %s "$dir/restyled.rgb")
  [ "$n" -eq $((9 * 96 * 64 * 3)) ] || { echo "FAIL: live-restyle.sh wrote $n bytes, 9 frames expected"; exit 1; }
else
  echo "SKIP: text-to-mp4.sh, live-generate.sh and live-restyle.sh (no pipeline fixtures: a build without the .venv)"
fi
# A live source never ends by itself: the sink stops after 6 frames and the script must then exit cleanly.
timeout 120 "$src/examples/round-trip-to-screen.sh" "$model" "fakesink num-buffers=6" >"$dir/live.log" 2>&1 \
  || { cat "$dir/live.log"; echo "FAIL: live round trip"; exit 1; }
# 17 frames: the first latent covers frame 0 alone, each further one 4 frames, so 5 latents of 16 x 8 x 8.
embed_fail() {
  cat "$dir/embed.log"
  echo "FAIL: embedding application: $*"
  exit 1
}
"$embed" 17 64 64 "$model" >"$dir/embed.log" 2>&1 || embed_fail "exit status $?"
n=$(grep -c '^latent [0-9]*: 16x8x8 F32' "$dir/embed.log" || true)
[ "$n" -eq 5 ] || embed_fail "$n latents of 16x8x8, 5 expected"
grep -q '^5 latents (16x8x8 F32) for 17 frames of 64x64, covering 17 frames$' "$dir/embed.log" \
  || embed_fail "no summary line of 5 latents covering 17 frames"
echo PASS
