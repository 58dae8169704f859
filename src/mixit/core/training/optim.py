"""AdamW over the trainable parameters (the schedule is `TrainConfig.lr_at`)."""

from __future__ import annotations

import torch
from torch import nn

from mixit.core.config import TrainConfig


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
