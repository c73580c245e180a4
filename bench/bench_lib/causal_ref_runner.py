"""The reference side of tools/bench --generate --causal: Self-Forcing's own causal inference loop (or LongLive's,
which has the same CausalInferencePipeline) on a local copy of the repository, one fresh process per measurement,
printing the keys latent-gen-bench prints (one JSON line) so the two can be tabulated together.

  python bench/bench_lib/causal_ref_runner.py --reference-dir DIR --model FILE --config FILE --text FILE
      --frames N --height h --width w [--chunk 3] [--kv-window 12] [--sink 3] [--denoising-steps 1000,750,500,250]
      [--threads T] [--seed S] [--save-latents FILE]

The repository is imported as tests/fixtures/gen_causal_fixtures.py imports it (its package __init__ files skipped,
einops and the GPU memory helpers stubbed, an fp32 scaled_dot_product_attention in place of their flash-attention
call, which casts to bf16). Then their code runs as their inference.py builds it: CausalInferencePipeline(args)
makes WanDiffusionWrapper(is_causal=True, local_attn_size, sink_size, timestep_shift=5), whose
CausalWanModel.from_pretrained is answered with a CausalWanModel of --config holding --model's weights (the bench
folder's, in the original Wan names), and pipeline.inference(noise, text_prompts, return_latents=True) runs every
block. What follows the model instead of their Wan 1.3B at 480x832 constants: the layer count, the tokens per frame
(frame_seq_length, the attention's max_attention_size) and the caches' shapes (the fixture script does the same).
The text encoder hands over --text's "text" [1, 512, D]; the VAE is the identity (latents are compared).

Noise as their inference.py draws it: torch.manual_seed(seed), then torch.randn([1, frames, 16, h, w]); the
re-noise draws follow from the global generator. Block times: the wrapper's forward is timed, and a block ends with
its context pass (its len(steps) + 1-th call), which is where latent-gen-bench's next() returns.
"""
import argparse
import contextlib
import json
import os
import resource
import sys
import time
import types

HERE = os.path.dirname(os.path.abspath(__file__))
TOP = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)

from ref_runner import reset_peak_rss, status_bytes  # noqa: E402

# Their global cache when local_attn_size is -1: 32760 tokens = 21 frames of 1560.
GLOBAL_CACHE_FRAMES = 21


def cpu_seconds():
    u = resource.getrusage(resource.RUSAGE_SELF)
    return u.ru_utime + u.ru_stime


def fixture_helpers():
    """load_repo, TextStub and VaeStub of tests/fixtures/gen_causal_fixtures.py."""
    sys.path.insert(0, os.path.join(TOP, "tests", "fixtures"))
    try:
        import gen_causal_fixtures
    finally:
        sys.path.pop(0)
    return gen_causal_fixtures


