#!/usr/bin/env python3
"""Trains gst-latent's embedded default model: a small Wan 2.1-architecture causal video VAE.

    models/recipes/train_default_vae.py prepare            # fetch photographs + evaluation clips (Debian packages)
    models/recipes/train_default_vae.py train --minutes 90 # resumable: run it again to continue from the checkpoint
    models/recipes/train_default_vae.py train --device cuda --budget-minutes 15.5 ...   # the shipped run (model card)
    models/recipes/train_default_vae.py eval               # PSNR / SSIM on the held-out clips
    models/recipes/train_default_vae.py export             # models/latent-tiny-wan.safetensors (+ latent statistics)

Training data are still photographs from Debian wallpaper packages, turned into video by synthetic camera
motion (pan, zoom, rotation), cuts, a second photograph moving in front as an occluding object, and lighting
ramps. Evaluation uses real video clips from Debian's opencv-doc package, which are never used for training.
Everything lives under --work (default build/train-default-vae) and is resumable; use --device cuda where a
GPU exists.
"""

import argparse
import json
import math
import os
import random
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

TOP = Path(__file__).resolve().parents[2]

# Smaller widths than Wan 2.1 (base_dim 96), same structure: 4x temporal, 8x spatial, 16 latent channels.
# dim_mult puts the width at low resolution, where it is cheap; the full-resolution level stays narrow. Widths
# are multiples of 8 because oneDNN's blocked CPU layouts pad channels to 8: 12 channels ran as slowly as 16,
# and 8 twice as fast (latent-bench, 320x176, 2 cores).
MODEL_CONFIG = {
    "base_dim": 8,
    "z_dim": 16,
    "dim_mult": [1, 2, 4, 8],
    "num_res_blocks": 1,
    "attn_scales": [],
    "temperal_downsample": [False, True, True],
    "dropout": 0.0,
}

TRAIN_PACKAGES = ["gnome-backgrounds", "mate-backgrounds", "plasma-workspace-wallpapers", "ukui-wallpapers"]
EVAL_PACKAGE = "opencv-doc"
# Real footage for evaluation only (path inside opencv-doc, frames used).
EVAL_CLIPS = {
    "vtest": "usr/share/doc/opencv-doc/examples/data/vtest.avi",
    "tree": "usr/share/doc/opencv-doc/examples/data/tree.avi",
    "box": "usr/share/doc/opencv-doc/opencv4/html/box.mp4.gz",
    "cup": "usr/share/doc/opencv-doc/opencv4/html/cup.mp4.gz",
}
EVAL_W, EVAL_H, EVAL_FRAMES = 320, 176, 65


def log(*a):
    print(time.strftime("%H:%M:%S"), *a, flush=True)


# ----------------------------------------------------------------------------------------------- data


def fetch_package(name, work):
    debs = work / "debs"
    root = work / "pkgs" / name
    if (root / ".done").exists():
        return root
    debs.mkdir(parents=True, exist_ok=True)
    if not list(debs.glob(f"{name}_*.deb")):
        subprocess.run(["apt-get", "download", name], cwd=debs, check=True)
    deb = sorted(debs.glob(f"{name}_*.deb"))[-1]
    root.mkdir(parents=True, exist_ok=True)
    subprocess.run(["dpkg-deb", "-x", str(deb), str(root)], check=True)
    (root / ".done").write_text(deb.name + "\n")
    return root


def load_photo(path, short_side):
    from PIL import Image

    im = Image.open(path).convert("RGB")
    w, h = im.size
    s = short_side / min(w, h)
    im = im.resize((max(1, round(w * s)), max(1, round(h * s))), Image.LANCZOS)
    return torch.from_numpy(np.asarray(im).copy()).permute(2, 0, 1).contiguous()


