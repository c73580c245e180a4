#!/usr/bin/env python3
"""Summarises a tools/demo run: frames, latent shape, PSNR/SSIM, time, memory, and a side-by-side PNG.

    demo_report.py --dir D --width W --height H ...        the encode -> decode round trip
    demo_report.py generated --dir D --frames N ...        tools/demo --generate: time, memory, contact sheet
"""

import argparse
import glob
import math
import os
import sys

import numpy as np
from PIL import Image, ImageDraw
from safetensors import safe_open


def psnr(a, b):
    mse = np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2)
    return 10 * math.log10(255.0**2 / max(mse, 1e-12))


def ssim(a, b):
    """Mean SSIM of two uint8 RGB frame stacks (Gaussian window 11, sigma 1.5, the usual constants)."""
    import torch
    import torch.nn.functional as F

    x = torch.from_numpy(a).float().permute(0, 3, 1, 2) / 255
    y = torch.from_numpy(b).float().permute(0, 3, 1, 2) / 255
    g = torch.exp(-((torch.arange(11).float() - 5) ** 2) / (2 * 1.5**2))
    w = (g[:, None] * g[None, :] / g.sum() ** 2).expand(3, 1, 11, 11).contiguous()
    f = lambda t: F.conv2d(t, w, groups=3)
    mx, my = f(x), f(y)
    sxx, syy, sxy = f(x * x) - mx**2, f(y * y) - my**2, f(x * y) - mx * my
    c1, c2 = 0.01**2, 0.03**2
    s = ((2 * mx * my + c1) * (2 * sxy + c2)) / ((mx**2 + my**2 + c1) * (sxx + syy + c2))
    return s.mean().item()


def side_by_side(orig, recon, path, picks=3):
    idx = sorted({0, len(orig) // 2, len(orig) - 1})[:picks]
    h, w = orig.shape[1:3]
    label = 14
    canvas = Image.new("RGB", (2 * w + 4, len(idx) * (h + label) + label), (255, 255, 255))
    draw = ImageDraw.Draw(canvas)
    draw.text((4, 1), "original", fill=(0, 0, 0))
    draw.text((w + 8, 1), "vaeencode -> vaedecode", fill=(0, 0, 0))
    for row, i in enumerate(idx):
        y = label + row * (h + label)
        canvas.paste(Image.fromarray(orig[i]), (0, y))
        canvas.paste(Image.fromarray(recon[i]), (w + 4, y))
        draw.text((4, y + h), f"frame {i}  PSNR {psnr(recon[i], orig[i]):.1f} dB", fill=(0, 0, 0))
    canvas.save(path)


def contact_sheet(frames, path, columns=8, rows=3):
    """Evenly spaced frames of the whole video, `columns` a row, each labelled with its number."""
    n = len(frames)
    picks = sorted({round(i * (n - 1) / max(1, columns * rows - 1)) for i in range(min(n, columns * rows))})
    h, w = frames.shape[1:3]
    label = 12
    rows = (len(picks) + columns - 1) // columns
    canvas = Image.new("RGB", (columns * (w + 2), rows * (h + label)), (255, 255, 255))
    draw = ImageDraw.Draw(canvas)
    for k, i in enumerate(picks):
        x, y = (k % columns) * (w + 2), (k // columns) * (h + label)
        canvas.paste(Image.fromarray(frames[i]), (x, y))
        draw.text((x + 2, y + h), f"{i}", fill=(0, 0, 0))
    canvas.save(path)


def generated(argv):
    ap = argparse.ArgumentParser(prog="demo_report.py generated")
    ap.add_argument("--dir", required=True)
    ap.add_argument("--frames", type=int, required=True)
    ap.add_argument("--width", type=int, required=True)
    ap.add_argument("--height", type=int, required=True)
    ap.add_argument("--seconds", type=float, required=True)
    ap.add_argument("--rss-kib", type=int, required=True)
    a = ap.parse_args(argv)
    frame = a.width * a.height * 3
    video = np.fromfile(os.path.join(a.dir, "generated.rgb"), np.uint8)
    video = video[: video.size // frame * frame].reshape(-1, a.height, a.width, 3)
    if len(video) != a.frames:
        raise SystemExit(f"asked for {a.frames} frames, got {len(video)}")
    png = os.path.join(a.dir, "contact-sheet.png")
    contact_sheet(video, png)
    print(f"== {len(video)} frames of {a.width}x{a.height} generated and decoded in {a.seconds:.1f} s "
          f"({len(video) / a.seconds:.1f} frames/s, peak RSS {a.rss_kib // 1024} MiB); one process, model loading "
          f"included")
    print(f"== wrote {os.path.join(a.dir, 'generated.mp4')}, {png}")


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "generated":
        return generated(sys.argv[2:])
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", required=True)
    ap.add_argument("--width", type=int, required=True)
    ap.add_argument("--height", type=int, required=True)
    ap.add_argument("--encode-seconds", type=float, required=True)
    ap.add_argument("--decode-seconds", type=float, required=True)
    ap.add_argument("--encode-rss-kib", type=int, required=True)
    ap.add_argument("--decode-rss-kib", type=int, required=True)
    a = ap.parse_args()
    frame = a.width * a.height * 3
    orig = np.fromfile(os.path.join(a.dir, "original.rgb"), np.uint8)
    recon = np.fromfile(os.path.join(a.dir, "decoded.rgb"), np.uint8)
    orig = orig[: orig.size // frame * frame].reshape(-1, a.height, a.width, 3)
    recon = recon[: recon.size // frame * frame].reshape(-1, a.height, a.width, 3)
    if len(orig) != len(recon):
        raise SystemExit(f"frame count changed: {len(orig)} in, {len(recon)} out")
    files = sorted(glob.glob(os.path.join(a.dir, "latents-*.safetensors")))
    shapes = []
    for f in files:
        with safe_open(f, "np") as s:
            shapes.append(s.get_slice("latents").get_shape())
    total = [sum(s[0] for s in shapes)] + list(shapes[0][1:])
    png = os.path.join(a.dir, "side-by-side.png")
    side_by_side(orig, recon, png)
    n = len(orig)
    print(f"== {n} frames of {a.width}x{a.height} -> latents {total} (frames, channels, height, width) "
          f"in {len(files)} files -> {n} frames")
    print(f"== round trip PSNR {psnr(recon, orig):.2f} dB, SSIM {ssim(recon, orig):.4f}")
    print(f"== encode {a.encode_seconds:.1f} s ({n / a.encode_seconds:.1f} frames/s, peak RSS "
          f"{a.encode_rss_kib // 1024} MiB), decode {a.decode_seconds:.1f} s ({n / a.decode_seconds:.1f} frames/s, "
          f"peak RSS {a.decode_rss_kib // 1024} MiB); whole processes, model loading included")
    print(f"== wrote {os.path.join(a.dir, 'decoded.mp4')}, {png}, {len(files)} latent files in {a.dir}")


if __name__ == "__main__":
    main()
