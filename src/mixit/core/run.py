"""The run directory and the one object that owns it: `Run`.

    RUN_DIR/
      .lock                held (flock) by the process training or resuming the run; holds its pid
                           (written once the checks pass: a refused command changes nothing here)
      config.json          {"config": the RunConfig, "request" it was resolved from, "mixit_version", "git_commit"}
      metrics.jsonl        one JSON object per event: the freeze report, training losses, evaluations
      summary.json         final metrics (written when the run completes)
      tokenizer.json       text tasks: the run's own tokenizer
      checkpoints/         the newest checkpoint, and those kept (`train`'s keep_checkpoints): latest and
                           step_NNNNNNN/, written, pruned and loaded by `mixit.core.checkpoint` (its files: there)
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

Everything that reads or writes a run goes through `Run`: no other module names these files
(tests/test_run_files.py checks it) but `mixit.core.checkpoint` and `mixit.tracking`, which own their parts as said
above, and a task, which names its own artifact such as ``tokenizer.json`` (`Task.save_artifacts`), since tasks
sit below this module. No pickle anywhere; every JSON and text file is written atomically (`mixit.files`).
"""

from __future__ import annotations

import json
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import IO, TYPE_CHECKING, Any, ClassVar, Literal

import numpy as np

from mixit.core.checkpoint import (
    checkpoint_path,
    checkpoint_steps,
    is_count,
    latest_checkpoint,
    load_model_state,
    partial_checkpoints,
)
from mixit.core.config import flatten
from mixit.core.experiment import RunConfig, build, read_record, read_request_file, record
from mixit.core.models import Transformer
from mixit.core.tasks import Task
from mixit.errors import UsageError, damaged, faults_refused, require
from mixit.files import (
    DirectoryLock,
    check_names,
    check_output_dir,
    read_json,
    remove_temporary,
    write_json,
    write_text,
)
from mixit.runtime import resolve_device
from mixit.version import install_hint

if TYPE_CHECKING:
    import pandas

CONFIG = "config.json"
EXPORTED = "mixit_export"
"""The key of an exported model's config.json (`mixit.export`) that holds its run's record: how a run and an
export, which both hold a config.json, are told apart."""
LOCK = DirectoryLock.NAME
FIGURES = ("head_scores", "attention", "fixed_patterns", "over_time")
"""The analysis's figures, by name: each drawn to NAME.png (attention and fixed_patterns: their arrays in NAME.npz;
head_scores and over_time: their numbers in NAME.json)."""

RunState = Literal["absent", "started", "done"]
"""How far a run has got (`Run.state`)."""


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


@dataclass
class Loaded:
    """A run's checkpoint (the latest unless asked for another), loaded: its config, task, model and
    checkpoint directory."""

    cfg: RunConfig
    task: Task
    model: Transformer
    checkpoint: Path


