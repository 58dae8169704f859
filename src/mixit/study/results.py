"""A study's results as the report reads them, and what every table's section and checks are made of.

    collect(study_dir)              every run of the study (`Result`) and the extras' signal.json files
    rows, values, by_label, fmt     select runs by their labels; numbers over seeds, mean ± sample std
    variant_table                   a markdown table: a row per variant, the metric, the paper's number,
                                    whether each cell converged, the settings a search chose
    reported                        the test metrics a run is reported by (at its best validation evaluation)
    plot_curves, plot_lines         the report's figures (each a Figure, saved if given a path; None: nothing
                                    to plot)
    results_csv, results_frame      one row per run: results.csv's text, or the same table as a pandas DataFrame

The verdict rule that judges the paper's findings on these is `mixit.study.verdicts`.

Nothing here knows a paper table: the tables (`mixit.study.tables`) are built from these.
"""

from __future__ import annotations

import csv
import io
import statistics
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mixit.analysis.report import summarize
from mixit.errors import UsageError
from mixit.files import read_json
from mixit.run import Run, is_number, require_pandas
from mixit.study.directory import failure_record, load_study_record
from mixit.study.executors import extra_result, run_dir, state

if TYPE_CHECKING:
    import pandas
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

HEADLINE = {  # task -> (column name, metric key, scale): the accuracy a task is judged by
    "addition": ("accuracy", "token_acc", 100),
    "dyck": ("accuracy", "token_acc", 100),
    "modular_addition": ("accuracy", "token_acc", 100),
    "memorization": ("accuracy", "token_acc", 100),
    "retrieval": ("accuracy", "token_acc", 100),
    "induction": ("accuracy", "token_acc", 100),
    "sentiment": ("accuracy", "accuracy", 100),
    "lm": ("loss", "loss", 1),
}
EXTRA_COLUMNS = {  # task -> further metrics shown
    "addition": [("exact match", "exact_match", 100)],
    "dyck": [("distinct strings", "distinct_token_acc", 100), ("majority", "majority_baseline", 100)],
    "memorization": [("bits/param", "bits_per_trainable_param", 1), ("bits", "bits", 1)],
    "induction": [("answered acc", "answered_acc", 100)],
    "sentiment": [("majority", "majority_baseline", 100)],
    "lm": [("perplexity", "perplexity", 1), ("unigram loss", "unigram_loss", 1)],
}


def headline(task: str) -> tuple[str, str, int]:
    """(column name, metric key, scale) of the number `task` is judged by; token accuracy for a task
    the report does not know."""
    return HEADLINE.get(task, ("accuracy", "token_acc", 100))


@dataclass
class Result:
    """One run of the study as the report sees it."""

    id: str
    labels: list[dict[str, Any]]
    config: dict[str, Any]
    state: str
    """done, failed, interrupted or new (`mixit.study.executors.state`), or damaged: finished, but a file
    of it cannot be read (`error` says which and why)."""
    test: dict[str, float]
    val: dict[str, float] = field(default_factory=dict)
    """Validation metrics at the end of training (summary.json "val")."""
    convergence: dict[str, Any] | None = None
    """summary.json "convergence" (metric, converged, reason, best, gain, window, ...); None: not recorded."""
    evals: list[dict[str, float]] = field(default_factory=list)
    """Every evaluation's metrics, with its "step" (metrics.jsonl eval events: test metrics by name, validation
    metrics as val_<name>)."""
    selected: dict[str, Any] = field(default_factory=dict)
    """summary.json "selected": the step, test and validation metrics of the evaluation whose validation
    metric was best ({}: a run of older code, which the report reads at its last evaluation)."""
    heads: dict[str, Any] | None = None  # analyze_run's findings, if analysed
    seconds: float | None = None
    error: str | None = None
    role: str = "final"
    """final (a cell of a table) or screen (a screening run of the per-architecture search)."""
    chosen: dict[str, Any] = field(default_factory=dict)
    """For a final run that was searched, the chosen settings: dotted request path -> value."""
    run: Run | None = None
    """The run (its analysis holds the figures and files the sections show)."""

    @property
    def curve(self) -> list[tuple[int, float]]:
        """(step, headline test metric in the report's units) at each evaluation: what the figures draw."""
        _, key, scale = headline(self.config["task"])
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
        """The runs that are cells of a table (not screening runs)."""
        return [r for r in self.results if r.role == "final"]

    @property
    def screens(self) -> list[Result]:
        return [r for r in self.results if r.role == "screen"]

    @property
    def figures(self) -> Path:
        if self.study_dir is None:
            raise ValueError("these results have no study directory to write figures to")
        return self.study_dir / "figures"


