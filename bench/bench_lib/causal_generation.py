"""tools/bench --generate --causal: gst-latent's causal schedule (latent::Generator with ScheduleKind::causal over a
native Wan folder, in latent-gen-bench) against the reference's own Python loop (Self-Forcing's
CausalInferencePipeline, bench_lib/causal_ref_runner.py), eager float32 on the CPU with the same thread count.

The folder is made at bench time: a random-weight diffusers Wan 2.1 folder of MODELS[--model] (tiny: the causal
fixtures' dims; 1.3b: Wan 2.1 1.3B's width with few layers and small latents) and, beside it, the same weights in
the original Wan names (causal-model.safetensors, what the reference's CausalWanModel loads; the renaming is checked
against diffusers' own converter) and random prompt embeddings [1, 512, text_dim]. Both sides draw the same noise
(seed 42: the reference's torch.manual_seed + randn, which the Generator reproduces) and run the same blocks: chunk
frames each, the steps 1000, 750, 500, 250 warped through shift 5, a context pass, LongLive's window and sink (kv
12, sink 3 by default; --kv-window 0 for Self-Forcing's global cache). Each measurement is a fresh process; the
sides alternate and swap order every repetition.

Reported per side: the time to the first block (first latent frames), latent frames per second over the blocks
after the first (steady state), the process's peak RSS, model calls; the ratios ours / reference; and the largest
difference of the latents relative to the reference's largest value. Without the reference (no --reference-dir,
no /tmp/refs/Self-Forcing) gst-latent is measured alone and the report says why.
"""
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

from . import causal_estimate
from .measure import TOP, log, machine_info
from .native_generation import max_rel_diff, measure

REF = os.path.join(TOP, "bench", "bench_lib", "causal_ref_runner.py")
DEFAULT_REFERENCE = "/tmp/refs/Self-Forcing"
MIB = 1024 * 1024
WEIGHT_SEED = 20261127
TEXT_SEED = 20261128
NOISE_SEED = 42
TEXT_TOKENS = 512
PROMPT_TOKENS = 38  # rows of the prompt; zero after them, as Wan's umT5 embeddings come

# diffusers WanTransformer3DModel configs. tiny: tests/fixtures/gen_causal_fixtures.py's MODEL (dim 32, 2 heads,
# 2 layers, text 24 wide) at its 6x8 latents. 1.3b: Wan 2.1 1.3B's width (12 heads x 128 = 1536, FFN 8960, text
# 4096 wide, freq 256) with 2 of its 30 layers at 16x16 latents (64 tokens a frame against 1560 at 480x832), so a
# run takes minutes on 2 cores.
_WAN = dict(patch_size=(1, 2, 2), in_channels=16, out_channels=16, cross_attn_norm=True,
            qk_norm="rms_norm_across_heads", eps=1e-6, rope_max_seq_len=1024)
MODELS = {
    "tiny": dict(title="tiny (causal fixtures' dims)", folder="wan-causal-tiny",
                 config=dict(_WAN, num_attention_heads=2, attention_head_dim=16, text_dim=24, freq_dim=32, ffn_dim=48,
                             num_layers=2),
                 # A call is a few milliseconds: split over 2 threads it waits at OpenMP's barriers, 20-60x longer
                # when another process holds one of the cores, so both sides run it on one thread.
                height=6, width=8, threads=1, repeat=5, results="generate-causal-tiny"),
    "1.3b": dict(title="Wan 2.1 1.3B-shaped (full width, 2 layers)", folder="wan-causal-1.3b",
                 config=dict(_WAN, num_attention_heads=12, attention_head_dim=128, text_dim=4096, freq_dim=256,
                             ffn_dim=8960, num_layers=2),
                 height=16, width=16, threads=0, repeat=2, results="generate-causal-1.3b"),
}
STEPS = [1000, 750, 500, 250]


def original_config(c):
    """CausalWanModel's constructor arguments for a diffusers Wan config."""
    return dict(model_type="t2v", patch_size=list(c["patch_size"]), text_len=TEXT_TOKENS, in_dim=c["in_channels"],
                dim=c["num_attention_heads"] * c["attention_head_dim"], ffn_dim=c["ffn_dim"], freq_dim=c["freq_dim"],
                text_dim=c["text_dim"], out_dim=c["out_channels"], num_heads=c["num_attention_heads"],
                num_layers=c["num_layers"], qk_norm=True, cross_attn_norm=c["cross_attn_norm"], eps=c["eps"])


