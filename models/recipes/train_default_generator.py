#!/usr/bin/env python3
"""Trains gst-latent's default video generator, latent-gen-small, in the latents of the default VAE.

    models/recipes/train_default_generator.py prepare             # photographs -> clips -> default VAE -> latents
    models/recipes/train_default_generator.py train --minutes 40  # resumable: run it again to continue
    models/recipes/train_default_generator.py export              # models/latent-gen-small.safetensors

Training material is the default VAE's own kind (models/recipes/train_default_vae.py): still photographs from
Debian wallpaper packages turned into clips by synthetic camera motion, occluding objects, cuts and lighting ramps.
The clips are encoded by the default VAE (models/latent-tiny-wan.safetensors) to posterior means in diffusion
space, (z - latents_mean) / latents_std, which is what vaeencode hands out and vaedecode takes: the generator makes
exactly what the decoder expects. Every tenth photograph is held out; clips made from those are the held-out set of
models/recipes/eval_generator.py and never reach training.

Objective: flow matching (x_s = (1 - s) x0 + s noise, target noise - x0, timestep 1000 s) with one noise level
per latent frame, drawn so that the model sees what each schedule gives it: independent levels, one shared level
(clip), levels rising along the window (fifo) and clean leading frames at level 0 (rolling context). Everything
lives under --work (default build/train-default-generator) and resumes from its checkpoint.
"""
import argparse
import json
import math
import os
import random
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

TOP = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))

import gen_small_model as gsm  # noqa: E402
import train_default_vae as tdv  # noqa: E402

VAE_FILE = TOP / "models" / "latent-tiny-wan.safetensors"
# 45 frames -> 12 latents at 128x128 -> 16x16: training windows of WINDOW latents are cut from them at random
# starts, so the model learns later latents (4 frames each, what an endless stream is made of) as well as the
# first one (1 frame).
CLIP_FRAMES, SIZE, WINDOW = 45, 128, 8
HELD_OUT_EVERY = 10
# The Euler sampler's defaults written into the model file: 20 steps at shift 3 (Wan's 480p setting) is where
# more steps stopped changing the held-out loss of the trajectories in early runs; shift 3 also shapes the
# training distribution of levels below, so the model is trained where the sampler spends its steps.
STEPS, SHIFT = 20, 3.0


def log(*a):
    print(time.strftime("%H:%M:%S"), *a, flush=True)


def split_photos(photos):
    train = [p for i, p in enumerate(photos) if i % HELD_OUT_EVERY != 0]
    held = [p for i, p in enumerate(photos) if i % HELD_OUT_EVERY == 0]
    return train, held


@torch.no_grad()
def encode_clips(vae, config, photos, count, seed, batch=4):
    """`count` synthetic clips encoded to diffusion-space latents [count, 16, 12, 16, 16] (float16 to halve the
    bank; the rounding, 1e-3 relative, is far below what the model learns)."""
    rng = random.Random(seed)
    mean = torch.tensor(config["latents_mean"]).view(1, -1, 1, 1, 1)
    std = torch.tensor(config["latents_std"]).view(1, -1, 1, 1, 1)
    out = []
    for start in range(0, count, batch):
        n = min(batch, count - start)
        x = tdv.batch(photos, n, CLIP_FRAMES, SIZE, SIZE, rng)
        z = vae.encode(x).latent_dist.mean
        out.append(((z - mean) / std).half())
    return torch.cat(out)


