"""The report's figures: learning curves of a study's cells, and lines of a number against what a table varies.
Each returns its Figure, saved to `path` if given, or None when there is nothing to plot (so that
`if plot_lines(...):` reads "if it drew one"). pyplot does not hold these figures: nothing needs closing.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mixit.study.cells import cell_name, rows
from mixit.study.collect import Result, task_class

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure


def _figure() -> tuple[Figure, Axes]:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6.0, 4.0), layout="constrained")
    return fig, fig.subplots()


def _finish(fig: Figure, ax: Axes, xlabel: str, ylabel: str, title: str, path: str | Path | None) -> None:
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    if path is not None:
        fig.savefig(path, dpi=100)


def plot_curves(
    results: Sequence[Result], table: str, task: str, path: str | Path | None = None, **match: Any
) -> Figure | None:
    """`plot_cell_curves` of the runs labelled `table` and `match` that train `task`, by cell (`cell_name`)."""
    cells: dict[str, list[Result]] = defaultdict(list)
    for r, labels in rows(results, table=table, **match):
        if r.config["task"] == task and r.curve:
            cells[cell_name(labels, *match)].append(r)
    return plot_cell_curves(cells, task, path)


def plot_cell_curves(cells: Mapping[str, Sequence[Result]], task: str, path: str | Path | None = None) -> Figure | None:
    """Test metric against step, one line per cell: the mean over its seeds at the steps all evaluated, with a
    band from the lowest seed to the highest."""
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
    column = task_class(task).report_metric[0]
    unit = " (%)" if column == "accuracy" else " (nats)"
    title = f"{task}: test {column} during training\nmean over the (n) seeds; band: lowest to highest"
    _finish(fig, ax, "step", column + unit, title, path)
    return fig


def plot_lines(
    series: dict[str, dict[Any, float]],
    xlabel: str,
    ylabel: str,
    title: str,
    path: str | Path | None = None,
    log2: bool = False,
    errors: Mapping[str, Mapping[Any, float | None]] | None = None,
) -> Figure | None:
    """One line per series (x -> y), with an error bar of half-width `errors[name][x]` where there is one."""
    series = {k: v for k, v in series.items() if v}
    if not series:
        return None
    fig, ax = _figure()
    for name, points in series.items():
        xs = sorted(points)
        bars = [(errors or {}).get(name, {}).get(x) for x in xs]
        yerr = [b or 0.0 for b in bars] if any(b is not None for b in bars) else None
        ax.errorbar(xs, [points[x] for x in xs], yerr=yerr, marker="o", capsize=3, label=name)
    if log2:
        ax.set_xscale("log", base=2)
    _finish(fig, ax, xlabel, ylabel, title, path)
    return fig
