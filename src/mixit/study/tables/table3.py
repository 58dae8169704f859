"""Table 3: arithmetic, parenthesis balancing, memorization and sentiment.

The paper's finding: on tasks that need no input-dependent routing, MixiT matches the standard model.
Memorization with every trained variant is also Table 4, which judges it; sentiment with all four
variants adds the frozen-MLP cell the paper left empty.
"""

from __future__ import annotations

from collections.abc import Mapping

from mixit.study.collect import StudyResults
from mixit.study.figures import plot_curves
from mixit.study.presets import TRAINED_VARIANTS, Scale, variant_runs
from mixit.study.render import variant_table
from mixit.study.spec import RunSpec, Seeds
from mixit.study.tables.base import Table
from mixit.study.verdicts import Check, Part, accuracy, judge

MATCHED = ("addition", "modular_addition", "dyck")  # where the paper finds MixiT as good as the standard model
PAPER = {
    ("sentiment:yelp_polarity", "standard", "accuracy"): 90.55,
    ("sentiment:yelp_polarity", "mixit", "accuracy"): 92.56,
}


def runs(scale: Scale, seeds: Seeds) -> list[RunSpec]:
    """Arithmetic, parenthesis balancing, memorization and sentiment: MixiT against trained attention."""
    specs = []
    for task in ("addition", "dyck", "modular_addition"):
        specs += variant_runs(scale, scale.tasks[task], ("standard", "mixit"), seeds, "table3")
    for task in ("memorization", "sentiment"):
        specs += variant_runs(scale, scale.tasks[task], TRAINED_VARIANTS, seeds, "table3")
    return specs


def section(study: StudyResults) -> list[str]:
    body: list[str] = []
    for task in ("addition", "dyck", "modular_addition", "memorization", "sentiment"):
        table = variant_table(study.final, "table3", task, ("standard", "frozen_qk", "frozen_mlp", "mixit"), PAPER)
        if table:
            body += [f"**{task}**", "", table, ""]
            if plot_curves(study.final, "table3", task, study.figures / f"curves-{task}.png"):
                body += [f"![{task} curves](figures/curves-{task}.png)", ""]
    return body


WITHIN = 5.0
"""Points of accuracy within which MixiT matches the standard model."""


def match_part(task: str) -> Part:
    """MixiT within `WITHIN` points of the standard model on `task`: MixiT - (standard - WITHIN)."""
    standard, mixit = (accuracy(f"{task}/{v}", task, table="table3", variant=v) for v in ("standard", "mixit"))

    def margin(x: Mapping[str, float]) -> float:
        return x[mixit.name] - (x[standard.name] - WITHIN)

    return Part(f"{task}: MixiT within {WITHIN:g} points", [standard, mixit], margin)


def check_mixit_matches(study: StudyResults) -> Check:
    return judge(
        "MixiT within 5 points of the standard model on addition, modular addition and Dyck",
        study.final,
        [match_part(task) for task in MATCHED],
    )


TABLE = Table(
    "table3", "Table 3: arithmetic, Dyck, memorization, sentiment", runs, section, (check_mixit_matches,), PAPER
)