def cmd_prepare(args):
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(args.threads)
    bank_path = work / "latents.pt"
    if bank_path.exists():
        log("bank exists:", bank_path)
        return
    photos = torch.load(Path(args.vae_work) / "photos.pt")["photos"] if (Path(args.vae_work) / "photos.pt").exists() \
        else tdv.prepare(Path(args.vae_work))[0]["photos"]
    train, held = split_photos(photos)
    vae, config = tdv.load_vae_file(VAE_FILE)
    t0 = time.time()
    probe = encode_clips(vae, config, train, 8, seed=99)
    per_clip = (time.time() - t0) / 8
    count = max(64, int(args.prepare_minutes * 60 / per_clip))
    log(f"{len(train)} training and {len(held)} held-out photographs; {per_clip:.2f} s a clip -> {count} clips")
    t0 = time.time()
    bank = encode_clips(vae, config, train, count, seed=args.seed)
    heldout = encode_clips(vae, config, held, args.heldout_clips, seed=args.seed + 1)
    torch.save({"train": bank, "heldout": heldout, "clip_frames": CLIP_FRAMES, "size": SIZE,
                "photos": {"train": len(train), "heldout": len(held)}, "seconds": time.time() - t0}, bank_path)
    log(f"bank: {tuple(bank.shape)} train, {tuple(heldout.shape)} held out, {time.time() - t0:.0f} s; probe mean "
        f"{probe.float().mean():.3f} std {probe.float().std():.3f}")


def shifted(u):
    return SHIFT * u / (1 + (SHIFT - 1) * u)


