"""tools/bench --memory --spatial: exact spatial bands of the Wan family against whole frames and diffusers' tiling.

For each model (the embedded default model, models/latent-tiny-wan.safetensors unpacked as build/bench-models/
default, and Wan 2.1 at its real widths with random weights: AutoencoderKLWan's defaults, base_dim 96, dim_mult
1-2-4-4, 2 res blocks, z_dim 16), each frame size, each clip length (1 frame -> 1 latent by default; 5 frames ->
2 latents with --frames 1 5) and each direction, these run side by side, each in its own process so that its peak
RSS is its own:

  gst-latent untiled         whole frames
  gst-latent band B          --band B: exact bands of B pixel rows (--bands, default 64 128 256)
  diffusers untiled          vae.encode / vae.decode
  diffusers enable_tiling()  its defaults (Wan: 256x256 tiles at a stride of 192, blended)

Reported: seconds, peak RSS above the loaded model (the harness's per-process VmHWM above the baseline), banded
time over untiled time, banded memory over diffusers' (untiled and tiled), and the largest |difference| of each
output against gst-latent's untiled one (diffusers' untiled output against it shows the two compute the same
thing; diffusers' tiled output differs by design, it blends overlapping tiles). Outputs are compared through
raw float32 dumps written outside the timed spans (--dump on both runners) and deleted afterwards.

Skipped, with the reason in the table, never with a number: a configuration whose time, extrapolated linearly in
pixels from the same configuration at a smaller size, exceeds --max-seconds (default 180), or whose peak RSS,
extrapolated the same way and added to the loaded model, exceeds --max-rss-gib (default 20); and a configuration
that timed out or ran out of memory at a smaller size.
"""
import json
import os
import sys
import time

from . import models

MIB = 1024 * 1024
GIB = 1024 * MIB
DEFAULT_SIZES = [(720, 1280), (1080, 1920), (2160, 3840)]
DEFAULT_BANDS = [64, 128, 256]
MODELS = {"default": "default model (latent-tiny-wan)", "wan2.1": "Wan 2.1, real width (random weights)"}


def log(msg):
    print(f"[bench] {time.strftime('%H:%M:%S')} {msg}", file=sys.stderr, flush=True)


def configs(bands):
    out = [("ours", 0, "gst-latent untiled")]
    out += [("ours", b, f"gst-latent band {b}") for b in bands]
    out += [("diffusers", "", "diffusers untiled"), ("diffusers", "default", "diffusers enable_tiling()")]
    return out


def key_of(impl, opt):
    return f"{impl}:{opt}"


def estimate(history, key, pixels):
    """(seconds, bytes, from) extrapolated linearly in pixels from the largest earlier run of `key`, or None."""
    runs = [h for h in history.get(key, []) if h["status"] == "ok"]
    if not runs:
        return None
    h = max(runs, key=lambda r: r["pixels"])
    f = pixels / h["pixels"]
    return h["seconds"] * f, h["mem"] * f, h["rss_baseline"], h["size"]


def max_abs_diff(a_path, b_path):
    import numpy as np

    a = np.fromfile(a_path, dtype=np.float32)
    b = np.fromfile(b_path, dtype=np.float32)
    if a.size != b.size:
        return None
    d = 0.0
    step = 1 << 24  # in pieces: 4K outputs are large
    for i in range(0, a.size, step):
        d = max(d, float(np.abs(a[i:i + step] - b[i:i + step]).max()))
    return d


