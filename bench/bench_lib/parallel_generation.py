"""tools/bench --generate --devices cpu,cpu[,...]: one stream generated on several ranks (threads of one process,
latent::ParallelGenerator, as videogen devices= runs it) against one device, on the same work, in one run.

Cases, each a plan the ranks run and the same generation on one device:
  cfg        the native Wan 2.1 folder of --generate --native, clip schedule, guidance 5: the text and the
             negative text evaluations of a step on different ranks
  ulysses    the same folder without guidance: each evaluation's tokens split over the ranks (all-to-all in
             every attention layer)
  partitions the default generator (latent-gen-small), fifo with --steps 16 and window 8: two partitions, one
             model call each per iteration, on different ranks
Sides: the ranks with --rank-threads threads each (OMP_NUM_THREADS; default 1), one device with as many threads as
the ranks have together (the same cores), and one device with one rank's threads (what each rank has: the
analogue of a GPU per rank). Each measurement is a fresh process; the sides alternate and rotate their order
every repetition. Reported as ratios ranks / one device: time per step (the loop's wall time over its steps or
fifo iterations), peak RSS; the final latents of the ranks against one device's; and the bytes the ranks move per
step, computed from the shapes (nothing is counted on the wire).

On a machine with fewer cores than ranks x threads the ranks share cores: no speed-up is to be had there, and
the point of the run is the harness, the volume and the exactness.
"""
import json
import math
import os
import statistics
import subprocess
import sys
import time

from . import native_generation as native

MIB = 1024 * 1024
GEN_SMALL = os.path.join(native.TOP, "models", "latent-gen-small.safetensors")
FLOAT32 = 4  # the CPU ranks compute and exchange float32


def log(msg):
    print(f"[bench] {time.strftime('%H:%M:%S')} {msg}", file=sys.stderr, flush=True)


