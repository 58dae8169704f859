"""The training loop (`train`): AdamW on the trainable parameters, warmup and
decay schedule, gradient clipping, evaluation on the validation and test sets
(before training and periodically), the convergence criterion on the
validation curve and optional early stopping on it (`mixit.core.training.convergence`),
metrics, checkpoints, and exact resumption (a training batch depends only on
(data_seed, step), so a resumed run sees the batches it would have seen).

Which checkpoints a run keeps is a choice of the session, not of the config (it changes no
result and no run id): `keep_checkpoints`, one of `KEEP_CHECKPOINTS` (docs/analysis.md, "Over
training"). Every mode writes a checkpoint every checkpoint_every steps and at the run's last
step (the final one, or where early stopping stops it), and `latest` always names the newest:
resumption starts there whatever is kept.

    latest  keep only the newest checkpoint (each save removes the one before)
    all     keep every checkpoint written
    log     also write a checkpoint at each of `log_spaced_steps(steps)` (about 20 steps, from 1 to
            the step budget, evenly spaced on a log scale), and keep those and the run's last one;
            the cadence's other checkpoints serve resumption and are removed by the next save

The same loop runs in one process or in several under torchrun
(docs/scaling.md): every process builds the same model, takes its slice of
the same global batch, and DistributedDataParallel sums their gradients;
only rank 0 writes the run directory, which is written through
`mixit.core.run.Run` (its checkpoints through `mixit.core.checkpoint`).

`train` checks its options, then the run and the task (`_checked`, before anything is written), creates or
reopens the run and builds what trains (`Training`), and hands it to `train_session`: the loop, read top to
bottom as one function. It restores the latest checkpoint, opens the logs (`Logs`), takes up the validation curve
(`Curve`) and evaluates where it starts; then each step: its micro-batches, learning rate and optimizer step
(`mixit.core.training.step`), then the log line, evaluation and checkpoint its number calls for; then the
summary. What changes from step to step is the session's own local state.

Where the metrics go besides metrics.jsonl is a choice of the session too: `tracking`, a `Tracker`
(`mixit.tracking.Tracking`: the sinks of docs/tracking.md). The loop declares what it asks of one and imports
nothing of the tooling: `train` has it check its sinks before any work, and rank 0 opens them as a `Feed` once the
run is locked, handing it each record after metrics.jsonl has it; what the sinks hold is derived from those records.
"""

from __future__ import annotations

import contextlib
import shlex
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol, get_args

import torch
from torch.nn.parallel import DistributedDataParallel
from tqdm.auto import tqdm

from mixit.core.checkpoint import load_model_state, load_training_state, save_checkpoint
from mixit.core.experiment import RunConfig, build
from mixit.core.freezing import FreezeReport
from mixit.core.models import Transformer
from mixit.core.precision import Precision
from mixit.core.resources import check_memory, training_parts
from mixit.core.run import MetricsLog, Run
from mixit.core.tasks import IGNORE, Batch, Task, check_batch
from mixit.core.training.convergence import Convergence, Selection
from mixit.core.training.evaluate import evaluate
from mixit.core.training.optim import build_optimizer
from mixit.core.training.step import StepParts, accumulated_step
from mixit.distributed import Dist, all_sum, barrier, broadcast, check_identical, env_world, setup, split, teardown
from mixit.errors import FAULTS, UsageError, faults_refused, faults_said
from mixit.runtime import fast_bf16, resolve_device

KeepCheckpoints = Literal["latest", "all", "log"]
"""Which checkpoints a run keeps (module docstring)."""

KEEP_CHECKPOINTS: tuple[str, ...] = get_args(KeepCheckpoints)

ACCURACIES = ("exact_match", "accuracy", "token_acc")
"""The accuracies a person reads first, in order of preference (the progress bar shows the first on the test set)."""

LOG_POINTS = 20
"""How many log-spaced steps `keep_checkpoints="log"` aims at (fewer on short runs, where they round together)."""


def log_spaced_steps(steps: int, points: int = LOG_POINTS) -> list[int]:
    """`points` steps from 1 to `steps`, evenly spaced on a log scale (step = steps ** (i / (points - 1))),
    rounded to integers, without repeats: log_spaced_steps(1000) = [1, 2, 3, 4, 6, 9, 13, 18, 26, 38, 55, 78,
    113, 162, 234, 336, 483, 695, 1000]."""
    if steps < 1:
        return []
    return sorted({round(steps ** (i / (points - 1))) for i in range(points)} | {steps})


