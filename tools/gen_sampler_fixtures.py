#!/usr/bin/env python3
"""Reference fixtures for the C++ samplers (core/src/gen/sampler.cpp): diffusers' schedulers run on a fixed
start sample with a made-up model, so the C++ port can be compared step by step.

Usage: .venv/bin/python tools/gen_sampler_fixtures.py OUTDIR     (CPU, fp32, seconds: mostly importing diffusers)

Writes OUTDIR/samplers.safetensors, then touches OUTDIR/stamp:
  start, clean, noise              fp32 [1, 4, 3, 6, 8], seeded
  <case>.sigmas     float64 [steps + 1]  the scheduler's sigmas (ddim: sqrt(1 - alpha_bar), then 0)
  <case>.timesteps  float64 [steps]      what the model is conditioned on
  <case>.trajectory fp32 [steps + 1 - start, ...]  the sample before each step from `start` on, then the result;
                    the model output at step i is sin(1.3 * x) + 0.001 * timestep_i
  <case>.noised     fp32  scale_noise / add_noise of `clean` with `noise` at step noised_step
  __metadata__ {"cases": JSON list of {name, kind, steps, shift, snr_shift_scale, prediction, start,
                noised_step}, "diffusers", "torch"}

A case with start > 0 begins from `start` at that step with no scheduler history (set_begin_index).
The epsilon DDIM case starts at step 1: with zero terminal SNR the first trailing timestep (999) has
alpha_bar = 0, where epsilon prediction cannot recover x0 (diffusers divides by 0 there).
"""
import json
import os
import sys

import torch

SEED_START = 1234
SEED_CLEAN = 99
SEED_NOISE = 100
SHAPE = (1, 4, 3, 6, 8)

CASES = [
    # name, kind, steps, shift, snr_shift_scale, prediction, start
    ("euler_s3_n10", "euler", 10, 3.0, 3.0, "flow", 0),
    ("euler_s5_n50", "euler", 50, 5.0, 3.0, "flow", 0),
    ("euler_s1_n7", "euler", 7, 1.0, 3.0, "flow", 0),
    ("unipc_s5_n50", "unipc", 50, 5.0, 3.0, "flow", 0),
    ("unipc_s3_n10", "unipc", 10, 3.0, 3.0, "flow", 0),
    ("unipc_s5_n1", "unipc", 1, 5.0, 3.0, "flow", 0),
    ("unipc_s5_n2", "unipc", 2, 5.0, 3.0, "flow", 0),
    ("unipc_s5_n3", "unipc", 3, 5.0, 3.0, "flow", 0),
    ("unipc_s5_n50_from20", "unipc", 50, 5.0, 3.0, "flow", 20),
    ("unipc_s5_n50_from48", "unipc", 50, 5.0, 3.0, "flow", 48),
    ("ddim_snr3_n50_v", "ddim", 50, 5.0, 3.0, "v", 0),
    ("ddim_snr1_n10_v", "ddim", 10, 5.0, 1.0, "v", 0),
    ("ddim_snr3_n30_v", "ddim", 30, 5.0, 3.0, "v", 0),
    ("ddim_snr3_n20_eps", "ddim", 20, 5.0, 3.0, "epsilon", 1),
]


def make_scheduler(kind, steps, shift, snr, prediction):
    from diffusers import CogVideoXDDIMScheduler, FlowMatchEulerDiscreteScheduler, UniPCMultistepScheduler

    if kind == "euler":
        s = FlowMatchEulerDiscreteScheduler(shift=shift)
    elif kind == "unipc":
        # Wan 2.1's diffusers scheduler_config.json, with this shift.
        s = UniPCMultistepScheduler(prediction_type="flow_prediction", use_flow_sigmas=True, flow_shift=shift,
                                    num_train_timesteps=1000, solver_order=2, solver_type="bh2", predict_x0=True,
                                    lower_order_final=True, final_sigmas_type="zero", timestep_spacing="linspace",
                                    beta_schedule="linear", beta_start=0.0001, beta_end=0.02)
    else:
        # CogVideoX's scheduler_config.json; eta is unused by this scheduler's step().
        s = CogVideoXDDIMScheduler(num_train_timesteps=1000, beta_schedule="scaled_linear", beta_start=0.00085,
                                   beta_end=0.012, clip_sample=False, set_alpha_to_one=True, steps_offset=0,
                                   prediction_type="v_prediction" if prediction == "v" else "epsilon",
                                   rescale_betas_zero_snr=True, timestep_spacing="trailing", snr_shift_scale=snr)
    s.set_timesteps(steps)
    return s


def model(x, t):
    return torch.sin(1.3 * x) + 0.001 * float(t)


def sigmas_of(kind, s):
    if kind == "ddim":
        ac = s.alphas_cumprod.to(torch.float64)
        return torch.cat([(1 - ac[s.timesteps]) ** 0.5, torch.zeros(1, dtype=torch.float64)])
    return s.sigmas.to(torch.float64)


def noised_of(kind, s, clean, noise, k):
    t = s.timesteps[k : k + 1]
    if kind == "euler":
        return s.scale_noise(clean, t, noise)
    return s.add_noise(clean, noise, t)


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    import diffusers
    from safetensors.torch import save_file

    torch.set_num_threads(1)
    start = torch.randn(SHAPE, generator=torch.Generator().manual_seed(SEED_START), dtype=torch.float32)
    clean = torch.randn(SHAPE, generator=torch.Generator().manual_seed(SEED_CLEAN), dtype=torch.float32)
    noise = torch.randn(SHAPE, generator=torch.Generator().manual_seed(SEED_NOISE), dtype=torch.float32)
    tensors = {"start": start, "clean": clean, "noise": noise}
    meta_cases = []
    for name, kind, steps, shift, snr, prediction, first in CASES:
        s = make_scheduler(kind, steps, shift, snr, prediction)
        assert len(s.timesteps) == steps, (name, len(s.timesteps))
        tensors[name + ".sigmas"] = sigmas_of(kind, s)
        tensors[name + ".timesteps"] = s.timesteps.to(torch.float64)
        k = steps // 2
        tensors[name + ".noised"] = noised_of(kind, s, clean, noise, k)

        s = make_scheduler(kind, steps, shift, snr, prediction)
        if first > 0 and kind != "ddim":
            s.set_begin_index(first)
        x = start.clone()
        traj = [x]
        for t in s.timesteps[first:]:
            x = s.step(model(x, t), t, x, return_dict=False)[0]
            traj.append(x)
        tensors[name + ".trajectory"] = torch.stack(traj)
        meta_cases.append({"name": name, "kind": kind, "steps": steps, "shift": shift, "snr_shift_scale": snr,
                           "prediction": prediction, "start": first, "noised_step": k})

    metadata = {"cases": json.dumps(meta_cases), "diffusers": diffusers.__version__, "torch": torch.__version__}
    path = os.path.join(out, "samplers.safetensors")
    save_file({k: v.contiguous() for k, v in tensors.items()}, path + ".tmp", metadata=metadata)
    os.replace(path + ".tmp", path)
    with open(os.path.join(out, "stamp"), "w"):
        pass


if __name__ == "__main__":
    main()