def collect(study_dir: Path) -> StudyResults:
    """The study's record, every run's results (what exists of them) and the extras' signal.json files.

    A damaged study (study.json, a failure record, an extra's result) is refused in one line; a damaged
    run is a result of its own, in state "damaged" (`_result`)."""
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
    """The run of study.json's `entry`, with what it has written so far.

    A finished run whose files cannot be read (a corrupt summary.json, metrics.jsonl or analysis) is
    "damaged", its error saying which file and why: the report shows it beside the others rather than
    refusing the study for one run (docs/reliability.md, "Studies and reports")."""
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
    if r.state == "done":
        try:
            _read_finished(r, entry["config"]["task"])
        except UsageError as e:
            r.state, r.error = "damaged", str(e)
            r.test, r.val, r.convergence, r.seconds, r.evals, r.selected, r.heads = {}, {}, None, None, [], {}, None
    elif r.state == "failed":
        r.error = failure_record(study_dir, entry["id"])["error"]
    return r


def _read_finished(r: Result, task: str) -> None:
    """Fill `r` from its finished run's summary, metrics and analysis; UsageError if one is damaged."""
    assert r.run is not None
    run = Run.open(r.run.path)
    summary = run.summary() or {}
    r.test, r.val = _metrics(summary, "test", run), _metrics(summary, "val", run)
    r.convergence, r.seconds = summary.get("convergence"), summary.get("train_seconds_this_session")
    if r.convergence is not None and not isinstance(r.convergence, dict):
        raise UsageError(f"{run.summary_path} is damaged: its 'convergence' is not an object")
    key = headline(task)[1]
    evals = [e for e in run.metrics() if isinstance(e, dict) and e.get("event") == "eval" and key in e]
    if not all(isinstance(e.get("step"), int) and is_number(e[key]) for e in evals):
        raise UsageError(f"{run.metrics_path} is damaged: an eval event without a step or a number for {key}")
    r.evals = [{k: v for k, v in e.items() if k == "step" or is_number(v)} for e in evals]
    selected = summary.get("selected") or {}
    if not isinstance(selected, dict) or not isinstance(selected.get("test", {}), dict):
        raise UsageError(f"{run.summary_path} is damaged: its 'selected' is not an object of metrics")
    r.selected = selected
    r.heads = _heads(run)


def reported(r: Result) -> dict[str, float]:
    """The test metrics a run is reported by: those at its best validation evaluation, or, for a run of
    older code that did not record it, at its last."""
    return r.selected.get("test") or r.test


def _metrics(summary: dict[str, Any], split: str, run: Run) -> dict[str, float]:
    """summary.json's metrics of `split` (test or val); UsageError unless an object of names to numbers."""
    found = summary.get(split, {})
    if not isinstance(found, dict) or not all(is_number(v) for v in found.values()):
        raise UsageError(f"{run.summary_path} is damaged: its {split!r} metrics are not numbers by name")
    return found


def _heads(run: Run) -> dict[str, Any] | None:
    """`analyze_run`'s findings on `run`, or None if it has not been analysed."""
    scores = run.analysis.head_scores()
    if scores is None:
        return None
    signal = run.analysis.signal()
    if signal is None:
        raise UsageError(f"{run.analysis.path} holds head scores but no signal result: run `mixit analyze` again")
    return summarize(scores, signal)


# -- selection and aggregation ---------------------------------------------------------------------


def rows(results: Sequence[Result], **match: Any) -> list[tuple[Result, dict[str, Any]]]:
    """(result, labels) for every label set of every result that matches `match`."""
    return [(r, labels) for r in results for labels in r.labels if all(labels.get(k) == v for k, v in match.items())]


