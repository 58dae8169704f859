"""Table 1: retrieval and k-hop induction, the tasks that need input-dependent attention.

The paper's finding: MixiT, whose attention cannot depend on the input, falls far below the standard
model and frozen Q/K on both, and only models with trained or random queries and keys form an
induction head. The runs are analysed (`mixit analyze`), which measures the head scores and the
retrieval accuracy by number of stored pairs (the paper's Fig. 2) that the section shows; they keep
log-spaced checkpoints and are analysed over them (`--over-time`), so the section also shows the
strongest induction head's score against training step, per variant (when the head forms).
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping
from typing import Any

from mixit.study.presets import Scale, variant_runs
from mixit.study.results import (
    Cell,
    Check,
    StudyResults,
    accuracy,
    judge,
    mean,
    plot_curves,
    plot_lines,
    rows,
    variant_table,
)
from mixit.study.spec import RunSpec
from mixit.study.tables.base import Table

VARIANTS = ("standard", "frozen_qk", "mixit")
TASKS = ("retrieval", "induction")
PAPER = {
    ("retrieval", "standard", "accuracy"): 100.0,
    ("retrieval", "frozen_qk", "accuracy"): 97.0,
    ("retrieval", "mixit", "accuracy"): 11.2,
    ("induction", "standard", "accuracy"): 99.99,
    ("induction", "frozen_qk", "accuracy"): 96.7,
    ("induction", "mixit", "accuracy"): 48.6,
}


def runs(scale: Scale, seeds: int) -> list[RunSpec]:
    """Retrieval and k-hop induction (analysed): input-dependent attention against MixiT."""
    return [
        spec
        for task in TASKS
        for spec in variant_runs(scale, scale.tasks[task], VARIANTS, seeds, "table1", analyze=True)
    ]


def section(study: StudyResults) -> list[str]:
    results, figures = study.final, study.figures
    body: list[str] = []
    for task in TASKS:
        table = variant_table(results, "table1", task, VARIANTS, PAPER)
        if not table:
            continue
        body += [f"**{task}**", "", table, ""]
        heads = []
        for variant in VARIANTS:
            found = [r.heads for r, _ in rows(results, table="table1", task=task, variant=variant) if r.heads]
            if found:
                ind = mean([h["induction"]["score"] for h in found])
                prev = mean([h["previous_token"]["score"] for h in found])
                heads.append(f"{variant}: strongest induction head {ind:.3f}, previous-token head {prev:.3f}")
        if heads:
            body += ["Head scores (`mixit analyze`, 1 = all attention on the target): " + "; ".join(heads) + ".", ""]
        if plot_curves(results, "table1", task, figures / f"curves-{task}.png"):
            body.append(f"![{task} curves](figures/curves-{task}.png)")
        if plot_lines(
            induction_over_time(study, task),
            "training step",
            "strongest induction head's score",
            f"{task}: induction head score against step (seed 0)",
            figures / f"induction-over-time-{task}.png",
            log2=True,
        ):
            body.append(f"![{task} induction score over training](figures/induction-over-time-{task}.png)")
        for r, labels in rows(results, table="table1", task=task, seed=0):
            for figure in ("attention", "head_scores"):
                src = r.run.analysis.figure(figure) if r.run else None
                if src is not None:
                    dst = figures / f"{task}-{labels['variant']}-{src.name}"
                    shutil.copy(src, dst)
                    body.append(f"![{task} {labels['variant']} {src.name}](figures/{dst.name})")
        body.append("")
    pairs: dict[str, dict[Any, float]] = {}
    for r, labels in rows(results, table="table1", task="retrieval", seed=0):
        by_pairs = r.run.analysis.retrieval_by_pairs() if r.state == "done" and r.run else None
        if by_pairs is not None:
            pairs[labels["variant"]] = {int(k): 100 * v["accuracy"] for k, v in by_pairs.items()}
    if plot_lines(
        pairs,
        "pairs stored in the example",
        "accuracy (%)",
        "retrieval accuracy by number of pairs (the paper's Fig. 2; seed 0)",
        figures / "retrieval-by-pairs.png",
    ):
        body.append("![retrieval by pairs](figures/retrieval-by-pairs.png)")
    return body


def induction_over_time(study: StudyResults, task: str) -> dict[str, dict[Any, float]]:
    """The strongest induction head's score at each kept checkpoint, {variant: {step: score}}, of the
    seed-0 runs of `task` analysed over time (`mixit analyze --over-time`)."""
    curves: dict[str, dict[Any, float]] = {}
    for r, labels in rows(study.final, table="table1", task=task, seed=0):
        history = r.run.analysis.over_time() if r.state == "done" and r.run else None
        if history is not None:
            scores = [h["score"] for h in history["strongest"]["induction"]]
            curves[labels["variant"]] = dict(zip(history["steps"], scores))
    return curves


def check_retrieval_gap(study: StudyResults) -> Check:
    cells = [accuracy(f"{task}/{v}", task, table="table1", variant=v) for task in TASKS for v in VARIANTS]

    def holds(x: Mapping[str, float]) -> bool:
        return all(x[f"{t}/mixit"] <= min(x[f"{t}/standard"], x[f"{t}/frozen_qk"]) - 30 for t in TASKS)

    return judge(
        "MixiT at least 30 points below both the standard model and frozen Q/K on retrieval and induction",
        study.final,
        cells,
        holds,
    )


def induction_score(variant: str) -> Cell:
    """The strongest induction-head score of `variant`'s induction runs (`mixit analyze`)."""
    return Cell(
        f"induction/{variant} head score",
        {"table": "table1", "task": "induction", "variant": variant},
        lambda r: r.heads["induction"]["score"] if r.heads else None,
        "",
        3,
        "head scores (not analysed)",
    )


def check_induction_heads(study: StudyResults) -> Check:
    return judge(
        "frozen Q/K forms an induction head (strongest score > 0.5) and MixiT does not (< 0.1)",
        study.final,
        [induction_score("frozen_qk"), induction_score("mixit")],
        lambda x: x["induction/frozen_qk head score"] > 0.5 and x["induction/mixit head score"] < 0.1,
    )


TABLE = Table(
    "table1",
    "Table 1: retrieval and induction",
    runs,
    section,
    (check_retrieval_gap, check_induction_heads),
    PAPER,
)
