"""Signal propagation at initialisation: do token representations collapse with depth?

The paper's depth experiment (docs/model.md, "The paper's numbers") reports that
the covariance between token representations of the random transformer rises
from 0.0022 at 2 layers to 0.054 at 32 while MixiT's stays flat: rank
collapse, the residual stream of every token drifting towards one shared
vector. This module measures that for freshly initialised models:

    pairwise_stats(h)          cosine, covariance and RMS of one residual stream (B, T, d)
    token_similarity(model, x) those statistics after the embedding and after every block
    signal_propagation(...)    the same for fresh models over variants x depths x seeds (`Probe`)
    plot_signal(result, path)  cosine and covariance against depth, one line per variant (a Figure; saved
                               to `path` if one is given)

Rank collapse shows as cosine -> 1 (and covariance -> 1) as depth grows.
The paper does not give its normalisation of the covariance; ours is defined
in `pairwise_stats`, so only the trend, not the values, compares with it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import torch

from mixit.config import ModelConfig, typed
from mixit.errors import UsageError
from mixit.experiment import model_config
from mixit.files import check_output_dir, write_json
from mixit.freezing import VARIANTS
from mixit.models import Transformer
from mixit.resources import activation_bytes, check_memory, model_bytes
from mixit.version import __version__

if TYPE_CHECKING:
    from matplotlib.figure import Figure

# Random inputs are drawn from a generator of their own, so they do not share a
# stream with the parameter initialisation that uses `seed` directly.
TOKEN_SEED_OFFSET = 7919
# Set by the sweep itself (`Probe` and the depths); refused in model_overrides.
_OWN_KEYS = ("vocab_size", "n_ctx", "d_model", "n_heads", "n_layers", "attention", "seed")


def pairwise_stats(h: torch.Tensor) -> dict[str, float]:
    """Similarity between the T token representations of each sequence, averaged over the batch.

    h: (B, T, d) with T >= 2. For one sequence X (T, d):
      cosine      mean over pairs i != j of cos(X_i, X_j) (a zero row counts as cosine 0);
      covariance  mean over i != j of C_ij, where C = Xn Xn^T / d and Xn = X / rms(X),
                  rms(X) = sqrt(mean of X^2 over all T*d entries). So the mean diagonal
                  of C is exactly 1, and the value is comparable across depths however
                  the residual stream grows or shrinks. Without the RMS division it would
                  be the mean pairwise dot product / d. This normalisation is ours: the
                  paper's is not known. Features are not centred, as in a Gram matrix.
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
    """`pairwise_stats` of the residual stream after the embedding and after each block.

    model: a `Transformer`; tokens: (B, T) ids with 2 <= T <= n_ctx. Runs in eval
    mode without gradients and restores the model's mode. Returns lists of
    n_layers + 1 floats under "cosine", "covariance" and "norm": entry 0 is the
    embedding (plus position embedding where the model has one), entry l the
    stream after block l, read from the model's hook points (``blocks.0.hook_resid_pre``,
    ``blocks.{l-1}.hook_resid_post``) during one forward pass. The final norm and the LM head
    are not included.
    """
    if tokens.dim() != 2 or not 2 <= tokens.shape[1] <= model.cfg.n_ctx:
        raise UsageError(
            f"tokens must have shape (B, T) with 2 <= T <= n_ctx={model.cfg.n_ctx}, got {tuple(tokens.shape)}"
        )
    was_training = model.training
    model.eval()
    try:
        tokens = tokens.to(next(model.parameters()).device)
        # The residual stream entering block 0 (embedding plus positions), then leaving each block.
        names = ["blocks.0.hook_resid_pre", *(f"blocks.{i}.hook_resid_post" for i in range(model.cfg.n_layers))]
        _, cache = model.run_with_cache(tokens, names_filter=names)
        per_layer = [pairwise_stats(cache[name]) for name in names]  # each (B, T, d_model)
    finally:
        model.train(was_training)
    return {key: [stats[key] for stats in per_layer] for key in ("cosine", "covariance", "norm")}


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
    if isinstance(variants, str):
        raise UsageError(f"variants must be a non-empty list of names, got the string {variants!r}")
    if not variants:
        raise UsageError(f"variants must be a non-empty list of names; allowed: {', '.join(VARIANTS)}")
    for v in variants:
        VARIANTS.get(v)
    if len(set(variants)) != len(variants):
        raise UsageError(f"variants must not repeat, got {list(variants)}")
    if not depths or not all(typed("depths", int, d) > 0 for d in depths):
        raise UsageError(f"depths must be a non-empty list of positive integers, got {list(depths)!r}")
    seeds, batch, n_ctx = probe.seeds, probe.batch, probe.n_ctx
    if not seeds:
        raise UsageError(f"seeds must be a non-empty list of integers, got {list(seeds)!r}")
    typed("seeds", tuple[int, ...], seeds)
    if typed("batch", int, batch) <= 0:
        raise UsageError(f"batch must be a positive integer, got {batch!r}")
    if typed("n_ctx", int, n_ctx) < 2:
        raise UsageError(f"n_ctx must be an integer >= 2 (similarity needs two tokens), got {n_ctx!r}")
    typed("shaped", bool, probe.shaped)
    taken = sorted(set(probe.model_overrides or {}) & set(_OWN_KEYS))
    if taken:
        raise UsageError(f"model_overrides may not set {', '.join(taken)}: the sweep sets them itself")