def decode_clip(path, frames, width=EVAL_W, height=EVAL_H):
    """Decodes with GStreamer: centre crop to the target aspect, scale, RGB; returns uint8 [T, H, W, 3]."""
    path = Path(path)
    if path.suffix == ".gz":  # opencv-doc ships two of its clips gzipped
        import gzip
        import shutil

        plain = path.with_suffix("")
        if not plain.exists():
            with gzip.open(path) as f, open(plain, "wb") as g:
                shutil.copyfileobj(f, g)
        path = plain
    pipe = (
        f"filesrc location={path} ! decodebin ! videoconvert ! aspectratiocrop aspect-ratio={width}/{height} ! videoscale ! "
        f"video/x-raw,format=RGB,width={width},height={height} ! fdsink fd=1"
    )
    out = subprocess.run(["gst-launch-1.0", "-q"] + pipe.split(), check=True, capture_output=True).stdout
    a = np.frombuffer(out, np.uint8)
    n = a.size // (width * height * 3)
    a = a[: n * width * height * 3].reshape(n, height, width, 3)
    return a[:frames].copy()


def prepare(work):
    work.mkdir(parents=True, exist_ok=True)
    bank_path = work / "photos.pt"
    if not bank_path.exists():
        photos, sources = [], []
        for pkg in TRAIN_PACKAGES:
            root = fetch_package(pkg, work)
            files = sorted(
                p
                for p in root.rglob("*")
                if p.suffix.lower() in (".jpg", ".jpeg", ".png", ".webp") and p.stat().st_size > 150_000
            )
            # Several sizes of one wallpaper are the same picture; keep the largest.
            seen = {}
            for p in files:
                key = str(p.parent) if p.parent.name == "images" else re.sub(r"_\d+x\d+$", "", str(p.with_suffix("")))
                if key not in seen or p.stat().st_size > seen[key].stat().st_size:
                    seen[key] = p
            for p in sorted(seen.values()):
                try:
                    photos.append(load_photo(p, 400))
                    sources.append(f"{pkg}:{p.relative_to(root)}")
                except Exception as e:  # a broken picture in a package is skipped, not fatal
                    log("skip", p, e)
        torch.save({"photos": photos, "sources": sources}, bank_path)
        log(f"{len(photos)} photographs from {', '.join(TRAIN_PACKAGES)}")
    clips_path = work / "eval-clips.npz"
    if not clips_path.exists():
        root = fetch_package(EVAL_PACKAGE, work)
        clips = {name: decode_clip(root / rel, EVAL_FRAMES) for name, rel in EVAL_CLIPS.items()}
        np.savez_compressed(clips_path, **clips)
        log("evaluation clips:", {k: v.shape for k, v in clips.items()})
    return torch.load(bank_path), dict(np.load(clips_path))


def smooth(t):
    return t * t * (3 - 2 * t)


def synth_clip(photos, T, H, W, rng):
    """One training clip [3, T, H, W] in [-1, 1] from still photographs, with motion a camera and a scene
    would produce; every transform is a differentiable-free resampling of a real photograph."""
    out = torch.empty(3, T, H, W, device=photos[0].device)
    cuts = [0]
    if T > 2 and rng.random() < 0.15:
        cuts.append(rng.randint(1, T - 1))
    cuts.append(T)
    for a, b in zip(cuts[:-1], cuts[1:]):
        out[:, a:b] = shot(photos, b - a, H, W, rng)
    return out


def camera_grid(hs, ws, T, H, W, rng, device):
    scale0 = rng.uniform(0.6, 1.6)
    scale1 = scale0 * math.exp(rng.gauss(0, 0.08 * T / 8))
    ang0 = rng.gauss(0, 0.05)
    ang1 = ang0 + rng.gauss(0, 0.04 * T / 8)
    span = rng.choice([2.0, 6.0, 14.0])  # slow, medium and fast pans, pixels per frame at output scale
    dx, dy = rng.gauss(0, span), rng.gauss(0, span / 2)
    ts = torch.linspace(0, 1, T) if T > 1 else torch.zeros(1)
    ys, xs = torch.meshgrid(torch.arange(H, device=device) - (H - 1) / 2,
                            torch.arange(W, device=device) - (W - 1) / 2, indexing="ij")
    grids = []
    margin_x = max(0.0, ws / 2 - W * max(scale0, scale1) * 0.75)
    margin_y = max(0.0, hs / 2 - H * max(scale0, scale1) * 0.75)
    cx = rng.uniform(-margin_x, margin_x)
    cy = rng.uniform(-margin_y, margin_y)
    ease = rng.random() < 0.5
    for t in ts.tolist():
        u = smooth(t) if ease else t
        s = scale0 + (scale1 - scale0) * u
        an = ang0 + (ang1 - ang0) * u
        px = cx + dx * (T - 1) * u * s
        py = cy + dy * (T - 1) * u * s
        c, si = math.cos(an), math.sin(an)
        sx = (c * xs - si * ys) * s + px
        sy = (si * xs + c * ys) * s + py
        grids.append(torch.stack([sx / (ws / 2), sy / (hs / 2)], -1))
    return torch.stack(grids)