def values(results: Sequence[Result], metric: str, scale: float = 1.0, **match: Any) -> list[float]:
    """The reported test metric (`reported`) of every finished run matching `match` (one value per seed)."""
    return [
        scale * reported(r)[metric] for r, _ in rows(results, **match) if r.state == "done" and metric in reported(r)
    ]


def mean(xs: Sequence[float]) -> float | None:
    return statistics.fmean(xs) if xs else None


def fmt(xs: Sequence[float], digits: int = 1) -> str:
    """mean ± sample std over seeds, or '-'."""
    if not xs:
        return "-"
    text = f"{statistics.fmean(xs):.{digits}f}"
    if len(xs) > 1:
        text += f" ± {statistics.stdev(xs):.{digits}f}"
    return text


def by_label(results: Sequence[Result], key: str, metric: str, scale: float, **match: Any) -> dict[Any, float]:
    """The mean test metric of the finished runs matching `match`, by the value of their label `key`."""
    groups: dict[Any, list[float]] = defaultdict(list)
    for r, labels in rows(results, **match):
        if r.state == "done" and metric in reported(r):
            groups[labels[key]].append(scale * reported(r)[metric])
    return {k: statistics.fmean(v) for k, v in sorted(groups.items())}


def task_key(task: str, config: dict[str, Any]) -> str:
    """The paper's name of a task's dataset: lm and sentiment by their corpus."""
    params = config["task_params"]
    if task == "lm":
        return f"lm:{Path(params['corpus']).name}"
    if task == "sentiment":
        return f"sentiment:{Path(params['dataset']).name}"
    return task


# -- convergence and search ------------------------------------------------------------------------

REASONS = {
    "improving": "still improving",
    "too_few": "too few evaluations to tell",
    "plateau": "on a plateau",
    "flat": "flat",
    "solved": "solved",
    "unknown": "no convergence record (a run of older code)",
}


def converged(r: Result) -> bool:
    """Whether the run's training loop judged it converged; a run without a record has not."""
    return bool(r.convergence and r.convergence.get("converged"))


def reason(r: Result) -> str:
    return (r.convergence or {}).get("reason", "unknown")


def _gain(convergence: Mapping[str, Any]) -> str:
    """The improvement over the final window, in the metric's units: points of accuracy, or nats."""
    metric, gain = str(convergence.get("metric", "")), float(convergence.get("gain") or 0.0)
    if "acc" in metric or metric == "exact_match":
        return f"{100 * gain:+.1f} points"
    return f"{gain:+.3f}" + (" nats" if "loss" in metric else "")


def not_converged(r: Result, where: str) -> str | None:
    """None for a converged run; otherwise `where` and how far from converged it was, e.g.
    "retrieval/mixit seed 1: still improving, +3.2 points over steps 800-1200"."""
    if converged(r):
        return None
    c = r.convergence
    text = f"{where}: {REASONS.get(reason(r), reason(r))}"
    if c and c.get("gain") is not None:
        window = c.get("window")
        text += f", {_gain(c)}" + (f" over steps {window[0]}-{window[1]}" if window else "")
    return text


def converged_cell(found: Sequence[tuple[Result, dict[str, Any]]]) -> str:
    """How many finished runs of a cell converged: "3/3", or "2/3 (seed 1: improving)"."""
    done = [(r, labels) for r, labels in found if r.state == "done"]
    if not done:
        return "-"
    late = [f"seed {labels.get('seed', 0)}: {reason(r)}" for r, labels in done if not converged(r)]
    return f"{len(done) - len(late)}/{len(done)}" + (f" ({', '.join(late)})" if late else "")


def settings(chosen: Mapping[str, Any]) -> str:
    """Settings by the last segment of their dotted paths: "lr=0.003, n_heads=16"."""
    return ", ".join(
        f"{path.split('.')[-1]}={value:g}" if isinstance(value, float) else f"{path.split('.')[-1]}={value}"
        for path, value in chosen.items()
    )


# -- tables ------------------------------------------------------------------------------------------


