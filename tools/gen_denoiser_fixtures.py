#!/usr/bin/env python3
"""Reference fixtures for the C++ denoiser and generator tests: a tiny random-weight diffusers
WanTransformer3DModel, exported with tools/export_denoiser.py, and what PyTorch and diffusers compute with it.

Usage: .venv/bin/python tools/gen_denoiser_fixtures.py OUTDIR     (CPU, fp32, ~1-2 min: mostly the compile)

Writes into OUTDIR ("stamp" last, as the build's output marker):
  wan-tiny/            save_pretrained of the transformer (config.json + safetensors)
  wan-tiny.pt2         its package: latent 8x8 (64x64 px), 4 channels, window 1..8, 7 text tokens of 16
  bad-*.pt2            the same package with damaged metadata (each a defect the loader must name)
  wan-tiny-cases.safetensors  fp32 tensors:
      text, negative_text              [1, 7, 16] prompt embeddings
      predict.<T>.x / .timesteps / .out    eager PyTorch (the exported wrapper, per-frame timesteps), T = 1, 3, 8
      clip.<sampler>.noise / .latents  diffusers' Wan pipeline loop (scalar timestep per step, classifier-free
                                       guidance 2.5) from seeded noise, 5 latent frames, 6 steps, shift 3
    __metadata__ {"clip_seed", "clip_frames", "clip_steps", "clip_shift", "clip_guidance", "diffusers", "torch"}
"""
import json
import os
import shutil
import sys
import zipfile

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import export_denoiser  # noqa: E402

SEED = 20261123
CLIP = {"clip_seed": 7, "clip_frames": 5, "clip_steps": 6, "clip_shift": 3.0, "clip_guidance": 2.5}
TINY = dict(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=8, in_channels=4, out_channels=4,
            text_dim=16, freq_dim=32, ffn_dim=32, num_layers=2, rope_max_seq_len=64)


def save(tensors, metadata, path):
    from safetensors.torch import save_file

    save_file({k: v.contiguous() for k, v in tensors.items()}, path + ".tmp", metadata=metadata)
    os.replace(path + ".tmp", path)


def with_metadata(src, dst, change):
    """Copies a package, editing the metadata JSON the loader reads."""
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst + ".tmp", "w", zipfile.ZIP_STORED) as zout:
        for item in zin.infolist():
            data = zin.read(item.filename)
            if item.filename.endswith("wrapper_metadata.json"):
                md = json.loads(data)
                change(md)
                data = json.dumps(md).encode()
            zout.writestr(item, data)
    os.replace(dst + ".tmp", dst)


def clip_reference(transformer, scheduler, text, negative):
    """WanPipeline's denoising loop (diffusers 0.42 pipeline_wan.py) with precomputed embeddings."""
    g = torch.Generator().manual_seed(CLIP["clip_seed"])
    noise = torch.randn(1, TINY["in_channels"], CLIP["clip_frames"], 8, 8, generator=g, dtype=torch.float32)
    scheduler.set_timesteps(CLIP["clip_steps"])
    latents = noise.clone()
    with torch.no_grad():
        for t in scheduler.timesteps:
            timestep = t.expand(latents.shape[0])
            cond = transformer(hidden_states=latents, timestep=timestep, encoder_hidden_states=text,
                               return_dict=False)[0]
            uncond = transformer(hidden_states=latents, timestep=timestep, encoder_hidden_states=negative,
                                 return_dict=False)[0]
            pred = uncond + CLIP["clip_guidance"] * (cond - uncond)
            latents = scheduler.step(pred, t, latents, return_dict=False)[0]
    return noise, latents


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    import diffusers
    from diffusers import FlowMatchEulerDiscreteScheduler, UniPCMultistepScheduler, WanTransformer3DModel

    torch.manual_seed(SEED)
    transformer = WanTransformer3DModel(**TINY).eval()
    # Random init leaves some parameters at 0 or 1; spread them so a wrong mapping cannot hide.
    with torch.no_grad():
        for p in transformer.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    model_dir = os.path.join(out, "wan-tiny")
    shutil.rmtree(model_dir, ignore_errors=True)
    transformer.save_pretrained(model_dir)

    package = os.path.join(out, "wan-tiny.pt2")
    export_denoiser.main([model_dir, package, "--height", "64", "--width", "64", "--window", "8", "--text-tokens",
                          "7", "--sampler", "euler", "--steps", "6", "--shift", "3", "--guidance", "2.5"])
    wrapper = export_denoiser.PerFrameWan(export_denoiser.load_transformer(model_dir, torch.float32)[0])

    g = torch.Generator().manual_seed(SEED)
    tensors = {"text": torch.randn(1, 7, 16, generator=g), "negative_text": torch.randn(1, 7, 16, generator=g)}
    with torch.no_grad():
        for frames in (1, 3, 8):
            x = torch.randn(1, 4, frames, 8, 8, generator=g)
            timesteps = torch.rand(1, frames, generator=g) * 1000
            tensors[f"predict.{frames}.x"] = x
            tensors[f"predict.{frames}.timesteps"] = timesteps
            tensors[f"predict.{frames}.out"] = wrapper(x, timesteps, tensors["text"])

    schedulers = {
        "euler": FlowMatchEulerDiscreteScheduler(shift=CLIP["clip_shift"]),
        # As Wan 2.1's diffusers scheduler_config.json sets it, with this shift.
        "unipc": UniPCMultistepScheduler(prediction_type="flow_prediction", use_flow_sigmas=True,
                                         flow_shift=CLIP["clip_shift"], num_train_timesteps=1000, solver_order=2,
                                         solver_type="bh2", predict_x0=True, lower_order_final=True,
                                         final_sigmas_type="zero", timestep_spacing="linspace"),
    }
    for name, scheduler in schedulers.items():
        noise, latents = clip_reference(wrapper.transformer, scheduler, tensors["text"], tensors["negative_text"])
        tensors[f"clip.{name}.noise"] = noise
        tensors[f"clip.{name}.latents"] = latents

    metadata = {k: json.dumps(v) for k, v in CLIP.items()}
    metadata.update(diffusers=diffusers.__version__, torch=torch.__version__)
    save(tensors, metadata, os.path.join(out, "wan-tiny-cases.safetensors"))

    def drop(key):
        return lambda md: md.pop(key)

    def put(key, value):
        return lambda md: md.__setitem__(key, value)

    for name, change in {
        "bad-no-window": drop("latent.window"),
        "bad-huge-window": put("latent.window", "1000000000000"),
        "bad-channels": put("latent.channels", "four"),
        "bad-prediction": put("latent.prediction", "sample"),
        "bad-format": put("latent.format", "99"),
        "bad-device": put("AOTI_DEVICE_KEY", "cuda"),
        "bad-isa": put("AOTI_CPU_ISA", "AVX512 AVX512_VNNI AMX_TILE"),
    }.items():
        with_metadata(package, os.path.join(out, name + ".pt2"), change)
    with open(package, "rb") as f:
        head = f.read(4096)
    with open(os.path.join(out, "bad-truncated.pt2"), "wb") as f:
        f.write(head)

    with open(os.path.join(out, "stamp"), "w") as f:
        f.write("ok\n")
    print("max |eager - exported| is checked by the C++ tests; fixtures in", out)


if __name__ == "__main__":
    main()
