"""The gated MLP of every block: down(act(gate(x)) * up(x)) (MODEL.md, base block)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from mixit.config import ModelConfig
from mixit.models.layers import block_linear


class ShapedLeakyReLU(nn.Module):
    """LeakyReLU with negative slope 1 + c/sqrt(d), times sqrt(2 / (1 + slope^2)).

    The slope tends to 1 as the width grows, so the activation approaches the
    identity at the rate that keeps deep random networks from collapsing
    (Noci et al. 2023, "The Shaped Transformer"); the gain keeps the second
    moment of a standard Gaussian input at 1.
    """

    def __init__(self, d_model: int, c: float):
        super().__init__()
        self.slope = 1.0 + c / math.sqrt(d_model)
        self.gain = math.sqrt(2.0 / (1.0 + self.slope**2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.leaky_relu(x, self.slope) * self.gain


def make_activation(cfg: ModelConfig) -> nn.Module:
    if cfg.activation == "silu":
        return nn.SiLU()
    return ShapedLeakyReLU(cfg.d_model, cfg.leaky_c)


class GatedMLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.gate = block_linear(cfg, cfg.d_model, cfg.d_mlp)
        self.up = block_linear(cfg, cfg.d_model, cfg.d_mlp)
        self.down = block_linear(cfg, cfg.d_mlp, cfg.d_model)
        self.act = make_activation(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, T, d_model)
        return self.down(self.act(self.gate(x)) * self.up(x))
