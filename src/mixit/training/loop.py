"""The training loop (`train`): AdamW on the trainable parameters, warmup and
decay schedule, gradient clipping, evaluation on the validation and test sets
(before training and periodically), the convergence criterion on the
validation curve and optional early stopping on it (`mixit.training.convergence`),
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
`mixit.run.Run` only.

Where the metrics go besides metrics.jsonl is a choice of the session too: `logger`, any of the
tracking sinks of `mixit.tracking` (docs/tracking.md), each fed every event of metrics.jsonl and the
summary, from rank 0.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, get_args

import torch
from torch.nn.parallel import DistributedDataParallel
from tqdm.auto import tqdm

from mixit.distributed import Dist, all_sum, broadcast, check_identical, env_world, setup, split, teardown
from mixit.errors import UsageError
from mixit.experiment import RunConfig, build
from mixit.freezing import FreezeReport
from mixit.models import Transformer
from mixit.precision import Precision
from mixit.resources import check_memory, training_parts
from mixit.run import MetricsLog, Run
from mixit.runtime import fast_bf16, resolve_device
from mixit.tasks import IGNORE, Batch, Task
from mixit.tracking import Grouping, Naming, Sink, Tracker, check_sinks, run_grouping
from mixit.training.convergence import Convergence, Selection
from mixit.training.evaluate import evaluate
from mixit.training.optim import build_optimizer
from mixit.training.step import StepParts, accumulated_step

KeepCheckpoints = Literal["latest", "all", "log"]
"""Which checkpoints a run keeps (module docstring)."""

KEEP_CHECKPOINTS: tuple[str, ...] = get_args(KeepCheckpoints)

LOG_POINTS = 20
"""How many log-spaced steps `keep_checkpoints="log"` aims at (fewer on short runs, where they round together)."""


def log_spaced_steps(steps: int, points: int = LOG_POINTS) -> list[int]:
    """`points` steps from 1 to `steps`, evenly spaced on a log scale (step = steps ** (i / (points - 1))),
    rounded to integers, without repeats: log_spaced_steps(1000) = [1, 2, 3, 4, 6, 9, 13, 18, 26, 38, 55, 78,
    113, 162, 234, 336, 483, 695, 1000]."""
    if steps < 1:
        return []
    return sorted({round(steps ** (i / (points - 1))) for i in range(points)} | {steps})


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
    logger: Sequence[Sink] = (),
    tracking_project: str | None = None,
    tracking_name: str | None = None,
    grouping: Grouping | None = None,
) -> dict[str, Any]:
    """Train `cfg` into `run_dir` and return the summary (also written to summary.json).

    Under torchrun, every process calls this with the same arguments; rank 0 writes the run directory.
    Why so many parameters: besides the config and the directory, they are the session's own options
    (``mixit train``'s flags that change no result), each one flag. Why so long: each is documented here, as
    its flag's --help.

    Args:
        cfg: The run's configuration (`mixit.run_config` or `mixit.experiment.resolve`).
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
        logger: Tracking sinks that receive every event of metrics.jsonl and the summary as well, any of
            tensorboard, wandb, mlflow and trackio (docs/tracking.md); a resumed run continues its runs there.
        tracking_project: The W&B project, MLflow experiment and trackio project of the run (TensorBoard has
            none); null means WANDB_PROJECT for W&B and MLFLOW_EXPERIMENT_NAME for MLflow if set, else mixit.
        tracking_name: The run's name in the tracking sinks (TensorBoard names a run by its directory); null
            means its directory's name.
        grouping: How the sinks name, group and tag the run (`mixit.tracking.Grouping`); by default as the two
            options above say, tagged with its task, variant and seed. A study sets it (and not those) for its runs.
    """
    if keep_checkpoints not in KEEP_CHECKPOINTS:
        raise UsageError(f"keep_checkpoints must be one of {', '.join(KEEP_CHECKPOINTS)}, got {keep_checkpoints!r}")
    naming = Naming(tracking_project, tracking_name)
    grouping = grouping or run_grouping(run_dir, cfg, naming)
    sinks = check_sinks(logger, run_dir=run_dir if resume else None)
    naming.check_sent(sinks)
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
        launch = Launch(
            Path(run_dir), resume, progress and dist.main, compile, on_step, keep_checkpoints, sinks, grouping
        )
        return _train(cfg, launch, dist, dev)
    finally:
        teardown(dist)


@dataclass(frozen=True)
class Launch:
    """How `train` was asked to run, apart from the configuration."""

    run_dir: Path
    resume: bool
    """Continue the run in run_dir from its last checkpoint."""
    progress: bool
    """Show a progress bar (rank 0 only)."""
    compile: bool
    """torch.compile the training forward pass."""
    on_step: Callable[[int, float], None] | None
    """Called as on_step(step, loss) after each optimizer step, on rank 0."""
    keep_checkpoints: KeepCheckpoints = "latest"
    """Which checkpoints to keep (module docstring)."""
    logger: tuple[Sink, ...] = ()
    """The tracking sinks that receive the metrics too (`mixit.tracking`), on rank 0."""
    grouping: Grouping | None = None
    """How the sinks name, group and tag the run (`train` sets it: `mixit.tracking.run_grouping` by default)."""

    def checkpoint_at(self, step: int, steps: int, every: int, last: bool) -> tuple[bool, bool]:
        """Whether to write a checkpoint after step `step` of `steps` (checkpoint_every `every`; `last`: the
        run stops here), and whether to keep it."""
        logged = self.keep_checkpoints == "log" and step in log_spaced_steps(steps)
        write = step % every == 0 or step == steps or last or logged
        keep = self.keep_checkpoints == "all" or logged or (self.keep_checkpoints == "log" and last)
        return write, write and keep


def _train(cfg: RunConfig, launch: Launch, dist: Dist, dev: torch.device) -> dict[str, Any]:
    """Check everything, then create (or reopen) the run directory and train; the run stays locked meanwhile."""
    run, per_rank, (task, model, report) = _checked(cfg, launch, dist, dev)
    try:
        if dist.main and run is None:
            run = Run.create(launch.run_dir, cfg)  # created and locked
            task.save_artifacts(run.path)
        session = Session(cfg, launch, run, task, model, report, dist, dev, per_rank)
        return session.train()
    finally:
        if run is not None:
            run.release()


def _checked(
    cfg: RunConfig, launch: Launch, dist: Dist, dev: torch.device
) -> tuple[Run | None, int, tuple[Task, Transformer, FreezeReport]]:
    """Every check before anything is written (rank 0's verdict is every rank's): the run directory (locked
    and returned on rank 0 when resuming), the memory, the task's data. Returns the run, the examples per
    process and micro-batch, and the built task, model and freeze report."""
    tc = cfg.train
    run: Run | None = None
    refusal: str | None = None
    try:
        per_rank = split(tc.batch_size, dist, tc.grad_accum)
        if dist.main:
            run = Run.open(launch.run_dir) if launch.resume else None
            if run is not None:
                run.acquire(stamp=False)  # before anything is read: one process per run; nothing written yet
                run.check_same(cfg)
            else:
                Run.check_new(launch.run_dir)
        check_memory(
            "this run",
            training_parts(cfg.model, per_rank, tc.eval_batch_size, cfg.test_size),
            dev,
            "lower batch_size, eval_batch_size, test_size or the model's size, or raise grad_accum",
        )
        built = build(cfg, launch.run_dir if launch.resume else None)
        built[0].train_batch(0, tc.batch_size)  # a task that cannot make training data is refused before any write
    except UsageError as e:
        refusal = str(e)
    refusal = broadcast(refusal, dist)
    if refusal is not None:
        if run is not None:
            run.release()
        raise UsageError(refusal)
    return run, per_rank, built


@dataclass
class Session:
    """One process's training session: what the restore, the step loop, the evaluations and the summary share.

    `run` is the locked run directory on rank 0, None on the others (which read checkpoints, never write).
    """

    cfg: RunConfig
    launch: Launch
    run: Run | None
    task: Task
    model: Transformer
    report: FreezeReport
    dist: Dist
    device: torch.device
    per_rank: int
    """Examples per process and micro-batch."""
    optimizer: torch.optim.Optimizer = field(init=False)
    precision: Precision = field(init=False)
    start: int = 0
    """The step this session starts from (that of the checkpoint it resumed, else 0)."""
    val_batch: Batch = field(init=False)
    conv: Convergence = field(init=False)
    selected: Selection = field(init=False)
    """The evaluation with the best validation metric so far, and its test metrics (summary.json's ``selected``)."""
    log: MetricsLog | None = None
    tracker: Tracker | None = None
    """The tracking sinks, on rank 0 when `logger` names any."""
    test: dict[str, float] = field(default_factory=dict)
    """The latest test metrics (empty until the first evaluation of this session)."""
    val: dict[str, float] = field(default_factory=dict)
    stopped: bool = False
    """Early stopping has stopped the run (every rank alike)."""
    trained: int = 0
    """Steps trained so far, counting those before a resume."""
    train_time: float = 0.0
    t0: float = field(default_factory=time.perf_counter)

    def train(self) -> dict[str, Any]:
        """Restore, evaluate where the curve starts, train, and return the summary."""
        done_before = self.restore()
        if done_before is not None:
            return done_before
        self.open_curve()
        try:
            # Where the curve starts, logged once (a run resumed at step 0 may have it already); rank 0 decides.
            if broadcast(self.start == 0 and not self.conv.history, self.dist):
                self.evaluation(0)
            self.step_loop()
            if not self.test:  # resumed from the final checkpoint of a run killed before its summary
                self.test = self.evaluate()
                self.val = self.evaluate(self.val_batch)
            summary = self.summary()
        except BaseException:
            self.close_logs(None)
            raise
        self.close_logs(summary)
        return summary

    def restore(self) -> dict[str, Any] | None:
        """Place the model, build the optimizer, and on resume load the latest checkpoint; return the run's
        summary if it has nothing left to train (every step done, or stopped early), else None."""
        tc, dist = self.cfg.train, self.dist
        self.model.to(self.device)
        check_identical(self.model, dist)
        self.optimizer = build_optimizer(self.model, tc, self.device)
        self.precision = Precision(tc.dtype, self.device)
        reader = self.run if self.run is not None else Run(self.launch.run_dir)
        found = reader.latest_checkpoint() if self.launch.resume and dist.main else None
        # A run killed before its first checkpoint resumes from step 0.
        last = broadcast(str(found) if found is not None else None, dist)
        if last is not None:
            reader.load_model_state(self.model, Path(last))
            self.start = reader.load_training_state(self.optimizer, Path(last), self.precision)
        self.trained = self.start
        done_before = broadcast(self.run.summary() if self.launch.resume and self.run is not None else None, dist)
        if done_before is not None and (
            self.start >= tc.steps or done_before.get("convergence", {}).get("stopped_early")
        ):
            return done_before
        return None

    def open_curve(self) -> None:
        """The validation set, the convergence criterion (with the curve so far on resume), and on rank 0 the
        metrics log (its freeze event written once per run)."""
        tc, run = self.cfg.train, self.run
        self.val_batch = self.task.val_batch()
        self.conv = Convergence(
            *self.task.selection, tc.patience, tc.min_delta, earliest=tc.steps // 2, stop_at=tc.stop_at
        )
        self.selected = Selection(*self.task.selection)
        if run is not None and self.launch.resume:
            earlier = run.metrics()
            self.conv.extend(earlier, up_to=self.start)
            self.selected.extend(earlier, up_to=self.start)
            run.begin()  # every check has passed: the first change to the resumed run
        if run is not None:
            self.log = run.open_metrics(resume_step=self.start if self.launch.resume else None)
            kept = run.metrics()
            if self.launch.logger:
                grouping = self.launch.grouping or run_grouping(run.path, self.cfg)
                self.tracker = Tracker.open(run, self.launch.logger, grouping, kept)
            if not any(e.get("event") == "freeze" for e in kept):
                self.record({"step": 0, "event": "freeze", **self.report.to_dict()})
        self.stopped = bool(broadcast(tc.early_stop and self.conv.should_stop, self.dist))  # killed just after stopping

    def record(self, event: dict[str, Any]) -> None:
        """Append `event` to metrics.jsonl, then send it to the tracking sinks (rank 0; the others hold neither)."""
        if self.log is not None:
            self.log.write(event)
        if self.tracker is not None:
            self.tracker.write(event)

    def close_logs(self, summary: dict[str, Any] | None) -> None:
        """Close metrics.jsonl and end the session in the tracking sinks, with the run's summary if it has one."""
        if self.log is not None:
            self.log.close()
        if self.tracker is not None:
            self.tracker.close(summary)

    def evaluate(self, batch: Batch | None = None) -> dict[str, float]:
        """Metrics on `batch` (default: the test set), every process evaluating its share."""
        tc = self.cfg.train
        return evaluate(
            self.model,
            self.task,
            self.device,
            tc.eval_batch_size,
            batch=batch,
            dist=self.dist,
            precision=self.precision,
        )

    def evaluation(self, step: int) -> bool:
        """Test and validation metrics at `step`, kept and logged; returns whether early stopping stops here
        (every rank alike)."""
        self.test = self.evaluate()
        self.val = self.evaluate(self.val_batch)
        self.conv.add(step, self.val[self.conv.metric])
        self.selected.add(step, self.test, self.val)
        self.record({"step": step, "event": "eval", **self.test, **{f"val_{k}": v for k, v in self.val.items()}})
        return bool(broadcast(self.cfg.train.early_stop and self.conv.should_stop, self.dist))

    def step_parts(self) -> StepParts:
        """The forward pass (wrapped in DistributedDataParallel under torchrun, compiled if asked) and the rest
        of what each optimizer step uses."""
        trainable = [p for p in self.model.parameters() if p.requires_grad]
        ddp = None
        if self.dist.active:
            ddp = DistributedDataParallel(self.model, device_ids=[self.device] if self.device.type == "cuda" else None)
        forward: Callable[[torch.Tensor], torch.Tensor] = ddp if ddp is not None else self.model
        forward = torch.compile(forward) if self.launch.compile else forward
        no_sync = ddp.no_sync if ddp is not None else None
        tc = self.cfg.train
        return StepParts(
            forward, self.optimizer, trainable, tc.grad_clip, self.precision, self.dist.world_size, no_sync
        )

    def step_loop(self) -> None:
        """Train from `start` to the step budget, or until early stopping stops the run."""
        tc = self.cfg.train
        parts = self.step_parts()
        # Redraw at most every 10 s when stderr is a log file rather than a terminal.
        bar = tqdm(
            total=tc.steps,
            initial=self.start,
            disable=not self.launch.progress,
            desc=f"{self.cfg.task}/{self.cfg.variant}",
            dynamic_ncols=True,
            mininterval=0.1 if sys.stderr.isatty() else 10.0,
        )
        self.t0 = time.perf_counter()
        self.model.train()
        try:
            for step in range(self.start, tc.steps):
                if self.stopped:
                    break
                self.one_step(step, parts, bar)
        finally:
            bar.close()

    def one_step(self, step: int, parts: StepParts, bar: tqdm) -> None:
        """Optimizer step `step` (counting from 0), then what its number calls for: a train log line, an
        evaluation, a checkpoint."""
        tc, dev = self.cfg.train, self.device
        _, eval_every, log_every, checkpoint_every = tc.cadence
        micro, scored = slices(self.task.train_batch(step, tc.batch_size), self.dist, self.per_rank, tc.grad_accum)
        lr = tc.lr_at(step)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        tick = time.perf_counter()
        share = accumulated_step(parts, [(b.inputs.to(dev), b.targets.to(dev)) for b in micro], scored)
        self.train_time += time.perf_counter() - tick
        done = step + 1
        if done % log_every == 0 or done == tc.steps:
            self.log_train(done, all_sum(share.item(), self.dist, dev), lr, bar)
        if done % eval_every == 0 or done == tc.steps:
            self.stopped = self.evaluation(done)
        write, keep = self.launch.checkpoint_at(done, tc.steps, checkpoint_every, self.stopped)
        if self.run is not None and write:
            self.run.save_checkpoint(done, self.model, self.optimizer, self.precision, keep)
        self.trained = done
        bar.update(1)
        if self.launch.on_step is not None and self.dist.main:
            self.launch.on_step(done, share.item())

    def log_train(self, step: int, loss: float, lr: float, bar: tqdm) -> None:
        """The train event of `step` (loss: the global batch's mean), and the progress bar's loss and test metric."""
        elapsed = round(time.perf_counter() - self.t0, 3)
        self.record({"step": step, "event": "train", "loss": loss, "lr": lr, "elapsed_s": elapsed})
        bar.set_postfix(loss=f"{loss:.4f}", **({"test": f"{headline(self.test):.3f}"} if self.test else {}))

    def summary(self) -> dict[str, Any]:
        """The session's summary, written to summary.json on rank 0."""
        tc, report = self.cfg.train, self.report
        summary = {
            "task": self.task.describe(),
            "variant": self.cfg.variant,
            "steps": tc.steps,
            "resumed_from": self.start if self.launch.resume else None,
            "test": self.test,
            "val": self.val,
            "selected": self.selected.summary(),
            "convergence": self.conv.summary(stopped_early=self.trained < tc.steps, steps_trained=self.trained),
            "n_params": report.n_trainable + report.n_frozen,
            "n_trainable": report.n_trainable,
            "train_seconds_this_session": round(self.train_time, 2),
            "wall_seconds_this_session": round(time.perf_counter() - self.t0, 2),
            "device": str(self.device),
            "world_size": self.dist.world_size,
            "run_dir": str(self.launch.run_dir),
        }
        if self.run is not None:
            self.run.write_summary(summary)
        return summary


def slices(batch: Batch, dist: Dist, per_rank: int, accum: int) -> tuple[list[Batch], int]:
    """This process's micro-batches of global batch `batch`, and the scored positions of the whole
    global batch. Rank r takes examples [r * per_rank * accum, (r + 1) * per_rank * accum), so the
    examples of a step do not depend on how many processes share it."""
    mine = batch[dist.rank * per_rank * accum : (dist.rank + 1) * per_rank * accum]
    micro = [mine[i * per_rank : (i + 1) * per_rank] for i in range(accum)]
    return micro, int((batch.targets != IGNORE).sum())


HEADLINE_METRICS = ("exact_match", "accuracy", "token_acc")
"""The metrics a person reads first, in order of preference (`headline`)."""


def headline(metrics: dict[str, float]) -> float:
    """The metric a person reads first: exact match, accuracy, or token accuracy."""
    for key in HEADLINE_METRICS:
        if key in metrics:
            return metrics[key]
    return float("nan")
