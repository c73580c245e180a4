#!/usr/bin/env python3
"""Scaling model of generation across GPUs (videogen devices=, parallel=), on paper (docs/multi-gpu.md).

For each model and GPU count, the plan latent::choose_plan picks for a guided clip (cfg 2, the rest Ulysses) and
per denoising step (two evaluations under guidance):

  FLOPs per evaluation = layers * (4 * L^2 * dim            self-attention: QK^T and AV
                                   + 4 * L * text * dim)    cross-attention over the text (Wan)
                         + 2 * params * L                   every weight used once per token
  Ulysses, per GPU, per layer and evaluation: q, k, v and the attention output, each [L / u, dim] bf16, of which
  (u - 1) / u leaves the GPU: 4 * (u - 1) / u^2 * L * dim * 2 bytes (the whole group moves u times that:
  4 * (u - 1) / u * L * dim * 2), in 2 all-to-alls (ours: q, k, v stacked, then the output)
  CFG: one all-gather per step of the float32 predictions, latents * 4 bytes from each rank
  time(N)   = compute(1) / N + bytes / bandwidth + collectives * latency     (communication not overlapped)
  memory(N) = weights (replicated, bf16) + activations / u   (activations: one layer's working set at a time,
              L * (6 * dim + ffn) * 2 bytes; the text encoder and the VAE are not counted)

compute(1) is the FLOPs at an efficiency calibrated on the one anchor that has one GPU: Wan 2.1 14B 720p, 50 steps
with guidance in 1837.9 s on one H100 (Wan's own figure, end to end, so the efficiency is a lower bound). Nothing
here is measured.

  python3 bench/gen_scaling.py [--json]
"""
import argparse
import json
import math

BF16 = 2
H100_BF16 = 989e12  # dense bf16 FLOP/s
LINKS = {"NVLink": (100e9, 30e-6), "PCIe Gen5": (25e9, 40e-6)}  # all-to-all bytes/s per GPU, s per collective

# name: latents (T, h, w), tokens, text tokens, layers, dim, heads, ffn, params
MODELS = {
    "Wan 2.1 1.3B 81x480x832": ((21, 60, 104), 21 * 30 * 52, 512, 30, 1536, 12, 8960, 1.42e9),
    "Wan 2.1 14B 81x720x1280": ((21, 90, 160), 21 * 45 * 80, 512, 40, 5120, 40, 13824, 14.0e9),
    "CogVideoX 5B 49x480x720": ((13, 60, 90), 13 * 30 * 45 + 226, 0, 42, 3072, 48, 12288, 5.0e9),
}
# The anchors, as published (see ../shared/reference): name -> {gpus: speed-up}
ANCHORS = {
    "Wan 2.1 14B 81x720x1280": ("Wan's own (Ulysses/ring + FSDP, H100, end to end)", {2: 1.94, 4: 3.70, 8: 6.38}),
    "CogVideoX 5B 49x480x720": ("xDiT (A100, per step: 4.07 -> 2.12 s CFG 2 -> 1.27 s best of 4)",
                                {2: 4.07 / 2.12, 4: 4.07 / 1.27}),
}
GOAL = {2: 1.9, 4: 3.6}
CALIBRATION = ("Wan 2.1 14B 81x720x1280", 50, 1837.9)


def flops_per_eval(m):
    _, tokens, text, layers, dim, _, _, params = m
    return layers * (4 * tokens ** 2 * dim + 4 * tokens * text * dim) + 2 * params * tokens


def plan(gpus, heads):
    u = gpus // 2
    if heads % u:
        return None
    return 2, u


def efficiency():
    name, steps, seconds = CALIBRATION
    return 2 * steps * flops_per_eval(MODELS[name]) / (seconds * H100_BF16)


