"""Attention kinds, one class each, registered in `ATTENTION` and chosen in one place (the block).

- `SoftmaxAttention`: causal softmax(Q K^T / sqrt(d_head)) V with rotary
  position embeddings on Q and K; separate q, k, v, o projections so Q and K
  can be frozen alone (the paper's frozen-Q/K variant).
- `MixingAttention`: MixiT (paper, Section 3): each head's output is A_h V_h
  for a fixed random causal matrix A_h, drawn once from a seed, stored as a
  buffer and never trained. It has no q or k; the model gives it learned
  absolute position embeddings instead.

- Three input-independent mixers, controls beside MixiT (docs/model.md,
  "Input-independent mixers"): each head's output is softmax(L_h) V_h for
  logits L_h that do not depend on the input, masked like softmax attention's
  scores. `RandFormerAttention`: L_h fixed, U(0, 1) entries (the random mixing
  of MetaFormer's RandFormer, Yu et al. 2022). `UniformAttention`: L_h = 0,
  every position averages the values it may read. `SynthesizerRandomAttention`:
  L_h a trained parameter (the Synthesizer's Random variant, Tay et al. 2020).
  `TransplantAttention`: the fixed pattern itself, a donor run's attention
  averaged over its task's data (docs/model.md, "Attention transplants").
  Unlike softmax and mixing, which the variants name, any variant takes them
  (`Attention.any_variant`).

All are causal by default; a config with ``causal=False`` (sequence
classification) makes them read the whole unpadded sequence: softmax and the
input-independent mixers mask padded keys, MixiT centres each row over the real tokens.

All pass their (B, H, T, T) pattern through ``self.hook_pattern``. Without a
hook attached they take the fast path: `scaled_dot_product_attention` for
softmax, one batched matmul against the pattern for the others.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from mixit.core.config import ModelConfig
from mixit.core.models.hooks import HookPoint
from mixit.core.models.layers import block_linear, fused_linear, trains_alike
from mixit.registry import Registry


class Attention(nn.Module):
    """The interface every attention kind implements (docs/extending.md).

    A kind is built as ``cls(cfg, layer)`` and called as ``attn(x, valid)``
    with x (B, T, d_model) and valid (B, T) bool or None (the unpadded
    positions, used only without causality); it returns (B, T, d_model) and
    sends its (B, H, T, T) pattern through ``self.hook_pattern`` whenever a
    hook is attached.
    """

    learned_positions: bool = False
    """True for a kind that cannot see positions itself: the model then adds learned absolute position embeddings."""
    coupled: ClassVar[dict[str, Any]] = {}
    """Model options this kind brings unless set (the reference switches them on together with the kind)."""
    any_variant: ClassVar[bool] = False
    """True for a kind any variant may take, its freeze rule applied as it is; False for a kind the variants name
    (softmax, mixing), which only a variant naming it, or one taking any kind (random), may take."""
    rotary: ClassVar[bool] = False
    """True for a kind that rotates its queries and keys by position (RoPE), which needs an even d_head."""
    has_qk: ClassVar[bool] = False
    """True for a kind whose pattern comes from its own query and key projections, ``q`` and ``k`` (what a qk
    transplant copies and an outside model's weights map onto); False for a kind with none."""
    classifies_causally: ClassVar[bool] = False
    """The default ``causal`` of a sequence classifier on this kind: as in the reference code, softmax attention
    reads causally (the Hugging Face Llama classifier) and the mixing kinds read the whole text."""
    hook_pattern: HookPoint

    @property
    def fixed_length(self) -> bool:
        """True if this layer reads every input right-padded to n_ctx (the model pads it)."""
        return False

    @property
    def fixed_pattern(self) -> torch.Tensor | None:
        """The (H, n_ctx, n_ctx) pattern if it does not depend on the input, else None."""
        return None

    def forward(self, x: torch.Tensor, valid: torch.Tensor | None = None) -> torch.Tensor:
        raise NotImplementedError(f"{type(self).__name__} must implement forward()")


ATTENTION: Registry[type[Attention]] = Registry("attention kind")
"""Name -> attention class; ``ModelConfig.attention`` picks one."""
ModelConfig.named["attention"] = ATTENTION


def mixit_noise(
    n_heads: int, n_ctx: int, d_head: int, generator: torch.Generator, depth_scaled: bool = False
) -> torch.Tensor:
    """The random part of one layer's MixiT matrices, (n_heads, n_ctx, n_ctx) float64, not yet masked or centred.

    docs/model.md, "MixiT attention", with T = n_ctx: W_h ~ N(0, sigma_h^2) entrywise, with
      sigma_h = 1/sqrt(T d_head) + u_h (1/sqrt(T) - 1/sqrt(T d_head)), u_h ~ U(0, 1),
    or, in the depth-scaled form, sigma_h = 1/sqrt(T) for every head.
    """
    T = n_ctx
    lo, hi = 1.0 / math.sqrt(T * d_head), 1.0 / math.sqrt(T)
    if depth_scaled:
        sigma = torch.full((n_heads,), hi, dtype=torch.float64)
    else:
        u = torch.rand(n_heads, generator=generator, dtype=torch.float64)
        sigma = lo + u * (hi - lo)  # (H,)
    w = torch.randn(n_heads, T, T, generator=generator, dtype=torch.float64)
    return w * sigma[:, None, None]


def set_sink(a: torch.Tensor, sink: str) -> torch.Tensor:
    """Make head 0 (dimension -3) the sink head: each token keeps half of itself and takes half of token 0.

    reference: 0.5 I, then column 0 set to 0.5, as the reference code does (an
    assignment, so A[0, 0] = 0.5 and row 0 sums to 0.5); normalised: 0.5 I +
    0.5 on column 0 (A[0, 0] = 1, every row sums to 1); off: unchanged.
    """
    if sink == "off":
        return a
    T = a.shape[-1]
    a[..., 0, :, :] = 0.5 * torch.eye(T, dtype=a.dtype, device=a.device)
    if sink == "reference":
        a[..., 0, :, 0] = 0.5
    else:
        a[..., 0, :, 0] += 0.5
    return a


def mixit_matrices(
    n_heads: int,
    n_ctx: int,
    d_head: int,
    generator: torch.Generator,
    alpha: float = 1.0,
    sink: str = "reference",
    depth_scaled: bool = False,
) -> torch.Tensor:
    """The causal MixiT mixing matrices of one layer, (n_heads, n_ctx, n_ctx).

    docs/model.md, "MixiT attention": W_h from `mixit_noise`, kept lower-triangular;
      Wbar_h[i] = sum_{j<=i} W_h[i, j] / (i + 1)          (centring over the causal support)
      A_h = tril(I + alpha (W_h - Wbar_h))                (depth-scaled: without I)
    so every row sums to exactly 1 (0 depth-scaled) and row 0 is [1, 0, ...].
    Head 0 then becomes the sink head (`set_sink`). Row i depends only on
    W[i, :i+1], so the top-left t x t block is exactly the matrix a length-t
    sequence should use. Built in float64, returned in float32.
    """
    T = n_ctx
    w = torch.tril(mixit_noise(n_heads, n_ctx, d_head, generator, depth_scaled))  # (H, T, T)
    support = torch.arange(1, T + 1, dtype=torch.float64)  # (T,) entries j <= i in row i
    w_bar = w.sum(dim=-1, keepdim=True) / support[:, None]  # (H, T, 1)
    identity = 0.0 if depth_scaled else torch.eye(T, dtype=torch.float64)
    a = torch.tril(identity + alpha * (w - w_bar))
    return set_sink(a, sink).float()


def bidirectional_mixing(
    noise: torch.Tensor,
    alpha: float = 1.0,
    sink: str = "reference",
    valid: torch.Tensor | None = None,
    centring: str = "real_tokens",
    depth_scaled: bool = False,
) -> torch.Tensor:
    """Non-causal MixiT matrices for the sequences at hand.

    noise (H, T, T): `mixit_noise` cut to the sequence length T.
    valid (B, T) bool: which positions hold real tokens (right padding); None: all of them.
    centring real_tokens: each row is centred over the real columns only and padded columns are zero,
      A[i, j] = I[i, j] + alpha (W[i, j] - mean_{k real} W[i, k])   for real j, else 0,
    so every row sums to exactly 1 and a padded sequence is mixed exactly as
    its unpadded copy. centring reference: as the reference code, which drops
    the triangular mask but still divides each row's sum by i + 1, over every
    column, padding included (`valid` is ignored; the model pads the input to
    n_ctx, as the reference's inputs always are):
      A[i, j] = I[i, j] + alpha (W[i, j] - sum_k W[i, k] / (i + 1)),
    whose rows do not sum to 1 (docs/model.md, "Non-causal use"). Depth-scaled: without I.
    Returns (H, T, T) without `valid` (or with reference centring), else (B, H, T, T).
    """
    T = noise.shape[-1]
    eye = 0.0 if depth_scaled else torch.eye(T, dtype=noise.dtype, device=noise.device)
    if centring == "reference":
        support = torch.arange(1, T + 1, dtype=noise.dtype, device=noise.device)  # (T,)
        a = eye + alpha * (noise - noise.sum(dim=-1, keepdim=True) / support[:, None])
    elif valid is None:
        a = eye + alpha * (noise - noise.mean(dim=-1, keepdim=True))
    else:
        cols = valid[:, None, None, :].to(noise.dtype)  # (B, 1, 1, T)
        w = noise * cols  # (B, H, T, T)
        centred = (w - w.sum(dim=-1, keepdim=True) / cols.sum(dim=-1, keepdim=True)) * cols
        a = eye + alpha * centred
    return set_sink(a, sink)


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


@ATTENTION.register("softmax")
class SoftmaxAttention(Attention):
    """Multi-head softmax attention with RoPE on Q and K, causal unless the
    config says otherwise (then padded keys are masked out)."""

    rotary = True
    has_qk = True
    classifies_causally = True
    rope_cos: torch.Tensor  # (n_ctx, d_head) buffer
    rope_sin: torch.Tensor  # (n_ctx, d_head) buffer

    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        self.n_heads, self.d_head, self.causal = cfg.n_heads, cfg.d_head, cfg.causal
        self.q = block_linear(cfg, cfg.d_model, cfg.d_model)
        self.k = block_linear(cfg, cfg.d_model, cfg.d_model)
        self.v = block_linear(cfg, cfg.d_model, cfg.d_model)
        self.o = block_linear(cfg, cfg.d_model, cfg.d_model)
        cos, sin = rope_tables(cfg.n_ctx, cfg.d_head, cfg.rope_base)
        # Derived from the config, so not saved with the model.
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.hook_pattern = HookPoint()

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

    def forward(self, x: torch.Tensor, valid: torch.Tensor | None = None) -> torch.Tensor:
        """x (B, T, d_model); valid (B, T) bool, the real (unpadded) positions,
        used only without causality (causally, right padding is never read)."""
        B, T, D = x.shape
        qk, v = self._project(x)
        cos, sin = self.rope_cos[:T, None, None], self.rope_sin[:T, None, None]  # (T, 1, 1, d_head)
        qk = apply_rope(qk, cos, sin)  # Q and K rotated together
        q, k, v = qk[:, :, 0].transpose(1, 2), qk[:, :, 1].transpose(1, 2), v.transpose(1, 2)  # (B, H, T, d_head)
        keys = None  # (B, 1, 1, T) or (T, T) bool: which keys each query may read
        if self.causal:
            keys = torch.ones(T, T, dtype=torch.bool, device=x.device).tril() if self.hook_pattern.active else None
        elif valid is not None:
            keys = valid[:, None, None, :]
        if self.hook_pattern.active:
            scores = q @ k.transpose(-1, -2) / math.sqrt(self.d_head)  # (B, H, T, T)
            if keys is not None:
                scores = scores.masked_fill(~keys, float("-inf"))
            y = self.hook_pattern(scores.softmax(dim=-1)) @ v
        else:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=keys, is_causal=self.causal)  # (B, H, T, d_head)
        return self.o(y.transpose(1, 2).reshape(B, T, D))


