"""Evaluation of a model on its task's fixed test set, and of a run's latest checkpoint (`mixit eval`)."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import torch
from torch import nn

from mixit.config import check
from mixit.distributed import Dist, all_sum, gather
from mixit.precision import Precision
from mixit.resources import check_memory, inference_parts
from mixit.run import Run
from mixit.runtime import resolve_device
from mixit.tasks import Batch, ParamCounts, Task
from mixit.training.step import loss_sum


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
    """Loss and the task's metrics on `batch` (default: the task's test set).

    Runs in chunks of `batch_size` examples; the loss is averaged over all
    scored positions, not over chunks. Under torchrun (`dist`), each process
    evaluates a contiguous share of the examples, and the loss sums and the
    predictions are gathered, so every process returns the metrics of the
    whole test set.
    """
    dist = dist or Dist()
    was_training = model.training
    model.eval()
    batch = task.test_batch() if batch is None else batch
    share = -(-len(batch) // dist.world_size)  # ceil
    mine = batch[dist.rank * share : (dist.rank + 1) * share]
    preds, total = [], 0.0
    for start in range(0, len(mine), batch_size):
        chunk = mine[start : start + batch_size].to(device)
        with precision.autocast() if precision is not None else contextlib.nullcontext():
            logits = model(chunk.inputs)
        total += loss_sum(logits, chunk.targets).item()
        preds.append(logits.argmax(dim=-1).cpu())
    model.train(was_training)
    counts = ParamCounts(
        trainable=sum(p.numel() for p in model.parameters() if p.requires_grad),
        total=sum(p.numel() for p in model.parameters()),
    )
    total = all_sum(total, dist, device)
    gathered = [p for part in gather(preds, dist) for p in part]
    metrics = {"loss": total / max(int(batch.mask.sum()), 1)}
    metrics.update(task.loss_metrics(metrics["loss"]))
    metrics.update(task.score(torch.cat(gathered), batch, counts))
    return metrics


def evaluate_run(run_dir: Path, device: str = "auto", batch_size: int = 1000) -> dict[str, Any]:
    """Re-evaluate a run's latest checkpoint on its task's fixed test set.

    Args:
        run_dir: The run directory.
        device: Where to run: auto (cuda if available, else cpu), cpu, cuda or cuda:N.
        batch_size: Test examples per forward pass.
    """
    check(batch_size > 0, f"batch_size must be a positive integer, got {batch_size}")
    run = Run.open(run_dir)
    model_cfg = run.config.model
    parts = inference_parts(model_cfg, batch_size, f"a batch of {batch_size}")
    check_memory("evaluating", parts, resolve_device(device), "lower --batch-size")
    loaded = run.load(device)
    # The frozen parts are frozen again, so bits per trainable parameter count what training could change.
    metrics = evaluate(loaded.model, loaded.task, next(loaded.model.parameters()).device, batch_size)
    return {
        "run_dir": str(run_dir),
        "checkpoint": loaded.checkpoint.name,
        "task": loaded.task.describe(),
        "variant": loaded.cfg.variant,
        "test": metrics,
    }
