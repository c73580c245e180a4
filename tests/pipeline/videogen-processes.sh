#!/usr/bin/env bash
# videogen under torchrun's environment: two gst-launch processes, RANK 0 and 1 of WORLD_SIZE 2, meet at rank 0's
# store and share each step's model calls (fifo partitions with the small generator; CFG with a tiny Wan pipeline
# folder and a prompt); each writes the latents, which must equal one process alone, bit for bit.
# usage: videogen-processes.sh PYTHON GENERATOR [PIPELINE_FIXTURES]
set -euo pipefail
py=$1 generator=$2 pipelines=${3:-}
dir=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$dir"' EXIT

same() {  # the latents of two latentfilesink files are equal
  "$py" - "$1" "$2" <<'PY'
import sys
from safetensors.torch import load_file
a, b = load_file(sys.argv[1]), load_file(sys.argv[2])
assert a.keys() == b.keys(), (a.keys(), b.keys())
for k in a:
    assert a[k].equal(b[k]), k
PY
}

check() {  # name, videogen properties, the plan for two processes
  local name=$1 props=$2 plan=$3
  # One thread everywhere: GEMMs split over another number of threads may sum in another order.
  OMP_NUM_THREADS=1 gst-launch-1.0 -q videogen $props ! latentfilesink location="$dir/$name-one.safetensors" >"$dir/$name-one.log" 2>&1 \
    || { cat "$dir/$name-one.log"; echo "FAIL: $name on one process"; exit 1; }
  local port=$((20000 + RANDOM % 20000)) pids=()
  for rank in 0 1; do
    RANK=$rank LOCAL_RANK=$rank WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port OMP_NUM_THREADS=1 \
      timeout 300 gst-launch-1.0 -q videogen $props parallel=$plan rank-timeout=120 ! \
      latentfilesink location="$dir/$name-rank$rank.safetensors" >"$dir/$name-rank$rank.log" 2>&1 &
    pids+=($!)
  done
  for rank in 0 1; do
    wait "${pids[$rank]}" || { cat "$dir/$name-rank$rank.log"; echo "FAIL: $name, rank $rank"; exit 1; }
  done
  for rank in 0 1; do
    same "$dir/$name-one.safetensors" "$dir/$name-rank$rank.safetensors" \
      || { echo "FAIL: $name, rank $rank differs from one process"; exit 1; }
  done
  echo "ok: $name"
}

check partitions "model=$generator width=64 height=48 steps=4 window=2 schedule=fifo num-frames=13" partitions=2
if [ -n "$pipelines" ] && [ -f "$pipelines/stamp" ]; then
  check cfg "model=$pipelines/wan prompt=fox width=96 height=64 steps=2 schedule=clip num-frames=17 guidance-scale=5" \
    auto
else
  echo "SKIP: cfg across processes (no pipeline fixtures)"
fi
# A plan for another number of processes is refused before any process waits for the others.
if WORLD_SIZE=2 RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=1 gst-launch-1.0 -q videogen model="$generator" \
    width=64 height=48 num-frames=5 parallel=partitions=3 ! fakesink >"$dir/bad.log" 2>&1; then
  echo "FAIL: partitions=3 on 2 processes was accepted"; exit 1
fi
grep -q "needs 3 processes (WORLD_SIZE); there are 2" "$dir/bad.log" || { cat "$dir/bad.log"; echo "FAIL: message"; exit 1; }
echo PASS
