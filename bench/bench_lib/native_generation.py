"""tools/bench --generate --native: the native Wan 2.1 denoiser (a diffusers pipeline folder loaded by
latent::load_denoiser, stepped by latent::Generator's clip schedule in latent-gen-bench) against diffusers'
WanPipeline on the same folder (wan_ref_runner.py), eager float32 on the CPU with the same thread count.

The folder is made at bench time: random weights in a small Wan 2.1 architecture (CONFIG), chosen so that one
model call over a 128x128 clip of 33 frames (9 latent frames of 16x16) takes about half a second on two cores,
with the real text width (4096) and length (512 tokens, zero past the prompt, as Wan's umT5 embeddings come). Both
sides start from the same noise (the Generator's seeded CPU draw, which torch.randn reproduces) and run the
folder's UniPC for --steps steps, with guidance (two calls a step) and without. Each measurement is a fresh
process; the sides alternate and swap order every repetition. Reported: time per step (median over the steps of
every run), peak RSS of the process, and the largest difference of the final latents relative to diffusers'
largest value, which shows the two timed the same computation.

--model ti2v: the same bench on a Wan 2.2 TI2V-5B-shaped folder (TI2V_CONFIG: the 5B's full width and 48-channel
latents, fewer layers), whose model_index.json sets expand_timesteps and whose vae/config.json is the Wan 2.2 VAE's
(no VAE weights: the denoiser only needs the latent space the config names). diffusers' WanPipeline then runs its
per-token timestep path ([B, seq] timesteps); the runner reports the timestep shape it saw.
"""
import hashlib
import json
import os
import statistics
import subprocess
import sys
import time

TOP = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
REF = os.path.join(TOP, "bench", "bench_lib", "wan_ref_runner.py")
MIB = 1024 * 1024

# Wan 2.1's layout (patch 1x2x2, qk RMS norm across heads, cross-attention norm, 4096-wide text of 512 tokens) at
# a width a 2-core CPU runs a model call of the clip below in about half a second: 12 heads as the 1.3B model has,
# of 40 instead of 128 dims, 8 instead of 30 layers, the FFN at 5.3x the width (the 1.3B model: 5.8x).
CONFIG = dict(patch_size=(1, 2, 2), num_attention_heads=12, attention_head_dim=40, in_channels=16, out_channels=16,
              text_dim=4096, freq_dim=256, ffn_dim=2560, num_layers=8, cross_attn_norm=True,
              qk_norm="rms_norm_across_heads", eps=1e-6, rope_max_seq_len=1024)
SCHEDULER = dict(prediction_type="flow_prediction", use_flow_sigmas=True, num_train_timesteps=1000, flow_shift=3.0)
WEIGHT_SEED = 2025
TEXT_TOKENS = 512
# Non-zero tokens of the prompt and of the negative prompt: a two-sentence prompt, and about the length Wan's
# default negative prompt has in umT5 tokens.
PROMPT_TOKENS = 38
NEGATIVE_TOKENS = 126
LATENTS, HEIGHT, WIDTH = 9, 16, 16  # 33 frames of 128x128: 576 tokens against the text's 512
NOISE_SEED = 42

# Wan 2.2 TI2V-5B's transformer config but for its depth: 2 of its 30 layers. Each layer of the 5B is 164 M
# parameters (0.66 GB in float32) and the embeddings and head another 90 M, so 2 layers are 418 M (1.7 GB). What
# sets the count is time, not memory (4 layers would peak at about 3.5 GB native and 6.5 GB in diffusers, which
# builds the module and then loads the file into it): a full-width layer costs about 4 CPU seconds per model call
# at 576 tokens, and the bench makes repeat x (1 + 2) x steps calls a side (without guidance, then with it).
TI2V_CONFIG = dict(patch_size=(1, 2, 2), num_attention_heads=24, attention_head_dim=128, in_channels=48,
                   out_channels=48, text_dim=4096, freq_dim=256, ffn_dim=14336, num_layers=2, cross_attn_norm=True,
                   qk_norm="rms_norm_across_heads", eps=1e-6, rope_max_seq_len=1024)
