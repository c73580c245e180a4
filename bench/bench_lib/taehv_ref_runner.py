"""The taehv.py side of the TAEHV benchmark: one fresh process per measurement, printing the JSON keys latent-bench
prints. taehv.py is not on the package index: it is imported from --reference-dir (a local copy of
github.com/madebyollin/taehv), never copied here.

  python bench/bench_lib/taehv_ref_runner.py --reference-dir DIR --model taew2_1.pth --frames N --height H
                                             --width W [--threads T] [--repeat R] [--warmup W] [--seed S]
                                             [--sequential]

Measured: TAEHV(checkpoint).decode_video(z, parallel=not --sequential, show_progress_bar=False) in
torch.inference_mode() in float32 on the CPU, z = torch.randn over [1, T', C, H/8, W/8] from a CPU generator seeded
with --seed, T' = 1 + (N - 1) / 4 latents (4 T' - 3 = N frames out, as latent-bench --direction decode).
Memory: VmHWM above VmRSS after the model is loaded and warmed, as ref_runner.py.
"""
import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ref_runner import reset_peak_rss, status_bytes  # noqa: E402


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--reference-dir", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--frames", type=int, default=17)
    p.add_argument("--height", type=int, default=176)
    p.add_argument("--width", type=int, default=320)
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--sequential", action="store_true", help="decode_video(parallel=False): frame by frame")
    a = p.parse_args(argv)

    import torch
    torch.set_num_threads(a.threads)
    sys.path.insert(0, a.reference_dir)
    from taehv import TAEHV

    rss_start = status_bytes("VmRSS")
    t = time.perf_counter()
    model = TAEHV(checkpoint_path=a.model).eval()
    load_seconds = time.perf_counter() - t
    patch = getattr(model, "patch_size", 1)
    latents = 1 + (a.frames - 1) // 4
    g = torch.Generator().manual_seed(a.seed)
    sf = 8 * patch
    z = torch.randn(1, latents, model.latent_channels, a.height // sf, a.width // sf, generator=g)

    cpu_times = []

    def run_once():
        c = time.process_time()
        t0 = time.perf_counter()
        with torch.inference_mode():
            out = model.decode_video(z, parallel=not a.sequential, show_progress_bar=False)
        dt = time.perf_counter() - t0
        cpu_times.append(time.process_time() - c)
        return dt, out

    for _ in range(a.warmup):
        run_once()
    del cpu_times[:]
    rss_baseline = status_bytes("VmRSS")
    hwm_reset = reset_peak_rss()
    walls, out = [], None
    for _ in range(a.repeat):
        dt, out = run_once()
        walls.append(dt)
    rss_peak = status_bytes("VmHWM")
    fps = [out.shape[1] / w for w in walls]
    print(json.dumps({
        "impl": "taehv.py", "model": a.model, "direction": "decode", "device": "cpu", "dtype": "float32",
        "frames": a.frames, "height": a.height, "width": a.width, "latents": latents, "seed": a.seed,
        "threads": torch.get_num_threads(), "runtime": f"taehv.py (parallel={not a.sequential}), torch "
        f"{torch.__version__}", "repeat": a.repeat, "warmup": a.warmup, "load_seconds": load_seconds,
        "wall_seconds": walls, "wall_seconds_median": statistics.median(walls), "cpu_seconds": cpu_times,
        "fps": fps, "fps_median": statistics.median(fps), "outputs": int(out.shape[1]), "outputs_expected": a.frames,
        "rss_start_bytes": rss_start, "rss_baseline_bytes": rss_baseline, "rss_peak_bytes": rss_peak,
        "rss_peak_above_baseline_bytes": rss_peak - rss_baseline, "rss_peak_reset": hwm_reset,
    }))


if __name__ == "__main__":
    main()
