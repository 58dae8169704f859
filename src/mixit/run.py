"""The run directory and the one object that owns it: `Run`.

    RUN_DIR/
      .lock                held (flock) by the process training or resuming the run; holds its pid
                           (written once the checks pass: a refused command changes nothing here)
      config.json          {"config": the RunConfig, "request" it was resolved from, "mixit_version", "git_commit"}
      metrics.jsonl        one JSON object per event: the freeze report, training losses, evaluations
      summary.json         final metrics (written when the run completes)
      tokenizer.json       text tasks: the run's own tokenizer
      checkpoints/         the newest checkpoint, and those kept (`train`'s keep_checkpoints): latest and
                           step_NNNNNNN/, written, pruned and loaded by `mixit.checkpoint` (its files: there)
      analysis/            written by `mixit analyze` (`Analysis`):
          head_scores.json / .png     head scores per layer and head, and the in-context gap
          attention.npz / .png        every head's pattern on one input, its tokens and their names
          fixed_patterns.npz / .png   the input-independent matrices (MixiT and the other fixed-pattern kinds)
          signal.json                 token similarity after each layer, trained and at initialisation
          retrieval_by_pairs.json     retrieval runs only: test accuracy by the number of stored pairs
          over_time.json / .png       with --over-time: head scores and test metrics at every checkpoint
          summary.md                  the findings in words; written last, so it marks a complete analysis
      tracking.json        with --logger (or after `mixit export-logs`): the tracking sinks the run remembers, and
                           what identifies the run in each (read and written by `mixit.tracking`)
      tensorboard/         --logger tensorboard: the run's TensorBoard event files (`mixit.tracking`)
      wandb/               --logger wandb: W&B's local files (W&B names this directory itself)

Training, evaluation, analysis, sampling, resumption and studies all go
through `Run`: nothing else knows these names (tests/test_run_files.py checks
it), except the two modules that own a part of the directory and say so above:
`mixit.checkpoint` (the checkpoint protocol: write, prune, keep, load) and
`mixit.tracking` (what the tracking sinks hold). The one other exception is a
task's own artifact, such as ``tokenizer.json``: the task names it
(`Task.save_artifacts(run_dir)`, `TaskConfig.for_run`), because tasks sit
below this module and cannot import it. No pickle anywhere (a checkpoint
cannot carry code). Every JSON and text file is written atomically, and every
checkpoint by the protocol `mixit.checkpoint` describes.
"""

from __future__ import annotations

import json
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import IO, TYPE_CHECKING, Any, Literal

import numpy as np

from mixit.checkpoint import (
    checkpoint_path,
    checkpoint_steps,
    is_count,
    latest_checkpoint,
    load_model_state,
    partial_checkpoints,
)
from mixit.config import flatten
from mixit.errors import UsageError, damaged, faults_refused, require
from mixit.experiment import RunConfig, build, read_record, read_request_file, record
from mixit.files import (
    DirectoryLock,
    check_names,
    check_output_dir,
    read_json,
    remove_temporary,
    write_json,
    write_text,
)
from mixit.models import Transformer
from mixit.runtime import resolve_device
from mixit.tasks import Task
from mixit.version import install_hint

if TYPE_CHECKING:
    import pandas

CONFIG = "config.json"
EXPORTED = "mixit_export"
"""The key of an exported model's config.json (`mixit.export`) that holds its run's record: how a run and an
export, which both hold a config.json, are told apart."""
LOCK = DirectoryLock.NAME
METRICS = "metrics.jsonl"
SUMMARY = "summary.json"
CHECKPOINTS = "checkpoints"
ANALYSIS = "analysis"
HEAD_SCORES = "head_scores.json"
SIGNAL = "signal.json"
BY_PAIRS = "retrieval_by_pairs.json"
OVER_TIME = "over_time.json"
ANALYSIS_SUMMARY = "summary.md"
FIGURES = ("head_scores", "attention", "fixed_patterns", "over_time")
"""The analysis's figures, by name: each drawn to NAME.png (attention and fixed_patterns: their arrays in NAME.npz;
head_scores and over_time: their numbers in NAME.json)."""
CONFIG_LOST = "restore it from a copy (a run cannot be read without it), or train the run again"
"""What to do about a run's config.json that is missing or damaged."""
SUMMARY_LOST = "remove it and resume the run (`mixit train --resume --out RUN_DIR`) to write it again"
"""What to do about a damaged summary.json: a resume evaluates the final checkpoint and writes it."""


