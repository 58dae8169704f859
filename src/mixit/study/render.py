"""A study's results as text: a paper table's cells as markdown, and one row per run (results.csv). What a table
shows of a task is the task's declaration (`Task.report_metric`, `report_columns`, `report_dataset`): nothing here
names a task."""

from __future__ import annotations

import csv
import io
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mixit.core.config import flatten
from mixit.core.run import require_pandas
from mixit.study.cells import converged, converged_cell, fmt, reason, rows, values
from mixit.study.collect import Result, collect, reported, task_class

if TYPE_CHECKING:
    import pandas


def settings(chosen: Mapping[str, Any]) -> str:
    """Settings by the last segment of their dotted paths: "lr=0.003, n_heads=16"."""
    return ", ".join(
        f"{path.split('.')[-1]}={value:g}" if isinstance(value, float) else f"{path.split('.')[-1]}={value}"
        for path, value in chosen.items()
    )


def paper_key(task: str, config: Mapping[str, Any]) -> str:
    """How `Table.paper` names a run's task: by its name, and its `Task.report_dataset` ("lm:wikitext-103")."""
    parameter = task_class(task).report_dataset
    return task if parameter is None else f"{task}:{Path(config['task_params'][parameter]).name}"


def variant_table(
    results: Sequence[Result],
    table: str,
    task: str,
    variants: Sequence[str],
    paper: Mapping[tuple[str, str, str], float] | None = None,
    by: str | None = None,
    **match: Any,
) -> str:
    """A markdown table of the final runs labelled `table` and `task`, a row per variant (and value of the label
    `by`): the task's metrics over seeds, the paper's beside them, convergence, settings chosen, runs finished."""
    results = [r for r in results if r.role == "final"]
    column, key, scale = task_class(task).report_metric
    extra = task_class(task).report_columns
    found = rows(results, table=table, task=task, **match)
    if not found:
        return ""
    name = paper_key(task, found[0][0].config)
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


def results_rows(results: Sequence[Result]) -> list[dict[str, Any]]:
    """One row per run, column -> value: id, state, role, labels, config (dotted paths), the test and validation
    metrics at the last evaluation and those the report gives (selected.*), convergence, the settings chosen."""
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
                **flatten(r.config),
                **{f"test.{k}": v for k, v in r.test.items()},
                **{f"val.{k}": v for k, v in r.val.items()},
                "selected.step": r.selected.get("step"),
                **{f"selected.test.{k}": v for k, v in reported(r).items()},
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
    """results.csv's table as a pandas DataFrame, read from the study's runs as they are now, its values in their
    Python types (None, or NaN in a numeric column, where missing). Needs pandas (the `notebook` extra)."""
    pd = require_pandas()
    table = results_rows(collect(Path(study_dir)).results)
    return pd.DataFrame(table, columns=_columns(table))
