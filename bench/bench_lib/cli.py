"""tools/bench: gst-latent's streaming engine side by side with diffusers.

Every measurement is a fresh process (latent-bench for gst-latent, ref_runner.py for diffusers), so memory peaks
never mix and neither side inherits the other's caches. The two implementations alternate, and the order is
swapped on every repetition (ours first, then diffusers first, ...), so slow drifts in machine load hit both.
Both get the same seeded input, the same dtype, device and thread count; the mean |output| of the two is
compared as a cross-check that they computed the same thing.
"""
import argparse
import datetime
import json
import os
import signal
import statistics
import subprocess
import sys
import time

from . import (causal_generation, flops, generation, models, native_generation, parallel_generation, report,
               spatial, taehv_bench)
from .measure import TOP, Runner, describe, log, machine_info


# What each mode measures. Sizes are (frames, height, width).
MODES = {
    "quick": {
        "about": "smoke test: Wan 2.1 only, 17 frames at 64x64, one repetition, a short memory sweep",
        "device": "cpu",
        "dtype": "float32",
        "families": ["wan2.1"],
        "directions": ["encode", "decode"],
        "sizes": [(17, 64, 64)],
        "repeat": 1,
        "sweep": {"runs": [("wan2.1", "encode")], "frames": [17, 65], "size": (64, 64)},
        "timeout": 120,
    },
    "cpu": {
        "about": "both families, encode and decode, 17 and 33 frames at 128x128 (one measurement per side "
                 "unless --repeat)",
        "device": "cpu",
        "dtype": "float32",
        "families": ["wan2.1", "cogvideox"],
        "directions": ["encode", "decode"],
        "sizes": [(17, 128, 128), (33, 128, 128)],
        "repeat": 1,
        "sweep": None,
        "timeout": 600,
    },
    "default": {
        "about": "the embedded default model at the demo's size: 17 and 33 frames at 320x176, encode and decode",
        "device": "cpu",
        "dtype": "float32",
        "families": ["default"],
        "directions": ["encode", "decode"],
        "sizes": [(17, 176, 320), (33, 176, 320)],
        "repeat": 1,
        "sweep": None,
        "timeout": 600,
    },
    "memory": {
        "about": "memory against clip length: 17, 65, 257, 1025 frames at 64x64; encode with both families, "
                 "decode with Wan 2.1",
        "device": "cpu",
        "dtype": "float32",
        "families": [],
        "directions": [],
        "sizes": [],
        "repeat": 1,
        "sweep": {"runs": [("wan2.1", "encode"), ("cogvideox", "encode"), ("wan2.1", "decode")],
                  "frames": [17, 65, 257, 1025], "size": (64, 64)},
        "timeout": 600,
    },
    "gpu": {
        "about": "CUDA, bf16: CogVideoX 49x480x720 and Wan 2.1 81x480x832, encode and decode, three repetitions; "
                 "memory sweep of Wan 2.1 at 480x832",
        "device": "cuda",
        "dtype": "bfloat16",
        "cases": [("cogvideox", 49, 480, 720), ("wan2.1", 81, 480, 832)],
        "directions": ["encode", "decode"],
        "repeat": 3,
        # One untimed pass first in each process: cuDNN picks its kernels and the caching allocator fills on the
        # first pass, which a long-running pipeline pays once.
        "warmup": 1,
        "sweep": {"runs": [("wan2.1", "encode"), ("wan2.1", "decode")], "frames": [17, 65, 257, 1025],
                  "size": (480, 832)},
        "timeout": 600,
    },
}


# ---- plans ----------------------------------------------------------------------------------------------------

def throughput_cases(mode, args):
    directions = args.directions or mode.get("directions", [])
    if "cases" in mode:  # per-family sizes (the GPU mode)
        out = []
        for fam, t, h, w in mode["cases"]:
            if args.families and fam not in args.families:
                continue
            hh, ww = args.size or (h, w)
            out += [(fam, d, tt, hh, ww) for d in directions for tt in (args.frames or [t])]
        return out
    families = args.families or mode.get("families", [])
    sizes = mode.get("sizes", [])
    if args.frames or args.size:
        h, w = args.size or (sizes[0][1:] if sizes else (64, 64))
        sizes = [(t, h, w) for t in (args.frames or sorted({s[0] for s in sizes}) or [17])]
    return [(fam, d, t, h, w) for fam in families for d in directions for t, h, w in sizes]