def variant_table(
    results: Sequence[Result],
    table: str,
    task: str,
    variants: Sequence[str],
    paper: Mapping[tuple[str, str, str], float] | None = None,
    by: str | None = None,
    **match: Any,
) -> str:
    """A markdown table of the final runs labelled `table` and `task`: one row per variant (and per value
    of the label `by`, when given), the task's metrics (mean ± sample std over seeds), the paper's number
    beside ours, how many runs converged, the settings a search chose, and how many runs finished."""
    results = [r for r in results if r.role == "final"]
    column, key, scale = headline(task)
    extra = EXTRA_COLUMNS.get(task, [])
    found = rows(results, table=table, task=task, **match)
    if not found:
        return ""
    name = task_key(task, found[0][0].config)
    paper = {k: v for k, v in (paper or {}).items() if k[0] == name}  # the paper's numbers of this task
    digits = 3 if scale == 1 else 1
    cells: list[tuple[list[str], dict[str, Any]]] = []
    for variant in variants:
        if by is None:
            cells.append(([variant], {"variant": variant}))
            continue
        for level in sorted({labels[by] for _, labels in found if labels.get("variant") == variant}):
            cells.append(([variant, str(level)], {"variant": variant, by: level}))
    searched = any(r.chosen for r, _ in found)
    header = ["variant", *([by] if by else []), column]
    header += ["paper"] if paper else []
    header += [c for c, _, _ in extra] + ["converged"] + (["chosen"] if searched else []) + ["runs"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for leading, cell in cells:
        here = rows(results, table=table, task=task, **match, **cell)
        if not here:  # a variant this table does not train
            continue
        got = values(results, key, scale, table=table, task=task, **match, **cell)
        row = [*leading, fmt(got, digits)]
        if paper:
            theirs = paper.get((name, cell["variant"], column))
            row.append("-" if theirs is None else f"{theirs:g}")
        for extra_column, k, s in extra:
            text = fmt(values(results, k, s, table=table, task=task, **match, **cell), 3 if s == 1 else 1)
            theirs = paper.get((name, cell["variant"], extra_column))
            row.append(text + (f" (paper {theirs:g})" if theirs is not None else ""))
        row.append(converged_cell(here))
        if searched:
            row.append("; ".join(sorted({settings(r.chosen) for r, _ in here if r.chosen})) or "-")
        row.append(f"{len(got)}/{len(here)}")
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


# -- figures ---------------------------------------------------------------------------------------
# Each returns its Figure, saved to `path` if one is given, or None when there is nothing to plot (so the report's
# `if plot_lines(...):` reads as "if it drew one"). pyplot does not hold these figures, so nothing needs closing:
# the report, which only wants the files, drops them.


def _figure(width: float = 6.0, height: float = 4.0) -> tuple[Figure, Axes]:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), layout="constrained")
    return fig, fig.subplots()


def plot_curves(
    results: Sequence[Result], table: str, task: str, path: str | Path | None = None, **match: Any
) -> Figure | None:
    """Test metric against step, one line per variant: the mean over its seeds with a band from the lowest
    to the highest (`plot_cell_curves`); None when no run matching `table`, `task` and `match` has a curve."""
    cells: dict[str, list[Result]] = defaultdict(list)
    for r, labels in rows(results, table=table, task=task, **match):
        if r.curve:
            cells[labels["variant"]].append(r)
    return plot_cell_curves(cells, task, path)


