"""The one loss and the one optimizer step, shared by the training loop and `mixit bench`."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from mixit.tasks import IGNORE


def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy (nats) over the scored positions: the one loss of every task."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=IGNORE)


def train_step(
    model: Callable[[torch.Tensor], torch.Tensor],
    optimizer: torch.optim.Optimizer,
    inputs: torch.Tensor,
    targets: torch.Tensor,
    trainable: list[torch.nn.Parameter],
    grad_clip: float,
) -> torch.Tensor:
    """One optimizer step: forward, the task loss, backward, global-norm clipping
    (grad_clip > 0), AdamW. `model` maps tokens to logits (a module, a compiled
    module, or a wrapper). Returns the loss tensor without synchronising on it."""
    loss = loss_fn(model(inputs), targets)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    if grad_clip > 0:
        torch.nn.utils.clip_grad_norm_(trainable, grad_clip)
    optimizer.step()
    return loss
