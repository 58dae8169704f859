"""The paper's comparison as a study: every table's runs (`mixit.study.tables.TABLES`) at a preset's scale
(`mixit.study.presets`), and the protocol (docs/protocol.md) any study of a preset's sizes follows
(`protocol_study`): the first look's seeds, budgets extended where a cell is still moving, and seeds added where
a finding is undecided.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from mixit.core.config import check
from mixit.study.collect import StudyResults, collect
from mixit.study.presets import PRESETS, Scale
from mixit.study.spec import MAX_RUNS, RunSpec, Study, check_size, seed_range
from mixit.study.tables import TABLES
from mixit.study.verdicts import RULE, PartVerdict


def paper_study(
    preset: str, seeds: int | None = None, first_seed: int = 0, test_seed: int | None = None, max_runs: int = MAX_RUNS
) -> Study:
    """The paper's comparison at the scale of `preset` (smoke, quick, gpu or paper), its test sets drawn with
    `test_seed` (None: the preset's); the seeds as `protocol_study` takes them (a second study uses seeds no other
    did: `first_seed` past the first's)."""
    check(preset in PRESETS, f"unknown preset {preset!r}; allowed: {', '.join(PRESETS)}")
    scale = PRESETS[preset]
    if test_seed is not None:
        scale = replace(
            scale, tasks={name: {**request, "test_seed": test_seed} for name, request in scale.tasks.items()}
        )
    cells = seed_range(scale.seeds if seeds is None else seeds, first_seed)
    return protocol_study(
        f"paper-{preset}",
        scale,
        runs=lambda chosen: [spec for table in TABLES for spec in table.runs(scale, chosen)],
        seeds=seeds,
        first_seed=first_seed,
        max_runs=max_runs,
        what=f"preset {preset}",
        rebuild=lambda more, first: paper_study(preset, more, first, test_seed, max_runs),
        undecided=lambda study: [
            part for table in TABLES for finding in table.checks for part in finding(study).undecided()
        ],
        description=scale.description,
        preset=preset,
        extras={name: options for table in TABLES for name, options in table.extras(scale, cells).items()},
    )


def protocol_study(
    name: str,
    scale: Scale,
    *,
    runs: Callable[[range], list[RunSpec]],
    seeds: int | None,
    first_seed: int,
    max_runs: int,
    what: str,
    rebuild: Callable[[int, int], Study],
    undecided: Callable[[StudyResults], Iterable[PartVerdict]],
    **fields: Any,
) -> Study:
    """The study of `runs` (its specs for some seeds) under docs/protocol.md at `scale`, searched and extended, with
    `seeds` seeds per cell from `first_seed`: exactly those, or with None the scale's first look and then the
    sequential design (`more_seeds`, below). One that may ask for more than `max_runs` final runs is refused before
    it is built (`what` names it); `rebuild(seeds, first_seed)` builds it again."""
    adaptive = seeds is None and scale.max_seeds > scale.seeds
    n = scale.seeds if seeds is None else seeds
    chosen = seed_range(n, first_seed)
    per_seed = len(runs(seed_range(1, first_seed)))
    check_size(per_seed * (scale.max_seeds if adaptive else n), max_runs, f"{what} with {n:,} seeds")

    def more_seeds(study_dir: Path) -> list[RunSpec]:
        """One step of the sequential design, a pure function of the runs finished in `study_dir`: every cell an
        `undecided` part reads gets seeds up to the rule's next look, at most the scale's `max_seeds`; seeds once
        asked for stay asked for, whatever the verdicts now say, so a study only grows."""
        study = collect(study_dir)
        wanted = [
            (cell, target)
            for part in undecided(study)
            if (target := RULE.next_look(len(part.seeds))) is not None and target <= scale.max_seeds
            for cell in part.cells
        ]
        present = {_key(labels) for r in study.final for labels in r.labels}
        return [
            spec
            for spec in rebuild(scale.max_seeds, first_seed).specs
            if _key(spec.labels) in present
            or any(
                all(spec.labels.get(k) == v for k, v in cell.items()) and spec.labels["seed"] < first_seed + target
                for cell, target in wanted
            )
        ]

    return Study(
        name,
        runs(chosen),
        seeds=n,
        first_seed=first_seed,
        screen_fraction=scale.screen_fraction,
        screen_min_steps=dict(scale.screen_min_steps),
        rebuild=rebuild,
        extend=scale.extend,
        more_seeds=more_seeds if adaptive else None,
        **fields,
    )


def _key(labels: Mapping[str, Any]) -> str:
    """A final run's labels without its budget (`mixit.study.collect`): one cell and seed."""
    return json.dumps({k: v for k, v in labels.items() if k != "budget"}, sort_keys=True, default=str)


__all__ = ["PRESETS", "paper_study"]
