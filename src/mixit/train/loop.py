"""Building a run from its config and training it.

`run_config` fills a RunConfig from a task's defaults and the caller's
overrides; `build` turns it into (task, model, freeze report); `train` runs
the loop: AdamW on the trainable parameters, warmup + cosine schedule,
gradient clipping, periodic test-set evaluation, JSONL metrics, safetensors
checkpoints, and exact resumption (a training batch depends only on
(data_seed, step), so a resumed run sees the batches it would have seen).
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Any, Callable

import torch
from tqdm.auto import tqdm

from mixit.config import ModelConfig, RunConfig, TrainConfig
from mixit.errors import UsageError
from mixit.freezing import FreezeReport, apply_variant, check_attention, get_variant
from mixit.models import Transformer
from mixit.tasks import Task, make_run_task, make_task
from mixit.train import checkpoint as ckpt
from mixit.train.evaluate import evaluate, loss_fn
from mixit.train.optim import build_optimizer, lr_at

MODEL_KEYS = {f.name for f in dataclasses.fields(ModelConfig)} - {"vocab_size"}
TRAIN_KEYS = {f.name for f in dataclasses.fields(TrainConfig)}
RUN_KEYS = {"data_seed", "test_size"}


def run_config(task: str, variant: str = "standard", task_params: dict[str, Any] | None = None,
               **overrides: Any) -> RunConfig:
    """A complete RunConfig for `task` and `variant`.

    Start from ModelConfig/TrainConfig defaults, then the task's own training
    defaults (``Task.default_train``), then `overrides` (any ModelConfig or
    TrainConfig field, data_seed, test_size). The model's vocabulary and n_ctx
    come from the task (n_ctx = the length of what the model reads),
    and its attention kind from the variant unless `attention` is given.
    """
    unknown = sorted(set(overrides) - MODEL_KEYS - TRAIN_KEYS - RUN_KEYS)
    if unknown:
        allowed = ", ".join(sorted(MODEL_KEYS | TRAIN_KEYS | RUN_KEYS))
        raise UsageError(f"unknown option(s) {', '.join(unknown)}; allowed: {allowed}")
    v = get_variant(variant)
    run_kw = {k: overrides[k] for k in RUN_KEYS if k in overrides}
    t = make_task(task, task_params, seed=run_kw.get("data_seed", 0), test_size=run_kw.get("test_size", 4000))
    merged = {**t.default_train, **overrides}
    train_kw = {k: merged[k] for k in TRAIN_KEYS if k in merged}
    steps = train_kw.get("steps", TrainConfig.steps)
    # Defaults that scale with the run's length unless given explicitly.
    train_kw.setdefault("warmup_steps", min(100, steps // 10))
    train_kw.setdefault("eval_every", max(steps // 10, 1))
    train_kw.setdefault("checkpoint_every", max(steps // 4, 1))
    train_kw.setdefault("log_every", max(min(50, steps // 20), 1))
    model_kw = {k: merged[k] for k in MODEL_KEYS if k in merged}
    model_kw.setdefault("attention", v.attention)
    model_kw = {**t.model_defaults(model_kw["attention"]), **model_kw}
    model_kw.setdefault("n_ctx", t.input_len)
    return RunConfig(task=task, variant=variant, model=ModelConfig(vocab_size=t.vocab_size, **model_kw),
                     train=TrainConfig(**train_kw), task_params=t.params(), **run_kw)


def build(cfg: RunConfig, run_dir: str | Path | None = None) -> tuple[Task, Transformer, FreezeReport]:
    """The task, the model (initialised from cfg.model.seed) and the applied variant.

    run_dir: the run's directory, whose saved tokenizer (if any) the task then uses.
    """
    task = make_run_task(cfg.task, cfg.task_params, seed=cfg.data_seed, test_size=cfg.test_size, run_dir=run_dir)
    if cfg.model.vocab_size != task.vocab_size:
        raise UsageError(f"model vocab_size={cfg.model.vocab_size} but task {cfg.task} needs {task.vocab_size}")
    if task.input_len > cfg.model.n_ctx:
        raise UsageError(f"task {task.describe()} feeds sequences of length {task.input_len}, "
                         f"longer than n_ctx={cfg.model.n_ctx}; n_ctx must be >= {task.input_len}")
    variant = get_variant(cfg.variant)
    check_attention(variant, cfg.model.attention)
    model = Transformer(cfg.model)
    report = apply_variant(model, variant)
    return task, model, report


def resolve_device(name: str) -> torch.device:
    """'auto' (cuda if available, else cpu), 'cpu', 'cuda' or 'cuda:N'."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cpu":
        return torch.device("cpu")
    if name == "cuda" or name.startswith("cuda:"):
        if not torch.cuda.is_available():
            raise UsageError(f"device {name!r} requested but no CUDA GPU is available; allowed here: auto, cpu")
        return torch.device(name)
    raise UsageError(f"unknown device {name!r}; allowed: auto, cpu, cuda, cuda:N")


