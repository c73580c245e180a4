#!/usr/bin/env python3
"""latent-gen-small: the architecture of gst-latent's default video generator, as a PyTorch module.

A small factorised video denoiser in the latents of the default VAE (latent-tiny-wan: 16 channels, 128x128 video
-> 16x16 latents). It takes one noise level per latent frame and predicts the flow velocity (noise - x0); it has
no text conditioning. core/src/gen/models/small_denoiser.cpp runs the same network in C++ from the file save() writes;
tests/core/gen/test_small_denoiser.cpp compares the two (fixtures: tests/fixtures/gen_small_denoiser_fixtures.py).

    .venv/bin/python models/recipes/gen_small_model.py --random OUT.safetensors [--seed N]   # random weights, for tests

Structure (every choice's reason is next to its code):
    t [B, T] -> sinusoid -> MLP -> e [B, T, E]            one embedding per latent frame
    x [B, C, T, h, w] -> stem 3x3 -> down levels -> up levels (nearest x2, concat skip) -> GN, SiLU, 3x3 -> out
    a block = 2-D residual block per frame (GN, SiLU, 3x3; FiLM from e; GN, SiLU, 3x3) then a causal temporal
              residual (GN, SiLU, conv over time with kernel k, k-1 zero frames in front)
Output frame t depends only on input frames <= t (and their levels), so a window's prefix gives the same
predictions as the prefix alone: FIFO queues and rolling windows need no special model.

The default config has 2.19 M parameters (8.8 MB as float32); a call on 8 latent frames of 16x16 takes ~30 ms in
the C++ backend and ~40 ms in eager PyTorch on 2 CPU cores.

Tensor names (the C++ loader reads exactly these):
    time_in.{weight,bias} time_out.{weight,bias} stem.{weight,bias}
    down.<i>.blocks.<j>.{norm1,conv1,film,conv2,skip,tnorm,tconv}.{weight,bias}   (skip only when widths differ)
    down.<i>.downsample.{weight,bias}   (all levels but the last)
    up.<i>.upsample.{weight,bias}  up.<i>.blocks.<j>....   (levels 0 .. L-2, run from L-2 down to 0)
    norm_out.{weight,bias} conv_out.{weight,bias}
"""
import argparse
import json
import math
import os

import torch
import torch.nn.functional as F
from torch import nn

ARCHITECTURE = "latent-gen-small"

DEFAULT_CONFIG = {
    # The default VAE's latent channels.
    "in_channels": 16,
    # One width per level; one 2x downsampling between consecutive levels. Two levels (16x16 and 8x8 latents at
    # 128x128 video) keep the model small and fast on a CPU; the coarse level doubles the width where it is cheap.
    # Multiples of 8: oneDNN's blocked CPU layouts pad channels to 8, so other widths cost as much as the next 8.
    "widths": [80, 160],
    # Residual blocks per level (each with its temporal residual); the up path has the same number.
    "blocks_per_level": 2,
    # Frames a temporal conv sees (its own and k-1 earlier). 3 with ~6 blocks on the way gives a receptive
    # field of ~13 latent frames (~50 video frames), enough for motion without a long context.
    "temporal_kernel": 3,
    # GroupNorm groups: 8 divides every width above with 10 or 20 channels a group.
    "groups": 8,
    # Sinusoid size of the timestep and width of the embedding MLP.
    "freq_dim": 64,
    "embed_dim": 256,
}

# The sinusoid's longest period, in timestep units (timesteps run 0..1000).
MAX_PERIOD = 10000.0


def timestep_embedding(t, dim):
    """[..., ] float -> [..., dim]: cos then sin of t * 10000^(-i/half), computed in float32.

    Float32 whatever the model's dtype: half precision cannot hold t * freq for t near 1000 to the precision the
    high frequencies need."""
    half = dim // 2
    freqs = torch.exp(torch.arange(half, dtype=torch.float32, device=t.device) * (-math.log(MAX_PERIOD) / half))
    args = t.float()[..., None] * freqs
    return torch.cat([torch.cos(args), torch.sin(args)], dim=-1)


def per_frame(fn, x):
    """Applies a 2-D module to every frame: [B, C, T, H, W] -> [B*T, C, H, W] -> fn -> back."""
    b, c, t, h, w = x.shape
    y = fn(x.transpose(1, 2).reshape(b * t, c, h, w))
    return y.reshape(b, t, y.shape[1], y.shape[2], y.shape[3]).transpose(1, 2)