def draw_levels(b, t, gen):
    """Per-frame noise levels [b, t] and a mask of the frames the loss counts (not clean context)."""
    u = torch.rand(b, t, generator=gen)
    kind = torch.randint(0, 100, (b,), generator=gen)
    levels = shifted(u)
    counted = torch.ones(b, t)
    for i in range(b):
        k = int(kind[i])
        if k < 25:  # clip: one level for the whole window
            levels[i] = shifted(u[i, :1]).expand(t)
        elif k < 50:  # fifo: rising along the window, adjacent queue slots
            lo = float(torch.rand(1, generator=gen)) * 0.7
            span = 0.3 + float(torch.rand(1, generator=gen)) * (1 - lo - 0.3)
            levels[i] = shifted(torch.linspace(lo, lo + span, t))
        elif k < 75:  # rolling: clean leading context, then one level
            c = int(torch.randint(1, t // 2 + 1, (1,), generator=gen))
            levels[i] = shifted(u[i, :1]).expand(t).clone()
            levels[i, :c] = 0.0
            counted[i, :c] = 0.0
        # else: independent levels per frame
    return levels, counted


def make_model(seed):
    torch.manual_seed(seed)
    model = gsm.LatentGenSmall(gsm.DEFAULT_CONFIG)
    # The output starts at zero: the first predictions are the mean velocity, not noise fed back through the
    # sampler.
    with torch.no_grad():
        model.conv_out.weight.zero_()
        model.conv_out.bias.zero_()
    return model


def batch_of(bank, b, gen):
    idx = torch.randint(0, bank.shape[0], (b,), generator=gen)
    # A third of the windows start at the clip's first latent, the rest anywhere.
    starts = torch.randint(0, bank.shape[2] - WINDOW + 1, (b,), generator=gen)
    starts[torch.rand(b, generator=gen) < 0.33] = 0
    return torch.stack([bank[i, :, s:s + WINDOW] for i, s in zip(idx.tolist(), starts.tolist())]).float()


def flow_loss(model, x0, levels, counted, noise):
    s = levels.view(*levels.shape[:1], 1, -1, 1, 1)
    xs = (1 - s) * x0 + s * noise
    v = model(xs, levels * 1000)
    err = ((v - (noise - x0)) ** 2).mean(dim=(1, 3, 4))
    return (err * counted).sum() / counted.sum().clamp(min=1)


def cmd_train(args):
    work = Path(args.work)
    torch.set_num_threads(args.threads)
    bank = torch.load(work / "latents.pt")["train"]
    ckpt = work / "checkpoint.pt"
    model = make_model(args.seed)
    ema = make_model(args.seed)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    step, seconds = 0, 0.0
    if ckpt.exists():
        state = torch.load(ckpt)
        model.load_state_dict(state["model"])
        ema.load_state_dict(state["ema"])
        opt.load_state_dict(state["opt"])
        step, seconds = state["step"], state["seconds"]
        gen = torch.Generator()
        gen.set_state(state["rng"])
        log(f"resumed at step {step} ({seconds / 60:.1f} min trained)")
    else:
        ema.load_state_dict(model.state_dict())
        gen = torch.Generator().manual_seed(args.seed)
    model.train()
    t_run = time.time()
    t_save = time.time()
    losses = []

    def save():
        tmp = ckpt.with_suffix(".tmp")
        torch.save({"model": model.state_dict(), "ema": ema.state_dict(), "opt": opt.state_dict(), "step": step,
                    "seconds": seconds + time.time() - t_run, "rng": gen.get_state()}, tmp)
        os.replace(tmp, ckpt)

    while time.time() - t_run < args.minutes * 60:
        warm = min(1.0, (step + 1) / 200)
        for g in opt.param_groups:
            g["lr"] = args.lr * warm
        x0 = batch_of(bank, args.batch, gen)
        levels, counted = draw_levels(args.batch, WINDOW, gen)
        noise = torch.randn(x0.shape, generator=gen)
        loss = flow_loss(model, x0, levels, counted, noise)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        with torch.no_grad():
            d = min(args.ema, (1 + step) / (10 + step))
            for pe, pm in zip(ema.parameters(), model.parameters()):
                pe.mul_(d).add_(pm.detach(), alpha=1 - d)
            for be, bm in zip(ema.buffers(), model.buffers()):
                be.copy_(bm)
        losses.append(loss.item())
        step += 1
        if step % args.log_every == 0:
            log(f"step {step} loss {sum(losses) / len(losses):.4f} ({(time.time() - t_run) / 60:.1f} min this run)")
            losses = []
        if time.time() - t_save > args.save_minutes * 60:
            save()
            t_save = time.time()
    save()
    log(f"stopped at step {step}")


def cmd_export(args):
    work = Path(args.work)
    state = torch.load(work / "checkpoint.pt")
    model = gsm.LatentGenSmall(gsm.DEFAULT_CONFIG)
    model.load_state_dict(state["ema"])
    bank = torch.load(work / "latents.pt")
    extra = {
        "native_height": str(SIZE // 8),
        "native_width": str(SIZE // 8),
        "temporal_factor": "4",
        "spatial_factor": "8",
        "training_steps": str(state["step"]),
        "training_minutes": f"{state['seconds'] / 60:.1f}",
        "training_data": f"{bank['train'].shape[0]} clips of {CLIP_FRAMES} frames at {SIZE}x{SIZE} from "
                         f"{bank['photos']['train']} photographs (models/recipes/train_default_vae.py's packages), "
                         "encoded by latent-tiny-wan",
    }
    # window: latent frames per call. Training windows were WINDOW long; the causal model accepts any count, and
    # at WINDOW a fifo iteration of 20 levels takes 3 calls.
    gsm.save(model.eval(), args.output, steps=STEPS, shift=SHIFT, window=WINDOW, extra=extra)
    log(f"wrote {args.output} ({os.path.getsize(args.output) / 1e6:.1f} MB), step {state['step']}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("command", choices=["prepare", "train", "export"])
    ap.add_argument("--work", default=str(TOP / "build" / "train-default-generator"))
    ap.add_argument("--vae-work", default=str(TOP / "build" / "train-default-vae"),
                    help="where models/recipes/train_default_vae.py prepare keeps the photographs")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--prepare-minutes", type=float, default=8.0, help="encoding budget of the training bank")
    ap.add_argument("--heldout-clips", type=int, default=96)
    ap.add_argument("--minutes", type=float, default=40.0, help="wall-clock budget of this train run")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--lr", type=float, default=5e-4)
    ap.add_argument("--ema", type=float, default=0.999)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--log-every", type=int, default=25)
    ap.add_argument("--save-minutes", type=float, default=5.0)
    ap.add_argument("--output", default=str(TOP / "models" / "latent-gen-small.safetensors"))
    args = ap.parse_args()
    {"prepare": cmd_prepare, "train": cmd_train, "export": cmd_export}[args.command](args)


if __name__ == "__main__":
    main()
