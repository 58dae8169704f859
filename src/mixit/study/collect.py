"""A study's runs as the report reads them: what each run wrote, collected into `Result`s (`collect`).

A cell trained again at longer budgets (`Study.extend`) has one final run per budget, labelled with its multiple
(`BUDGET`); the tables read the longest that finished (`StudyResults.final`). Nothing here names a task: a task
declares what the report shows of it (`Task.report_metric`, `Task.report_columns`).
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from mixit.analysis.report import summarize
from mixit.core.run import Run, is_number
from mixit.core.tasks import TASKS, Task
from mixit.errors import UsageError
from mixit.files import read_json
from mixit.study.directory import failure_record, load_study_record
from mixit.study.executors import extra_result, run_dir, state
from mixit.study.spec import BUDGET, budget


def task_class(name: str) -> type[Task]:
    """The task registered as `name`, or the base `Task` (its defaults) for one not registered in this process."""
    return TASKS[name] if name in TASKS else Task


@dataclass
class Result:
    """One run of the study as the report sees it."""

    id: str
    labels: list[dict[str, Any]]
    config: dict[str, Any]
    state: str
    """done, failed, interrupted or new (`mixit.study.executors.state`), or damaged: finished, but a file of it
    cannot be read (`error` says which)."""
    test: dict[str, float]
    """summary.json's test metrics at the end of training; `val`, its validation metrics."""
    val: dict[str, float] = field(default_factory=dict)
    convergence: dict[str, Any] | None = None
    """summary.json "convergence" (metric, converged, reason, best, gain, window, ...); None: not recorded."""
    evals: list[dict[str, float]] = field(default_factory=list)
    """metrics.jsonl's eval events: each one's step and metrics (validation metrics as val_<name>)."""
    selected: dict[str, Any] = field(default_factory=dict)
    """summary.json "selected": the evaluation whose validation metric was best ({}: a run of older code)."""
    heads: dict[str, Any] | None = None  # analyze_run's findings, if analysed
    seconds: float | None = None
    error: str | None = None
    role: str = "final"
    """final (a cell of a table) or screen (a screening run of a search)."""
    chosen: dict[str, Any] = field(default_factory=dict)
    """A searched final run's chosen settings: dotted request path -> value."""
    run: Run | None = None
    """The run (its analysis holds the figures and files the sections show)."""

    @property
    def budget(self) -> int:
        """The multiple of its cell's step cap it trained (`Study.extend`), 1 at the cap itself."""
        return max(budget(labels) for labels in self.labels)

    @property
    def curve(self) -> list[tuple[int, float]]:
        """(step, the task's report metric in the report's units) at each evaluation: what the figures draw."""
        _, key, scale = task_class(self.config["task"]).report_metric
        return [(int(e["step"]), scale * e[key]) for e in self.evals if key in e]


@dataclass
class StudyResults:
    """What the tables' sections and checks read: every run, and the extras' results."""

    results: list[Result]
    signals: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Each finished signal sweep of the study's extras: name -> its signal.json."""
    record: dict[str, Any] = field(default_factory=dict)
    """study.json."""
    study_dir: Path | None = None

    @property
    def final(self) -> list[Result]:
        """The final runs, each cell's seed at the longest budget that finished (if none has, at the step cap),
        so the tables find one run per seed; a run keeps only the labels it is read under."""
        return _at_budget(self.results, read=True)

    @property
    def superseded(self) -> list[Result]:
        """The final runs that a longer budget of the same cell and seed replaces in `final`."""
        return _at_budget(self.results, read=False)

    @property
    def screens(self) -> list[Result]:
        """The screening runs of the searches."""
        return [r for r in self.results if r.role == "screen"]

    @property
    def figures(self) -> Path:
        """The study's figures/ directory."""
        if self.study_dir is None:
            raise ValueError("these results have no study directory to write figures to")
        return self.study_dir / "figures"