class Block(nn.Module):
    """A per-frame residual block with FiLM from the frame's noise embedding, then a causal temporal residual."""

    def __init__(self, cin, cout, cfg):
        super().__init__()
        g, e, k = cfg["groups"], cfg["embed_dim"], cfg["temporal_kernel"]
        # GroupNorm (not BatchNorm): statistics per sample and frame, so nothing depends on the batch or on
        # other frames (causality), and it behaves the same in training and inference.
        self.norm1 = nn.GroupNorm(g, cin)
        self.conv1 = nn.Conv2d(cin, cout, 3, padding=1)
        # FiLM: per-frame scale and shift after the second norm. Every frame has its own noise level (diffusion
        # forcing), so the conditioning must be per frame; FiLM is the cheapest way to make every block see it.
        self.film = nn.Linear(e, 2 * cout)
        # No affine here: FiLM's (1 + scale, shift) already is one, per frame.
        self.norm2 = nn.GroupNorm(g, cout, affine=False)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1)
        self.skip = nn.Conv2d(cin, cout, 1) if cin != cout else None
        # Temporal mixing factorised from the spatial one (a (k,1,1) conv instead of (k,3,3)): 1/3 of a 3-D
        # conv's cost per block, and frames still exchange information at every block and level.
        self.tnorm = nn.GroupNorm(g, cout)
        self.tconv = nn.Conv3d(cout, cout, (k, 1, 1))
        self.k = k
        # Residual branches start at zero: the untrained network is the identity plus the stem/out convs, which
        # keeps early training stable (the usual choice for diffusion U-Nets).
        nn.init.zeros_(self.conv2.weight)
        nn.init.zeros_(self.conv2.bias)
        nn.init.zeros_(self.tconv.weight)
        nn.init.zeros_(self.tconv.bias)

    def forward(self, x, emb):
        """x [B, C, T, H, W]; emb [B, T, E] (already through SiLU)."""
        b, _, t, hh, ww = x.shape
        f = x.transpose(1, 2).reshape(b * t, x.shape[1], hh, ww)
        h = self.conv1(F.silu(self.norm1(f)))
        scale, shift = self.film(emb.reshape(b * t, -1))[:, :, None, None].chunk(2, dim=1)
        h = self.norm2(h) * (1 + scale) + shift
        h = self.conv2(F.silu(h))
        h = h + (self.skip(f) if self.skip is not None else f)
        h = h.reshape(b, t, h.shape[1], hh, ww).transpose(1, 2)
        # Causal: k-1 zero frames in front, none behind, so output frame t sees input frames t-k+1..t only.
        # Zeros rather than a repeated first frame: a window's first frame then means the same thing wherever
        # the window starts.
        r = per_frame(lambda z: F.silu(self.tnorm(z)), h)
        r = self.tconv(F.pad(r, (0, 0, 0, 0, self.k - 1, 0)))
        return h + r


class Level(nn.Module):
    def __init__(self, cin, cout, cfg, resample):
        super().__init__()
        n = cfg["blocks_per_level"]
        self.blocks = nn.ModuleList([Block(cin if j == 0 else cout, cout, cfg) for j in range(n)])
        if resample == "down":
            # A strided conv, not pooling: learnable, and as cheap.
            self.downsample = nn.Conv2d(cout, cout, 3, stride=2, padding=1)
        elif resample == "up":
            # Nearest x2 then a 3x3 conv (from the coarser width to this level's): no checkerboard artefacts,
            # unlike a transposed conv.
            self.upsample = nn.Conv2d(cin, cout, 3, padding=1)


def check_config(cfg):
    cfg = dict(cfg)
    unknown = set(cfg) - set(DEFAULT_CONFIG)
    if unknown:
        raise ValueError(f"unknown config keys {sorted(unknown)}")
    for key in DEFAULT_CONFIG:
        if key not in cfg:
            raise ValueError(f"config lacks {key}")
    if not 1 <= len(cfg["widths"]) <= 4:
        raise ValueError("widths needs 1 to 4 levels")
    for w in cfg["widths"]:
        if w % cfg["groups"]:
            raise ValueError(f"width {w} is not a multiple of groups {cfg['groups']}")
    if cfg["freq_dim"] % 2:
        raise ValueError("freq_dim must be even")
    return cfg