def run(args, binary, out_dir):
    from .measure import REF_RUNNER, Runner, describe, machine_info

    sizes = args.resolutions or DEFAULT_SIZES
    bands = args.bands or DEFAULT_BANDS
    frames_list = args.frames or [1]
    directions = args.directions or ["encode", "decode"]
    fams = args.spatial_models or ["default", "wan2.1"]
    max_seconds = args.max_seconds
    max_rss = args.max_rss_gib * GIB
    for t in frames_list:
        if (t - 1) % 4:
            sys.exit(f"[bench] --spatial: clip lengths are 1 + 4k frames (got {t})")
    mode = {"device": "cpu", "dtype": "float32", "timeout": args.timeout or 600}
    runner = Runner(args, mode)
    model_dirs = {fam: models.ensure_model(args.cache, fam) for fam in fams}
    scratch = os.path.join(args.cache, "spatial-outputs")
    os.makedirs(scratch, exist_ok=True)
    os.makedirs(out_dir, exist_ok=True)
    started = time.time()
    results = {
        "mode": "spatial-memory",
        "about": __doc__.split("\n\n")[0],
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": machine_info("cpu"),
        "settings": {"threads": runner.threads, "dtype": runner.dtype, "bands": bands, "sizes": sizes,
                     "frames": frames_list, "directions": directions, "max_seconds": max_seconds,
                     "max_rss_gib": args.max_rss_gib, "timeout_seconds": runner.timeout},
        "models": {fam: dict(models.model_info(d), label=MODELS.get(fam, fam)) for fam, d in model_dirs.items()},
        "cases": [],
    }
    history = {}  # (fam, direction, frames) -> key -> runs
    gave_up = {}
    ci = 0
    for fam in fams:
        model = model_dirs[fam]
        for t in frames_list:
            for direction in directions:
                hist = history.setdefault((fam, direction, t), {})
                for h, w in sizes:
                    log(f"{fam} {direction} {t} frame(s) at {h}x{w}")
                    case = {"family": fam, "direction": direction, "frames": t, "height": h, "width": w, "runs": []}
                    cfgs = configs(bands)
                    if ci % 2:  # alternate which side goes first
                        cfgs = cfgs[len(cfgs) - 2:] + cfgs[:len(cfgs) - 2]
                    ci += 1
                    dumps = {}
                    for impl, opt, label in cfgs:
                        key = key_of(impl, opt)
                        dump = os.path.join(scratch, f"{impl}-{opt or 'untiled'}.f32")
                        est = estimate(hist, key, h * w * t)
                        reason = None
                        if (fam, direction, t, key) in gave_up:
                            reason = gave_up[(fam, direction, t, key)]
                        elif est and est[0] > max_seconds:
                            reason = (f"estimated {est[0]:.0f} s (linear in pixels from {est[3]}) > "
                                      f"{max_seconds} s")
                        elif est and est[1] + est[2] > max_rss:
                            reason = (f"estimated peak RSS {(est[1] + est[2]) / GIB:.1f} GiB (linear in pixels "
                                      f"from {est[3]}) > {args.max_rss_gib} GiB")
                        if reason:
                            r = {"impl": "gst-latent" if impl == "ours" else "diffusers", "status": "skipped",
                                 "reason": reason}
                        else:
                            if impl == "ours":
                                cmd = [binary] + runner.common(model, direction, t, h, w, 0) + [
                                    "--band", str(opt), "--dump", dump, "--json"]
                                r = runner.measure("gst-latent", cmd, None)
                            else:
                                cmd = [sys.executable, REF_RUNNER] + runner.common(model, direction, t, h, w, 0) + [
                                    "--dump", dump] + (["--tile", opt] if opt else [])
                                r = runner.measure("diffusers", cmd, None)
                            if r.get("status") == "ok":
                                dumps[key] = dump
                                hist.setdefault(key, []).append({
                                    "status": "ok", "pixels": h * w * t, "size": f"{h}x{w}",
                                    "seconds": r["wall_seconds_median"], "mem": r["rss_peak_above_baseline_bytes"],
                                    "rss_baseline": r["rss_baseline_bytes"]})
                            elif r.get("status") in ("timeout", "oom"):
                                gave_up[(fam, direction, t, key)] = f"{r['status']} at {h}x{w}"
                                r["reason"] = f"{r['status']} (limit {runner.timeout} s)" if r["status"] == "timeout" \
                                    else "ran out of memory"
                        r["config"] = label
                        r["band"] = opt if impl == "ours" else None
                        r["tile"] = opt if impl == "diffusers" else None
                        for k in ("stderr_tail",):
                            if r.get("status") == "ok":
                                r.pop(k, None)
                        case["runs"].append(r)
                        log(f"  {label:26s} " + (describe(r) if r.get("status") == "ok"
                                                  else f"{r['status']}: {r.get('reason', '')}"))
                    # Outputs against gst-latent's untiled one (diffusers' untiled where ours did not run).
                    ref_key = key_of("ours", 0) if key_of("ours", 0) in dumps else key_of("diffusers", "")
                    case["reference"] = ref_key if ref_key in dumps else None
                    for r in case["runs"]:
                        if r.get("status") != "ok" or not case["reference"]:
                            continue
                        k = key_of("ours", r["band"]) if r["impl"] == "gst-latent" else key_of("diffusers", r["tile"])
                        if k != ref_key:
                            r["max_abs_diff_vs_reference"] = max_abs_diff(dumps[k], dumps[ref_key])
                    for pth in dumps.values():
                        try:
                            os.remove(pth)
                        except OSError:
                            pass
                    # Cases sorted back into the fixed order of configs() for the table.
                    order = [c[2] for c in configs(bands)]
                    case["runs"].sort(key=lambda r: order.index(r["config"]))
                    results["cases"].append(case)
                    save(results, out_dir)
    results["elapsed_seconds"] = time.time() - started
    save(results, out_dir)
    return render(results, out_dir)