# The TI2V-5B folder's UniPC: Wan 2.1's with flow shift 5.
TI2V_SCHEDULER = dict(SCHEDULER, flow_shift=5.0)
# The Wan 2.2 VAE's config (AutoencoderKLWan, residual, 48 latent channels, 16 pixels a latent): only its latent
# space is read by the denoiser's loader; no weights are written. latents_mean/std, which only the pipeline's
# decode uses, are 0 and 1 for the 48 channels.
TI2V_VAE = dict(base_dim=160, decoder_base_dim=256, z_dim=48, dim_mult=[1, 2, 4, 4], num_res_blocks=2,
                attn_scales=[], temperal_downsample=[False, True, True], dropout=0.0, latents_mean=[0.0] * 48,
                latents_std=[1.0] * 48, is_residual=True, in_channels=12, out_channels=12, patch_size=2,
                scale_factor_temporal=4, scale_factor_spatial=16)

# --model: the folder each bench makes. The default's key stays what it was, so its cached folder is reused.
MODELS = {
    "wan2.1": dict(title="Wan 2.1", folder="wan2.1-native-small", config=CONFIG, scheduler=SCHEDULER, vae=None,
                   index={}, spatial_factor=8, steps=5, results="generate-native"),
    "ti2v": dict(title="Wan 2.2 TI2V-5B-shaped", folder="wan2.2-ti2v-native", config=TI2V_CONFIG,
                 scheduler=TI2V_SCHEDULER, vae=TI2V_VAE, index={"expand_timesteps": True}, spatial_factor=16,
                 steps=3, results="generate-native-ti2v"),
}


def log(msg):
    print(f"[bench] {time.strftime('%H:%M:%S')} {msg}", file=sys.stderr, flush=True)


def ensure_pipeline(cache, model="wan2.1"):
    """The random-weight pipeline folder of MODELS[model] and its prompt embeddings, made once per config under
    cache."""
    m = MODELS[model]
    parts = [m["config"], m["scheduler"], WEIGHT_SEED, PROMPT_TOKENS, NEGATIVE_TOKENS]
    if m["vae"] or m["index"]:
        parts += [m["vae"], m["index"]]
    key = hashlib.sha1(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:10]
    root = os.path.join(cache, f"{m['folder']}-{key}")
    stamp = os.path.join(root, "stamp")
    text_file = os.path.join(root, "text.safetensors")
    if os.path.exists(stamp):
        return root, text_file
    import diffusers
    import torch
    from diffusers import UniPCMultistepScheduler, WanTransformer3DModel
    from safetensors.torch import save_file

    log(f"making the random-weight pipeline folder {root}")
    torch.manual_seed(WEIGHT_SEED)
    network = WanTransformer3DModel(**m["config"]).eval()
    network.save_pretrained(os.path.join(root, "transformer"), safe_serialization=True)
    del network
    UniPCMultistepScheduler(**m["scheduler"]).save_pretrained(os.path.join(root, "scheduler"))
    index = {"_class_name": "WanPipeline", "_diffusers_version": diffusers.__version__,
             "scheduler": ["diffusers", "UniPCMultistepScheduler"],
             "transformer": ["diffusers", "WanTransformer3DModel"]}
    if m["vae"]:
        os.makedirs(os.path.join(root, "vae"), exist_ok=True)
        with open(os.path.join(root, "vae", "config.json"), "w") as f:
            json.dump(dict({"_class_name": "AutoencoderKLWan", "_diffusers_version": diffusers.__version__},
                           **m["vae"]), f, indent=2)
        index["vae"] = ["diffusers", "AutoencoderKLWan"]
    with open(os.path.join(root, "model_index.json"), "w") as f:
        json.dump(dict(index, **m["index"]), f, indent=2)
    g = torch.Generator().manual_seed(WEIGHT_SEED + 1)
    text_dim = m["config"]["text_dim"]
    text = torch.zeros(1, TEXT_TOKENS, text_dim)
    negative = torch.zeros_like(text)
    # umT5's final RMS norm leaves activations of a few tenths; zero past the prompt, as WanPipeline pads.
    text[:, :PROMPT_TOKENS] = 0.2 * torch.randn(1, PROMPT_TOKENS, text_dim, generator=g)
    negative[:, :NEGATIVE_TOKENS] = 0.2 * torch.randn(1, NEGATIVE_TOKENS, text_dim, generator=g)
    save_file({"text": text, "negative_text": negative}, text_file)
    open(stamp, "w").close()
    return root, text_file


