"""The tables of the paper study, one module each, every one a `Table`: its runs, its section of the
report, its checks and the paper's numbers (`mixit.study.tables.base`).

Adding a table is one new module defining ``TABLE = Table(...)`` and its line in `TABLES`
(docs/extending.md, "A table of the study"); `mixit.study.paper.paper_study` trains its runs and
`mixit.study.report.write_report` writes its section and judges its checks.
"""

from __future__ import annotations

from mixit.study.tables import pairs, table1, table2, table3, table4, table5, table6_7
from mixit.study.tables.base import Table

TABLES: list[Table] = [
    table1.TABLE,
    table2.TABLE,
    table3.TABLE,
    table4.TABLE,
    table5.TABLE,
    table6_7.TABLE,
    pairs.TABLE,
]
"""Every table of the paper study, in the report's order."""

__all__ = ["TABLES", "Table"]
