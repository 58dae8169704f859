"""`mixit eval SOURCE`: a trained model's metrics on its task's fixed test set, measured again. SOURCE is a run
directory (its latest checkpoint), a `mixit export` directory or its Hub repo id (`mixit.load`); the test set is
rebuilt from the config each records, so it is the run's own, drawn from the same seeds.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mixit.core.config import check
from mixit.core.resources import check_memory, inference_parts
from mixit.core.training.evaluate import evaluate
from mixit.export import load
from mixit.runtime import resolve_device


def evaluate_run(run_dir: Path, device: str = "auto", batch_size: int = 1000) -> dict[str, Any]:
    """Re-evaluate a trained model on its task's fixed test set: a run's latest checkpoint, or an exported model.

    Args:
        run_dir: The run directory, a directory written by `mixit export` (--to hf or hub), or the Hub repo id
            of one.
        device: Where to run: auto (cuda if available, else cpu), cpu, cuda or cuda:N.
        batch_size: Test examples per forward pass.
    """
    check(batch_size > 0, f"batch_size must be a positive integer, got {batch_size}")
    where = resolve_device(device)
    loaded = load(run_dir, "cpu")  # the weights are read before the memory they need on `where` is checked
    parts = inference_parts(loaded.cfg.model, batch_size, f"a batch of {batch_size}")
    check_memory("evaluating", parts, where, "lower --batch-size")
    # The frozen parts are frozen again, so bits per trainable parameter count what training could change.
    metrics = evaluate(loaded.model.to(where), loaded.task, where, batch_size)
    return {
        "run_dir": str(run_dir),
        "checkpoint": loaded.checkpoint.name,
        "task": loaded.task.describe(),
        "variant": loaded.cfg.variant,
        "test": metrics,
    }
