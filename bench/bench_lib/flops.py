"""Convolution FLOPs of one encode or decode, counted from the model's own layer graph.

The diffusers model is built from its config on the meta device and run on a meta tensor of the benchmark's
shape under torch's FlopCounterMode: every convolution reports 2 x multiply-accumulates for the shapes it really
sees (causal padding, strides, chunking and the per-level frame counts included) and nothing is computed, so
counting Wan 2.1 decode at 81x480x832 takes a few seconds on any machine. Attention and norms are not counted
(attention is under 1% of these models' work); the figure is what the throughput is divided by to give an
achieved TFLOP/s.
"""
import json
import os

# Dense bf16 tensor-core peaks from the vendor data sheets (SXM parts), TFLOP/s: achieved / peak is the
# utilisation the GPU run reports. Matched by substring of torch.cuda.get_device_name().
BF16_PEAK_TFLOPS = {"H100": 989.4, "H200": 989.4, "B200": 2250.0, "A100": 312.0, "L40S": 362.1, "RTX 4090": 165.2}


def bf16_peak(device_name):
    for key, peak in BF16_PEAK_TFLOPS.items():
        if device_name and key in device_name:
            return key, peak
    return None, None


def conv_flops(model_dir, direction, frames, height, width, temporal=4, spatial=8):
    """FLOPs of the convolutions of one `direction` pass over a clip of `frames` x `height` x `width` pixels."""
    import diffusers
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = json.load(f)
    cls = getattr(diffusers, cfg["_class_name"])
    with torch.device("meta"):
        model = cls.from_config(cfg).eval()
        if direction == "encode":
            x = torch.empty(1, 3, frames, height, width)
        else:
            channels = cfg.get("z_dim") or cfg.get("latent_channels")
            x = torch.empty(1, channels, 1 + (frames - 1) // temporal, height // spatial, width // spatial)
    counter = FlopCounterMode(display=False)
    with counter, torch.no_grad():
        model.encode(x) if direction == "encode" else model.decode(x)
    counts = counter.get_flop_counts().get("Global", {})
    return int(sum(v for k, v in counts.items() if "convolution" in str(k)))
