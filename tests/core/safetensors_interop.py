"""Writes or checks a safetensors file with the reference implementation (the `safetensors` package).

The same tensors are spelled out in test_safetensors.cpp; the C++ reader must read what this writes, and the
C++ writer must write what this reads.
"""
import sys

import torch
from safetensors import safe_open
from safetensors.torch import save_file


def expected():
    return {
        "f32": torch.arange(24, dtype=torch.float32).reshape(2, 3, 4),
        "f16": (torch.arange(6, dtype=torch.float32) / 4).to(torch.float16),
        "bf16": (torch.arange(10, dtype=torch.float32) * 0.5).to(torch.bfloat16),
        "i64": torch.arange(-5, 5, dtype=torch.int64),
        "u8": torch.arange(256, dtype=torch.int32).to(torch.uint8),
        "bool": torch.tensor([True, False, True]),
        "f8": torch.tensor([0.5, 1.0, 2.0]).to(torch.float8_e4m3fn),
    }


def main(mode, path):
    want = expected()
    if mode == "write":
        save_file(want, path, metadata={"origin": "python-safetensors"})
        return 0
    with safe_open(path, framework="pt") as f:
        if f.metadata() != {"origin": "gst-latent"}:
            print("metadata differs:", f.metadata())
            return 1
        names = set(f.keys())
        if names != set(want):
            print("names differ:", sorted(names))
            return 1
        for name, t in want.items():
            got = f.get_tensor(name)
            if got.dtype != t.dtype or got.shape != t.shape or not torch.equal(got.view(torch.uint8), t.view(torch.uint8)):
                print("tensor differs:", name, got)
                return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
