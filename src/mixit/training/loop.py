"""The training loop (`train`): AdamW on the trainable parameters, warmup +
cosine schedule, gradient clipping, periodic test-set evaluation, metrics,
checkpoints, and exact resumption (a training batch depends only on
(data_seed, step), so a resumed run sees the batches it would have seen).
The run directory is written through `mixit.run.Run` only.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from mixit.experiment import RunConfig, build
from mixit.freezing import FreezeReport
from mixit.models import Transformer
from mixit.resources import check_memory, training_parts
from mixit.run import Run
from mixit.runtime import resolve_device
from mixit.tasks import Task
from mixit.training.evaluate import evaluate
from mixit.training.optim import build_optimizer
from mixit.training.step import train_step


def train(
    cfg: RunConfig,
    run_dir: str | Path,
    device: str = "auto",
    resume: bool = False,
    progress: bool = True,
    compile: bool = False,
    on_step: Callable[[int, float], None] | None = None,
) -> dict[str, Any]:
    """Train `cfg` into `run_dir` and return the summary (also written to summary.json).

    Args:
        cfg: the run's configuration (`mixit.run_config` or `mixit.experiment.resolve`).
        run_dir: the run directory; new runs need it absent or empty.
        device: auto (cuda if available), cpu, cuda or cuda:N.
        resume: continue the run in run_dir from its last checkpoint (cfg must be the run's own).
        progress: show a progress bar.
        compile: torch.compile the training forward pass (evaluation and checkpoints use the same weights).
        on_step: called as on_step(step, loss) after each optimizer step (steps count from 1).
    """
    dev = resolve_device(device)
    tc = cfg.train
    run = Run.open(run_dir) if resume else None
    if run is not None:
        run.acquire()  # before anything is read or rewritten: one process per run directory
    else:
        Run.check_new(run_dir)
    try:
        if run is not None:
            run.check_same(cfg)
        check_memory(
            "this run",
            training_parts(cfg.model, tc.batch_size, tc.eval_batch_size, cfg.test_size),
            dev,
            "lower batch_size, eval_batch_size, test_size or the model's size",
        )
        task, model, report = build(cfg, None if run is None else run.path)
        task.train_batch(0, tc.batch_size)  # a task that cannot make training data is refused before any write
        if run is None:
            run = Run.create(run_dir, cfg)  # created and locked
            task.save_artifacts(run.path)
        return _loop(cfg, run, task, model, report, dev, resume, progress, compile, on_step)
    finally:
        if run is not None:
            run.release()


def _loop(
    cfg: RunConfig,
    run: Run,
    task: Task,
    model: Transformer,
    report: FreezeReport,
    dev: torch.device,
    resume: bool,
    progress: bool,
    compile: bool,
    on_step: Callable[[int, float], None] | None,
) -> dict[str, Any]:
    """The training loop proper, in a locked run directory."""
    tc = cfg.train
    _, eval_every, log_every, checkpoint_every = tc.cadence
    model.to(dev)
    optimizer = build_optimizer(model, tc, dev)
    start = 0
    last = run.latest_checkpoint() if resume else None
    if last is not None:
        run.load_model_state(model, last)
        start = run.load_training_state(optimizer, last)
    done_before = run.summary() if resume else None
    if done_before is not None and start >= tc.steps:
        return done_before

    log = run.open_metrics(resume_step=start if resume else None)
    if not any(e.get("event") == "freeze" for e in run.metrics()):
        log.write({"step": 0, "event": "freeze", **report.to_dict()})
    trainable = [p for p in model.parameters() if p.requires_grad]
    forward = torch.compile(model) if compile else model
    # Redraw at most every 10 s when stderr is a log file rather than a terminal.
    bar = tqdm(
        total=tc.steps,
        initial=start,
        disable=not progress,
        desc=f"{cfg.task}/{cfg.variant}",
        dynamic_ncols=True,
        mininterval=0.1 if sys.stderr.isatty() else 10.0,
    )
    t0, train_time = time.perf_counter(), 0.0
    metrics: dict[str, float] = {}
    model.train()
    try:
        for step in range(start, tc.steps):
            batch = task.train_batch(step, tc.batch_size).to(dev)
            lr = tc.lr_at(step)
            for group in optimizer.param_groups:
                group["lr"] = lr
            tick = time.perf_counter()
            loss = train_step(forward, optimizer, batch.inputs, batch.targets, trainable, tc.grad_clip)
            train_time += time.perf_counter() - tick
            done = step + 1
            if done % log_every == 0 or done == tc.steps:
                loss_value = loss.item()
                log.write(
                    {
                        "step": done,
                        "event": "train",
                        "loss": loss_value,
                        "lr": lr,
                        "elapsed_s": round(time.perf_counter() - t0, 3),
                    }
                )
                bar.set_postfix(loss=f"{loss_value:.4f}", **({"test": f"{headline(metrics):.3f}"} if metrics else {}))
            if done % eval_every == 0 or done == tc.steps:
                metrics = evaluate(model, task, dev, tc.eval_batch_size)
                log.write({"step": done, "event": "eval", **metrics})
            if done % checkpoint_every == 0 or done == tc.steps:
                run.save_checkpoint(done, model, optimizer)
            bar.update(1)
            if on_step is not None:
                on_step(done, loss.item())
    finally:
        bar.close()
        log.close()
    if not metrics:  # resumed from the final checkpoint of a run killed before its summary
        metrics = evaluate(model, task, dev, tc.eval_batch_size)

    summary = {
        "task": task.describe(),
        "variant": cfg.variant,
        "steps": tc.steps,
        "resumed_from": start if resume else None,
        "test": metrics,
        "n_params": report.n_trainable + report.n_frozen,
        "n_trainable": report.n_trainable,
        "train_seconds_this_session": round(train_time, 2),
        "wall_seconds_this_session": round(time.perf_counter() - t0, 2),
        "device": str(dev),
        "run_dir": str(run.path),
    }
    run.write_summary(summary)
    return summary


def headline(metrics: dict[str, float]) -> float:
    """The metric a person reads first: exact match, accuracy, or token accuracy."""
    for key in ("exact_match", "accuracy", "token_acc"):
        if key in metrics:
            return metrics[key]
    return float("nan")