def shot(photos, T, H, W, rng):
    img = photos[rng.randrange(len(photos))].float() / 127.5 - 1
    if rng.random() < 0.5:
        img = img.flip(-1)
    hs, ws = img.shape[-2:]
    grid = camera_grid(hs, ws, T, H, W, rng, img.device)
    frames = F.grid_sample(img[None].expand(T, -1, -1, -1), grid, mode="bilinear", padding_mode="reflection",
                           align_corners=False)
    if rng.random() < 0.6:  # an occluding object: a disc of another photograph crossing the frame
        obj = photos[rng.randrange(len(photos))].float() / 127.5 - 1
        og = camera_grid(obj.shape[-2], obj.shape[-1], T, H, W, rng, obj.device)
        tex = F.grid_sample(obj[None].expand(T, -1, -1, -1), og, padding_mode="reflection", align_corners=False)
        r = rng.uniform(0.15, 0.45) * H
        x0, y0 = rng.uniform(0, W), rng.uniform(0, H)
        vx, vy = rng.gauss(0, 6), rng.gauss(0, 4)
        ys, xs = torch.meshgrid(torch.arange(H, device=obj.device).float(),
                                torch.arange(W, device=obj.device).float(), indexing="ij")
        ax, ay = rng.uniform(0.6, 1.4), rng.uniform(0.6, 1.4)
        for t in range(T):
            d = ((xs - x0 - vx * t) / ax) ** 2 + ((ys - y0 - vy * t) / ay) ** 2
            m = torch.clamp(r - d.sqrt(), 0, 1.5) / 1.5
            frames[t] = frames[t] * (1 - m) + tex[t] * m
    if rng.random() < 0.4:  # lighting change: gain and tint ramps
        g0, g1 = rng.uniform(0.7, 1.3), rng.uniform(0.7, 1.3)
        tint = torch.tensor([rng.uniform(0.93, 1.07) for _ in range(3)], device=frames.device)
        for t in range(T):
            u = t / max(1, T - 1)
            gain = (g0 + (g1 - g0) * u) * (1 + (tint - 1) * u)
            frames[t] = ((frames[t] + 1) * gain[:, None, None]) - 1
    return frames.clamp(-1, 1).permute(1, 0, 2, 3)


def batch(photos, B, T, H, W, rng):
    return torch.stack([synth_clip(photos, T, H, W, rng) for _ in range(B)])


# ----------------------------------------------------------------------------------------------- model


def make_model(config=None, fresh=False):
    from diffusers import AutoencoderKLWan

    model = AutoencoderKLWan(**(config or MODEL_CONFIG))
    if fresh:
        # Variance-preserving convolutions. With PyTorch's default init (each conv shrinks the variance about
        # threefold) the output barely depended on the input, and 300 steps later the model still drew one
        # grey-green blob for every picture (12 dB held out; a per-picture mean colour scores 16-18 dB).
        with torch.no_grad():
            for m in model.modules():
                if isinstance(m, (torch.nn.Conv2d, torch.nn.Conv3d)):
                    m.weight.normal_(0.0, 1.0 / math.sqrt(m.weight[0].numel()))
                    if m.bias is not None:
                        m.bias.zero_()
            # Posterior noise starts small (std e^-4), for users who ask for samples of a model trained on means.
            z = model.quant_conv.bias.shape[0] // 2
            model.quant_conv.bias[z:] = -8.0
    return model


