#!/usr/bin/env bash
# GStreamer's leaks tracer over a full encode -> decode pipeline and a generate -> decode one: every GstObject and
# mini object the elements create (buffers, caps, events, pads) must be gone when gst-launch deinitialises
# GStreamer.
# usage: leaks.sh MODEL
set -euo pipefail
model=$1
log=$(mktemp)
trap 'rm -f "$log"' EXIT
GST_TRACERS=leaks GST_DEBUG='GST_TRACER:7' gst-launch-1.0 -q \
  videotestsrc num-buffers=9 ! video/x-raw,format=RGB,width=64,height=48 ! vaeencode model="$model" ! \
  vaedecode model="$model" ! fakesink >"$log" 2>&1 || { cat "$log"; echo "FAIL: pipeline failed"; exit 1; }
check() {
  grep -q 'leaks' "$log" || { cat "$log"; echo "FAIL: the leaks tracer did not run"; exit 1; }
  # Records of live objects, not the tracer's own format declarations (which mention %s).
  if grep -E 'object-alive, type-name=\(string\)[A-Za-z]' "$log"; then
    echo "FAIL: objects still alive at exit ($1)"
    exit 1
  fi
}
check "encode and decode"
# Generation into the decoder, with the default generator (whose latent space is the default VAE's).
GST_TRACERS=leaks GST_DEBUG='GST_TRACER:7' gst-launch-1.0 -q \
  videogen num-frames=9 steps=2 ! vaedecode ! fakesink >"$log" 2>&1 || { cat "$log"; echo "FAIL: videogen failed"; exit 1; }
check "videogen"
echo PASS
