"""The atlas: which parts of the model each task needs, read as a map (docs/atlas.md). For each task, a grid
of regimes at a preset's sizes, searched and seeded as the paper study is:

    standard               the model as it is
    frozen, PART           PART kept at its initialisation, everything else trained
    alone, PART            PART trained, everything else kept at its initialisation
    mixit                  MixiT: fixed random mixing in place of attention
    transplant             the same seed's standard run's average attention pattern, fixed (a stage after it)

Every cell is judged over seeds by the paper's rule, one part: its number - (standard - `TOLERANCE`), Table 3's
"matches". A part's **drop** (frozen) reads PASS as *not needed*, FAIL as *needed*; its **reach** (trained alone)
PASS as *enough*, FAIL as *not enough*; else *undecided*.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mixit.core.config import check
from mixit.core.experiment import merge, resolve
from mixit.core.models import ATTENTION
from mixit.errors import UsageError
from mixit.study.collect import Result, StudyResults
from mixit.study.paper import protocol_study
from mixit.study.presets import ALGORITHMIC, PRESETS, Scale
from mixit.study.spec import MAX_RUNS, RunSpec, Seeds, Study, grid
from mixit.study.verdicts import RULE, Check, Part, accuracy, judge

PARTS: dict[str, tuple[str, ...]] = {
    "embed": ("embed",),
    "pos": ("pos_embed",),
    "qk": ("blocks.*.attn.q", "blocks.*.attn.k"),
    "v": ("blocks.*.attn.v",),
    "o": ("blocks.*.attn.o",),
    "mlp": ("blocks.*.mlp",),
    "norms": ("norms",),
    "head": ("head",),
}
"""The parts of the map, as freeze selectors (docs/model.md, "Freezing by structure")."""

WHOLE = ("mixit", "transplant")
"""The regimes of the map's last columns, each a drop from the standard model."""

TASKS = ALGORITHMIC
ATLAS_PRESETS = ("smoke", "quick")
TOLERANCE = 5.0
"""Points of accuracy within which a regime matches the standard model: Table 3's threshold."""
TABLE = "atlas"
"""The `table` label of every atlas run."""


def parts_of(request: Mapping[str, Any]) -> list[str]:
    """The parts of `PARTS` the model of `request` has: positions only where its attention kind learns them."""
    learned = ATTENTION.get(resolve(request).model.attention).learned_positions
    return [part for part in PARTS if part != "pos" or learned]


def task_runs(scale: Scale, task: str, seeds: Seeds) -> list[RunSpec]:
    """Every run of `task`'s grid for each seed, each with the scale's search candidates."""
    base = scale.tasks[task]
    parts = parts_of(base)
    labels = {"table": TABLE, "task": task}

    def cell(request: Mapping[str, Any], variant: str, **more: Any) -> list[RunSpec]:
        search = scale.search_for(task, variant)
        return grid(request, {"variant": [variant]}, seeds, {**labels, **more}, search=search)

    specs = cell(base, "standard", regime="standard")
    for part in parts:
        specs += cell(merge(base, {"freeze": list(PARTS[part])}), "standard", regime="frozen", part=part)
        others = [selector for other in parts if other != part for selector in PARTS[other]]
        specs += cell(merge(base, {"freeze": others}), "standard", regime="alone", part=part)
    specs += cell(base, "mixit", regime="mixit")
    for spec in cell(merge(base, {"transplant_part": "pattern"}), "standard", regime="transplant"):
        donor = {**labels, "regime": "standard", "variant": "standard", "seed": spec.labels["seed"]}
        specs.append(RunSpec(spec.request, spec.labels, spec.analyze, spec.search, donor))
    return specs


def check_tasks(tasks: Sequence[str]) -> list[str]:
    """`tasks` as a list, refused unless it names one or more of `TASKS`, each once."""
    check(len(tasks) > 0, f"an atlas needs one task or more (--task NAME, repeatable); allowed: {', '.join(TASKS)}")
    for task in tasks:
        check(task in TASKS, f"the atlas maps the algorithmic tasks; {task!r} is not one: allowed: {', '.join(TASKS)}")
    check(len(set(tasks)) == len(tasks), f"tasks list a task more than once ({', '.join(tasks)}); list each once")
    return list(tasks)


