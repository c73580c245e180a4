"""The PyTorch side of the generation benchmark: one fresh process per measurement, printing the keys
latent-gen-bench prints so the two can be tabulated together.

  python bench/bench_lib/gen_ref_runner.py --generator FILE [--vae FILE] --latents N [--steps K]
                                           [--window W] [--context C] [--threads T] [--seed S] [--sample K]

What it runs is what a Python user would write: the latent-gen-small module (models/recipes/gen_small_model.py) in eager
PyTorch, diffusers' FlowMatchEulerDiscreteScheduler for the sigmas and steps, and the rolling schedule
(windows of W frames whose first C are the clean frames carried from the window before); then diffusers'
AutoencoderKLWan decodes all latents at once, as its pipelines do, from diffusion space (z * std + mean).
Only rolling is run: it makes the same model calls (steps per window, W frames each) as latent-gen-bench's
rolling, so the two differ in the engine only.
"""
import argparse
import json
import os
import sys
import time

TOP = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(TOP, "models", "recipes"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import gen_small_model as gsm  # noqa: E402
import train_default_vae as tdv  # noqa: E402
from ref_runner import reset_peak_rss, status_bytes  # noqa: E402


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--generator", required=True)
    p.add_argument("--vae", default="")
    p.add_argument("--latents", type=int, required=True)
    p.add_argument("--steps", type=int, default=0)
    p.add_argument("--window", type=int, default=0)
    p.add_argument("--context", type=int, default=-1)
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--sample", type=int, default=0)
    a = p.parse_args(argv)

    import torch
    from diffusers import FlowMatchEulerDiscreteScheduler

    if a.threads > 0:
        torch.set_num_threads(a.threads)
    t_load = time.perf_counter()
    model, meta = gsm.load(a.generator)
    vae, vae_config = tdv.load_vae_file(a.vae) if a.vae else (None, None)
    load_seconds = time.perf_counter() - t_load
    steps = a.steps or int(meta["steps"])
    window = a.window or int(meta["window"])
    context = a.context if a.context >= 0 else max(1, window // 4)
    h = int(meta.get("native_height", 16))
    w = int(meta.get("native_width", 16))
    channels = model.config["in_channels"]
    sample = a.sample or max(1, a.latents // 10)
    scheduler = FlowMatchEulerDiscreteScheduler(shift=float(meta["shift"]))

    rss_baseline = status_bytes("VmRSS")
    hwm_reset = reset_peak_rss()
    g = torch.Generator().manual_seed(a.seed)
    made, calls, samples = [], 0, []
    carried = None
    start = time.perf_counter()
    first_latent = 0.0
    with torch.inference_mode():
        while len(made) < a.latents:
            c = 0 if carried is None else carried.shape[2]
            fresh = min(window - c, a.latents - len(made))
            x = torch.randn(1, channels, fresh, h, w, generator=g)
            scheduler.set_timesteps(steps)
            for t in scheduler.timesteps:
                levels = torch.cat([torch.zeros(c), t.float().expand(fresh)])[None]
                inp = x if carried is None else torch.cat([carried, x], 2)
                v = model(inp, levels)[:, :, c:]
                calls += 1
                x = scheduler.step(v, t, x).prev_sample
            if not made:
                first_latent = time.perf_counter() - start
            for k in range(fresh):
                made.append(x[:, :, k : k + 1])
                if len(made) % sample == 0:
                    samples.append({"latents": len(made), "rss_bytes": status_bytes("VmRSS")})
            all_frames = x if carried is None else torch.cat([carried, x], 2)
            carried = all_frames[:, :, -context:].clone() if context > 0 else None
        gen_seconds = time.perf_counter() - start
        frames = 0
        decode_seconds = 0.0
        if vae is not None:
            t0 = time.perf_counter()
            z = torch.cat(made, 2)
            mean = torch.tensor(vae_config["latents_mean"]).view(1, -1, 1, 1, 1)
            std = torch.tensor(vae_config["latents_std"]).view(1, -1, 1, 1, 1)
            video = vae.decode(z * std + mean).sample
            frames = video.shape[2]
            decode_seconds = time.perf_counter() - t0
    wall = time.perf_counter() - start
    rss_peak = status_bytes("VmHWM")
    print(json.dumps({
        "impl": "pytorch",
        "generator": a.generator,
        "vae": a.vae,
        "schedule": "rolling",
        "sampler": "euler",
        "steps": steps,
        "window": window,
        "context": context,
        "height": h,
        "width": w,
        "device": "cpu",
        "dtype": "float32",
        "threads": torch.get_num_threads(),
        "runtime": f"torch {torch.__version__}",
        "load_seconds": load_seconds,
        "latents": len(made),
        "frames": frames,
        "frames_expected": 1 + 4 * (a.latents - 1) if vae is not None else 0,
        "model_calls": calls,
        "generate_seconds": gen_seconds,
        "decode_seconds": decode_seconds,
        "wall_seconds": wall,
        "latents_per_second": len(made) / gen_seconds,
        "frames_per_second": frames / wall if vae is not None else 0.0,
        "first_latent_seconds": first_latent,
        "state_bytes": 0,
        "rss_baseline_bytes": rss_baseline,
        "rss_peak_bytes": rss_peak,
        "rss_peak_above_baseline_bytes": rss_peak - rss_baseline,
        "rss_peak_reset": hwm_reset,
        "rss_samples": samples,
    }))


if __name__ == "__main__":
    main()
