#!/usr/bin/env bash
# latent-precompute on small generated clips with the default model: what it writes (index entries, latents equal
# to vaeencode ! latentfilesink's), bad input recorded while the run goes on, the exit status, resuming after
# kill -9 equals an uninterrupted run, rank shards and --devices add up to the whole, and peak memory that does not
# grow with the number of clips (LATENT_PRECOMPUTE_SCALE=1: 200 against 2,000 clips; otherwise 40 against 200).
# usage: precompute.sh LATENT_PRECOMPUTE
set -euo pipefail
# The rank comes from the launcher's environment: a test run inside a Slurm job or torchrun is still one process.
unset RANK WORLD_SIZE LOCAL_RANK $(compgen -e | grep '^SLURM_' || true)
tool=$(realpath "$1")
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
cd "$dir"

# Three clips of different lengths and patterns; MJPEG in AVI keeps exact timestamps.
for i in 1 2 3; do
  gst-launch-1.0 -q videotestsrc num-buffers=$((6 + 4 * i)) pattern=$i ! \
    video/x-raw,width=96,height=64,framerate=24/1 ! jpegenc ! avimux ! filesink location="clip$i.avi"
done
echo "not a video" >broken.avi
mkdir -p sub && cp clip1.avi "sub/with space.avi"
cat >m.csv <<'EOF'
path,caption,start,end
clip1.avi,"a caption, with a comma",,
clip2.avi,"two
lines and ""quotes""",,
sub/with space.avi,relative path with a space,,
missing.avi,no such file,,
broken.avi,not a video,,
clip3.avi,a time range,0.25,0.5
clip3.avi,bad,"x",
EOF

echo "== a manifest with good and bad rows"
set +e
"$tool" --width 64 --height 64 m.csv out >run.log 2>&1
rc=$?
set -e
cat run.log
[ $rc -eq 1 ] || fail "exit status $rc with failed clips, 1 expected"
[ "$(wc -l <out/index-rank0.jsonl)" -eq 4 ] || fail "index: $(cat out/index-rank0.jsonl)"
[ "$(wc -l <out/errors-rank0.jsonl)" -eq 3 ] || fail "errors: $(cat out/errors-rank0.jsonl)"
grep -q '"reason":"no such file"' out/errors-rank0.jsonl || fail "missing file not recorded"
grep -q '"path":"broken.avi"' out/errors-rank0.jsonl || fail "broken file not recorded"
grep -q '"reason":"manifest: column start' out/errors-rank0.jsonl || fail "malformed row not recorded"
grep -q '"caption":"two\\nlines and \\"quotes\\""' out/index-rank0.jsonl || fail "caption not kept: $(cat out/index-rank0.jsonl)"
grep -q '"frames":6,' out/index-rank0.jsonl || fail "the 0.25-0.5 s range is not 6 frames: $(cat out/index-rank0.jsonl)"
grep -q '4 clips done, 3 failed' run.log || fail "summary"

echo "== the latents equal vaeencode ! latentfilesink's"
file1=$(grep '"path":"clip1.avi"' out/index-rank0.jsonl | sed 's/.*"latent_file":"\([^"]*\)".*/\1/')
gst-launch-1.0 -q filesrc location=clip1.avi ! decodebin ! videoconvert ! videorate ! aspectratiocrop aspect-ratio=1/1 ! \
  videoscale ! video/x-raw,width=64,height=64 ! vaeencode ! latentfilesink location=direct.safetensors
if [ -n "${LATENT_PYTHON:-}" ]; then
  "$LATENT_PYTHON" - "out/$file1" direct.safetensors <<'EOF'
import sys
from safetensors import safe_open
a, b = (safe_open(p, "pt") for p in sys.argv[1:])
assert a.get_tensor("latents").equal(b.get_tensor("latents")), "latents differ"
m = a.metadata()
assert m["caption"] == "a caption, with a comma" and m["source"] == "clip1.avi", m
print("latents identical; metadata", {k: m[k] for k in ("caption", "source", "latent.model")})
EOF
fi

if [ -n "${LATENT_PYTHON:-}" ]; then
  echo "== examples/latent_dataset.py reads the output"
  PYTHONPATH="$LATENT_SOURCE_DIR/examples" "$LATENT_PYTHON" - out <<'EOF'
import json, sys
import torch
from latent_dataset import LatentDataset
ds = LatentDataset(sys.argv[1])
index = [json.loads(l) for l in open(sys.argv[1] + "/index-rank0.jsonl")]
assert len(ds) == len(index) == 4, len(ds)
for item, e in zip(ds, index):
    assert list(item["latents"].shape) == e["shape"], (item["latents"].shape, e["shape"])
    assert item["caption"] == e["caption"] and item["model"] == "latent-tiny-wan"
    assert item["timing"].shape[0] == e["shape"][0]
batches = list(torch.utils.data.DataLoader(ds, batch_size=None, shuffle=True))
assert sorted(b["caption"] for b in batches) == sorted(e["caption"] for e in index)
print("LatentDataset:", len(ds), "clips, shapes", [e["shape"] for e in index])
EOF
fi

echo "== a folder of videos, --max-frames and --fps"
"$tool" --width 64 --height 64 --max-frames 5 sub folder >/dev/null 2>&1 || fail "folder run"
[ "$(wc -l <folder/index-rank0.jsonl)" -eq 1 ] || fail "folder index: $(cat folder/index-rank0.jsonl)"
grep -q '"path":"with space.avi","caption":"",.*"frames":5,' folder/index-rank0.jsonl || fail "folder/max-frames: $(cat folder/index-rank0.jsonl)"
printf 'path,caption,fps\nclip2.avi,twelve a second,12\n' >fps.csv
"$tool" --width 64 --height 64 fps.csv fps >/dev/null 2>&1 || fail "fps run"
# 14 frames at 24/s last 0.58 s: 7 frames at 12/s, and videorate may add one to cover the last frame's time.
grep -qE '"frames":(7|8),' fps/index-rank0.jsonl || fail "14 frames at 24/s resampled to 12/s: $(cat fps/index-rank0.jsonl)"

echo "== a rerun skips what is done"
set +e
"$tool" --width 64 --height 64 m.csv out >rerun.log 2>&1
set -e
grep -q '0 clips done, 3 failed, 4 skipped' rerun.log || fail "rerun: $(cat rerun.log)"
[ "$(wc -l <out/index-rank0.jsonl)" -eq 4 ] || fail "the rerun added index entries"

# 30 distinct clips: three videos at ten start times.
{
  echo "path,caption,start"
  for s in 0 1 2 3 4 5 6 7 8 9; do for i in 1 2 3; do echo "clip$i.avi,clip $i from $s,0.0$s"; done; done
} >many.csv

echo "== kill -9 at random moments, then resume: the same result as one run"
"$tool" --width 64 --height 64 many.csv whole >/dev/null 2>&1
for k in 1 2 3; do
  "$tool" --width 64 --height 64 many.csv killed >/dev/null 2>&1 &
  pid=$!
  sleep "0.$((RANDOM % 9 + 1))"
  kill -9 $pid 2>/dev/null || true
  wait $pid 2>/dev/null || true
done
"$tool" --width 64 --height 64 many.csv killed >/dev/null 2>&1
sort whole/index-rank0.jsonl >a.txt
grep -v '^$' killed/index-rank0.jsonl | "${LATENT_PYTHON:-python3}" -c '
import json, sys
for line in sys.stdin:
    try:
        print(json.dumps(json.loads(line), separators=(",", ":"), ensure_ascii=False))
    except ValueError:
        pass  # the torn line of a kill
' | sort >b.txt
diff a.txt b.txt >/dev/null || fail "resumed index differs from an uninterrupted one: $(diff a.txt b.txt | head -5)"
[ "$(sort -u b.txt | wc -l)" -eq 30 ] || fail "duplicate or missing entries after resuming"
for f in whole/*.safetensors; do cmp -s "$f" "killed/$(basename "$f")" || fail "$(basename "$f") differs after resuming"; done
[ -z "$(find killed -name '.*' ! -name '.lock-rank*' -type f)" ] || fail "temporary files left behind: $(find killed -name '.*')"

echo "== two ranks at once and two devices add up to the whole"
"$tool" --width 64 --height 64 --rank 0 --world-size 2 many.csv shards >/dev/null 2>&1 &
RANK=1 WORLD_SIZE=2 "$tool" --width 64 --height 64 many.csv shards >/dev/null 2>&1 || fail "rank 1"
wait $! || fail "rank 0"
cat shards/index-rank0.jsonl shards/index-rank1.jsonl | sort | diff - a.txt >/dev/null ||
  fail "the shards' union is not the whole manifest"
if [ -n "${LATENT_PYTHON:-}" ]; then
  PYTHONPATH="$LATENT_SOURCE_DIR/examples" "$LATENT_PYTHON" -c '
import sys
from latent_dataset import LatentDataset
ds = LatentDataset(sys.argv[1])
assert len(ds) == 30 and len({e["latent_file"] for e in ds.entries}) == 30, len(ds)
' shards || fail "LatentDataset over the per-rank indexes"
fi
"$tool" --width 64 --height 64 --devices cpu,cpu many.csv two >/dev/null 2>&1
sort two/index-rank0.jsonl | diff - a.txt >/dev/null || fail "--devices cpu,cpu differs"

echo "== Slurm's task variables take torchrun's shards; torchrun's win when both are set"
SLURM_PROCID=1 SLURM_NTASKS=2 SLURM_LOCALID=1 "$tool" --width 64 --height 64 many.csv slurm >slurm.log 2>&1 ||
  fail "SLURM_PROCID=1: $(cat slurm.log)"
grep -q 'rank 1 of 2 (\$SLURM_PROCID/\$SLURM_NTASKS)' slurm.log || fail "the rank's source: $(head -3 slurm.log)"
diff <(sort slurm/index-rank1.jsonl) <(sort shards/index-rank1.jsonl) >/dev/null || fail "SLURM_PROCID=1 took another shard"
RANK=0 WORLD_SIZE=2 SLURM_PROCID=1 SLURM_NTASKS=2 "$tool" --width 64 --height 64 many.csv slurm >slurm.log 2>&1 ||
  fail "RANK=0 inside Slurm: $(cat slurm.log)"
diff <(sort slurm/index-rank0.jsonl) <(sort shards/index-rank0.jsonl) >/dev/null || fail "RANK=0 did not win over Slurm's"
for bad in "SLURM_PROCID=one SLURM_NTASKS=2" "SLURM_PROCID=2 SLURM_NTASKS=2" "SLURM_PROCID=1" \
  "SLURM_PROCID=0 SLURM_NTASKS=0" "SLURM_ARRAY_TASK_ID=3 SLURM_ARRAY_TASK_MIN=1 SLURM_ARRAY_TASK_MAX=9 SLURM_ARRAY_TASK_COUNT=3"; do
  set +e
  env $bad "$tool" --width 64 --height 64 many.csv slurm-bad >bad.log 2>&1
  rc=$?
  set -e
  [ $rc -eq 2 ] || fail "$bad: exit status $rc, 2 expected"
  grep -q 'latent-precompute: .*\$SLURM_' bad.log || fail "$bad: $(cat bad.log)"
  [ ! -e slurm-bad/index-rank0.jsonl ] || fail "$bad: it ran"
done

echo "== peak memory does not grow with the number of clips"
small=40 large=200
[ "${LATENT_PRECOMPUTE_SCALE:-0}" = 1 ] && small=200 large=2000
manifest() {
  echo "path,caption,start"
  for ((n = 0; n < $1; n++)); do echo "clip$((n % 3 + 1)).avi,clip $n,0.00$n"; done
}
manifest $small >small.csv
manifest $large >large.csv
/usr/bin/time -f %M -o small.rss "$tool" --width 64 --height 64 small.csv small >small.log 2>&1
/usr/bin/time -f %M -o large.rss "$tool" --width 64 --height 64 large.csv large >large.log 2>&1
tail -1 small.log
tail -1 large.log
a=$(cat small.rss) b=$(cat large.rss)
echo "peak RSS: $small clips $((a / 1024)) MiB, $large clips $((b / 1024)) MiB"
# Each clip is one pipeline torn down before the next; 10% covers allocator noise, while keeping anything per
# clip (a pipeline, a decoded frame of 64x64) over 5x more clips would exceed it.
[ $((b * 100)) -le $((a * 110)) ] || fail "peak RSS grew from $a KiB to $b KiB"
echo PASS
