"""The tables of the paper study, one module each defining ``TABLE = Table(...)`` (`mixit.study.tables.base`);
adding one is a new module and its name in `NAMES` (docs/extending.md, "A table of the study")."""

from __future__ import annotations

import importlib

from mixit.study.tables.base import Table

NAMES = ("table1", "table2", "table3", "table4", "table5", "table6_7", "pairs")
"""The table modules, in the report's order."""

TABLES: list[Table] = [importlib.import_module(f"{__name__}.{name}").TABLE for name in NAMES]

__all__ = ["NAMES", "TABLES", "Table"]