class Run:
    """One run directory (module docstring): its layout, config, metrics, checkpoints, summary and analysis, its
    state, and loading it back.

        run = Run.create("runs/x", cfg)     # a new run: refuses a directory holding anything
        run = Run.open("runs/x")            # an existing run: refuses anything else
        loaded = run.load()                 # config, task and model at the latest checkpoint
        run.checkpoints(), run.load(step=s) # the steps of the checkpoints held; the model at one of them
        run.state(), run.summary()          # absent, started or done; the final metrics
        run.analysis.head_scores()          # what `mixit analyze` wrote (`Analysis`; None if not written)
    """

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.config_path = self.path / CONFIG
        self.metrics_path = self.path / "metrics.jsonl"
        self.summary_path = self.path / "summary.json"
        self.checkpoints_dir = self.path / "checkpoints"
        self.analysis = Analysis(self.path / "analysis")
        """What `mixit analyze` wrote (or writes) into this run."""
        self._config: RunConfig | None = None
        self._lock = DirectoryLock(self.path)

    def __repr__(self) -> str:
        return f"Run({str(self.path)!r})"

    # -- creating and opening ---------------------------------------------------------
    @classmethod
    def check_new(cls, path: str | Path) -> None:
        """Refuse `path` as the directory of a new run unless it is absent or empty (and creatable)."""
        path = Path(path)
        check_output_dir(path)  # no name too long, a directory or creatable as one, writable
        if (path / CONFIG).exists():
            raise UsageError(
                f"{path} already holds a run; continue it with --resume or choose another output directory"
            )
        # A run another process is creating holds its lock and, for a moment, its config.json's temporary file:
        # the lock then refuses this one, naming that process.
        creating = f".{CONFIG}."
        if path.exists() and any(p.name != LOCK and not p.name.startswith(creating) for p in path.iterdir()):
            raise UsageError(f"output directory {path} is not empty and holds no mixit run; refusing to write into it")

    @classmethod
    def create(cls, path: str | Path, cfg: RunConfig) -> Run:
        """A new run directory holding `cfg`'s config.json, locked by this process until `release`.

        The directory is created and locked first and checked second, so two processes starting a run in one
        directory cannot both succeed. If the check fails, or the machine does (a full disk writing config.json:
        a refusal, since no work has begun), what was created is removed again.
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

    # -- the lock ---------------------------------------------------------------------
    def acquire(self, stamp: bool = True) -> None:
        """Take the run's lock (`mixit.files.DirectoryLock`), or refuse naming the holder. Without `stamp`, nothing
        is written until `begin`, so that checks that refuse leave the run as it was."""
        self._lock.acquire(stamp)

    def begin(self) -> None:
        """The lock's holder starts to change the run (a resume whose checks passed): record its pid in the lock
        file, and remove what killed writes left (`write_text`'s temporary files, half-written checkpoints).
        Their writers are gone: this process holds the lock, and `mixit analyze`, which does not take it, writes
        under analysis/ only."""
        self._lock.stamp()
        remove_temporary(self.path)
        remove_temporary(self.checkpoints_dir)
        for partial in partial_checkpoints(self.checkpoints_dir):
            shutil.rmtree(partial, ignore_errors=True)

    def release(self) -> None:
        """Give the run's lock back."""
        self._lock.release()

    # -- what the run holds -----------------------------------------------------------
    @property
    def config(self) -> RunConfig:
        """The run's config.json, read (with the request it was resolved from: `read_record`) at first use."""
        if self._config is None:
            remedy = "restore it from a copy (a run cannot be read without it), or train the run again"
            with damaged(self.config_path, remedy):
                data = read_json(self.config_path, CONFIG)
            self._config = read_record(data, str(self.config_path))
        return self._config

    @property
    def request(self) -> dict[str, Any]:
        """The request the run was resolved from (what its user and recipe asked for): replay and ``--resume``
        start from it. A run written before runs recorded it gives its whole config."""
        return self.config.request

    def check_same(self, cfg: RunConfig) -> None:
        """Refuse to continue this run with a config that differs from its own."""
        saved, requested = flatten(self.config.to_dict()), flatten(cfg.to_dict())
        differ = [k for k in sorted(saved | requested) if saved.get(k) != requested.get(k)]
        if differ:
            diffs = "; ".join(f"{k}: {saved.get(k)!r} != {requested.get(k)!r}" for k in differ[:5])
            raise UsageError(f"{self.path} holds a different run; differences (saved != requested): {diffs}")

    def state(self) -> RunState:
        """How far the run has got: absent (no run here yet), started (its config but no summary: training now, or
        interrupted) or done (its summary is written)."""
        if self.summary_path.exists():
            return "done"
        return "started" if self.config_path.exists() else "absent"

    @property
    def analysed(self) -> bool:
        """Whether `mixit analyze` has completed on this run (`Analysis.complete`)."""
        return self.analysis.complete

    def summary(self) -> dict[str, Any] | None:
        """The final summary, or None if the run has not completed."""
        remedy = "remove it and resume the run (`mixit train --resume --out RUN_DIR`) to write it again"
        with damaged(self.summary_path, remedy):
            return read_object(self.summary_path, "summary.json")

    def write_summary(self, summary: dict[str, Any]) -> None:
        """Write the final summary: the run is done."""
        write_json(self.summary_path, summary)

    # -- metrics ----------------------------------------------------------------------
    def metrics(self) -> list[dict[str, Any]]:
        """Every event logged so far, in order ([] before the first). A torn last line (a process killed while
        writing it) is skipped with a warning on stderr; any other line that is no event is refused."""
        if not self.metrics_path.exists():
            return []
        lines = self.metrics_path.read_text().splitlines()
        events = []
        for i, line in enumerate(lines):
            if not line.strip():
                continue
            try:
                event = json.loads(line)
            except json.JSONDecodeError:
                if i == len(lines) - 1:
                    print(f"mixit: warning: {self.metrics_path}: ignoring a torn last line", file=sys.stderr)
                    continue
                raise UsageError(f"{self.metrics_path} is corrupt at line {i + 1}") from None
            if not isinstance(event, dict) or not is_count(event.get("step")):
                raise UsageError(f"{self.metrics_path} is corrupt at line {i + 1} (no integer step >= 0)")
            events.append(event)
        return events

    def metrics_frame(self) -> pandas.DataFrame:
        """`metrics` as a pandas DataFrame: a row per event, in order, with the columns step, event and every number
        an event holds (NaN where it has none), as named in metrics.jsonl (`loss`: the training loss on a train
        row, the test loss on an eval row; validation metrics as val_<name>). The freeze report's lists of
        parameters are left out. Needs pandas (the `notebook` extra); a directory that holds no run is refused."""
        pd = require_pandas()
        if self.state() == "absent":
            raise UsageError(f"{self.path} holds no mixit run (no {CONFIG})")
        rows = [{k: v for k, v in e.items() if k in ("step", "event") or is_number(v)} for e in self.metrics()]
        return pd.DataFrame(rows, columns=list(dict.fromkeys(["step", "event", *(k for row in rows for k in row)])))

    def open_metrics(self, resume_step: int | None = None) -> MetricsLog:
        """The metrics log, for appending. With `resume_step`, the events after that step are dropped first (their
        steps will be run again), by an atomic rewrite."""
        if resume_step is not None and self.metrics_path.exists():
            kept = [e for e in self.metrics() if e.get("step", 0) <= resume_step]
            write_text(self.metrics_path, "".join(json.dumps(e) + "\n" for e in kept))
        return MetricsLog(self.metrics_path)

    # -- checkpoints (`mixit.core.checkpoint`) -------------------------------------------------
    def checkpoints(self) -> list[int]:
        """The steps of the checkpoints this run holds, in order: the kept ones and the newest."""
        return checkpoint_steps(self.checkpoints_dir)

    def checkpoint(self, step: int) -> Path:
        """The directory of checkpoint `step` (which may not exist: `checkpoints` lists those that do)."""
        return checkpoint_path(self.checkpoints_dir, step)

    def latest_checkpoint(self) -> Path | None:
        """The newest checkpoint, which a resume starts from (None before the first)."""
        return latest_checkpoint(self.checkpoints_dir)

    def load(self, device: str = "auto", step: int | None = None) -> Loaded:
        """The config, the task (with the run's own tokenizer) and the model at checkpoint `step` (default: the
        latest; `checkpoints` lists those held), on `device`."""
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


class MetricsLog:
    """The open metrics.jsonl: one JSON object per line, each on disk as it is written (`Run.metrics` reads them)."""

    def __init__(self, path: Path):
        self._file: IO[str] = open(path, "a", buffering=1)  # line-buffered: flushed at every event's newline

    def write(self, event: dict[str, Any]) -> None:
        """Append `event`."""
        self._file.write(json.dumps(event) + "\n")

    def close(self) -> None:
        """Close the file."""
        self._file.close()


@dataclass(frozen=True)
class Analysis:
    """A run's analysis directory, written by `mixit analyze` (its files: module docstring).

    Its JSON files (`JSON`) are written by `write` and read by the method of their name, which returns None for a
    file not written. A figure (`FIGURES`) is drawn at `figure_path`; `figure` is the drawing if there is one.
    """

    path: Path
    JSON: ClassVar[tuple[str, ...]] = ("head_scores", "signal", "retrieval_by_pairs", "over_time")

    def prepare(self) -> None:
        """Create the directory for writing, refusing a file in its place (files already there are rewritten)."""
        if self.path.exists() and not self.path.is_dir():
            raise UsageError(f"{self.path} exists and is not a directory")
        self.path.mkdir(parents=True, exist_ok=True)

    @property
    def complete(self) -> bool:
        """Whether an analysis ran to its end: its summary is written last."""
        return (self.path / "summary.md").exists()

    def write(self, name: str, data: dict[str, Any]) -> Path:
        """Write the JSON file `name` (one of `JSON`): NAME.json."""
        if name not in self.JSON:
            raise ValueError(f"unknown analysis file {name!r}; known: {', '.join(self.JSON)}")
        write_json(self.path / f"{name}.json", data)
        return self.path / f"{name}.json"

    def _read(self, name: str) -> dict[str, Any] | None:
        with damaged(self.path / f"{name}.json", "run `mixit analyze RUN_DIR` again, which rewrites it"):
            return read_object(self.path / f"{name}.json", f"analysis {name}.json")

    def head_scores(self) -> dict[str, Any] | None:
        """The head scores per layer and head, and the in-context gap (`mixit.analysis.induction.head_scores`)."""
        return self._read("head_scores")

    def signal(self) -> dict[str, Any] | None:
        """Token similarity after each layer: {"trained": ..., "init": ...}."""
        return self._read("signal")

    def retrieval_by_pairs(self) -> dict[str, Any] | None:
        """A retrieval run's test accuracy by the number of stored pairs: {k: {"accuracy", "examples"}}."""
        return self._read("retrieval_by_pairs")

    def over_time(self) -> dict[str, Any] | None:
        """Head scores and test metrics at every checkpoint (`mixit.analysis.report.over_time`)."""
        return self._read("over_time")

    def summary(self) -> str | None:
        """The findings in words (markdown)."""
        path = self.path / "summary.md"
        return path.read_text() if path.exists() else None

    def write_summary(self, text: str) -> Path:
        """Write the findings in words; written last, this marks the analysis `complete`."""
        write_text(self.path / "summary.md", text)
        return self.path / "summary.md"

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
