"""Evaluation of a model on its task's fixed test set (`mixit eval` is `mixit.analysis.evaluation`)."""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from torch import nn

from mixit.core.precision import Precision
from mixit.core.tasks import IGNORE, Batch, ParamCounts, Task
from mixit.core.tasks.base import per_example, ratio_se
from mixit.distributed import Dist, gather


@torch.no_grad()
def evaluate(
    model: nn.Module,
    task: Task,
    device: torch.device,
    batch_size: int = 1000,
    batch: Batch | None = None,
    dist: Dist | None = None,
    precision: Precision | None = None,
) -> dict[str, float]:
    """Loss and the task's metrics on `batch` (default: the task's test set), each with its standard error
    ``<name>_se`` over the examples (docs/tasks.md, "Standard errors").

    Runs in chunks of `batch_size` examples; the loss is averaged over all
    scored positions, not over chunks, and its error is the ratio estimator's
    (`ratio_se`) with each example's summed loss. Under torchrun (`dist`),
    each process evaluates a contiguous share of the examples, and the
    per-example loss sums and the predictions are gathered, so every process
    returns the metrics of the whole test set.
    """
    dist = dist or Dist()
    was_training = model.training
    model.eval()
    batch = task.test_batch() if batch is None else batch
    share = -(-len(batch) // dist.world_size)  # ceil
    mine = batch[dist.rank * share : (dist.rank + 1) * share]
    preds, losses = [], []
    for start in range(0, len(mine), batch_size):
        chunk = mine[start : start + batch_size].to(device)
        with precision.autocast() if precision is not None else contextlib.nullcontext():
            logits = model(chunk.inputs)
        losses.append(example_losses(logits, chunk.targets).cpu())
        preds.append(logits.argmax(dim=-1).cpu())
    model.train(was_training)
    counts = ParamCounts(
        trainable=sum(p.numel() for p in model.parameters() if p.requires_grad),
        total=sum(p.numel() for p in model.parameters()),
    )
    gathered = [(p, loss) for part in gather(list(zip(preds, losses, strict=True)), dist) for p, loss in part]
    loss_sums = torch.cat([loss for _, loss in gathered])  # (N,) float64
    scored = per_example(batch.mask)  # (N,)
    metrics = {"loss": float(loss_sums.sum()) / max(float(scored.sum()), 1.0), "loss_se": ratio_se(loss_sums, scored)}
    metrics.update(task.loss_metrics(metrics["loss"]))
    metrics.update(task.score(torch.cat([p for p, _ in gathered]), batch, counts))
    return metrics


def example_losses(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Each example's cross-entropy summed over its scored positions (in fp32, summed in fp64): (N,)."""
    losses = F.cross_entropy(
        logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=IGNORE, reduction="none"
    )  # (N * positions,), 0 where not scored
    return per_example(losses.reshape(len(targets), -1))
