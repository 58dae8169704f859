"""The paper's comparison as a study: every table's runs at a preset's scale.

The tables (`mixit.study.tables.TABLES`) say what to train, the presets (`mixit.study.presets`) at what
scale; `paper_study` collects their runs (a run asked for by two tables is trained once) and the work
beside the runs (the signal sweeps of Tables 6-7).
"""

from __future__ import annotations

from dataclasses import replace

from mixit.config import check
from mixit.study.presets import PRESETS
from mixit.study.spec import Study, seed_range
from mixit.study.tables import TABLES


def paper_study(preset: str, seeds: int | None = None, first_seed: int = 0, test_seed: int | None = None) -> Study:
    """The paper's comparison at the scale of `preset` (smoke, quick, gpu or paper), `seeds` seeds per cell (None:
    the preset's first look) from `first_seed` on (a second study with seeds no other used: `first_seed` past the
    first's), its test sets drawn with `test_seed` (None: the preset's)."""
    check(preset in PRESETS, f"unknown preset {preset!r}; allowed: {', '.join(PRESETS)}")
    scale = PRESETS[preset]
    if test_seed is not None:
        scale = replace(
            scale, tasks={name: {**request, "test_seed": test_seed} for name, request in scale.tasks.items()}
        )
    seeds = seeds or scale.seeds
    chosen = seed_range(seeds, first_seed)
    return Study(
        f"paper-{preset}",
        [spec for table in TABLES for spec in table.runs(scale, chosen)],
        scale.description,
        preset,
        seeds,
        first_seed,
        extras={name: options for table in TABLES for name, options in table.extras(scale, seeds).items()},
        screen_fraction=scale.screen_fraction,
        screen_min_steps=dict(scale.screen_min_steps),
        rebuild=lambda more, first: paper_study(preset, more, first, test_seed),
    )


__all__ = ["PRESETS", "paper_study"]
