"""Evaluation of a model on its task's fixed test set."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from mixit.tasks import IGNORE, Batch, ParamCounts, Task


def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy (nats) over the scored positions: the one loss of every task."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=IGNORE)


@torch.no_grad()
def evaluate(model: nn.Module, task: Task, device: torch.device, batch_size: int = 1000,
             batch: Batch | None = None) -> dict[str, float]:
    """Loss and the task's metrics on `batch` (default: the task's test set).

    Runs in chunks of `batch_size` examples; the loss is averaged over all
    scored positions, not over chunks.
    """
    was_training = model.training
    model.eval()
    batch = task.test_batch() if batch is None else batch
    preds, loss_sum = [], 0.0
    for start in range(0, len(batch), batch_size):
        chunk = batch[start:start + batch_size].to(device)
        logits = model(chunk.inputs)
        n = int(chunk.mask.sum())
        if n:
            loss_sum += loss_fn(logits, chunk.targets).item() * n
        preds.append(logits.argmax(dim=-1).cpu())
    model.train(was_training)
    counts = ParamCounts(trainable=sum(p.numel() for p in model.parameters() if p.requires_grad),
                         total=sum(p.numel() for p in model.parameters()))
    metrics = {"loss": loss_sum / max(int(batch.mask.sum()), 1)}
    metrics.update(task.loss_metrics(metrics["loss"]))
    metrics.update(task.score(torch.cat(preds), batch, counts))
    return metrics