class Feed(Protocol):
    """The tracking sinks of one session, as the loop sees them: fed each record of metrics.jsonl, then the summary
    (None: the session stopped before the run was done)."""

    def write(self, event: dict[str, Any]) -> None: ...

    def close(self, summary: dict[str, Any] | None) -> None: ...


OpenFeed = Callable[[Run, Sequence[dict[str, Any]]], Feed]
"""Opens a session's `Feed` on the locked run, given the events its metrics.jsonl keeps (rank 0 only)."""


class Tracker(Protocol):
    """What `train` asks of its `tracking` (`mixit.tracking.Tracking` is one): a check before any work that returns
    how to open the session's sinks. The protocol lives here so that the loop imports nothing above the core."""

    def feeder(self, run_dir: Path, cfg: RunConfig, resume: bool) -> OpenFeed | None:
        """Refuse, with a `UsageError` in one line, sinks that cannot work for the run in `run_dir` (`resume`: an
        existing one); None if the session has no sink, else how to open them."""


def train(
    cfg: RunConfig,
    run_dir: str | Path,
    device: str = "auto",
    resume: bool = False,
    progress: bool = True,
    compile: bool = False,
    allow_slow_dtype: bool = False,
    on_step: Callable[[int, float], None] | None = None,
    keep_checkpoints: KeepCheckpoints = "latest",
    tracking: Tracker | None = None,
) -> dict[str, Any]:
    """Train `cfg` into `run_dir` and return the summary (also written to summary.json).

    Under torchrun, every process calls this with the same arguments; rank 0 writes the run directory.
    Why so many parameters: besides the config and the directory, they are the session's own options
    (``mixit train``'s flags that change no result), each one flag (tracking: three). Why so long: each is
    documented here, as its flag's --help.

    Args:
        cfg: The run's configuration (`mixit.run_config` or `mixit.core.experiment.resolve`).
        run_dir: The run directory; a new run needs it absent or empty.
        device: Where to train: auto (cuda if available, else cpu), cpu, cuda or cuda:N; under torchrun each
            process takes its own GPU.
        resume: Continue the run in the run directory (--out) from its last checkpoint; its config must be
            the run's own.
        progress: Show a progress bar.
        compile: Compile the training forward pass with torch.compile; evaluation and checkpoints use the same
            weights.
        allow_slow_dtype: Accept bf16 on a CPU without fast bf16 matrix products, where it is many times
            slower than fp32.
        on_step: Called as on_step(step, loss) after each optimizer step (steps count from 1), on rank 0.
        keep_checkpoints: Which checkpoints to keep: latest (only the newest), all (every one written, one
            every checkpoint_every steps), or log (also about 20 log-spaced steps, for `mixit analyze
            --over-time`).
        tracking: Where the metrics go besides metrics.jsonl: `mixit.tracking.Tracking` (``mixit train``'s
            --logger, --tracking-project and --tracking-name), whose sinks include those a resumed run remembers.
            None sends nothing anywhere else, not even to the sinks a resumed run remembers: they keep what they
            hold, and a later session given a Tracking, or ``mixit export-logs``, sends them what they lack.
    """
    if keep_checkpoints not in KEEP_CHECKPOINTS:
        raise UsageError(f"keep_checkpoints must be one of {', '.join(KEEP_CHECKPOINTS)}, got {keep_checkpoints!r}")
    run_dir = Path(run_dir)
    feed = tracking.feeder(run_dir, cfg, resume) if tracking is not None else None
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
        run, per_rank, (task, model, report) = _checked(cfg, run_dir, resume, dist, dev)
        # The run stays locked until the session ends; a fault of the machine met from now on (a full disk) is a
        # `MachineFault` that says how to continue the run.
        command = f"mixit train --resume --out {shlex.quote(str(run_dir))}"
        try:
            with faults_said(run_dir, f"`{command}` continues the run from its last checkpoint"):
                if dist.main and run is None:
                    run = Run.create(run_dir, cfg)  # created and locked; a fault here is a refusal, nothing left
                    task.save_artifacts(run.path)
                check_identical(model, dist)
                optimizer = build_optimizer(model, cfg.train, dev)
                precision = Precision(cfg.train.dtype, dev)
                tr = Training(cfg, task, model, report, optimizer, precision, dist, dev, run_dir, per_rank)
                summary = train_session(
                    tr,
                    run,
                    resume=resume,
                    progress=progress and dist.main,
                    compile=compile,
                    on_step=on_step,
                    keep_checkpoints=keep_checkpoints,
                    feed=feed,
                )
        finally:
            if run is not None:
                run.release()
        barrier(dist)  # only a finished job: after an error another rank may never arrive
        return summary
    finally:
        teardown(dist)


