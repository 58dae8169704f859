"""The run directory and the one object that owns it: `Run`.

    RUN_DIR/
      .lock                held (flock) by the process training or resuming the run; holds its pid
      config.json          {"config": the RunConfig, "mixit_version", "git_commit"}
      metrics.jsonl        one JSON object per event: the freeze report, training losses, evaluations
      summary.json         final metrics (written when the run completes)
      tokenizer.json       text tasks: the run's own tokenizer
      checkpoints/latest   the name of the newest complete checkpoint directory
      checkpoints/step_0000500/
          model.safetensors       parameters and persistent buffers (MixiT matrices)
          optimizer.safetensors   AdamW moments, flattened
          state.json              step and optimizer hyper-parameters
      analysis/            written by `mixit analyze`

Training, evaluation, analysis, sampling and resumption all go through
`Run`: nothing else knows these names. No pickle anywhere (a checkpoint cannot
carry code). Every file is written atomically; a checkpoint directory is
complete, and flushed to disk, before ``latest`` points at it, so a run
killed mid-write resumes from the previous checkpoint.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import nn

from mixit.errors import UsageError
from mixit.experiment import RunConfig, build, is_record
from mixit.files import DirectoryLock, check_output_dir, read_json, write_json, write_text
from mixit.models import Transformer
from mixit.precision import Precision
from mixit.runtime import resolve_device
from mixit.tasks import Task
from mixit.version import __version__, git_commit

CONFIG = "config.json"
LOCK = DirectoryLock.NAME
METRICS = "metrics.jsonl"
SUMMARY = "summary.json"
CHECKPOINTS = "checkpoints"
LATEST = "latest"
ANALYSIS = "analysis"
STEP_PREFIX = "step_"


def _config_diff(a: dict[str, Any], b: dict[str, Any], prefix: str = "") -> list[str]:
    diffs = []
    for key in sorted(set(a) | set(b)):
        va, vb = a.get(key), b.get(key)
        if isinstance(va, dict) and isinstance(vb, dict):
            diffs += _config_diff(va, vb, f"{prefix}{key}.")
        elif va != vb:
            diffs.append(f"{prefix}{key}: {va!r} != {vb!r}")
    return diffs


def _fsync_dir(path: Path) -> None:
    """Make a rename or a new file inside `path` durable (a no-op where directories cannot be opened)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def load_config_file(path: Path) -> RunConfig:
    """The RunConfig stored in a run's config.json."""
    data = read_json(path, "config.json")
    if not is_record(data):
        raise UsageError(f"{path} is corrupt: no 'config' entry")
    return RunConfig.from_dict(data["config"])


@dataclass
class Loaded:
    """A run's latest checkpoint, loaded: its config, task, model and checkpoint directory."""

    cfg: RunConfig
    task: Task
    model: Transformer
    checkpoint: Path