# diffusers -> original Wan names, in order (the inverse of diffusers' convert_wan_transformer_to_diffusers for a
# text-to-video model; norm2 and norm3 swap, through a placeholder).
_TO_ORIGINAL = [
    ("condition_embedder.time_embedder.linear_1", "time_embedding.0"),
    ("condition_embedder.time_embedder.linear_2", "time_embedding.2"),
    ("condition_embedder.text_embedder.linear_1", "text_embedding.0"),
    ("condition_embedder.text_embedder.linear_2", "text_embedding.2"),
    ("condition_embedder.time_proj", "time_projection.1"),
    ("attn2", "cross_attn"), ("attn1", "self_attn"),
    (".to_out.0.", ".o."), (".to_q.", ".q."), (".to_k.", ".k."), (".to_v.", ".v."),
    ("ffn.net.0.proj", "ffn.0"), ("ffn.net.2", "ffn.2"),
    ("proj_out", "head.head"),
    ("norm2", "norm__placeholder"), ("norm3", "norm2"), ("norm__placeholder", "norm3"),
]


def original_names(state_dict):
    """The diffusers state dict in the original Wan names; checked by converting back with diffusers' converter."""
    from diffusers.loaders.single_file_utils import convert_wan_transformer_to_diffusers

    out = {}
    for key, value in state_dict.items():
        name = key
        if name == "scale_shift_table":
            name = "head.modulation"
        elif name.endswith(".scale_shift_table"):
            name = name[:-len("scale_shift_table")] + "modulation"
        for a, b in _TO_ORIGINAL:
            name = name.replace(a, b)
        out[name] = value
    back = convert_wan_transformer_to_diffusers(dict(out))
    if set(back) != set(state_dict) or any(back[k] is not state_dict[k] for k in state_dict):
        raise RuntimeError("the original Wan names do not convert back to the diffusers folder's")
    return out


def ensure_folder(cache, name):
    """The random-weight folder of MODELS[name]: a diffusers Wan pipeline folder, the same weights in the original
    names with CausalWanModel's config, and the prompt embeddings; made once per config under cache."""
    m = MODELS[name]
    key = hashlib.sha1(json.dumps([m["config"], WEIGHT_SEED, TEXT_SEED, PROMPT_TOKENS],
                                  sort_keys=True).encode()).hexdigest()[:10]
    root = os.path.join(cache, f"{m['folder']}-{key}")
    files = {"folder": root, "text": os.path.join(root, "text.safetensors"),
             "original": os.path.join(root, "causal-model.safetensors"),
             "original_config": os.path.join(root, "causal-model.json")}
    if os.path.exists(os.path.join(root, "stamp")):
        return files
    import diffusers
    import torch
    from diffusers import UniPCMultistepScheduler, WanTransformer3DModel
    from safetensors.torch import save_file

    log(f"making the random-weight folder {root}")
    torch.manual_seed(WEIGHT_SEED)
    network = WanTransformer3DModel(**m["config"]).eval()
    network.save_pretrained(os.path.join(root, "transformer"), safe_serialization=True)
    state = {k: v.detach().contiguous() for k, v in network.state_dict().items()}
    save_file(original_names(state), files["original"])
    del network, state
    with open(files["original_config"], "w") as f:
        json.dump(original_config(m["config"]), f, indent=2)
    # The scheduler is the folder's for completeness (a causal run takes its own steps, not the folder's sampler).
    UniPCMultistepScheduler(prediction_type="flow_prediction", use_flow_sigmas=True, num_train_timesteps=1000,
                            flow_shift=3.0).save_pretrained(os.path.join(root, "scheduler"))
    with open(os.path.join(root, "model_index.json"), "w") as f:
        json.dump({"_class_name": "WanPipeline", "_diffusers_version": diffusers.__version__,
                   "scheduler": ["diffusers", "UniPCMultistepScheduler"],
                   "transformer": ["diffusers", "WanTransformer3DModel"]}, f, indent=2)
    g = torch.Generator().manual_seed(TEXT_SEED)
    text = torch.zeros(1, TEXT_TOKENS, m["config"]["text_dim"])
    text[:, :PROMPT_TOKENS] = torch.randn(1, PROMPT_TOKENS, m["config"]["text_dim"], generator=g)
    save_file({"text": text}, files["text"])
    open(os.path.join(root, "stamp"), "w").close()
    return files


