"""The diffusers side of the benchmark: one fresh process per measurement, printing the same JSON keys as
latent-bench so the two can be tabulated together.

  python bench/bench_lib/ref_runner.py --model DIR --frames N --height H --width W --direction encode|decode
                                       [--device cpu|cuda] [--dtype float32|bfloat16|float16] [--threads T]
                                       [--repeat R] [--warmup W] [--seed S] [--tile HxW|default]
                                       [--dump OUT.f32]

Input: the same seeded values latent-bench uses. encode: torch.rand over [T, 3, H, W] * 2 - 1 from a CPU
generator seeded with --seed (latent-bench draws the same stream frame by frame), as [1, 3, T, H, W].
decode: raw VAE-space latents torch.randn over [T', C, H/8, W/8], as [1, C, T', h, w].
Measured: vae.encode(x).latent_dist.mean or vae.decode(z).sample, in torch.inference_mode(), with
torch.set_num_threads(T). Memory: VmRSS after the model is loaded (and after any warmup) is the baseline; the
peak (VmHWM) is reset then through /proc/self/clear_refs, so the peak above baseline includes the input clip,
which diffusers' API needs whole. Weights are touched after loading (they are lazily mapped pages), so the
baseline holds the whole model, as latent-bench's does after the engine's load. On CUDA: torch.cuda.max_memory_allocated after reset_peak_memory_stats.
Tiles: --tile HxW calls vae.enable_tiling() with tiles of H x W pixels and the class's default overlaps
(CogVideoX: 1/6 of the height and 1/5 of the width; Wan: strides of 3/4 of the tile, as its 256/192 defaults);
--tile default calls enable_tiling() with no arguments (Wan: 256x256 tiles at a stride of 192).
--dump writes the output (encode: latent_dist.mean, decode: the frames) as raw float32 in [T, C, H, W] order,
the layout latent-bench --dump writes, after the measurement.
"""
import argparse
import json
import os
import statistics
import sys
import time


def status_bytes(key):
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return -1


def reset_peak_rss():
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