@torch.no_grad()
def init_time_convs(model):
    """Starts the temporal layers as a plain codec of time: the encoder's stride-2 time convolutions average
    the two new frames, the decoder's frame-doubling ones repeat the current frame. The picture phase never
    trains them, and random ones gave 9 dB on real clips whose first frames were already good."""
    for name, m in model.named_modules():
        if not name.endswith("time_conv"):
            continue
        w = m.weight  # [out, in, 3, 1, 1]; taps: two frames back, one back, current
        w.zero_()
        m.bias.zero_()
        c = w.shape[1]
        eye = torch.eye(c, dtype=w.dtype)
        if w.shape[0] == c:  # encoder: 2 frames -> 1
            w[:, :, 1, 0, 0] = 0.5 * eye
            w[:, :, 2, 0, 0] = 0.5 * eye
        else:  # decoder: 1 frame -> 2 (channels [frame 0 | frame 1])
            w[:c, :, 2, 0, 0] = eye
            w[c:, :, 2, 0, 0] = eye


def gaussian_window(size=11, sigma=1.5):
    x = torch.arange(size).float() - size // 2
    g = torch.exp(-(x**2) / (2 * sigma**2))
    g = g / g.sum()
    return (g[:, None] * g[None, :])[None, None]


def ssim(a, b, window=None):
    """Mean SSIM of images in [-1, 1] given as [N, C, H, W] (frames flattened into N)."""
    a = (a + 1) / 2
    b = (b + 1) / 2
    c = a.shape[1]
    w = (window if window is not None else gaussian_window()).to(a).expand(c, 1, -1, -1)
    mu_a = F.conv2d(a, w, groups=c)
    mu_b = F.conv2d(b, w, groups=c)
    saa = F.conv2d(a * a, w, groups=c) - mu_a**2
    sbb = F.conv2d(b * b, w, groups=c) - mu_b**2
    sab = F.conv2d(a * b, w, groups=c) - mu_a * mu_b
    c1, c2 = 0.01**2, 0.03**2
    s = ((2 * mu_a * mu_b + c1) * (2 * sab + c2)) / ((mu_a**2 + mu_b**2 + c1) * (saa + sbb + c2))
    return s.mean()


def frames_of(x):
    return x.permute(0, 2, 1, 3, 4).reshape(-1, x.shape[1], x.shape[3], x.shape[4])


# ----------------------------------------------------------------------------------------------- train


def save_checkpoint(path, state):
    tmp = path.with_suffix(".tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)


def model_config(args):
    """MODEL_CONFIG with the widths asked for on the command line (the checkpoint records what was trained)."""
    config = dict(MODEL_CONFIG)
    if args.base_dim:
        config["base_dim"] = args.base_dim
    if args.dim_mult:
        config["dim_mult"] = [int(v) for v in args.dim_mult.split(",")]
    return config


class Schedule:
    """Where training stands: by steps (`--steps`, `--image-steps`), or by trained time when `--budget-minutes`
    is set. A GPU's step rate is not known ahead, so a run given a time budget spends its first
    `--image-fraction` on pictures and the rest on clips, each phase with its own warm-up and cosine decay."""

    def __init__(self, args):
        self.args = args
        self.timed = args.budget_minutes > 0

    def progress(self, step, seconds):
        """(phase, fraction of the phase done), phase 1 = pictures, 2 = clips."""
        a = self.args
        if self.timed:
            u = seconds / (a.budget_minutes * 60)
            split = a.image_fraction
        else:
            u = step / max(1, a.steps)
            split = a.image_steps / max(1, a.steps)
        if u < split:
            return 1, u / max(split, 1e-9)
        return 2, (u - split) / max(1 - split, 1e-9)

    def done(self, step, seconds):
        return seconds >= self.args.budget_minutes * 60 if self.timed else step >= self.args.steps

    def lr(self, phase_step, fraction):
        """Warm-up and cosine decay in each phase: clips begin with freshly initialised time layers that need the
        full rate (phase 2 from the picture phase's end rate of 7e-5 stalled at 17 dB)."""
        peak = self.args.lr
        if phase_step < 50:
            return peak * (phase_step + 1) / 50
        return peak * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * min(1.0, fraction))))


