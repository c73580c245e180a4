#!/usr/bin/env python3
"""Deterministic diffusers reference fixtures for the C++ VAE parity tests.

Usage: .venv/bin/python tools/gen_vae_fixtures.py OUTDIR     (CPU, fp32, ~10-15 s)

Writes into OUTDIR (each file via a temp name + rename; "stamp" last, as the build's output marker):
  wan/, cogvideox/   save_pretrained: config.json + diffusion_pytorch_model.safetensors (fp32)
  wan_original.pth           same Wan weights, original Wan2.1_VAE.pth key names (plain dict)
  <family>_single_bf16.safetensors   all weights bf16; __metadata__ {"config": config.json text,
                                     "family": "wan2.1" | "cogvideox"}
  <family>_cases.safetensors fp32 tensors input/mean/logvar/decoded.<T>x<H>x<W>, where
                             input [1,3,T,H,W] ~ U[-1,1]; mean, logvar = encode(input).latent_dist
                             (raw VAE space, no scaling or normalisation);
                             decoded = decode(mean).sample.
                             __metadata__ {"cases": JSON [[T,H,W],...], "diffusers", "torch"}
  stamp

Findings from running diffusers 0.42.1 / torch 2.11.0 (re-checked and printed on every run):
 1. Wan: T 1,5,9,17,33 -> 1,2,3,5,9 latents -> decode gives 1,5,9,17,33 frames (1 + 4(L-1));
    9x32x64 -> 3 latents of 4x8 -> 9 frames. decode clamps to [-1, 1].
 2. CogVideoX: T 1,5,9,17,33 -> 1,2,3,5,9 latents -> decode gives 1,8,9,17,33 frames: an even
    latent count decodes to 4L frames (T=5 does not round-trip). No clamp.
 3. Spatial sizes: both families need H, W multiples of 8 only (no multiple-of-16 rule; Wan's
    per-frame attention and RMS norm do not care). 40x72 works for both (latent 5x9, decoded 40x72).
    44x76 does not fail: both silently give a 5x9 latent and a 40x72 decode (the k3/s2 downsamplers
    pad right/bottom by 1 and floor), so a port must reject or crop non-multiples of 8 itself.
 4. Config keys the C++ loader must read (full config.json is printed on each run):
    Wan: base_dim, decoder_base_dim (null = base_dim), z_dim (encoder emits 2*z_dim), dim_mult,
      num_res_blocks (encoder R per level, decoder R+1), attn_scales (must be [] - otherwise
      attention blocks are interleaved into the flat lists), temperal_downsample (decoder uses it
      reversed), is_residual (false = 2.1), in/out_channels, patch_size (null for 2.1),
      latents_mean/latents_std (z_dim each; pipeline-side normalisation only). scale_factor_* and
      dropout are informational.
    CogVideoX: block_out_channels (levels; spatial factor 2^(n-1)), latent_channels (also the
      SpatialNorm3D conv_y/conv_b input width), layers_per_block (decoder uses +1), norm_num_groups
      (honoured by every GroupNorm incl. SpatialNorm3D and encoder norm_out - no hard-coded 32),
      norm_eps (used ONLY by the encoder's down/mid resnet GroupNorms; encoder norm_out and every
      decoder SpatialNorm3D hard-code 1e-6), temporal_compression_ratio (levels < log2 compress time),
      in/out_channels, scaling_factor, invert_scale_latents, shift_factor/latents_mean/std (null),
      use_quant_conv/use_post_quant_conv (false; diffusers would size quant_conv from
      2*out_channels, a latent bug), down/up_block_types, act_fn. sample_height/width only size
      tiles; force_upcast is irrelevant in fp32.
 Also: diffusers' own single-file Wan converter (convert_wan_vae_to_diffusers) hard-codes the
 num_res_blocks=2 decoder indices and mis-maps wan_original.pth (36 decoder keys land on wrong
 names); see the mapping rule below.
 wan_original.pth was checked against the original Wan-Video/Wan2.1 wan/modules/vae.py (WanVAE_
 built from this config): strict load_state_dict, and encode mean / clamped decode equal these
 fixtures exactly (max diff 0.0).
"""
import json
import os
import shutil
import sys
import time

import torch

