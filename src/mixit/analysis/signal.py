"""Signal propagation at initialisation: do token representations collapse with depth?

The paper's depth experiment (docs/model.md, "The paper's numbers") reports that the covariance between token
representations of the random transformer rises from 0.0022 at 2 layers to 0.054 at 32 while MixiT's stays flat:
rank collapse, every token drifting towards one shared vector, which shows here as cosine -> 1 (and covariance
-> 1) with depth. The paper does not give its normalisation of the covariance, so only the trend compares.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
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

# The inputs have a generator of their own, so as not to share a stream with the initialisation seeded by `seed`.
TOKEN_SEED_OFFSET = 7919
# Set by the sweep itself: left out of the model settings it records.
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
    """`pairwise_stats` of the residual stream on `tokens` (B, T), 2 <= T <= n_ctx, in one forward pass:
    n_layers + 1 floats under each of `STATS`, entry 0 the stream entering block 0 (embedding and positions),
    entry l the stream leaving block l - 1; the final norm and LM head are left out."""
    if tokens.dim() != 2 or not 2 <= tokens.shape[1] <= model.cfg.n_ctx:
        raise UsageError(
            f"tokens must have shape (B, T) with 2 <= T <= n_ctx={model.cfg.n_ctx}, got {tuple(tokens.shape)}"
        )
    names = ["blocks.0.hook_resid_pre", *(f"blocks.{i}.hook_resid_post" for i in range(model.cfg.n_layers))]
    _, cache = model.run_with_cache(tokens.to(next(model.parameters()).device), names_filter=names)
    per_layer = [pairwise_stats(cache[name]) for name in names]  # each (B, T, d_model)
    return {key: [stats[key] for stats in per_layer] for key in STATS}


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
    vocab_size: int = 64
    """Vocabulary the random inputs are drawn from."""
    batch: int = 16
    """Random sequences per measurement."""
    seeds: int = 3
    """Initialisations averaged per point (seeds first_seed to first_seed + seeds - 1); seed s also draws the
    inputs."""
    first_seed: int = 0
    """The first initialisation seed: a second study measures seeds no other did."""
    shaped: bool = False
    """Build every variant with the signal-propagation settings (`ModelConfig.shaped()`), not the standard ones."""
    mixing_sink: Literal["reference", "normalised", "off"] = "reference"
    """MixiT's head 0: reference, normalised or off (docs/model.md, "The sink head")."""

    def model(self, variant: str, depth: int, seed: int) -> ModelConfig:
        """The model of `variant` with `depth` blocks initialised from `seed` (the variant's own settings)."""
        return model_config(
            variant,
            n_layers=depth,
            seed=seed,
            vocab_size=self.vocab_size,
            n_ctx=self.n_ctx,
            d_model=self.d_model,
            n_heads=self.n_heads,
            **{**(ModelConfig.shaped() if self.shaped else {}), "mixing_sink": self.mixing_sink},
        )

    def inputs(self, seed: int) -> torch.Tensor:
        """The random token ids every variant of `seed` is measured on: (batch, n_ctx)."""
        generator = torch.Generator().manual_seed(seed + TOKEN_SEED_OFFSET)
        return torch.randint(self.vocab_size, (self.batch, self.n_ctx), generator=generator)  # (batch, n_ctx)


def _check(options: SignalOptions) -> None:
    """Refuse, with one line, a sweep no model or measurement could be made of."""
    variants, depths = options.variants, options.depths
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
    for name in ("seeds", "batch"):
        value = getattr(options, name)
        check(typed(name, int, value) > 0, f"{name} must be a positive integer, got {value!r}")
    check(
        typed("first_seed", int, options.first_seed) >= 0,
        f"first_seed must be an integer >= 0, got {options.first_seed!r}",
    )
    check(
        typed("n_ctx", int, options.n_ctx) >= 2,
        f"n_ctx must be an integer >= 2 (similarity needs two tokens), got {options.n_ctx!r}",
    )
    typed("shaped", bool, options.shaped)


def signal_propagation(options: SignalOptions = SignalOptions()) -> dict[str, Any]:
    """`token_similarity` of freshly initialised models for every variant x depth of `options` (its `out` is not
    read), averaged over the seeds, on the same random ids for every variant of a seed. A variant matters only
    through its attention kind: freezing changes no forward pass at initialisation, so "standard" and "random"
    give identical numbers.

    Returns {"config": every setting, "results": {variant: {str(depth): `_measure`}}}, as JSON types.
    """
    _check(options)
    variants, depths = list(options.variants), list(options.depths)
    seeds = list(range(options.first_seed, options.first_seed + options.seeds))
    # Validate the model settings of every variant before any work, and check that the deepest fits.
    example = {v: options.model(v, depths[0], 0) for v in variants}
    deepest = options.model(variants[0], max(depths), 0)
    check_memory(
        "the signal sweep",
        {
            "the deepest model": model_bytes(deepest),
            f"its activations at batch {options.batch}": activation_bytes(deepest, options.batch, options.n_ctx),
        },
        "cpu",
        "lower the depths, d_model or n_ctx",
    )
    inputs = {s: options.inputs(s) for s in seeds}
    results = {v: {str(depth): _measure(options, v, depth, inputs) for depth in depths} for v in variants}
    probe = {k: getattr(options, k) for k in ("d_model", "n_heads", "n_ctx", "vocab_size", "batch")}
    return {
        "config": {
            "variants": variants,
            "depths": depths,
            **probe,
            "seeds": seeds,
            "shaped": options.shaped,
            "model_overrides": {"mixing_sink": options.mixing_sink},
            "attention": {v: example[v].attention for v in variants},
            "model": {k: v for k, v in vars(example[variants[0]]).items() if k not in _OWN_KEYS},
            "mixit_version": __version__,
        },
        "results": results,
    }


def _measure(options: SignalOptions, variant: str, depth: int, inputs: dict[int, torch.Tensor]) -> dict[str, Any]:
    """One point of the sweep: the last block's "cosine", "covariance" and "norm" (means over seeds) with their
    sample std ("cosine_std", ...; 0 for one seed), and each layer's means ("per_layer_cosine", ...)."""
    runs = [token_similarity(Transformer(options.model(variant, depth, s)), inputs[s]) for s in inputs]
    entry: dict[str, Any] = {}
    for key in STATS:
        last = np.asarray([r[key][-1] for r in runs], dtype=np.float64)
        entry[key], entry[f"{key}_std"] = float(last.mean()), float(last.std(ddof=1)) if len(runs) > 1 else 0.0
    return {**entry, **{f"per_layer_{key}": np.mean([r[key] for r in runs], axis=0).tolist() for key in STATS}}


def plot_signal(result: dict[str, Any], path: str | Path | None = None) -> Figure:
    """Two panels from a `signal_propagation` result: last-layer cosine and covariance against depth, a line per
    variant with error bars of one seed standard deviation; saved to `path` if one is given. Variants that coincide
    (standard and random) would hide each other: later lines are thinner, and the legend names the one repeated."""
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


def signal_command(options: SignalOptions) -> tuple[dict[str, Any], list[Path]]:
    """Measure, for freshly initialised models of several variants and depths, the mean cosine similarity and
    covariance between token representations after each layer; write signal.json and signal.png into the
    output directory (`out`, --out)."""
    files = (options.out / "signal.json", options.out / "signal.png")
    check_output_dir(options.out, tuple(f.name for f in files))
    result = signal_propagation(options)
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
