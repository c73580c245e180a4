#!/usr/bin/env bash
# The offline GPU check as far as a machine without a GPU can take it: the check table and the report's parsers,
# the runner's stamps (a rerun skips what passed), its timeouts, expectations and stage budget, the bundle's
# package and wheel lists (--dry-run: nothing downloaded), a bundle of the source tree alone, tools/gpu-check
# from it with every GPU check skipping for its reason, and `meson setup` against a second torch root through
# gpu-check's own --torch (configure only: nothing is compiled).
# usage: gpu-bundle.sh SOURCE_ROOT [VENV_PYTHON]
set -euo pipefail
src=$(realpath "$1")
venv_py=${2:-}
if [ -z "$venv_py" ] || [ ! -x "$venv_py" ]; then
  echo "no .venv Python (run tools/setup): the bundle's wheels and the torch root come from it"
  exit 77
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
checks=$src/tools/gpu_checks.py

echo "== the table: every row well-formed, every case it names exists"
python3 "$checks" list >"$tmp/list.txt" || fail "the table does not read"
grep -q "^proof" "$tmp/list.txt" && grep -q "^speed" "$tmp/list.txt" && grep -q "^training" "$tmp/list.txt" ||
  fail "a stage without checks: $(cat "$tmp/list.txt")"
for c in $(grep -o 'tools/gpu-check-cases [a-z0-9-]*' "$src/tools/gpu-checks.tsv" | awk '{print $2}' | sort -u); do
  grep -q "^case_${c//-/_}()" "$src/tools/gpu-check-cases" || fail "the table names a case $c that does not exist"
done

echo "== the parsers"
mkdir -p "$tmp/parse/bench"
cp "$src/docs/perf/gpu-results.json" "$tmp/parse/bench/gpu-results.json"
cat >"$tmp/parse/meson.log" <<'EOF'
1/2 core          OK              41.20s
2/2 core-winograd OK              12.00s

Ok:                 2
Expected Fail:      0
Fail:               0
Unexpected Pass:    0
Skipped:            0
Timeout:            0
EOF
cat >"$tmp/parse/testlog.txt" <<'EOF'
[ RUN      ] BuildInfo.CudaTensor
tests/core/runtime/test_build_info.cpp:41: Skipped
no GPU on this machine
[  SKIPPED ] BuildInfo.CudaTensor (0 ms)
[  PASSED  ] 310 tests.
[  SKIPPED ] 1 test, listed below:
EOF
printf 'noise\nfigure clips_per_s 12.5\nfigure gpu0 NVIDIA_H100\nfigure clips_failed 0\n' >"$tmp/parse/figures.log"
PYTHONPATH="$src/tools" python3 - "$tmp/parse" <<'PY'
import os, sys
import gpu_checks as g
d = sys.argv[1]
m = g.parse_meson(open(os.path.join(d, "meson.log")).read(), d)
assert m["ok"] == 2 and m["fail"] == 0 and m["skipped"] == 0, m
assert m["no_gpu_skips"] == 1 and m["gtest_passed"] == 310, m
b = g.parse_bench("", os.path.join(d, "bench"))
assert abs(b["wan21_decode_81x480x832.s"] - 2.07) < 0.2, b  # gst-latent's Wan 2.1 decode on the H100 run
assert b["cogvideox_encode_49x480x720.diffusers_fps"] > 0 and "wan21_decode_81x480x832.peak_share" in b, b
f = g.parse_figures(open(os.path.join(d, "figures.log")).read(), d)
assert f == {"clips_per_s": 12.5, "gpu0": "NVIDIA_H100", "clips_failed": 0}, f
assert g.judge(g.parse_terms("clips_per_s>=10;missing<1;clips_failed==1"), f) == [
    ("clips_per_s >= 10", True), ("missing < 1", None), ("clips_failed == 1", False)]
t = g.parse_train("step 100 loss 0.51 PSNR 27.3\nstep 200 loss 0.42 PSNR 28.1\n", d)
assert t["step"] == 200 and t["loss"] == 0.42 and t["psnr_db"] == 28.1, t
for bad in ("x >> 1", "1 < x"):
    try:
        g.parse_terms(bad)
    except SystemExit:
        continue
    raise AssertionError(f"{bad!r} accepted")
