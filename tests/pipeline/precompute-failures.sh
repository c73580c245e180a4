#!/usr/bin/env bash
# latent-precompute reports, never aborts, and keeps one dataset per folder: a full disk, a short write, an
# unwritable OUT_DIR end with exit status 3 and a message; a manifest given as a pipe is read once; a % in OUT_DIR
# is a plain character; a second process of the same rank is turned away while the first loses nothing; each
# caption of a video is its own file; a rerun with other settings is refused; a caption that is not UTF-8 fails
# its row only; a failed clip removes no file it did not write.
# usage: precompute-failures.sh LATENT_PRECOMPUTE
set -euo pipefail
# The rank comes from the launcher's environment: a test run inside a Slurm job or torchrun is still one process.
unset RANK WORLD_SIZE LOCAL_RANK $(compgen -e | grep '^SLURM_' || true)
tool=$(realpath "$1")
dir=$(mktemp -d)
trap 'chmod -R u+w "$dir"; rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
cd "$dir"
py=${LATENT_PYTHON:-python3}
run() { "$tool" --device cpu --width 64 --height 64 "$@"; }
# Runs the tool expecting exit status $1 and a message matching $2 on its stderr.
expect() {
  local want=$1 pattern=$2 rc=0
  shift 2
  run "$@" >out.log 2>&1 || rc=$?
  [ $rc -eq "$want" ] || { cat out.log; fail "exit status $rc, $want expected: $*"; }
  grep -qE "$pattern" out.log || { cat out.log; fail "no message matching '$pattern': $*"; }
}

for i in 1 2; do
  gst-launch-1.0 -q videotestsrc num-buffers=9 pattern=$i ! video/x-raw,width=64,height=64,framerate=24/1 ! jpegenc ! \
    avimux ! filesink location="clip$i.avi"
done
echo "not a video" >broken.avi
printf 'path,caption\nclip1.avi,one\nclip2.avi,two\n' >m.csv

echo "== the default device is auto, as for the elements"
"$tool" --help | grep -qE -- '--device D .*\(default: auto' || fail "the default device: $("$tool" --help | grep -- --device)"

echo "== a full disk: the index on /dev/full"
mkdir full
ln -s /dev/full full/index-rank0.jsonl
expect 3 'index-rank0.jsonl: cannot append a line: No space left on device' m.csv full
grep -q 'run the same command again' out.log || fail "no advice to rerun"
echo "== a full disk: the error log on /dev/full"
mkdir full-errors
ln -s /dev/full full-errors/errors-rank0.jsonl
printf 'path,caption\nmissing.avi,gone\n' >missing.csv
expect 3 'errors-rank0.jsonl: .*No space left on device' missing.csv full-errors

echo "== a short write: the index reaches the file size limit mid-line"
mkdir short
# 40 KiB allowed; the index holds all but 10 bytes of it (one blank-padded line that no reader takes), so the next
# line is cut short. SIGXFSZ is ignored by the tool: the write fails instead of killing it.
head -c $((40 * 1024 - 11)) /dev/zero | tr '\0' ' ' >short/index-rank0.jsonl
echo >>short/index-rank0.jsonl
(ulimit -f 40 && expect 3 'index-rank0.jsonl: cannot append a line: (short write|File too large)' m.csv short)
[ "$(stat -c %s short/index-rank0.jsonl)" -le $((40 * 1024)) ] || fail "the index grew past the limit"

echo "== an unwritable OUT_DIR"
touch plain-file
expect 3 'cannot create plain-file/out' m.csv plain-file/out
mkdir index-is-a-folder
mkdir index-is-a-folder/index-rank0.jsonl
expect 3 'index-rank0.jsonl: cannot open for appending' m.csv index-is-a-folder
mkdir read-only
chmod 555 read-only
if [ "$(id -u)" -ne 0 ]; then
  expect 3 'read-only.*(Permission denied|cannot)' m.csv read-only
else
  echo "(running as root, whom chmod does not stop: the read-only folder case is skipped)"
fi

echo "== a manifest given as a pipe is read once"
rc=0
run <(cat m.csv) piped >out.log 2>&1 || rc=$?
[ $rc -eq 0 ] || { cat out.log; fail "a piped manifest: exit status $rc"; }
[ "$(wc -l <piped/index-rank0.jsonl)" -eq 2 ] || fail "piped: $(cat piped/index-rank0.jsonl)"
grep -q '2 clips: 2 done' out.log || { cat out.log; fail "progress of a piped manifest"; }