def model(name, gpus, eff):
    m = MODELS[name]
    (t, h, w), tokens, _, layers, dim, heads, ffn, params = m
    step_flops = 2 * flops_per_eval(m)
    t1 = step_flops / (eff * H100_BF16)
    p = plan(gpus, heads)
    out = {"flops_per_step": step_flops, "seconds_per_step_1": t1}
    if not p:
        out["plan"] = f"none: {heads} heads are not a multiple of {gpus // 2}"
        return out
    cfg, u = p
    evals = 2 // cfg  # evaluations per GPU per step
    a2a_layer = 4 * (u - 1) / u ** 2 * tokens * dim * BF16
    a2a_step = a2a_layer * layers * evals
    gather = t * h * w * 16 * 4 * (gpus - 1)  # float32 predictions from every other rank
    collectives = 2 * layers * evals * (u > 1) + 1
    out.update(plan=f"cfg {cfg} x ulysses {u}", alltoall_bytes_per_layer_per_gpu=a2a_layer,
               alltoall_group_bytes_per_layer=4 * (u - 1) / u * tokens * dim * BF16,
               alltoall_bytes_per_step_per_gpu=a2a_step, cfg_allgather_bytes_per_step_per_gpu=gather)
    for link, (bw, lat) in LINKS.items():
        comm = (a2a_step + gather) / bw + collectives * lat
        tn = t1 / gpus + comm
        out[link] = {"seconds_per_step": tn, "speedup": t1 / tn, "comm_seconds": comm}
    weights = params * BF16
    act = tokens * (6 * dim + ffn) * BF16
    out["memory_gb_per_gpu"] = (weights + act / u) / 1e9
    out["memory_gb_1"] = (weights + act) / 1e9
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    eff = efficiency()
    report = {"efficiency": eff, "links": LINKS}
    for name in MODELS:
        for gpus in (2, 4, 8):
            report[f"{name}, {gpus} GPUs"] = model(name, gpus, eff)
    if args.json:
        print(json.dumps(report, indent=1))
        return
    print(f"efficiency {eff:.1%} of {H100_BF16 / 1e12:.0f} TFLOP/s, from {CALIBRATION[0]}: {CALIBRATION[1]} guided "
          f"steps in {CALIBRATION[2]} s on one H100; links (all-to-all per GPU): "
          + ", ".join(f"{k} {bw / 1e9:.0f} GB/s + {lat * 1e6:.0f} us" for k, (bw, lat) in LINKS.items()))
    for name, m in MODELS.items():
        r1 = report[f"{name}, 2 GPUs"]
        print(f"{name}: {m[1]} tokens, {m[3]} layers, dim {m[4]}, {m[5]} heads; {r1['flops_per_step'] / 1e15:.2f} "
              f"PFLOP per guided step, {r1['seconds_per_step_1']:.2f} s on one GPU, {r1['memory_gb_1']:.1f} GB")
        anchor = ANCHORS.get(name)
        for gpus in (2, 4, 8):
            r = report[f"{name}, {gpus} GPUs"]
            if "NVLink" not in r:
                print(f"  {gpus} GPUs: {r['plan']}")
                continue
            pub = f"; published {anchor[1][gpus]:.2f}x" if anchor and gpus in anchor[1] else ""
            goal = f"; goal >= {GOAL[gpus]}x" if name.startswith("Wan 2.1 14B") and gpus in GOAL else ""
            print(f"  {gpus} GPUs, {r['plan']}: all-to-all {r['alltoall_bytes_per_layer_per_gpu'] / 1e6:.1f} MB per "
                  f"layer and GPU ({r['alltoall_group_bytes_per_layer'] / 1e6:.1f} MB the group), "
                  f"{r['alltoall_bytes_per_step_per_gpu'] / 1e9:.2f} GB per step and GPU; CFG all-gather "
                  f"{r['cfg_allgather_bytes_per_step_per_gpu'] / 1e6:.1f} MB; memory {r['memory_gb_per_gpu']:.1f} GB "
                  f"per GPU{pub}{goal}")
            for link in LINKS:
                x = r[link]
                print(f"     {link}: {x['seconds_per_step']:.3f} s/step ({x['speedup']:.2f}x), communication "
                      f"{1e3 * x['comm_seconds']:.0f} ms")


if __name__ == "__main__":
    main()