class LatentGenSmall(nn.Module):
    def __init__(self, config=None):
        super().__init__()
        cfg = check_config(DEFAULT_CONFIG if config is None else config)
        self.config = cfg
        c, widths, e = cfg["in_channels"], cfg["widths"], cfg["embed_dim"]
        levels = len(widths)
        self.time_in = nn.Linear(cfg["freq_dim"], e)
        self.time_out = nn.Linear(e, e)
        self.stem = nn.Conv2d(c, widths[0], 3, padding=1)
        self.down = nn.ModuleList([
            Level(widths[max(i - 1, 0)], widths[i], cfg, "down" if i + 1 < levels else None) for i in range(levels)
        ])
        # up[i] brings level i+1's features back to level i; its first block takes the concatenated skip.
        self.up = nn.ModuleList()
        for i in range(levels - 1):
            lvl = Level(widths[i + 1], widths[i], cfg, "up")
            lvl.blocks[0] = Block(2 * widths[i], widths[i], cfg)
            self.up.append(lvl)
        self.norm_out = nn.GroupNorm(cfg["groups"], widths[0])
        self.conv_out = nn.Conv2d(widths[0], c, 3, padding=1)

    @property
    def size_multiple(self):
        return 2 ** (len(self.config["widths"]) - 1)

    def forward(self, x, timesteps, text=None):
        """x [B, C, T, h, w] noisy latents; timesteps [B, T] each frame's level in 0..1000 (0: clean).
        Returns the flow velocity [B, C, T, h, w] (float32 when x is)."""
        if text is not None:
            raise ValueError("latent-gen-small takes no text conditioning")
        b, _, t, hh, ww = x.shape
        if timesteps.shape != (b, t):
            raise ValueError(f"timesteps {tuple(timesteps.shape)}, expected {(b, t)}")
        m = self.size_multiple
        if hh % m or ww % m:
            raise ValueError(f"latent size {hh}x{ww} is not a multiple of {m}")
        emb = timestep_embedding(timesteps, self.config["freq_dim"]).to(x.dtype)
        # Every block applies SiLU before its FiLM layer; doing it once here is the same and cheaper.
        emb = F.silu(self.time_out(F.silu(self.time_in(emb))))
        h = per_frame(self.stem, x)
        skips = []
        for i, lvl in enumerate(self.down):
            for blk in lvl.blocks:
                h = blk(h, emb)
            if hasattr(lvl, "downsample"):
                skips.append(h)
                h = per_frame(lvl.downsample, h)
        for i in reversed(range(len(self.up))):
            lvl = self.up[i]
            h = per_frame(lambda z: lvl.upsample(F.interpolate(z, scale_factor=2.0, mode="nearest")), h)
            h = torch.cat([h, skips.pop()], dim=1)
            for blk in lvl.blocks:
                h = blk(h, emb)
        return per_frame(lambda z: self.conv_out(F.silu(self.norm_out(z))), h)


def save(model, path, steps=20, shift=3.0, window=16, extra=None):
    """Writes the weights (float32) and the contract the C++ loader reads into one .safetensors file, atomically.

    steps / shift: the Euler sampler's defaults users get; window: the most latent frames per call (the causal
    model accepts any count; this bounds a call's memory and stays near the training clip length)."""
    from safetensors.torch import save_file

    meta = {
        "architecture": ARCHITECTURE,
        "config": json.dumps(model.config),
        "prediction": "flow",
        "latent_space": "latent-tiny-wan",
        "sampler": "euler",
        "steps": str(int(steps)),
        "shift": repr(float(shift)),
        "window": str(int(window)),
    }
    meta.update(extra or {})
    sd = {k: v.detach().float().contiguous().cpu() for k, v in model.state_dict().items()}
    tmp = str(path) + ".tmp"
    save_file(sd, tmp, metadata=meta)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


@torch.no_grad()
def randomize(model, seed):
    """Random values everywhere, norm affines and biases included, so that a tensor read into the wrong place
    changes the output. Scales keep activations of order 1 through the network."""
    g = torch.Generator().manual_seed(seed)
    for mod in model.modules():
        if isinstance(mod, (nn.Conv2d, nn.Conv3d, nn.Linear)):
            fan_in = mod.weight[0].numel()
            mod.weight.copy_(torch.randn(mod.weight.shape, generator=g) / math.sqrt(fan_in))
            mod.bias.copy_(0.1 * torch.randn(mod.bias.shape, generator=g))
        elif isinstance(mod, nn.GroupNorm) and mod.affine:
            mod.weight.copy_(1 + 0.25 * torch.randn(mod.weight.shape, generator=g))
            mod.bias.copy_(0.1 * torch.randn(mod.bias.shape, generator=g))
    return model


def load(path):
    """The model saved by save() and its __metadata__ (all strings)."""
    from safetensors import safe_open
    from safetensors.torch import load_file

    with safe_open(str(path), "pt") as f:
        meta = f.metadata()
    model = LatentGenSmall(json.loads(meta["config"]))
    model.load_state_dict(load_file(str(path)))
    return model.eval(), meta


def parameter_count(model):
    return sum(p.numel() for p in model.parameters())


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--random", metavar="OUT.safetensors", required=True, help="write random weights here")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--config", help="JSON object overriding keys of the default config")
    args = ap.parse_args()
    cfg = dict(DEFAULT_CONFIG)
    if args.config:
        cfg.update(json.loads(args.config))
    model = randomize(LatentGenSmall(cfg), args.seed)
    save(model, args.random)
    print(json.dumps({"output": args.random, "parameters": parameter_count(model), "config": model.config}))


if __name__ == "__main__":
    main()
