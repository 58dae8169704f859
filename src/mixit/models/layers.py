"""Small building blocks shared by attention and MLP: the scaled linear layer."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from mixit.config import ModelConfig


class Linear(nn.Linear):
    """nn.Linear whose output is multiplied by a fixed `multiplier`.

    The multiplier is sqrt(base_width / fan_in) under width scaling
    (MODEL.md, signal-propagation settings) and exactly 1 otherwise, in which
    case no multiplication is done.
    """

    def __init__(self, fan_in: int, fan_out: int, bias: bool, multiplier: float = 1.0):
        super().__init__(fan_in, fan_out, bias=bias)
        self.multiplier = multiplier

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.linear(x, self.weight, self.bias)
        return y if self.multiplier == 1.0 else y * self.multiplier


def block_linear(cfg: ModelConfig, fan_in: int, fan_out: int) -> Linear:
    """A linear layer inside a transformer block, scaled as `cfg` says."""
    multiplier = math.sqrt(cfg.base_width / fan_in) if cfg.width_scaling else 1.0
    return Linear(fan_in, fan_out, bias=cfg.bias, multiplier=multiplier)