def _checked(
    cfg: RunConfig, run_dir: Path, resume: bool, dist: Dist, dev: torch.device
) -> tuple[Run | None, int, tuple[Task, Transformer, FreezeReport]]:
    """Every check before anything is written (rank 0's verdict is every rank's): the run directory (locked
    and returned on rank 0 when resuming), the memory, the task's data and the model's forward pass on it.
    Returns the run, the examples per process and micro-batch, and the built task, model and freeze report."""
    tc = cfg.train
    run: Run | None = None
    refusal: str | None = None
    try:
        with faults_refused(run_dir):  # a fault of the machine found by a check is a refusal too
            per_rank = split(tc.batch_size, dist, tc.grad_accum)
            if dist.main:
                if resume:
                    run = Run.open(run_dir)
                    run.acquire(stamp=False)  # before anything is read: one process per run; nothing written yet
                    run.check_same(cfg)
                else:
                    Run.check_new(run_dir)
            check_memory(
                "this run",
                training_parts(cfg.model, per_rank, tc.eval_batch_size, cfg.test_size),
                dev,
                "lower batch_size, eval_batch_size, test_size or the model's size, or raise grad_accum",
            )
            # A resumed run's model comes from its latest checkpoint, unless it was stopped before the first.
            fresh = not resume or Run(run_dir).latest_checkpoint() is None
            built = build(cfg, run_dir if resume else None, fresh)
            task, model = built[0], built[1]  # a task whose data the model cannot read is refused before any write
            first = task.train_batch(0, tc.batch_size)
            check_batch(task, first, cfg.model)
            tried(model.to(dev), first, dev)
    except UsageError as e:
        refusal = str(e)
    except BaseException:
        if run is not None:
            run.release()
        raise
    refusal = broadcast(refusal, dist)
    if refusal is not None:
        if run is not None:
            run.release()
        raise UsageError(refusal)
    return run, per_rank, built


def tried(model: Transformer, batch: Batch, dev: torch.device) -> None:
    """The model's forward pass on the first example of `batch`, before anything is written: an attention kind or
    task of one's own that fails on the run's data fails here with its own traceback, leaving no run directory
    behind. On `dev`, where the model is, without gradients, and drawing nothing from the random number
    generators, so the run is unchanged."""
    try:
        with torch.no_grad(), torch.random.fork_rng(devices=[dev] if dev.type == "cuda" else []):
            model(batch.inputs[:1].to(dev))
    except Exception as e:
        e.add_note("mixit: the model failed on the task's first training example, before the run was written")
        raise


@dataclass(frozen=True)
class Training:
    """What one process trains, built once and handed to every part of its session: the config, the task, the
    model and its freeze report, the optimizer and precision that train it, and where it runs (the job, the device
    and the run directory)."""

    cfg: RunConfig
    task: Task
    model: Transformer
    report: FreezeReport
    optimizer: torch.optim.Optimizer
    precision: Precision
    dist: Dist
    device: torch.device
    run_dir: Path
    """Rank 0 writes it; the others name it in the summary."""
    per_rank: int
    """Examples per process and micro-batch."""


@dataclass(frozen=True)
class Curve:
    """The validation set and what is read off the curve of its metrics: the convergence criterion (early
    stopping) and the selected evaluation (summary.json's ``selected``)."""

    val_batch: Batch
    conv: Convergence
    selected: Selection


@dataclass(frozen=True)
class Logs:
    """Where the session's events go: metrics.jsonl, then the tracking sinks' `Feed`; rank 0 holds them, the other
    ranks neither."""

    metrics: MetricsLog | None = None
    feed: Feed | None = None

    def write(self, event: dict[str, Any]) -> None:
        """Append `event` to metrics.jsonl, then feed the record to the tracking sinks."""
        if self.metrics is not None:
            self.metrics.write(event)
        if self.feed is not None:
            self.feed.write(event)

    def close(self, summary: dict[str, Any] | None) -> None:
        """Close metrics.jsonl and end the session in the tracking sinks, with the run's summary if it has one."""
        if self.metrics is not None:
            self.metrics.close()
        if self.feed is not None:
            self.feed.close(summary)


