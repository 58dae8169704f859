"""The tables of the paper study, one module each, every one a `Table`: its runs, its section of the
report, its checks and the paper's numbers (`mixit.study.tables.base`).

Adding a table is one new module in this package defining ``TABLE = Table(...)`` and its name in
`NAMES` (docs/extending.md, "A table of the study"); `mixit.study.paper.paper_study` trains its runs
and `mixit.study.report.write_report` writes its section and judges its checks.
"""

from __future__ import annotations

import importlib

from mixit.study.tables.base import Table

NAMES = ("table1", "table2", "table3", "table4", "table5", "table6_7", "pairs")
"""The table modules of this package, in the report's order: the one line a new table adds itself to."""

TABLES: list[Table] = [importlib.import_module(f"{__name__}.{name}").TABLE for name in NAMES]
"""Every table of the paper study, in the report's order."""

__all__ = ["NAMES", "TABLES", "Table"]
