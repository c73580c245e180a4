"""What the causal schedule would do on one H100 in bf16 at 480x832: an ESTIMATE from the shapes, not a
measurement. tools/bench --generate --causal prints it under its CPU table.

FLOPs are counted per model call from Wan 2.1 1.3B's shapes (matrix products and attention; norms, modulation and
RoPE are left out): a call runs the block's query tokens through every layer's self-attention projections, the
attention over the keys the window holds, the cross-attention (its keys and values over the 512 text tokens are
computed once per prompt, as both implementations cache them) and the FFN; the text embedder runs on every call in
Self-Forcing's loop and is counted. A block is len(steps) denoising calls and one context pass, all over the same
keys.

The throughput is not assumed from the datasheet but taken from the published runs: Self-Forcing's 17.0 FPS (81
frames = 21 latent frames = 7 blocks of 3 over a global cache, so each block attends to all frames before it) and
0.69 s to the first block, both on one H100 (paper, table 1). Dividing the FLOPs of those blocks by those seconds
gives the rate their whole loop sustained (whatever else it did, VAE decode included, is inside those seconds, so it
is a rate per denoiser FLOP, lower than the GPU's); the same rate applied to LongLive's window (kv 12, sink 3) gives
the steady state. A second line assumes a share of the H100's 989 TFLOP/s dense bf16 for the denoiser alone.
"""

# Wan 2.1 T2V 1.3B at 480x832: 60x104 latents, patch 1x2x2.
WAN_1_3B = dict(dim=1536, heads=12, ffn=8960, layers=30, text_tokens=512, text_dim=4096, frame_tokens=1560,
                in_channels=16, patch=4)
H100_BF16_DENSE = 989e12  # TFLOP/s, SXM (the anchors' datasheet figure)
SELF_FORCING = dict(fps=17.0, first_block_seconds=0.69, frames=81, latent_frames=21, chunk=3)
# The Wan 2.1 VAE decoder at 480x832, per output frame (derived in the performance anchors from its layers).
WAN_VAE_DECODE_TFLOP_PER_FRAME = 3.4
LONGLIVE_FPS = 20.7  # LongLive 1.0 on one H100, window 12, sink 3 (README)


def call_flops(m, query_frames, key_frames, text_embedder=True):
    """FLOPs (2 per multiply-add) of one model call of `query_frames` frames attending to `key_frames` frames."""
    d, tokens, keys = m["dim"], query_frames * m["frame_tokens"], key_frames * m["frame_tokens"]
    per_layer = (2 * 4 * d * d * tokens              # self-attention q, k, v, o
                 + 2 * 2 * tokens * keys * d         # self-attention scores and weighted values
                 + 2 * 2 * d * d * tokens            # cross-attention q, o
                 + 2 * 2 * tokens * m["text_tokens"] * d  # cross-attention over the text
                 + 2 * 2 * d * m["ffn"] * tokens)    # FFN
    patch = 2 * 2 * tokens * m["in_channels"] * m["patch"] * d  # patch embedding and head
    text = 2 * m["text_tokens"] * (m["text_dim"] * d + d * d) if text_embedder else 0
    return m["layers"] * per_layer + patch + text


def block_flops(m, key_frames, chunk=3, steps=4):
    """A block: `steps` denoising calls and its context pass, all over the same keys."""
    return (steps + 1) * call_flops(m, chunk, key_frames)


def window_keys(block, chunk, kv_window, global_frames=21):
    """Frames block `block` (from 0) attends to, its own included: all before it (global cache) or the window."""
    seen = (block + 1) * chunk
    return min(seen, kv_window if kv_window > 0 else global_frames)


