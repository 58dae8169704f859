"""The paper's comparison as a study: every table's runs at a preset's scale.

The tables (`mixit.study.tables.TABLES`) say what to train, the presets (`mixit.study.presets`) at what
scale; `paper_study` collects their runs (a run asked for by two tables is trained once) and the work
beside the runs (the signal sweeps of Tables 6-7). The protocol it carries out is docs/protocol.md: the
first look's seeds, budgets extended where a cell is still moving, and seeds added where a finding is
undecided (`more_seeds`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from mixit.core.config import check
from mixit.study.collect import Result, collect
from mixit.study.presets import PRESETS
from mixit.study.spec import MAX_RUNS, RunSpec, Study, check_size, seed_range
from mixit.study.tables import TABLES
from mixit.study.verdicts import RULE, PartVerdict


def paper_study(
    preset: str, seeds: int | None = None, first_seed: int = 0, test_seed: int | None = None, max_runs: int = MAX_RUNS
) -> Study:
    """The paper's comparison at the scale of `preset` (smoke, quick, gpu or paper), `seeds` seeds per cell (None:
    the preset's first look, with the sequential design's seeds added where a finding is undecided) from
    `first_seed` on (a second study with seeds no other used: `first_seed` past the first's), its test sets drawn
    with `test_seed` (None: the preset's). With `seeds` given, the study has exactly those: no seed is added. One
    that may ask for more than `max_runs` final runs is refused before it is built (`check_size`)."""
    check(preset in PRESETS, f"unknown preset {preset!r}; allowed: {', '.join(PRESETS)}")
    scale = PRESETS[preset]
    if test_seed is not None:
        scale = replace(
            scale, tasks={name: {**request, "test_seed": test_seed} for name, request in scale.tasks.items()}
        )
    adaptive = seeds is None and scale.max_seeds > scale.seeds
    n = scale.seeds if seeds is None else seeds
    chosen = seed_range(n, first_seed)
    per_seed = sum(len(table.runs(scale, seed_range(1, first_seed))) for table in TABLES)
    check_size(per_seed * (scale.max_seeds if adaptive else n), max_runs, f"preset {preset} with {n:,} seeds")
    return Study(
        f"paper-{preset}",
        [spec for table in TABLES for spec in table.runs(scale, chosen)],
        scale.description,
        preset,
        n,
        first_seed,
        extras={name: options for table in TABLES for name, options in table.extras(scale, n).items()},
        screen_fraction=scale.screen_fraction,
        screen_min_steps=dict(scale.screen_min_steps),
        rebuild=lambda more, first: paper_study(preset, more, first, test_seed, max_runs),
        extend=scale.extend,
        more_seeds=more_seeds(preset, first_seed, test_seed, scale.max_seeds) if adaptive else None,
    )


def more_seeds(preset: str, first_seed: int, test_seed: int | None, max_seeds: int) -> Callable[[Path], list[RunSpec]]:
    """The sequential design (docs/protocol.md): given a study directory, the final runs of the seeds to add,
    a pure function of what has finished there. Every cell that a part left undecided by its interval (or
    provisional) reads gets seeds up to the rule's next look (`Rule.next_look`), at most `max_seeds`; a finding
    with an input missing (n/a) adds none until it has them."""

    def more(study_dir: Path) -> list[RunSpec]:
        study = collect(study_dir)
        undecided = [part for table in TABLES for finding in table.checks for part in finding(study).undecided()]
        grown = paper_study(preset, max_seeds, first_seed, test_seed)
        return seeds_to_add(undecided, study.final, grown.specs, first_seed, max_seeds)

    return more


def seeds_to_add(
    undecided: Iterable[PartVerdict],
    final: Sequence[Result],
    grown: Sequence[RunSpec],
    first_seed: int,
    max_seeds: int,
) -> list[RunSpec]:
    """One step of the sequential design, for any study: the runs of `grown` (the study at `max_seeds` seeds) to
    train. Every cell an `undecided` part reads gets seeds up to the rule's next look (`Rule.next_look`), at most
    `max_seeds`; the seeds among the `final` runs stay asked for whatever the verdicts now say, so a study only
    grows."""
    wanted: list[tuple[Mapping[str, Any], int]] = []
    for part in undecided:
        target = RULE.next_look(len(part.seeds))
        if target is not None and target <= max_seeds:
            wanted += [(cell, target) for cell in part.cells]
    present = {_key(labels) for r in final for labels in r.labels}
    return [
        spec
        for spec in grown
        if _key(spec.labels) in present
        or any(_matches(spec, cell) and spec.labels["seed"] < first_seed + n for cell, n in wanted)
    ]


def _key(labels: Mapping[str, Any]) -> str:
    """A final run's labels without its budget (`mixit.study.collect`): one cell and seed."""
    return json.dumps({k: v for k, v in labels.items() if k != "budget"}, sort_keys=True, default=str)


def _matches(spec: RunSpec, cell: Mapping[str, Any]) -> bool:
    return all(spec.labels.get(key) == value for key, value in cell.items())


__all__ = ["PRESETS", "paper_study"]