def sweep_plan(mode, args):
    sw = mode.get("sweep")
    if args.no_sweep or not sw:
        return None
    sw = dict(sw)
    if args.sweep_frames:
        sw["frames"] = args.sweep_frames
    if args.sweep_families:
        sw["runs"] = [(f, d) for f, d in sw["runs"] if f in args.sweep_families] or \
            [(f, d) for f in args.sweep_families for d in sorted({d for _, d in sw["runs"]})]
    if args.directions:
        sw["runs"] = [(f, d) for f, d in sw["runs"] if d in args.directions]
    return sw


def summarise_pair(ours, theirs):
    def ok(rs):
        return [r for r in rs if r.get("status") == "ok"]

    def med(rs, key):
        vals = [r[key] for r in ok(rs) if r.get(key) is not None]
        return statistics.median(vals) if vals else None

    def mem(r):
        g = r.get("gpu_memory")
        return g["allocated_peak_above_baseline_bytes"] if g else r["rss_peak_above_baseline_bytes"]

    def med_mem(rs):
        vals = [mem(r) for r in ok(rs)]
        return statistics.median(vals) if vals else None

    s = {
        "ours_fps": med(ours, "fps_median"),
        "theirs_fps": med(theirs, "fps_median"),
        "ours_wall": med(ours, "wall_seconds_median"),
        "theirs_wall": med(theirs, "wall_seconds_median"),
        "ours_first_output": med(ours, "first_output_seconds"),
        "ours_chunk_latency": med(ours, "chunk_latency_mean_seconds"),
        "ours_chunks": med(ours, "chunks"),
        "ours_mem": med_mem(ours),
        "theirs_mem": med_mem(theirs),
        "ours_rss_peak": med(ours, "rss_peak_bytes"),
        "theirs_rss_peak": med(theirs, "rss_peak_bytes"),
        "ours_state": med(ours, "state_bytes"),
        "theirs_input": med(theirs, "input_bytes"),
        "ours_cpu_share": med(ours, "cpu_share"),
        "theirs_cpu_share": med(theirs, "cpu_share"),
        "contended_kept": sum(1 for r in ok(ours) + ok(theirs) if r.get("contended")),
        "remeasured": sum(len(r.get("contended_attempts") or []) for r in ours + theirs),
        "ours_runs_ok": len(ok(ours)),
        "theirs_runs_ok": len(ok(theirs)),
        "ours_status": sorted({r.get("status") for r in ours}),
        "theirs_status": sorted({r.get("status") for r in theirs}),
    }
    s["fps_ratio"] = s["ours_fps"] / s["theirs_fps"] if s["ours_fps"] and s["theirs_fps"] else None
    s["mem_ratio"] = s["ours_mem"] / s["theirs_mem"] if s["ours_mem"] and s["theirs_mem"] else None
    a = [r["output_mean_abs"] for r in ok(ours)]
    b = [r["output_mean_abs"] for r in ok(theirs)]
    if a and b and b[0]:
        s["output_rel_diff"] = abs(a[0] - b[0]) / abs(b[0])
    s["gpu"] = any("gpu_memory" in r for r in ok(ours) + ok(theirs))
    return s


def add_conv_rate(entry, model, gpu_name):
    """Achieved convolution TFLOP/s of both sides (and the share of the GPU's bf16 peak) from the FLOPs the
    model's convolutions do on this clip; a failed count only leaves the figures out."""
    try:
        n = flops.conv_flops(model, entry["direction"], entry["frames"], entry["height"], entry["width"])
    except Exception as e:  # the counter runs diffusers code on meta tensors; a future version may refuse
        log(f"  could not count the convolution FLOPs: {e}")
        return
    s = entry["summary"]
    entry["conv_flops"] = n
    name, peak = flops.bf16_peak(gpu_name)
    for side in ("ours", "theirs"):
        wall = s.get(f"{side}_wall")
        s[f"{side}_tflops"] = n / wall / 1e12 if wall else None
        if peak and s[f"{side}_tflops"] is not None:
            s[f"{side}_peak_share"] = s[f"{side}_tflops"] / peak
    if peak:
        s["bf16_peak"] = {"device": name, "tflops": peak}


# ---- main -----------------------------------------------------------------------------------------------------

