#!/usr/bin/env python3
"""The headline GPU figures' Python side (tools/gpu-check-cases causal-headline and restyle-headline).

    gpu_headline.py make-wan FOLDER [--layers 30] [--device cuda] [--dtype bfloat16]
        a random-weight diffusers Wan 2.1 folder with the 1.3B model's real shapes (30 layers of 12 heads x 128,
        FFN 8960, text 4096 wide) and, beside it, prompt embeddings [1, 512, 4096] under the names both
        latent-gen-bench ("text") and the elements ("prompt_embeds") read. Made once (a stamp file); the weights
        are drawn on --device, so on a GPU the folder takes seconds.
    gpu_headline.py profile TRACE.json
        what one profiled block (latent-gen-bench --profile-iteration) spent: `figure` lines for its span, the GPU's
        busy time and share (kernels, copies and fills merged), the idle gaps between them (the host's cost), the
        host-blocking calls (synchronisations and blocking copies), and the kernels that took the most time.
    gpu_headline.py causal PLAIN.json [WITH_DECODE.json]
        `figure NAME VALUE` lines from latent-gen-bench --json runs of the causal schedule: the time to the first
        block, the steady latent frames/s (every block after the first) and video frames/s, and with the decoder
        in the loop the video frames/s of generation plus decode.

Needs torch and, for make-wan, diffusers; the rest is the standard library.
"""
import argparse
import json
import os
import sys

# diffusers' WanTransformer3DModel config of Wan2.1-T2V-1.3B-Diffusers; only num_layers is ever changed.
WAN_13B = dict(patch_size=(1, 2, 2), num_attention_heads=12, attention_head_dim=128, in_channels=16, out_channels=16,
               text_dim=4096, freq_dim=256, ffn_dim=8960, num_layers=30, cross_attn_norm=True,
               qk_norm="rms_norm_across_heads", eps=1e-6, rope_max_seq_len=1024)
TEXT_TOKENS = 512
PROMPT_TOKENS = 38  # rows of a real prompt; the rest zero, as umT5's embeddings come
SEED = 20261128


def make_wan(folder, layers, device, dtype):
    stamp = os.path.join(folder, "stamp")
    if os.path.exists(stamp):
        return
    import torch
    from diffusers import UniPCMultistepScheduler, WanTransformer3DModel
    from safetensors.torch import save_file

    torch.manual_seed(SEED)
    with torch.device(device):
        net = WanTransformer3DModel(**dict(WAN_13B, num_layers=layers)).eval()
    net.to(getattr(torch, dtype)).save_pretrained(os.path.join(folder, "transformer"), safe_serialization=True)
    params = sum(p.numel() for p in net.parameters())
    del net
    UniPCMultistepScheduler(prediction_type="flow_prediction", use_flow_sigmas=True, num_train_timesteps=1000,
                            flow_shift=3.0).save_pretrained(os.path.join(folder, "scheduler"))
    with open(os.path.join(folder, "model_index.json"), "w") as f:
        json.dump({"_class_name": "WanPipeline", "scheduler": ["diffusers", "UniPCMultistepScheduler"],
                   "transformer": ["diffusers", "WanTransformer3DModel"]}, f, indent=2)
    g = torch.Generator().manual_seed(SEED + 1)
    text = torch.zeros(1, TEXT_TOKENS, WAN_13B["text_dim"])
    text[:, :PROMPT_TOKENS] = torch.randn(1, PROMPT_TOKENS, WAN_13B["text_dim"], generator=g)
    save_file({"text": text}, os.path.join(folder, "text.safetensors"))
    save_file({"prompt_embeds": text}, os.path.join(folder, "prompt-embeds.safetensors"))
    with open(stamp, "w") as f:
        f.write(f"{params}\n")
    print(f"figure transformer_params {params}")


