#!/usr/bin/env python3
"""Scaling model of patch-parallel decoding, on paper (docs/multi-gpu.md).

Walks the decoder of Wan 2.1 and CogVideoX layer by layer, as core/src/vae/{wan,cogvideox}.cpp run it with
row bands, and counts what one rank border carries per clip: halo rows (one row each way per 3x3 convolution, of
the frames the chunk holds at that layer), Wan's mid-block key/value gather, CogVideoX's GroupNorm all-reduces.
Then predicts time and memory per GPU for N GPUs from one GPU's measured time and peak:

  time(N)   = time(1) * rows_max(N) / rows + halo_bytes / bandwidth + exchanges * latency
  memory(N) = weights + (peak(1) - weights) * rows_max(N) / rows

Compute scales with a band's rows because a band computes only its own rows (the convolutions consume the halo
rows instead of padding). All inputs are printed with the result; nothing here is measured.

  python3 bench/parallel_scaling.py [--json]
"""
import argparse
import json
import math

BF16 = 2


def wan_decoder(t_latents, h, w, base=96, mult=(1, 2, 4, 4), blocks=2, z=16):
    """(layer, channels in, rows, width, frames per clip at that layer) of every 3x3 convolution."""
    dims = [base * mult[-1]] + [base * m for m in reversed(mult)]
    temporal_up = [True, True, False]  # the decoder's up blocks 0, 1 double time, block 2 does not
    # Decoding one latent per chunk: the first chunk is 1 frame deep everywhere; later latents are 1 deep at the
    # latent level and doubled by each temporal upsampler.
    frames = t_latents
    layers = [("conv_in", z, h, w, frames)]
    gathers = [("mid attention K,V", 2 * dims[0], h, w, frames)]
    for i in range(2):
        layers += [(f"mid.resnets.{i}.conv{k}", dims[0], h, w, frames) for k in (1, 2)]
    res, tf = 1, 1  # tf: time upsampling so far; a level holds 1 + (t - 1) * tf frames of the clip
    for i in range(len(mult)):
        cin = dims[i] if i == 0 else dims[i] // 2
        cout = dims[i + 1]
        fr = 1 + (t_latents - 1) * tf
        for j in range(blocks + 1):
            layers.append((f"up.{i}.resnets.{j}.conv1", cin, h * res, w * res, fr))
            layers.append((f"up.{i}.resnets.{j}.conv2", cout, h * res, w * res, fr))
            cin = cout
        if i + 1 < len(mult):
            if temporal_up[i]:
                tf *= 2
            fr = 1 + (t_latents - 1) * tf
            layers.append((f"up.{i}.upsampler", cout, 2 * h * res, 2 * w * res, fr))
            res *= 2
    layers.append(("conv_out", dims[-1], h * res, w * res, 1 + (t_latents - 1) * tf))
    norms = 0
    chunks = t_latents
    return layers, gathers, norms, chunks


def cog_decoder(t_latents, h, w, ch=(128, 256, 256, 512), per_block=3, z=16, groups=32):
    c = list(reversed(ch))
    frames_out = 1 + (t_latents - 1) * 4
    # Frames at level k: time doubles at the first two upsamplers; a clip of T latents is 4T - 3 frames out.
    def frames_at(level):
        return [t_latents, 2 * t_latents - 1, frames_out, frames_out][level]

    layers = [("conv_in", z, h, w, t_latents)]
    for i in range(2):
        layers += [(f"mid.resnets.{i}.conv1", c[0], h, w, t_latents), (f"mid.resnets.{i}.conv2", c[0], h, w, t_latents)]
    res, cin = 1, c[0]
    for i in range(4):
        for j in range(per_block + 1):
            layers.append((f"up.{i}.resnets.{j}.conv1", cin, h * res, w * res, frames_at(i)))
            layers.append((f"up.{i}.resnets.{j}.conv2", c[i], h * res, w * res, frames_at(i)))
            cin = c[i]
        if i < 3:
            layers.append((f"up.{i}.upsampler", c[i], 2 * h * res, 2 * w * res, frames_at(i + 1)))
            res *= 2
    layers.append(("conv_out", c[-1], h * res, w * res, frames_out))
    # Two GroupNorms per resnet plus norm_out, each two all-reduces of [groups] sums per chunk.
    norms = 2 * (2 + 4 * (per_block + 1)) + 1
    chunks = 1 + (t_latents - 3 + 1) // 2
    return layers, [], norms, chunks


CASES = {
    # name: (decoder, latents, latent rows, latent width, one H100's decode seconds and peak MB, weights MB)
    "Wan 2.1 81x480x832": (wan_decoder, 21, 60, 104, 1.88, 4296, 254),
    "CogVideoX 49x480x720": (cog_decoder, 13, 60, 90, 2.24, 10115, 431),
}
LINKS = {"NVLink (H100, 100 GB/s sendrecv)": (100e9, 20e-6), "PCIe Gen5 (25 GB/s p2p)": (25e9, 30e-6)}


def model(name, gpus):
    make, t, h, w, t1, peak, weights = CASES[name]
    layers, gathers, norms, chunks = make(t, h, w)
    # One border, one direction: a row of every 3x3 conv's input, for every frame the clip passes through it.
    halo = sum(cin * wd * fr * BF16 for _, cin, _, wd, fr in layers)
    exchanges = len(layers) * chunks
    rows_max = math.ceil(h / gpus)
    out = {"halo_bytes_per_border": halo, "exchanges": exchanges, "norm_allreduces": 2 * norms * chunks}
    gather = sum(c * r * wd * fr * BF16 for _, c, r, wd, fr in gathers) * (gpus - 1) / gpus
    out["gather_bytes_per_rank"] = gather
    for link, (bw, lat) in LINKS.items():
        # Both directions of a border share the link; a gather is two collectives (band heights, then data).
        comm = 2 * halo / bw + gather / bw + (exchanges + 2 * norms * chunks + 2 * len(gathers) * chunks) * lat
        tn = t1 * rows_max / h + comm
        out[link] = {"seconds": tn, "speedup": t1 / tn, "comm_seconds": comm}
    out["memory_mb"] = weights + (peak - weights) * rows_max / h
    return out, layers


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    report = {}
    for name in CASES:
        for gpus in (2, 4, 8):
            report[f"{name}, {gpus} GPUs"], layers = model(name, gpus)
        report[f"{name}, layers"] = [
            {"layer": l, "channels": c, "rows": r, "width": w, "frames": f, "halo_bytes": c * w * f * BF16}
            for l, c, r, w, f in layers
        ]
    if args.json:
        print(json.dumps(report, indent=1))
        return
    for name, (_, t, h, w, t1, peak, weights) in CASES.items():
        print(f"{name}: {t} latents of {h}x{w}; one H100: {t1} s, peak {peak} MB (weights {weights} MB)")
        for gpus in (2, 4, 8):
            r = report[f"{name}, {gpus} GPUs"]
            print(f"  {gpus} GPUs: halo {r['halo_bytes_per_border'] / 1e6:.0f} MB per border and direction, "
                  f"{r['exchanges']} exchanges, gather {r['gather_bytes_per_rank'] / 1e6:.0f} MB per rank, "
                  f"memory {r['memory_mb']:.0f} MB per GPU")
            for link in LINKS:
                x = r[link]
                print(f"     {link}: {x['seconds']:.3f} s ({x['speedup']:.2f}x), of which communication "
                      f"{x['comm_seconds'] * 1000:.0f} ms")


if __name__ == "__main__":
    main()
