"""Signal propagation at initialisation: do token representations collapse with depth?

The paper's depth experiment (docs/model.md, "The paper's numbers") reports that the covariance between token
representations of the random transformer rises from 0.0022 at 2 layers to 0.054 at 32 while MixiT's stays
flat: rank collapse, every token's residual stream drifting towards one shared vector, which shows here as
cosine -> 1 (and covariance -> 1) with depth. `pairwise_stats` measures one stream, `token_similarity` every
layer of a model, `signal_propagation` fresh models over variants x depths x seeds, and `plot_signal` draws
it. The paper does not give its normalisation of the covariance, so only the trend compares with it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import torch

from mixit.analysis.attention_maps import saved
from mixit.core.config import ModelConfig, check, typed
from mixit.core.experiment import model_config
from mixit.core.freezing import VARIANTS
from mixit.core.models import Transformer
from mixit.core.resources import activation_bytes, check_memory, model_bytes
from mixit.errors import UsageError
from mixit.files import check_output_dir, write_json
from mixit.version import __version__

if TYPE_CHECKING:
    from matplotlib.figure import Figure

# Random inputs are drawn from a generator of their own, so they do not share a
# stream with the parameter initialisation that uses `seed` directly.
TOKEN_SEED_OFFSET = 7919
# Set by the sweep itself (`Probe` and the depths); refused in model_overrides.
_OWN_KEYS = ("vocab_size", "n_ctx", "d_model", "n_heads", "n_layers", "attention", "seed")
STATS = ("cosine", "covariance", "norm")


def pairwise_stats(h: torch.Tensor) -> dict[str, float]:
    """Similarity between the T token representations of each sequence of h (B, T, d), T >= 2, averaged over
    the batch. For one sequence X (T, d):

      cosine      mean over pairs i != j of cos(X_i, X_j) (a zero row counts as cosine 0);
      covariance  mean over i != j of C_ij, C = Xn Xn^T / d with Xn = X / rms(X) and rms(X) the root mean
                  square of all T*d entries: the mean diagonal of C is exactly 1, so the value compares across
                  depths however the stream grows. This normalisation is ours (the paper's is not known);
                  features are not centred, as in a Gram matrix.
      norm        rms(X), showing whether the residual stream explodes or vanishes.

    Identical rows give cosine 1 and covariance 1; orthogonal rows give 0 and 0.
    """
    if h.dim() != 3 or h.shape[1] < 2:
        raise UsageError(f"pairwise_stats needs h of shape (B, T, d) with T >= 2, got {tuple(h.shape)}")
    h = h.detach().double()
    T, d = h.shape[1:]  # h (B, T, d)
    off = ~torch.eye(T, dtype=torch.bool, device=h.device)  # (T, T) off-diagonal pairs
    unit = h / h.norm(dim=-1, keepdim=True).clamp_min(1e-30)  # (B, T, d)
    cosine = (unit @ unit.transpose(1, 2))[:, off].mean(dim=1)  # (B,)
    rms = h.pow(2).mean(dim=(1, 2)).sqrt()  # (B,)
    xn = h / rms.clamp_min(1e-30)[:, None, None]  # (B, T, d)
    covariance = (xn @ xn.transpose(1, 2) / d)[:, off].mean(dim=1)  # (B,)
    return {"cosine": cosine.mean().item(), "covariance": covariance.mean().item(), "norm": rms.mean().item()}


@torch.no_grad()
def token_similarity(model: Transformer, tokens: torch.Tensor) -> dict[str, list[float]]:
    """`pairwise_stats` of the residual stream after the embedding and after each block, on `tokens` (B, T),
    2 <= T <= n_ctx.

    Returns n_layers + 1 floats under each of `STATS`: entry 0 is the stream entering block 0 (embedding, plus
    positions where the model has them, ``blocks.0.hook_resid_pre``), entry l the stream leaving block l - 1
    (``blocks.{l-1}.hook_resid_post``), read in one forward pass; the final norm and LM head are left out.
    """
    if tokens.dim() != 2 or not 2 <= tokens.shape[1] <= model.cfg.n_ctx:
        raise UsageError(
            f"tokens must have shape (B, T) with 2 <= T <= n_ctx={model.cfg.n_ctx}, got {tuple(tokens.shape)}"
        )
    names = ["blocks.0.hook_resid_pre", *(f"blocks.{i}.hook_resid_post" for i in range(model.cfg.n_layers))]
    _, cache = model.run_with_cache(tokens.to(next(model.parameters()).device), names_filter=names)
    per_layer = [pairwise_stats(cache[name]) for name in names]  # each (B, T, d_model)
    return {key: [stats[key] for stats in per_layer] for key in STATS}


@dataclass(frozen=True)
class Probe:
    """The fresh models and random inputs every point of a signal sweep is measured with (all but its variant
    and depth)."""

    d_model: int = 128
    n_heads: int = 4
    n_ctx: int = 64
    """Tokens per random input sequence (and the models' context)."""
    vocab_size: int = 64
    batch: int = 16
    """Random sequences per measurement."""
    seeds: Sequence[int] = (0, 1, 2)
    """Initialisations averaged per point; seed s also draws the inputs (from s + TOKEN_SEED_OFFSET)."""
    shaped: bool = False
    """False builds the standard settings of docs/model.md for every variant, True the signal-propagation
    settings (`ModelConfig.shaped()`) for every variant. Nothing is chosen per attention kind; run both to compare."""
    model_overrides: dict[str, Any] | None = None
    """Further ModelConfig fields applied to every model (for instance {"init_std": 0.2}); unknown keys, and
    keys the sweep sets itself, are refused."""

    def model(self, variant: str, depth: int, seed: int) -> ModelConfig:
        """The model of `variant` with `depth` blocks initialised from `seed` (the variant's own settings)."""
        settings = {**(ModelConfig.shaped() if self.shaped else {}), **(self.model_overrides or {})}
        return model_config(
            variant,
            n_layers=depth,
            seed=seed,
            vocab_size=self.vocab_size,
            n_ctx=self.n_ctx,
            d_model=self.d_model,
            n_heads=self.n_heads,
            **settings,
        )

    def inputs(self, seed: int) -> torch.Tensor:
        """The random token ids every variant of `seed` is measured on: (batch, n_ctx)."""
        generator = torch.Generator().manual_seed(seed + TOKEN_SEED_OFFSET)
        return torch.randint(self.vocab_size, (self.batch, self.n_ctx), generator=generator)  # (batch, n_ctx)


def _check_inputs(variants: Sequence[str], depths: Sequence[int], probe: Probe) -> None:
    """Refuse, with one line, a sweep no model or measurement could be made of."""
    check(
        bool(variants) and not isinstance(variants, str),
        f"variants must be a non-empty list of names (allowed: {', '.join(VARIANTS)}), got {variants!r}",
    )
    for v in variants:
        VARIANTS.get(v)
    check(len(set(variants)) == len(variants), f"variants must not repeat, got {list(variants)}")
    check(
        bool(depths) and all(typed("depths", int, d) > 0 for d in depths),
        f"depths must be a non-empty list of positive integers, got {list(depths)!r}",
    )
    check(bool(probe.seeds), f"seeds must be a non-empty list of integers, got {list(probe.seeds)!r}")
    typed("seeds", tuple[int, ...], probe.seeds)
    check(typed("batch", int, probe.batch) > 0, f"batch must be a positive integer, got {probe.batch!r}")
    check(
        typed("n_ctx", int, probe.n_ctx) >= 2,
        f"n_ctx must be an integer >= 2 (similarity needs two tokens), got {probe.n_ctx!r}",
    )
    typed("shaped", bool, probe.shaped)
    taken = sorted(set(probe.model_overrides or {}) & set(_OWN_KEYS))
    check(not taken, f"model_overrides may not set {', '.join(taken)}: the sweep sets them itself")


def signal_propagation(variants: Sequence[str], depths: Sequence[int], probe: Probe | None = None) -> dict[str, Any]:
    """Token similarity (`token_similarity`) of freshly initialised models (`Probe.model`) for every variant x
    depth, averaged over the probe's seeds, on random ids (`Probe.inputs`, the same for every variant of a seed).

    A variant matters here only through its attention kind: freezing leaves the forward pass at initialisation
    untouched, so "standard" and "random" (the paper's random transformer) give identical numbers.

    Returns {"config": every setting, the model settings and the mixit version, "results": {variant:
    {str(depth): the last block's "cosine", "covariance" and "norm", each also as its sample std over seeds
    ("cosine_std", ...), and their depth + 1 per-layer means ("per_layer_cosine", ...)}}}, as JSON types.
    """
    probe = probe or Probe()
    _check_inputs(variants, depths, probe)
    variants, depths = list(variants), list(depths)
    probe = replace(probe, seeds=list(probe.seeds), model_overrides=dict(probe.model_overrides or {}))
    # Validate the model settings of every variant before any work, and check that the deepest fits.
    example = {v: probe.model(v, depths[0], probe.seeds[0]) for v in variants}
    deepest = probe.model(variants[0], max(depths), probe.seeds[0])
    check_memory(
        "the signal sweep",
        {
            "the deepest model": model_bytes(deepest),
            f"its activations at batch {probe.batch}": activation_bytes(deepest, probe.batch, probe.n_ctx),
        },
        "cpu",
        "lower the depths, d_model or n_ctx",
    )
    inputs = {s: probe.inputs(s) for s in probe.seeds}
    results = {v: {str(depth): _measure(probe, v, depth, inputs) for depth in depths} for v in variants}
    return {
        "config": {
            "variants": variants,
            "depths": depths,
            **vars(probe),
            "attention": {v: example[v].attention for v in variants},
            "model": {k: v for k, v in vars(example[variants[0]]).items() if k not in _OWN_KEYS},
            "mixit_version": __version__,
        },
        "results": results,
    }


def _measure(probe: Probe, variant: str, depth: int, inputs: dict[int, torch.Tensor]) -> dict[str, Any]:
    """One point of the sweep: the last block's statistics (mean and sample std over seeds, 0 for one seed), and
    each layer's means."""
    runs = [token_similarity(Transformer(probe.model(variant, depth, s)), inputs[s]) for s in probe.seeds]
    entry: dict[str, Any] = {}
    for key in STATS:
        last = np.asarray([r[key][-1] for r in runs], dtype=np.float64)
        entry[key], entry[f"{key}_std"] = float(last.mean()), float(last.std(ddof=1)) if len(runs) > 1 else 0.0
    return {**entry, **{f"per_layer_{key}": np.mean([r[key] for r in runs], axis=0).tolist() for key in STATS}}


def plot_signal(result: dict[str, Any], path: str | Path | None = None) -> Figure:
    """Two panels from a `signal_propagation` result: last-layer cosine and covariance against depth (log2
    axis), one line per variant with error bars of one seed standard deviation; saved to `path` if one is given.

    Variants that coincide at initialisation (standard and random) would hide each other, so later lines get
    smaller markers and thinner lines, and the legend names the variant a line repeats.
    """
    from matplotlib.figure import Figure

    cfg = result["config"]
    depths = cfg["depths"]
    fig = Figure(figsize=(11, 4.4), layout="constrained")
    panels = {
        "cosine": "mean cosine similarity between tokens",
        "covariance": "mean off-diagonal token covariance\n(RMS-normalised Gram / d)",
    }
    results = list(result["results"].items())
    labels = []
    for i, (variant, by_depth) in enumerate(results):
        same = [other for other, earlier in results[:i] if earlier == by_depth]
        labels.append(
            f"{variant} ({cfg['attention'][variant]} attention" + (f"; identical to {same[0]})" if same else ")")
        )
    for ax, (key, label) in zip(fig.subplots(1, 2), panels.items()):
        for i, (_, by_depth) in enumerate(results):
            ax.errorbar(
                depths,
                [by_depth[str(d)][key] for d in depths],
                yerr=[by_depth[str(d)][f"{key}_std"] for d in depths],
                marker="osD^vx*P"[i % 8],
                linestyle=["-", "--", ":", "-."][i % 4],
                capsize=3,
                markersize=max(9 - 2.5 * i, 3),
                linewidth=max(2.2 - 0.6 * i, 0.8),
                label=labels[i],
            )
        ax.set_xscale("log", base=2)
        ax.set_xticks(depths, [str(d) for d in depths])
        ax.set(xlabel="depth (number of blocks)", ylabel=label)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    settings = "shaped (signal-propagation) settings" if cfg["shaped"] else "standard settings"
    extra = f", {cfg['model_overrides']}" if cfg.get("model_overrides") else ""
    fig.suptitle(
        f"Token similarity after the last block at initialisation: d_model={cfg['d_model']}, "
        f"n_ctx={cfg['n_ctx']}, {settings}{extra}, {len(cfg['seeds'])} seeds",
        fontsize=10,
    )
    return saved(fig, path)


@dataclass(frozen=True)
class SignalOptions:
    """What `mixit signal` measures, and where it writes signal.json and signal.png (one flag per field)."""

    out: Path = Path("signal")
    """The output directory; signal.json and signal.png there are never overwritten."""
    variants: Sequence[str] = ("standard", "mixit", "random")
    """The variants to build, comma-separated."""
    depths: Sequence[int] = (2, 4, 8, 16, 32)
    """The depths (numbers of blocks) to build, comma-separated."""
    d_model: int = 128
    """Model width."""
    n_heads: int = 4
    """Attention heads; must divide d_model."""
    n_ctx: int = 64
    """Tokens per random input sequence (and the models' context)."""
    seeds: int = 3
    """Initialisations averaged per point (seeds 0 to seeds - 1)."""
    shaped: bool = False
    """Build every variant with the signal-propagation settings (`ModelConfig.shaped()`) instead of the
    standard ones."""
    mixing_sink: Literal["reference", "normalised", "off"] = "reference"
    """MixiT's head 0: reference, normalised or off (docs/model.md, "The sink head")."""


def signal_command(options: SignalOptions) -> tuple[dict[str, Any], list[Path]]:
    """Measure, for freshly initialised models of several variants and depths, the mean cosine similarity and
    covariance between token representations after each layer; write signal.json and signal.png into the
    output directory (`out`, --out).

    Returns the result and the files written.
    """
    files = (options.out / "signal.json", options.out / "signal.png")
    check_output_dir(options.out, tuple(f.name for f in files))
    check(options.seeds >= 1, f"seeds must be a positive integer, got {options.seeds}")
    probe = Probe(
        d_model=options.d_model,
        n_heads=options.n_heads,
        n_ctx=options.n_ctx,
        seeds=tuple(range(options.seeds)),
        shaped=options.shaped,
        model_overrides={"mixing_sink": options.mixing_sink},
    )
    result = signal_propagation(list(options.variants), list(options.depths), probe)
    options.out.mkdir(parents=True, exist_ok=True)
    write_json(files[0], result)
    plot_signal(result, files[1])
    return result, list(files)


def format_signal(result: dict[str, Any]) -> str:
    """The last-layer cosine of each variant and depth, as a text table."""
    depths = result["config"]["depths"]
    lines = ["variant      " + "".join(f"{d:>9}" for d in depths) + "   (mean token cosine after the last layer)"]
    for variant, by_depth in result["results"].items():
        lines.append(f"{variant:<12} " + "".join(f"{by_depth[str(d)]['cosine']:>9.4f}" for d in depths))
    return "\n".join(lines)
