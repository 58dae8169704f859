"""The one loss and the one optimizer step, shared by the training loop and `mixit bench`.

A step may be split into micro-batches (gradient accumulation) and across
processes (data parallelism). Its loss is always the mean cross-entropy over
every scored position of the whole global batch: each micro-batch
contributes its *sum* divided by the global count of scored positions, so
the gradient is the same however the batch is split (tested against one
process, docs/scaling.md).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from mixit.core.precision import Precision
from mixit.core.tasks import IGNORE


def loss_sum(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Summed cross-entropy (nats) over the scored positions, in fp32 whatever the autocast dtype: the one loss of
    every task, which a step divides by the global count of scored positions."""
    return F.cross_entropy(
        logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=IGNORE, reduction="sum"
    )


@dataclass
class StepParts:
    """What every optimizer step of one training uses: the model's forward pass, the optimizer, the parameters it
    trains, and how gradients are clipped, computed in reduced precision, and shared between processes."""

    forward: Callable[[torch.Tensor], torch.Tensor]
    """The forward pass: the model, or its DistributedDataParallel or compiled wrapper."""
    optimizer: torch.optim.Optimizer
    trainable: list[torch.nn.Parameter]
    """The parameters whose gradient norm is clipped."""
    grad_clip: float
    """Global-norm gradient clipping (off at 0)."""
    precision: Precision | None = None
    """The forward pass's autocast dtype and, for fp16, the gradient scaler (None: fp32)."""
    replicas: int = 1
    """Processes whose gradients are averaged (DistributedDataParallel divides by their number, which is
    multiplied back)."""
    no_sync: Callable[[], contextlib.AbstractContextManager[Any]] | None = None
    """DDP's context that skips the gradient all-reduce, for every micro-batch but the last."""


def accumulated_step(
    parts: StepParts, micro_batches: Sequence[tuple[torch.Tensor, torch.Tensor]], total_scored: int
) -> torch.Tensor:
    """One optimizer step over `micro_batches` (inputs, targets): forward, loss, backward for each,
    then global-norm clipping (grad_clip > 0) and AdamW.

    total_scored: scored positions in the whole global batch (every micro-batch of every process).
    Returns this process's share of the global mean loss (the sum over processes is the mean),
    without synchronising on it.
    """
    parts.optimizer.zero_grad(set_to_none=True)
    precision = parts.precision
    scaler = precision.scaler if precision is not None else None
    share = torch.zeros((), device=micro_batches[0][0].device)
    for i, (inputs, targets) in enumerate(micro_batches):
        last = i == len(micro_batches) - 1
        with parts.no_sync() if parts.no_sync is not None and not last else contextlib.nullcontext():
            with precision.autocast() if precision is not None else contextlib.nullcontext():
                logits = parts.forward(inputs)
            summed = loss_sum(logits, targets)
            loss = summed * (parts.replicas / max(total_scored, 1))
            (scaler.scale(loss) if scaler is not None else loss).backward()
        share += summed.detach() / max(total_scored, 1)
    if scaler is not None:
        scaler.unscale_(parts.optimizer)
    if parts.grad_clip > 0:
        torch.nn.utils.clip_grad_norm_(parts.trainable, parts.grad_clip)
    if scaler is not None:
        scaler.step(parts.optimizer)
        scaler.update()
    else:
        parts.optimizer.step()
    return share


def train_step(
    model: Callable[[torch.Tensor], torch.Tensor],
    optimizer: torch.optim.Optimizer,
    inputs: torch.Tensor,
    targets: torch.Tensor,
    trainable: list[torch.nn.Parameter],
    grad_clip: float,
    precision: Precision | None = None,
) -> torch.Tensor:
    """One optimizer step on one batch (`accumulated_step` with a single micro-batch in one process),
    as `mixit bench` times it. Returns the mean loss."""
    scored = int((targets != IGNORE).sum())
    return accumulated_step(StepParts(model, optimizer, trainable, grad_clip, precision), [(inputs, targets)], scored)