def build_latent_bench(args, name="latent-bench"):
    if args.latent_bench and name == "latent-bench":
        return args.latent_bench
    if args.latent_gen_bench and name == "latent-gen-bench":
        return args.latent_gen_bench
    build = os.path.join(TOP, args.build_dir)
    binary = os.path.join(build, "bench", name)
    if not args.no_build and os.path.exists(os.path.join(build, "build.ninja")):
        log(f"ninja -C {args.build_dir} bench/{name}")
        r = subprocess.run(["ninja", "-C", build, f"bench/{name}"], capture_output=True, text=True)
        if r.returncode != 0:
            sys.exit(f"[bench] building {name} failed:\n{r.stdout[-3000:]}{r.stderr[-2000:]}")
    if not os.path.exists(binary):
        sys.exit(f"[bench] {binary} not found: configure and build first (meson setup {args.build_dir}; "
                 f"ninja -C {args.build_dir} bench/{name})" + (", or pass --latent-bench PATH" if name == "latent-bench"
                                                              else ""))
    return binary


def parse_size(text):
    try:
        h, w = text.lower().split("x")
        return int(h), int(w)
    except ValueError:
        raise argparse.ArgumentTypeError("size is HEIGHTxWIDTH, e.g. 128x128")


def main(argv=None):
    p = argparse.ArgumentParser(
        prog="tools/bench", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="modes:\n" + "\n".join(f"  {k:7s} {v['about']}" for k, v in MODES.items()))
    g = p.add_mutually_exclusive_group()
    g.add_argument("--quick", action="store_const", dest="mode", const="quick", help="under 2 minutes on 2 cores")
    g.add_argument("--memory", action="store_const", dest="mode", const="memory",
                   help="only the memory-against-clip-length sweep (long on a small CPU)")
    g.add_argument("--gpu", action="store_const", dest="mode", const="gpu", help="CUDA, bf16, full-size clips")
    g.add_argument("--default-model", action="store_const", dest="mode", const="default",
                   help="the embedded default model at the demo's 320x176")
    g.add_argument("--taehv", action="store_const", dest="mode", const="taehv",
                   help="TAEHV's tiny decoder against the Wan 2.1 VAE's and taehv.py eager, CPU (--reference-dir, "
                        "--taehv-weights, --size 176x320 or 480x832)")
    g.add_argument("--generate", action="store_const", dest="mode", const="generate",
                   help="video generation (default generator and VAE) next to eager PyTorch; --frames sets the "
                        "lengths of its memory sweep in latents (default 100 500 2000)")
    p.set_defaults(mode="cpu")
    p.add_argument("--native", action="store_true",
                   help="with --generate: instead, the native Wan 2.1 denoiser (a random-weight diffusers folder "
                        "made at bench time) through the clip schedule against diffusers' WanPipeline, with and "
                        "without guidance: time per step, peak RSS, final latents compared")
    p.add_argument("--causal", action="store_true",
                   help="with --generate: instead, the causal schedule (Self-Forcing / LongLive live generation) on a "
                        "random-weight Wan folder against the reference's own loop (--reference-dir): time to the "
                        "first block, steady-state latent frames/s, peak RSS, latents compared; then an H100 "
                        "estimate from the shapes")
    p.add_argument("--model", choices=sorted(set(native_generation.MODELS) | set(causal_generation.MODELS)),
                   default="",
                   help="with --generate --native: the folder's model: wan2.1 (default; small width) or ti2v (Wan 2.2 "
                        "TI2V-5B's full width, 48-channel latents and expand_timesteps, 2 layers; default 3 steps). "
                        "With --generate --causal: tiny (default; the causal fixtures' dims) or 1.3b (Wan 2.1 1.3B's "
                        "width, 2 layers, 16x16 latents)")
    p.add_argument("--reference-dir", default="",
                   help="--causal: a local copy of Self-Forcing (github.com/guandeh17/Self-Forcing, 33593df; LongLive "
                        "works too), which is not on the package index (default: /tmp/refs/Self-Forcing if it is "
                        "there; without one gst-latent is measured alone)")
    p.add_argument("--blocks", type=int, default=0, help="--causal: blocks of 3 latent frames (default 6)")
    p.add_argument("--kv-window", type=int, default=None,
                   help="--causal: latent frames of keys and values (default 12, LongLive's; 0: the global cache of "
                        "21 frames, Self-Forcing's)")
    p.add_argument("--sink", type=int, default=None,
                   help="--causal: frames kept at the window's start (default 3 with a window, else 0)")
    p.add_argument("--denoising-steps", default="",
                   help="--causal: steps on the 1000-step grid, comma-separated (default 1000,750,500,250)")
    p.add_argument("--devices", default="", metavar="D,D[,...]",
                   help="with --generate: instead, one stream on these ranks (threads of one process, e.g. cpu,cpu) "
                        "against one device on the same work: cfg 2 (guided native Wan clip), Ulysses (unguided "
                        "clip) and fifo partitions (default generator); time per step, peak RSS, latents compared, "
                        "bytes exchanged per step")
    p.add_argument("--taehv-weights", default="",
                   help="--taehv: the taew2_1 file the engine and taehv.py load (default: the tests' random one)")
    p.add_argument("--spatial", action="store_true",
                   help="with --memory: instead, exact spatial bands of the Wan family at large frame sizes: for each "
                        "size (--resolutions) and model (--spatial-models), encode and decode of --frames (default "
                        "1) with gst-latent untiled and in bands of --bands pixel rows, diffusers untiled and with "
                        "enable_tiling(), each in its own process: seconds, peak RSS above the model, ratios, max "
                        "difference against untiled; configurations extrapolated past --max-seconds or "
                        "--max-rss-gib are skipped and said so (results: spatial-memory-results.*)")
    p.add_argument("--resolutions", nargs="+", type=parse_size, metavar="HxW",
                   help="--spatial: frame sizes (default 720x1280 1080x1920 2160x3840)")
    p.add_argument("--bands", nargs="+", type=int, metavar="H",
                   help="--spatial: band heights in pixel rows (default 64 128 256)")
    p.add_argument("--spatial-models", nargs="+", choices=("default", "wan2.1"),
                   help="--spatial: models (default: the embedded default model, then real-width Wan 2.1)")
    p.add_argument("--max-seconds", type=float, default=180,
                   help="--spatial: skip a configuration whose time extrapolated from a smaller size exceeds this "
                        "(default 180)")
    p.add_argument("--max-rss-gib", type=float, default=20,
                   help="--spatial: skip a configuration whose extrapolated peak RSS exceeds this (default 20)")
    p.add_argument("--rank-threads", type=int, default=0,
                   help="--generate --devices: threads per rank (default 1; OMP_NUM_THREADS of the process)")
    p.add_argument("--steps", type=int, default=0,
                   help="--generate --native / --devices: sampler steps per clip (default 5, 3 with --model ti2v / "
                        "4)")
    p.add_argument("--threads", type=int, default=0, help="torch threads on both sides (default: all cores)")
    p.add_argument("--repeat", type=int, default=0, help="measurements per side and case (default: the mode's)")
    p.add_argument("--timeout", type=int, default=0, help="seconds before one measurement is given up")
    p.add_argument("--dtype", default="", help="compute dtype on both sides (default: the mode's)")
    p.add_argument("--families", nargs="+", choices=sorted(models.FAMILIES), help="restrict the families")
    p.add_argument("--directions", nargs="+", choices=("encode", "decode"), help="restrict the directions")
    p.add_argument("--frames", nargs="+", type=int, help="clip lengths of the throughput cases")
    p.add_argument("--size", type=parse_size, help="HEIGHTxWIDTH of the throughput cases")
    p.add_argument("--sweep-frames", nargs="+", type=int, help="clip lengths of the memory sweep")
    p.add_argument("--sweep-families", nargs="+", choices=sorted(models.FAMILIES))
    p.add_argument("--no-sweep", action="store_true", help="skip the memory sweep")
    p.add_argument("--profile", action="store_true",
                   help="after the timed runs, one profiled run per side and case (LibTorch profiler)")
    p.add_argument("--cache", default=os.path.join(TOP, "build", "bench-models"),
                   help="where the random full-width models are kept (default: build/bench-models)")
    p.add_argument("--out", default=os.path.join(TOP, "docs", "perf"), help="results, tables and plots")
    p.add_argument("--build-dir", default="build")
    p.add_argument("--latent-bench", default="", help="the latent-bench binary (default: build it in --build-dir)")
    p.add_argument("--latent-gen-bench", default="",
                   help="the latent-gen-bench binary of --generate (default: build it in --build-dir); a copy with "
                        "its library beside it (core/) keeps a rebuild from replacing the code under a measurement")
    p.add_argument("--no-build", action="store_true", help="do not run ninja for latent-bench")
    p.add_argument("--no-plots", action="store_true")
    p.add_argument("--render", metavar="RESULTS.json",
                   help="measure nothing: write the table and plots of an earlier results file again")
    p.add_argument("--wait-idle", type=float, default=0.25, metavar="FRACTION",
                   help="CPU mode: before each measurement wait until other processes use less than this fraction "
                        "of the CPUs (default 0.25; 0 disables)")
    p.add_argument("--wait-max", type=int, default=0, metavar="SECONDS",
                   help="longest wait for a quiet machine before measuring anyway (default: 20 with --quick, "
                        "else 300)")
    p.add_argument("--min-cpu-share", type=float, default=0.85, metavar="FRACTION",
                   help="CPU mode: a measurement whose process got less than this share of its threads' CPU time "
                        "(another process took cores) is measured again (default 0.85)")
    p.add_argument("--retries", type=int, default=-1,
                   help="re-measurements of a contended run (default: 1 with --quick, else 2); the last is kept "
                        "and marked contended")
    args = p.parse_args(argv)
    # A terminated run stops its measurement process too (subprocess.run kills the child on an exception).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    mode_name = args.mode
    if (args.native or args.devices) and mode_name != "generate":
        p.error("--native and --devices go with --generate")
    if args.causal and mode_name != "generate":
        p.error("--causal goes with --generate")
    if sum(map(bool, (args.native, args.devices, args.causal))) > 1:
        p.error("--native, --devices and --causal are different runs")
    if args.model and not (args.native or args.causal):
        p.error("--model goes with --generate --native or --generate --causal")
    if args.model and args.model not in (causal_generation.MODELS if args.causal else native_generation.MODELS):
        p.error(f"--model {args.model} is not a model of --{'causal' if args.causal else 'native'}")
    causal_only = (args.reference_dir, args.blocks, args.kv_window is not None, args.sink is not None,
                   args.denoising_steps)
    if mode_name == "taehv":
        if args.render:
            with open(args.render) as f:
                return taehv_bench.render(json.load(f), args.out)
        return taehv_bench.run(args, build_latent_bench(args), args.out)
    if any(causal_only) and not args.causal:
        p.error("--reference-dir, --blocks, --kv-window, --sink and --denoising-steps go with --generate --causal")
    if args.spatial:
        if mode_name != "memory":
            p.error("--spatial goes with --memory")
        if args.render:
            with open(args.render) as f:
                return spatial.render(json.load(f), args.out)
        if args.wait_max <= 0:
            args.wait_max = 60
        if args.retries < 0:
            args.retries = 0
        args.timeout = args.timeout or 400
        return spatial.run(args, build_latent_bench(args), args.out)
    if mode_name == "generate":
        binary = "" if args.render else build_latent_bench(args, "latent-gen-bench")
        if args.devices:
            if args.render:
                with open(args.render) as f:
                    return parallel_generation.render(json.load(f), args.out)
            return parallel_generation.run(args, binary, args.out)
        if args.causal:
            if args.render:
                with open(args.render) as f:
                    return causal_generation.render(json.load(f), args.out)
            return causal_generation.run(args, binary, args.out)
        if args.native:
            if args.render:
                with open(args.render) as f:
                    return native_generation.render(json.load(f), args.out)
            return native_generation.run(args, binary, args.out)
        return generation.run(args, binary, args.out)
    mode = MODES[mode_name]
    if args.wait_max <= 0:
        args.wait_max = 20 if mode_name == "quick" else 300
    if args.retries < 0:
        args.retries = 1 if mode_name == "quick" else 2

    if args.render:
        with open(args.render) as f:
            results = json.load(f)
        finish(results, args, results["mode"])
        return 0
    if mode["device"] == "cuda":
        import torch
        if not torch.cuda.is_available():
            log("--gpu needs a CUDA device and torch sees none; nothing was measured")
            return 3
    args.latent_bench = build_latent_bench(args)
    runner = Runner(args, mode)
    repeat = args.repeat or mode["repeat"]
    warmup = mode.get("warmup", 0)
    cases = throughput_cases(mode, args)
    sweep = sweep_plan(mode, args)
    needed = sorted({c[0] for c in cases} | {f for f, _ in (sweep["runs"] if sweep else [])})
    model_dirs = {fam: models.ensure_model(args.cache, fam) for fam in needed}

    started = time.time()
    results = {
        "mode": mode_name,
        "about": mode["about"],
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": machine_info(mode["device"]),
        "settings": {"device": runner.device, "dtype": runner.dtype, "threads": runner.threads, "repeat": repeat,
                     "timeout_seconds": runner.timeout, "wait_idle": args.wait_idle, "wait_max": args.wait_max,
                     "min_cpu_share": args.min_cpu_share, "retries": args.retries, "warmup": warmup},
        "models": {fam: models.model_info(d) for fam, d in model_dirs.items()},
        "throughput": [],
        "memory_sweep": [],
    }
    os.makedirs(args.out, exist_ok=True)
    prof_dir = os.path.join(args.out, f"{mode_name}-profiles")

    log(f"mode {mode_name}: {mode['about']}; {runner.threads} threads, {runner.dtype} on {runner.device}, "
        f"{repeat} repetition(s), timeout {runner.timeout} s")
    for ci, (fam, direction, t, h, w) in enumerate(cases):
        model = model_dirs[fam]
        ours, theirs = [], []
        log(f"{fam} {direction} {t}x{h}x{w}")
        for i in range(repeat):
            order = ("ours", "theirs") if (ci + i) % 2 == 0 else ("theirs", "ours")
            for side in order:
                if side == "ours":
                    r = runner.ours(model, direction, t, h, w, warmup=warmup)
                    ours.append(r)
                else:
                    r = runner.theirs(model, direction, t, h, w, warmup=warmup)
                    theirs.append(r)
                log(f"  {i + 1}/{repeat} {r['impl']:10s} {describe(r)}")
        entry = {"family": fam, "direction": direction, "frames": t, "height": h, "width": w,
                 "ours": ours, "diffusers": theirs, "summary": summarise_pair(ours, theirs)}
        add_conv_rate(entry, model, results["machine"].get("gpu"))
        if args.profile:
            os.makedirs(prof_dir, exist_ok=True)
            stem = os.path.join(prof_dir, f"{fam}-{direction}-{t}x{h}x{w}")
            po = runner.ours(model, direction, t, h, w, profile=stem + "-ours.trace.json")
            pt = runner.theirs(model, direction, t, h, w, profile=stem + "-diffusers.txt")
            entry["profile"] = {"ours": po.get("profile"), "diffusers": pt.get("profile")}
            if po.get("status") == "ok":
                table = report.trace_self_times(po["profile"])
                with open(stem + "-ours.txt", "w") as f:
                    f.write(report.self_time_table(table))
                entry["profile"]["ours_table"] = stem + "-ours.txt"
                os.remove(po["profile"])  # the raw trace is large; the table is what is kept
                entry["profile"]["ours"] = None
        results["throughput"].append(entry)
        save(results, args.out, mode_name)

    if sweep:
        h, w = sweep["size"]
        for fam, direction in sweep["runs"]:
            model = model_dirs[fam]
            gave_up = {"gst-latent": None, "diffusers": None}
            for n, t in enumerate(sweep["frames"]):
                log(f"memory sweep: {fam} {direction} {t}x{h}x{w}")
                row = {"family": fam, "direction": direction, "frames": t, "height": h, "width": w}
                order = ("ours", "theirs") if n % 2 == 0 else ("theirs", "ours")
                for side in order:
                    impl = "gst-latent" if side == "ours" else "diffusers"
                    if gave_up[impl]:
                        r = {"impl": impl, "status": "skipped",
                             "reason": f"{gave_up[impl]} at a shorter clip"}
                    elif side == "ours":
                        r = runner.ours(model, direction, t, h, w)
                    else:
                        r = runner.theirs(model, direction, t, h, w)
                    if r.get("status") in ("timeout", "oom"):
                        gave_up[impl] = r["status"]
                    row["ours" if side == "ours" else "diffusers"] = r
                    log(f"  {impl:10s} {describe(r)}")
                results["memory_sweep"].append(row)
                save(results, args.out, mode_name)

    results["elapsed_seconds"] = time.time() - started
    results["machine"]["loadavg_end"] = os.getloadavg()
    save(results, args.out, mode_name)
    finish(results, args, mode_name)
    return 0


def finish(results, args, mode_name):
    """Writes the markdown table (and prints it) and the plots."""
    os.makedirs(args.out, exist_ok=True)
    md = report.markdown(results)
    plots = [] if args.no_plots else report.plots(results, args.out, mode_name)
    if plots:
        md += "\n" + "\n".join(f"![{os.path.basename(pth)}]({os.path.basename(pth)})" for pth in plots) + "\n"
    with open(os.path.join(args.out, f"{mode_name}-results.md"), "w") as f:
        f.write(md)
    print(md)
    log(f"done in {results.get('elapsed_seconds', 0) / 60:.1f} min; results in {args.out}/{mode_name}-results.json, "
        f"{mode_name}-results.md" + (", plots " + ", ".join(os.path.basename(x) for x in plots) if plots else ""))


def save(results, out, mode_name):
    path = os.path.join(out, f"{mode_name}-results.json")
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(results, f, indent=1)
    os.replace(tmp, path)


if __name__ == "__main__":
    sys.exit(main())