def private_driver(binary, cache):
    """A copy of the in-tree latent-gen-bench with its core library beside it (its rpath finds ../core), so that a
    rebuild of the tree during the minutes of a run neither replaces the code under a measurement nor pairs the
    driver with a library whose structs have changed."""
    lib = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(binary))), "core", "liblatentcore.so.0")
    if not os.path.exists(lib):
        return binary
    root = os.path.join(cache, "causal-driver")
    for sub in ("bench", "core"):
        os.makedirs(os.path.join(root, sub), exist_ok=True)
    copy = os.path.join(root, "bench", os.path.basename(binary))
    shutil.copy2(binary, copy)
    shutil.copy2(os.path.realpath(lib), os.path.join(root, "core", "liblatentcore.so.0"))
    return copy


def reference_dir(args):
    """The reference's local copy and, without one, why."""
    if args.reference_dir:
        d = args.reference_dir
        if not os.path.exists(os.path.join(d, "pipeline", "causal_inference.py")):
            return None, (f"--reference-dir {d} has no pipeline/causal_inference.py (not a Self-Forcing or LongLive "
                          f"copy)")
        return d, None
    if os.path.exists(os.path.join(DEFAULT_REFERENCE, "pipeline", "causal_inference.py")):
        return DEFAULT_REFERENCE, None
    return None, (f"no reference: Self-Forcing is not on the package index; pass --reference-dir with a local copy "
                  f"(git clone https://github.com/guandeh17/Self-Forcing; commit 33593df) or put one at "
                  f"{DEFAULT_REFERENCE}")


def steady(r):
    """Latent frames per second over the blocks after the first."""
    rest = r["next_seconds"][1:]
    return r["chunk_frames"] * len(rest) / sum(rest) if rest and sum(rest) > 0 else None


def describe(r):
    if r.get("status") != "ok":
        return r.get("status", "?") + (f": {r.get('stderr', '')[-400:]}" if r.get("stderr") else "")
    s = steady(r)
    return (f"first block {r['first_latent_seconds']:.3g} s, steady {s:.3g} latents/s, blocks "
            + " ".join(f"{x:.3g}" for x in r["next_seconds"])
            + f" s, {r['model_calls']} calls, peak RSS "
            f"{max(r['rss_peak_bytes'], r['rss_peak_loading_bytes']) / MIB:.0f} MiB, CPU share {r['cpu_share']:.2f}")


def summarise(ours, theirs):
    def ok(rs):
        done = [r for r in rs if r.get("status") == "ok"]
        return [r for r in done if not r.get("contended")] or done

    def med(rs, f):
        vals = [v for v in (f(r) for r in ok(rs)) if v is not None]
        return statistics.median(vals) if vals else None

    s = {}
    for side, rs in (("ours", ours), ("theirs", theirs)):
        s[f"{side}_first_block_seconds"] = med(rs, lambda r: r["first_latent_seconds"])
        s[f"{side}_steady_latents_per_second"] = med(rs, steady)
        s[f"{side}_block_seconds"] = med(rs, lambda r: statistics.median(r["next_seconds"][1:])
                                         if len(r["next_seconds"]) > 1 else None)
        s[f"{side}_cpu_per_block"] = med(rs, lambda r: r["generate_cpu_seconds"] / len(r["next_seconds"]))
        # The process's peak over its life: loading or generating, whichever is higher.
        s[f"{side}_rss_peak"] = med(rs, lambda r: max(r["rss_peak_bytes"], r["rss_peak_loading_bytes"]))
        s[f"{side}_above_baseline"] = med(rs, lambda r: r["rss_peak_above_baseline_bytes"])
        s[f"{side}_model_calls"] = med(rs, lambda r: r["model_calls"])
        s[f"{side}_cpu_share"] = med(rs, lambda r: r.get("cpu_share"))
        s[f"{side}_runs_ok"] = len(ok(rs))
    for k in ("first_block_seconds", "steady_latents_per_second", "block_seconds", "cpu_per_block", "rss_peak",
              "above_baseline"):
        o, t = s[f"ours_{k}"], s[f"theirs_{k}"]
        s[f"{k}_ratio"] = o / t if o and t else None
    return s