def _config_diff(a: dict, b: dict, prefix: str = "") -> list[str]:
    diffs = []
    for key in sorted(set(a) | set(b)):
        va, vb = a.get(key), b.get(key)
        if isinstance(va, dict) and isinstance(vb, dict):
            diffs += _config_diff(va, vb, f"{prefix}{key}.")
        elif va != vb:
            diffs.append(f"{prefix}{key}: {va!r} != {vb!r}")
    return diffs


def prepare_run_dir(run_dir: Path, cfg: RunConfig, resume: bool) -> None:
    """Check that `run_dir` may receive this run, before any work.

    A new run needs a missing or empty directory; resuming needs the
    directory of the same run. Nothing is written here except config.json for
    a new run.
    """
    if run_dir.exists() and not run_dir.is_dir():
        raise UsageError(f"output path {run_dir} exists and is not a directory")
    has_run = (run_dir / ckpt.CONFIG).exists()
    if resume:
        if not has_run:
            raise UsageError(f"cannot resume: {run_dir} holds no mixit run (no {ckpt.CONFIG})")
        saved = ckpt.load_config(run_dir)
        diffs = _config_diff(saved.to_dict(), cfg.to_dict())
        if diffs:
            raise UsageError(f"{run_dir} holds a different run; differences (saved != requested): "
                             + "; ".join(diffs[:5]))
        return
    if has_run:
        raise UsageError(f"{run_dir} already holds a run; continue it with --resume or choose another output directory")
    if run_dir.exists() and any(run_dir.iterdir()):
        raise UsageError(f"output directory {run_dir} is not empty and holds no mixit run; refusing to write into it")
    run_dir.mkdir(parents=True, exist_ok=True)
    ckpt.save_config(run_dir, cfg)