print("parsers ok")
PY

echo "== the runner: results, stamps, a rerun skips what passed, timeouts, expectations, the stage budget"
count=$tmp/runs.txt
T=$'\t'
{
  echo "id${T}stage${T}needs${T}timeout${T}parser${T}expect${T}goal${T}command${T}proves"
  echo "ok${T}proof${T}${T}30${T}figures${T}x==1${T}y>=5${T}echo run >>$count; echo 'figure x 1'; echo 'figure y 3'${T}passes"
  echo "skips${T}proof${T}${T}30${T}none${T}-${T}-${T}echo 'no fixture here'; exit 77${T}skips"
  echo "fails${T}proof${T}${T}30${T}none${T}-${T}-${T}echo broken; exit 3${T}fails"
  echo "short${T}proof${T}${T}30${T}figures${T}x>1${T}-${T}echo 'figure x 1'${T}misses its expectation"
  echo "hangs${T}proof${T}${T}1${T}none${T}-${T}-${T}sleep 30${T}times out"
  echo "needs-gpu${T}proof${T}gpu${T}30${T}none${T}-${T}-${T}echo ran >>$count${T}needs a GPU"
  echo "later${T}speed${T}todo:not landed${T}30${T}none${T}-${T}-${T}true${T}waits for a feature"
  echo "big${T}training${T}${T}500${T}none${T}-${T}-${T}echo ran-big >>$count${T}too long for what is left"
  echo "first${T}training${T}${T}30${T}none${T}-${T}-${T}sleep 0${T}fits"
} >"$tmp/table.tsv"
run() { LATENT_GPUS=0 LATENT_GPU_PROBE="hidden" python3 "$checks" --table "$tmp/table.tsv" run "$tmp/r" --src "$src" --budget 100 "$@"; }
set +e
run --stage all >"$tmp/run1.txt" 2>&1
rc=$?
set -e
cat "$tmp/run1.txt"
[ $rc -eq 1 ] || fail "a run with failed checks exits $rc, 1 expected"
PYTHONPATH="$src/tools" python3 - "$tmp/r" <<'PY'
import json, os, sys
r = sys.argv[1]
doc = json.load(open(os.path.join(r, "report.json")))
by = {c["id"]: c for c in doc["checks"]}
want = {"ok": "pass", "skips": "skip", "fails": "fail", "short": "fail", "hangs": "fail", "needs-gpu": "skip",
        "later": "skip", "first": "pass", "big": "pending"}
got = {k: by[k]["status"] for k in want}
assert got == want, got
assert by["ok"]["figures"] == {"x": 1, "y": 3} and by["ok"]["goals"] == [["y >= 5", False]], by["ok"]
assert by["skips"]["reason"] == "no fixture here", by["skips"]
assert by["fails"]["reason"].startswith("exit status 3"), by["fails"]
assert by["short"]["reason"] == "expected x > 1", by["short"]
assert "timed out after 1 s" in by["hangs"]["reason"], by["hangs"]
assert by["needs-gpu"]["reason"] == "no GPU: hidden", by["needs-gpu"]
assert by["later"]["reason"] == "not yet possible: not landed", by["later"]
assert "rerun the stage" in by["big"]["reason"], by["big"]
assert os.path.exists(os.path.join(r, by["ok"]["log"])) and by["ok"]["seconds"] >= 0
assert sorted(os.listdir(os.path.join(r, "stamps"))) == ["first", "ok"]
md = open(os.path.join(r, "report.md")).read()
assert "| ok | proof | pass" in md and "no GPU: hidden" in md and "| y >= 5 | no |" in md, md
PY
run --stage proof >"$tmp/run2.txt" 2>&1 || true
grep -q "ok: passed earlier, not run again" "$tmp/run2.txt" || fail "the rerun ran a passed check again: $(cat "$tmp/run2.txt")"
[ "$(grep -c '^run$' "$count")" -eq 1 ] || fail "the passed check's command ran $(grep -c '^run$' "$count") times"
! grep -q "^ran" "$count" || fail "a skipped or pending check ran: $(cat "$count")"

