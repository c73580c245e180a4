#!/usr/bin/env bash
# Shows a test pattern after a trip through the VAE, live.  usage: round-trip-to-screen.sh MODEL [SINK]
# SINK is a sink element with its properties, e.g. "ximagesink sync=false".
set -euo pipefail
model=$1 sink=${2:-autovideosink}
gst-launch-1.0 videotestsrc is-live=true pattern=ball ! video/x-raw,width=320,height=176,framerate=12/1 ! \
  videoconvert ! vaeencode model="$model" ! vaedecode model="$model" ! videoconvert ! $sink  # SINK may carry properties
