"""Table 5: MixiT with more heads, on addition and on sentiment.

The paper's finding: MixiT's accuracy rises with the number of heads (addition 35% at 4 heads to 92%
at 256), more fixed mixing matrices making up for their input independence.
"""

from __future__ import annotations

from typing import Any

from mixit.core.experiment import merge
from mixit.study.cells import by_label, rows
from mixit.study.collect import StudyResults, task_class
from mixit.study.figures import plot_lines
from mixit.study.presets import Scale
from mixit.study.render import variant_table
from mixit.study.spec import RunSpec, Seeds, grid
from mixit.study.tables.base import Table
from mixit.study.verdicts import Check, Part, accuracy, judge

TASKS = ("addition", "sentiment")


def runs(scale: Scale, seeds: Seeds) -> list[RunSpec]:
    """MixiT with more heads, on addition and on sentiment, its learning rate searched at each head count."""
    d_model = scale.extra.get("heads_d_model")
    specs = []
    for task in TASKS:
        base = merge(scale.tasks[task], {"variant": "mixit", **({"model": {"d_model": d_model}} if d_model else {})})
        specs += grid(
            base,
            {"model.n_heads": list(scale.heads)},
            seeds,
            {"table": "table5", "task": task, "variant": "mixit"},
            search=_learning_rate(scale.search_for(task, "mixit")),
        )
    return specs


def _learning_rate(search: dict[str, tuple[Any, ...]]) -> dict[str, tuple[Any, ...]]:
    """The learning-rate candidates of a search: each head count is searched on them, the heads being what the
    table varies."""
    return {path: values for path, values in search.items() if path == "train.lr"}


def section(study: StudyResults) -> list[str]:
    body: list[str] = []
    for task in TASKS:
        table = variant_table(study.final, "table5", task, ("mixit",), by="n_heads")
        if table:
            body += [f"**{task}**", "", table, ""]
    by_heads: dict[str, dict[Any, float]] = {}
    for task in TASKS:
        _, key, scale = task_class(task).report_metric  # accuracy in percent, as the figure's axis says
        by_heads[f"mixit, {task}"] = by_label(study.final, "n_heads", key, scale, table="table5", task=task)
    title = "MixiT accuracy by number of heads"
    if plot_lines(by_heads, "heads", "accuracy (%)", title, study.figures / "heads.png", log2=True):
        body.append("![heads](figures/heads.png)")
    return body


def check_heads(study: StudyResults) -> Check:
    name = "MixiT's addition accuracy rises with the number of heads (the most heads against the fewest)"
    heads = sorted({labels["n_heads"] for _, labels in rows(study.final, table="table5", task="addition")})
    if len(heads) < 2:
        return Check(name, "n/a", f"missing: runs at two head counts at least (found {heads or 'none'})")
    fewest, most = heads[0], heads[-1]
    low, high = (accuracy(f"{h} heads", "addition", table="table5", n_heads=h) for h in (fewest, most))
    rises = Part(f"{most} heads above {fewest}", [low, high], lambda x: x[high.name] - x[low.name])
    return judge(name, study.final, [rises])


TABLE = Table(
    "table5",
    "Table 5: MixiT and the number of heads (paper: addition 35% -> 92% at 256 heads)",
    runs,
    section,
    (check_heads,),
)
