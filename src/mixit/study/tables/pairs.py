"""Beyond the paper: MixiT and the standard model against the number of retrieval pairs.

How retrieval accuracy falls as an example stores more pairs (a longer sequence), for a model whose
attention can route by content and one whose attention cannot. No finding of the paper to check.
"""

from __future__ import annotations

from mixit.study.cells import by_label
from mixit.study.collect import StudyResults
from mixit.study.figures import plot_lines
from mixit.study.presets import Scale
from mixit.study.render import variant_table
from mixit.study.spec import RunSpec, Seeds, grid
from mixit.study.tables.base import Table

VARIANTS = ("standard", "mixit")


def runs(scale: Scale, seeds: Seeds) -> list[RunSpec]:
    """Beyond the paper: MixiT and the standard model against the number of retrieval pairs (the scale's
    "pairs" request if it has one, else its retrieval); none where the scale sweeps no pairs."""
    if not scale.retrieval_pairs:
        return []
    return grid(
        scale.tasks.get("pairs", scale.tasks["retrieval"]),
        {"variant": list(VARIANTS), "task_params.max_pairs": list(scale.retrieval_pairs)},
        seeds,
        {"table": "pairs", "task": "retrieval"},
    )


def section(study: StudyResults) -> list[str]:
    body: list[str] = []
    table = variant_table(study.final, "pairs", "retrieval", VARIANTS, by="max_pairs")
    if table:
        body += [table, ""]
    by_pairs = {v: by_label(study.final, "max_pairs", "token_acc", 100, table="pairs", variant=v) for v in VARIANTS}
    if plot_lines(
        by_pairs,
        "max pairs (sequence length 2 max_pairs + 3)",
        "accuracy (%)",
        "retrieval accuracy against sequence length",
        study.figures / "pairs.png",
    ):
        body.append("![pairs](figures/pairs.png)")
    return body


TABLE = Table("pairs", "Beyond the paper: retrieval against the number of pairs (sequence length)", runs, section)