def _at_budget(results: Sequence[Result], read: bool) -> list[Result]:
    """The final runs with only their labels read at their budget (`read`: `StudyResults.final`), or only those
    read at another (not `read`: `superseded`)."""
    finals = [r for r in results if r.role == "final"]
    found: dict[str, list[tuple[int, bool]]] = defaultdict(list)  # cell and seed -> (budget, finished)
    for r in finals:
        for labels in r.labels:
            found[_cell_seed(labels)].append((budget(labels), r.state == "done"))
    chosen = {key: max((b for b, done in got if done), default=min(b for b, _ in got)) for key, got in found.items()}
    kept = []
    for r in finals:
        under = [x for x in r.labels if (chosen[_cell_seed(x)] == budget(x)) == read]
        if under:
            kept.append(r if len(under) == len(r.labels) else replace(r, labels=under))
    return kept


def _cell_seed(labels: dict[str, Any]) -> str:
    """A run's cell and seed: its labels but its budget."""
    return json.dumps({k: v for k, v in labels.items() if k != BUDGET}, sort_keys=True, default=str)


def collect(study_dir: Path) -> StudyResults:
    """The study's record, every run's results (what exists of them) and the extras' signal.json files.

    A damaged study (study.json, a failure record, an extra's result) is refused in one line; a finished run
    whose files cannot be read is in state "damaged", its error saying which file and why, so that the report
    shows it beside the others (docs/reliability.md, "Studies and reports")."""
    study_dir = Path(study_dir)
    record = load_study_record(study_dir)
    results = [_result(study_dir, entry) for entry in record["runs"]]
    signals = {}
    for name in record.get("extras", {}):
        path = extra_result(study_dir, name)
        if path.exists():
            signals[name] = read_json(path, f"{name}/{path.name}")
            if not isinstance(signals[name], dict):
                raise UsageError(f"{path} is damaged: not a JSON object")
    return StudyResults(results, signals, record, study_dir)


def _result(study_dir: Path, entry: dict[str, Any]) -> Result:
    """The run of study.json's `entry`, with what it has written so far."""
    run = Run(run_dir(study_dir, entry["id"]))
    r = Result(
        entry["id"],
        entry["labels"],
        entry["config"],
        state(study_dir, entry["id"]),
        {},
        role=entry.get("role", "final"),
        chosen=entry.get("chosen") or {},
        run=run,
    )
    if r.state == "failed":
        r.error = failure_record(study_dir, entry["id"])["error"]
    if r.state != "done":
        return r
    try:
        run = Run.open(run.path)
        summary = run.summary() or {}
        test, val = summary.get("test", {}), summary.get("val", {})
        for split, found in (("test", test), ("val", val)):
            if not isinstance(found, dict) or not all(is_number(v) for v in found.values()):
                raise UsageError(f"{run.summary_path} is damaged: its {split!r} metrics are not numbers by name")
        convergence = summary.get("convergence")
        if convergence is not None and not isinstance(convergence, dict):
            raise UsageError(f"{run.summary_path} is damaged: its 'convergence' is not an object")
        key = task_class(r.config["task"]).report_metric[1]
        evals = [e for e in run.metrics() if isinstance(e, dict) and e.get("event") == "eval" and key in e]
        if not all(isinstance(e.get("step"), int) and is_number(e[key]) for e in evals):
            raise UsageError(f"{run.metrics_path} is damaged: an eval event without a step or a number for {key}")
        selected = summary.get("selected") or {}
        if not isinstance(selected, dict) or not isinstance(selected.get("test", {}), dict):
            raise UsageError(f"{run.summary_path} is damaged: its 'selected' is not an object of metrics")
        scores, heads = run.analysis.head_scores(), None
        if scores is not None:
            signal = run.analysis.signal()
            if signal is None:
                raise UsageError(
                    f"{run.analysis.path} holds head scores but no signal result: run `mixit analyze` again"
                )
            heads = summarize(scores, signal)
    except UsageError as e:
        return replace(r, state="damaged", error=str(e))
    return replace(
        r,
        test=test,
        val=val,
        convergence=convergence,
        seconds=summary.get("train_seconds_this_session"),
        evals=[{k: v for k, v in e.items() if k == "step" or is_number(v)} for e in evals],
        selected=selected,
        heads=heads,
    )


def reported(r: Result) -> dict[str, float]:
    """The test metrics a run is reported by: those at its best validation evaluation, or, for a run of
    older code that did not record it, at its last."""
    return r.selected.get("test") or r.test