SEED = 20250601
FRAME_COUNTS = (1, 5, 9, 17, 33)
CASES = [(t, 48, 80) for t in FRAME_COUNTS] + [(9, 32, 64)]
PROBE_T, PROBE_SIZES = 5, [(40, 72), (44, 76)]  # 8-but-not-16 multiple, and not a multiple of 8
# T -> (latent frames, decoded frames) that the C++ ports are written against (findings 1-2), so a
# diffusers upgrade that changes them fails here instead of silently moving the goalposts.
EXPECTED_COUNTS = {"wan": {1: (1, 1), 5: (2, 5), 9: (3, 9), 17: (5, 17), 33: (9, 33)},
                   "cogvideox": {1: (1, 1), 5: (2, 8), 9: (3, 9), 17: (5, 17), 33: (9, 33)}}


class FixtureError(Exception):
    pass


def check(cond, msg):
    if not cond:
        raise FixtureError(msg)


def wan_config(gen):
    # Width, depth, latent size and latent statistics all differ from the published Wan 2.1 config,
    # so a loader that hard-codes 96/16/2 or the published latents_mean/std fails loudly.
    z_dim = 8
    return dict(
        base_dim=12, z_dim=z_dim, dim_mult=[1, 2, 4, 4], num_res_blocks=1, attn_scales=[],
        temperal_downsample=[False, True, True],
        latents_mean=[round(v, 4) for v in torch.randn(z_dim, generator=gen).tolist()],
        latents_std=[round(0.5 + v, 4) for v in torch.rand(z_dim, generator=gen).mul(2).tolist()],
    )


# diffusers 0.42.1 passes norm_num_groups to every GroupNorm (resnets, mid block, encoder norm_out
# and SpatialNorm3D); make_models() asserts that, so 8 groups (not 32) is a valid choice and forces
# the loader to read it.  Widths are all different so every level has a 1x1x1 shortcut.
COG_CONFIG = dict(
    block_out_channels=[16, 24, 32, 48], latent_channels=8, layers_per_block=1,
    norm_num_groups=8, scaling_factor=0.7,
)


def randomise(model, gen, gains):
    """Re-draw every parameter so activations stay O(1) end to end.

    The diffusers default init lets the signal decay towards 0 through the stack, which would make
    relative-error comparisons meaningless. Convs get N(0, 1/fan_in) (variance-preserving in front
    of the norms), norm scales 1 + 0.1 N(0,1) so a wrong gamma is visible, biases 0.05 N(0,1).
    """
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen)
            if name.endswith("gamma") or (p.ndim == 1 and not name.endswith("bias")):
                p.copy_(1.0 + 0.1 * noise)
            elif name.endswith("bias"):
                p.copy_(0.05 * noise)
            else:
                p.copy_(noise * gains.get(name, 1.0) / p[0].numel() ** 0.5)


def make_models(gen):
    from diffusers import AutoencoderKLCogVideoX, AutoencoderKLWan

    wan = AutoencoderKLWan(**wan_config(gen)).eval()
    # Shrink the last decoder conv so that most of Wan's output sits inside the [-1, 1] clamp:
    # a saturated output would hide decoder errors from the parity test.
    randomise(wan, gen, {"decoder.conv_out.weight": 0.6})
    cog = AutoencoderKLCogVideoX(**COG_CONFIG).eval()
    randomise(cog, gen, {})
    groups = {m.num_groups for m in cog.modules() if isinstance(m, torch.nn.GroupNorm)}
    check(groups == {COG_CONFIG["norm_num_groups"]}, f"CogVideoX GroupNorm groups {groups}")
    return {"wan": wan, "cogvideox": cog}


# ---- Wan 2.1 original (Wan2.1_VAE.pth) key layout ------------------------------------------
# The original Encoder3d.downsamples / Decoder3d.upsamples are flat nn.Sequentials built level by
# level: encoder level = num_res_blocks ResidualBlocks then one Resample (none on the last level);
# decoder level = num_res_blocks + 1 ResidualBlocks then one Resample (none on the last level).
# diffusers keeps the encoder list flat (same indices), but nests the decoder, so with
# R = num_res_blocks and stride S = R + 2:
#     decoder.up_blocks.{i}.resnets.{j}    <-> decoder.upsamples.{i*S + j}      (j = 0..R)
#     decoder.up_blocks.{i}.upsamplers.0   <-> decoder.upsamples.{i*S + R + 1}
# (R = 2 gives the familiar 0-2/3, 4-6/7, ... of the published checkpoint; R = 1 gives 0-1/2,
# 3-4/5, 6-7/8, 9-10.) diffusers' own single-file converter hard-codes the R = 2 indices.
RES_TO_ORIG = {"norm1": "residual.0", "conv1": "residual.2", "norm2": "residual.3",
               "conv2": "residual.6", "conv_shortcut": "shortcut"}