def _mean_std(values: list[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for a single value)."""
    a = np.asarray(values, dtype=np.float64)
    return float(a.mean()), float(a.std(ddof=1)) if len(a) > 1 else 0.0


def signal_propagation(variants: Sequence[str], depths: Sequence[int], probe: Probe | None = None) -> dict[str, Any]:
    """Token similarity of freshly initialised models, for every variant x depth, averaged over seeds.

    For each (variant, depth, seed) a new `Transformer` is built (`Probe.model`: the variant's own
    settings) and `token_similarity` is measured on `probe.batch` random sequences of n_ctx uniformly
    random ids (`Probe.inputs`: every variant of one seed sees the same inputs). A variant matters here
    only through its attention kind: freezing decides what training may change and leaves the forward
    pass at initialisation untouched, so "standard" and "random" (the paper's random transformer: a
    softmax model of which only the embeddings and head are trained) give identical numbers.

    Returns a JSON-serialisable dict:
        {"config": {every setting, the resulting model settings, mixit version},
         "results": {variant: {str(depth): {
             "cosine", "cosine_std", "covariance", "covariance_std", "norm", "norm_std":
                 after the last block, mean and sample std over seeds;
             "per_layer_cosine", "per_layer_covariance", "per_layer_norm":
                 depth + 1 values (embedding, then each block), means over seeds}}}}
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
    model = {k: v for k, v in vars(next(iter(example.values()))).items() if k not in _OWN_KEYS}
    return {
        "config": {
            "variants": variants,
            "depths": depths,
            **vars(probe),
            "attention": {v: example[v].attention for v in variants},
            "model": model,
            "mixit_version": __version__,
        },
        "results": results,
    }


def _measure(probe: Probe, variant: str, depth: int, inputs: dict[int, torch.Tensor]) -> dict[str, Any]:
    """One point of the sweep: the last block's statistics (mean and std over seeds), and each layer's means."""
    runs = [token_similarity(Transformer(probe.model(variant, depth, s)), inputs[s]) for s in probe.seeds]
    entry: dict[str, Any] = {}
    for key in ("cosine", "covariance", "norm"):
        entry[key], entry[f"{key}_std"] = _mean_std([r[key][-1] for r in runs])
    for key in ("cosine", "covariance", "norm"):
        entry[f"per_layer_{key}"] = np.mean([r[key] for r in runs], axis=0).tolist()
    return entry


def plot_signal(result: dict[str, Any], path: str | Path | None = None) -> Figure:
    """Two panels from a `signal_propagation` result: last-layer cosine and covariance against depth; saved
    to `path` if one is given. pyplot does not hold the Figure: a caller that only wants the file drops it.

    One line per variant with error bars of one seed standard deviation; depth
    on a log2 axis. Variants that coincide at initialisation (standard and
    random) would hide each other, so later lines get smaller markers and
    thinner lines, and the legend names the variant a line repeats.
    """
    from matplotlib.figure import Figure

    cfg = result["config"]
    depths = cfg["depths"]
    markers, dashes = "osD^vx*P", ["-", "--", ":", "-."]
    fig = Figure(figsize=(11, 4.4), layout="constrained")
    axes = fig.subplots(1, 2)
    panels = [
        ("cosine", "mean cosine similarity between tokens"),
        ("covariance", "mean off-diagonal token covariance\n(RMS-normalised Gram / d)"),
    ]
    results = list(result["results"].items())
    labels = []
    for i, (variant, by_depth) in enumerate(results):
        same = [other for other, earlier in results[:i] if earlier == by_depth]
        labels.append(
            f"{variant} ({cfg['attention'][variant]} attention" + (f"; identical to {same[0]})" if same else ")")
        )
    for ax, (key, label) in zip(axes, panels):
        for i, (_, by_depth) in enumerate(results):
            mean = [by_depth[str(d)][key] for d in depths]
            std = [by_depth[str(d)][f"{key}_std"] for d in depths]
            ax.errorbar(
                depths,
                mean,
                yerr=std,
                marker=markers[i % len(markers)],
                linestyle=dashes[i % len(dashes)],
                capsize=3,
                markersize=max(9 - 2.5 * i, 3),
                linewidth=max(2.2 - 0.6 * i, 0.8),
                label=labels[i],
            )
        ax.set_xscale("log", base=2)
        ax.set_xticks(depths, [str(d) for d in depths])
        ax.set_xlabel("depth (number of blocks)")
        ax.set_ylabel(label)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    settings = "shaped (signal-propagation) settings" if cfg["shaped"] else "standard settings"
    extra = f", {cfg['model_overrides']}" if cfg.get("model_overrides") else ""
    fig.suptitle(
        f"Token similarity after the last block at initialisation: d_model={cfg['d_model']}, "
        f"n_ctx={cfg['n_ctx']}, {settings}{extra}, {len(cfg['seeds'])} seeds",
        fontsize=10,
    )
    if path is not None:
        fig.savefig(path, dpi=110)
    return fig


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
    if options.seeds < 1:
        raise UsageError(f"seeds must be a positive integer, got {options.seeds}")
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
