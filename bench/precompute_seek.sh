#!/usr/bin/env bash
# What a clip late in a long video costs latent-precompute, against one at its start: with the seek to the clip
# (the default) and with --no-seek (decoding from the video's start, as before seeking existed). Each figure is
# the median over REPEATS whole runs of one clip (process start, model load, decode, encode, write) of the wall
# time and of the CPU time (user + system, which others' load on a shared machine disturbs less), so the end
# minus the start is what the clip's position costs. docs/precompute.md has the measured figures.
#
#   bench/precompute_seek.sh build/apps/latent-precompute [MINUTES] [REPEATS]
#
# The video: MINUTES (default 10) of 320x240 at 24 frames/s, H.264 in MP4 with a keyframe every 2 s (openh264),
# else MJPEG in AVI; clips of 2 s, at 0-2 s and 3-1 s before the end, encoded at 160x120 with the default model.
set -euo pipefail
unset RANK WORLD_SIZE LOCAL_RANK $(compgen -e | grep '^SLURM_' || true)
tool=$(realpath "$1")
minutes=${2:-10}
repeats=${3:-3}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
cd "$dir"

frames=$((minutes * 60 * 24))
src="videotestsrc num-buffers=$frames pattern=ball ! video/x-raw,width=320,height=240,framerate=24/1"
if gst-inspect-1.0 openh264enc >/dev/null 2>&1; then
  video=long.mp4
  gst-launch-1.0 -q $src ! openh264enc gop-size=48 ! h264parse ! mp4mux ! filesink location=$video
else
  video=long.avi
  gst-launch-1.0 -q $src ! jpegenc ! avimux ! filesink location=$video
fi
length=$((minutes * 60))
printf 'path,caption,start,end\n%s,start,0,2\n' $video >start.csv
printf 'path,caption,start,end\n%s,end,%s,%s\n' $video $((length - 3)) $((length - 1)) >end.csv

median() { sort -n | awk '{a[NR] = $1} END {print a[int((NR + 1) / 2)]}'; }
TIMEFORMAT='%R %U %S'
run() {  # CSV OPTIONS... -> "wall cpu", each the median in seconds
  for r in $(seq "$repeats"); do
    rm -rf out
    { time "$tool" --width 160 --height 120 "${@:2}" "$1" out >/dev/null 2>&1; } 2>time.txt ||
      { echo "FAILED: $*" >&2; exit 1; }
    cat time.txt
  done >runs.txt
  echo "$(awk '{print $1}' runs.txt | median) $(awk '{print $2 + $3}' runs.txt | median)"
}

echo "video: $video, $minutes min, $frames frames of 320x240 at 24/s; $(nproc) CPU cores; median of $repeats runs"
printf '%-16s %24s %24s\n' "" "clip at 0 s: wall, CPU" "clip at end: wall, CPU"
for mode in seek --no-seek; do
  opts=()
  [ $mode = seek ] || opts=(--no-seek)
  read -r sw sc <<<"$(run start.csv "${opts[@]}")"
  read -r ew ec <<<"$(run end.csv "${opts[@]}")"
  printf '%-16s %11.1f s, %7.1f s %11.1f s, %7.1f s\n' "$mode" "$sw" "$sc" "$ew" "$ec"
done