echo "== the bundle's lists (--dry-run: nothing downloaded)"
if command -v apt-get >/dev/null && apt-cache show gstreamer1.0-plugins-good >/dev/null 2>&1; then
  "$src/tools/gpu-bundle" --dry-run >"$tmp/dry.txt"
  sed -n '1,2p' "$tmp/dry.txt"
  for p in libgstreamer1.0-dev gstreamer1.0-plugins-good gstreamer1.0-libav libsentencepiece-dev libgtest-dev \
    'diffusers==0.42.1' 'transformers==5.24.0' 'safetensors==0.8.0' 'meson==' 'ninja==' 'pip=='; do
    grep -q "^  $p" "$tmp/dry.txt" || fail "the bundle would lack $p"
  done
  for p in libc6 libstdc++6 python3 torch== nvidia- gcc-12 libllvm15; do
    ! grep -q "^  $p" "$tmp/dry.txt" || fail "the bundle would carry $p"
  done
else
  echo "no apt-get with Debian's package lists here: the package list is not checked"
fi

echo "== a bundle of the source tree alone, unpacked, and gpu-check from it on a machine without a GPU"
"$src/tools/gpu-bundle" "$tmp/b.tar" --worktree --no-debs --no-wheels
tar -xf "$tmp/b.tar" -C "$tmp"
b=$tmp/gst-latent-gpu
[ -x "$b/gpu-check" ] && [ -f "$b/manifest.json" ] && [ -f "$b/src/tools/gpu-checks.tsv" ] || fail "bundle layout: $(ls "$b")"
[ -f "$tmp/b.tar.manifest.json" ] && grep -q '"bundle_bytes"' "$tmp/b.tar.manifest.json" || fail "size not recorded"
CUDA_VISIBLE_DEVICES="" "$b/gpu-check" "$tmp/report" --torch "$venv_py" --build-dir "$tmp/build-gpu" >"$tmp/check.txt" 2>&1 ||
  { cat "$tmp/check.txt"; fail "gpu-check without a GPU exits non-zero"; }
cat "$tmp/check.txt"
python3 - "$tmp/report" <<'PY'
import json, os, sys
r = sys.argv[1]
doc = json.load(open(os.path.join(r, "report.json")))
assert doc["checks"] and doc["machine"]["gpus"] == 0, doc["machine"]
for c in doc["checks"]:
    assert c["status"] == "skip", c
    # The smoke checks that need the build but no GPU wait for the build stage, which needs a GPU here.
    without_build = c["id"] in ("plugin-loads", "roundtrip-cpu") and c["reason"].startswith("the build stage")
    assert without_build or c["reason"].startswith(("no GPU: torch.cuda.device_count() is 0", "not yet possible: ")), c
assert os.path.exists(os.path.join(r, "report.md"))
PY
[ ! -e "$tmp/build-gpu" ] || fail "gpu-check built without a GPU"
"$b/src/.venv/bin/python" -c 'import torch, diffusers' || fail "the bundle's venv does not see torch and diffusers"

echo "== meson setup against a second torch root, the torch package folder given to --torch (no compile)"
root=$("$venv_py" -c 'import os, torch; print(os.path.dirname(torch.__file__))')
"$b/gpu-check" "$tmp/report2" --configure-only --torch "$root" --build-dir "$tmp/build-configure" \
  >"$tmp/configure.txt" 2>&1 || { tail -30 "$tmp/configure.txt"; fail "configure against $root failed"; }
grep -q "^figure torch_root $root$" "$tmp/configure.txt" || fail "torch root not reported: $(tail "$tmp/configure.txt")"
grep -q "LibTorch *: *$root" "$tmp/configure.txt" || fail "meson's summary names another LibTorch"
[ -f "$tmp/build-configure/build.ninja" ] || fail "no build.ninja"
! find "$tmp/build-configure" -name '*.o' | grep -q . || fail "configure-only compiled something"
echo "PASS"
