#!/usr/bin/env bash
# An install works from its own prefix: `meson install` into a scratch DESTDIR, then the installed plugin, library
# and tools run with nothing of the build tree in sight (no build-tree plugin path, no LD_LIBRARY_PATH, no
# LATENT_* variables), and the default model is the installed copy. The tree is then moved and checked again, as
# a prefix moved after installation must keep working.
# usage: install.sh <build dir> <prefix> <libdir> <plugin dir> <bindir> <datadir> <torch lib dir> <gst plugins dir>
set -euo pipefail
build=$1 prefix=$2 libdir=$3 plugindir=$4 bindir=$5 datadir=$6 torch_lib=$7 gst_plugins=$8

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() {
  echo "FAIL: $*"
  exit 1
}

meson install -C "$build" --destdir "$tmp/root" --no-rebuild --quiet >"$tmp/install.log" 2>&1 ||
  {
    cat "$tmp/install.log"
    fail "meson install --destdir failed"
  }

gst_inspect=$(command -v gst-inspect-1.0)
gst_launch=$(command -v gst-launch-1.0)
# The source and sink of the test pipeline come from the system's GStreamer, copied alone so that no other plugin
# (an installed gst-latent among them) is in sight.
system_plugins=$tmp/system-plugins
mkdir -p "$system_plugins"
for p in coreelements videotestsrc; do
  cp "$gst_plugins/libgst$p.so" "$system_plugins/" || fail "system plugin $p not found in $gst_plugins"
done

n=0
# Checks the install under DESTDIR $1.
check() {
  local destdir=$1
  # Where meson puts an install directory under DESTDIR: options inside the prefix are relative to it.
  installed() { case $1 in /*) echo "$destdir$1" ;; *) echo "$destdir$prefix/$1" ;; esac }
  local lib plugins tools models plugin inspect precompute
  lib=$(installed "$libdir")
  plugins=$(installed "$plugindir")
  tools=$(installed "$bindir")
  models=$(installed "$datadir")/gst-latent/models
  plugin=$plugins/libgstlatent.so
  inspect=$tools/latent-inspect
  precompute=$tools/latent-precompute
  for f in "$plugin" "$lib/liblatentcore.so" "$inspect" "$precompute" "$models/latent-tiny-wan.safetensors" \
    "$models/latent-gen-small.safetensors"; do
    [ -e "$f" ] || fail "$f was not installed"
  done

  # Only what a user of the install would have: a plain PATH, a fresh registry, and the installed plugin dir as
  # the only plugin dir, unless a run adds the system plugins through $extra.
  local extra=
  clean() {
    n=$((n + 1))
    env -i PATH=/usr/local/bin:/usr/bin:/bin HOME="$tmp/home" \
      GST_PLUGIN_SYSTEM_PATH_1_0="$plugins" GST_PLUGIN_PATH_1_0="$plugins${extra:+:$extra}" \
      GST_REGISTRY_1_0="$tmp/registry-$n.bin" "$@"
  }

  echo "== RUNPATH of the installed binaries"
  local status=0 bin runpath resolved core e entries
  for bin in "$plugin" "$lib"/liblatentcore.so.*.*.* "$inspect" "$precompute"; do
    runpath=$(readelf -d "$bin" | sed -n 's/.*(\(RUNPATH\|RPATH\)).*\[\(.*\)\]/\2/p')
    echo "$bin: $runpath"
    case ":$runpath:" in *":$build"[:/]*) echo "FAIL: $bin names the build dir $build"; status=1 ;; esac
    # Each entry is relative to the binary or LibTorch's own directory (the .venv or -Dtorch_root): nothing else
    # of this machine's build may leak into an installed binary.
    IFS=: read -ra entries <<<"$runpath"
    # shellcheck disable=SC2016 # $ORIGIN is the loader's, not the shell's
    for e in "${entries[@]}"; do
      case $e in '$ORIGIN'* | "$torch_lib") ;; *) echo "FAIL: $bin has RUNPATH entry $e"; status=1 ;; esac
    done
    resolved=$(env -i ldd "$bin")
    if grep -q 'not found' <<<"$resolved"; then
      echo "FAIL: $bin has unresolved libraries without LD_LIBRARY_PATH:"
      grep 'not found' <<<"$resolved"
      status=1
    fi
    # The installed binaries must use the installed core library, not one of the build tree or the system.
    core=$(awk '/liblatentcore/ && $3 ~ /^\// {print $3}' <<<"$resolved")
    if [ -n "$core" ] && [ "$(realpath "$core")" != "$(realpath "$lib"/liblatentcore.so.*.*.*)" ]; then
      echo "FAIL: $bin loads $core, not the installed $lib/liblatentcore.so"
      status=1
    fi
  done
  [ $status -eq 0 ] || exit 1

  echo "== gst-inspect-1.0 latent (installed plugin only)"
  local out rc
  out=$(clean "$gst_inspect" latent 2>&1) || {
    echo "$out"
    fail "gst-inspect-1.0 latent does not load the installed plugin"
  }
  echo "$out"
  grep -q "Filename *$plugin" <<<"$out" || fail "gst-inspect-1.0 did not load $plugin"
  for e in vaeencode vaedecode videogen videorestyle latentfilesink latentfilesrc; do
    grep -qE "^ *$e:" <<<"$out" || fail "element $e missing"
  done

  echo "== installed latent-inspect"
  clean "$inspect" --runtime | grep -q LibTorch || fail "installed latent-inspect --runtime"
  clean "$inspect" "$models/latent-tiny-wan.safetensors" >/dev/null || fail "installed latent-inspect on the model"
  clean "$precompute" --help | grep -q MANIFEST || fail "installed latent-precompute --help"

  echo "== pipeline through the installed plugin with the default model"
  extra=$system_plugins
  set +e
  out=$(clean GST_DEBUG=latentmodel:4 GST_DEBUG_NO_COLOR=1 "$gst_launch" -v videotestsrc num-buffers=5 ! \
    video/x-raw,width=64,height=64 ! vaeencode ! vaedecode ! fakesink silent=false 2>&1)
  rc=$?
  set -e
  [ $rc -eq 0 ] || {
    echo "$out"
    fail "the pipeline failed (exit status $rc)"
  }
  grep 'loading ' <<<"$out"
  grep -q "loading $models/latent-tiny-wan.safetensors " <<<"$out" || fail "the default model was not loaded from $models"
  if grep 'loading ' <<<"$out" | grep -v "loading $models/"; then fail "a model was loaded from outside $models"; fi
  local frames
  frames=$(grep -c 'last-message = chain' <<<"$out" || true)
  [ "$frames" -eq 5 ] || fail "5 frames in, $frames frames out"

  echo "== generation through the installed plugin with the default generator and VAE"
  set +e
  out=$(clean GST_DEBUG=latentmodel:4 GST_DEBUG_NO_COLOR=1 "$gst_launch" -v videogen num-frames=6 steps=2 ! \
    vaedecode ! fakesink silent=false 2>&1)
  rc=$?
  set -e
  [ $rc -eq 0 ] || {
    echo "$out"
    fail "the generation pipeline failed (exit status $rc)"
  }
  grep -q "loading $models/latent-gen-small.safetensors " <<<"$out" || fail "the default generator was not loaded from $models"
  frames=$(grep -c 'last-message = chain' <<<"$out" || true)
  [ "$frames" -eq 6 ] || fail "num-frames=6 gave $frames frames"
}

check "$tmp/root"
echo "== the same install, moved"
mv "$tmp/root" "$tmp/moved"
check "$tmp/moved"
echo PASS