def atlas_study(
    tasks: Sequence[str],
    preset: str = "quick",
    seeds: int | None = None,
    first_seed: int = 0,
    max_runs: int = MAX_RUNS,
    name: str | None = None,
) -> Study:
    """The atlas of `tasks` at `preset`'s sizes, runnable as any study and searched, extended, seeded and judged as
    the paper study is (`mixit.study.paper.protocol_study`, its undecided parts those of the words). Named
    atlas-PRESET unless `name` says otherwise."""
    tasks = check_tasks(tasks)
    check(preset in ATLAS_PRESETS, f"unknown atlas preset {preset!r}; allowed: {', '.join(ATLAS_PRESETS)}")
    scale = PRESETS[preset]
    name = name or f"atlas-{preset}"
    return protocol_study(
        name,
        scale,
        runs=lambda chosen: [spec for task in tasks for spec in task_runs(scale, task, chosen)],
        seeds=seeds,
        first_seed=first_seed,
        max_runs=max_runs,
        what="the atlas",
        rebuild=lambda more, first: atlas_study(tasks, preset, more, first, max_runs, name),
        undecided=lambda study: [part for word in words(study.final, tasks) for part in word.check.undecided()],
        description=f"which parts {', '.join(tasks)} need, at the {preset} preset's sizes",
        preset=TABLE,
        source={"atlas": {"tasks": tasks, "preset": preset}},
    )


@dataclass
class Word:
    """One cell of the map: a regime of a task against the standard model, judged over seeds."""

    task: str
    regime: str
    """frozen, alone, mixit or transplant."""
    part: str
    """The part frozen or trained alone ("" for mixit and transplant)."""
    check: Check

    @property
    def word(self) -> str:
        """The word read off the interval (module docstring); n/a while a run is missing."""
        yes, no = ("enough", "not enough") if self.regime == "alone" else ("not needed", "needed")
        verdict = self.check.verdict
        return {"PASS": yes, "FAIL": no, "n/a": "n/a"}.get(verdict, "undecided")

    def gap(self) -> dict[str, Any] | None:
        """standard - the regime: its mean over seeds and its one-sided bounds; None while a run is missing."""
        if not self.check.parts:
            return None
        part = self.check.parts[0]
        low, high = (TOLERANCE - part.interval[1], TOLERANCE - part.interval[0]) if part.interval else (None, None)
        return {"mean": TOLERANCE - part.mean, "low": low, "high": high, "seeds": len(part.seeds)}

    def means(self) -> dict[str, float]:
        """The mean number of each cell over the seeds judged."""
        part = self.check.parts[0]
        found: dict[str, list[float]] = {}
        for seed in part.seeds:
            for reading in seed.cells:
                found.setdefault(reading.cell, []).append(reading.value)
        return {cell: sum(values) / len(values) for cell, values in found.items()}


def words(results: Sequence[Result], tasks: Sequence[str]) -> list[Word]:
    """Every cell of the map of `tasks`, judged on the final runs among `results` (`verdicts.judge`)."""
    found = []
    for task in tasks:
        present = {labels.get("part") for r in results for labels in r.labels if labels.get("task") == task}
        cells = [("frozen", p) for p in PARTS if p in present] + [("alone", p) for p in PARTS if p in present]
        for regime, part in [*cells, *((w, "") for w in WHOLE)]:
            match = {"table": TABLE, "regime": regime, **({"part": part} if part else {})}
            name = f"{task}/{regime}" + (f" {part}" if part else "")
            standard = accuracy("standard", task, table=TABLE, regime="standard")
            other = accuracy(name, task, **match)
            margin = Part(f"{name} within {TOLERANCE:g} points of standard", [standard, other], _within(name))
            found.append(Word(task, regime, part, judge(name, results, [margin])))
    return found


def _within(name: str) -> Callable[[Mapping[str, float]], float]:
    """The margin of cell `name` against the standard model: its number - (standard's - `TOLERANCE`)."""
    return lambda x: x[name] - (x["standard"] - TOLERANCE)


def atlas_map(study: StudyResults) -> dict[str, Any]:
    """The atlas of a study's results: per task, each cell's means, gap and word."""
    tasks = list(study.record.get("file", {}).get("atlas", {}).get("tasks", []))
    found = words(study.final, tasks)
    return {
        "tolerance": TOLERANCE,
        "level": RULE.level,
        "tasks": tasks,
        "cells": [
            {
                "task": w.task,
                "regime": w.regime,
                "part": w.part,
                "word": w.word,
                "verdict": w.check.verdict,
                "gap": w.gap(),
                "means": w.means() if w.check.parts else {},
                "why": w.check.blocking,
            }
            for w in found
        ],
    }


def _number(value: float | None, digits: int = 1) -> str:
    return "" if value is None else f"{value:.{digits}f}"


def _gap(cell: Mapping[str, Any]) -> str:
    gap = cell["gap"]
    if gap is None:
        return "n/a"
    bounds = f" [{gap['low']:+.1f}, {gap['high']:+.1f}]" if gap["low"] is not None else ""
    return f"{gap['mean']:+.1f}{bounds} ({gap['seeds']} seeds)"


