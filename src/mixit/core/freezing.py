"""The paper's training regimes ("variants"), and any other, as declared, checked freeze specs.

What a run keeps at its initialisation is a list of *selectors*: module paths
of the one model definition (`mixit.core.models.transformer`), as the
`FreezeReport` and the checkpoint name its parameters (docs/model.md,
"Freezing by structure"):

    embed  pos_embed  norm_f  lm_head  classifier    a top-level module
    blocks                                           every block, whole
    blocks.*.attn.q                                  q of every layer
    blocks.1.mlp   blocks.0-2.attn   blocks.0+3.norm1 one layer, a range (inclusive), a list of them
    norms   blocks.*.norms                           every RMSNorm (of the model, of those layers)
    head                                             the output head, LM or classifier

A segment is a child module's name, a layer set (``*``, ``2``, ``0-2``,
``0+3``, ``0-1+3``) under a list of layers, or, last, a group (`GROUPS`);
no brackets or commas, so a list of selectors is written on the command line
as any list is (``--freeze embed,blocks.0.attn.q``). `parse_selector` is the
one parser, `select` the one function from a selector to modules.

A variant names an attention kind and the selectors it freezes, and is
registered in `VARIANTS`:

    standard    softmax attention, everything trained
    frozen_qk   softmax attention, blocks.*.attn.q and blocks.*.attn.k frozen
    frozen_mlp  softmax attention, blocks.*.mlp (gate, up and down) frozen
    mixit       MixiT attention (fixed random buffers), everything else trained
    random      blocks and norm_f frozen: only the token embedding, the position embedding and
                the head train (Zhong & Andreas 2024); works with either attention kind

A run's own ``freeze`` selectors are added to its variant's. `apply_variant`
freezes what they select with ``requires_grad_(False)`` and returns a
`FreezeReport` listing exactly what is frozen and what trains. A selector
that selects nothing is refused, naming what the model has (``blocks.5``
where the model has layers 0-1; ``blocks.*.attn.q`` on MixiT attention,
which has no q). The optimizer is built afterwards from the trainable
parameters only. A new variant is one `Variant` (with its selectors) added to
`VARIANTS` (docs/extending.md).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import nn

from mixit.core.config import ModelConfig
from mixit.core.models.transformer import Transformer
from mixit.errors import UsageError
from mixit.registry import Registry

GROUPS: dict[str, Callable[[str, nn.Module], bool]] = {
    "norms": lambda name, module: isinstance(module, nn.RMSNorm),
    "head": lambda name, module: name in ("lm_head", "classifier"),
}
"""Group name -> whether a module under the path selected so far belongs to it, from its own name and the
module: the last segment of a selector may be a group."""

_NAME = re.compile(r"[A-Za-z_]\w*")
_LAYERS = re.compile(r"\*|\d+(-\d+)?(\+\d+(-\d+)?)*")
SYNTAX = (
    "a selector is a module path such as blocks.*.attn.q: module names, layer sets (*, 2, 0-2, 0+3) after "
    f"blocks, and last perhaps a group ({', '.join(GROUPS)}); docs/model.md, 'Freezing by structure'"
)

Segment = tuple[Literal["name", "layers", "group"], Any]
"""One step of a selector: ("name", child), ("layers", None for all or a sorted tuple of indices), ("group", name)."""


def parse_selector(text: str) -> tuple[Segment, ...]:
    """The segments of selector `text` (module docstring); a `UsageError` naming it and the syntax if it is none."""
    segments: list[Segment] = []
    parts = text.split(".")
    for i, part in enumerate(parts):
        if _LAYERS.fullmatch(part):
            segments.append(("layers", None if part == "*" else _layer_set(text, part)))
        elif part in GROUPS:
            if i < len(parts) - 1:
                raise UsageError(f"freeze {text!r}: the group {part} selects modules of a kind, so it comes last")
            segments.append(("group", part))
        elif _NAME.fullmatch(part):
            segments.append(("name", part))
        else:
            raise UsageError(f"freeze {text!r} is not a selector ({part!r} is no segment): {SYNTAX}")
    return tuple(segments)


def _layer_set(text: str, part: str) -> tuple[int, ...]:
    """``0-2+5`` -> (0, 1, 2, 5); a range that runs backwards is refused."""
    layers: set[int] = set()
    for item in part.split("+"):
        first, _, last = item.partition("-")
        lo, hi = int(first), int(last or first)
        if hi < lo:
            raise UsageError(f"freeze {text!r}: the layer range {item} runs backwards; write {hi}-{lo}")
        layers.update(range(lo, hi + 1))
    return tuple(sorted(layers))


def _holds_parameters(module: nn.Module) -> bool:
    return any(True for _ in module.parameters())


def select(model: nn.Module, text: str, what: str = "freeze") -> dict[str, nn.Module]:
    """The modules selector `text` names in `model`, by module path; a `UsageError` if it selects nothing,
    naming the selector (after `what`: "freeze", "variant 'x': freeze") and what the model has there."""
    nodes: dict[str, nn.Module] = {"": model}
    for kind, value in parse_selector(text):
        found: dict[str, nn.Module] = {}
        for path, module in nodes.items():
            prefix = f"{path}." if path else ""
            if kind == "group":
                members = {n: m for n, m in module.named_modules() if n and GROUPS[value](n.rpartition(".")[2], m)}
                found.update({prefix + n: m for n, m in members.items() if _holds_parameters(m)})
            elif kind == "name":
                child = dict(module.named_children()).get(value)
                if child is not None and _holds_parameters(child):
                    found[prefix + value] = child
            elif isinstance(module, nn.ModuleList):
                n = len(module)
                layers = range(n) if value is None else value
                missing = [i for i in layers if i >= n]
                if missing and len(missing) < len(layers):
                    raise UsageError(
                        f"{what} {text!r} names layer(s) {', '.join(map(str, missing))}, which do not exist: "
                        f"{path} has {_layers(n)}"
                    )
                found.update({f"{prefix}{i}": module[i] for i in layers if i < n})
        if not found:
            raise UsageError(f"{what} {text!r} selects nothing: {_what_is_there(nodes, kind, value)}")
        nodes = found
    return nodes


def _layers(n: int) -> str:
    return "layer 0 only" if n == 1 else f"layers 0-{n - 1}"


def _what_is_there(nodes: dict[str, nn.Module], kind: str, value: Any) -> str:
    """Why a step found nothing, said from the first node it looked in."""
    path, module = next(iter(nodes.items()))
    where = path or "the model"
    if kind == "layers":
        if isinstance(module, nn.ModuleList):
            return f"{where} has {_layers(len(module))}"
        return f"{where} is not a list of layers"
    children = [n for n, c in module.named_children() if _holds_parameters(c)]
    has = f"it has {', '.join(children)}" if children else "it has no parts with parameters"
    if kind == "group":
        return f"{where} holds no {value} ({has})"
    return f"{where} has no {value} ({has})"


def select_all(model: nn.Module, selectors: Iterable[str], what: str = "freeze") -> dict[str, nn.Module]:
    """The modules every selector of `selectors` names (`select`), by module path."""
    return {path: m for text in selectors for path, m in select(model, text, what).items()}


def check_selectors(cfg: ModelConfig, selectors: Sequence[str]) -> None:
    """Refuse, before any work, a selector that selects nothing in the model `cfg` describes: the model is built
    on torch's meta device (structure only, no memory, no initial values), or on the CPU where a part of it
    (a plugin's attention kind, say) reads a tensor's values while it is built, which the meta device cannot."""
    if not selectors:
        return
    try:
        with torch.device("meta"):
            model = Transformer(cfg)
    except (RuntimeError, NotImplementedError):
        model = Transformer(cfg)
    select_all(model, selectors)


@dataclass(frozen=True)
class Variant:
    """A training regime: an attention kind, the selectors it freezes, and a description."""

    name: str
    attention: str
    freeze: tuple[str, ...]
    """Selectors (module docstring) of what stays at its initialisation; () trains everything."""
    description: str
    any_attention: bool = False  # may be combined with another attention kind

    def __post_init__(self) -> None:
        if not isinstance(self.freeze, tuple) or not all(isinstance(text, str) for text in self.freeze):
            raise TypeError(
                f"variant {self.name!r}: freeze must be a tuple of selectors such as ('blocks.*.attn.q',), "
                f"got {self.freeze!r} (docs/model.md, 'Freezing by structure')"
            )
        for text in self.freeze:
            parse_selector(text)


VARIANTS: Registry[Variant] = Registry("variant")
"""Name -> `Variant`; one `VARIANTS.add` line per variant."""

for _variant in (
    Variant("standard", "softmax", (), "softmax attention with RoPE, everything trained"),
    Variant(
        "frozen_qk",
        "softmax",
        ("blocks.*.attn.q", "blocks.*.attn.k"),
        "query and key projections frozen at initialisation",
    ),
    Variant("frozen_mlp", "softmax", ("blocks.*.mlp",), "every MLP (gate, up, down) frozen at initialisation"),
    Variant("mixit", "mixing", (), "MixiT: fixed random mixing matrices instead of attention"),
    Variant(
        "random",
        "softmax",
        ("blocks", "norm_f"),
        "only embeddings and LM head trained (Zhong & Andreas)",
        any_attention=True,
    ),
):
    VARIANTS.add(_variant.name, _variant)


def get_variant(name: str) -> Variant:
    """The registered variant `name`; a `UsageError` naming the allowed ones if there is none."""
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
    """What a variant, and the run's own freeze selectors beside it, froze: parameter names with their sizes."""

    variant: str
    frozen: dict[str, int]
    trainable: dict[str, int]
    freeze: tuple[str, ...] = ()
    """The run's own selectors, frozen beside the variant's."""

    @property
    def n_frozen(self) -> int:
        return sum(self.frozen.values())

    @property
    def n_trainable(self) -> int:
        return sum(self.trainable.values())

    def summary(self) -> str:
        total = self.n_frozen + self.n_trainable
        extra = f" with freeze {', '.join(self.freeze)}" if self.freeze else ""
        return (
            f"variant {self.variant}{extra}: {self.n_trainable:,} of {total:,} parameters trainable, "
            f"{len(self.frozen)} tensors ({self.n_frozen:,} parameters) frozen"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "variant": self.variant,
            "freeze": list(self.freeze),
            "n_trainable": self.n_trainable,
            "n_frozen": self.n_frozen,
            "frozen": self.frozen,
            "trainable": self.trainable,
        }


def apply_variant(model: Transformer, variant: str | Variant, freeze: Sequence[str] = ()) -> FreezeReport:
    """Freeze what `variant`'s selectors and the extra selectors `freeze` select in `model`, and report it.

    Raises UsageError if any selector selects nothing (`select`)."""
    v = get_variant(variant) if isinstance(variant, str) else variant
    selected = {**select_all(model, v.freeze, f"variant {v.name!r}: freeze"), **select_all(model, freeze)}
    for module in selected.values():
        module.requires_grad_(False)
    frozen = {n: p.numel() for n, p in model.named_parameters() if not p.requires_grad}
    trainable = {n: p.numel() for n, p in model.named_parameters() if p.requires_grad}
    return FreezeReport(v.name, frozen, trainable, tuple(freeze))