def cpu_share(r, threads):
    if r.get("status") != "ok" or not r.get("generate_seconds"):
        return None
    return r["generate_cpu_seconds"] / (r["generate_seconds"] * threads)


def measure(cmd, timeout, threads, min_share, retries, wait):
    """One measurement process, measured again (at most `retries` times) when others took its cores."""
    from .measure import wait_for_quiet

    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    env.setdefault("PYTHONWARNINGS", "ignore")
    rejected = []
    for attempt in range(1 + retries):
        busy, waited = wait_for_quiet(*wait) if wait[0] > 0 else (None, 0.0)
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
        except subprocess.TimeoutExpired:
            return {"status": "timeout", "timeout_seconds": timeout, "cmd": cmd}
        if p.returncode != 0:
            return {"status": "failed", "returncode": p.returncode, "stderr": p.stderr[-2000:], "cmd": cmd}
        r = json.loads(p.stdout.strip().splitlines()[-1])
        r.update(status="ok", cmd=cmd, others_cpu_busy_before=busy, waited_for_quiet_seconds=waited)
        r["cpu_share"] = cpu_share(r, threads)
        if r["cpu_share"] is None or r["cpu_share"] >= min_share:
            break
        rejected.append({k: r.get(k) for k in ("generate_seconds", "cpu_share")})
        if attempt == retries:
            r["contended"] = True
        else:
            log(f"  got {100 * r['cpu_share']:.0f}% of the cores (another process ran); measuring again")
    if rejected:
        r["contended_attempts"] = rejected if not r.get("contended") else rejected[:-1]
    return r


def describe(r):
    if r.get("status") != "ok":
        return r.get("status", "?") + (f": {r.get('stderr', '')[-300:]}" if r.get("stderr") else "")
    return (f"{statistics.median(r['step_seconds']):.3f} s/step (median of {len(r['step_seconds'])}), "
            f"{r['model_calls']} calls in {r['generate_seconds']:.2f} s, peak RSS {r['rss_peak_bytes'] / MIB:.0f} MiB "
            f"(+{r['rss_peak_above_baseline_bytes'] / MIB:.0f}), CPU share {r['cpu_share']:.2f}")


def max_rel_diff(a_file, b_file):
    from safetensors.torch import load_file

    a, b = load_file(a_file)["latents"], load_file(b_file)["latents"]
    if a.shape != b.shape:
        return None
    return float((a - b).abs().max() / b.abs().max())


def summarise(ours, theirs):
    # A run that got a fraction of the cores measured the other processes as much as itself (at half the cores a
    # step took up to 5x as long here): the medians leave such runs out while a side has any other.
    def ok(rs):
        done = [r for r in rs if r.get("status") == "ok"]
        return [r for r in done if not r.get("contended")] or done

    def steps(rs):
        vals = [s for r in ok(rs) for s in r["step_seconds"]]
        return statistics.median(vals) if vals else None

    def med(rs, key):
        vals = [r[key] for r in ok(rs) if r.get(key) is not None]
        return statistics.median(vals) if vals else None

    s = {"ours_step_seconds": steps(ours), "theirs_step_seconds": steps(theirs),
         # Per-run means: each run's whole loop (sampler and guidance arithmetic included) over its steps.
         "ours_wall_per_step": med([dict(r, w=r["generate_seconds"] / r["steps"]) for r in ok(ours)], "w"),
         "theirs_wall_per_step": med([dict(r, w=r["generate_seconds"] / r["steps"]) for r in ok(theirs)], "w"),
         # The process's peak over its life: loading (diffusers builds the module, then loads the weights into it)
         # or generating, whichever is higher.
         "ours_rss_peak": med([dict(r, p=max(r["rss_peak_bytes"], r["rss_peak_loading_bytes"])) for r in ok(ours)], "p"),
         "theirs_rss_peak": med([dict(r, p=max(r["rss_peak_bytes"], r["rss_peak_loading_bytes"])) for r in ok(theirs)],
                                "p"),
         "ours_rss_baseline": med(ours, "rss_baseline_bytes"), "theirs_rss_baseline": med(theirs, "rss_baseline_bytes"),
         "ours_above_baseline": med(ours, "rss_peak_above_baseline_bytes"),
         "theirs_above_baseline": med(theirs, "rss_peak_above_baseline_bytes"),
         "ours_rss_peak_loading": med(ours, "rss_peak_loading_bytes"),
         "theirs_rss_peak_loading": med(theirs, "rss_peak_loading_bytes"),
         "ours_cpu_share": med(ours, "cpu_share"), "theirs_cpu_share": med(theirs, "cpu_share"),
         "ours_runs_ok": len(ok(ours)), "theirs_runs_ok": len(ok(theirs)),
         "contended_in_medians": sum(1 for r in ok(ours) + ok(theirs) if r.get("contended")),
         "contended_left_out": sum(1 for r in ours + theirs if r.get("contended")) -
         sum(1 for r in ok(ours) + ok(theirs) if r.get("contended"))}
    for k in ("step_seconds", "wall_per_step", "rss_peak", "above_baseline"):
        o, t = s[f"ours_{k}"], s[f"theirs_{k}"]
        s[f"{k}_ratio"] = o / t if o and t else None
    return s