class Run:
    """One run directory (module docstring): its layout, config, metrics,
    checkpoints and summary, and loading it back.

        run = Run.create("runs/x", cfg)     # a new run: refuses a directory holding anything
        run = Run.open("runs/x")            # an existing run: refuses anything else
        loaded = run.load()                 # config, task and model at the latest checkpoint
    """

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._config: RunConfig | None = None
        self._lock = DirectoryLock(self.path)

    def __repr__(self) -> str:
        return f"Run({str(self.path)!r})"

    # -- layout -----------------------------------------------------------------------
    @property
    def config_path(self) -> Path:
        return self.path / CONFIG

    @property
    def metrics_path(self) -> Path:
        return self.path / METRICS

    @property
    def summary_path(self) -> Path:
        return self.path / SUMMARY

    @property
    def checkpoints_dir(self) -> Path:
        return self.path / CHECKPOINTS

    @property
    def analysis_dir(self) -> Path:
        return self.path / ANALYSIS

    # -- creating and opening ---------------------------------------------------------
    @classmethod
    def check_new(cls, path: str | Path) -> None:
        """Refuse `path` as the directory of a new run unless it is absent or empty (and creatable)."""
        path = Path(path)
        if path.exists() and not path.is_dir():
            raise UsageError(f"output path {path} exists and is not a directory")
        if (path / CONFIG).exists():
            raise UsageError(
                f"{path} already holds a run; continue it with --resume or choose another output directory"
            )
        if path.exists() and any(p.name != LOCK for p in path.iterdir()):
            raise UsageError(f"output directory {path} is not empty and holds no mixit run; refusing to write into it")
        check_output_dir(path)

    @classmethod
    def create(cls, path: str | Path, cfg: RunConfig) -> Run:
        """A new run directory holding `cfg`'s config.json, locked by this process until `release`.

        The directory is created and locked first and checked second, so two
        processes starting a run in one directory cannot both succeed. If the
        check fails, what was created is removed again.
        """
        cls.check_new(path)
        run = cls(path)
        made = not run.path.exists()
        run.path.mkdir(parents=True, exist_ok=True)
        try:
            run.acquire()
            cls.check_new(path)
        except UsageError:
            run.release()
            if made:
                shutil.rmtree(run.path, ignore_errors=True)
            raise
        write_json(run.config_path, {"config": cfg.to_dict(), "mixit_version": __version__, "git_commit": git_commit()})
        run._config = cfg
        return run

    # -- the lock ---------------------------------------------------------------------
    def acquire(self) -> None:
        """Take the run directory's exclusive lock (`mixit.files.DirectoryLock`), or refuse naming the holder."""
        self._lock.acquire()

    def release(self) -> None:
        self._lock.release()

    @classmethod
    def open(cls, path: str | Path) -> Run:
        """An existing run directory (it must hold a readable config.json)."""
        run = cls(path)
        if not run.path.is_dir():
            raise UsageError(f"run directory {run.path} does not exist")
        if not run.config_path.exists():
            raise UsageError(f"{run.path} holds no mixit run (no {CONFIG})")
        run.config  # noqa: B018 -- read and validate now, not at first use
        return run

    @property
    def config(self) -> RunConfig:
        if self._config is None:
            self._config = load_config_file(self.config_path)
        return self._config

    def check_same(self, cfg: RunConfig) -> None:
        """Refuse to continue this run with a config that differs from its own."""
        diffs = _config_diff(self.config.to_dict(), cfg.to_dict())
        if diffs:
            raise UsageError(
                f"{self.path} holds a different run; differences (saved != requested): " + "; ".join(diffs[:5])
            )

    # -- metrics ----------------------------------------------------------------------
    def metrics(self) -> list[dict[str, Any]]:
        """Every event logged so far, in order. A torn last line (a process
        killed while writing it) is skipped with a warning on stderr."""
        if not self.metrics_path.exists():
            return []
        lines = self.metrics_path.read_text().splitlines()
        events = []
        for i, line in enumerate(lines):
            if not line.strip():
                continue
            try:
                events.append(json.loads(line))
            except json.JSONDecodeError:
                if i == len(lines) - 1:
                    print(f"mixit: warning: {self.metrics_path}: ignoring a torn last line", file=sys.stderr)
                    continue
                raise UsageError(f"{self.metrics_path} is corrupt at line {i + 1}") from None
        return events

    def open_metrics(self, resume_step: int | None = None) -> MetricsLog:
        """The metrics log, for appending. With `resume_step`, events after that
        step are dropped first (they belong to steps that will be run again);
        the file is rewritten atomically."""
        if resume_step is not None and self.metrics_path.exists():
            kept = [e for e in self.metrics() if e.get("step", 0) <= resume_step]
            write_text(self.metrics_path, "".join(json.dumps(e) + "\n" for e in kept))
        return MetricsLog(self.metrics_path)

    # -- checkpoints ------------------------------------------------------------------
    def save_checkpoint(
        self, step: int, model: nn.Module, optimizer: torch.optim.Optimizer, precision: Precision | None = None
    ) -> Path:
        """Write checkpoint `step`, point `latest` at it, then delete mixit's older step directories."""
        root = self.checkpoints_dir
        root.mkdir(parents=True, exist_ok=True)
        name = f"{STEP_PREFIX}{step:07d}"
        final, tmp = root / name, root / (name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        state = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
        save_file(state, str(tmp / "model.safetensors"))
        opt_tensors, opt_meta = _flatten_optimizer(optimizer.state_dict())
        save_file(opt_tensors, str(tmp / "optimizer.safetensors"))
        scaler = precision.state_dict() if precision is not None else {}
        write_json(tmp / "state.json", {"step": step, "optimizer": opt_meta, "scaler": scaler})
        for file in ("model.safetensors", "optimizer.safetensors"):
            with open(tmp / file, "rb") as f:
                os.fsync(f.fileno())
        _fsync_dir(tmp)
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
        write_text(root / LATEST, name + "\n")
        _fsync_dir(root)
        for old in root.iterdir():
            if old.is_dir() and old.name.startswith(STEP_PREFIX) and old.name != name:
                shutil.rmtree(old, ignore_errors=True)
        return final

    def latest_checkpoint(self) -> Path | None:
        latest = self.checkpoints_dir / LATEST
        if not latest.exists():
            return None
        path = latest.parent / latest.read_text().strip()
        if not path.is_dir():
            raise UsageError(f"{latest} points at {path.name}, which does not exist: the checkpoint is corrupt")
        return path

    def load_model_state(self, model: nn.Module, ckpt: Path) -> None:
        """Load checkpoint `ckpt`'s parameters and buffers into `model`, refusing any mismatch."""
        state = _load_tensors(ckpt / "model.safetensors")
        expected = model.state_dict()
        if set(state) != set(expected):
            missing = sorted(set(expected) - set(state))[:3]
            extra = sorted(set(state) - set(expected))[:3]
            raise UsageError(
                f"checkpoint {ckpt} does not match the model in config.json (missing {missing}, unexpected {extra})"
            )
        for key, value in state.items():
            if value.shape != expected[key].shape:
                raise UsageError(
                    f"checkpoint {ckpt}: {key} has shape {tuple(value.shape)}, "
                    f"the model expects {tuple(expected[key].shape)}"
                )
        model.load_state_dict(state)

    def load_training_state(
        self, optimizer: torch.optim.Optimizer, ckpt: Path, precision: Precision | None = None
    ) -> int:
        """Load checkpoint `ckpt`'s optimizer state (and fp16's gradient scale); return its step."""
        meta = read_json(ckpt / "state.json", "checkpoint state.json")
        tensors = _load_tensors(ckpt / "optimizer.safetensors")
        try:
            optimizer.load_state_dict(_unflatten_optimizer(tensors, meta["optimizer"]))
            if precision is not None:
                precision.load_state_dict(meta.get("scaler", {}))
            return int(meta["step"])
        except (KeyError, ValueError, TypeError) as e:
            raise UsageError(f"checkpoint {ckpt} has a corrupt optimizer state ({e})") from None

    # -- summary ----------------------------------------------------------------------
    def write_summary(self, summary: dict[str, Any]) -> None:
        write_json(self.summary_path, summary)

    def summary(self) -> dict[str, Any] | None:
        """The final summary, or None if the run has not completed."""
        if not self.summary_path.exists():
            return None
        data = read_json(self.summary_path, "summary.json")
        if not isinstance(data, dict):
            raise UsageError(f"{self.summary_path} is corrupt: not a JSON object")
        return data

    # -- loading ----------------------------------------------------------------------
    def load(self, device: str = "auto") -> Loaded:
        """The config, the task (with the run's own tokenizer) and the model at
        the latest checkpoint, on `device`."""
        last = self.latest_checkpoint()
        if last is None:
            raise UsageError(f"{self.path} has no checkpoint yet")
        dev = resolve_device(device)
        task, model, _ = build(self.config, self.path)
        self.load_model_state(model, last)
        return Loaded(self.config, task, model.to(dev), last)


class MetricsLog:
    """The open metrics.jsonl: one JSON object per line, flushed as written."""

    def __init__(self, path: Path):
        self.path = path
        self._file: IO[str] = open(path, "a")

    def write(self, event: dict[str, Any]) -> None:
        self._file.write(json.dumps(event) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


def _flatten_optimizer(state: dict[str, Any]) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    tensors, scalars = {}, {}
    for idx, per_param in state["state"].items():
        for key, value in per_param.items():
            if isinstance(value, torch.Tensor):
                tensors[f"{idx}.{key}"] = value.detach().cpu().contiguous()
            else:
                scalars[f"{idx}.{key}"] = value
    return tensors, {"param_groups": state["param_groups"], "scalars": scalars}


def _unflatten_optimizer(tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> dict[str, Any]:
    state: dict[int, dict[str, Any]] = {}
    for flat, value in list(tensors.items()) + list(meta["scalars"].items()):
        idx, key = flat.split(".", 1)
        state.setdefault(int(idx), {})[key] = value
    return {"state": state, "param_groups": meta["param_groups"]}


def _load_tensors(path: Path) -> dict[str, torch.Tensor]:
    try:
        return load_file(str(path))
    except FileNotFoundError:
        raise UsageError(f"checkpoint file {path} is missing") from None
    except (SafetensorError, OSError, ValueError, RuntimeError) as e:
        raise UsageError(f"checkpoint file {path} is corrupt or unreadable ({e})") from None