DTYPES = {"float32": "float32", "f32": "float32", "fp32": "float32", "float16": "float16", "f16": "float16",
          "fp16": "float16", "bfloat16": "bfloat16", "bf16": "bfloat16"}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True)
    p.add_argument("--frames", type=int, default=17)
    p.add_argument("--height", type=int, default=64)
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--direction", choices=("encode", "decode"), default="encode")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--repeat", type=int, default=1)
    p.add_argument("--warmup", type=int, default=0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tile", default="",
                   help="HxW pixels: enable_tiling() with these tiles and its default overlaps; 'default': "
                        "enable_tiling() with its defaults")
    p.add_argument("--dump", default="", help="write the last output as raw float32, [T, C, H, W]")
    p.add_argument("--profile", default="", help="write a torch.profiler op table (text) of the last repetition")
    a = p.parse_args(argv)

    rss_start = status_bytes("VmRSS")
    import torch
    import diffusers

    if a.threads > 0:
        torch.set_num_threads(a.threads)
    device = torch.device(a.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("ref_runner: --device cuda but torch sees no CUDA device")
    dtype = getattr(torch, DTYPES[a.dtype])
    cuda = device.type == "cuda"

    def sync():
        if cuda:
            torch.cuda.synchronize(device)

    with open(os.path.join(a.model, "config.json")) as f:
        cls_name = json.load(f)["_class_name"]
    cls = getattr(diffusers, cls_name)
    t0 = time.perf_counter()
    vae = cls.from_pretrained(a.model, torch_dtype=dtype, low_cpu_mem_usage=False).to(device).eval()
    sync()
    load_seconds = time.perf_counter() - t0
    tiling = None
    if a.tile == "default":
        vae.enable_tiling()
    elif a.tile:
        th, tw = (int(v) for v in a.tile.split("x"))
        if cls_name == "AutoencoderKLWan":
            # Wan's enable_tiling() takes strides, not overlap factors; its defaults are 256-pixel tiles at a
            # stride of 192, so keep that ratio (a stride above the tile would leave gaps).
            vae.enable_tiling(tile_sample_min_height=th, tile_sample_min_width=tw,
                              tile_sample_stride_height=th * 3 // 4, tile_sample_stride_width=tw * 3 // 4)
        else:
            vae.enable_tiling(tile_sample_min_height=th, tile_sample_min_width=tw)
    if a.tile:
        tiling = {k: getattr(vae, k) for k in ("tile_sample_min_height", "tile_sample_min_width",
                                               "tile_sample_stride_height", "tile_sample_stride_width",
                                               "tile_overlap_factor_height", "tile_overlap_factor_width")
                  if hasattr(vae, k)}
    if device.type == "cpu":
        # diffusers' CPU weights are views of a mapping of the safetensors file, faulted in on first use (the
        # engine faults in what it keeps while loading): touch them so the baseline holds the whole model on
        # both sides.
        with torch.inference_mode():
            for t in list(vae.parameters()) + list(vae.buffers()):
                t.sum()
    cfg = vae.config
    family = {"AutoencoderKLWan": "wan2.1", "AutoencoderKLCogVideoX": "cogvideox"}.get(cls_name, cls_name)
    tf = 4
    sf = 8
    latent_channels = cfg.z_dim if family == "wan2.1" else cfg.latent_channels
    latents = 1 + (a.frames - 1) // tf
    if a.direction == "decode" and (a.frames - 1) % tf:
        raise SystemExit(f"ref_runner: --direction decode wants --frames 1 + {tf}k")

    def make_input():
        g = torch.Generator().manual_seed(a.seed)
        if a.direction == "encode":
            x = torch.rand(a.frames, 3, a.height, a.width, generator=g).mul_(2).sub_(1)
            x = x.permute(1, 0, 2, 3).unsqueeze(0).contiguous()
        else:
            x = torch.randn(latents, latent_channels, a.height // sf, a.width // sf, generator=g)
            x = x.permute(1, 0, 2, 3).unsqueeze(0).contiguous()
        return x.to(device, dtype)

    def run_once():
        x = make_input()
        sync()
        c = time.process_time()
        t = time.perf_counter()
        with torch.inference_mode():
            if a.direction == "encode":
                out = vae.encode(x).latent_dist.mean
            else:
                out = vae.decode(x).sample
        sync()
        dt = time.perf_counter() - t
        cpu_times.append(time.process_time() - c)
        return dt, out, x.numel() * x.element_size()

    cpu_times = []
    for _ in range(a.warmup):
        run_once()
    del cpu_times[:]
    rss_baseline = status_bytes("VmRSS")
    hwm_reset = reset_peak_rss()
    gpu_baseline = 0
    if cuda:
        sync()
        torch.cuda.reset_peak_memory_stats(device)
        gpu_baseline = torch.cuda.memory_allocated(device)

    walls = []
    out = None
    input_bytes = 0
    for i in range(a.repeat):
        out = None
        if a.profile and i == a.repeat - 1:
            from torch.profiler import ProfilerActivity, profile
            acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
            with profile(activities=acts) as prof:
                dt, out, input_bytes = run_once()
            with open(a.profile, "w") as f:
                f.write(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=40))
        else:
            dt, out, input_bytes = run_once()
        walls.append(dt)
    rss_peak = status_bytes("VmHWM")
    outputs = out.shape[2]
    expected = latents if a.direction == "encode" else a.frames
    fps = [a.frames / w for w in walls]
    res = {
        "impl": "diffusers",
        "model": a.model,
        "family": family,
        "direction": a.direction,
        "device": str(device),
        "dtype": str(dtype).replace("torch.", ""),
        "frames": a.frames,
        "height": a.height,
        "width": a.width,
        "latents": latents,
        "seed": a.seed,
        "threads": torch.get_num_threads(),
        "interop_threads": torch.get_num_interop_threads(),
        "runtime": f"diffusers {diffusers.__version__}, torch {torch.__version__}",
        "repeat": a.repeat,
        "warmup": a.warmup,
        "load_seconds": load_seconds,
        "wall_seconds": walls,
        "wall_seconds_median": statistics.median(walls),
        "cpu_seconds": cpu_times,
        "fps": fps,
        "fps_median": statistics.median(fps),
        # One call returns the whole clip: no chunk is visible to the caller before the end.
        "chunks": 1,
        "chunk_latency_mean_seconds": statistics.median(walls),
        "chunk_latency_max_seconds": statistics.median(walls),
        "first_output_seconds": statistics.median(walls),
        "outputs": outputs,
        "outputs_expected": expected,
        "output_mean_abs": out.double().abs().mean().item(),
        "input_bytes": input_bytes,
        "rss_start_bytes": rss_start,
        "rss_baseline_bytes": rss_baseline,
        "rss_peak_bytes": rss_peak,
        "rss_peak_above_baseline_bytes": rss_peak - rss_baseline,
        "rss_end_bytes": status_bytes("VmRSS"),
        "rss_peak_reset": hwm_reset,
        "tile": a.tile,
        "tiling": tiling,
        "dump": a.dump,
    }
    if a.dump:
        out[0].permute(1, 0, 2, 3).to("cpu", torch.float32).contiguous().numpy().tofile(a.dump)
    if cuda:
        peak = torch.cuda.max_memory_allocated(device)
        res["gpu_memory"] = {
            "allocated_baseline_bytes": gpu_baseline,
            "allocated_peak_bytes": peak,
            "allocated_peak_above_baseline_bytes": peak - gpu_baseline,
            "reserved_peak_bytes": torch.cuda.max_memory_reserved(device),
        }
    if a.profile:
        res["profile"] = a.profile
    print(json.dumps(res))
    return 0 if outputs == expected else 1


if __name__ == "__main__":
    sys.exit(main())