def train(args):
    work = Path(args.work)
    bank, clips = prepare(work)
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = True  # fixed shapes per phase: let cuDNN pick its fastest kernels
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    # The synthetic clips are made where the model runs: on a GPU, the CPU would otherwise feed it too slowly.
    photos = [p.to(device) for p in bank["photos"]]
    config = model_config(args)
    model = make_model(config, fresh=True).to(device)
    ema = make_model(config).to(device)
    ema.load_state_dict(model.state_dict())
    ema.requires_grad_(False)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.99), weight_decay=1e-4)
    ckpt = work / "checkpoint.pt"
    step, seen_seconds, phase_start = 0, 0.0, {1: 0, 2: None}
    rng = random.Random(args.seed)
    if ckpt.exists():
        st = torch.load(ckpt, map_location=device, weights_only=False)
        if st["config"] != config:
            raise SystemExit(f"{ckpt} holds a model of another config ({st['config']}); use another --work")
        model.load_state_dict(st["model"])
        ema.load_state_dict(st["ema"])
        opt.load_state_dict(st["opt"])
        step, seen_seconds = st["step"], st["seconds"]
        phase_start = {1: 0, 2: st.get("phase2_step")}
        if phase_start[2] is None and not args.budget_minutes and step >= args.image_steps:
            phase_start[2] = args.image_steps  # checkpoints from before phase2_step was recorded
        rng.setstate(st["rng"])
        torch.set_rng_state(st["torch_rng"])
        log(f"resumed at step {step} ({seen_seconds / 60:.1f} min trained)")
    else:
        torch.manual_seed(args.seed)
    sched = Schedule(args)
    first_step = step
    window = gaussian_window().to(device)
    start = time.time()
    last_save = start
    last_eval = start
    history = []
    hist_path = work / "history.jsonl"

    def trained_seconds():
        return seen_seconds + time.time() - start

    def state():
        return {"model": model.state_dict(), "ema": ema.state_dict(), "opt": opt.state_dict(), "step": step,
                "seconds": trained_seconds(), "rng": rng.getstate(), "phase2_step": phase_start[2],
                "torch_rng": torch.get_rng_state(), "config": config}

    while not sched.done(step, trained_seconds()) and time.time() - start < args.minutes * 60:
        phase, fraction = sched.progress(step, trained_seconds())
        # Pictures first: the spatial code is most of the work and single frames cost an eighth of a clip step,
        # so the first phase takes many more (and noisier) steps in the same time. Then mostly 5-frame clips
        # (first frame alone + one 4-frame chunk); every 4th step longer ones, so the steady-state chunk (cache
        # from a 4-frame chunk) is trained too.
        if phase == 2 and phase_start[2] is None:
            phase_start[2] = step
            init_time_convs(model)
            init_time_convs(ema)
            log(f"step {step}: clips from now on")
        if phase == 1:
            x = batch(photos, args.image_batch or args.batch, 1, args.image_size, args.image_size, rng)
        elif step % 4 == 3:
            x = batch(photos, args.batch // 2 or 1, args.long_frames, args.size, args.size, rng)
        else:
            x = batch(photos, args.batch, 5, args.size, args.size, rng)
        lr = sched.lr(step - phase_start[phase], fraction)
        for g in opt.param_groups:
            g["lr"] = lr
        post = model.encode(x).latent_dist
        # The decoder learns from the posterior mean, which is what the elements emit (sample=false). Sampling
        # with a small KL weight let Adam raise the log-variance step by step (its normalised update ignores
        # how small the KL gradient is) until the noise drowned the latents: 12 dB after 250 steps. The latent
        # scale is kept in check by the KL's mean term alone.
        z = post.mean
        y = model.decode(z).sample
        l1 = (y - x).abs().mean()
        s = ssim(frames_of(y), frames_of(x), window)
        kl = 0.5 * (z**2).sum() / x.shape[0]
        loss = l1 + args.ssim_weight * (1 - s) + args.kl_weight * kl
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gn = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        with torch.no_grad():
            d = min(args.ema, (1 + step) / (10 + step))
            for pe, pm in zip(ema.parameters(), model.parameters()):
                pe.lerp_(pm, 1 - d)
        step += 1
        if step % args.log_every == 0 or step < 5:
            mse = F.mse_loss(y.detach(), x).item()
            history.append({"step": step, "phase": phase, "lr": lr, "loss": loss.item(), "l1": l1.item(),
                            "ssim": s.item(), "kl": kl.item(), "psnr": 10 * math.log10(4 / max(mse, 1e-10)),
                            "grad": gn.item(), "seconds": round(trained_seconds(), 1)})
            h = history[-1]
            log(f"step {step} phase {phase} lr {lr:.2e} "
                + " ".join(f"{k} {h[k]:.4f}" for k in ("loss", "l1", "ssim", "kl", "psnr"))
                + f" {(time.time() - start) / max(1, step - first_step):.3f} s/step")
        now = time.time()
        if now - last_save > args.save_minutes * 60:
            save_checkpoint(ckpt, state())
            with open(hist_path, "a") as f:
                f.writelines(json.dumps(r) + "\n" for r in history)
            history.clear()
            last_save = now
        if now - last_eval > args.eval_minutes * 60:
            m = evaluate(ema, {"vtest": clips["vtest"][:17]}, device)
            log("held-out vtest[:17] (EMA):", m)
            last_eval = time.time()
    save_checkpoint(ckpt, state())
    with open(hist_path, "a") as f:
        f.writelines(json.dumps(r) + "\n" for r in history)
    log(f"stopped at step {step} ({trained_seconds() / 60:.1f} min trained)")


# ----------------------------------------------------------------------------------------------- eval


def psnr_of(a, b):
    mse = np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2)
    return 10 * math.log10(255.0**2 / max(mse, 1e-12))


