"""A PyTorch Dataset over the latents latent-precompute wrote: one item per finished clip, loaded on demand.

    from latent_dataset import LatentDataset
    ds = LatentDataset("latents/")          # reads latents/index.jsonl
    item = ds[0]                            # {"latents": [T', C, H', W'] tensor, "caption": str, ...}
    loader = torch.utils.data.DataLoader(ds, batch_size=None, shuffle=True, num_workers=4)

The index is read once (one small JSON object per clip); each clip's safetensors file is opened only when its
item is asked for, so memory holds the clips in use, not the dataset. The latents are in the VAE's diffusion
space (what vaeencode emits and vaedecode takes), the layout latentfilesink writes: `latents` [T', C, H', W'] and
`timing` [T', 4] (pts, duration, first and end source frame of each latent).
"""
import json
import os

import torch
from safetensors import safe_open


class LatentDataset(torch.utils.data.Dataset):
    def __init__(self, out_dir, dtype=None):
        self.dir = out_dir
        self.dtype = dtype
        self.entries = []
        with open(os.path.join(out_dir, "index.jsonl"), encoding="utf-8") as f:
            for line in f:
                try:
                    self.entries.append(json.loads(line))
                except ValueError:
                    pass  # a line torn by a killed run; its clip is redone by the next run

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
