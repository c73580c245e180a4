"""tools/bench --generate: video generation with the default generator and VAE, as `videogen ! vaedecode` runs
it (latent-gen-bench), next to what a PyTorch user writes (gen_ref_runner.py: eager model, diffusers' Euler
scheduler, rolling windows, diffusers' decode of the whole clip).

Throughput: the rolling schedule on both sides (the same model calls), plus our fifo; latent frames/s of the
generator alone and video frames/s end to end. Memory against length: our fifo at 100, 500 and 2,000 latents
(the RSS sampled every tenth of the run), the reference at the lengths it can hold.
"""
import json
import os
import statistics
import subprocess
import sys
import time

TOP = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GEN_REF = os.path.join(TOP, "bench", "bench_lib", "gen_ref_runner.py")
GENERATOR = os.path.join(TOP, "models", "latent-gen-small.safetensors")
VAE = os.path.join(TOP, "models", "latent-tiny-wan.safetensors")

MIB = 1024 * 1024


def log(msg):
    print(f"[bench] {time.strftime('%H:%M:%S')} {msg}", file=sys.stderr, flush=True)


def measure(cmd, timeout):
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"status": "timeout", "timeout_seconds": timeout}
    if r.returncode != 0:
        return {"status": "failed", "stderr": r.stderr[-2000:]}
    out = json.loads(r.stdout.strip().splitlines()[-1])
    out["status"] = "ok"
    return out


def ours(binary, schedule, latents, threads, decode=True):
    cmd = [binary, "--generator", GENERATOR, "--latents", str(latents), "--schedule", schedule, "--threads",
           str(threads), "--json"]
    return cmd + (["--vae", VAE] if decode else [])


def theirs(latents, threads, decode=True):
    cmd = [sys.executable, GEN_REF, "--generator", GENERATOR, "--latents", str(latents), "--threads", str(threads)]
    return cmd + (["--vae", VAE] if decode else [])


def describe(r):
    if r.get("status") != "ok":
        return r.get("status", "?")
    return (f"{r['latents']} latents {r['latents_per_second']:.2f}/s, {r['frames']} frames "
            f"{r['frames_per_second']:.2f}/s end to end, {r['model_calls']} calls, "
            f"peak +{r['rss_peak_above_baseline_bytes'] / MIB:.0f} MiB")


def run(args, binary, out_dir):
    threads = args.threads or os.cpu_count()
    repeat = args.repeat or 3
    timeout = args.timeout or 1800
    lengths = args.frames or [100, 500, 2000]
    results = {"mode": "generate", "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
               "threads": threads, "generator": GENERATOR, "vae": VAE, "throughput": [], "memory": []}
    os.makedirs(out_dir, exist_ok=True)

    def save():
        with open(os.path.join(out_dir, "generate-results.json"), "w") as f:
            json.dump(results, f, indent=1)

    n = 48
    log(f"throughput: {n} latents, rolling on both sides, fifo on ours; {repeat} repetitions, {threads} threads")
    runs = {"gst-latent rolling": [], "pytorch rolling": [], "gst-latent fifo": []}
    for i in range(repeat):
        order = list(runs) if i % 2 == 0 else list(reversed(runs))
        for name in order:
            cmd = theirs(n, threads) if name.startswith("pytorch") else ours(binary, name.split()[1], n, threads)
            r = measure(cmd, timeout)
            runs[name].append(r)
            log(f"  {i + 1}/{repeat} {name:20s} {describe(r)}")
    for name, rs in runs.items():
        ok = [r for r in rs if r["status"] == "ok"]
        entry = {"case": name, "latents": n, "runs": rs}
        if ok:
            entry["latents_per_second"] = statistics.median(r["latents_per_second"] for r in ok)
            entry["frames_per_second"] = statistics.median(r["frames_per_second"] for r in ok)
            entry["peak_above_baseline_mib"] = statistics.median(r["rss_peak_above_baseline_bytes"] for r in ok) / MIB
        results["throughput"].append(entry)
        save()

    log(f"memory against length: {lengths} latents")
    gave_up = False
    for length in lengths:
        row = {"latents": length}
        row["gst-latent fifo"] = measure(ours(binary, "fifo", length, threads), timeout)
        log(f"  {length:5d} gst-latent fifo    {describe(row['gst-latent fifo'])}")
        if gave_up:
            row["pytorch rolling"] = {"status": "skipped", "reason": "gave up at a shorter length"}
        else:
            row["pytorch rolling"] = measure(theirs(length, threads), timeout)
            gave_up = row["pytorch rolling"]["status"] != "ok"
        log(f"  {length:5d} pytorch rolling    {describe(row['pytorch rolling'])}")
        results["memory"].append(row)
        save()
    md = markdown(results)
    with open(os.path.join(out_dir, "generate-results.md"), "w") as f:
        f.write(md)
    print(md)
    return 0


def markdown(results):
    lines = [f"# Generation benchmark ({results['date']}, {results['threads']} threads, CPU)", "",
             "| case | latents | latent frames/s | video frames/s end to end | peak above baseline |",
             "|---|---|---|---|---|"]
    base = {e["case"]: e for e in results["throughput"]}
    for e in results["throughput"]:
        if "latents_per_second" not in e:
            lines.append(f"| {e['case']} | {e['latents']} | failed | | |")
            continue
        lines.append(f"| {e['case']} | {e['latents']} | {e['latents_per_second']:.2f} | "
                     f"{e['frames_per_second']:.2f} | {e['peak_above_baseline_mib']:.0f} MiB |")
    ref, our = base.get("pytorch rolling", {}), base.get("gst-latent rolling", {})
    if "latents_per_second" in ref and "latents_per_second" in our:
        lines += ["", f"rolling, gst-latent / PyTorch: {our['latents_per_second'] / ref['latents_per_second']:.2f}x "
                      f"latent frames/s, {our['frames_per_second'] / ref['frames_per_second']:.2f}x frames/s end "
                      "to end (medians)."]
    lines += ["", "| latents | gst-latent fifo: peak above baseline | RSS first -> last sample | "
                  "PyTorch rolling: peak above baseline |", "|---|---|---|---|"]
    for row in results["memory"]:
        o, t = row["gst-latent fifo"], row["pytorch rolling"]

        def peak(r):
            return f"{r['rss_peak_above_baseline_bytes'] / MIB:.0f} MiB" if r.get("status") == "ok" else r["status"]

        drift = ""
        if o.get("status") == "ok" and o["rss_samples"]:
            s = o["rss_samples"]
            drift = f"{s[0]['rss_bytes'] / MIB:.0f} -> {s[-1]['rss_bytes'] / MIB:.0f} MiB"
        lines.append(f"| {row['latents']} | {peak(o)} | {drift} | {peak(t)} |")
    return "\n".join(lines) + "\n"