def causal_figures(plain, decoded):
    def load(path):
        with open(path) as f:
            text = f.read()
        # latent-gen-bench --json prints one JSON object as its last line.
        return json.loads(text.strip().splitlines()[-1])

    r = load(plain)
    blocks = r["next_seconds"]
    chunk = r["chunk_frames"]
    tf = r["temporal_factor"]
    print(f"figure load_s {r['load_seconds']:.3f}")
    print(f"figure blocks {len(blocks)}")
    print(f"figure first_block_s {r['first_latent_seconds']:.4f}")
    if len(blocks) < 2:
        raise SystemExit("FAIL: one block only: no steady state to measure")
    steady = sum(blocks[1:])
    latent_fps = chunk * (len(blocks) - 1) / steady
    print(f"figure block_ms {1000 * steady / (len(blocks) - 1):.2f}")
    print(f"figure latent_fps {latent_fps:.3f}")
    print(f"figure video_fps {tf * latent_fps:.3f}")
    if decoded:
        d = load(decoded)
        gen, dec = d["next_seconds"], d.get("decode_next_seconds") or []
        if len(dec) != len(gen) or len(gen) < 2:
            raise SystemExit("FAIL: the decoded run has no per-block decode times")
        loop = sum(gen[1:]) + sum(dec[1:])
        print(f"figure taehv_block_ms {1000 * sum(dec[1:]) / (len(dec) - 1):.2f}")
        print(f"figure video_fps_taehv {tf * chunk * (len(gen) - 1) / loop:.3f}")
        # The second process on the GPU: its first block skips what the first process paid once (measured on an
        # H200: 0.68-0.91 s against 1.7-2.5 s), so both are reported.
        print(f"figure first_block_s_taehv_run {d['first_latent_seconds']:.4f}")
        print(f"figure first_frames_s_taehv {d['first_latent_seconds'] + dec[0]:.4f}")
        print(f"figure frames_decoded {d['frames']}")


GPU_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")
# CUDA runtime calls that make the host wait for the device.
BLOCKING = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy",
            "cudaMemcpy2D", "cudaStreamWaitEvent")


def profile_figures(path, top=12, gap_us=10.0):
    with open(path) as f:
        trace = json.load(f)
    events = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X" and "dur" in e]
    if not events:
        raise SystemExit(f"FAIL: {path} holds no timed events")
    start = min(e["ts"] for e in events)
    end = max(e["ts"] + e["dur"] for e in events)
    print(f"figure profile_span_ms {(end - start) / 1000:.3f}")
    print(f"figure cpu_ops {sum(1 for e in events if e.get('cat') == 'cpu_op')}")
    gpu = sorted((e["ts"], e["ts"] + e["dur"], e) for e in events if e.get("cat") in GPU_CATEGORIES)
    print(f"figure gpu_kernels {sum(1 for _, _, e in gpu if e.get('cat') == 'kernel')}")
    blocking = [e for e in events if e.get("cat") == "cuda_runtime" and e.get("name") in BLOCKING]
    print(f"figure host_blocking_calls {len(blocking)}")
    if not gpu:
        return
    busy, gaps, cur_s, cur_e = 0.0, [], gpu[0][0], gpu[0][1]
    for s, e, _ in gpu[1:]:
        if s > cur_e:
            busy += cur_e - cur_s
            if s - cur_e > gap_us:
                gaps.append(s - cur_e)
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    busy += cur_e - cur_s
    span = gpu[-1][1] - gpu[0][0]
    print(f"figure gpu_span_ms {span / 1000:.3f}")
    print(f"figure gpu_busy_ms {busy / 1000:.3f}")
    print(f"figure gpu_busy_share {busy / span if span else 0:.4f}")
    print(f"figure gpu_gaps_over_{gap_us:g}us {len(gaps)}")
    print(f"figure gpu_gaps_ms {sum(gaps) / 1000:.3f}")
    print(f"figure gpu_largest_gap_ms {max(gaps, default=0) / 1000:.3f}")
    totals = {}
    for s, e, ev in gpu:
        t = totals.setdefault(ev.get("name", "?"), [0.0, 0])
        t[0] += e - s
        t[1] += 1
    print(f"top {top} GPU kernels and copies of the block by time (ms, calls, share of busy, name):")
    for name, (us, n) in sorted(totals.items(), key=lambda kv: -kv[1][0])[:top]:
        print(f"  {us / 1000:9.3f} {n:6d} {us / busy:6.1%}  {name[:140]}")
    names = {}
    for e in blocking:
        names[e["name"]] = names.get(e["name"], 0) + 1
    if names:
        print("host-blocking calls: " + ", ".join(f"{k} x{v}" for k, v in sorted(names.items())))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("make-wan")
    m.add_argument("folder")
    m.add_argument("--layers", type=int, default=WAN_13B["num_layers"])
    m.add_argument("--device", default="cuda")
    m.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
    pr = sub.add_parser("profile")
    pr.add_argument("trace")
    c = sub.add_parser("causal")
    c.add_argument("plain")
    c.add_argument("decoded", nargs="?")
    a = p.parse_args(argv)
    if a.cmd == "make-wan":
        make_wan(a.folder, a.layers, a.device, a.dtype)
    elif a.cmd == "profile":
        profile_figures(a.trace)
    else:
        causal_figures(a.plain, a.decoded)
    return 0


if __name__ == "__main__":
    sys.exit(main())