ORIG_TO_RES = {v: k for k, v in RES_TO_ORIG.items()}


def _res_tail(tail, table):
    # Inside a block only the resnet sub-layer names differ; resample/time_conv/attention match.
    for src, dst in table.items():
        if tail == src or tail.startswith(src + "."):
            return dst + tail[len(src):]
    return tail


def wan_to_original(key, nrb):
    top, _, rest = key.partition(".")
    if top in ("quant_conv", "post_quant_conv"):
        return ("conv1." if top == "quant_conv" else "conv2.") + rest
    mod, _, rest = rest.partition(".")
    if mod in ("conv_in", "norm_out", "conv_out"):
        new = {"conv_in": "conv1", "norm_out": "head.0", "conv_out": "head.2"}[mod]
        return f"{top}.{new}.{rest}"
    if mod == "mid_block":
        kind, idx, tail = rest.split(".", 2)
        pos = 1 if kind == "attentions" else 2 * int(idx)
        return f"{top}.middle.{pos}.{_res_tail(tail, RES_TO_ORIG)}"
    if mod == "down_blocks":
        n, tail = rest.split(".", 1)
        return f"{top}.downsamples.{n}.{_res_tail(tail, RES_TO_ORIG)}"
    level, kind, j, tail = rest.split(".", 3)
    n = int(level) * (nrb + 2) + (int(j) if kind == "resnets" else nrb + 1)
    return f"{top}.upsamples.{n}.{_res_tail(tail, RES_TO_ORIG)}"


def original_to_wan(key, nrb):
    """The direction a loader needs; written independently of wan_to_original to cross-check it."""
    p = key.split(".")
    if p[0] in ("conv1", "conv2"):
        return {"conv1": "quant_conv", "conv2": "post_quant_conv"}[p[0]] + "." + ".".join(p[1:])
    side, mod = p[0], p[1]
    if mod == "conv1":
        return f"{side}.conv_in." + ".".join(p[2:])
    if mod == "head":
        return f"{side}." + {"0": "norm_out", "2": "conv_out"}[p[2]] + "." + ".".join(p[3:])
    if mod == "middle":
        base = "mid_block.attentions.0" if p[2] == "1" else f"mid_block.resnets.{int(p[2]) // 2}"
    elif mod == "downsamples":
        base = f"down_blocks.{p[2]}"
    else:
        level, j = divmod(int(p[2]), nrb + 2)
        base = f"up_blocks.{level}." + (f"resnets.{j}" if j <= nrb else "upsamplers.0")
    return f"{side}.{base}.{_res_tail('.'.join(p[3:]), ORIG_TO_RES)}"


# ---- running the reference --------------------------------------------------------------------
def stats(t):
    return f"std {t.std().item():.3f} min {t.min().item():+.3f} max {t.max().item():+.3f}"


def run_case(model, x):
    with torch.no_grad():
        dist = model.encode(x).latent_dist
        mean, logvar = dist.mean.contiguous(), dist.logvar.contiguous()
        decoded = model.decode(mean).sample.contiguous()
    return mean, logvar, decoded


