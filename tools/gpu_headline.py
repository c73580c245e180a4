#!/usr/bin/env python3
"""The headline GPU figures' Python side (tools/gpu-check-cases causal-headline and restyle-headline).

    gpu_headline.py make-wan FOLDER [--layers 30] [--device cuda] [--dtype bfloat16]
        a random-weight diffusers Wan 2.1 folder with the 1.3B model's real shapes (30 layers of 12 heads x 128,
        FFN 8960, text 4096 wide) and, beside it, prompt embeddings [1, 512, 4096] under the names both
        latent-gen-bench ("text") and the elements ("prompt_embeds") read. Made once (a stamp file); the weights
        are drawn on --device, so on a GPU the folder takes seconds.
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
        print(f"figure first_frames_s_taehv {d['first_latent_seconds'] + dec[0]:.4f}")
        print(f"figure frames_decoded {d['frames']}")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("make-wan")
    m.add_argument("folder")
    m.add_argument("--layers", type=int, default=WAN_13B["num_layers"])
    m.add_argument("--device", default="cuda")
    m.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
    c = sub.add_parser("causal")
    c.add_argument("plain")
    c.add_argument("decoded", nargs="?")
    a = p.parse_args(argv)
    if a.cmd == "make-wan":
        make_wan(a.folder, a.layers, a.device, a.dtype)
    else:
        causal_figures(a.plain, a.decoded)
    return 0


if __name__ == "__main__":
    sys.exit(main())
