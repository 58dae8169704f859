"""`Table`: one table (or figure) of the paper as one object: its runs, its report section, its checks
and the paper's numbers it is compared with (docs/extending.md, "A table of the study", describes each field)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from mixit.study.collect import StudyResults
from mixit.study.presets import Scale
from mixit.study.spec import RunSpec, Seeds
from mixit.study.verdicts import Check


def no_extras(scale: Scale, seeds: Seeds) -> dict[str, dict[str, Any]]:
    return {}


@dataclass(frozen=True)
class Table:
    """One unit of the paper study; `mixit.study.tables.TABLES` lists them in the report's order."""

    name: str
    """The label "table" its runs carry; the report and the checks find them by it."""
    title: str
    runs: Callable[[Scale, Seeds], list[RunSpec]]
    section: Callable[[StudyResults], list[str]]
    """Its section of report.md as markdown lines; it writes its own figures into `StudyResults.figures`."""
    checks: tuple[Callable[[StudyResults], Check], ...] = ()
    paper: Mapping[tuple[str, str, str], float] = field(default_factory=dict)
    """The paper's numbers (arXiv 2506.01115 v3): (task key, variant, column) -> value, in percent or nats."""
    extras: Callable[[Scale, Seeds], dict[str, dict[str, Any]]] = no_extras
    """Work beside the runs (`Study.extras`)."""
