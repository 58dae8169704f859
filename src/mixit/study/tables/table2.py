"""Table 2: language modelling, held-out loss (nats) of each trained variant on each corpus.

The paper's finding: the loss is ordered standard < frozen Q/K < MixiT, frozen Q/K much closer to the
standard model than MixiT is.
"""

from __future__ import annotations

import itertools

from mixit.core.experiment import merge
from mixit.study.cells import rows
from mixit.study.collect import StudyResults
from mixit.study.figures import plot_curves
from mixit.study.presets import TRAINED_VARIANTS, Scale, variant_runs
from mixit.study.render import variant_table
from mixit.study.spec import RunSpec, Seeds
from mixit.study.tables.base import Table
from mixit.study.verdicts import Check, Part, accuracy, difference, judge

PAPER = {
    ("lm:wikitext-103", "standard", "loss"): 2.78,
    ("lm:wikitext-103", "frozen_qk", "loss"): 3.07,
    ("lm:wikitext-103", "mixit", "loss"): 3.73,
    ("lm:fineweb-edu", "standard", "loss"): 3.05,
    ("lm:fineweb-edu", "frozen_qk", "loss"): 3.16,
    ("lm:fineweb-edu", "mixit", "loss"): 4.08,
}


def runs(scale: Scale, seeds: Seeds) -> list[RunSpec]:
    """Language modelling: held-out log perplexity (nats) of each trained variant."""
    specs = []
    for corpus in scale.lm_corpora:
        base = merge(scale.tasks["lm"], {"task_params": {"corpus": corpus}})
        specs += variant_runs(scale, base, TRAINED_VARIANTS, seeds, "table2", corpus=corpus)
    return specs


LM_VARIANTS = ("standard", "frozen_qk", "mixit")
"""The ordering the paper finds, lowest loss first."""


def corpora(study: StudyResults) -> list[str]:
    return sorted({str(labels.get("corpus")) for _, labels in rows(study.final, table="table2")})


def section(study: StudyResults) -> list[str]:
    body: list[str] = []
    variants = ("standard", "frozen_qk", "mixit", "frozen_mlp")
    for corpus in corpora(study):
        body += [f"**{corpus}**", "", variant_table(study.final, "table2", "lm", variants, PAPER, corpus=corpus), ""]
        if plot_curves(study.final, "table2", "lm", study.figures / f"curves-lm-{corpus}.png", corpus=corpus):
            body.append(f"![lm curves](figures/curves-lm-{corpus}.png)")
    return body


def check_lm(study: StudyResults) -> Check:
    """The ordering as two parts per corpus: frozen Q/K above the standard model, MixiT above frozen Q/K (the
    paper's "frozen Q/K's gap smaller than MixiT's" follows from the second)."""
    parts = []
    for corpus in corpora(study):
        cell = {v: accuracy(f"{corpus}/{v}", "lm", table="table2", variant=v, corpus=corpus) for v in LM_VARIANTS}
        for low, high in itertools.pairwise(LM_VARIANTS):
            parts.append(
                Part(
                    f"{corpus}: {low} below {high}",
                    [cell[low], cell[high]],
                    difference(cell[high].name, cell[low].name),
                    " nats",
                    3,
                )
            )
    return judge(
        "language-model loss ordered standard < frozen Q/K < MixiT, frozen Q/K's gap to standard smaller than "
        "MixiT's (on every corpus)",
        study.final,
        parts,
    )


TABLE = Table("table2", "Table 2: language modelling (held-out loss, nats)", runs, section, (check_lm,), PAPER)
