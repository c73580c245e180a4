#!/usr/bin/env bash
# latent-bench runs one stream over ranks as threads (--devices) and as processes launched the way torchrun does
# (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT), and every way gives the one-device output.
set -euo pipefail
bench=$1 model=$2
args=(--model "$model" --frames 9 --height 48 --width 32 --threads 1)
mean_abs() { sed -n 's/.*output mean |x| \([0-9.e+-]*\).*/\1/p'; }
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for dir in encode decode; do
  one=$("$bench" "${args[@]}" --direction "$dir" | mean_abs)
  threads=$("$bench" "${args[@]}" --direction "$dir" --devices cpu,cpu,cpu | mean_abs)
  port=$(free_port)
  pids=()
  for r in 0 1; do
    RANK=$r LOCAL_RANK=$r WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
      timeout 120 "$bench" "${args[@]}" --direction "$dir" >"$tmp/rank$r.out" 2>"$tmp/rank$r.err" &
    pids+=($!)
  done
  for i in 0 1; do
    wait "${pids[$i]}" || { cat "$tmp/rank$i.err"; echo "FAIL: $dir rank $i exited non-zero"; exit 1; }
  done
  procs=$(mean_abs <"$tmp/rank0.out")
  [ ! -s "$tmp/rank1.out" ] || { echo "FAIL: rank 1 printed a report"; exit 1; }
  echo "$dir: one device $one, 3 threads $threads, 2 processes $procs"
  # The cross-check is printed to 6 significant digits; patch parallel is within 1e-5 of one device.
  python3 - "$one" "$threads" "$procs" <<'PY'
import sys
one, *others = map(float, sys.argv[1:])
for o in others:
    assert abs(o - one) <= 1e-5 * abs(one), (one, o)
PY
done
# A rank whose peer never starts fails after its timeout instead of hanging.
port=$(free_port)
if RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port timeout 60 "$bench" "${args[@]}" --rank-timeout 2 \
  2>"$tmp/alone.err" >/dev/null; then
  echo "FAIL: a rank alone succeeded"; exit 1
fi
grep -q "only 1 of 2 ranks joined within 2" "$tmp/alone.err" || { cat "$tmp/alone.err"; echo "FAIL: no timeout message"; exit 1; }
echo PASS