@ATTENTION.register("mixing")
class MixingAttention(Attention):
    """MixiT: y_h = A_h V_h with a fixed random A_h per head: causal
    (`mixit_matrices`, stored as ``mixing``) or, for a non-causal config,
    centred over each sequence's real tokens (`bidirectional_mixing`, built
    from the stored ``mixing_noise``)."""

    learned_positions = True
    # In the reference, shaped_attention="mixing" switches on the signal-propagation settings
    # together with the mixing matrices (docs/fidelity.md).
    coupled: ClassVar[dict[str, Any]] = ModelConfig.shaped()
    mixing: torch.Tensor  # (H, n_ctx, n_ctx) buffer of the causal form
    mixing_noise: torch.Tensor  # (H, n_ctx, n_ctx) buffer of the non-causal form

    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        self.n_heads, self.d_head, self.causal = cfg.n_heads, cfg.d_head, cfg.causal
        self.alpha, self.sink, self.centring = cfg.mixing_alpha, cfg.mixing_sink, cfg.mixing_centring
        self.depth_scaled = cfg.depth_alpha != 0
        self.v = block_linear(cfg, cfg.d_model, cfg.d_model)
        self.o = block_linear(cfg, cfg.d_model, cfg.d_model)
        generator = layer_generator(cfg.seed, layer)
        if cfg.causal:
            mixing = mixit_matrices(
                cfg.n_heads,
                cfg.n_ctx,
                cfg.d_head,
                generator,
                alpha=cfg.mixing_alpha,
                sink=cfg.mixing_sink,
                depth_scaled=self.depth_scaled,
            )
            self.register_buffer("mixing", mixing)  # (H, n_ctx, n_ctx), saved with the model
        else:
            noise = mixit_noise(cfg.n_heads, cfg.n_ctx, cfg.d_head, generator, self.depth_scaled).float()
            self.register_buffer("mixing_noise", noise)  # (H, n_ctx, n_ctx), saved with the model
        self.hook_pattern = HookPoint()

    @property
    def fixed_length(self) -> bool:
        return not self.causal and self.centring == "reference"

    @property
    def fixed_pattern(self) -> torch.Tensor:
        """The input-independent pattern (H, n_ctx, n_ctx): the MixiT matrices
        (non-causal: those of an unpadded full-length sequence)."""
        return self.mixing if self.causal else self._bidirectional(self.mixing_noise.shape[-1], None)

    def _bidirectional(self, T: int, valid: torch.Tensor | None) -> torch.Tensor:
        return bidirectional_mixing(
            self.mixing_noise[:, :T, :T], self.alpha, self.sink, valid, self.centring, self.depth_scaled
        )

    def forward(self, x: torch.Tensor, valid: torch.Tensor | None = None) -> torch.Tensor:
        """x (B, T, d_model); valid (B, T) bool, the real (unpadded) positions,
        used only without causality (causally, right padding is never read)."""
        B, T, D = x.shape
        v = self.v(x).view(B, T, self.n_heads, self.d_head).transpose(1, 2)  # (B, H, T, d_head)
        if self.causal:
            a = self.mixing[:, :T, :T]  # (H, T, T): exact for any T <= n_ctx (see mixit_matrices)
        else:
            a = self._bidirectional(T, valid)  # (H, T, T), or (B, H, T, T) with padding
        if self.hook_pattern.active:
            a = self.hook_pattern(a.expand(B, -1, -1, -1))  # (B, H, T, T)
        y = a @ v  # (B, H, T, d_head)
        return self.o(y.transpose(1, 2).reshape(B, T, D))