@torch.no_grad()
def reconstruct(model, frames_u8, device):
    x = torch.from_numpy(frames_u8).float().div(127.5).sub(1).permute(3, 0, 1, 2)[None].to(device)
    z = model.encode(x).latent_dist.mode()
    y = model.decode(z).sample
    return ((y[0].permute(1, 2, 3, 0).clamp(-1, 1) + 1) * 127.5).round().byte().cpu().numpy(), z


@torch.no_grad()
def evaluate(model, clips, device):
    model.eval()
    out = {}
    for name, a in clips.items():
        r, _ = reconstruct(model, a, device)
        ta = torch.from_numpy(a).float().permute(0, 3, 1, 2) / 127.5 - 1
        tr = torch.from_numpy(r).float().permute(0, 3, 1, 2) / 127.5 - 1
        out[name] = {"frames": int(a.shape[0]), "psnr": round(psnr_of(r, a), 2), "ssim": round(ssim(tr, ta).item(), 4)}
    return out


def load_vae_file(path):
    """A VAE exported by `export` (or any AutoencoderKLWan safetensors file with its config in __metadata__),
    as the diffusers module and its config."""
    from safetensors import safe_open
    from safetensors.torch import load_file

    with safe_open(str(path), "pt") as f:
        config = json.loads(f.metadata()["config"])
    model = make_model({k: v for k, v in config.items() if not k.startswith("_")})
    model.load_state_dict(load_file(str(path)))
    return model.eval(), config


def load_trained(work, device, which="ema"):
    st = torch.load(Path(work) / "checkpoint.pt", map_location=device, weights_only=False)
    model = make_model(st["config"]).to(device)
    model.load_state_dict(st[which])
    return model.eval(), st


def cmd_eval(args):
    _, clips = prepare(Path(args.work))
    torch.set_num_threads(args.threads)
    model, st = load_trained(args.work, args.device, args.weights)
    res = evaluate(model, clips, args.device)
    print(json.dumps({"step": st["step"], "clips": res}, indent=2))


