"""Full-width VAEs with seeded random weights, built once with diffusers and cached as diffusers folders.

The benchmarks measure speed and memory, which depend on the architecture and the channel widths, not on the
values of the weights; random weights keep the benchmark free of downloads. Each model is the diffusers class
with its default config, which is the published one: AutoencoderKLWan() is the Wan 2.1 VAE (base_dim 96,
dim_mult 1-2-4-4) and AutoencoderKLCogVideoX() the CogVideoX 2b/5b VAE (128-256-256-512).
The embedded default model ("default") is the shipped trained file, models/latent-tiny-wan.safetensors, unpacked
into a diffusers folder so both sides load the same weights the same way.
"""
import json
import os
import shutil
import sys
import time

FAMILIES = {
    "wan2.1": "AutoencoderKLWan",
    "cogvideox": "AutoencoderKLCogVideoX",
    "default": "AutoencoderKLWan",
}
DEFAULT_MODEL = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                             "models", "latent-tiny-wan.safetensors")
SEED = 1234
STAMP = "bench-model.json"


def _log(msg):
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


def model_dir(cache, family):
    return os.path.join(cache, family)


def _stamp_ok(path, want):
    try:
        with open(os.path.join(path, STAMP)) as f:
            have = json.load(f)
    except (OSError, ValueError):
        return False
    return all(have.get(k) == v for k, v in want.items()) and os.path.exists(
        os.path.join(path, "diffusion_pytorch_model.safetensors"))


def ensure_model(cache, family):
    """Returns the folder of `family`'s benchmark model, building it first when missing or stale."""
    import diffusers
    import torch

    path = model_dir(cache, family)
    want = {"class": FAMILIES[family], "seed": SEED, "diffusers": diffusers.__version__, "dtype": "float32"}
    if family == "default":
        want = {"class": FAMILIES[family], "source": DEFAULT_MODEL, "mtime": os.path.getmtime(DEFAULT_MODEL),
                "diffusers": diffusers.__version__}
    if _stamp_ok(path, want):
        return path
    _log(f"building the {family} benchmark model ({FAMILIES[family]} default config, random weights, "
         f"seed {SEED}) into {path} ...")
    t0 = time.time()
    cls = getattr(diffusers, FAMILIES[family])
    torch.manual_seed(SEED)
    with torch.no_grad():
        model = _shipped_default(cls) if family == "default" else cls()
    params = sum(p.numel() for p in model.parameters())
    tmp = path + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    model.save_pretrained(tmp, safe_serialization=True)
    with open(os.path.join(tmp, STAMP), "w") as f:
        json.dump(dict(want, parameters=params), f, indent=1)
    shutil.rmtree(path, ignore_errors=True)
    os.rename(tmp, path)
    _log(f"  {params / 1e6:.1f} M parameters, {time.time() - t0:.1f} s")
    return path


def _shipped_default(cls):
    from safetensors import safe_open
    from safetensors.torch import load_file

    with safe_open(DEFAULT_MODEL, "pt") as f:
        config = json.loads(f.metadata()["config"])
    model = cls(**{k: v for k, v in config.items() if not k.startswith("_")})
    model.load_state_dict(load_file(DEFAULT_MODEL))
    return model


def model_info(path):
    try:
        with open(os.path.join(path, STAMP)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}