echo "== a % in OUT_DIR is a plain character"
run m.csv 'out%20dir' >out.log 2>&1 || { cat out.log; fail "out%20dir"; }
[ "$(ls 'out%20dir'/*.safetensors | wc -l)" -eq 2 ] || fail "files not in out%20dir: $(ls)"
[ -z "$(find . -maxdepth 1 -type d -name 'out*' ! -name 'out%20dir')" ] || fail "files written elsewhere: $(ls)"

echo "== each caption of a video is its own file; a repeated row is one"
printf 'path,caption\nclip1.avi,a dog\nclip1.avi,a brown dog on a beach\nclip1.avi,a dog\nclip1.avi,"caf\xe9"\n' >caps.csv
expect 1 '2 clips done, 1 failed, 1 skipped' caps.csv caps
[ "$(wc -l <caps/index-rank0.jsonl)" -eq 2 ] || fail "index: $(cat caps/index-rank0.jsonl)"
grep -q '"reason":"manifest: the caption is not valid UTF-8' caps/errors-rank0.jsonl ||
  fail "the Latin-1 caption: $(cat caps/errors-rank0.jsonl)"
[ "$(ls caps/*.safetensors | wc -l)" -eq 2 ] || fail "files: $(ls caps)"
"$py" - caps <<'PY' || fail "index and files disagree"
import json, struct, sys
d = sys.argv[1]
for line in open(f"{d}/index-rank0.jsonl", encoding="utf-8"):
    e = json.loads(line)
    with open(f"{d}/{e['latent_file']}", "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        meta = json.loads(f.read(n).decode("utf-8"))["__metadata__"]
    assert meta["caption"] == e["caption"], (meta["caption"], e["caption"])
print("each index entry's caption is its file's")
PY

echo "== a rerun with other settings is refused"
expect 3 'encoded with max_frames all; this run asks for max_frames 5' --max-frames 5 caps.csv caps
expect 3 'encoded with size 64x64; this run asks for size 96x96' --width 96 --height 96 caps.csv caps
expect 1 '0 clips done, 1 failed, 3 skipped' caps.csv caps

echo "== a failed clip removes no file it did not write"
printf 'path,caption\nbroken.avi,not a video\n' >broken.csv
mkdir keep
run broken.csv keep >/dev/null 2>&1 || true
name=$(cd keep && ls -a | grep -v '^\.\{1,2\}$' | grep -vE '^(\.lock-rank0|settings\.json|index-rank0\.jsonl|errors-rank0\.jsonl)$' || true)
[ -z "$name" ] || fail "a failed clip left $name"
# The name the row maps to, written by someone else meanwhile: the failure must leave it alone.
"$py" - >target.txt <<'PY'
h = 1469598103934665603
for c in b"broken.avi\n-\n-\n-\nnot a video":
    h = ((h ^ c) * 1099511628211) % (1 << 64)
print(f"broken-{h:016x}.safetensors")
PY
echo "someone else's" >"keep/$(cat target.txt)"
expect 1 '0 clips done, 1 failed' broken.csv keep
[ "$(cat "keep/$(cat target.txt)")" = "someone else's" ] || fail "the failed clip removed another's file"

echo "== a second process of the same rank is turned away; the first loses nothing"
{
  echo "path,caption,start"
  for s in $(seq 0 39); do echo "clip$((s % 2 + 1)).avi,clip $s,0.00$s"; done
} >forty.csv
run forty.csv shared >first.log 2>&1 &
first=$!
for _ in $(seq 1 600); do
  [ -s shared/index-rank0.jsonl ] && break
  kill -0 $first 2>/dev/null || break
  sleep 0.05
done
[ -s shared/index-rank0.jsonl ] || { cat first.log; fail "the first run wrote nothing"; }
rc=0
run forty.csv shared >second.log 2>&1 || rc=$?
kill -0 $first 2>/dev/null || echo "(the first run ended before the second started: the lock was not contended)"
wait $first || { cat first.log; fail "the first run failed"; }
[ $rc -eq 3 ] || { cat second.log; fail "the second process: exit status $rc, 3 expected"; }
grep -q 'another latent-precompute of rank 0 is writing to shared' second.log || { cat second.log; fail "message"; }
[ "$(wc -l <shared/index-rank0.jsonl)" -eq 40 ] || fail "index lines: $(wc -l <shared/index-rank0.jsonl)"
[ "$(sort -u shared/index-rank0.jsonl | wc -l)" -eq 40 ] || fail "duplicate index lines"
[ "$(ls shared/*.safetensors | wc -l)" -eq 40 ] || fail "files: $(ls shared | wc -l)"
echo PASS