def save(results, out_dir):
    path = os.path.join(out_dir, "spatial-memory-results.json")
    with open(path + ".tmp", "w") as f:
        json.dump(results, f, indent=1)
    os.replace(path + ".tmp", path)


def mib(b):
    return f"{b / MIB:.0f}"


def markdown(results):
    s = results["settings"]
    m = results["machine"]
    lines = [f"# Spatial bands (Wan): memory and time, {results['date']}", "",
             f"{m.get('cpu', '?')}, {m.get('cpus')} CPUs, {m.get('memory_gib')} GiB; torch {m.get('torch')}, "
             f"diffusers {m.get('diffusers')}; {s['dtype']}, {s['threads']} threads on both sides. Each row is "
             f"its own process. Memory: peak RSS above the loaded model. Skipped: extrapolated past "
             f"{s['max_seconds']} s or {s['max_rss_gib']} GiB of RSS (linear in pixels from the same run at a "
             f"smaller size). Differences: largest |output - reference|, the reference being gst-latent untiled, "
             f"or diffusers untiled where ours was skipped. 'got N% of the cores': CPU time over wall x threads "
             f"below 85%, another process shared the machine and the time is inflated.", ""]
    for c in results["cases"]:
        label = results["models"].get(c["family"], {}).get("label", c["family"])
        lines += [f"## {label}: {c['direction']} {c['frames']} frame(s) at {c['height']}x{c['width']}", "",
                  "| run | s | peak RSS above model (MiB) | time / untiled | memory / diffusers untiled | "
                  "memory / diffusers tiled | max abs diff vs reference | heap / caches (MiB) | |",
                  "|---|---|---|---|---|---|---|---|---|"]
        by = {r["config"]: r for r in c["runs"]}

        def ok(name):
            r = by.get(name)
            return r if r and r.get("status") == "ok" else None
        untiled = ok("gst-latent untiled")
        d_un = ok("diffusers untiled")
        d_t = ok("diffusers enable_tiling()")
        for r in c["runs"]:
            if r.get("status") != "ok":
                lines.append(f"| {r['config']} | - | - | | | | | | {r['status']}: {r.get('reason', '')} |")
                continue
            sec = r["wall_seconds_median"]
            mem = r["rss_peak_above_baseline_bytes"]
            tr = f"{sec / untiled['wall_seconds_median']:.2f}" if untiled and r["impl"] == "gst-latent" else ""
            mr = f"{mem / d_un['rss_peak_above_baseline_bytes']:.2f}" if d_un and r["impl"] == "gst-latent" else ""
            mt = f"{mem / d_t['rss_peak_above_baseline_bytes']:.2f}" if d_t and r["impl"] == "gst-latent" else ""
            d = r.get("max_abs_diff_vs_reference")
            ref = c.get("reference")
            is_ref = ref == (key_of("ours", r["band"]) if r["impl"] == "gst-latent" else key_of("diffusers", r["tile"]))
            ds = f"{d:.2g}" if d is not None else ("(reference)" if is_ref else "")
            note = []
            if r.get("band_halo"):
                note.append(f"halo {r['band_halo']} {'px' if c['direction'] == 'encode' else 'latent rows'}")
            share = r.get("cpu_share")
            if share is not None and share < 0.85:
                note.append(f"got {100 * share:.0f}% of the cores")
            hc = f"{mib(r['heap_bytes'])} / {mib(r['state_bytes'])}" if r["impl"] == "gst-latent" else ""
            lines.append(f"| {r['config']} | {sec:.2f} | {mib(mem)} | {tr} | {mr} | {mt} | {ds} | {hc} | "
                         f"{', '.join(note)} |")
        lines.append("")
    return "\n".join(lines)


def render(results, out_dir):
    md = markdown(results)
    with open(os.path.join(out_dir, "spatial-memory-results.md"), "w") as f:
        f.write(md)
    print(md)
    log(f"results in {out_dir}/spatial-memory-results.json, spatial-memory-results.md")
    return 0
