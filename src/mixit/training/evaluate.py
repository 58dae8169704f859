"""Evaluation of a model on its task's fixed test set, and of a run's latest checkpoint (`mixit eval`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from mixit.config import check
from mixit.resources import activation_bytes, check_memory, model_bytes
from mixit.run import Run
from mixit.runtime import resolve_device
from mixit.tasks import Batch, ParamCounts, Task
from mixit.training.step import loss_fn


@torch.no_grad()
def evaluate(
    model: nn.Module, task: Task, device: torch.device, batch_size: int = 1000, batch: Batch | None = None
) -> dict[str, float]:
    """Loss and the task's metrics on `batch` (default: the task's test set).

    Runs in chunks of `batch_size` examples; the loss is averaged over all
    scored positions, not over chunks.
    """
    was_training = model.training
    model.eval()
    batch = task.test_batch() if batch is None else batch
    preds, loss_sum = [], 0.0
    for start in range(0, len(batch), batch_size):
        chunk = batch[start : start + batch_size].to(device)
        logits = model(chunk.inputs)
        n = int(chunk.mask.sum())
        if n:
            loss_sum += loss_fn(logits, chunk.targets).item() * n
        preds.append(logits.argmax(dim=-1).cpu())
    model.train(was_training)
    counts = ParamCounts(
        trainable=sum(p.numel() for p in model.parameters() if p.requires_grad),
        total=sum(p.numel() for p in model.parameters()),
    )
    metrics = {"loss": loss_sum / max(int(batch.mask.sum()), 1)}
    metrics.update(task.loss_metrics(metrics["loss"]))
    metrics.update(task.score(torch.cat(preds), batch, counts))
    return metrics


def evaluate_run(run_dir: Path, device: str = "auto", batch_size: int = 1000) -> dict[str, Any]:
    """Re-evaluate a run's latest checkpoint on its task's fixed test set.

    Args:
        run_dir: the run directory.
        device: auto, cpu, cuda or cuda:N.
        batch_size: examples per forward pass.
    """
    check(batch_size > 0, f"batch_size must be a positive integer, got {batch_size}")
    run = Run.open(run_dir)
    model_cfg = run.config.model
    check_memory(
        "evaluating",
        {
            "the model": model_bytes(model_cfg),
            f"a batch of {batch_size}": activation_bytes(model_cfg, batch_size, model_cfg.n_ctx, backward=False),
        },
        resolve_device(device),
        "lower --batch-size",
    )
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