def is_export(directory: Path) -> bool:
    """Whether `directory` holds a model written by `mixit export` (its config.json names `EXPORTED`); not where
    its config.json is missing or unreadable, which its reader then says."""
    try:
        data = read_json(Path(directory) / CONFIG, CONFIG)
    except UsageError:
        return False
    return isinstance(data, dict) and EXPORTED in data


def require_pandas() -> ModuleType:
    """pandas, which the DataFrames of a notebook need (`Run.metrics_frame`, `mixit.study.render.results_frame`)."""
    return require("pandas", f"a DataFrame needs pandas, which is not installed: {install_hint('notebook')}")


def load_request(path: str | Path) -> dict[str, Any]:
    """The request in a config file (YAML, TOML, JSON, or a run's config.json: `read_request_file`) or
    recorded by the run in directory `path` (`Run.request`): what ``mixit train --config`` starts from."""
    return Run.open(path).request if Path(path).is_dir() else read_request_file(Path(path))


RunState = Literal["absent", "started", "done"]
"""How far a run has got (`Run.state`)."""


@dataclass
class Loaded:
    """A run's checkpoint (the latest unless asked for another), loaded: its config, task, model and
    checkpoint directory."""

    cfg: RunConfig
    task: Task
    model: Transformer
    checkpoint: Path


