"""The cells of a study (a variant of a task, at what its table varies, over seeds): their runs selected by
label, their numbers over seeds, and whether their runs converged, in the words the report uses."""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

from mixit.study.collect import Result, reported
from mixit.study.spec import BUDGET


def rows(results: Sequence[Result], **match: Any) -> list[tuple[Result, dict[str, Any]]]:
    """(result, labels) for every label set of every result that matches `match`."""
    return [(r, labels) for r in results for labels in r.labels if all(labels.get(k) == v for k, v in match.items())]


def values(results: Sequence[Result], metric: str, scale: float = 1.0, **match: Any) -> list[float]:
    """The reported test metric of every finished run matching `match` (one value per seed)."""
    return [
        scale * reported(r)[metric] for r, _ in rows(results, **match) if r.state == "done" and metric in reported(r)
    ]


def cell_name(labels: Mapping[str, Any], *leave: str) -> str:
    """A cell's name in a figure: its labels' values but table, task, seed, budget and `leave` ("mixit, 0.01"),
    or "all"."""
    kept = [str(v) for k, v in labels.items() if k not in ("table", "task", "seed", BUDGET, *leave)]
    return ", ".join(kept) or "all"


def spread(xs: Sequence[float]) -> tuple[float, float | None]:
    """The mean and sample standard deviation over seeds (None for a single seed) of a non-empty `xs`."""
    return statistics.fmean(xs), statistics.stdev(xs) if len(xs) > 1 else None


def fmt(xs: Sequence[float], digits: int = 1) -> str:
    """mean ± sample std over seeds (`spread`), or '-'."""
    if not xs:
        return "-"
    centre, std = spread(xs)
    return f"{centre:.{digits}f}" + ("" if std is None else f" ± {std:.{digits}f}")


def by_label(results: Sequence[Result], key: str, metric: str, scale: float, **match: Any) -> dict[Any, float]:
    """The mean test metric of the finished runs matching `match`, by the value of their label `key`."""
    groups: dict[Any, list[float]] = defaultdict(list)
    for r, labels in rows(results, **match):
        if r.state == "done" and metric in reported(r):
            groups[labels[key]].append(scale * reported(r)[metric])
    return {k: statistics.fmean(v) for k, v in sorted(groups.items())}


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
    """Why the run's training loop judged it converged or not (`REASONS`'s keys)."""
    return (r.convergence or {}).get("reason", "unknown")


def not_converged(r: Result, where: str) -> str | None:
    """None for a converged run, else `where` and how far from converged it was: "retrieval/mixit seed 1: still
    improving, +3.2 points over steps 800-1200"."""
    if converged(r):
        return None
    c = r.convergence
    text = f"{where}: {REASONS.get(reason(r), reason(r))}"
    if c and c.get("gain") is not None:
        metric, gain, window = str(c.get("metric", "")), float(c["gain"]), c.get("window")
        if "acc" in metric or metric == "exact_match":
            text += f", {100 * gain:+.1f} points"
        else:
            text += f", {gain:+.3f}" + (" nats" if "loss" in metric else "")
        text += f" over steps {window[0]}-{window[1]}" if window else ""
    return text


def converged_cell(found: Sequence[tuple[Result, dict[str, Any]]]) -> str:
    """How many finished runs of a cell converged: "3/3", or "2/3 (seed 1: improving)"."""
    done = [(r, labels) for r, labels in found if r.state == "done"]
    if not done:
        return "-"
    late = [f"seed {labels.get('seed', 0)}: {reason(r)}" for r, labels in done if not converged(r)]
    return f"{len(done) - len(late)}/{len(done)}" + (f" ({', '.join(late)})" if late else "")
