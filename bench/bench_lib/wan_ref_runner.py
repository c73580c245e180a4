"""The diffusers side of tools/bench --generate --native: one fresh process per measurement, printing the keys
latent-gen-bench prints (one JSON line) so the two can be tabulated together.

  python bench/bench_lib/wan_ref_runner.py --pipeline DIR --text FILE --latents N --height h --width w
                                           --steps K --guidance G [--threads T] [--seed S] [--save-latents FILE]

It runs what a diffusers user writes for a Wan 2.1 text-to-video clip without the text encoder and the VAE:
WanPipeline(transformer, scheduler from DIR) called with prompt_embeds=, negative_prompt_embeds= (from FILE),
latents= (torch.randn of a CPU generator seeded S: the noise latent-gen-bench's Generator draws from the same
seed) and output_type="latent", eager, float32, on the CPU. Forward hooks on the transformer time each model call;
a step is its calls (cond, then uncond under guidance). A folder whose model_index.json sets expand_timesteps (Wan
2.2 TI2V) gets a pipeline with it set, as WanPipeline.from_pretrained would make: its timesteps are per token
([B, seq]); the shape of the first call's timestep is reported. The video size passed is the latents' times the
folder's VAE factor (vae/config.json's scale_factor_spatial; 8 without one).
"""
import argparse
import json
import os
import resource
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from ref_runner import reset_peak_rss, status_bytes  # noqa: E402


def read_json(path):
    if not os.path.exists(path):
        return {}
    with open(path) as f:
        return json.load(f)


def cpu_seconds():
    u = resource.getrusage(resource.RUSAGE_SELF)
    return u.ru_utime + u.ru_stime


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pipeline", required=True)
    p.add_argument("--text", required=True)
    p.add_argument("--latents", type=int, required=True)
    p.add_argument("--height", type=int, required=True, help="latent rows")
    p.add_argument("--width", type=int, required=True, help="latent columns")
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--guidance", type=float, required=True)
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--save-latents", default="")
    a = p.parse_args(argv)

    import torch
    from diffusers import UniPCMultistepScheduler, WanPipeline, WanTransformer3DModel
    from safetensors.torch import load_file, save_file

    if a.threads > 0:
        torch.set_num_threads(a.threads)
    t_load = time.perf_counter()
    # from_pretrained wants accelerate for this class; the config and the weights file are what it would read.
    folder = os.path.join(a.pipeline, "transformer")
    transformer = WanTransformer3DModel.from_config(WanTransformer3DModel.load_config(folder)).eval()
    transformer.load_state_dict(load_file(os.path.join(folder, "diffusion_pytorch_model.safetensors")), strict=True)
    scheduler = UniPCMultistepScheduler.from_pretrained(os.path.join(a.pipeline, "scheduler"))
    index = read_json(os.path.join(a.pipeline, "model_index.json"))
    spatial = read_json(os.path.join(a.pipeline, "vae", "config.json")).get("scale_factor_spatial", 8)
    pipe = WanPipeline(tokenizer=None, text_encoder=None, transformer=transformer, vae=None, scheduler=scheduler,
                       expand_timesteps=bool(index.get("expand_timesteps")))
    pipe.set_progress_bar_config(disable=True)
    text = load_file(a.text)
    load_seconds = time.perf_counter() - t_load
    channels = transformer.config.in_channels
    noise = torch.randn(1, channels, a.latents, a.height, a.width, generator=torch.Generator().manual_seed(a.seed))

    calls = []
    started = []
    timestep_shapes = []

    def before_call(module, args, kwargs):
        timestep = kwargs.get("timestep", args[1] if len(args) > 1 else None)
        timestep_shapes.append(list(timestep.shape) if timestep is not None else None)
        started.append(time.perf_counter())

    transformer.register_forward_pre_hook(before_call, with_kwargs=True)
    transformer.register_forward_hook(lambda *_: calls.append(time.perf_counter() - started[-1]))

    rss_baseline = status_bytes("VmRSS")
    rss_peak_loading = status_bytes("VmHWM")
    hwm_reset = reset_peak_rss()
    c0 = cpu_seconds()
    start = time.perf_counter()
    latents = pipe(prompt_embeds=text["text"], negative_prompt_embeds=text.get("negative_text"),
                   height=spatial * a.height, width=spatial * a.width, num_frames=1 + 4 * (a.latents - 1),
                   num_inference_steps=a.steps, guidance_scale=a.guidance, latents=noise,
                   output_type="latent", return_dict=False)[0]
    gen_seconds = time.perf_counter() - start
    gen_cpu = cpu_seconds() - c0
    rss_peak = status_bytes("VmHWM")
    if a.save_latents:
        save_file({"latents": latents.float().contiguous()}, a.save_latents)
    per = len(calls) // a.steps if a.steps and len(calls) % a.steps == 0 else 0
    steps = [sum(calls[i:i + per]) for i in range(0, len(calls), per)] if per else []
    print(json.dumps({
        "impl": "diffusers",
        "generator": a.pipeline,
        "schedule": "clip",
        "sampler": "unipc",
        "steps": a.steps,
        "guidance": a.guidance,
        "height": a.height,
        "width": a.width,
        "device": "cpu",
        "dtype": "float32",
        "threads": torch.get_num_threads(),
        "runtime": f"torch {torch.__version__}",
        "load_seconds": load_seconds,
        "latents": latents.shape[2],
        "model_calls": len(calls),
        "timestep_shape": timestep_shapes[0] if timestep_shapes else None,
        "expand_timesteps": bool(pipe.config.expand_timesteps),
        "text": a.text,
        "latents_file": a.save_latents,
        "generate_seconds": gen_seconds,
        "generate_cpu_seconds": gen_cpu,
        "model_call_seconds": calls,
        "step_seconds": steps,
        "latents_per_second": latents.shape[2] / gen_seconds,
        "rss_baseline_bytes": rss_baseline,
        "rss_peak_bytes": rss_peak,
        "rss_peak_loading_bytes": rss_peak_loading,
        "rss_peak_above_baseline_bytes": rss_peak - rss_baseline,
        "rss_peak_reset": hwm_reset,
    }))


if __name__ == "__main__":
    main()