class Run:
    """One run directory (module docstring): its layout, config, metrics,
    checkpoints, summary and analysis, its state, and loading it back.

        run = Run.create("runs/x", cfg)     # a new run: refuses a directory holding anything
        run = Run.open("runs/x")            # an existing run: refuses anything else
        loaded = run.load()                 # config, task and model at the latest checkpoint
        run.checkpoints(), run.load(step=s) # the steps of the checkpoints held; the model at one of them
        run.state(), run.summary()          # absent, started or done; the final metrics
        run.analysis.head_scores()          # what `mixit analyze` wrote (`Analysis`; None if not written)
    """

    def __init__(self, path: str | Path):
        self.path = Path(path)
        # The layout (module docstring).
        self.config_path = self.path / CONFIG
        self.metrics_path = self.path / METRICS
        self.summary_path = self.path / SUMMARY
        self.checkpoints_dir = self.path / CHECKPOINTS
        self.analysis_dir = self.path / ANALYSIS
        self._config: RunConfig | None = None
        self._lock = DirectoryLock(self.path)

    def __repr__(self) -> str:
        return f"Run({str(self.path)!r})"

    @property
    def analysis(self) -> Analysis:
        """What `mixit analyze` wrote (or writes) into this run: `Analysis`."""
        return Analysis(self.analysis_dir)

    # -- creating and opening ---------------------------------------------------------
    @classmethod
    def check_new(cls, path: str | Path) -> None:
        """Refuse `path` as the directory of a new run unless it is absent or empty (and creatable)."""
        path = Path(path)
        check_names(path)
        if path.exists() and not path.is_dir():
            raise UsageError(f"output path {path} exists and is not a directory")
        if (path / CONFIG).exists():
            raise UsageError(
                f"{path} already holds a run; continue it with --resume or choose another output directory"
            )
        # A run another process is creating holds its lock and, for a moment, its config.json's temporary file:
        # the lock then refuses this one, naming that process.
        creating = f".{CONFIG}."
        if path.exists() and any(p.name != LOCK and not p.name.startswith(creating) for p in path.iterdir()):
            raise UsageError(f"output directory {path} is not empty and holds no mixit run; refusing to write into it")
        check_output_dir(path)

    @classmethod
    def create(cls, path: str | Path, cfg: RunConfig) -> Run:
        """A new run directory holding `cfg`'s config.json, locked by this process until `release`.

        The directory is created and locked first and checked second, so two
        processes starting a run in one directory cannot both succeed. If the
        check fails, or the machine does (a full disk writing config.json: a
        refusal, since no work has begun), what was created is removed again.
        """
        cls.check_new(path)
        run = cls(path)
        made = not run.path.exists()
        try:
            with faults_refused(run.path):
                run.path.mkdir(parents=True, exist_ok=True)
                run.acquire()
                cls.check_new(path)
                write_json(run.config_path, record(cfg))
        except UsageError:
            run.release()
            if made:
                shutil.rmtree(run.path, ignore_errors=True)
            raise
        run._config = cfg
        return run

    # -- the lock ---------------------------------------------------------------------
    def acquire(self, stamp: bool = True) -> None:
        """Take the run directory's exclusive lock (`mixit.files.DirectoryLock`), or refuse naming the holder.
        Without `stamp` nothing is written until `begin`, so that checks that refuse leave the run as it was."""
        self._lock.acquire(stamp)

    def begin(self) -> None:
        """The lock's holder starts to change the run (a resume whose checks passed): record its pid in the lock
        file, and remove what killed writes left behind (`write_text`'s temporary files, a half-written
        checkpoint directory). Their writers are gone: this process holds the lock, and `mixit analyze`,
        which does not take it, writes under analysis/ only."""
        self._lock.stamp()
        for directory in (self.path, self.checkpoints_dir):
            if directory.is_dir():
                remove_temporary(directory)
        for partial in partial_checkpoints(self.checkpoints_dir):
            shutil.rmtree(partial, ignore_errors=True)

    def release(self) -> None:
        self._lock.release()

    @classmethod
    def open(cls, path: str | Path) -> Run:
        """An existing run directory (it must hold a readable config.json)."""
        run = cls(path)
        check_names(run.path)
        with faults_refused(run.path):
            if not run.path.is_dir():
                raise UsageError(f"run directory {run.path} does not exist")
            if not run.config_path.exists():
                raise UsageError(f"{run.path} holds no mixit run (no {CONFIG})")
        if is_export(run.path):
            raise UsageError(
                f"{run.path} is a mixit export, not a run: load it with mixit.load({str(run.path)!r}), "
                "or give the run directory it was exported from"
            )
        run.config  # noqa: B018 -- read and validate now, not at first use
        return run

    @property
    def config(self) -> RunConfig:
        """The run's config.json, read (with the request it was resolved from: `read_record`) at first use."""
        if self._config is None:
            with damaged(self.config_path, CONFIG_LOST):
                data = read_json(self.config_path, CONFIG)
            self._config = read_record(data, str(self.config_path))
        return self._config

    @property
    def request(self) -> dict[str, Any]:
        """The request the run was resolved from (what its user and recipe asked for): replay and
        ``--resume`` start from it. A run written before runs recorded it gives its whole config."""
        return self.config.request

    def check_same(self, cfg: RunConfig) -> None:
        """Refuse to continue this run with a config that differs from its own."""
        saved, requested = flatten(self.config.to_dict()), flatten(cfg.to_dict())
        differ = [k for k in sorted(saved | requested) if saved.get(k) != requested.get(k)]
        diffs = [f"{k}: {saved.get(k)!r} != {requested.get(k)!r}" for k in differ]
        if diffs:
            raise UsageError(
                f"{self.path} holds a different run; differences (saved != requested): " + "; ".join(diffs[:5])
            )

    # -- state ------------------------------------------------------------------------
    def state(self) -> RunState:
        """How far the run has got: absent (no run here yet), started (it has its config but no
        summary: training now, or interrupted) or done (its summary is written)."""
        if self.summary_path.exists():
            return "done"
        if self.config_path.exists():
            return "started"
        return "absent"

    @property
    def analysed(self) -> bool:
        """Whether `mixit analyze` has completed on this run (`Analysis.complete`)."""
        return self.analysis.complete

    # -- metrics ----------------------------------------------------------------------
    def metrics(self) -> list[dict[str, Any]]:
        """Every event logged so far, in order (`read_metrics`)."""
        return read_metrics(self.metrics_path)

    def metrics_frame(self) -> pandas.DataFrame:
        """`metrics` as a pandas DataFrame: one row per event, in order, with the columns step, event and every
        number an event holds (the freeze report's counts; a train event's loss, lr and elapsed_s; an eval
        event's test metrics, and its validation metrics as val_<name>), NaN where an event has none. As in
        metrics.jsonl, `loss` is the training loss on a train row and the test loss on an eval row. The freeze
        report's lists of parameters are not numbers, and are left out (`metrics` has them). Needs pandas (the
        `notebook` extra); a directory that holds no run is refused."""
        pd = require_pandas()
        if self.state() == "absent":
            raise UsageError(f"{self.path} holds no mixit run (no {CONFIG})")
        rows = [{k: v for k, v in e.items() if k in ("step", "event") or is_number(v)} for e in self.metrics()]
        return pd.DataFrame(rows, columns=list(dict.fromkeys(["step", "event", *(k for row in rows for k in row)])))

    def open_metrics(self, resume_step: int | None = None) -> MetricsLog:
        """The metrics log, for appending. With `resume_step`, events after that
        step are dropped first (they belong to steps that will be run again);
        the file is rewritten atomically."""
        if resume_step is not None and self.metrics_path.exists():
            kept = [e for e in self.metrics() if e.get("step", 0) <= resume_step]
            write_text(self.metrics_path, "".join(json.dumps(e) + "\n" for e in kept))
        return MetricsLog(self.metrics_path)

    # -- checkpoints (`mixit.checkpoint`) --------------------------------------------------
    def checkpoints(self) -> list[int]:
        """The steps of the checkpoints this run holds, in order: the kept ones and the newest."""
        return checkpoint_steps(self.checkpoints_dir)

    def checkpoint(self, step: int) -> Path:
        """The directory of checkpoint `step` (which may not exist: `checkpoints` lists those that do)."""
        return checkpoint_path(self.checkpoints_dir, step)

    def latest_checkpoint(self) -> Path | None:
        """The newest checkpoint, which a resume starts from (None before the first)."""
        return latest_checkpoint(self.checkpoints_dir)

    # -- summary ----------------------------------------------------------------------
    def write_summary(self, summary: dict[str, Any]) -> None:
        write_json(self.summary_path, summary)

    def summary(self) -> dict[str, Any] | None:
        """The final summary, or None if the run has not completed."""
        with damaged(self.summary_path, SUMMARY_LOST):
            return read_object(self.summary_path, SUMMARY)

    # -- loading ----------------------------------------------------------------------
    def load(self, device: str = "auto", step: int | None = None) -> Loaded:
        """The config, the task (with the run's own tokenizer) and the model at checkpoint `step`
        (default: the latest; `checkpoints` lists those held), on `device`."""
        ckpt = self.latest_checkpoint() if step is None else self.checkpoint(step)
        if ckpt is None:
            raise UsageError(f"{self.path} has no checkpoint yet")
        if not ckpt.is_dir():
            held = ", ".join(map(str, self.checkpoints())) or "none"
            raise UsageError(f"{self.path} holds no checkpoint of step {step}; it holds steps: {held}")
        dev = resolve_device(device)
        task, model, _ = build(self.config, self.path)
        load_model_state(model, ckpt)
        return Loaded(self.config, task, model.to(dev), ckpt)


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """The events of metrics.jsonl `path`, in order ([] if there is none yet). A torn last line (a process
    killed while writing it) is skipped with a warning on stderr."""
    if not path.exists():
        return []
    lines = path.read_text().splitlines()
    events = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            if i == len(lines) - 1:
                print(f"mixit: warning: {path}: ignoring a torn last line", file=sys.stderr)
                continue
            raise UsageError(f"{path} is corrupt at line {i + 1}") from None
        if not isinstance(event, dict) or not is_count(event.get("step")):
            raise UsageError(f"{path} is corrupt at line {i + 1} (no integer step >= 0)")
        events.append(event)
    return events