def cases(ranks, steps, root, text_file):
    """name -> (plan, bench arguments without threads/devices)."""
    wan = ["--generator", root, "--schedule", "clip", "--latents", str(native.LATENTS), "--height",
           str(native.HEIGHT), "--width", str(native.WIDTH), "--steps", str(steps), "--text", text_file,
           "--seed", str(native.NOISE_SEED)]
    out = {}
    if ranks == 2:
        out["cfg"] = ("cfg=2", wan + ["--guidance", "5"])
    elif ranks % 2 == 0 and native.CONFIG["num_attention_heads"] % (ranks // 2) == 0:
        out["cfg"] = (f"cfg=2,ulysses={ranks // 2}", wan + ["--guidance", "5"])
    if native.CONFIG["num_attention_heads"] % ranks == 0:
        out["ulysses"] = (f"ulysses={ranks}", wan + ["--guidance", "1"])
    # fifo: ceil(steps / window) partitions, one call each per iteration; as many as ranks.
    out["partitions"] = (f"partitions={ranks}", ["--generator", GEN_SMALL, "--schedule", "fifo", "--latents", "40",
                                                 "--steps", str(8 * ranks), "--window", "8"])
    return out


def volume(r, ranks):
    """Bytes per step (clip) or fifo iteration that cross between ranks, from the shapes the run reports."""
    cfg, uly, parts = r["plan_cfg"], r["plan_ulysses"], r["plan_partitions"]
    guided = r["guidance"] != 1
    per_call = 2 if guided else 1
    c, h, w = r["channels"], r["height"], r["width"]
    if r["schedule"] == "clip":
        calls, latents = 1, r["latents"]
    else:  # fifo's steady state: one call per partition of window latents
        calls, latents = math.ceil(r["steps"] / r["window"]), r["window"]
    numel = c * latents * h * w
    evaluations = calls * per_call
    groups = cfg * parts
    # ParallelExecutor packs a call group's predictions into one float32 buffer, the longest group's length, and
    # all-gathers it over every rank.
    packed = math.ceil(evaluations / groups) * numel * FLOAT32
    out = {"evaluations_per_step": evaluations, "allgather_send_bytes_per_rank": packed,
           "allgather_recv_bytes_per_rank": (ranks - 1) * packed}
    if uly > 1:
        pt, ph, pw = native.CONFIG["patch_size"]
        tokens = (latents // pt) * (h // ph) * (w // pw)
        dim = native.CONFIG["num_attention_heads"] * native.CONFIG["attention_head_dim"]
        chunk = math.ceil(tokens / uly)
        # to_heads sends q, k, v (one all-to-all), to_tokens the attention output (another): 4 tensors of
        # [chunk, dim], of which (u-1)/u leave the rank.
        layer = 4 * chunk * dim * FLOAT32 * (uly - 1) / uly
        layers = native.CONFIG["num_layers"]
        evals_per_rank = math.ceil(evaluations / groups)
        # The last step gathers the output tokens: [chunk, out_channels * patch] from every rank.
        gather = chunk * native.CONFIG["out_channels"] * pt * ph * pw * FLOAT32 * (uly - 1)
        out.update(tokens=tokens, dim=dim, layers=layers, alltoall_bytes_per_layer_per_rank=layer,
                   alltoall_bytes_per_step_per_rank=layer * layers * evals_per_rank,
                   output_gather_recv_bytes_per_step_per_rank=gather * evals_per_rank)
    return out


def run(args, binary, out_dir):
    devices = args.devices.split(",")
    ranks = len(devices)
    if ranks < 2:
        log("--devices wants two or more ranks, e.g. cpu,cpu")
        return 2
    rank_threads = args.rank_threads or 1
    repeat = args.repeat or 3
    steps = args.steps or 4
    timeout = args.timeout or 900
    wait = (args.wait_idle, args.wait_max or 120)
    retries = 2 if args.retries < 0 else args.retries
    root, text_file = native.ensure_pipeline(args.cache)
    scratch = os.path.join(args.cache, "parallel-latents")
    os.makedirs(scratch, exist_ok=True)
    os.makedirs(out_dir, exist_ok=True)
    from .measure import machine_info

    results = {"mode": "generate-devices", "about": __doc__.strip().split("\n\n")[0].replace("\n", " "),
               "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "machine": machine_info("cpu"),
               "commit": subprocess.run(["git", "-C", native.TOP, "rev-parse", "--short", "HEAD"],
                                        capture_output=True, text=True).stdout.strip(),
               "settings": {"devices": args.devices, "ranks": ranks, "rank_threads": rank_threads,
                            "repeat": repeat, "steps": steps, "dtype": "float32",
                            "min_cpu_share": args.min_cpu_share, "retries": retries},
               "config": native.CONFIG, "cases": []}

    def save():
        with open(os.path.join(out_dir, "generate-devices-results.json"), "w") as f:
            json.dump(results, f, indent=1)

    # Every side on the first listed device: with --devices cuda:0,cuda:0 the one-device runs are on cuda:0 too,
    # not on the driver's default (the CPU).
    first = ["--device", args.devices.split(",")[0]]
    sides = {"ranks": (rank_threads, first + ["--devices", args.devices]),
             "one, same cores": (rank_threads * ranks, first),
             "one, a rank's threads": (rank_threads, first)}
    log(f"{ranks} ranks ({args.devices}) x {rank_threads} threads against one device; {repeat} repetitions")
    for name, (plan, common) in cases(ranks, steps, root, text_file).items():
        runs = {s: [] for s in sides}
        for i in range(repeat):
            order = list(sides)[i % len(sides):] + list(sides)[:i % len(sides)]
            for side in order:
                threads, extra = sides[side]
                latents = os.path.join(scratch, f"{name}-{side.replace(' ', '_').replace(',', '')}-{i}.safetensors")
                cmd = [binary, "--json", "--threads", str(threads), "--save-latents", latents] + common + extra
                if side == "ranks":
                    cmd += ["--parallel", plan]
                r = measure(cmd, timeout, threads, threads * (ranks if side == "ranks" else 1), args.min_cpu_share,
                            retries, wait)
                r["side"] = side
                runs[side].append(r)
                log(f"  {name} {i + 1}/{repeat} {side:22s} {brief(r)}")
        case = {"case": name, "plan": plan, "runs": runs}
        case["summary"] = summarise(runs, ranks)
        results["cases"].append(case)
        save()
    return render(results, out_dir)


def measure(cmd, timeout, omp_threads, cores, min_share, retries, wait):
    """One measurement process (OMP_NUM_THREADS=omp_threads, which every rank thread takes), measured again when
    it got less than min_share of `cores` (another process took them)."""
    from .measure import wait_for_quiet

    env = dict(os.environ, OMP_NUM_THREADS=str(omp_threads))
    for attempt in range(1 + retries):
        busy, waited = wait_for_quiet(*wait) if wait[0] > 0 else (None, 0.0)
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
        except subprocess.TimeoutExpired:
            return {"status": "timeout", "timeout_seconds": timeout, "cmd": cmd}
        if p.returncode != 0:
            return {"status": "failed", "returncode": p.returncode, "stderr": p.stderr[-2000:], "cmd": cmd}
        r = json.loads(p.stdout.strip().splitlines()[-1])
        r.update(status="ok", cmd=cmd, others_cpu_busy_before=busy, waited_for_quiet_seconds=waited,
                 omp_threads=omp_threads, cores=cores)
        r["cpu_share"] = r["generate_cpu_seconds"] / (r["generate_seconds"] * cores)
        if r["cpu_share"] >= min_share:
            return r
        if attempt == retries:
            r["contended"] = True
            return r
        log(f"  got {100 * r['cpu_share']:.0f}% of {cores} cores (another process ran); measuring again")
    return r


def per_step(r):
    return r["generate_seconds"] / (r["steps"] if r["schedule"] == "clip" else r["iterations"])


def peak(r):
    return max(r["rss_peak_bytes"], r["rss_peak_loading_bytes"])


def brief(r):
    if r.get("status") != "ok":
        return r.get("status", "?") + (f": {r.get('stderr', '')[-300:]}" if r.get("stderr") else "")
    return (f"{per_step(r):.3f} s/step, {r['model_calls']} calls in {r['generate_seconds']:.2f} s, peak RSS "
            f"{peak(r) / MIB:.0f} MiB, CPU share {r['cpu_share']:.2f}" + (f", {r['plan']}" if r["plan"] else ""))


def summarise(runs, ranks):
    def ok(rs):
        done = [r for r in rs if r.get("status") == "ok"]
        return [r for r in done if not r.get("contended")] or done

    s = {}
    for side, rs in runs.items():
        good = ok(rs)
        s[side] = {"runs_ok": len(good),
                   "step_seconds": statistics.median(per_step(r) for r in good) if good else None,
                   "rss_peak": statistics.median(peak(r) for r in good) if good else None,
                   "cpu_share": statistics.median(r["cpu_share"] for r in good if r.get("cpu_share")) if good else None}
    for side in runs:
        if side != "ranks" and s["ranks"]["step_seconds"] and s[side]["step_seconds"]:
            s[side]["time_ratio"] = s["ranks"]["step_seconds"] / s[side]["step_seconds"]
            s[side]["rss_ratio"] = s["ranks"]["rss_peak"] / s[side]["rss_peak"]
    mine = ok(runs["ranks"])
    one = ok(runs["one, same cores"])
    if mine and one:
        s["volume"] = volume(mine[0], ranks)
        s["plan"] = mine[0]["plan"]
        s["latents_max_abs_diff"] = max_abs_diff(mine[0]["latents_file"], one[0]["latents_file"])
    return s


def max_abs_diff(a_file, b_file):
    from safetensors.torch import load_file

    a, b = load_file(a_file)["latents"], load_file(b_file)["latents"]
    return float((a - b).abs().max()) if a.shape == b.shape else None


def render(results, out_dir):
    md = markdown(results)
    with open(os.path.join(out_dir, "generate-devices-results.md"), "w") as f:
        f.write(md)
    print(md)
    return 0


def markdown(results):
    st = results["settings"]
    lines = [f"# Generation on {st['ranks']} ranks ({st['devices']}) against one device ({results['date']}, CPU, "
             f"{st['rank_threads']} thread(s) per rank, {st['steps']} steps on the Wan clip)", "",
             "| case | plan | ranks s/step | one device, same cores | ratio | one device, a rank's threads | ratio | "
             "ranks peak RSS MiB | ratio (same cores) | CPU share ranks / one | runs ok | latents max abs diff |",
             "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|"]

    def f(v, fmt):
        return format(v, fmt) if v is not None else "-"

    for c in results["cases"]:
        s = c["summary"]
        a, b, d = s["ranks"], s["one, same cores"], s["one, a rank's threads"]
        lines.append(
            f"| {c['case']} | {s.get('plan', c['plan'])} | {f(a['step_seconds'], '.3f')} | "
            f"{f(b['step_seconds'], '.3f')} | {f(b.get('time_ratio'), '.2f')} | {f(d['step_seconds'], '.3f')} | "
            f"{f(d.get('time_ratio'), '.2f')} | {f(a['rss_peak'] and a['rss_peak'] / MIB, '.0f')} | "
            f"{f(b.get('rss_ratio'), '.2f')} | {f(a['cpu_share'], '.2f')} / {f(b['cpu_share'], '.2f')} | "
            f"{a['runs_ok']}/{b['runs_ok']}/{d['runs_ok']} | {f(s.get('latents_max_abs_diff'), '.1e')} |")
    lines += ["", "Ratios are ranks / one device: below 1 is faster or leaner. Communication per step (clip) or "
                  "iteration (fifo), computed from the shapes (float32):", ""]
    for c in results["cases"]:
        v = c["summary"].get("volume")
        if not v:
            continue
        line = (f"- {c['case']}: {v['evaluations_per_step']} evaluations per step; all-gather: each rank sends "
                f"{v['allgather_send_bytes_per_rank'] / 1e6:.3f} MB, receives "
                f"{v['allgather_recv_bytes_per_rank'] / 1e6:.3f} MB")
        if "alltoall_bytes_per_layer_per_rank" in v:
            line += (f"; Ulysses over {v['tokens']} tokens x {v['dim']}: "
                     f"{v['alltoall_bytes_per_layer_per_rank'] / 1e6:.3f} MB per layer and rank (2 all-to-alls: "
                     f"q, k, v then the output), {v['alltoall_bytes_per_step_per_rank'] / 1e6:.2f} MB per step "
                     f"over {v['layers']} layers, plus {v['output_gather_recv_bytes_per_step_per_rank'] / 1e6:.3f} MB "
                     "of output tokens gathered")
        lines.append(line)
    return "\n".join(lines) + "\n"
