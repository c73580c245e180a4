#!/usr/bin/env bash
# gst-inspect-1.0 finds the plugin from the build tree, with and without a GPU in sight.
set -euo pipefail
out=$(gst-inspect-1.0 latent 2>&1) || { echo "$out"; echo "FAIL: gst-inspect-1.0 latent exited non-zero"; exit 1; }
echo "$out"
grep -q 'Name *latent' <<<"$out" || { echo "FAIL: plugin name missing"; exit 1; }
grep -q "Version *$1" <<<"$out" || { echo "FAIL: version $1 missing"; exit 1; }
grep -q 'Streaming causal video VAEs' <<<"$out" || { echo "FAIL: description missing"; exit 1; }
# Patch parallel is documented where users look: the devices property with a launch line, on both VAE elements.
for e in vaeencode vaedecode; do
  props=$(gst-inspect-1.0 "$e" 2>&1)
  grep -q 'devices *: Runs one stream across several devices' <<<"$props" || { echo "FAIL: $e lacks devices"; exit 1; }
  grep -q "$e devices=cuda:0,cuda:1" <<<"$props" || { echo "FAIL: $e devices has no launch line"; exit 1; }
  grep -q 'rank-timeout' <<<"$props" || { echo "FAIL: $e lacks rank-timeout"; exit 1; }
done
# plugin_init must not depend on CUDA: hide every GPU and load again through a fresh registry.
reg=$(mktemp -d)
trap 'rm -rf "$reg"' EXIT
CUDA_VISIBLE_DEVICES= GST_REGISTRY_1_0="$reg/registry.bin" gst-inspect-1.0 latent >/dev/null \
  || { echo "FAIL: plugin does not load with CUDA hidden"; exit 1; }
echo PASS
