"""The presets of the paper study: the sizes of every task at three scales.

- ``smoke``: every code path of ``quick`` with the smallest models and a few
  steps, in about three minutes on 2 CPU cores (CI and the tests use it).
- ``quick``: the whole comparison at a scale that finishes in 30 minutes on
  2 CPU cores, each cell trained as far as that allows (docs/reproduction.md
  says how it was calibrated).
- ``paper``: the paper's own scales and the reference recipes
  (docs/fidelity.md, "Recipes"), for GPUs and clusters.

This module is data, plus `variant_runs`, the helper every table builds its runs with
(`mixit.study.tables`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from mixit.study.spec import RunSpec, grid

TRAINED_VARIANTS = ("standard", "frozen_qk", "frozen_mlp", "mixit")


@dataclass(frozen=True)
class Scale:
    """The sizes of one preset: a request per task (merged into every run of that task) and the
    values the scaling tables sweep."""

    tasks: dict[str, dict[str, Any]]
    heads: tuple[int, ...]
    depths: tuple[int, ...]
    retrieval_pairs: tuple[int, ...]
    signal: dict[str, Any]
    lm_corpora: tuple[str, ...] = ("english",)
    description: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
    search: dict[str, dict[str, dict[str, tuple[Any, ...]]]] = field(default_factory=dict)
    """task -> variant (or "*" for every variant) -> dotted request path -> candidate values: what the
    study screens per architecture per task before training each cell (`mixit.study.search`)."""

    def search_for(self, task: str, variant: str) -> dict[str, tuple[Any, ...]]:
        """The candidates of `variant` on `task`: those for every variant, then the variant's own."""
        by_variant = self.search.get(task, {})
        return {**by_variant.get("*", {}), **by_variant.get(variant, {})}


def _run(
    task: str,
    params: dict[str, Any] | None = None,
    model: dict[str, Any] | None = None,
    train: dict[str, Any] | None = None,
    **top: Any,
) -> dict[str, Any]:
    return {"task": task, "task_params": params or {}, "model": model or {}, "train": train or {}, **top}


_TINY = {"d_model": 32, "n_heads": 2, "n_layers": 1}
SMOKE = Scale(
    description="every code path, smallest models, a few steps (about 3 minutes on 2 cores)",
    tasks={
        "retrieval": _run(
            "retrieval", {"max_pairs": 4, "vocab": 32}, _TINY, {"steps": 20, "batch_size": 32}, test_size=100
        ),
        "induction": _run(
            "induction",
            {"k": 1, "alphabet": 4, "length": 12},
            {**_TINY, "n_layers": 2},
            {"steps": 20, "batch_size": 16},
            test_size=100,
        ),
        "lm": _run(
            "lm", {"length": 16, "vocab": 300, "max_documents": 40}, _TINY, {"steps": 10, "batch_size": 8}, test_size=20
        ),
        "addition": _run("addition", {"n_digits": 2}, _TINY, {"steps": 20, "batch_size": 32}, test_size=100),
        "dyck": _run("dyck", {"max_pairs": 4}, _TINY, {"steps": 20, "batch_size": 32}, test_size=100),
        "modular_addition": _run("modular_addition", {"p": 11}, _TINY, {"steps": 20, "batch_size": 32}),
        "memorization": _run("memorization", {"n": 8}, _TINY, {"steps": 20, "batch_size": 32}),
        "sentiment": _run(
            "sentiment",
            {"vocab": 300, "length": 16, "max_documents": 300},
            _TINY,
            {"steps": 10, "batch_size": 16},
            test_size=50,
        ),
    },
    heads=(1, 2),
    depths=(1, 2),
    retrieval_pairs=(2, 4),
    signal={"depths": (1, 2), "d_model": 16, "n_heads": 2, "n_ctx": 8, "seeds": 1},
)

