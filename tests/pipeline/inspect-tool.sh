#!/usr/bin/env bash
# latent-inspect reports a valid file and refuses a hostile one with a message naming it, without crashing.
set -euo pipefail
tool=$1
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
# A header length of 2^62: far past the end of a 12-byte file.
printf '\x00\x00\x00\x00\x00\x00\x00\x40{}  ' >"$dir/hostile.safetensors"
set +e
msg=$("$tool" "$dir/hostile.safetensors" 2>&1)
rc=$?
set -e
echo "$msg"
[ $rc -eq 1 ] || { echo "FAIL: exit status $rc, expected 1"; exit 1; }
grep -q "hostile.safetensors: header length .* exceeds" <<<"$msg" || { echo "FAIL: message"; exit 1; }
"$tool" --runtime | grep -q 'LibTorch' || { echo "FAIL: --runtime"; exit 1; }
echo PASS
