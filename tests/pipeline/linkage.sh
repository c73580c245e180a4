#!/usr/bin/env bash
# Link-time contract: libtorch_cuda stays in NEEDED on a CUDA build (--as-needed would drop it), and every
# binary that loads torch carries an rpath to it (gst-plugin-scanner sets no LD_LIBRARY_PATH).
# usage: linkage.sh <with_cuda:true|false> <torch lib dir> <binary>...
set -euo pipefail
with_cuda=$1 torch_lib=$2
shift 2
status=0
for bin in "$@"; do
  dyn=$(readelf -d "$bin")
  if [ "$with_cuda" = true ] && ! grep -q 'NEEDED.*\[libtorch_cuda.so\]' <<<"$dyn"; then
    echo "FAIL: $bin lacks libtorch_cuda.so in NEEDED"; status=1
  fi
  if ! grep -qE "(RUNPATH|RPATH).*$torch_lib" <<<"$dyn"; then
    echo "FAIL: $bin has no rpath to $torch_lib"; status=1
  fi
  # The system libstdc++ must be searched before libtorch*, which exports a broken copy of std::filesystem.
  order=$(grep NEEDED <<<"$dyn" | grep -oE 'lib(stdc\+\+|torch[a-z_]*)\.so' | head -1)
  if [ "$order" != "libstdc++.so" ]; then
    echo "FAIL: $bin loads $order before libstdc++.so"; status=1
  fi
  # The binary must resolve every library with no help from the environment.
  if env -u LD_LIBRARY_PATH ldd "$bin" | grep -q 'not found'; then
    echo "FAIL: $bin has unresolved libraries:"; env -u LD_LIBRARY_PATH ldd "$bin" | grep 'not found'; status=1
  fi
  [ $status -eq 0 ] && echo "ok: $bin"
done
exit $status