def train_session(
    tr: Training,
    run: Run | None,
    *,
    resume: bool,
    progress: bool,
    compile: bool,
    on_step: Callable[[int, float], None] | None,
    keep_checkpoints: KeepCheckpoints,
    feed: OpenFeed | None,
) -> dict[str, Any]:
    """One process's training session, top to bottom: restore the latest checkpoint (on resume), evaluate where
    the curve starts, then each optimizer step and what its number calls for (a train log line, an evaluation, a
    checkpoint) until the step budget or early stopping; then the summary, written to summary.json.

    `run` is the locked run directory on rank 0, None on the others (which read checkpoints, never write); the
    other arguments are `train`'s (`progress`: rank 0's). A new run holds nothing yet: the checkpoint, summary and
    metrics read from `run` below are a resumed run's."""
    tc, dist, dev, model = tr.cfg.train, tr.dist, tr.device, tr.model
    _, eval_every, log_every, checkpoint_every = tc.cadence
    start = restore(tr, run)
    done_before = broadcast(run.summary() if run is not None else None, dist)
    if done_before is not None and (start >= tc.steps or done_before.get("convergence", {}).get("stopped_early")):
        return done_before  # nothing left to train: every step done, or stopped early

    # The validation curve goes on from the evaluations of metrics.jsonl, read (and a damaged file refused) before
    # anything of a resumed run is changed; rank 0's: the other ranks follow its decisions.
    earlier = run.metrics() if run is not None and resume else []
    curve = Curve(
        tr.task.val_batch(),
        Convergence(*tr.task.selection, tc.patience, tc.min_delta, earliest=tc.steps // 2, stop_at=tc.stop_at),
        Selection(*tr.task.selection),
    )
    curve.conv.extend(earlier, up_to=start)
    curve.selected.extend(earlier, up_to=start)

    # Rank 0 opens the logs: metrics.jsonl (on resume, cut back to step `start`) and the tracking sinks.
    logs = Logs()
    if run is not None:
        if resume:
            run.begin()  # the first change to a resumed run: every check has passed
        metrics = run.open_metrics(resume_step=start if resume else None)
        kept = run.metrics()
        logs = Logs(metrics, feed(run, kept) if feed is not None else None)
        if not any(e.get("event") == "freeze" for e in kept):
            logs.write({"step": 0, "event": "freeze", **tr.report.to_dict()})  # once per run

    # Early stopping (rank 0 decides): a run killed just after early stopping stopped it is stopped already.
    stopped = bool(broadcast(tc.early_stop and curve.conv.should_stop, dist))

    test: dict[str, float] = {}
    val: dict[str, float] = {}
    try:
        if broadcast(start == 0 and not curve.conv.history, dist):  # logged once: a run resumed at 0 may have it
            test, val = evaluation(tr, curve, logs, 0)
        # The forward pass: under torchrun, DistributedDataParallel's (it sums the gradients of the processes and,
        # through no_sync, skips that for every micro-batch but the last); compiled if asked.
        ddp: DistributedDataParallel | None = None
        if dist.active:
            ddp = DistributedDataParallel(model, device_ids=[dev] if dev.type == "cuda" else None)
        forward = ddp if ddp is not None else model
        parts = StepParts(
            torch.compile(forward) if compile else forward,
            tr.optimizer,
            [p for p in model.parameters() if p.requires_grad],
            tc.grad_clip,
            tr.precision,
            dist.world_size,
            ddp.no_sync if ddp is not None else None,
        )
        log_steps = set(log_spaced_steps(tc.steps)) if keep_checkpoints == "log" else set()
        # The bar redraws at most every 10 s when stderr is a log file rather than a terminal.
        with tqdm(
            total=tc.steps,
            initial=start,
            disable=not progress,
            desc=f"{tr.cfg.task}/{tr.cfg.variant}",
            dynamic_ncols=True,
            mininterval=0.1 if sys.stderr.isatty() else 10.0,
        ) as bar:
            trained, train_time, t0 = start, 0.0, time.perf_counter()
            model.train()
            for step in range(start, tc.steps):
                if stopped:
                    break
                # This process's micro-batches: rank r takes examples [r * span, (r + 1) * span) of the global
                # batch, so the examples of a step do not depend on how many processes share it.
                batch = tr.task.train_batch(step, tc.batch_size)
                span = tr.per_rank * tc.grad_accum
                mine = batch[dist.rank * span : (dist.rank + 1) * span]
                micro = [mine[i : i + tr.per_rank] for i in range(0, span, tr.per_rank)]
                scored = int((batch.targets != IGNORE).sum())  # of the whole global batch
                lr = tc.lr_at(step)
                for group in tr.optimizer.param_groups:
                    group["lr"] = lr
                tick = time.perf_counter()
                share = accumulated_step(parts, [(b.inputs.to(dev), b.targets.to(dev)) for b in micro], scored)
                train_time += time.perf_counter() - tick
                done = step + 1

                if done % log_every == 0 or done == tc.steps:
                    loss = all_sum(share.item(), dist, dev)  # the global batch's mean
                    elapsed = round(time.perf_counter() - t0, 3)
                    logs.write({"step": done, "event": "train", "loss": loss, "lr": lr, "elapsed_s": elapsed})
                    accuracy = next((test[k] for k in ACCURACIES if k in test), float("nan"))
                    bar.set_postfix(loss=f"{loss:.4f}", **({"test": f"{accuracy:.3f}"} if test else {}))
                if done % eval_every == 0 or done == tc.steps:
                    test, val = evaluation(tr, curve, logs, done)
                    stopped = bool(broadcast(tc.early_stop and curve.conv.should_stop, dist))
                # Which checkpoints are written and kept: the module docstring's `keep_checkpoints`.
                logged = done in log_steps
                if run is not None and (done % checkpoint_every == 0 or done == tc.steps or stopped or logged):
                    keep = keep_checkpoints == "all" or logged or (keep_checkpoints == "log" and stopped)
                    save_checkpoint(run.checkpoints_dir, done, model, tr.optimizer, tr.precision, keep)
                trained = done
                bar.update(1)
                if on_step is not None and dist.main:
                    on_step(done, share.item())

        if not test:  # resumed from the final checkpoint of a run killed before its summary
            test, val = evaluate_model(tr), evaluate_model(tr, curve.val_batch)
        resumed_from = start if resume else None
        summary = session_summary(tr, curve, test, val, resumed_from, trained, train_time, time.perf_counter() - t0)
        if run is not None:
            run.write_summary(summary)
    except BaseException:
        with contextlib.suppress(*FAULTS):  # closing may fail as the session did (a full disk): that is said once
            logs.close(None)  # the session ends without a summary; the sinks' run goes on when it is resumed
        raise
    logs.close(summary)
    return summary


def restore(tr: Training, run: Run | None) -> int:
    """Load the latest checkpoint into the model and the optimizer (rank 0 finds it in `run`, every rank loads it)
    and return its step; 0 for a new run, and for a run killed before its first checkpoint."""
    found = run.latest_checkpoint() if run is not None else None
    latest = broadcast(str(found) if found is not None else None, tr.dist)
    if latest is None:
        return 0
    load_model_state(tr.model, Path(latest))
    return load_training_state(tr.optimizer, Path(latest), tr.precision)


def evaluate_model(tr: Training, batch: Batch | None = None) -> dict[str, float]:
    """Metrics on `batch` (default: the test set), every process evaluating its share."""
    return evaluate(
        tr.model, tr.task, tr.device, tr.cfg.train.eval_batch_size, batch=batch, dist=tr.dist, precision=tr.precision
    )


def evaluation(tr: Training, curve: Curve, logs: Logs, step: int) -> tuple[dict[str, float], dict[str, float]]:
    """The test and validation metrics at `step`, added to the curve and logged."""
    test = evaluate_model(tr)
    val = evaluate_model(tr, curve.val_batch)
    curve.conv.add(step, val[curve.conv.metric])
    curve.selected.add(step, test, val)
    logs.write({"step": step, "event": "eval", **test, **{f"val_{k}": v for k, v in val.items()}})
    return test, val


def session_summary(
    tr: Training,
    curve: Curve,
    test: dict[str, float],
    val: dict[str, float],
    resumed_from: int | None,
    trained: int,
    train_time: float,
    wall_time: float,
) -> dict[str, Any]:
    """summary.json: the latest evaluation, what the curve selected and says of convergence, the step a resumed
    session started from and the steps trained by its end, and the seconds it spent training and in all."""
    tc, report = tr.cfg.train, tr.report
    return {
        "task": tr.task.describe(),
        "variant": tr.cfg.variant,
        "steps": tc.steps,
        "resumed_from": resumed_from,
        "test": test,
        "val": val,
        "selected": curve.selected.summary(),
        "convergence": curve.conv.summary(stopped_early=trained < tc.steps, steps_trained=trained),
        "n_params": report.n_trainable + report.n_frozen,
        "n_trainable": report.n_trainable,
        "train_seconds_this_session": round(train_time, 2),
        "wall_seconds_this_session": round(wall_time, 2),
        "device": str(tr.device),
        "world_size": tr.dist.world_size,
        "run_dir": str(tr.run_dir),
    }
