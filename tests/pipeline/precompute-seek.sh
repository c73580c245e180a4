#!/usr/bin/env bash
# latent-precompute seeks near a clip's start instead of decoding its video from the beginning: the latent files
# are byte-identical to those of --no-seek (decoding from the start, cut at the clip by timestamp), while the
# frames decoded before a late clip's start drop from the whole prefix to about a second's worth; a source that
# cannot seek (YUV4MPEG) still decodes from the start.
# usage: precompute-seek.sh LATENT_PRECOMPUTE
set -euo pipefail
# The rank comes from the launcher's environment: a test run inside a Slurm job or torchrun is still one process.
unset RANK WORLD_SIZE LOCAL_RANK $(compgen -e | grep '^SLURM_' || true)
tool=$(realpath "$1")
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
cd "$dir"

# 20 s at 24 frames/s: MJPEG in AVI (every frame a keyframe), H.264 in MP4 with 2 s between keyframes where the
# encoder is installed, and raw frames in YUV4MPEG, which cannot seek.
src="videotestsrc num-buffers=480 pattern=ball ! video/x-raw,width=96,height=64,framerate=24/1"
gst-launch-1.0 -q $src ! jpegenc ! avimux ! filesink location=long.avi
gst-launch-1.0 -q $src ! y4menc ! filesink location=long.y4m
{
  echo "path,caption,start,end,fps"
  echo "long.avi,late,15.3,16.0,"
  echo "long.avi,to the end,19.0,,"
  echo "long.avi,resampled,12.5,13.5,10"
  echo "long.avi,resampled to a rate whose frames are not whole ns,12.5,13.5,30"
  echo "long.avi,near the start,0.5,1.0,"
  echo "long.y4m,cannot seek,15.3,16.0,"
} >m.csv
if gst-inspect-1.0 openh264enc >/dev/null 2>&1 && gst-inspect-1.0 openh264dec >/dev/null 2>&1; then
  gst-launch-1.0 -q $src ! openh264enc gop-size=48 ! h264parse ! mp4mux ! filesink location=long.mp4
  echo "long.mp4,between keyframes,15.3,16.0," >>m.csv
  echo "long.mp4,resampled between keyframes,11.1,12.0,7" >>m.csv
else
  echo "(no openh264enc/openh264dec: H.264 rows left out)"
fi
rows=$(($(wc -l <m.csv) - 1))

echo "== the latents equal those of decoding from the start"
"$tool" --verbose --width 64 --height 64 m.csv seek 2>seek.log || { cat seek.log; fail "the run with seeks"; }
"$tool" --verbose --no-seek --width 64 --height 64 m.csv noseek 2>noseek.log || { cat noseek.log; fail "--no-seek"; }
grep 'frames decoded before' seek.log
[ "$(wc -l <seek/index-rank0.jsonl)" -eq "$rows" ] || fail "index: $(cat seek/index-rank0.jsonl)"
diff <(sort seek/index-rank0.jsonl) <(sort noseek/index-rank0.jsonl) || fail "the index entries differ"
for f in noseek/*.safetensors; do
  cmp -s "$f" "seek/$(basename "$f")" || fail "$(basename "$f") differs with the seek"
done
echo "$rows clips byte-identical"

echo "== a late clip decodes about a second before its start, not the whole video"
before() { sed -n "s/.*row $1 (.*; \([0-9]*\) frames decoded before the clip's start.*/\1/p" "$2"; }
for row in 0 1 2 3; do
  with=$(before $row seek.log) without=$(before $row noseek.log)
  [ -n "$with" ] && [ -n "$without" ] || fail "no count for row $row"
  [ "$without" -ge 290 ] || fail "row $row: $without frames before the start without the seek"
  [ "$with" -le 60 ] || fail "row $row: $with frames decoded before the start with the seek (without: $without)"
done
grep -q "row 0 (long.avi): seek to 14.250 s" seek.log || fail "row 0 did not seek to the grid point 1 s before it"
grep -q "row 4 (long.avi): no seek: the clip starts near the video's start; 12 frames" seek.log ||
  fail "row 4: $(grep 'row 4' seek.log)"
grep -q "row 5 (long.y4m): no seek: the source cannot seek; 368 frames" seek.log ||
  fail "the YUV4MPEG row: $(grep 'row 5' seek.log)"
if [ -f long.mp4 ]; then
  for row in 6 7; do
    with=$(before $row seek.log)
    [ "$with" -le 60 ] || fail "row $row: $with frames before the start with the seek"
  done
fi
echo "PASS"
