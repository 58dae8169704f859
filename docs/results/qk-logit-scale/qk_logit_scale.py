"""Standard deviation of the attention logits q.k / sqrt(d_head) of a freshly
initialised first layer (what frozen_qk keeps for ever), at several widths.

Usage: python docs/results/qk-logit-scale/qk_logit_scale.py   (seconds on a CPU)
"""

import math

import torch

from mixit.config import ModelConfig
from mixit.models import Transformer


def logit_std(
    d_model: int, n_heads: int, n_ctx: int = 128, vocab_size: int = 4096, batch: int = 8, qk_init: str = "reference"
) -> float:
    model = Transformer(
        ModelConfig(vocab_size=vocab_size, n_ctx=n_ctx, d_model=d_model, n_heads=n_heads, n_layers=1, qk_init=qk_init)
    ).eval()
    tokens = torch.randint(0, vocab_size, (batch, n_ctx), generator=torch.Generator().manual_seed(0))
    attn, d_head = model.blocks[0].attn, d_model // n_heads
    with torch.no_grad():
        h = model.blocks[0].norm1(model.embed(tokens))
        q = attn.q(h).view(batch, n_ctx, n_heads, d_head).transpose(1, 2)
        k = attn.k(h).view(batch, n_ctx, n_heads, d_head).transpose(1, 2)
        return (q @ k.transpose(-1, -2) / math.sqrt(d_head)).std().item()


if __name__ == "__main__":
    print("d_model  n_heads  logit std at init: qk_init=reference (N(0, 0.02^2))  qk_init=paper (N(0, 1/d_model))")
    for d_model, n_heads in ((64, 4), (128, 4), (256, 4), (512, 8), (1024, 16)):
        ref, paper = logit_std(d_model, n_heads), logit_std(d_model, n_heads, qk_init="paper")
        print(f"{d_model:>7}  {n_heads:>7}  {ref:.3f}  {paper:.3f}")
