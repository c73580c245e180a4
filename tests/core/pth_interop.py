"""torch.save archives for tests/core/io/test_pth.cpp and seeds for the pth fuzzer (tools/fuzz pth).

usage: pth_interop.py write DIR     archives as torch.save writes them, each with NAME.expected.safetensors
                                    (every tensor's bytes, contiguous, as uint8) whose metadata "layout" gives
                                    dtype, shape, stride and which tensor it shares memory with
       pth_interop.py evil PATH MARKER   a checkpoint whose unpickling would run os.system("touch MARKER")
       pth_interop.py seeds DIR     fuzz corpus: the archives of `write`, damaged copies, bare data.pkl files
"""
import collections
import io
import json
import os
import sys
import zipfile

import torch
from safetensors.torch import save_file


def dtypes_dict():
    g = torch.Generator().manual_seed(0)
    base = torch.randn(3, 5, generator=g) * 100
    out = {}
    for dt in [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.complex64, torch.complex128,
               torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool, torch.uint16,
               torch.uint32, torch.uint64, torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e8m0fnu]:
        name = str(dt).removeprefix("torch.")
        if dt.is_complex:
            out[name] = torch.complex(base, -base).to(dt)
        elif dt in (torch.uint16, torch.uint32, torch.uint64):
            out[name] = base.abs().to(torch.int64).to(dt)
        elif dt == torch.float8_e8m0fnu:
            out[name] = base.abs().add(1).to(dt)
        else:
            out[name] = base.to(dt)
    return out


def views_dict():
    base = torch.arange(60, dtype=torch.float32).view(3, 4, 5)
    half = torch.arange(40, dtype=torch.float16)
    return {
        "base": base,
        "perm": base.permute(2, 0, 1),
        "slice": base[1:, 2:, ::2],
        "row": base[2],
        "col": base[:, 1],
        "scalar": base[1, 2, 3],
        "flat": base.view(-1)[7:20],
        "expand": torch.ones(1, 5).expand(4, 5),
        "half_tail": half[33:],
        "half_step": half[1::3],
        "own": torch.full((2, 2), 7.0),
    }


def small_model():
    torch.manual_seed(1)
    return torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.Linear(6, 2))


def archives():
    """name -> (object to torch.save, the dict of tensors the reader must find, save keyword arguments)"""
    sd = small_model().state_dict()
    opt_state = {"state": {0: {"momentum_buffer": torch.zeros(3)}}, "param_groups": [{"lr": 0.1, "params": [0]}]}
    empty = {"zero_rows": torch.zeros(0, 3), "past_end": torch.arange(5.0)[5:], "scalar": torch.tensor(2.5)}
    return {
        "dtypes": (dtypes_dict(), dtypes_dict(), {}),
        "views": (views_dict(), views_dict(), {}),
        "state_dict": (sd, sd, {}),
        "nested": ({"state_dict": sd, "epoch": 3, "optimizer": opt_state, "name": "run 7", "loss": 0.25,
                    "flags": [True, None, b"raw"], "step": 2**40}, sd, {}),
        "model_key": ({"model": sd, "step": 12}, sd, {}),
        "parameters": (small_model().state_dict(keep_vars=True), sd, {}),
        "protocol4": (sd, sd, {"pickle_protocol": 4}),
        "protocol5": (views_dict(), views_dict(), {"pickle_protocol": 5}),
        "empty": (empty, empty, {}),
    }


def expected_file(tensors, path):
    layout, data = {}, {}
    ptrs = {}
    for name, t in tensors.items():
        t = t.detach()
        layout[name] = {"dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape),
                        "stride": list(t.stride())}
        if t.numel() and t.untyped_storage().data_ptr() in ptrs:
            other = ptrs[t.untyped_storage().data_ptr()]
            layout[name]["shares"] = [other, t.data_ptr() - tensors[other].data_ptr()]
        elif t.numel():
            ptrs[t.untyped_storage().data_ptr()] = name
        flat = t.contiguous().reshape(-1).clone()
        data[name] = flat.view(torch.uint8) if flat.numel() else torch.zeros(0, dtype=torch.uint8)
    save_file(data, path, metadata={"layout": json.dumps(layout)})


def write(out):
    os.makedirs(out, exist_ok=True)
    for name, (obj, tensors, kwargs) in archives().items():
        torch.save(obj, os.path.join(out, name + ".pth"), **kwargs)
        expected_file(tensors, os.path.join(out, name + ".expected.safetensors"))


class Evil:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, ("touch '" + self.marker + "'",))


def evil(path, marker):
    torch.save({"weight": torch.ones(2), "payload": Evil(marker)}, path)


def rezip(data, edit):
    """The archive's entries through edit(name, bytes) -> bytes or None (dropped), stored again."""
    src = zipfile.ZipFile(io.BytesIO(data))
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as dst:
        for info in src.infolist():
            content = edit(info.filename, src.read(info.filename))
            if content is not None:
                dst.writestr(info.filename, content)
    return buf.getvalue()


def seeds(out):
    os.makedirs(out, exist_ok=True)
    n = 0

    def put(name, data):
        with open(os.path.join(out, name), "wb") as f:
            f.write(data)

    for name, (obj, _, kwargs) in archives().items():
        buf = io.BytesIO()
        torch.save(obj, buf, **kwargs)
        data = buf.getvalue()
        put(name + ".pth", data)
        pkl = next(zipfile.ZipFile(io.BytesIO(data)).read(i) for i in zipfile.ZipFile(io.BytesIO(data)).namelist()
                   if i.endswith("/data.pkl"))
        put(name + ".pkl", pkl)
        for cut in (len(data) // 3, len(data) - 30, len(data) - 1):
            put(f"{name}-cut{cut}.pth", data[:cut])
        put(name + "-flipped.pth", bytes(b ^ 0x20 if i % 97 == 13 else b for i, b in enumerate(data)))
        n += 1

    sd = {"w": torch.arange(6.0).view(2, 3), "b": torch.ones(3, dtype=torch.float16)}
    buf = io.BytesIO()
    torch.save(sd, buf)
    data = buf.getvalue()
    put("missing-record.pth", rezip(data, lambda n, c: None if n.endswith("/data/1") else c))
    put("short-record.pth", rezip(data, lambda n, c: c[:5] if n.endswith("/data/0") else c))
    put("big-endian.pth", rezip(data, lambda n, c: b"big" if n.endswith("/byteorder") else c))
    # numel 6 (BININT1 6 after the 'cpu' string) raised to 2**40 in the pickle
    put("absurd-numel.pth", rezip(data, lambda n, c: c.replace(b"cpuq\x07K\x06", b"cpuq\x07\x8a\x06" + (2**40).to_bytes(6, "little"))
                                  if n.endswith("/data.pkl") else c))
    put("os-system.pth", rezip(data, lambda n, c: c.replace(b"ccollections\nOrderedDict\n", b"cos\nsystem\n")
                               if n.endswith("/data.pkl") else c))
    compressed = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(data)) as src, zipfile.ZipFile(compressed, "w", zipfile.ZIP_DEFLATED) as dst:
        for info in src.infolist():
            dst.writestr(info.filename, src.read(info.filename))
    put("compressed.pth", compressed.getvalue())
    print(f"[fuzz] {n} archives and their damaged copies in {out}")


if __name__ == "__main__":
    mode = sys.argv[1]
    if mode == "write":
        write(sys.argv[2])
    elif mode == "evil":
        evil(sys.argv[2], sys.argv[3])
    elif mode == "seeds":
        seeds(sys.argv[2])
    else:
        sys.exit(__doc__)
