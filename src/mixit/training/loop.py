"""The training loop (`train`): AdamW on the trainable parameters, warmup and
decay schedule, gradient clipping, evaluation on the validation and test sets
(before training and periodically), the convergence criterion on the
validation curve and optional early stopping on it (`mixit.training.convergence`),
metrics, checkpoints, and exact resumption (a training batch depends only on
(data_seed, step), so a resumed run sees the batches it would have seen).

The same loop runs in one process or in several under torchrun
(docs/scaling.md): every process builds the same model, takes its slice of
the same global batch, and DistributedDataParallel sums their gradients;
only rank 0 writes the run directory, which is written through
`mixit.run.Run` only.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.nn.parallel import DistributedDataParallel
from tqdm.auto import tqdm

from mixit.distributed import Dist, all_sum, broadcast, check_identical, env_world, setup, split, teardown
from mixit.errors import UsageError
from mixit.experiment import RunConfig, build
from mixit.freezing import FreezeReport
from mixit.models import Transformer
from mixit.resources import check_memory, training_parts
from mixit.run import Run
from mixit.runtime import fast_bf16, resolve_device
from mixit.tasks import IGNORE, Batch, Task
from mixit.training.convergence import Convergence
from mixit.training.evaluate import evaluate
from mixit.training.optim import build_optimizer
from mixit.training.step import Precision, accumulated_step


def train(
    cfg: RunConfig,
    run_dir: str | Path,
    device: str = "auto",
    resume: bool = False,
    progress: bool = True,
    compile: bool = False,
    allow_slow_dtype: bool = False,
    on_step: Callable[[int, float], None] | None = None,
) -> dict[str, Any]:
    """Train `cfg` into `run_dir` and return the summary (also written to summary.json).

    Under torchrun, every process calls this with the same arguments; rank 0 writes the run directory.

    Args:
        cfg: the run's configuration (`mixit.run_config` or `mixit.experiment.resolve`).
        run_dir: the run directory; new runs need it absent or empty.
        device: auto (cuda if available), cpu, cuda or cuda:N (under torchrun, each process takes its own GPU).
        resume: continue the run in run_dir from its last checkpoint (cfg must be the run's own).
        progress: show a progress bar.
        compile: torch.compile the training forward pass (evaluation and checkpoints use the same weights).
        allow_slow_dtype: accept bf16 on a CPU without fast bf16 matrix products (many times slower than fp32).
        on_step: called as on_step(step, loss) after each optimizer step (steps count from 1), on rank 0.
    """
    dev = resolve_device(device)
    # Checks that need no other process come first, so that a bad option never waits for the others.
    if cfg.train.dtype == "bf16" and dev.type == "cpu" and not allow_slow_dtype and not fast_bf16():
        raise UsageError(
            "dtype bf16 on this CPU, which has no fast bf16 matrix products, is many times slower "
            "than fp32; use fp32, or pass --allow-slow-dtype"
        )
    split(cfg.train.batch_size, env_world(), cfg.train.grad_accum)
    dist, dev = setup(dev)
    try:
        return _train(cfg, Path(run_dir), dist, dev, resume, progress and dist.main, compile, on_step)
    finally:
        teardown(dist)


def _train(
    cfg: RunConfig,
    run_dir: Path,
    dist: Dist,
    dev: torch.device,
    resume: bool,
    progress: bool,
    compile: bool,
    on_step: Callable[[int, float], None] | None,
) -> dict[str, Any]:
    tc = cfg.train
    run: Run | None = None
    refusal: str | None = None
    try:  # every check before anything is written; rank 0's verdict is every rank's
        per_rank = split(tc.batch_size, dist, tc.grad_accum)
        if dist.main:
            run = Run.open(run_dir) if resume else None
            if run is not None:
                run.acquire()  # before anything is read or rewritten: one process per run directory
                run.check_same(cfg)
            else:
                Run.check_new(run_dir)
        check_memory(
            "this run",
            training_parts(cfg.model, per_rank, tc.eval_batch_size, cfg.test_size),
            dev,
            "lower batch_size, eval_batch_size, test_size or the model's size, or raise grad_accum",
        )
        task, model, report = build(cfg, run_dir if resume else None)
        task.train_batch(0, tc.batch_size)  # a task that cannot make training data is refused before any write
    except UsageError as e:
        refusal = str(e)
    refusal = broadcast(refusal, dist)
    if refusal is not None:
        if run is not None:
            run.release()
        raise UsageError(refusal)
    try:
        if dist.main and run is None:
            run = Run.create(run_dir, cfg)  # created and locked
            task.save_artifacts(run.path)
        return _loop(cfg, run, run_dir, task, model, report, dist, dev, per_rank, resume, progress, compile, on_step)
    finally:
        if run is not None:
            run.release()


def _loop(
    cfg: RunConfig,
    run: Run | None,
    run_dir: Path,
    task: Task,
    model: Transformer,
    report: FreezeReport,
    dist: Dist,
    dev: torch.device,
    per_rank: int,
    resume: bool,
    progress: bool,
    compile: bool,
    on_step: Callable[[int, float], None] | None,
) -> dict[str, Any]:
    """The training loop proper. `run` is the locked run directory on rank 0, None on the others."""
    tc = cfg.train
    _, eval_every, log_every, checkpoint_every = tc.cadence
    model.to(dev)
    check_identical(model, dist)
    optimizer = build_optimizer(model, tc, dev)
    precision = Precision(tc.dtype, dev)
    start = 0
    reader = run if run is not None else Run(run_dir)  # the other ranks read the checkpoint, never write
    found = reader.latest_checkpoint() if resume and dist.main else None
    # A run killed before its first checkpoint resumes from step 0.
    last = broadcast(str(found) if found is not None else None, dist)
    if last is not None:
        reader.load_model_state(model, Path(last))
        start = reader.load_training_state(optimizer, Path(last), precision)
    done_before = broadcast(run.summary() if resume and run is not None else None, dist)
    if done_before is not None and (start >= tc.steps or done_before.get("convergence", {}).get("stopped_early")):
        return done_before

    val_batch = task.val_batch()
    conv = Convergence(*task.selection, tc.patience, tc.min_delta, earliest=tc.steps // 2, stop_at=tc.stop_at)
    if run is not None and resume:
        conv.extend(run.metrics(), up_to=start)
    log = run.open_metrics(resume_step=start if resume else None) if run is not None else None
    if run is not None and log is not None and not any(e.get("event") == "freeze" for e in run.metrics()):
        log.write({"step": 0, "event": "freeze", **report.to_dict()})

    def evaluation(step: int) -> tuple[dict[str, float], dict[str, float], bool]:
        """Test and validation metrics, logged; and whether early stopping stops at `step` (every rank alike)."""
        test = evaluate(model, task, dev, tc.eval_batch_size, dist=dist, precision=precision)
        val = evaluate(model, task, dev, tc.eval_batch_size, batch=val_batch, dist=dist, precision=precision)
        conv.add(step, val[conv.metric])
        if log is not None:
            log.write({"step": step, "event": "eval", **test, **{f"val_{k}": v for k, v in val.items()}})
        return test, val, bool(broadcast(tc.early_stop and conv.should_stop, dist))

    metrics: dict[str, float] = {}
    val_metrics: dict[str, float] = {}
    stopped = bool(broadcast(tc.early_stop and conv.should_stop, dist))  # a run killed just after stopping
    # Where the curve starts, logged once (a run resumed at step 0 may have it already); rank 0 decides.
    if broadcast(start == 0 and not conv.history, dist):
        metrics, val_metrics, _ = evaluation(0)
    trainable = [p for p in model.parameters() if p.requires_grad]
    ddp = DistributedDataParallel(model, device_ids=[dev] if dev.type == "cuda" else None) if dist.active else None
    forward: Callable[[torch.Tensor], torch.Tensor] = ddp if ddp is not None else model
    forward = torch.compile(forward) if compile else forward
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
    trained = start
    model.train()
    try:
        for step in range(start, tc.steps):
            if stopped:
                break
            micro, scored = slices(task.train_batch(step, tc.batch_size), dist, per_rank, tc.grad_accum)
            lr = tc.lr_at(step)
            for group in optimizer.param_groups:
                group["lr"] = lr
            tick = time.perf_counter()
            share = accumulated_step(
                forward,
                optimizer,
                [(b.inputs.to(dev), b.targets.to(dev)) for b in micro],
                trainable,
                tc.grad_clip,
                scored,
                dist.world_size,
                precision,
                ddp.no_sync if ddp is not None else None,
            )
            train_time += time.perf_counter() - tick
            done = step + 1
            if done % log_every == 0 or done == tc.steps:
                loss_value = all_sum(share.item(), dist, dev)
                if log is not None:
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
                metrics, val_metrics, stopped = evaluation(done)
            if run is not None and (done % checkpoint_every == 0 or done == tc.steps or stopped):
                run.save_checkpoint(done, model, optimizer, precision)
            trained = done
            bar.update(1)
            if on_step is not None and dist.main:
                on_step(done, share.item())
    finally:
        bar.close()
        if log is not None:
            log.close()
    if not metrics:  # resumed from the final checkpoint of a run killed before its summary
        metrics = evaluate(model, task, dev, tc.eval_batch_size, dist=dist, precision=precision)
        val_metrics = evaluate(model, task, dev, tc.eval_batch_size, batch=val_batch, dist=dist, precision=precision)

    summary = {
        "task": task.describe(),
        "variant": cfg.variant,
        "steps": tc.steps,
        "resumed_from": start if resume else None,
        "test": metrics,
        "val": val_metrics,
        "convergence": conv.summary(stopped_early=trained < tc.steps, steps_trained=trained),
        "n_params": report.n_trainable + report.n_frozen,
        "n_trainable": report.n_trainable,
        "train_seconds_this_session": round(train_time, 2),
        "wall_seconds_this_session": round(time.perf_counter() - t0, 2),
        "device": str(dev),
        "world_size": dist.world_size,
        "run_dir": str(run_dir),
    }
    if run is not None:
        run.write_summary(summary)
    return summary


def slices(batch: Batch, dist: Dist, per_rank: int, accum: int) -> tuple[list[Batch], int]:
    """This process's micro-batches of global batch `batch`, and the scored positions of the whole
    global batch. Rank r takes examples [r * per_rank * accum, (r + 1) * per_rank * accum), so the
    examples of a step do not depend on how many processes share it."""
    mine = batch[dist.rank * per_rank * accum : (dist.rank + 1) * per_rank * accum]
    micro = [mine[i * per_rank : (i + 1) * per_rank] for i in range(accum)]
    return micro, int((batch.targets != IGNORE).sum())


def headline(metrics: dict[str, float]) -> float:
    """The metric a person reads first: exact match, accuracy, or token accuracy."""
    for key in ("exact_match", "accuracy", "token_acc"):
        if key in metrics:
            return metrics[key]
    return float("nan")
