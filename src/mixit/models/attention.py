"""Attention kinds, one class each, chosen in one place through `ATTENTION`.

- `SoftmaxAttention`: causal softmax(Q K^T / sqrt(d_head)) V with rotary
  position embeddings on Q and K; separate q, k, v, o projections so Q and K
  can be frozen alone (the paper's frozen-Q/K variant).
- `MixingAttention`: MixiT (paper, Section 3): each head's output is A_h V_h
  for a fixed random causal matrix A_h, drawn once from a seed, stored as a
  buffer and never trained. It has no q or k; the model gives it learned
  absolute position embeddings instead.

Both pass their (B, H, T, T) pattern through ``self.hook_pattern``. Without a
hook attached they take the fast path: `scaled_dot_product_attention` for
softmax, one batched matmul against the stored buffer for mixing.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from mixit.config import ModelConfig
from mixit.models.hooks import HookPoint
from mixit.models.layers import block_linear, fused_linear, trains_alike


def mixit_matrices(n_heads: int, n_ctx: int, d_head: int, generator: torch.Generator,
                   alpha: float = 1.0, sink: bool = True) -> torch.Tensor:
    """The MixiT mixing matrices of one layer, (n_heads, n_ctx, n_ctx).

    MODEL.md, "MixiT attention", with T = n_ctx:
      sigma_h = 1/sqrt(T d_head) + u_h (1/sqrt(T) - 1/sqrt(T d_head)), u_h ~ U(0, 1)
      W_h ~ N(0, sigma_h^2) entrywise, lower-triangular
      Wbar_h[i] = sum_{j<=i} W_h[i, j] / (i + 1)          (centring over the causal support)
      A_h = tril(I + alpha (W_h - Wbar_h))
    so every row sums to exactly 1 and row 0 is [1, 0, ...]. With `sink`,
    head 0 becomes 0.5 I + 0.5 e_0^T: each token keeps half of itself and
    half of token 0 (the reference code's undocumented "sink head").
    Row i depends only on W[i, :i+1], so the top-left t x t block is exactly
    the matrix a length-t sequence should use. Built in float64, returned in
    float32.
    """
    T = n_ctx
    lo, hi = 1.0 / math.sqrt(T * d_head), 1.0 / math.sqrt(T)
    u = torch.rand(n_heads, generator=generator, dtype=torch.float64)
    sigma = lo + u * (hi - lo)  # (H,)
    w = torch.randn(n_heads, T, T, generator=generator, dtype=torch.float64)
    w = torch.tril(w * sigma[:, None, None])  # (H, T, T)
    support = torch.arange(1, T + 1, dtype=torch.float64)  # (T,) entries j <= i in row i
    w_bar = w.sum(dim=-1, keepdim=True) / support[:, None]  # (H, T, 1)
    a = torch.tril(torch.eye(T, dtype=torch.float64) + alpha * (w - w_bar))
    if sink:
        a[0] = 0.5 * torch.eye(T, dtype=torch.float64)
        a[0, :, 0] += 0.5
    return a.float()


def layer_generator(seed: int, layer: int) -> torch.Generator:
    """A generator for layer `layer`'s fixed random tensors, independent of other layers."""
    state = np.random.SeedSequence([seed, 0x6D697869, layer]).generate_state(1, dtype=np.uint64)[0]
    return torch.Generator().manual_seed(int(state) & ((1 << 63) - 1))


def rope_tables(n_ctx: int, d_head: int, base: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin tables (n_ctx, d_head) for rotate-half RoPE."""
    inv_freq = 1.0 / base ** (torch.arange(0, d_head, 2, dtype=torch.float64) / d_head)  # (d_head/2,)
    angles = torch.outer(torch.arange(n_ctx, dtype=torch.float64), inv_freq)  # (T, d_head/2)
    angles = torch.cat([angles, angles], dim=-1)  # (T, d_head)
    return angles.cos().float(), angles.sin().float()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate the last dimension of x by position; cos and sin (built by
    `rope_tables`, sliced to the sequence) broadcast against x."""
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


class SoftmaxAttention(nn.Module):
    """Causal multi-head softmax attention with RoPE on Q and K."""

    learned_positions = False
    fixed_pattern = None  # the pattern depends on the input

    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        self.n_heads, self.d_head = cfg.n_heads, cfg.d_head
        self.q = block_linear(cfg, cfg.d_model, cfg.d_model)
        self.k = block_linear(cfg, cfg.d_model, cfg.d_model)
        self.v = block_linear(cfg, cfg.d_model, cfg.d_model)
        self.o = block_linear(cfg, cfg.d_model, cfg.d_model)
        cos, sin = rope_tables(cfg.n_ctx, cfg.d_head, cfg.rope_base)
        # Derived from the config, so not saved with the model.
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.hook_pattern = HookPoint()

    def matmul_flops(self, batch: int, seq: int) -> int:
        """FLOPs of one training step's products between activations (the
        projections are counted as linear layers): Q K^T and A V over the
        T(T+1)/2 causal pairs, 2 products forward and 4 backward."""
        return 12 * batch * (seq * (seq + 1) // 2) * self.n_heads * self.d_head

    def _project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x (B, T, d_model) -> qk (B, T, 2, H, d_head) and v (B, T, H, d_head).

        Projections that train alike share one matrix product (`fused_linear`):
        all three normally, Q and K apart from V under frozen_qk.
        """
        B, T, _ = x.shape
        heads = (B, T, self.n_heads, self.d_head)
        if trains_alike(self.q, self.k, self.v):
            qkv = fused_linear(x, (self.q, self.k, self.v)).view(B, T, 3, *heads[2:])
            return qkv[:, :, :2], qkv[:, :, 2]
        if trains_alike(self.q, self.k):
            qk = fused_linear(x, (self.q, self.k)).view(B, T, 2, *heads[2:])
        else:
            qk = torch.stack([self.q(x).view(heads), self.k(x).view(heads)], dim=2)
        return qk, self.v(x).view(heads)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, T, d_model)
        B, T, D = x.shape
        qk, v = self._project(x)
        cos, sin = self.rope_cos[:T, None, None], self.rope_sin[:T, None, None]  # (T, 1, 1, d_head)
        qk = apply_rope(qk, cos, sin)  # Q and K rotated together
        q, k, v = qk[:, :, 0].transpose(1, 2), qk[:, :, 1].transpose(1, 2), v.transpose(1, 2)  # (B, H, T, d_head)
        if self.hook_pattern.active:
            scores = q @ k.transpose(-1, -2) / math.sqrt(self.d_head)  # (B, H, T, T)
            causal = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
            pattern = self.hook_pattern(scores.masked_fill(~causal, float("-inf")).softmax(dim=-1))
            y = pattern @ v
        else:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, H, T, d_head)
        return self.o(y.transpose(1, 2).reshape(B, T, D))


class MixingAttention(nn.Module):
    """MixiT: y_h = A_h V_h with a fixed random causal A_h per head (`mixit_matrices`)."""

    learned_positions = True

    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        self.n_heads, self.d_head = cfg.n_heads, cfg.d_head
        self.v = block_linear(cfg, cfg.d_model, cfg.d_model)
        self.o = block_linear(cfg, cfg.d_model, cfg.d_model)
        mixing = mixit_matrices(cfg.n_heads, cfg.n_ctx, cfg.d_head, layer_generator(cfg.seed, layer),
                                alpha=cfg.mixing_alpha, sink=cfg.mixing_sink)
        self.register_buffer("mixing", mixing)  # (H, n_ctx, n_ctx), saved with the model
        self.hook_pattern = HookPoint()

    def matmul_flops(self, batch: int, seq: int) -> int:
        """FLOPs of one training step's A V over the T(T+1)/2 causal pairs:
        forward, and the gradient for V only (A is fixed)."""
        return 4 * batch * (seq * (seq + 1) // 2) * self.n_heads * self.d_head

    @property
    def fixed_pattern(self) -> torch.Tensor:
        """The input-independent pattern (H, n_ctx, n_ctx): the MixiT matrices."""
        return self.mixing

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, T, d_model)
        B, T, D = x.shape
        v = self.v(x).view(B, T, self.n_heads, self.d_head).transpose(1, 2)  # (B, H, T, d_head)
        a = self.mixing[:, :T, :T]  # (H, T, T): exact for any T <= n_ctx (see mixit_matrices)
        if self.hook_pattern.active:
            a = self.hook_pattern(a.expand(B, -1, -1, -1))  # (B, H, T, T)
        y = a @ v  # (B, H, T, d_head)
        return self.o(y.transpose(1, 2).reshape(B, T, D))


ATTENTION: dict[str, type[nn.Module]] = {"softmax": SoftmaxAttention, "mixing": MixingAttention}