def probe_sizes(family, model, gen):
    """Fact 3: which spatial sizes survive encode+decode with the expected shapes."""
    for h, w in PROBE_SIZES:
        x = torch.rand(1, 3, PROBE_T, h, w, generator=gen) * 2 - 1
        try:
            mean, _, dec = run_case(model, x)
            ok = tuple(dec.shape[-2:]) == (h, w) and tuple(mean.shape[-2:]) == (h // 8, w // 8)
            print(f"  probe {family:9s} {PROBE_T}x{h}x{w}: latent {list(mean.shape)} -> decoded "
                  f"{list(dec.shape)} {'OK' if ok else 'SHAPE MISMATCH'}")
        except Exception as e:  # a failure here is a finding, not a generator error
            print(f"  probe {family:9s} {PROBE_T}x{h}x{w}: FAILED {type(e).__name__}: {e}")


def publish(tmp, final):
    """Move a finished temp file/dir into place, so a killed run never leaves a half-written
    fixture under its final name. safetensors creates files 0600; make them readable to all."""
    if os.path.isdir(tmp):
        paths = [os.path.join(root, f) for root, _, files in os.walk(tmp) for f in files]
    else:
        paths = [tmp]
    for path in paths:
        os.chmod(path, 0o644)
    if os.path.isdir(final):
        shutil.rmtree(final)
    os.replace(tmp, final)


def write_family(outdir, family, model, gen, versions):
    from safetensors.torch import save_file

    tensors, cases = {}, []
    print(f"== {family}: {sum(p.numel() for p in model.parameters())} parameters")
    for t, h, w in CASES:
        x = (torch.rand(1, 3, t, h, w, generator=gen) * 2 - 1).contiguous()
        tag = f"{t}x{h}x{w}"
        t0 = time.monotonic()
        mean, logvar, dec = run_case(model, x)
        for m_std, what in ((mean.std().item(), "mean"), (dec.std().item(), "decoded")):
            check(0.1 <= m_std <= 10, f"{family} {tag}: {what} std {m_std:.4f} outside 0.1..10")
        counts = (mean.shape[2], dec.shape[2])
        check(counts == EXPECTED_COUNTS[family][t], f"{family} {tag}: (latents, frames) {counts}")
        check(tuple(mean.shape[-2:]) == (h // 8, w // 8) and tuple(dec.shape[-2:]) == (h, w),
              f"{family} {tag}: spatial shapes {list(mean.shape)} / {list(dec.shape)}")
        clamp = (dec.abs() >= 1).float().mean().item()
        print(f"  {tag:8s} latents {mean.shape[2]:2d} -> frames {dec.shape[2]:2d} | mean "
              f"{list(mean.shape)} {stats(mean)} | logvar avg {logvar.mean().item():+.3f} "
              f"{stats(logvar)} | decoded {list(dec.shape)} {stats(dec)} |x|>=1 {clamp:.1%} | "
              f"{time.monotonic() - t0:.1f} s", flush=True)
        tensors.update({f"input.{tag}": x, f"mean.{tag}": mean, f"logvar.{tag}": logvar,
                        f"decoded.{tag}": dec})
        cases.append([t, h, w])
    probe_sizes(family, model, gen)

    meta = {"cases": json.dumps(cases), **versions}
    path = os.path.join(outdir, f"{family}_cases.safetensors")
    save_file({k: v.float().contiguous() for k, v in tensors.items()}, path + ".tmp", metadata=meta)
    publish(path + ".tmp", path)

    tmpdir = os.path.join(outdir, f".{family}.tmp")
    shutil.rmtree(tmpdir, ignore_errors=True)
    model.save_pretrained(tmpdir, safe_serialization=True)
    publish(tmpdir, os.path.join(outdir, family))
    with open(os.path.join(outdir, family, "config.json")) as f:
        config_text = f.read()
    print(f"  {family}/config.json:\n{config_text}")

    # Single-file variant: bf16 storage exercises the loader's dtype conversion, and the embedded
    # config exercises reading the config from the safetensors header instead of a sidecar file.
    sd = {k: v.to(torch.bfloat16).contiguous() for k, v in model.state_dict().items()}
    single = os.path.join(outdir, f"{family}_single_bf16.safetensors")
    label = "wan2.1" if family == "wan" else "cogvideox"
    save_file(sd, single + ".tmp", metadata={"config": config_text, "family": label})
    publish(single + ".tmp", single)


def write_wan_original(outdir, model):
    nrb = model.config.num_res_blocks
    sd = model.state_dict()
    orig = {wan_to_original(k, nrb): v.clone().contiguous() for k, v in sd.items()}
    check(len(orig) == len(sd), "wan original mapping is not one-to-one")
    path = os.path.join(outdir, "wan_original.pth")
    torch.save(orig, path + ".tmp")
    publish(path + ".tmp", path)
    # Verify from the file on disk, through the independent reverse mapping.
    back = {original_to_wan(k, nrb): v for k, v in torch.load(path, weights_only=True).items()}
    check(set(back) == set(sd), f"wan original round trip: key sets differ {set(back) ^ set(sd)}")
    for k, v in sd.items():
        check(back[k].dtype == v.dtype and torch.equal(back[k], v), f"wan original mismatch at {k}")
    print(f"  wan_original.pth: {len(orig)} tensors, round trip through original_to_wan exact")


def verify_reload(outdir, models):
    """The saved directories must rebuild bit-identical models through the public loader."""
    from diffusers import AutoencoderKLCogVideoX, AutoencoderKLWan
    from safetensors import safe_open

    for family, cls in (("wan", AutoencoderKLWan), ("cogvideox", AutoencoderKLCogVideoX)):
        ref = models[family].state_dict()
        got = cls.from_pretrained(os.path.join(outdir, family)).state_dict()
        check(set(got) == set(ref) and all(torch.equal(got[k], ref[k]) for k in ref),
              f"{family}: save_pretrained/from_pretrained round trip differs")
        with safe_open(os.path.join(outdir, f"{family}_single_bf16.safetensors"), "pt") as f:
            check(set(f.keys()) == set(ref), f"{family}: bf16 single-file key set differs")
            with open(os.path.join(outdir, family, "config.json")) as cfg:
                check(f.metadata()["config"] == cfg.read(), f"{family}: bf16 config differs")


def write_default_model_cases(outdir, gen, versions):
    """The shipped default model (models/latent-tiny-wan.safetensors) run by diffusers: the C++ engine must
    give the same latents and frames on the trained weights, not only on random ones."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "models", "latent-tiny-wan.safetensors")
    if not os.path.exists(path):
        print("no default model in models/: default_cases.safetensors not written")
        return
    from diffusers import AutoencoderKLWan
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    with safe_open(path, "pt") as f:
        config = json.loads(f.metadata()["config"])
    config = {k: v for k, v in config.items() if not k.startswith("_")}
    model = AutoencoderKLWan(**config).eval()
    model.load_state_dict(load_file(path))
    tensors, case_list = {}, []
    # Smooth structured input (what the model was trained on) as well as noise (a harder numeric case).
    for t, h, w, kind in [(9, 64, 96, "noise"), (17, 48, 80, "smooth")]:
        if kind == "noise":
            x = torch.rand(1, 3, t, h, w, generator=gen) * 2 - 1
        else:
            x = torch.nn.functional.interpolate(torch.rand(1, 3, t, h // 8, w // 8, generator=gen) * 2 - 1,
                                                size=(t, h, w), mode="trilinear")
        mean, logvar, decoded = run_case(model, x)
        key = f"{t}x{h}x{w}"
        tensors.update({f"input.{key}": x, f"mean.{key}": mean, f"logvar.{key}": logvar, f"decoded.{key}": decoded})
        case_list.append([t, h, w])
        print(f"  default model {key} ({kind}): latents {tuple(mean.shape)} decoded {tuple(decoded.shape)}")
    meta = {"cases": json.dumps(case_list), **versions}
    out = os.path.join(outdir, "default_cases.safetensors")
    save_file({k: v.float().contiguous() for k, v in tensors.items()}, out + ".tmp", metadata=meta)
    publish(out + ".tmp", out)


def main(argv):
    if len(argv) != 2:
        raise FixtureError("usage: gen_vae_fixtures.py OUTDIR")
    outdir = argv[1]
    os.makedirs(outdir, exist_ok=True)
    stamp = os.path.join(outdir, "stamp")
    if os.path.exists(stamp):  # a failed run must not look up to date to the build
        os.remove(stamp)
    start = time.monotonic()

    # One intra-op thread on purpose: the tensors are tiny, and with 2 OpenMP threads on a 2-core
    # box that was also compiling, the spinning barriers made the run ~7x slower (65 s vs 9 s
    # measured) for bit-identical results.
    torch.set_num_threads(1)
    torch.manual_seed(SEED)
    import diffusers
    import diffusers.utils.logging as dlog

    dlog.set_verbosity_error()
    versions = {"diffusers": diffusers.__version__, "torch": torch.__version__}
    print(f"diffusers {versions['diffusers']}, torch {versions['torch']}, seed {SEED}")

    gen = torch.Generator().manual_seed(SEED)
    models = make_models(gen)
    for family, model in models.items():
        write_family(outdir, family, model, gen, versions)
    write_wan_original(outdir, models["wan"])
    verify_reload(outdir, models)
    write_default_model_cases(outdir, gen, versions)

    with open(stamp + ".tmp", "w") as f:
        f.write(f"seed {SEED} diffusers {versions['diffusers']} torch {versions['torch']}\n")
    publish(stamp + ".tmp", stamp)
    print(f"done in {time.monotonic() - start:.1f} s wall, {time.process_time():.1f} s CPU "
          f"-> {outdir}")


if __name__ == "__main__":
    try:
        main(sys.argv)
    except FixtureError as e:
        sys.exit(f"gen_vae_fixtures: error: {e}")
    except Exception as e:  # noqa: BLE001 - any failure must fail the build step with a message
        import traceback

        traceback.print_exc()
        sys.exit(f"gen_vae_fixtures: error: {type(e).__name__}: {e}")