def atlas_section(study: StudyResults) -> list[str]:
    """The report's atlas: how to read it, a table per task and the two heatmaps."""
    found = atlas_map(study)
    if not found["tasks"]:
        return []
    level = round(100 * found["level"], 1)
    lines = [
        f"Per task, the drop when a part is frozen (standard - frozen alone) and the reach when only it trains "
        f"(trained alone, and its gap standard - alone), in points of accuracy: the mean over seeds with its "
        f"one-sided bounds at {level}% each (the paper's rule, docs/protocol.md). A word is read off the bounds: "
        f"the regime within {TOLERANCE:g} points of standard (the lower bound of its margin above 0) is *not "
        f"needed* when frozen and *enough* alone; more than {TOLERANCE:g} points below it (the upper bound below 0) "
        "is *needed* and *not enough*; else *undecided*. MixiT and the transplant are drops of attention itself.",
        "",
    ]
    for task in found["tasks"]:
        cells = [c for c in found["cells"] if c["task"] == task]
        lines += [f"### {task}", "", "| part | frozen alone | drop | word | alone | gap | word |", "|---" * 7 + "|"]
        parts = [c["part"] for c in cells if c["regime"] == "frozen"]
        by = {(c["regime"], c["part"]): c for c in cells}
        for part in parts:
            frozen, alone = by["frozen", part], by["alone", part]
            lines.append(
                f"| {part} | {_number(frozen['means'].get(f'{task}/frozen {part}'))} | {_gap(frozen)} | "
                f"{frozen['word']} | {_number(alone['means'].get(f'{task}/alone {part}'))} | {_gap(alone)} | "
                f"{alone['word']} |"
            )
        for regime in WHOLE:
            cell = by[regime, ""]
            lines.append(
                f"| {regime} | {_number(cell['means'].get(f'{task}/{regime}'))} | {_gap(cell)} | {cell['word']} | | | |"
            )
        standard = next((c["means"]["standard"] for c in cells if "standard" in c["means"]), None)
        lines += ["", f"Standard: {_number(standard)}.", ""]
    figures = study.figures
    for what, regime in (("drop", "frozen"), ("reach", "alone")):
        if plot_map(found, regime, figures / f"atlas-{what}.png") is not None:
            lines.append(f"![the {what}](figures/atlas-{what}.png)")
    return lines


def plot_map(found: Mapping[str, Any], regime: str, path: Path | None = None) -> Any:
    """A heatmap, tasks x parts, of the drop (`regime` frozen, with `WHOLE` last) or of the reach's gap (alone),
    each cell annotated with its word; None if no cell has a number."""
    from matplotlib.figure import Figure

    columns = [p for p in PARTS if any(c["part"] == p for c in found["cells"])]
    columns += list(WHOLE) if regime == "frozen" else []
    tasks = found["tasks"]
    values = [[math.nan] * len(columns) for _ in tasks]
    notes = [[""] * len(columns) for _ in tasks]
    for c in found["cells"]:
        if c["regime"] not in (regime, *(WHOLE if regime == "frozen" else ())) or c["task"] not in tasks:
            continue
        column = c["part"] or c["regime"]
        if column not in columns:
            continue
        i, j = tasks.index(c["task"]), columns.index(column)
        values[i][j] = c["gap"]["mean"] if c["gap"] else math.nan
        notes[i][j] = c["word"]
    if all(math.isnan(v) for row in values for v in row):
        return None
    fig = Figure(figsize=(1.1 * len(columns) + 2, 0.7 * len(tasks) + 1.6), layout="constrained")
    ax = fig.subplots()
    image = ax.imshow(values, cmap="Reds", vmin=0, vmax=100, aspect="auto")
    ax.set_xticks(range(len(columns)), columns)
    ax.set_yticks(range(len(tasks)), tasks)
    for i, row in enumerate(notes):
        for j, note in enumerate(row):
            number = "" if math.isnan(values[i][j]) else f"{values[i][j]:+.0f}\n"
            ax.text(j, i, number + note, ha="center", va="center", fontsize=7)
    what = "drop: standard - frozen alone" if regime == "frozen" else "reach: standard - trained alone"
    ax.set_title(f"{what} (points)", fontsize=10)
    fig.colorbar(image, ax=ax)
    if path is not None:
        fig.savefig(path, dpi=100)
    return fig


def read_atlas_file(data: Mapping[str, Any], where: str) -> tuple[list[str], str]:
    """A study file's atlas table ({tasks = [...], preset = "quick"}): its tasks and preset."""
    atlas = data["atlas"]
    check(isinstance(atlas, dict), f"{where}: atlas must be a table of tasks and preset")
    unknown = sorted(set(atlas) - {"tasks", "preset"})
    check(not unknown, f"{where}: atlas: unknown key(s) {', '.join(unknown)}; allowed: tasks, preset")
    tasks = atlas.get("tasks")
    check(isinstance(tasks, list), f"{where}: atlas.tasks must list the tasks, got {tasks!r}")
    try:
        check_tasks(tasks)
    except UsageError as e:
        raise UsageError(f"{where}: {e}") from None
    preset = atlas.get("preset", "quick")
    check(preset in ATLAS_PRESETS, f"{where}: atlas.preset must be one of {', '.join(ATLAS_PRESETS)}, got {preset!r}")
    return tasks, preset