def run(args, binary, out_dir):
    name = args.model or "tiny"
    m = MODELS[name]
    threads = args.threads or m["threads"] or os.cpu_count()
    repeat = args.repeat or m["repeat"]
    blocks = args.blocks or 6
    chunk = 3
    frames = blocks * chunk
    steps = [int(x) for x in args.denoising_steps.split(",")] if args.denoising_steps else STEPS
    kv_window = 12 if args.kv_window is None else args.kv_window
    sink = (3 if kv_window else 0) if args.sink is None else args.sink
    timeout = args.timeout or 900
    wait = (args.wait_idle, args.wait_max or 120)
    retries = 1 if args.retries < 0 else args.retries
    files = ensure_folder(args.cache, name)
    if not args.latent_gen_bench:
        binary = private_driver(binary, args.cache)
    ref, why_not = reference_dir(args)
    scratch = os.path.join(args.cache, f"causal-latents-{name}")
    os.makedirs(scratch, exist_ok=True)
    os.makedirs(out_dir, exist_ok=True)

    results = {"mode": "generate-causal", "model": name, "about": __doc__.strip().split("\n\n")[0].replace("\n", " "),
               "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "machine": machine_info("cpu"),
               "commit": subprocess.run(["git", "-C", TOP, "rev-parse", "--short", "HEAD"], capture_output=True,
                                        text=True).stdout.strip(),
               "settings": {"threads": threads, "repeat": repeat, "blocks": blocks, "chunk_frames": chunk,
                            "frames": frames, "denoising_steps": steps, "kv_window": kv_window, "sink_frames": sink,
                            "latent_height": m["height"], "latent_width": m["width"],
                            "tokens_per_frame": (m["height"] // 2) * (m["width"] // 2), "dtype": "float32",
                            "text_tokens": TEXT_TOKENS, "prompt_tokens": PROMPT_TOKENS, "seed": NOISE_SEED,
                            "min_cpu_share": args.min_cpu_share, "retries": retries, "wait_idle": wait[0]},
               "config": m["config"], "folder": files["folder"], "reference_dir": ref, "reference_missing": why_not,
               "estimate_h100": causal_estimate.estimate(chunk, len(steps), kv_window, sink)}
    if why_not:
        log(why_not + "; measuring gst-latent alone")

    common = ["--height", str(m["height"]), "--width", str(m["width"]), "--chunk", str(chunk), "--kv-window",
              str(kv_window), "--sink", str(sink), "--denoising-steps", ",".join(map(str, steps)), "--threads",
              str(threads), "--seed", str(NOISE_SEED), "--text", files["text"]]

    def cmd(side, latents_file):
        if side == "ours":
            return [binary, "--generator", files["folder"], "--schedule", "causal", "--latents", str(frames),
                    "--json", "--save-latents", latents_file] + common
        return [sys.executable, REF, "--reference-dir", ref, "--model", files["original"], "--config",
                files["original_config"], "--frames", str(frames), "--save-latents", latents_file] + common

    sides = ("ours", "reference") if ref else ("ours",)
    log(f"causal {m['title']}: {blocks} blocks of {chunk} latent frames at {m['height']}x{m['width']}, steps "
        f"{steps}, window {kv_window or 'global'}, sink {sink}, {repeat} repetitions, {threads} threads"
        + (f", reference {ref}" if ref else ""))
    runs = {s: [] for s in sides}
    for i in range(repeat):
        for side in (sides if i % 2 == 0 else sides[::-1]):
            latents_file = os.path.join(scratch, f"{side}-{i}.safetensors")
            r = measure(cmd(side, latents_file), timeout, threads, args.min_cpu_share, retries, wait)
            runs[side].append(r)
            log(f"  {i + 1}/{repeat} {side:9s} {describe(r)}")
    results["ours"], results["reference"] = runs["ours"], runs.get("reference", [])
    finish_summary(results)
    with open(os.path.join(out_dir, m["results"] + "-results.json"), "w") as f:
        json.dump(results, f, indent=1)
    return render(results, out_dir)


def finish_summary(results):
    s = summarise(results["ours"], results["reference"])
    a = [r for r in results["ours"] if r.get("status") == "ok"]
    b = [r for r in results["reference"] if r.get("status") == "ok"]
    if a and b:
        s["latents_max_rel_diff"] = max_rel_diff(a[0]["latents_file"], b[0]["latents_file"])
    if len(a) > 1:
        # Every run of a side starts from the same seed: a run that differs from the first did other work.
        s["ours_runs_identical"] = all(max_rel_diff(r["latents_file"], a[0]["latents_file"]) == 0 for r in a[1:])
    results["summary"] = s


def render(results, out_dir):
    """Writes the markdown table (from an earlier results file too) and prints it."""
    keep = {k: v for k, v in results.get("summary", {}).items() if k in ("latents_max_rel_diff", "ours_runs_identical")}
    results["summary"] = dict(summarise(results["ours"], results["reference"]), **keep)
    name = MODELS[results["model"]]["results"]
    with open(os.path.join(out_dir, name + "-results.json"), "w") as f:
        json.dump(results, f, indent=1)
    md = markdown(results)
    with open(os.path.join(out_dir, name + "-results.md"), "w") as f:
        f.write(md)
    print(md)
    return 0


def markdown(results):
    st, s = results["settings"], results["summary"]
    ref = os.path.basename(results["reference_dir"] or "") or "reference"

    def f(v, fmt, unit=""):
        return format(v, fmt) + unit if v is not None else "-"

    def mib(k):
        return s[k] / MIB if s.get(k) else None

    lines = [f"# Causal generation, {MODELS[results['model']]['title']} ({results['date']}, "
             f"{st['threads']} threads, CPU, float32)", "",
             f"{st['blocks']} blocks of {st['chunk_frames']} latent frames at {st['latent_height']}x"
             f"{st['latent_width']} ({st['tokens_per_frame']} tokens a frame), steps {st['denoising_steps']} and a "
             f"context pass a block, window {st['kv_window'] or 'global'}, sink {st['sink_frames']}; "
             f"{st['repeat']} runs a side, commit {results['commit']}.", ""]
    if results.get("reference_missing"):
        lines += [f"gst-latent alone: {results['reference_missing']}.", ""]
    lines += [f"| | gst-latent | {ref} | ratio |", "|---|--:|--:|--:|",
              f"| time to the first block | {f(s['ours_first_block_seconds'], '.3g', ' s')} | "
              f"{f(s['theirs_first_block_seconds'], '.3g', ' s')} | {f(s['first_block_seconds_ratio'], '.2f')} |",
              f"| steady state, latent frames/s (blocks 2-{st['blocks']}) | "
              f"{f(s['ours_steady_latents_per_second'], '.3g')} | {f(s['theirs_steady_latents_per_second'], '.3g')} | "
              f"{f(s['steady_latents_per_second_ratio'], '.2f')} |",
              f"| CPU seconds a block | {f(s['ours_cpu_per_block'], '.3g')} | {f(s['theirs_cpu_per_block'], '.3g')} | "
              f"{f(s['cpu_per_block_ratio'], '.2f')} |",
              f"| process peak RSS | {f(mib('ours_rss_peak'), '.0f', ' MiB')} | "
              f"{f(mib('theirs_rss_peak'), '.0f', ' MiB')} | "
              f"{f(s['rss_peak_ratio'], '.2f')} |",
              f"| above the loaded model | {f(mib('ours_above_baseline'), '.1f', ' MiB')} | "
              f"{f(mib('theirs_above_baseline'), '.1f', ' MiB')} | {f(s['above_baseline_ratio'], '.2f')} |",
              f"| model calls | {f(s['ours_model_calls'], '.0f')} | {f(s['theirs_model_calls'], '.0f')} | |",
              f"| CPU share, runs in the medians | {f(s['ours_cpu_share'], '.2f')}, "
              f"{s['ours_runs_ok']}/{st['repeat']} | "
              f"{f(s['theirs_cpu_share'], '.2f')}, {s['theirs_runs_ok']}/{st['repeat']} | |",
              "",
              f"Latents, max abs difference / the reference's max abs: {f(s.get('latents_max_rel_diff'), '.1e')}"
              + (f"; every run of ours bitwise the same: {s['ours_runs_identical']}" if "ours_runs_identical" in s
                 else "") + ".",
              "",
              "Ratios are gst-latent / reference (below 1: faster or leaner for times and memory, slower for "
              "frames/s). A block ends with its context pass on both sides.",
              "", causal_estimate.markdown(results["estimate_h100"])]
    return "\n".join(lines) + "\n"