def run(args, binary, out_dir):
    threads = args.threads or os.cpu_count()
    repeat = args.repeat or 3
    name = args.model or "wan2.1"
    model = MODELS[name]
    steps = args.steps or model["steps"]
    timeout = args.timeout or 900
    wait = (args.wait_idle, args.wait_max or 120)
    retries = 2 if args.retries < 0 else args.retries
    root, text_file = ensure_pipeline(args.cache, name)
    scratch = os.path.join(args.cache, "native-latents" + ("" if name == "wan2.1" else f"-{name}"))
    os.makedirs(scratch, exist_ok=True)
    os.makedirs(out_dir, exist_ok=True)
    from .measure import machine_info

    spatial = model["spatial_factor"]
    results = {"mode": "generate-native", "model": name, "about": __doc__.strip().split("\n\n")[0].replace("\n", " "),
               "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "machine": machine_info("cpu"),
               "commit": subprocess.run(["git", "-C", TOP, "rev-parse", "--short", "HEAD"], capture_output=True,
                                        text=True).stdout.strip(),
               "settings": {"threads": threads, "repeat": repeat, "steps": steps, "dtype": "float32",
                            "latents": LATENTS, "latent_height": HEIGHT, "latent_width": WIDTH,
                            "video": f"{1 + 4 * (LATENTS - 1)}x{spatial * HEIGHT}x{spatial * WIDTH}",
                            "text_tokens": TEXT_TOKENS,
                            "prompt_tokens": PROMPT_TOKENS, "negative_tokens": NEGATIVE_TOKENS, "seed": NOISE_SEED,
                            "min_cpu_share": args.min_cpu_share, "retries": retries, "wait_idle": wait[0]},
               "config": model["config"], "scheduler": model["scheduler"], "vae": model["vae"],
               "model_index": model["index"], "pipeline": root, "cases": []}

    def save():
        with open(os.path.join(out_dir, results_name(results) + ".json"), "w") as f:
            json.dump(results, f, indent=1)

    def cmd(side, guidance, latents_file):
        common = ["--latents", str(LATENTS), "--height", str(HEIGHT), "--width", str(WIDTH), "--steps", str(steps),
                  "--guidance", str(guidance), "--threads", str(threads), "--seed", str(NOISE_SEED),
                  "--text", text_file, "--save-latents", latents_file]
        if side == "ours":
            return [binary, "--generator", root, "--schedule", "clip", "--json"] + common
        return [sys.executable, REF, "--pipeline", root] + common

    log(f"native {model['title']} denoiser against WanPipeline: {results['settings']['video']} video, {steps} steps, "
        f"{repeat} repetitions, {threads} threads")
    for gi, guidance in enumerate((1.0, 5.0)):
        runs = {"ours": [], "diffusers": []}
        for i in range(repeat):
            order = ("ours", "diffusers") if (gi + i) % 2 == 0 else ("diffusers", "ours")
            for side in order:
                latents_file = os.path.join(scratch, f"{side}-g{guidance:g}-{i}.safetensors")
                r = measure(cmd(side, guidance, latents_file), timeout, threads, args.min_cpu_share, retries, wait)
                runs[side].append(r)
                log(f"  guidance {guidance:g} {i + 1}/{repeat} {side:9s} {describe(r)}")
        case = {"guidance": guidance, "calls_per_step": 2 if guidance != 1 else 1, "ours": runs["ours"],
                "diffusers": runs["diffusers"], "summary": summarise(runs["ours"], runs["diffusers"])}
        a = [r for r in runs["ours"] if r.get("status") == "ok"]
        b = [r for r in runs["diffusers"] if r.get("status") == "ok"]
        if a and b:
            case["summary"]["latents_max_rel_diff"] = max_rel_diff(a[0]["latents_file"], b[0]["latents_file"])
            # Every run of a side starts from the same noise: a run that differs from the first did other work.
            case["summary"]["ours_runs_identical"] = all(
                max_rel_diff(r["latents_file"], a[0]["latents_file"]) == 0 for r in a[1:])
        case["summary"]["theirs_timestep_shapes"] = timestep_shapes(runs["diffusers"])
        results["cases"].append(case)
        save()
    return render(results, out_dir)


