"""Small building blocks shared by attention and MLP: the scaled linear layer
and the fused application of several of them to one input."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from mixit.core.config import ModelConfig


class Linear(nn.Linear):
    """nn.Linear whose output is multiplied by a fixed `multiplier`.

    The multiplier is sqrt(base_width / fan_in) under width scaling
    (docs/model.md, "Signal-propagation settings") and exactly 1 otherwise, in which
    case no multiplication is done.
    """

    def __init__(self, fan_in: int, fan_out: int, bias: bool, multiplier: float = 1.0):
        super().__init__(fan_in, fan_out, bias=bias)
        self.multiplier = multiplier

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.linear(x, self.weight, self.bias)
        return y if self.multiplier == 1.0 else y * self.multiplier


def scaled_linear(cfg: ModelConfig, fan_in: int, fan_out: int, base: int, bias: bool) -> Linear:
    """A linear layer whose output is multiplied by sqrt(base / fan_in) under width scaling, by 1 otherwise."""
    multiplier = math.sqrt(base / fan_in) if cfg.width_scaling else 1.0
    return Linear(fan_in, fan_out, bias=bias, multiplier=multiplier)


def block_linear(cfg: ModelConfig, fan_in: int, fan_out: int, base: int | None = None) -> Linear:
    """A linear layer inside a transformer block, scaled as `cfg` says (base: cfg.base_width unless given)."""
    return scaled_linear(cfg, fan_in, fan_out, cfg.base_width if base is None else base, cfg.bias)


def trains_alike(*layers: nn.Linear) -> bool:
    """Whether every weight and bias of `layers` has the same requires_grad."""
    flags = {p.requires_grad for layer in layers for p in layer.parameters()}
    return len(flags) <= 1


def fused_linear(x: torch.Tensor, layers: tuple[Linear, ...]) -> torch.Tensor:
    """``torch.cat([layer(x) for layer in layers], -1)`` as one matrix product.

    The weights are concatenated on every call (a copy of a few hundred KB, no
    state to keep in sync with the parameters), and autograd splits the
    gradient back onto each layer's own weight. One wide product makes better
    use of a CPU's matmul kernel than several narrow ones of the same total
    size, and saves the summation of their input gradients. Only layers that
    `trains_alike` should be fused, or the weight gradient of frozen ones is
    computed for nothing. All layers must share
    one multiplier (they do when they share fan_in).
    """
    weight = torch.cat([layer.weight for layer in layers])
    bias = torch.cat([layer.bias for layer in layers]) if layers[0].bias is not None else None
    y = F.linear(x, weight, bias)
    multiplier = layers[0].multiplier
    return y if multiplier == 1.0 else y * multiplier
