#!/usr/bin/env bash
# The GPU pack (tools/gpu-pack, tools/gpu-pack-run) as far as a machine without a GPU takes it: the pack is made
# from this build and is under its size limit; its runner, started with an empty environment (`env -i`), unpacks
# it, finds torch through the given Python only, runs every check that needs no GPU (the plugin and its GStreamer
# from the pack alone, a CPU round trip) and reports every GPU check as skipped for "no GPU"; every library of
# every program in the pack resolves inside the pack, in torch's folder or in the base system, and no RUNPATH
# names a folder of this machine. Then the whole-run budget of the runner (--deadline): a check is cut when the
# time is up and what could not start is pending, both left for a rerun.
# usage: gpu-pack.sh SOURCE_ROOT BUILD_ROOT [VENV_PYTHON]
set -euo pipefail
src=$(realpath "$1")
build=$(realpath "$2")
venv_py=${3:-}
if [ -z "$venv_py" ] || [ ! -x "$venv_py" ]; then
  echo "no .venv Python (run tools/setup): the pack takes diffusers and torch's location from it"
  exit 77
fi
command -v patchelf >/dev/null || { echo "no patchelf (tools/setup installs it)"; exit 77; }
if ! readelf -d "$build/elements/libgstlatent.so" | grep -q libtorch_cuda.so; then
  echo "a CPU-only build (no libtorch_cuda): a GPU pack is made from a CUDA build"
  exit 77
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

echo "== making the pack"
t0=$(date +%s)
"$src/tools/gpu-pack" "$tmp/pack" --build-dir "$build" || fail "tools/gpu-pack failed"
echo "made in $(($(date +%s) - t0)) s"
bytes=$(du -sb "$tmp/pack" | cut -f1)
[ "$bytes" -le $((32 * 1048576)) ] || fail "the pack is $bytes bytes, over 32 MiB"
[ "$(ls "$tmp/pack" | sort | tr '\n' ' ')" = "pack.json payload.tar.xz run " ] ||
  fail "the pack holds $(ls "$tmp/pack"), not run, payload.tar.xz and pack.json"
[ -x "$tmp/pack/run" ] || fail "run is not executable"

echo "== the runner in an empty environment"
torch_lib=$("$venv_py" -c 'import os, torch; print(os.path.realpath(os.path.join(os.path.dirname(torch.__file__), "lib")))')
set +e
env -i PATH=/usr/bin:/bin HOME="$tmp" "$tmp/pack/run" --python "$venv_py" --keep --budget 240 "$tmp/out" \
  >"$tmp/run.log" 2>&1
rc=$?
set -e
cat "$tmp/run.log"
[ $rc -eq 0 ] || fail "the runner exited with $rc"
for f in report.md report.json logs.tar.gz; do [ -s "$tmp/out/$f" ] || fail "no $f in the results"; done
[ "$(ls "$tmp/out" | wc -l)" -le 8 ] || fail "more than 8 result files: $(ls "$tmp/out")"

"$venv_py" - "$tmp/out/report.json" <<'PY' || fail "the report does not hold"
import json, sys
r = json.load(open(sys.argv[1]))
by = {c["id"]: c for c in r["checks"]}
bad = []
for cid in ("plugin-loads", "roundtrip-cpu"):
    if by[cid]["status"] != "pass":
        bad.append(f"{cid}: {by[cid]['status']} ({by[cid]['reason']})")
if by["plugin-loads"]["figures"].get("plugins_outside_pack") != 0:
    bad.append(f"plugins from outside the pack: {by['plugin-loads']['figures']}")
if by["plugin-loads"]["figures"].get("latent_elements", 0) < 6:
    bad.append(f"the plugin's elements: {by['plugin-loads']['figures']}")