def timestep_shapes(runs):
    """The shapes of the timestep diffusers' transformer was called with: [B] per call, or [B, seq] per token (the
    path expand_timesteps takes)."""
    return sorted({tuple(r["timestep_shape"]) for r in runs if r.get("timestep_shape")})


def results_name(results):
    return MODELS[results.get("model", "wan2.1")]["results"] + "-results"


def render(results, out_dir):
    """Summarises the cases again (from an earlier results file too) and writes the markdown table."""
    for c in results["cases"]:
        keep = {k: v for k, v in c["summary"].items() if k in ("latents_max_rel_diff", "ours_runs_identical")}
        c["summary"] = dict(summarise(c["ours"], c["diffusers"]), **keep)
        c["summary"]["theirs_timestep_shapes"] = timestep_shapes(c["diffusers"])
    with open(os.path.join(out_dir, results_name(results) + ".json"), "w") as f:
        json.dump(results, f, indent=1)
    md = markdown(results)
    with open(os.path.join(out_dir, results_name(results) + ".md"), "w") as f:
        f.write(md)
    print(md)
    return 0


def markdown(results):
    st = results["settings"]
    title = MODELS[results.get("model", "wan2.1")]["title"]
    lines = [f"# Native {title} denoiser against diffusers ({results['date']}, {st['threads']} threads, CPU, "
             f"{st['video']} video, {st['steps']} steps)", "",
             "| guidance | calls/step | ours s/step | diffusers s/step | ratio | ours process peak RSS MiB | diffusers "
             "process peak RSS MiB | ratio | ours / diffusers above baseline MiB | CPU share | runs ok | latents max rel diff |",
             "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|"]

    def f(v, fmt):
        return format(v, fmt) if v is not None else "-"

    for c in results["cases"]:
        s = c["summary"]
        mib = lambda k: s[k] / MIB if s.get(k) else None  # noqa: E731
        lines.append(
            f"| {c['guidance']:g} | {c['calls_per_step']} | {f(s['ours_step_seconds'], '.3f')} | "
            f"{f(s['theirs_step_seconds'], '.3f')} | {f(s['step_seconds_ratio'], '.2f')} | "
            f"{f(mib('ours_rss_peak'), '.0f')} | {f(mib('theirs_rss_peak'), '.0f')} | {f(s['rss_peak_ratio'], '.2f')} | "
            f"{f(mib('ours_above_baseline'), '.0f')} / {f(mib('theirs_above_baseline'), '.0f')} | "
            f"{f(s['ours_cpu_share'], '.2f')}, {f(s['theirs_cpu_share'], '.2f')} | "
            f"{s['ours_runs_ok']}/{st['repeat']}, {s['theirs_runs_ok']}/{st['repeat']} | "
            f"{f(s.get('latents_max_rel_diff'), '.1e')} |")
    lines += ["", "Ratios are ours / diffusers: below 1 is faster or leaner. s/step: median over the steps of every "
                  "run (a step is its model calls). runs ok: the runs in the medians (a run that got under "
                  f"{st['min_cpu_share']:.0%} of its cores after the retries is left out while its side has others)."]
    shapes = {s for c in results["cases"] for s in map(tuple, c["summary"].get("theirs_timestep_shapes") or [])}
    if shapes:
        lines += ["", "diffusers' transformer was called with timesteps of shape " +
                  ", ".join("[" + ", ".join(map(str, s)) + "]" for s in sorted(shapes)) +
                  (" (one per token: the expand_timesteps path)." if any(len(s) == 2 for s in shapes) else ".")]
    return "\n".join(lines) + "\n"
