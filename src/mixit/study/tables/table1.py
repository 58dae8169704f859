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
from collections.abc import Callable, Mapping
from statistics import fmean
from typing import Any

from mixit.study.cells import rows
from mixit.study.collect import Result, StudyResults
from mixit.study.figures import plot_curves, plot_lines
from mixit.study.presets import Scale, variant_runs
from mixit.study.render import variant_table
from mixit.study.spec import RunSpec, Seeds
from mixit.study.tables.base import Table
from mixit.study.verdicts import Cell, Check, Part, Reading, accuracy, budget, converged, judge

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


def runs(scale: Scale, seeds: Seeds) -> list[RunSpec]:
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
                ind = fmean(h["induction"]["score"] for h in found)
                prev = fmean(h["previous_token"]["score"] for h in found)
                line = f"{variant}: strongest induction head {ind:.3f}, previous-token head {prev:.3f}"
                dependence = [h["pattern_input_dependence"] for h in found if "pattern_input_dependence" in h]
                if len(dependence) == len(found) and None not in dependence:
                    line += f", patterns' input dependence {fmean(dependence):.3g}"
                heads.append(line)
        if heads:
            body += ["Head scores (`mixit analyze`, 1 = all attention on the target): " + "; ".join(heads) + ".", ""]
        if plot_curves(results, "table1", task, figures / f"curves-{task}.png"):
            body.append(f"![{task} curves](figures/curves-{task}.png)")
        over_time = {
            variant: dict(zip(history["steps"], (h["score"] for h in history["strongest"]["induction"])))
            for variant, history in seed_zero(study, task, lambda analysis: analysis.over_time()).items()
        }
        title = f"{task}: induction head score against step (seed 0)"
        png = figures / f"induction-over-time-{task}.png"
        if plot_lines(over_time, "training step", "strongest induction head's score", title, png, log2=True):
            body.append(f"![{task} induction score over training](figures/{png.name})")
        for r, labels in rows(results, table="table1", task=task, seed=0):
            for figure in ("attention", "head_scores"):
                src = r.run.analysis.figure(figure) if r.run else None
                if src is not None:
                    dst = figures / f"{task}-{labels['variant']}-{src.name}"
                    shutil.copy(src, dst)
                    body.append(f"![{task} {labels['variant']} {src.name}](figures/{dst.name})")
        body.append("")
    pairs = {
        variant: {int(k): 100 * v["accuracy"] for k, v in by_pairs.items()}
        for variant, by_pairs in seed_zero(study, "retrieval", lambda analysis: analysis.retrieval_by_pairs()).items()
    }
    title = "retrieval accuracy by number of pairs (the paper's Fig. 2; seed 0)"
    if plot_lines(pairs, "pairs stored in the example", "accuracy (%)", title, figures / "retrieval-by-pairs.png"):
        body.append("![retrieval by pairs](figures/retrieval-by-pairs.png)")
    return body


def seed_zero(study: StudyResults, task: str, read: Callable[[Any], Any]) -> dict[str, Any]:
    """{variant: what `read` finds in its analysis} of the finished seed-0 runs of `task` (None: nothing)."""
    found = {}
    for r, labels in rows(study.final, table="table1", task=task, seed=0):
        value = read(r.run.analysis) if r.state == "done" and r.run else None
        if value is not None:
            found[labels["variant"]] = value
    return found


GAP = 30.0
"""Points of accuracy MixiT must fall below the better of the standard model and frozen Q/K."""


def gap_part(task: str) -> Part:
    """MixiT at least `GAP` points below both on `task`: min(standard, frozen Q/K) - GAP - MixiT."""
    cells = [accuracy(f"{task}/{v}", task, table="table1", variant=v) for v in VARIANTS]

    def margin(x: Mapping[str, float]) -> float:
        return min(x[f"{task}/standard"], x[f"{task}/frozen_qk"]) - GAP - x[f"{task}/mixit"]

    return Part(f"{task}: MixiT {GAP:g} points below both", cells, margin)


def check_retrieval_gap(study: StudyResults) -> Check:
    return judge(
        "MixiT at least 30 points below both the standard model and frozen Q/K on retrieval and induction",
        study.final,
        [gap_part(task) for task in TASKS],
    )


def head_score(r: Result) -> Reading | None:
    """The strongest induction head's score of an analysed run (`mixit analyze`)."""
    if not r.heads:
        return None
    return Reading(r.heads["induction"]["score"], 0.0, *budget(r), converged(r), r.budget)


ROUNDING = 4 * 2.0**-23
"""Four float32 machine epsilons (2^-23): how far two float32 patterns computed from the same weights may
differ by rounding alone, relative to the patterns' magnitude (max(1, largest |weight|): softmax
probabilities are at most 1)."""


def relative_dependence(r: Result) -> Reading | None:
    """How much an analysed run's attention patterns change between two probe batches (head_scores.json's
    pattern_input_dependence), relative to their magnitude. Structural: MixiT's matrices are never trained and
    cannot drift, so the reading counts as converged."""
    heads = r.heads or {}
    found = heads.get("pattern_input_dependence")
    if found is None:
        return None
    scale = max(1.0, heads.get("pattern_scale") or 0.0)
    return Reading(found / scale, 0.0, *budget(r), True, r.budget)


def check_induction_heads(study: StudyResults) -> Check:
    """Frozen Q/K's induction head is measured; MixiT's lack of one is structural, so what is checked is its
    cause: MixiT's patterns, measured on two different inputs, are the same up to float32 rounding. Its
    (near-zero) head score is shown in the section, for information."""
    induction = {"table": "table1", "task": "induction"}
    frozen_qk = Cell(
        "induction/frozen_qk head score",
        {**induction, "variant": "frozen_qk"},
        head_score,
        "",
        3,
        "head scores (not analysed)",
    )
    mixit = Cell(
        "induction/mixit pattern input dependence",
        {**induction, "variant": "mixit"},
        relative_dependence,
        "",
        7,
        "the patterns' input dependence (not analysed, or analysed before it was measured)",
    )
    return judge(
        "frozen Q/K forms an induction head (strongest score > 0.5); MixiT's attention does not depend on the "
        "input (verified), so it has no induction head",
        study.final,
        [
            Part("frozen Q/K's score above 0.5", [frozen_qk], lambda x: x[frozen_qk.name] - 0.5, "", 3),
            # In rounding tolerances: +1 for identical patterns, 0 at the tolerance, negative beyond it.
            Part(
                "MixiT's attention does not depend on the input (verified), so it has no induction head",
                [mixit],
                lambda x: 1.0 - x[mixit.name] / ROUNDING,
                " tolerances",
                1,
            ),
        ],
    )


TABLE = Table(
    "table1",
    "Table 1: retrieval and induction",
    runs,
    section,
    (check_retrieval_gap, check_induction_heads),
    PAPER,
)