def estimate(chunk=3, steps=4, kv_window=12, sink=3, mfu=(0.3, 0.5), m=WAN_1_3B):
    sf = SELF_FORCING
    blocks = sf["latent_frames"] // sf["chunk"]
    sf_flops = [block_flops(m, window_keys(b, sf["chunk"], 0), sf["chunk"], 4) for b in range(blocks)]
    sf_seconds = sf["frames"] / sf["fps"]
    rate = sum(sf_flops) / sf_seconds
    first_rate = sf_flops[0] / sf["first_block_seconds"]
    first = block_flops(m, window_keys(0, chunk, kv_window), chunk, steps)
    steady = block_flops(m, window_keys(10 ** 6, chunk, kv_window), chunk, steps)
    t_block = steady / rate
    out = {
        "what": "ESTIMATE from the shapes (Wan 2.1 1.3B, 480x832, bf16, one H100), not a measurement",
        "model": m, "chunk_frames": chunk, "denoising_steps": steps, "kv_window": kv_window, "sink_frames": sink,
        "call_tflop_first": call_flops(m, chunk, window_keys(0, chunk, kv_window)) / 1e12,
        "call_tflop_steady": call_flops(m, chunk, window_keys(10 ** 6, chunk, kv_window)) / 1e12,
        "block_tflop_first": first / 1e12,
        "block_tflop_steady": steady / 1e12,
        "anchor": dict(sf, blocks=blocks, tflop=sum(sf_flops) / 1e12, seconds=sf_seconds,
                       sustained_tflops=rate / 1e12, first_block_tflops=first_rate / 1e12,
                       share_of_peak=rate / H100_BF16_DENSE),
        "anchored": {"first_block_seconds": first / first_rate, "block_seconds": t_block,
                     "latents_per_second": chunk / t_block, "video_fps": 4 * chunk / t_block},
        "at_mfu": [{"mfu": u, "first_block_seconds": first / (u * H100_BF16_DENSE),
                    "block_seconds": steady / (u * H100_BF16_DENSE),
                    "latents_per_second": chunk * u * H100_BF16_DENSE / steady,
                    "video_fps": 4 * chunk * u * H100_BF16_DENSE / steady} for u in mfu],
        "longlive_published_fps": LONGLIVE_FPS,
    }
    return out


def markdown(e):
    a, an = e["anchor"], e["anchored"]
    lines = [
        f"**Estimate, not a measurement**: one H100, bf16, Wan 2.1 1.3B at 480x832 ({e['model']['frame_tokens']} "
        f"tokens a frame, {e['model']['layers']} layers, dim {e['model']['dim']}), blocks of {e['chunk_frames']} "
        f"latent frames, {e['denoising_steps']} steps and a context pass, window {e['kv_window'] or 'global'}"
        f"{', sink ' + str(e['sink_frames']) if e['sink_frames'] else ''}.",
        "",
        "| | per call | per block (5 calls) |",
        "|---|--:|--:|",
        f"| first block (attends to {e['chunk_frames']} frames) | {e['call_tflop_first']:.1f} TFLOP | "
        f"{e['block_tflop_first']:.0f} TFLOP |",
        f"| steady state (attends to {e['kv_window'] or 21} frames) | {e['call_tflop_steady']:.1f} TFLOP | "
        f"{e['block_tflop_steady']:.0f} TFLOP |",
        "",
        f"Anchor: Self-Forcing's {a['fps']:g} FPS ({a['frames']} frames = {a['blocks']} blocks over a global cache, "
        f"{a['tflop']:.0f} TFLOP in {a['seconds']:.2f} s) is {a['sustained_tflops']:.0f} TFLOP/s sustained by their "
        f"whole loop ({100 * a['share_of_peak']:.0f}% of 989 TFLOP/s dense bf16; the rest of the loop is inside the "
        f"seconds, e.g. the Wan VAE's decode, about {WAN_VAE_DECODE_TFLOP_PER_FRAME:g} TFLOP a frame at 480x832 by "
        f"the anchors' count), and its {a['first_block_seconds']:g} s first block {a['first_block_tflops']:.0f} "
        f"TFLOP/s.",
        "",
        "| assumption | first block | block (steady) | latent frames/s | video FPS |",
        "|---|--:|--:|--:|--:|",
        f"| Self-Forcing's sustained rate | {an['first_block_seconds']:.2f} s | {an['block_seconds']:.2f} s | "
        f"{an['latents_per_second']:.1f} | {an['video_fps']:.1f} |",
    ]
    for r in e["at_mfu"]:
        lines.append(f"| denoiser alone at {100 * r['mfu']:.0f}% of 989 TFLOP/s | {r['first_block_seconds']:.2f} s | "
                     f"{r['block_seconds']:.2f} s | {r['latents_per_second']:.1f} | {r['video_fps']:.1f} |")
    lines += ["", f"For comparison, LongLive publishes {e['longlive_published_fps']:g} FPS on one H100 at this window "
                  "and sink. A video frame is 4 per latent frame (the Wan VAE's temporal factor)."]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(markdown(estimate()))
