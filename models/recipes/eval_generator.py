#!/usr/bin/env python3
"""Objective figures of the default generator (models/latent-gen-small.md shows them), on clips it never saw.

    models/recipes/eval_generator.py [--model models/latent-gen-small.safetensors] [--json OUT.json]

1. Held-out flow-matching loss on a fixed grid of noise levels (0.1 ... 0.9, fixed noise), next to the loss of
   the best constant predictor (the mean velocity): how much the model learned beyond the data's average.
2. Frechet distance between clip features of generated clips and of held-out clips, with two baselines: the
   held-out clips with their frames shuffled (right content, wrong motion) and pure Gaussian latents. Features
   come from the default VAE's encoder, i.e. from the latents themselves: per clip, each channel's mean over
   space-time and its mean |frame-to-frame change| (32 numbers); with 96 clips a set the covariances are
   estimated from three samples a dimension, so compare the figures with each other, not with published FIDs.
   Generated clips: the clip schedule in Python (the model module, diffusers' Euler scheduler with the file's
   steps and shift), which the C++ generator equals.
3. A long stream from the C++ engine (videogen, fifo, through latentfilesink): per block of 100 latents the
   per-channel mean and standard deviation, and the mean |z_t - z_(t-1)|, against the training clips'. A stream
   that blows up grows its std; one that freezes loses its motion.

Held-out clips and training clips come from models/recipes/train_default_generator.py's bank (build/train-default-
generator/latents.pt); run its `prepare` first.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

TOP = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))

import gen_small_model as gsm  # noqa: E402

GRID = [0.1, 0.3, 0.5, 0.7, 0.9]


@torch.no_grad()
def heldout_loss(model, clips, window):
    x0 = clips[:, :, :window].float()
    g = torch.Generator().manual_seed(1234)
    noise = torch.randn(x0.shape, generator=g)
    # The best constant predictor of noise - x0 is its mean over the set, per channel.
    const = (noise - x0).mean(dim=(0, 2, 3, 4), keepdim=True)
    out = {}
    for s in GRID:
        levels = torch.full(x0.shape[:1] + x0.shape[2:3], s)
        xs = (1 - s) * x0 + s * noise
        v = torch.cat([model(xs[i:i + 16], levels[i:i + 16] * 1000) for i in range(0, len(xs), 16)])
        out[str(s)] = {"model": float(((v - (noise - x0)) ** 2).mean()),
                       "constant": float(((const - (noise - x0)) ** 2).mean())}
    return out


@torch.no_grad()
def generate_clips(model, meta, n, frames, h, w, seed):
    from diffusers import FlowMatchEulerDiscreteScheduler

    sched = FlowMatchEulerDiscreteScheduler(shift=float(meta["shift"]))
    sched.set_timesteps(int(meta["steps"]))
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, model.config["in_channels"], frames, h, w, generator=g)
    for t in sched.timesteps:
        levels = t.float().expand(n, frames)
        v = torch.cat([model(x[i:i + 16], levels[i:i + 16]) for i in range(0, n, 16)])
        x = sched.step(v, t, x).prev_sample
    return x


def features(clips):
    c = clips.float()
    mean = c.mean(dim=(2, 3, 4))
    motion = (c[:, :, 1:] - c[:, :, :-1]).abs().mean(dim=(2, 3, 4))
    return torch.cat([mean, motion], 1).double().numpy()


def psd_sqrt(m):
    vals, vecs = np.linalg.eigh(m)
    return (vecs * np.sqrt(np.clip(vals, 0, None))) @ vecs.T


def frechet(a, b):
    """|mu1 - mu2|^2 + tr(S1 + S2 - 2 (S1 S2)^(1/2)); the trace of the root is that of the symmetric
    S1^(1/2) S2 S1^(1/2), whose eigenvalues numpy gives without scipy."""
    mu1, mu2 = a.mean(0), b.mean(0)
    s1, s2 = np.cov(a, rowvar=False), np.cov(b, rowvar=False)
    r = psd_sqrt(s1)
    cross = np.sqrt(np.clip(np.linalg.eigvalsh(r @ s2 @ r), 0, None)).sum()
    return float(((mu1 - mu2) ** 2).sum() + np.trace(s1) + np.trace(s2) - 2 * cross)


def stream_latents(model_path, count, seed, build):
    """`count` latents from videogen (fifo) through latentfilesink, as [T, C, h, w]."""
    from safetensors.torch import load_file

    env = dict(os.environ, GST_PLUGIN_PATH_1_0=str(TOP / build / "elements"),
               GST_REGISTRY_1_0=str(TOP / build / "eval-registry.bin"))
    frames = 1 + 4 * (count - 1)
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "stream.safetensors")
        subprocess.run(["gst-launch-1.0", "-q", "videogen", f"model={model_path}", f"num-frames={frames}",
                        f"seed={seed}", "schedule=fifo", "!", "latentfilesink", f"location={out}"], check=True, env=env)
        return load_file(out)["latents"].float()


def stream_stats(z, bank, block=100):
    """Per block of `block` latents: channel means and stds, and mean |z_t - z_(t-1)|."""
    blocks = []
    for s in range(0, z.shape[0] - block + 1, block):
        b = z[s:s + block]
        blocks.append({"first": s, "channel_mean": b.mean(dim=(0, 2, 3)).tolist(),
                       "channel_std": b.std(dim=(0, 2, 3)).tolist(),
                       "motion": float((b[1:] - b[:-1]).abs().mean())})
    m0 = np.array(blocks[0]["channel_mean"])
    s0 = np.array(blocks[0]["channel_std"])
    train = bank[:, :, 1:].float()  # later latents (4 frames each), as an endless stream's are
    return {
        "latents": int(z.shape[0]),
        "blocks": len(blocks),
        "max_mean_drift_from_first_block": float(max(np.abs(np.array(b["channel_mean"]) - m0).max() for b in blocks)),
        "std_ratio_to_first_block_min": float(min((np.array(b["channel_std"]) / s0).min() for b in blocks)),
        "std_ratio_to_first_block_max": float(max((np.array(b["channel_std"]) / s0).max() for b in blocks)),
        "overall_std": float(z.std()),
        "motion_per_block": [b["motion"] for b in blocks],
        "training_clips_std": float(train.std()),
        "training_clips_motion": float((train[:, :, 1:] - train[:, :, :-1]).abs().mean()),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=str(TOP / "models" / "latent-gen-small.safetensors"))
    ap.add_argument("--work", default=str(TOP / "build" / "train-default-generator"))
    ap.add_argument("--build", default="build")
    ap.add_argument("--stream-latents", type=int, default=2000)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--json", default="")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    model, meta = gsm.load(a.model)
    bank = torch.load(Path(a.work) / "latents.pt")
    held, train = bank["heldout"], bank["train"]
    window = int(meta["window"])
    h, w = held.shape[3], held.shape[4]
    result = {"model": a.model, "training_steps": meta.get("training_steps"),
              "training_minutes": meta.get("training_minutes"), "heldout_clips": int(held.shape[0])}

    result["heldout_flow_loss"] = heldout_loss(model, held, window)
    print(json.dumps({"heldout_flow_loss": result["heldout_flow_loss"]}), flush=True)

    n = held.shape[0]
    real = features(held[:, :, :window])
    gen = features(generate_clips(model, meta, n, window, h, w, seed=7))
    g = torch.Generator().manual_seed(3)
    shuffled = torch.stack([c[:, torch.randperm(window, generator=g)] for c in held[:, :, :window].float()])
    noise = torch.randn(held[:, :, :window].shape, generator=g)
    result["frechet"] = {"feature_dims": int(real.shape[1]), "clips_per_set": int(n),
                         "generated": frechet(gen, real), "shuffled_frames": frechet(features(shuffled), real),
                         "pure_noise": frechet(features(noise), real)}
    print(json.dumps({"frechet": result["frechet"]}), flush=True)

    if a.stream_latents > 0:
        z = stream_latents(a.model, a.stream_latents, seed=11, build=a.build)
        result["stream"] = stream_stats(z, train)
        print(json.dumps({"stream": {k: v for k, v in result["stream"].items() if k != "motion_per_block"}}),
              flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
