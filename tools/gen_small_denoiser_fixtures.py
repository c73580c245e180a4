#!/usr/bin/env python3
"""Reference fixtures for the native latent-gen-small denoiser (core/src/gen/small_denoiser.cpp): random weights
for the PyTorch module of tools/gen_small_model.py and what PyTorch computes with them.

Usage: .venv/bin/python tools/gen_small_denoiser_fixtures.py OUTDIR     (CPU, a few seconds)

Writes into OUTDIR ("stamp" last, as the build's output marker):
  model.safetensors         the default config, random weights (gen_small_model.randomize), save()'s metadata
  model-3level.safetensors  a tiny 3-level config (size multiple 4, one block a level, temporal kernel 2)
  cases.safetensors         for each case <name>:
      <name>.x          fp32 [1, C, T, h, w] noisy latents
      <name>.timesteps  fp32 [1, T], a different level for each frame (0 = clean context and 1000 included)
      <name>.out        fp32 PyTorch output of the model in float32
      <name>.out64      float64 output of the same weights in float64: shows how far float32 itself is off
    __metadata__ {"cases": JSON list of {"name", "model", "frames", "height", "width"}, "torch"}
"""
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gen_small_model as gsm  # noqa: E402

SEED = 20261124
SMALL_3LEVEL = {"in_channels": 16, "widths": [16, 32, 48], "blocks_per_level": 1, "temporal_kernel": 2,
                "groups": 4, "freq_dim": 32, "embed_dim": 64}
# name, model file, frames, height, width
CASES = [("t1", "model", 1, 16, 16), ("t3", "model", 3, 16, 16), ("t8", "model", 8, 16, 16),
         ("t4_8x24", "model", 4, 8, 24), ("l3_t3_8x12", "model-3level", 3, 8, 12)]


def timesteps_for(frames, g):
    """Distinct per-frame levels in random order, with the extremes present once there are enough frames."""
    t = torch.rand(frames, generator=g) * 1000
    if frames >= 3:
        t[0], t[-1] = 1000.0, 0.0
        t = t[torch.randperm(frames, generator=g)]
    return t.reshape(1, frames)


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    stamp = os.path.join(out, "stamp")
    if os.path.exists(stamp):
        os.remove(stamp)
    torch.manual_seed(SEED)
    models = {
        "model": gsm.randomize(gsm.LatentGenSmall(gsm.DEFAULT_CONFIG), SEED).eval(),
        "model-3level": gsm.randomize(gsm.LatentGenSmall(SMALL_3LEVEL), SEED + 1).eval(),
    }
    for name, m in models.items():
        gsm.save(m, os.path.join(out, name + ".safetensors"))
    g = torch.Generator().manual_seed(SEED + 2)
    tensors, listing = {}, []
    for name, model_name, frames, h, w in CASES:
        m = models[model_name]
        x = torch.randn(1, m.config["in_channels"], frames, h, w, generator=g)
        t = timesteps_for(frames, g)
        with torch.no_grad():
            y = m(x, t)
            y64 = m.double()(x.double(), t.double())
            m.float()
        tensors.update({f"{name}.x": x, f"{name}.timesteps": t, f"{name}.out": y, f"{name}.out64": y64})
        listing.append({"name": name, "model": model_name, "frames": frames, "height": h, "width": w})
        print(f"{name}: max |out| {y.abs().max():.3g}, max |fp32 - fp64| {(y.double() - y64).abs().max():.3g}")
    from safetensors.torch import save_file

    meta = {"cases": json.dumps(listing), "torch": torch.__version__}
    path = os.path.join(out, "cases.safetensors")
    save_file({k: v.contiguous() for k, v in tensors.items()}, path + ".tmp", metadata=meta)
    os.replace(path + ".tmp", path)
    with open(stamp, "w") as f:
        f.write("ok\n")


if __name__ == "__main__":
    main()
