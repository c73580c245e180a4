#!/usr/bin/env python3
"""Exports a diffusers WanTransformer3DModel to an AOTInductor package that gst-latent loads (load_denoiser).

Usage: .venv/bin/python tools/export_denoiser.py MODEL_DIR OUT.pt2 [options]

MODEL_DIR is a diffusers model folder (config.json + diffusion_pytorch_model*.safetensors), or a pipeline folder
with such a folder in transformer/ (e.g. Wan-AI/Wan2.1-T2V-1.3B-Diffusers). The package takes three inputs:

  latents        [1, C, T, h, w]  noisy latents (T dynamic, min_frames..window; h, w fixed at export)
  timesteps      [1, T] float32   the model's timestep of each latent frame (per-frame noise levels)
  prompt_embeds  [1, L, D]        text conditioning (latent-prompt computes it with the folder's text encoder)

and returns the prediction [1, C, T, h, w]. Its metadata ("latent.*" keys) carries the contract the C++ side checks
before every run: prediction type, latent space, channels, frame window, latent size, text shape, dtype and the
recommended sampler, steps, shift and guidance (docs/generation.md).

Compile where you deploy: a CPU package holds code for this machine's instruction set, a CUDA package kernels
for this GPU. The compile takes minutes for a real model (~1 min for a tiny one on 2 CPU cores).
"""
import argparse
import json
import os
import sys
import tempfile

import torch

FORMAT_VERSION = "1"
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