# Calibrated on the project's 2-core machine (docs/reproduction.md): width 64, and steps chosen so
# that the whole preset fits in 30 minutes with two workers. Queries and keys are drawn as the paper's
# text says (N(0, 1/d_model)): at width 64 the reference code's N(0, 0.02^2) gives frozen attention
# logits of std 0.03, near-uniform attention, and frozen Q/K could not attend at all (docs/foundation.md,
# "With the reference's coupled settings").
_SMALL = {"d_model": 64, "n_heads": 4, "n_layers": 2, "qk_init": "paper"}
QUICK = Scale(
    description="the whole comparison in at most 30 minutes on 2 CPU cores",
    tasks={
        "retrieval": _run(
            "retrieval", {"max_pairs": 10}, _SMALL, {"steps": 1200, "batch_size": 64, "lr": 1e-3}, test_size=1000
        ),
        "induction": _run(
            "induction",
            {"k": 1, "alphabet": 8, "length": 32},
            {**_SMALL, "init_std": 0.1},
            {"steps": 1600, "batch_size": 32, "lr": 1e-3},
            test_size=500,
        ),
        "lm": _run(
            "lm", {"length": 64, "vocab": 2048}, _SMALL, {"steps": 600, "batch_size": 32, "lr": 2e-3}, test_size=500
        ),
        "addition": _run(
            "addition", {"n_digits": 3}, _SMALL, {"steps": 800, "batch_size": 128, "lr": 3e-3}, test_size=1000
        ),
        "dyck": _run("dyck", {"max_pairs": 10}, _SMALL, {"steps": 600, "batch_size": 128, "lr": 3e-3}, test_size=1000),
        "modular_addition": _run("modular_addition", {"p": 97}, _SMALL, {"steps": 5000, "batch_size": 256, "lr": 3e-3}),
        "memorization": _run("memorization", {"n": 256}, _SMALL, {"steps": 1500, "batch_size": 512, "lr": 3e-3}),
        "sentiment": _run(
            "sentiment",
            {"length": 32, "vocab": 2048},
            _SMALL,
            {"steps": 400, "batch_size": 64, "lr": 1e-3},
            test_size=1000,
        ),
    },
    heads=(1, 4, 16),
    depths=(2, 4, 8),
    retrieval_pairs=(5, 10, 20),
    signal={"depths": (2, 4, 8, 16, 32), "d_model": 128, "n_heads": 4, "n_ctx": 64, "seeds": 3},
)

PAPER = Scale(
    description="the paper's scales with the reference recipes, for GPUs and clusters",
    tasks={
        "retrieval": _run("retrieval", {"max_pairs": 30}, recipe="reference"),
        "induction": _run("induction", {"k": 16, "alphabet": 4, "length": 256}, recipe="reference"),
        "lm": _run("lm", {"corpus": "wikitext-103"}, recipe="reference"),
        "addition": _run("addition", {"n_digits": 10}, recipe="reference"),
        "dyck": _run("dyck", {"max_pairs": 30}, recipe="reference"),
        "modular_addition": _run("modular_addition", {"p": 599}, recipe="reference"),
        "memorization": _run("memorization", {"n": 512}, recipe="reference"),
        "sentiment": _run("sentiment", {"dataset": "yelp_polarity"}, recipe="reference"),
    },
    heads=(4, 16, 64, 256),
    depths=(2, 4, 8, 16),
    retrieval_pairs=(10, 20, 30, 40),
    signal={"depths": (2, 4, 8, 16, 32), "d_model": 512, "n_heads": 8, "n_ctx": 256, "seeds": 5},
    lm_corpora=("wikitext-103", "fineweb-edu"),
    extra={"heads_d_model": 1024},
)

PRESETS: dict[str, Scale] = {"smoke": SMOKE, "quick": QUICK, "paper": PAPER}


def variant_runs(
    scale: Scale,
    base: dict[str, Any],
    variants: tuple[str, ...],
    seeds: int,
    table: str,
    analyze: bool = False,
    **labels: Any,
) -> list[RunSpec]:
    """Every variant of `variants` on `base` for each seed, each with the scale's search candidates."""
    task = base["task"]
    return [
        spec
        for variant in variants
        for spec in grid(
            base,
            {"variant": [variant]},
            seeds,
            {"table": table, "task": task, **labels},
            analyze,
            search=scale.search_for(task, variant),
        )
    ]
