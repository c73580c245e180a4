"""TAEHV's tiny decoder against the Wan 2.1 VAE's decoder (both the engine's) and against taehv.py in eager
PyTorch, on the CPU in float32, in one run: decoded frames per second and peak memory above the loaded model.

Speed does not depend on the weights' values: the engine loads a taew2_1-shaped file (default: the random
one the TAEHV tests build, tests/fixtures/gen_taehv_fixtures.py; --taehv-weights takes the published file) and the
bench's random full-width Wan 2.1 VAE (models.py). taehv.py is not on the package index: --reference-dir DIR
(default /tmp/refs/taehv if there) is a local copy of github.com/madebyollin/taehv; without one it is left out
and the table says so. Its decode_video runs with parallel=True (its default, all frames at once) and
parallel=False (frame by frame, the engine's way, the reference's streaming memory).
"""
import json
import os
import subprocess
import sys
import time

from . import models
from .measure import TOP, Runner, log, machine_info

DEFAULT_REFERENCE = "/tmp/refs/taehv"
DEFAULT_WEIGHTS = os.path.join(TOP, "build", "tests", "core", "taehv-fixtures", "taew2_1.pth")
RUNNER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "taehv_ref_runner.py")
# (height, width, frames): the default model's size and Wan's 480p; 4k + 1 frames, every one decoded.
CASES = [(176, 320, 17), (480, 832, 9)]
MIB = 1 << 20


def reference_dir(args):
    d = args.reference_dir or (DEFAULT_REFERENCE if os.path.exists(DEFAULT_REFERENCE) else "")
    if not d:
        return None, (f"no reference: taehv.py is not on the package index; pass --reference-dir with a local copy "
                      f"(git clone https://github.com/madebyollin/taehv) or put one at {DEFAULT_REFERENCE}")
    if not os.path.exists(os.path.join(d, "taehv.py")):
        return None, f"--reference-dir {d} has no taehv.py"
    return d, None


def run(args, latent_bench, out_dir):
    weights = args.taehv_weights or DEFAULT_WEIGHTS
    if not os.path.exists(weights):
        log(f"{weights} is missing: build the tests (ninja -C build) or pass --taehv-weights taew2_1.pth")
        return 2
    args.latent_bench = latent_bench
    if args.retries < 0:
        args.retries = 1
    if args.wait_max <= 0:
        args.wait_max = 120
    mode = {"device": "cpu", "dtype": "float32", "timeout": args.timeout or 1200}
    runner = Runner(args, mode)
    repeat = args.repeat or 3
    wan = models.ensure_model(args.cache, "wan2.1")
    ref, why_not = reference_dir(args)
    cases = [(h, w, f) for h, w, f in CASES if not args.size or (h, w) == tuple(args.size)]
    results = {"mode": "taehv", "about": __doc__.strip().split("\n\n")[0].replace("\n", " "),
               "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "machine": machine_info("cpu"),
               "commit": subprocess.run(["git", "-C", TOP, "rev-parse", "--short", "HEAD"], capture_output=True,
                                        text=True).stdout.strip(),
               "settings": {"threads": runner.threads, "repeat": repeat, "warmup": 1, "dtype": "float32"},
               "taehv_weights": weights, "wan_model": wan, "reference_dir": ref, "reference_missing": why_not,
               "cases": []}
    for h, w, frames in cases:
        case = {"height": h, "width": w, "frames": frames, "sides": {}}
        def ours(model, name):
            cmd = [latent_bench] + runner.common(model, "decode", frames, h, w, 0, warmup=1) + ["--json"]
            cmd[cmd.index("--repeat") + 1] = str(repeat)
            return lambda: runner.measure(name, cmd, None)

        sides = [("engine taew2_1", ours(weights, "engine taew2_1")),
                 ("engine Wan 2.1 VAE", ours(wan, "engine Wan 2.1 VAE"))]
        if ref:
            for sequential in (False, True):
                cmd = [sys.executable, RUNNER, "--reference-dir", ref, "--model", weights, "--frames", str(frames),
                       "--height", str(h), "--width", str(w), "--threads", str(runner.threads), "--repeat",
                       str(repeat), "--warmup", "1"] + (["--sequential"] if sequential else [])
                name = "taehv.py " + ("frame by frame" if sequential else "parallel")
                sides.append((name, lambda cmd=cmd, name=name: runner.measure(name, cmd, None)))
        for name, measure in sides:
            log(f"{h}x{w}, {frames} frames: {name}")
            r = measure()
            case["sides"][name] = r
            if r.get("status") == "ok":
                log(f"  {r['fps_median']:.2f} frames/s, peak {r.get('rss_peak_above_baseline_bytes', 0) / MIB:.0f} MiB "
                    f"above the model")
            else:
                log(f"  {r.get('status')}: {r.get('stderr_tail', '')[-300:]}")
        results["cases"].append(case)
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "taehv-results.json"), "w") as f:
        json.dump(results, f, indent=1)
    return render(results, out_dir)


def render(results, out_dir):
    md = markdown(results)
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "taehv-results.md"), "w") as f:
        f.write(md)
    print(md)
    return 0


def markdown(results):
    st = results["settings"]
    lines = [f"# TAEHV decode on the CPU ({results['date']}, {st['threads']} threads, float32, commit "
             f"{results['commit']})", "",
             "| size | frames | side | frames/s | ratio to engine taew2_1 | peak above model (MiB) |",
             "|---|---|---|---|---|---|"]
    for c in results["cases"]:
        base = c["sides"].get("engine taew2_1", {})
        base_fps = base.get("fps_median") if base.get("status") == "ok" else None
        for name, r in c["sides"].items():
            if r.get("status") != "ok":
                lines.append(f"| {c['width']}x{c['height']} | {c['frames']} | {name} | {r.get('status')} | - | - |")
                continue
            ratio = f"{r['fps_median'] / base_fps:.3f}" if base_fps else "-"
            peak = r.get("rss_peak_above_baseline_bytes")
            peak = f"{peak / MIB:.0f}" if peak is not None else "-"
            lines.append(f"| {c['width']}x{c['height']} | {c['frames']} | {name} | {r['fps_median']:.2f} | {ratio} | "
                         f"{peak} |")
    if results.get("reference_missing"):
        lines += ["", f"taehv.py not measured: {results['reference_missing']}"]
    lines += ["", f"Medians of {st['repeat']} runs a side after one warm-up, each side its own process; weights "
              f"{os.path.basename(results['taehv_weights'])} (random, taew2_1's shapes) and the bench's random "
              f"full-width Wan 2.1 VAE.", ""]
    return "\n".join(lines)
