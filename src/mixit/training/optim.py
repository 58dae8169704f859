"""AdamW over the trainable parameters and the warmup + cosine schedule."""

from __future__ import annotations

import math

import torch
from torch import nn

from mixit.config import TrainConfig


def build_optimizer(model: nn.Module, cfg: TrainConfig, device: torch.device) -> torch.optim.AdamW:
    """AdamW over the parameters with requires_grad only.

    Weight decay applies to matrices (weights of linears and embeddings), not
    to biases or norm gains. The fused kernel is used where torch has one for
    the device: CUDA, and CPU since torch 2.4 (one kernel over all
    parameters instead of a loop of elementwise ops per parameter).
    """
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise ValueError("the model has no trainable parameter")
    decay = [p for p in params if p.ndim >= 2]
    no_decay = [p for p in params if p.ndim < 2]
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    fused = True if device.type in ("cuda", "cpu") else None
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), fused=fused)


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Learning rate for optimizer step `step` (0-based): linear warmup to
    cfg.lr over warmup_steps, then cosine decay to min_lr_ratio * lr at the
    last step."""
    warmup = cfg.cadence[0]
    if step < warmup:
        return cfg.lr * (step + 1) / warmup
    span = max(cfg.steps - 1 - warmup, 1)
    progress = min((step - warmup) / span, 1.0)
    floor = cfg.min_lr_ratio
    return cfg.lr * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress)))
