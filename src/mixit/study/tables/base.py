"""`Table`: one table (or figure) of the paper as one object: its runs, its report section, its checks
and the paper's numbers it is compared with."""

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
    """The label "table" its runs carry ("table1"); the report and the checks find them by it."""
    title: str
    """The heading of its section in report.md."""
    runs: Callable[[Scale, Seeds], list[RunSpec]]
    """Its runs at a preset's scale, for a number of seeds, labelled table, task, variant, seed and
    whatever the table varies."""
    section: Callable[[StudyResults], list[str]]
    """Its section of report.md as markdown lines (none: no section); it writes its own figures into
    `StudyResults.figures`."""
    checks: tuple[Callable[[StudyResults], Check], ...] = ()
    """The paper's findings it judges, each a function of the study's results (`mixit.study.verdicts.judge`)."""
    paper: Mapping[tuple[str, str, str], float] = field(default_factory=dict)
    """The paper's numbers (arXiv 2506.01115 v3): (task key, variant, column) -> value, in percent or nats."""
    extras: Callable[[Scale, Seeds], dict[str, dict[str, Any]]] = no_extras
    """Work beside the runs (`Study.extras`: name -> options of `mixit.analysis.signal.signal_command`)."""