class MetricsLog:
    """The open metrics.jsonl: one JSON object per line, flushed as written (`read_metrics` reads it back)."""

    def __init__(self, path: Path):
        self._file: IO[str] = open(path, "a")

    def write(self, event: dict[str, Any]) -> None:
        self._file.write(json.dumps(event) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


class Analysis:
    """A run's analysis directory, written by `mixit analyze` (its files: module docstring).

    Each file is read and written by what it holds; a reader returns None for a file not written.
    A figure is named by what it shows (`FIGURES`): `figure_path` is where it is drawn, `figure`
    the drawing if there is one.
    """

    def __init__(self, path: Path):
        self.path = path

    def __repr__(self) -> str:
        return f"Analysis({str(self.path)!r})"

    def prepare(self) -> None:
        """Create the directory for writing, refusing a file in its place (files already there are rewritten)."""
        if self.path.exists() and not self.path.is_dir():
            raise UsageError(f"{self.path} exists and is not a directory")
        self.path.mkdir(parents=True, exist_ok=True)

    @property
    def complete(self) -> bool:
        """Whether an analysis ran to its end: its summary is written last."""
        return (self.path / ANALYSIS_SUMMARY).exists()

    def head_scores(self) -> dict[str, Any] | None:
        """The head scores per layer and head, and the in-context gap (`mixit.analysis.induction.head_scores`)."""
        return self._read_json(HEAD_SCORES)

    def write_head_scores(self, scores: dict[str, Any]) -> Path:
        return self._write_json(HEAD_SCORES, scores)

    def signal(self) -> dict[str, Any] | None:
        """Token similarity after each layer: {"trained": ..., "init": ...}."""
        return self._read_json(SIGNAL)

    def write_signal(self, signal: dict[str, Any]) -> Path:
        return self._write_json(SIGNAL, signal)

    def retrieval_by_pairs(self) -> dict[str, Any] | None:
        """A retrieval run's test accuracy by the number of stored pairs: {k: {"accuracy", "examples"}}."""
        return self._read_json(BY_PAIRS)

    def write_retrieval_by_pairs(self, by_pairs: dict[str, Any]) -> Path:
        return self._write_json(BY_PAIRS, by_pairs)

    def over_time(self) -> dict[str, Any] | None:
        """Head scores and test metrics at every checkpoint (`mixit.analysis.report.over_time`)."""
        return self._read_json(OVER_TIME)

    def write_over_time(self, over_time: dict[str, Any]) -> Path:
        return self._write_json(OVER_TIME, over_time)

    def summary(self) -> str | None:
        """The findings in words (markdown)."""
        path = self.path / ANALYSIS_SUMMARY
        return path.read_text() if path.exists() else None

    def write_summary(self, text: str) -> Path:
        """Write the findings in words; written last, this marks the analysis `complete`."""
        write_text(self.path / ANALYSIS_SUMMARY, text)
        return self.path / ANALYSIS_SUMMARY

    def write_arrays(self, figure: str, **arrays: np.ndarray) -> Path:
        """Save the arrays behind the figure `figure` (NAME.npz, numpy's format: no pickle)."""
        path = self.figure_path(figure).with_suffix(".npz")
        np.savez(path, **arrays)  # type: ignore[arg-type]  # (the stub mistakes arrays for allow_pickle)
        return path

    def figure_path(self, figure: str) -> Path:
        """Where the figure `figure` (one of `FIGURES`) is drawn."""
        if figure not in FIGURES:
            raise ValueError(f"unknown analysis figure {figure!r}; known: {', '.join(FIGURES)}")
        return self.path / f"{figure}.png"

    def figure(self, figure: str) -> Path | None:
        """The drawing of the figure `figure`, or None if it has not been drawn."""
        path = self.figure_path(figure)
        return path if path.exists() else None

    def _read_json(self, name: str) -> dict[str, Any] | None:
        with damaged(self.path / name, "run `mixit analyze RUN_DIR` again, which rewrites it"):
            return read_object(self.path / name, f"analysis {name}")

    def _write_json(self, name: str, data: dict[str, Any]) -> Path:
        write_json(self.path / name, data)
        return self.path / name


def read_object(path: Path, what: str) -> dict[str, Any] | None:
    """The JSON object in `path` (`what` names it in a refusal), None if there is no such file."""
    if not path.exists():
        return None
    data = read_json(path, what)
    if not isinstance(data, dict):
        raise UsageError(f"{path} is corrupt: not a JSON object")
    return data


def is_number(value: Any) -> bool:
    """Whether `value`, read from a run's file, is a number (an int or a float, not a bool)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)