class InputIndependentAttention(Attention):
    """y_h = softmax(L_h) V_h with logits L_h (H, n_ctx, n_ctx) that do not depend on the input (`logits`),
    masked as softmax attention's scores are: causally, or, without causality, to the real tokens. Each row of
    the pattern sums to 1 over the positions it may read. It has v and o projections, as MixiT has, and no q or
    k: the model adds learned absolute position embeddings."""

    learned_positions = True
    any_variant = True

    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        self.n_heads, self.d_head, self.causal, self.n_ctx = cfg.n_heads, cfg.d_head, cfg.causal, cfg.n_ctx
        self.v = block_linear(cfg, cfg.d_model, cfg.d_model)
        self.o = block_linear(cfg, cfg.d_model, cfg.d_model)
        self.hook_pattern = HookPoint()

    def logits(self, T: int, like: torch.Tensor) -> torch.Tensor:
        """The (H, T, T) logits of a length-T sequence, on `like`'s device."""
        raise NotImplementedError(f"{type(self).__name__} must implement logits()")

    def pattern(self, T: int, valid: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor:
        """The mixing of a length-T sequence: (H, T, T), or (B, H, T, T) given `valid` (B, T) without causality.

        A row's softmax covers only the positions it may read, so the top-left t x t block of the causal
        pattern is exactly that of a length-t sequence, and a padded sequence is mixed as its unpadded copy."""
        logits = self.logits(T, like)  # (H, T, T)
        keys = None  # (T, T) or (B, 1, 1, T) bool: which positions each row may read
        if self.causal:
            keys = torch.ones(T, T, dtype=torch.bool, device=logits.device).tril()
        elif valid is not None:
            keys = valid[:, None, None, :]
        if keys is not None:
            logits = logits.masked_fill(~keys, float("-inf"))
        return logits.softmax(dim=-1)

    @property
    def fixed_pattern(self) -> torch.Tensor:
        """The (H, n_ctx, n_ctx) pattern of an unpadded full-length sequence."""
        return self.pattern(self.n_ctx, None, self.o.weight).detach()

    def forward(self, x: torch.Tensor, valid: torch.Tensor | None = None) -> torch.Tensor:
        """x (B, T, d_model); valid (B, T) bool, the real (unpadded) positions,
        used only without causality (causally, right padding is never read)."""
        B, T, D = x.shape
        v = self.v(x).view(B, T, self.n_heads, self.d_head).transpose(1, 2)  # (B, H, T, d_head)
        a = self.pattern(T, None if self.causal else valid, v)  # (H, T, T), or (B, H, T, T) with padding
        if self.hook_pattern.active:
            a = self.hook_pattern(a.expand(B, -1, -1, -1))  # (B, H, T, T)
        y = a @ v  # (B, H, T, d_head)
        return self.o(y.transpose(1, 2).reshape(B, T, D))


@ATTENTION.register("randformer")
class RandFormerAttention(InputIndependentAttention):
    """RandFormer's random mixing (MetaFormer baselines, Yu et al. 2022), per head and causal: the softmax of a
    fixed matrix with U(0, 1) entries, drawn once from the layer's seed (`layer_generator`, as MixiT's) and
    stored as the buffer ``mixing_logits``, never trained."""

    mixing_logits: torch.Tensor  # (H, n_ctx, n_ctx) buffer

    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__(cfg, layer)
        draw = torch.rand(cfg.n_heads, cfg.n_ctx, cfg.n_ctx, generator=layer_generator(cfg.seed, layer))
        self.register_buffer("mixing_logits", draw)  # (H, n_ctx, n_ctx), saved with the model

    def logits(self, T: int, like: torch.Tensor) -> torch.Tensor:
        return self.mixing_logits[:, :T, :T]


@ATTENTION.register("uniform")
class UniformAttention(InputIndependentAttention):
    """Uniform averaging: logits 0, so each position averages the values of every position it may read (causal:
    itself and the earlier ones, weight 1 / (i + 1)). No randomness, nothing stored, nothing trained."""

    def logits(self, T: int, like: torch.Tensor) -> torch.Tensor:
        return torch.zeros(self.n_heads, T, T, dtype=like.dtype, device=like.device)


@ATTENTION.register("synthesizer_random")
class SynthesizerRandomAttention(InputIndependentAttention):
    """The Synthesizer's Random variant (Tay et al. 2020), causal: per head, logits that are a trained parameter
    ``mixing_logits`` (H, n_ctx, n_ctx), the same for every input; initialised N(0, init_std^2) from the layer's
    seed (`layer_generator`). The entries above the diagonal are masked causally and so never receive a gradient."""

    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__(cfg, layer)
        draw = torch.randn(cfg.n_heads, cfg.n_ctx, cfg.n_ctx, generator=layer_generator(cfg.seed, layer))
        self.mixing_logits = nn.Parameter(draw * cfg.init_std)  # (H, n_ctx, n_ctx)

    def logits(self, T: int, like: torch.Tensor) -> torch.Tensor:
        return self.mixing_logits[:, :T, :T]


@ATTENTION.register("transplant")
class TransplantAttention(InputIndependentAttention):
    """A donor run's attention, averaged and frozen (docs/model.md, "Attention transplants"), causal: per head,
    the fixed pattern ``donor_pattern`` (H, n_ctx, n_ctx), a buffer that `mixit.core.transplant.install` fills with the
    donor's pattern averaged over its task's validation examples, saved with the model and never trained. Built
    alone it holds the uniform causal pattern (as `UniformAttention` mixes); rows beyond the donor's sequences
    keep it."""

    donor_pattern: torch.Tensor  # (H, n_ctx, n_ctx) buffer

    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__(cfg, layer)
        reads = torch.ones(cfg.n_ctx, cfg.n_ctx).tril()  # (T, T): row i reads positions 0..i
        uniform = (reads / reads.sum(dim=-1, keepdim=True)).expand(cfg.n_heads, -1, -1)
        self.register_buffer("donor_pattern", uniform.clone())  # (H, n_ctx, n_ctx), saved with the model

    def pattern(self, T: int, valid: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor:
        """The stored pattern's top-left T x T block, used as it is: each row of a causal average of causal
        patterns already sums to 1 over the positions it may read, and row i depends on no later position."""
        return self.donor_pattern[:, :T, :T]
