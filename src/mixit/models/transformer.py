"""The decoder of docs/model.md: pre-norm blocks, gated MLP, untied head.

    h = skip_scale * h + branch_scale * attn(norm1(h))
    h = skip_scale * h + branch_scale * mlp(norm2(h))
    logits = lm_head(norm_f(h))

The attention kind comes from `ATTENTION.get(cfg.attention)`, the one place it
is chosen; a kind without Q and K (MixiT) declares ``learned_positions`` and
the model adds learned absolute position embeddings for it. What is trained
is decided afterwards, by `mixit.freezing.apply_variant`, never inside the
model.
"""

from __future__ import annotations

import math
import typing

import torch
from torch import nn

from mixit.config import ModelConfig
from mixit.models.attention import ATTENTION, Attention
from mixit.models.layers import Linear
from mixit.models.mlp import GatedMLP


class Block(nn.Module):
    """One pre-norm block: attention, then the MLP, each on a scaled residual."""

    attn: Attention

    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        self.norm1 = nn.RMSNorm(cfg.d_model, eps=1e-6)
        self.attn = ATTENTION.get(cfg.attention)(cfg, layer)
        self.norm2 = nn.RMSNorm(cfg.d_model, eps=1e-6)
        self.mlp = GatedMLP(cfg)
        self.skip_scale, self.branch_scale = cfg.skip_scale, cfg.branch_scale

    def forward(self, h: torch.Tensor, valid: torch.Tensor | None = None) -> torch.Tensor:
        """h (B, T, d_model); valid (B, T) bool: the unpadded positions (non-causal attention only)."""
        if self.skip_scale == 1.0 and self.branch_scale == 1.0:  # the usual case: no full-size multiplies by 1
            h = h + self.attn(self.norm1(h), valid)
            return h + self.mlp(self.norm2(h))
        h = self.skip_scale * h + self.branch_scale * self.attn(self.norm1(h), valid)
        return self.skip_scale * h + self.branch_scale * self.mlp(self.norm2(h))


class Transformer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        # torch's layers draw a throw-away initialisation from the global generator;
        # building inside a fork leaves the caller's random state untouched.
        with torch.random.fork_rng(devices=[]):
            self._build(cfg)
        self.reset_parameters()

    def _build(self, cfg: ModelConfig) -> None:
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        learned_positions = ATTENTION.get(cfg.attention).learned_positions
        self.pos_embed = nn.Embedding(cfg.n_ctx, cfg.d_model) if learned_positions else None
        self.blocks = nn.ModuleList(Block(cfg, layer) for layer in range(cfg.n_layers))
        self.norm_f = nn.RMSNorm(cfg.d_model, eps=1e-6)
        if cfg.head == "lm":
            self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        else:
            self.classifier = nn.Linear(cfg.d_model, cfg.n_classes, bias=False)

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """Initialise from cfg.seed: N(0, init_std^2) weights and embeddings, zero
        biases, unit norm gains. Under width scaling the block linears get std
        1/sqrt(base_width) instead (see ModelConfig). Buffers are left alone:
        they are built from their own seeds at construction.
        """
        cfg = self.cfg
        g = torch.Generator().manual_seed(cfg.seed)
        for module in self.modules():
            if isinstance(module, nn.RMSNorm):
                module.weight.fill_(1.0)
            elif isinstance(module, Linear):
                std = 1.0 / math.sqrt(cfg.base_width) if cfg.width_scaling else cfg.init_std
                module.weight.copy_(torch.randn(module.weight.shape, generator=g) * std)
                if module.bias is not None:
                    module.bias.zero_()
            elif isinstance(module, (nn.Linear, nn.Embedding)):
                module.weight.copy_(torch.randn(module.weight.shape, generator=g) * cfg.init_std)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens (B, T) int64 with T <= n_ctx -> logits (B, T, vocab_size),
        or (B, n_classes) with the classifier head.

        Inputs are right-padded with cfg.pad_id, if any. Causal attention never
        lets a real position read a pad (pads come after it); non-causal
        attention masks them out, and pooling skips them, so a padded and an
        unpadded copy of an input get the same classification.
        """
        cfg = self.cfg
        T = tokens.shape[1]  # tokens (B, T)
        if T > cfg.n_ctx:
            raise ValueError(f"sequence length {T} exceeds the model's n_ctx={cfg.n_ctx}")
        valid = None  # (B, T) bool: real tokens; needed only where padding could be read
        if cfg.pad_id is not None and (cfg.head == "classifier" or not cfg.causal):
            valid = tokens != cfg.pad_id
        h = self.embed(tokens)  # (B, T, d_model)
        if self.pos_embed is not None:
            h = h + self.pos_embed.weight[:T]
        for block in self.blocks:
            h = block(h, valid)
        h = self.norm_f(h)
        if cfg.head == "lm":
            return self.lm_head(h)  # (B, T, vocab_size)
        return self.classifier(self.pool(h, valid))  # (B, n_classes)

    def pool(self, h: torch.Tensor, valid: torch.Tensor | None) -> torch.Tensor:
        """(B, T, d_model) -> (B, d_model): the last real token, or the mean over real tokens (cfg.pooling).
        Padding is on the right, so the last real token sits at length - 1."""
        if valid is None:
            return h[:, -1] if self.cfg.pooling == "last" else h.mean(dim=1)
        lengths = valid.sum(dim=1).clamp(min=1)  # (B,)
        if self.cfg.pooling == "last":
            return h[torch.arange(h.shape[0], device=h.device), lengths - 1]
        return (h * valid[..., None]).sum(dim=1) / lengths[:, None]

    @property
    def layers(self) -> list[Block]:
        """The blocks, in order (``self.blocks`` typed as what it holds)."""
        return [typing.cast(Block, block) for block in self.blocks]

    def num_params(self, trainable_only: bool = False) -> int:
        return sum(p.numel() for p in self.parameters() if p.requires_grad or not trainable_only)
