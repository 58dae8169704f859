"""The paper's training regimes ("variants") as explicit, checked freeze rules.

A variant names an attention kind and a freeze rule (docs/model.md, "Variants"),
and is registered in `VARIANTS`:

    standard    softmax attention, everything trained
    frozen_qk   softmax attention, q and k projections (weights and biases) frozen
    frozen_mlp  softmax attention, gate, up and down of every MLP frozen
    mixit       MixiT attention (fixed random buffers), everything else trained
    random      everything frozen except token embedding, position embedding and
                LM head (Zhong & Andreas 2024); works with either attention kind

A rule selects modules by structure (``block.attn.q``), never by name
substring; `apply_variant` freezes them with ``requires_grad_(False)`` and
returns a `FreezeReport` listing exactly what it froze. A rule that selects
nothing is an error (frozen_qk on MixiT attention, which has no q or k). The
optimizer is built afterwards from the trainable parameters only. A new
variant is one `Variant` (with its rule) added to `VARIANTS` (docs/extending.md).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torch import nn

from mixit.errors import UsageError
from mixit.models.transformer import Transformer
from mixit.registry import Registry

Rule = Callable[[Transformer], dict[str, nn.Module]]


def block_parts(model: Transformer, part: str, names: tuple[str, ...]) -> dict[str, nn.Module]:
    found = {}
    for i, block in enumerate(model.layers):
        parent = getattr(block, part)
        for name in names:
            module = getattr(parent, name, None)
            if module is not None:
                found[f"blocks.{i}.{part}.{name}"] = module
    return found


def query_key(model: Transformer) -> dict[str, nn.Module]:
    """The q and k projections of every layer."""
    return block_parts(model, "attn", ("q", "k"))


def mlps(model: Transformer) -> dict[str, nn.Module]:
    """gate, up and down of every MLP."""
    return block_parts(model, "mlp", ("gate", "up", "down"))


def all_but_embeddings(model: Transformer) -> dict[str, nn.Module]:
    """Every block and the final norm: all but the embeddings and the LM head."""
    found: dict[str, nn.Module] = {f"blocks.{i}": block for i, block in enumerate(model.blocks)}
    found["norm_f"] = model.norm_f
    return found


@dataclass(frozen=True)
class Variant:
    """A training regime: an attention kind, what is frozen, and the model settings it brings."""

    name: str
    attention: str
    freeze: Rule | None
    description: str
    any_attention: bool = False  # may be combined with another attention kind


VARIANTS: Registry[Variant] = Registry("variant")
"""Name -> `Variant`; one `VARIANTS.add` line per variant."""

for _variant in (
    Variant("standard", "softmax", None, "softmax attention with RoPE, everything trained"),
    Variant("frozen_qk", "softmax", query_key, "query and key projections frozen at initialisation"),
    Variant("frozen_mlp", "softmax", mlps, "every MLP (gate, up, down) frozen at initialisation"),
    Variant("mixit", "mixing", None, "MixiT: fixed random mixing matrices instead of attention"),
    Variant(
        "random",
        "softmax",
        all_but_embeddings,
        "only embeddings and LM head trained (Zhong & Andreas)",
        any_attention=True,
    ),
):
    VARIANTS.add(_variant.name, _variant)


def get_variant(name: str) -> Variant:
    return VARIANTS.get(name)


def check_attention(variant: Variant, attention: str) -> None:
    """Refuse an attention kind the variant is not defined for."""
    if attention != variant.attention and not variant.any_attention:
        raise UsageError(
            f"variant {variant.name!r} uses {variant.attention} attention, not {attention!r}; "
            f"only 'random' may be combined with another attention kind"
        )


@dataclass
class FreezeReport:
    """What a variant froze: parameter names with their sizes."""

    variant: str
    frozen: dict[str, int]
    trainable: dict[str, int]

    @property
    def n_frozen(self) -> int:
        return sum(self.frozen.values())

    @property
    def n_trainable(self) -> int:
        return sum(self.trainable.values())

    def summary(self) -> str:
        total = self.n_frozen + self.n_trainable
        return (
            f"variant {self.variant}: {self.n_trainable:,} of {total:,} parameters trainable, "
            f"{len(self.frozen)} tensors ({self.n_frozen:,} parameters) frozen"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "variant": self.variant,
            "n_trainable": self.n_trainable,
            "n_frozen": self.n_frozen,
            "frozen": self.frozen,
            "trainable": self.trainable,
        }


def apply_variant(model: Transformer, variant: str | Variant) -> FreezeReport:
    """Freeze what `variant`'s rule selects in `model` and report it.

    Raises UsageError if the rule selects no parameter at all.
    """
    v = get_variant(variant) if isinstance(variant, str) else variant
    if v.freeze is not None:
        selected = v.freeze(model)
        n_selected = sum(p.numel() for m in selected.values() for p in m.parameters())
        if n_selected == 0:
            raise UsageError(
                f"freeze rule of variant {v.name!r} ({v.freeze.__name__}) matches no parameter "
                f"in this model ({model.cfg.attention} attention)"
            )
        for module in selected.values():
            module.requires_grad_(False)
    frozen = {n: p.numel() for n, p in model.named_parameters() if not p.requires_grad}
    trainable = {n: p.numel() for n, p in model.named_parameters() if p.requires_grad}
    return FreezeReport(v.name, frozen, trainable)