def build_pipeline(mods, fx, config, weights, text, args):
    import torch

    local_attn_size = args.kv_window if args.kv_window > 0 else -1
    frame_tokens = (args.height // config["patch_size"][1]) * (args.width // config["patch_size"][2])
    cache_frames = local_attn_size if local_attn_size != -1 else GLOBAL_CACHE_FRAMES
    heads, head_dim = config["num_heads"], config["dim"] // config["num_heads"]

    def from_pretrained(cls, path, local_attn_size=-1, sink_size=0, **kwargs):
        model = cls(local_attn_size=local_attn_size, sink_size=sink_size, **config)
        model.load_state_dict(weights, strict=True)
        return model

    mods.causal_model.CausalWanModel.from_pretrained = classmethod(from_pretrained)
    pipeline_args = types.SimpleNamespace(
        denoising_step_list=args.denoising_steps, warp_denoising_step=True, num_frame_per_block=args.chunk,
        independent_first_frame=False, context_noise=0, global_sink=True,
        model_kwargs=dict(local_attn_size=local_attn_size, sink_size=args.sink, timestep_shift=5.0))
    with contextlib.redirect_stdout(sys.stderr):
        pipe = mods.pipeline.CausalInferencePipeline(pipeline_args, torch.device("cpu"),
                                                     text_encoder=fx.TextStub({"prompt": text}), vae=fx.VaeStub())
    model = pipe.generator.model
    for m in model.modules():
        if hasattr(m, "max_attention_size"):
            m.max_attention_size = cache_frames * frame_tokens
    pipe.num_transformer_blocks = config["num_layers"]
    pipe.frame_seq_length = frame_tokens

    def init_kv(batch_size, dtype, device):
        pipe.kv_cache1 = [{"k": torch.zeros([batch_size, cache_frames * frame_tokens, heads, head_dim], dtype=dtype,
                                            device=device),
                           "v": torch.zeros([batch_size, cache_frames * frame_tokens, heads, head_dim], dtype=dtype,
                                            device=device),
                           "global_end_index": torch.tensor([0], dtype=torch.long, device=device),
                           "local_end_index": torch.tensor([0], dtype=torch.long, device=device)}
                          for _ in range(pipe.num_transformer_blocks)]

    def init_cross(batch_size, dtype, device):
        pipe.crossattn_cache = [{"k": torch.zeros([batch_size, config["text_len"], heads, head_dim], dtype=dtype,
                                                  device=device),
                                 "v": torch.zeros([batch_size, config["text_len"], heads, head_dim], dtype=dtype,
                                                  device=device),
                                 "is_init": False}
                                for _ in range(pipe.num_transformer_blocks)]

    pipe._initialize_kv_cache = init_kv
    pipe._initialize_crossattn_cache = init_cross
    return pipe


def time_calls(wrapper):
    """Records the end of every model call (their WanDiffusionWrapper.forward)."""
    ends = []
    forward = wrapper.forward

    def timed(*a, **k):
        out = forward(*a, **k)
        ends.append(time.perf_counter())
        return out

    wrapper.forward = timed
    return ends


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--reference-dir", required=True, help="local copy of Self-Forcing (or LongLive)")
    p.add_argument("--model", required=True, help="safetensors of the weights in the original Wan names")
    p.add_argument("--config", required=True, help="JSON: CausalWanModel's constructor arguments")
    p.add_argument("--text", required=True)
    p.add_argument("--frames", type=int, required=True)
    p.add_argument("--height", type=int, required=True, help="latent rows")
    p.add_argument("--width", type=int, required=True, help="latent columns")
    p.add_argument("--chunk", type=int, default=3)
    p.add_argument("--kv-window", type=int, default=0, help="frames; 0: their global cache")
    p.add_argument("--sink", type=int, default=0)
    p.add_argument("--denoising-steps", default="1000,750,500,250")
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--save-latents", default="")
    a = p.parse_args(argv)
    a.denoising_steps = [int(s) for s in a.denoising_steps.split(",")]

    import torch
    from safetensors.torch import load_file, save_file

    if a.threads > 0:
        torch.set_num_threads(a.threads)
    t_load = time.perf_counter()
    fx = fixture_helpers()
    with contextlib.redirect_stdout(sys.stderr):
        mods = fx.load_repo(a.reference_dir, interactive=False)
    with open(a.config) as f:
        config = json.load(f)
    config["patch_size"] = tuple(config["patch_size"])
    text = load_file(a.text)["text"]
    pipe = build_pipeline(mods, fx, config, load_file(a.model), text, a)
    load_seconds = time.perf_counter() - t_load
    ends = time_calls(pipe.generator)

    rss_baseline = status_bytes("VmRSS")
    rss_peak_loading = status_bytes("VmHWM")
    hwm_reset = reset_peak_rss()
    c0 = cpu_seconds()
    start = time.perf_counter()
    # Their inference.py: the seed, then the whole clip's noise; the pipeline draws the re-noise after it.
    torch.manual_seed(a.seed)
    noise = torch.randn([1, a.frames, config["in_dim"], a.height, a.width])
    with torch.no_grad(), contextlib.redirect_stdout(sys.stderr):  # it prints every step's timestep
        _, latents = pipe.inference(noise, text_prompts=["prompt"], return_latents=True)
    gen_seconds = time.perf_counter() - start
    gen_cpu = cpu_seconds() - c0
    rss_peak = status_bytes("VmHWM")

    per_block = len(a.denoising_steps) + 1
    block_ends = [start] + ends[per_block - 1::per_block]
    next_seconds = [b - e for e, b in zip(block_ends, block_ends[1:])]
    latents = latents.permute(0, 2, 1, 3, 4).float().contiguous()  # [1, C, T, h, w], as latent-gen-bench saves
    if a.save_latents:
        save_file({"latents": latents}, a.save_latents)
    repo = os.path.basename(os.path.normpath(a.reference_dir))
    print(json.dumps({
        "impl": repo,
        "reference_dir": os.path.abspath(a.reference_dir),
        "schedule": "causal",
        "chunk_frames": a.chunk,
        "kv_window": a.kv_window,
        "sink_frames": a.sink,
        "denoising_steps": a.denoising_steps,
        "height": a.height,
        "width": a.width,
        "device": "cpu",
        "dtype": "float32",
        "threads": torch.get_num_threads(),
        "runtime": f"torch {torch.__version__}",
        "load_seconds": load_seconds,
        "latents": latents.shape[2],
        "model_calls": len(ends),
        "iterations": len(next_seconds),
        "next_seconds": next_seconds,
        "first_latent_seconds": next_seconds[0] if next_seconds else None,
        "text": a.text,
        "latents_file": a.save_latents,
        "generate_seconds": gen_seconds,
        "generate_cpu_seconds": gen_cpu,
        "latents_per_second": latents.shape[2] / gen_seconds,
        "rss_baseline_bytes": rss_baseline,
        "rss_peak_bytes": rss_peak,
        "rss_peak_loading_bytes": rss_peak_loading,
        "rss_peak_above_baseline_bytes": rss_peak - rss_baseline,
        "rss_peak_reset": hwm_reset,
    }))


if __name__ == "__main__":
    main()
