"""A PyTorch Dataset over the latents latent-precompute wrote: one item per finished clip, loaded on demand.

    from latent_dataset import LatentDataset
    ds = LatentDataset("latents/")          # reads latents/index-rank*.jsonl
    item = ds[0]                            # {"latents": [T', C, H', W'] tensor, "caption": str, ...}
    loader = torch.utils.data.DataLoader(ds, batch_size=None, shuffle=True, num_workers=4)

Each rank of a run appends to its own index (index-rank0.jsonl, index-rank1.jsonl, ...; folders written by
earlier versions have one index.jsonl): all of them are read once, in rank order, one small JSON object per clip.
A file listed twice (a row repeated on two ranks encodes to the same name) is one item. Each clip's safetensors
file is opened only when its item is asked for, so memory holds the clips in use, not the dataset. The latents
are in the VAE's diffusion space (what vaeencode emits and vaedecode takes), the layout latentfilesink writes:
`latents` [T', C, H', W'] and `timing` [T', 4] (pts, duration, first and end source frame of each latent).
"""
import json
import os
import re

import torch
from safetensors import safe_open


def index_files(out_dir):
    """The index files of an output folder: index.jsonl (older versions), then index-rankR.jsonl by rank."""
    ranks = []
    for name in os.listdir(out_dir):
        m = re.fullmatch(r"index-rank(\d+)\.jsonl", name)
        if m:
            ranks.append((int(m.group(1)), name))
    legacy = ["index.jsonl"] if os.path.exists(os.path.join(out_dir, "index.jsonl")) else []
    names = legacy + [n for _, n in sorted(ranks)]
    if not names:
        raise FileNotFoundError(f"{out_dir}: no index-rank*.jsonl (or index.jsonl): not a latent-precompute folder")
    return [os.path.join(out_dir, n) for n in names]


def read_index(out_dir):
    """Every finished clip's entry, each latent file once."""
    entries, seen = [], set()
    for path in index_files(out_dir):
        with open(path, encoding="utf-8") as f:
            for line in f:
                try:
                    e = json.loads(line)
                except ValueError:
                    continue  # a line torn by a killed run; its clip is redone by the next run
                if e["latent_file"] not in seen:
                    seen.add(e["latent_file"])
                    entries.append(e)
    return entries


class LatentDataset(torch.utils.data.Dataset):
    def __init__(self, out_dir, dtype=None):
        self.dir = out_dir
        self.dtype = dtype
        self.entries = read_index(out_dir)

    def __len__(self):
        return len(self.entries)

    def __getitem__(self, i):
        e = self.entries[i]
        with safe_open(os.path.join(self.dir, e["latent_file"]), "pt") as f:
            latents = f.get_tensor("latents")
            timing = f.get_tensor("timing")
            metadata = f.metadata()
        if self.dtype is not None:
            latents = latents.to(self.dtype)
        return {"latents": latents, "timing": timing, "caption": e.get("caption", ""), "path": e["path"],
                "frames": e["frames"], "model": metadata.get("latent.model", ""), "metadata": metadata}
