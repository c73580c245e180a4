#!/usr/bin/env bash
# Shows a test pattern after a trip through the VAE, live.  usage: round-trip-to-screen.sh MODEL [SINK]
# SINK is a sink element with its properties, e.g. "ximagesink sync=false".
set -euo pipefail
# MODEL "default" is the built-in default model (no model property); otherwise a folder or weights file.
model=$1 sink=${2:-autovideosink}
props=(); [ "$model" = default ] || props=(model="$model")
gst-launch-1.0 videotestsrc is-live=true pattern=ball ! video/x-raw,width=320,height=176,framerate=12/1 ! \
  videoconvert ! vaeencode "${props[@]}" ! vaedecode "${props[@]}" ! videoconvert ! $sink  # SINK may carry properties
