"""The gated MLP of every block, down(act(gate(x)) * up(x)) (docs/model.md,
"The block"), and its activations, registered in `ACTIVATIONS`."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from mixit.core.config import ModelConfig
from mixit.core.models.layers import block_linear
from mixit.registry import Registry

ACTIVATIONS: Registry[Callable[[ModelConfig], nn.Module]] = Registry("activation")
"""Name -> factory of the MLP activation from the model config; ``ModelConfig.activation`` picks one."""
ModelConfig.named["activation"] = ACTIVATIONS

ACTIVATIONS.add("silu", lambda cfg: nn.SiLU())


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


ACTIVATIONS.add("shaped_leaky_relu", lambda cfg: ShapedLeakyReLU(cfg.d_model, cfg.leaky_c))


class GatedMLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        d_mlp = cfg.d_mlp
        assert d_mlp is not None  # resolved by ModelConfig
        self.gate = block_linear(cfg, cfg.d_model, d_mlp)
        self.up = block_linear(cfg, cfg.d_model, d_mlp)
        # The reference passes no base width to the down projection (docs/fidelity.md): down_base_width.
        self.down = block_linear(cfg, d_mlp, cfg.d_model, base=cfg.down_base_width)
        self.act = ACTIVATIONS.get(cfg.activation)(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, T, d_model)
        return self.down(self.act(self.gate(x)) * self.up(x))