class MetricsLog:
    """Append-only JSONL metrics file; on resume, drops events after the resumed step."""

    def __init__(self, path: Path, resume_step: int | None = None):
        self.path = path
        if resume_step is not None and path.exists():
            kept = [line for line in path.read_text().splitlines()
                    if line.strip() and json.loads(line)["step"] <= resume_step]
            path.write_text("".join(line + "\n" for line in kept))
        self._file = open(path, "a")

    def write(self, event: dict[str, Any]) -> None:
        self._file.write(json.dumps(event) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


def train_step(model: Callable[[torch.Tensor], torch.Tensor], optimizer: torch.optim.Optimizer,
               inputs: torch.Tensor, targets: torch.Tensor, trainable: list[torch.nn.Parameter],
               grad_clip: float) -> torch.Tensor:
    """One optimizer step: forward, the task loss, backward, global-norm clipping
    (grad_clip > 0), AdamW. `model` maps tokens to logits (a module, a compiled
    module, or a wrapper). Returns the loss tensor without synchronising on it.
    The training loop and `mixit bench` both run exactly this."""
    loss = loss_fn(model(inputs), targets)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    if grad_clip > 0:
        torch.nn.utils.clip_grad_norm_(trainable, grad_clip)
    optimizer.step()
    return loss


def train(cfg: RunConfig, run_dir: str | Path, device: str = "auto", resume: bool = False,
          progress: bool = True, on_step: Callable[[int, float], None] | None = None,
          compile: bool = False) -> dict[str, Any]:
    """Train `cfg` into `run_dir` and return the summary (also written to summary.json).

    on_step(step, loss) is called after each optimizer step (steps count from 1).
    compile: run the training forward pass through torch.compile (evaluation
    and checkpoints use the same weights uncompiled).
    """
    run_dir = Path(run_dir)
    dev = resolve_device(device)
    task, model, report = build(cfg, run_dir if resume else None)
    prepare_run_dir(run_dir, cfg, resume)
    if not resume:
        task.save_artifacts(run_dir)
    tc = cfg.train
    model.to(dev)
    optimizer = build_optimizer(model, tc, dev)
    start = 0
    last = ckpt.latest_checkpoint(run_dir) if resume else None
    if last is not None:
        ckpt.load_model_state(last, model)
        start = ckpt.load_training_state(last, optimizer)
    if resume and (run_dir / ckpt.SUMMARY).exists() and start >= tc.steps:
        return json.loads((run_dir / ckpt.SUMMARY).read_text())

    log = MetricsLog(run_dir / ckpt.METRICS, resume_step=start if resume else None)
    if not resume:
        log.write({"step": 0, "event": "freeze", **report.to_dict()})
    trainable = [p for p in model.parameters() if p.requires_grad]
    forward = torch.compile(model) if compile else model
    # Redraw at most every 10 s when stderr is a log file rather than a terminal.
    bar = tqdm(total=tc.steps, initial=start, disable=not progress, desc=f"{cfg.task}/{cfg.variant}",
               dynamic_ncols=True, mininterval=0.1 if sys.stderr.isatty() else 10.0)
    t0, train_time = time.perf_counter(), 0.0
    metrics: dict[str, float] = {}
    model.train()
    try:
        for step in range(start, tc.steps):
            batch = task.train_batch(step, tc.batch_size).to(dev)
            lr = lr_at(step, tc)
            for group in optimizer.param_groups:
                group["lr"] = lr
            tick = time.perf_counter()
            loss = train_step(forward, optimizer, batch.inputs, batch.targets, trainable, tc.grad_clip)
            train_time += time.perf_counter() - tick
            done = step + 1
            if done % tc.log_every == 0 or done == tc.steps:
                loss_value = loss.item()
                log.write({"step": done, "event": "train", "loss": loss_value, "lr": lr,
                           "elapsed_s": round(time.perf_counter() - t0, 3)})
                bar.set_postfix(loss=f"{loss_value:.4f}", **({"test": f"{_headline(metrics):.3f}"} if metrics else {}))
            if done % tc.eval_every == 0 or done == tc.steps:
                metrics = evaluate(model, task, dev, tc.eval_batch_size)
                log.write({"step": done, "event": "eval", **metrics})
            if done % tc.checkpoint_every == 0 or done == tc.steps:
                ckpt.save_checkpoint(run_dir, done, model, optimizer)
            bar.update(1)
            if on_step is not None:
                on_step(done, loss.item())
    finally:
        bar.close()
        log.close()
    if not metrics:  # resumed from the final checkpoint of a run killed before its summary
        metrics = evaluate(model, task, dev, tc.eval_batch_size)

    summary = {
        "task": task.describe(), "variant": cfg.variant, "steps": tc.steps, "resumed_from": start if resume else None,
        "test": metrics, "n_params": report.n_trainable + report.n_frozen, "n_trainable": report.n_trainable,
        "train_seconds_this_session": round(train_time, 2),
        "wall_seconds_this_session": round(time.perf_counter() - t0, 2), "device": str(dev),
        "run_dir": str(run_dir),
    }
    ckpt.write_json(run_dir / ckpt.SUMMARY, summary)
    return summary


def _headline(metrics: dict[str, float]) -> float:
    for key in ("exact_match", "accuracy", "token_acc"):
        if key in metrics:
            return metrics[key]
    return float("nan")