class PerFrameWan(torch.nn.Module):
    """Feeds Wan one timestep per latent frame: diffusers' WanTransformer3DModel accepts a timestep per token
    ([B, tokens]), so each frame's value is repeated over that frame's patches. Equal values on every frame give
    the scalar-timestep model."""

    def __init__(self, transformer):
        super().__init__()
        self.transformer = transformer
        self.patch = tuple(transformer.config.patch_size)

    def forward(self, latents, timesteps, prompt_embeds):
        b, _, t, h, w = latents.shape
        pt, ph, pw = self.patch
        tokens_per_frame = (h // ph) * (w // pw)
        per_step = timesteps[:, ::pt] if pt > 1 else timesteps
        per_token = per_step[:, :, None].expand(b, t // pt, tokens_per_frame).reshape(b, -1)
        return self.transformer(latents, per_token, prompt_embeds, return_dict=False)[0].float()


def load_transformer(model_dir, dtype):
    from diffusers import WanTransformer3DModel

    folder = model_dir
    if not os.path.exists(os.path.join(folder, "config.json")) and os.path.isdir(os.path.join(folder, "transformer")):
        folder = os.path.join(folder, "transformer")
    with open(os.path.join(folder, "config.json")) as f:
        config = json.load(f)
    if config.get("_class_name") != "WanTransformer3DModel":
        sys.exit(f"{folder}: _class_name is {config.get('_class_name')!r}, this tool exports WanTransformer3DModel")
    # Built from the config and filled by hand: diffusers' from_pretrained needs accelerate for a model that keeps
    # some modules in float32, as Wan does. Sharded checkpoints (*.safetensors.index.json) read the same way.
    from safetensors.torch import load_file

    model = WanTransformer3DModel.from_config(config).eval()
    files = sorted(f for f in os.listdir(folder) if f.endswith(".safetensors"))
    if not files:
        sys.exit(f"{folder}: no .safetensors weights")
    state = {}
    for f in files:
        state.update(load_file(os.path.join(folder, f)))
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        sys.exit(f"{folder}: weights do not fit the config: missing {missing[:5]}, unexpected {unexpected[:5]}")
    model.float()
    if dtype != torch.float32:
        model.to(dtype)
        keep = set(getattr(model, "_keep_in_fp32_modules", None) or [])
        for name, module in model.named_modules():
            if keep.intersection(name.split(".")):
                module.float()
    return model, config


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model_dir")
    p.add_argument("out")
    p.add_argument("--height", type=int, default=480, help="video height in pixels (default 480)")
    p.add_argument("--width", type=int, default=832, help="video width in pixels (default 832)")
    p.add_argument("--vae-factor", type=int, default=8, help="the VAE's spatial compression (Wan 2.1: 8)")
    p.add_argument("--window", type=int, default=21, help="most latent frames per call (Wan 2.1: 21 = 81 frames)")
    p.add_argument("--min-frames", type=int, default=1, help="fewest latent frames per call")
    p.add_argument("--text-tokens", type=int, default=512, help="prompt embedding length (Wan: 512)")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="compile for this device")
    p.add_argument("--dtype", default="float32", choices=sorted(DTYPES))
    p.add_argument("--latent-space", default="wan2.1", help="the VAE model id whose latents it takes")
    p.add_argument("--sampler", default="unipc", choices=["euler", "unipc"], help="recommended sampler")
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--shift", type=float, default=5.0, help="flow shift (Wan 2.1: 5.0 at 720p, 3.0 at 480p)")
    p.add_argument("--guidance", type=float, default=5.0, help="classifier-free guidance scale")
    p.add_argument("--seed", type=int, default=0, help="seed of the example inputs used for tracing")
    return p.parse_args(argv)


def export(args):
    dtype = DTYPES[args.dtype]
    transformer, config = load_transformer(args.model_dir, dtype)
    pt, ph, pw = config.get("patch_size", [1, 2, 2])
    if args.height % (args.vae_factor * ph) or args.width % (args.vae_factor * pw):
        sys.exit(f"--height and --width must be multiples of {args.vae_factor * ph} and {args.vae_factor * pw}")
    if not 1 <= args.min_frames <= args.window:
        sys.exit("need 1 <= --min-frames <= --window")
    if args.text_tokens < 1:
        sys.exit("--text-tokens must be >= 1: Wan is a text-conditioned model")
    if pt != 1:
        sys.exit(f"patch_size {config['patch_size']}: only a temporal patch of 1 (Wan 2.1) is supported")
    h, w = args.height // args.vae_factor, args.width // args.vae_factor
    channels, text_dim = config["in_channels"], config["text_dim"]
    if config.get("out_channels", channels) != channels:
        sys.exit("in_channels != out_channels: not a denoiser of its own latents")
    if config.get("image_dim"):
        sys.exit("an image-conditioned (i2v) transformer: only text-to-video is supported")

    model = PerFrameWan(transformer).to(args.device).eval()
    g = torch.Generator().manual_seed(args.seed)
    example_frames = max(args.min_frames, min(2, args.window))
    example = (
        torch.randn(1, channels, example_frames, h, w, generator=g).to(args.device, dtype),
        (torch.rand(1, example_frames, generator=g) * 1000).to(args.device),
        torch.randn(1, args.text_tokens, text_dim, generator=g).to(args.device, dtype),
    )
    if args.min_frames == args.window:
        dynamic = None
    else:
        frames = torch.export.Dim("frames", min=args.min_frames, max=args.window)
        dynamic = ({2: frames}, {1: frames}, None)
    with torch.no_grad():
        program = torch.export.export(model, example, dynamic_shapes=dynamic)
    metadata = {
        "latent.format": FORMAT_VERSION,
        "latent.source": "diffusers.WanTransformer3DModel",
        "latent.config": json.dumps(config, sort_keys=True),
        "latent.prediction": "flow",
        "latent.latent_space": args.latent_space,
        "latent.channels": str(channels),
        "latent.min_frames": str(args.min_frames),
        "latent.window": str(args.window),
        "latent.height": str(h),
        "latent.width": str(w),
        "latent.text_tokens": str(args.text_tokens),
        "latent.text_dim": str(text_dim),
        "latent.dtype": args.dtype,
        "latent.sampler": args.sampler,
        "latent.steps": str(args.steps),
        "latent.shift": repr(float(args.shift)),
        "latent.guidance": repr(float(args.guidance)),
    }
    out = os.path.abspath(args.out)
    # Compile into a temporary name beside OUT, then rename: a stopped export leaves no half package.
    fd, tmp = tempfile.mkstemp(suffix=".pt2", dir=os.path.dirname(out))
    os.close(fd)
    try:
        # check_lowerbound off: torch.export treats a dynamic size as >= 2 (0/1 specialisation), and the package's
        # input checks, which gst-latent turns on, would then refuse a window of one frame that runs correctly.
        torch._inductor.aoti_compile_and_package(
            program, package_path=tmp,
            inductor_configs={"aot_inductor.metadata": metadata, "aot_inductor.check_lowerbound": False})
        # mkstemp makes the file private; a package is as readable as any file the user makes.
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, out)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return out, model


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    out, _ = export(args)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