for c in r["checks"]:
    if c["status"] == "fail":
        bad.append(f"{c['id']} failed: {c['reason']}")
    if c["stage"] in ("headline",) and not c["reason"].startswith("no GPU"):
        bad.append(f"{c['id']}: {c['status']} ({c['reason']}), not skipped for no GPU")
    if c["id"] in ("gpu-info", "roundtrip-cuda", "causal-cuda-cpu", "restyle-cuda-cpu") and \
            not c["reason"].startswith("no GPU"):
        bad.append(f"{c['id']}: {c['status']} ({c['reason']}), not skipped for no GPU")
if r["machine"].get("gpus") != 0 or "pack" not in r["machine"]:
    bad.append(f"machine: {r['machine']}")
print("\n".join(bad) or "report: smoke passed on the CPU, every GPU check skipped for no GPU")
sys.exit(1 if bad else 0)
PY

echo "== every library resolves inside the pack, in torch's folder or in the base system"
root=$tmp/pack/unpacked/root
[ -d "$root" ] || fail "--keep left no unpacked pack at $root"
elfs=0
while IFS= read -r f; do
  head -c4 "$f" | LC_ALL=C grep -qa '^.ELF' || continue
  elfs=$((elfs + 1))
  rp=$(readelf -d "$f" | sed -n 's/.*R\(UN\)\{0,1\}PATH.*\[\(.*\)\]/\2/p')
  case ":$rp:" in *:/*) fail "$f has an absolute RUNPATH: $rp" ;; esac
  out=$(env -i ldd "$f" 2>&1) || true
  ! grep -q "not found" <<<"$out" || fail "$f: $(grep 'not found' <<<"$out" | head -3)"
  while read -r lib; do
    real=$(realpath "$lib")
    case $real in
      "$root"/*|"$torch_lib"/*|"$(dirname "$(dirname "$torch_lib")")"/nvidia/*) ;;
      */libc.so.*|*/libm.so.*|*/libstdc++.so.*|*/libgcc_s.so.*|*/libz.so.*|*/ld-linux*|*/libpthread.so.*|\
      */libdl.so.*|*/librt.so.*|*/libresolv.so.*|*/libutil.so.*) ;;
      *) fail "$f loads $lib ($real), outside the pack, torch and the base system" ;;
    esac
  done < <(awk '$2 == "=>" && $3 ~ /^\// {print $3}' <<<"$out")
done < <(find "$root" -path "$root/torch-lib" -prune -o -type f -print)
[ $elfs -ge 20 ] || fail "only $elfs ELF files in the pack"
echo "$elfs ELF files checked"

echo "== the runner's whole-run budget: a check cut at the deadline, the next pending"
cat >"$tmp/table.tsv" <<'EOF'
id	stage	needs	timeout	parser	expect	goal	command	proves
first	smoke		30	figures	-	-	echo "figure n 1"	passes at once
slow	headline		300	none	-	-	sleep 60	cut by the deadline
after	proof		30	none	-	-	true	never starts: no time left
EOF
set +e
python3 "$src/tools/gpu_checks.py" --table "$tmp/table.tsv" run "$tmp/budget" --stage smoke,headline,proof \
  --prebuilt --deadline 17 --results "$tmp/budget-out" >"$tmp/budget.log" 2>&1
set -e
cat "$tmp/budget.log"
python3 - "$tmp/budget-out/report.json" <<'PY' || fail "the deadline does not hold"
import json, sys
by = {c["id"]: c for c in json.load(open(sys.argv[1]))["checks"]}
want = {"first": "pass", "slow": "pending", "after": "pending"}
got = {k: by[k]["status"] for k in want}
assert got == want, got
assert by["slow"]["reason"].startswith("cut after"), by["slow"]["reason"]
assert by["slow"]["seconds"] < 20, by["slow"]["seconds"]
assert by["after"]["reason"].startswith("not started"), by["after"]["reason"]
print("deadline: first passed, slow cut at", by["slow"]["seconds"], "s, after pending")
PY
echo "OK"
