#!/usr/bin/env python3
"""Computes the prompt embeddings a Wan 2.1 denoiser package takes, with the model's own text encoder (UMT5-XXL).

Usage: python tools/encode_prompt.py PIPELINE_DIR OUT.safetensors --prompt TEXT [--negative-prompt TEXT]
                                     [--max-tokens 512] [--device cpu|cuda]

PIPELINE_DIR is a diffusers Wan pipeline folder with tokenizer/ and text_encoder/ (e.g.
Wan-AI/Wan2.1-T2V-1.3B-Diffusers). Needs `pip install transformers sentencepiece` (not part of gst-latent's
requirements: the encoder runs once per prompt, outside the pipeline). Writes prompt_embeds [1, L, D] and, with
--negative-prompt (the model card's recommended negative prompt, or "" for an empty one),
negative_prompt_embeds, both float32, as videogen and load_denoiser's users expect them (docs/generation.md).

The embeddings are computed as diffusers' WanPipeline does: tokens padded to L, the encoder's last hidden state,
positions past each prompt's length set to zero.
"""
import argparse
import html
import os
import re
import sys

import torch


def clean(text):
    try:
        import ftfy

        text = ftfy.fix_text(text)
    except ImportError:
        pass
    text = html.unescape(html.unescape(text))
    return re.sub(r"\s+", " ", text).strip()


def encode(tokenizer, encoder, prompt, max_tokens, device):
    tokens = tokenizer([clean(prompt)], padding="max_length", max_length=max_tokens, truncation=True,
                       add_special_tokens=True, return_attention_mask=True, return_tensors="pt")
    mask = tokens.attention_mask.to(device)
    with torch.no_grad():
        hidden = encoder(tokens.input_ids.to(device), mask).last_hidden_state.float()
    length = int(mask.sum())
    hidden[:, length:] = 0
    return hidden.cpu().contiguous()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("pipeline_dir")
    p.add_argument("out")
    p.add_argument("--prompt", required=True)
    p.add_argument("--negative-prompt")
    p.add_argument("--max-tokens", type=int, default=512)
    p.add_argument("--device", default="cpu")
    args = p.parse_args()
    try:
        from transformers import AutoTokenizer, UMT5EncoderModel
    except ImportError:
        sys.exit("needs transformers and sentencepiece: pip install transformers sentencepiece")
    from safetensors.torch import save_file

    tokenizer = AutoTokenizer.from_pretrained(os.path.join(args.pipeline_dir, "tokenizer"))
    encoder = UMT5EncoderModel.from_pretrained(os.path.join(args.pipeline_dir, "text_encoder")).to(args.device).eval()
    tensors = {"prompt_embeds": encode(tokenizer, encoder, args.prompt, args.max_tokens, args.device)}
    metadata = {"prompt": args.prompt}
    if args.negative_prompt is not None:
        tensors["negative_prompt_embeds"] = encode(tokenizer, encoder, args.negative_prompt, args.max_tokens,
                                                   args.device)
        metadata["negative_prompt"] = args.negative_prompt
    save_file(tensors, args.out + ".tmp", metadata=metadata)
    os.replace(args.out + ".tmp", args.out)
    print(f"wrote {args.out}: " + ", ".join(f"{k} {list(v.shape)}" for k, v in tensors.items()))


if __name__ == "__main__":
    main()