def _finish_curves(fig: Figure, ax: Axes, task: str, note: str, path: str | Path | None) -> None:
    """Label a figure of `task`'s learning curves (its headline metric against step), with `note` under the
    title, and save it to `path` if one is given."""
    column = headline(task)[0]
    ax.set_xlabel("step")
    ax.set_ylabel(column + (" (%)" if column == "accuracy" else " (nats)"))
    ax.set_title(f"{task}: test {column} during training" + (f"\n{note}" if note else ""), fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    if path is not None:
        fig.savefig(path, dpi=100)


def plot_cell_curves(cells: Mapping[str, Sequence[Result]], task: str, path: str | Path | None = None) -> Figure | None:
    """Test metric against step, one line per cell: the mean over its seeds at the steps all of them evaluated,
    with a band from the lowest seed to the highest; None, and no file, when no cell has a curve."""
    curves = {name: [dict(r.curve) for r in found if r.curve] for name, found in cells.items()}
    curves = {name: seeds for name, seeds in curves.items() if seeds}
    if not curves:
        return None
    fig, ax = _figure()
    for name, seeds in curves.items():
        steps = sorted(set.intersection(*(set(c) for c in seeds)))
        values = [[c[step] for c in seeds] for step in steps]  # (steps, seeds)
        (line,) = ax.plot(
            steps, [statistics.fmean(v) for v in values], marker="o", markersize=3, label=f"{name} ({len(seeds)})"
        )
        if len(seeds) > 1:
            ax.fill_between(
                steps, [min(v) for v in values], [max(v) for v in values], color=line.get_color(), alpha=0.2
            )
    _finish_curves(fig, ax, task, "mean over the (n) seeds; band: lowest to highest", path)
    return fig


def plot_lines(
    series: dict[str, dict[Any, float]],
    xlabel: str,
    ylabel: str,
    title: str,
    path: str | Path | None = None,
    log2: bool = False,
) -> Figure | None:
    """One line per series (x -> y); None, and no file, when every series is empty."""
    series = {k: v for k, v in series.items() if v}
    if not series:
        return None
    fig, ax = _figure()
    for name, points in series.items():
        xs = sorted(points)
        ax.plot(xs, [points[x] for x in xs], marker="o", label=name)
    if log2:
        ax.set_xscale("log", base=2)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    if path is not None:
        fig.savefig(path, dpi=100)
    return fig


# -- results.csv -----------------------------------------------------------------------------------


def results_rows(results: Sequence[Result]) -> list[dict[str, Any]]:
    """One row per run, as a mapping of column to value: id, state, role, labels, every config field (dotted
    paths), every test and validation metric, whether it converged, and the settings a search chose."""

    def flat(prefix: str, d: dict[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for k, v in d.items():
            if isinstance(v, dict):
                out.update(flat(f"{prefix}{k}.", v))
            else:
                out[f"{prefix}{k}"] = v
        return out

    table = []
    for r in results:
        c = r.convergence or {}
        table.append(
            {
                "id": r.id,
                "state": r.state,
                "role": r.role,
                "tables": ";".join(sorted({lb["table"] for lb in r.labels})),
                **{f"label.{k}": v for k, v in r.labels[0].items() if k != "table"},
                **flat("", r.config),
                **{f"test.{k}": v for k, v in r.test.items()},
                **{f"val.{k}": v for k, v in r.val.items()},
                "selected.step": r.selected.get("step"),
                **{f"selected.test.{k}": v for k, v in (r.selected.get("test") or {}).items()},
                "converged": converged(r) if r.state == "done" else None,
                "reason": reason(r) if r.state == "done" else None,
                "gain": c.get("gain"),
                "steps_trained": c.get("steps_trained"),
                "stopped_early": c.get("stopped_early"),
                "chosen": settings(r.chosen),
                "train_seconds": r.seconds,
                "error": r.error,
            }
        )
    return table


def _columns(table: Sequence[Mapping[str, Any]]) -> list[str]:
    """Every column of `table`, in the order the rows first name them."""
    return list(dict.fromkeys(k for row in table for k in row))


def results_csv(results: Sequence[Result]) -> str:
    """`results_rows` as CSV text: what the report writes to results.csv."""
    table = results_rows(results)
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=_columns(table))
    writer.writeheader()
    writer.writerows(table)
    return out.getvalue()


def results_frame(study_dir: str | Path) -> pandas.DataFrame:
    """The table of results.csv as a pandas DataFrame, one row per run, read from the study's runs as they are
    now (no report needed; a run still training has its state and no metrics).

    The columns and rows are results.csv's; the values keep their Python types (a missing value is None, or
    NaN in a numeric column) instead of CSV text. Needs pandas (the `notebook` extra)."""
    pd = require_pandas()
    table = results_rows(collect(Path(study_dir)).results)
    return pd.DataFrame(table, columns=_columns(table))