@torch.no_grad()
def cmd_export(args):
    work = Path(args.work)
    bank, clips = prepare(work)
    torch.set_num_threads(args.threads)
    model, st = load_trained(work, args.device, args.weights)
    # Per-channel latent statistics over synthetic clips, so diffusion users can normalise as with Wan 2.1.
    rng = random.Random(1234)
    zs = []
    for _ in range(24):
        x = batch(bank["photos"], 2, 9, 128, 128, rng).to(args.device)
        zs.append(model.encode(x).latent_dist.mode().transpose(0, 1).reshape(16, -1))
    z = torch.cat(zs, 1)
    config = dict(st["config"])
    config["latents_mean"] = [round(v, 6) for v in z.mean(1).tolist()]
    config["latents_std"] = [round(v, 6) for v in z.std(1).tolist()]
    config["_class_name"] = "AutoencoderKLWan"
    res = {} if args.skip_eval else evaluate(model, clips, args.device)
    from safetensors.torch import save_file

    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    sd = {k: v.float().contiguous().cpu() for k, v in model.state_dict().items()}
    meta = {
        "config": json.dumps(config),
        "family": "wan2.1",
        # Its own latent space: the latent caps say model=latent-tiny-wan, so real Wan 2.1 refuses its latents.
        "model_id": out.stem,
        "training_steps": str(st["step"]),
        "weights": args.weights,
        "training_minutes": f"{st['seconds'] / 60:.1f}",
        "heldout": json.dumps(res),
    }
    save_file(sd, str(out) + ".tmp", metadata=meta)
    os.replace(str(out) + ".tmp", out)
    os.chmod(out, 0o644)
    print(json.dumps({"output": str(out), "bytes": out.stat().st_size, "step": st["step"], "clips": res,
                      "config": config}, indent=2))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("command", choices=["prepare", "train", "eval", "export"])
    ap.add_argument("--work", default=str(TOP / "build" / "train-default-vae"))
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--minutes", type=float, default=60.0, help="wall-clock budget of this train run")
    ap.add_argument("--steps", type=int, default=6000, help="length of the learning-rate schedule")
    ap.add_argument("--budget-minutes", type=float, default=0.0,
                    help="schedule by trained time instead of --steps (for GPUs, whose step rate is not known ahead)")
    ap.add_argument("--image-fraction", type=float, default=0.3, help="with --budget-minutes: the picture phase")
    ap.add_argument("--batch", type=int, default=4, help="clips per step")
    ap.add_argument("--image-batch", type=int, default=0, help="pictures per step in phase 1 (default: --batch)")
    ap.add_argument("--image-size", type=int, default=96, help="picture crop of phase 1, pixels")
    ap.add_argument("--image-steps", type=int, default=1500, help="steps on single frames before clips")
    ap.add_argument("--size", type=int, default=128, help="training crop, pixels")
    ap.add_argument("--long-frames", type=int, default=9, help="frames of every 4th clip batch (half as many clips)")
    ap.add_argument("--base-dim", type=int, default=0, help="model width (default: MODEL_CONFIG's)")
    ap.add_argument("--dim-mult", default="", help="width multipliers per level, e.g. 1,2,4,8")
    ap.add_argument("--log-every", type=int, default=25)
    ap.add_argument("--lr", type=float, default=2e-4)  # 1e-3 stalls (17 dB even on one fixed batch)
    ap.add_argument("--ssim-weight", type=float, default=0.2)
    ap.add_argument("--kl-weight", type=float, default=1e-6)
    ap.add_argument("--ema", type=float, default=0.998)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--save-minutes", type=float, default=5.0)
    ap.add_argument("--eval-minutes", type=float, default=15.0)
    ap.add_argument("--weights", choices=["ema", "model"], default="ema",
                    help="eval/export: the moving average of the weights, or the last step's")
    ap.add_argument("--skip-eval", action="store_true", help="export without measuring the held-out clips")
    ap.add_argument("--output", default=str(TOP / "models" / "latent-tiny-wan.safetensors"))
    args = ap.parse_args()
    {"prepare": lambda a: prepare(Path(a.work)), "train": train, "eval": cmd_eval, "export": cmd_export}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
