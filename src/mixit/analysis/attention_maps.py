"""Attention maps: every layer's and head's pattern on one input, as arrays and a PNG grid.

Patterns come through the model's one pattern hook, so softmax and MixiT heads are drawn by the same code; the
input-independent kinds (MixiT, randformer, uniform, synthesizer_random) also expose theirs as
``attn.fixed_pattern``. Figures use matplotlib's object interface (`Figure`), never pyplot, so no backend or
global state is touched: each plot function returns its Figure and saves it only when given a path.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from mixit.analysis.induction import SCORE_KINDS, is_pattern
from mixit.core.models.transformer import Transformer

if TYPE_CHECKING:
    from matplotlib.figure import Figure


@torch.no_grad()
def attention_patterns(model: Transformer, tokens: torch.Tensor) -> np.ndarray:
    """Patterns of one input `tokens` (T,) -> array (n_layers, n_heads, T, T)."""
    _, patterns = model.run_with_cache(tokens.reshape(1, -1).to(next(model.parameters()).device), is_pattern)
    return np.stack([p[0].float().cpu().numpy() for p in patterns.values()])  # layer order


def fixed_patterns(model: Transformer) -> np.ndarray | None:
    """The input-independent patterns (n_layers, n_heads, n_ctx, n_ctx), or None if the model's attention
    depends on its input."""
    mats = [block.attn.fixed_pattern for block in model.blocks]
    if any(m is None for m in mats):
        return None
    return np.stack([m.float().cpu().numpy() for m in mats if m is not None])


def saved(fig: Figure, path: str | Path | None) -> Figure:
    """`fig`, written to `path` first if one is given (every figure of `mixit analyze` and `mixit signal`)."""
    if path is not None:
        fig.savefig(path, dpi=110)
    return fig


def plot_pattern_grid(
    patterns: np.ndarray, path: str | Path | None = None, title: str = "", labels: Sequence[str] | None = None
) -> Figure:
    """A layers x heads grid of (T, T) patterns with one shared colour bar; saved to `path` if one is given.
    Signed patterns (MixiT) get a diverging map centred on 0; `labels` name up to 40 tokens on both axes."""
    from matplotlib.figure import Figure

    n_layers, n_heads, T, _ = patterns.shape
    if (patterns < -1e-6).any():
        vmax = float(np.abs(patterns).max())
        colours = {"cmap": "RdBu_r", "vmin": -vmax, "vmax": vmax}
    else:
        colours = {"cmap": "viridis", "vmin": 0.0, "vmax": 1.0}
    cell = 2.6 if T <= 40 else 2.2
    fig = Figure(figsize=(cell * n_heads + 1.2, cell * n_layers + 0.8), layout="constrained")
    axes = fig.subplots(n_layers, n_heads, squeeze=False)
    for (layer, head), ax in np.ndenumerate(axes):
        image = ax.imshow(patterns[layer, head], interpolation="nearest", **colours)
        ax.set_title(f"L{layer} H{head}", fontsize=9)
        if labels is not None and T <= 40:
            ax.set_xticks(range(T), labels, fontsize=5, rotation=90)
            ax.set_yticks(range(T), labels, fontsize=5)
        else:
            ax.tick_params(labelsize=6)
        if head == 0:
            ax.set_ylabel("query position", fontsize=8)
        if layer == n_layers - 1:
            ax.set_xlabel("key position", fontsize=8)
    fig.colorbar(image, ax=axes, shrink=0.8, label="attention weight")
    fig.suptitle(title, fontsize=11)
    return saved(fig, path)


def plot_score_tables(scores: dict[str, list[list[float]]], path: str | Path | None = None, title: str = "") -> Figure:
    """Heatmaps (layers x heads) of the head scores, values in the cells; saved to `path` if one is given."""
    from matplotlib.figure import Figure

    n_layers, n_heads = np.shape(scores[SCORE_KINDS[0]])
    fig = Figure(figsize=(3 * (0.6 * n_heads + 1.6), 0.55 * n_layers + 1.8), layout="constrained")
    axes = fig.subplots(1, 3, squeeze=False)
    for ax, kind in zip(axes[0], SCORE_KINDS):
        table = np.asarray(scores[kind])
        image = ax.imshow(table, cmap="magma", vmin=min(0.0, float(table.min())), vmax=1.0)
        for (layer, head), value in np.ndenumerate(table):
            colour = "white" if value < 0.6 else "black"
            ax.text(head, layer, f"{value:.2f}", ha="center", va="center", fontsize=7, color=colour)
        ax.set_title(kind.replace("_", " "), fontsize=10)
        ax.set(xticks=range(n_heads), yticks=range(n_layers), xlabel="head", ylabel="layer")
    fig.colorbar(image, ax=axes, shrink=0.8, label="mean attention on target")
    fig.suptitle(title, fontsize=11)
    return saved(fig, path)


def plot_over_time(
    steps: Sequence[int],
    scores: Mapping[str, Sequence[float]],
    metrics: Mapping[str, Sequence[float]],
    title: str,
    path: str | Path | None = None,
) -> Figure:
    """Score against training step on a log-scale x axis: one solid line per score kind (`scores`), one
    dashed line per test metric (`metrics`), on one axis (all are fractions); saved to `path` if one is given."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6.4, 4.0), layout="constrained")
    ax = fig.subplots()
    for name, values in scores.items():
        ax.plot(steps, values, marker="o", markersize=3, label=name.replace("_", " "))
    for name, values in metrics.items():
        ax.plot(steps, values, linestyle="--", color="grey", label=name.replace("_", " "))
    ax.set(xscale="log", xlabel="training step", ylabel="strongest head's score")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(title, fontsize=10)
    return saved(fig, path)
