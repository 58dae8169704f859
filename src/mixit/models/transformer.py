"""The decoder of ../shared/spec/MODEL.md: pre-norm blocks, gated MLP, untied head.

    h = skip_scale * h + branch_scale * attn(norm1(h))
    h = skip_scale * h + branch_scale * mlp(norm2(h))
    logits = lm_head(norm_f(h))

The attention kind comes from `ATTENTION[cfg.attention]`; a kind without Q and
K (MixiT) declares ``learned_positions`` and the model adds learned absolute
position embeddings for it. What is trained is decided afterwards, by
`mixit.freezing.apply_variant`, never inside the model.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from mixit.config import ModelConfig
from mixit.models.attention import ATTENTION
from mixit.models.layers import Linear
from mixit.models.mlp import GatedMLP


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        self.norm1 = nn.RMSNorm(cfg.d_model, eps=1e-6)
        self.attn = ATTENTION[cfg.attention](cfg, layer)
        self.norm2 = nn.RMSNorm(cfg.d_model, eps=1e-6)
        self.mlp = GatedMLP(cfg)
        self.skip_scale, self.branch_scale = cfg.skip_scale, cfg.branch_scale

    def forward(self, h: torch.Tensor) -> torch.Tensor:  # (B, T, d_model)
        if self.skip_scale == 1.0 and self.branch_scale == 1.0:  # the usual case: no full-size multiplies by 1
            h = h + self.attn(self.norm1(h))
            return h + self.mlp(self.norm2(h))
        h = self.skip_scale * h + self.branch_scale * self.attn(self.norm1(h))
        return self.skip_scale * h + self.branch_scale * self.mlp(self.norm2(h))


class Transformer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        learned_positions = ATTENTION[cfg.attention].learned_positions
        self.pos_embed = nn.Embedding(cfg.n_ctx, cfg.d_model) if learned_positions else None
        self.blocks = nn.ModuleList(Block(cfg, layer) for layer in range(cfg.n_layers))
        self.norm_f = nn.RMSNorm(cfg.d_model, eps=1e-6)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.reset_parameters()

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
        """tokens (B, T) int64 with T <= n_ctx -> logits (B, T, vocab_size).

        Attention is causal, so right padding never changes the logits at the
        real positions: pad tokens sit after every position that could read them.
        """
        B, T = tokens.shape
        if T > self.cfg.n_ctx:
            raise ValueError(f"sequence length {T} exceeds the model's n_ctx={self.cfg.n_ctx}")
        h = self.embed(tokens)  # (B, T, d_model)
        if self.pos_embed is not None:
            h = h + self.pos_embed.weight[:T]
        for block in self.blocks:
            h = block(h)
        return self.lm_head(self.norm_f(h))  # (B, T, vocab_size)

    def num_params(self, trainable_only: bool = False) -> int:
        return sum(p.numel() for p in self.parameters() if p.requires_grad or not trainable_only)
