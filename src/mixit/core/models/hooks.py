"""Hook points: named places where analysis code can read or replace a tensor.

The model passes its residual stream and the outputs of every attention and
MLP through `HookPoint`s named as TransformerLens names them (docs/model.md,
"Hook points"), so a hook written for TransformerLens finds the same tensor
here:

    hook_embed, hook_pos_embed (MixiT only: learned positions)
    blocks.{i}.hook_resid_pre, blocks.{i}.hook_attn_out, blocks.{i}.hook_resid_mid,
    blocks.{i}.hook_mlp_out, blocks.{i}.hook_resid_post, blocks.{i}.attn.hook_pattern
    ln_final.hook_normalized (the final stream normalized, before the norm's gain, as in TransformerLens)

A hook point is an identity module: with nothing attached it costs one module
call. Every attention kind passes its (B, H, T, T) pattern through its
``hook_pattern``, so analysis never branches on the variant. Fast attention
kernels never materialise the pattern; an attention module builds it
explicitly only while something watches it: a hook attached, or nnsight's
wrapper (`HookPoint.active`).

    capture(model, names_filter)  a dict name -> tensor filled by the forward passes inside the block
    attach(model, fwd_hooks)      run (name, fn) hooks inside the block; fn may return a replacement
    capture_patterns(model)       capture() of every attention pattern
"""

from __future__ import annotations

import typing
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager

import torch
from torch import nn

from mixit.errors import UsageError

HookFn = Callable[[torch.Tensor, "HookPoint"], torch.Tensor | None]
"""``fn(activation, hook)`` -> None to leave the activation as it is, or the tensor to use instead."""
NamesFilter = str | Sequence[str] | Callable[[str], bool] | None
"""Which hook points: None for all, one name, a list of names, or a predicate on the name."""


class HookPoint(nn.Module):
    """Identity module whose forward hooks see (and may replace) the tensor passing through.

    ``name`` is its module name in the model (``blocks.0.hook_resid_post``), set by `name_hook_points`.
    """

    def __init__(self) -> None:
        super().__init__()
        self.name = ""

    @property
    def active(self) -> bool:
        """Whether something watches the tensor here, so the model must compute it: a forward hook, or a wrapper
        that replaced this module's forward (nnsight does, to read and patch module outputs)."""
        return bool(self._forward_hooks) or "forward" in self.__dict__

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


def name_hook_points(model: nn.Module) -> None:
    """Give every hook point of `model` its module name (``HookPoint.name``), as a hook function reads it."""
    for name, module in model.named_modules():
        if isinstance(module, HookPoint):
            module.name = name


def hook_points(model: nn.Module, names_filter: NamesFilter = None) -> dict[str, HookPoint]:
    """The hook points of `model` that `names_filter` selects, by name, in the order the forward pass meets them.

    A name in a list (or a single name) that is no hook point of the model is refused, naming the hook points.
    """
    points = {name: m for name, m in model.named_modules() if isinstance(m, HookPoint)}
    if names_filter is None:
        return points
    if callable(names_filter):
        return {name: m for name, m in points.items() if names_filter(name)}
    wanted = [names_filter] if isinstance(names_filter, str) else list(names_filter)
    unknown = [name for name in wanted if name not in points]
    if unknown:
        raise UsageError(f"no hook point named {unknown[0]!r}; the model has: {', '.join(points)}")
    return {name: points[name] for name in points if name in wanted}


TorchHook = Callable[[nn.Module, object, torch.Tensor], torch.Tensor | None]


@contextmanager
def _registered(hooks: Iterable[tuple[HookPoint, TorchHook]]) -> Iterator[None]:
    """Register each (hook point, torch forward hook) pair for the duration of the block."""
    handles = []
    try:
        for point, hook in hooks:
            handles.append(point.register_forward_hook(hook))
        yield
    finally:
        for h in handles:
            h.remove()


def _calling(fn: HookFn) -> TorchHook:
    """A torch forward hook that calls ``fn(activation, hook point)`` and returns what it returns."""
    return lambda point, _inputs, out: fn(out, typing.cast(HookPoint, point))


@contextmanager
def attach(model: nn.Module, fwd_hooks: Iterable[tuple[NamesFilter, HookFn]]) -> Iterator[None]:
    """Run each ``(names, fn)`` of `fwd_hooks` at the hook points `names` selects (a name, a list or a
    predicate, as `hook_points` reads them) during the forward passes inside the block; removed afterwards.

    ``fn(activation, hook)`` returns None to read only, or a tensor that replaces the activation
    downstream (activation patching):

        with attach(model, [("blocks.0.hook_mlp_out", lambda x, hook: torch.zeros_like(x))]):
            logits = model(tokens)  # the first MLP ablated
    """
    hooks = [(point, _calling(fn)) for names, fn in fwd_hooks for point in hook_points(model, names).values()]
    with _registered(hooks):
        yield


@contextmanager
def capture(model: nn.Module, names_filter: NamesFilter = None) -> Iterator[dict[str, torch.Tensor]]:
    """Collect the tensors at the hook points `names_filter` selects (`hook_points`) during the forward passes
    inside the block.

    Yields a dict filled as the model runs: hook point name (in `model`) -> tensor, detached; a later pass
    overwrites an earlier one.

        with capture(model, ["blocks.0.hook_resid_post"]) as cache:
            model(tokens)
        cache["blocks.0.hook_resid_post"]  # (B, T, d_model)
    """
    cache: dict[str, torch.Tensor] = {}

    def saver(name: str) -> TorchHook:
        def save(_point: nn.Module, _inputs: object, out: torch.Tensor) -> None:
            cache[name] = out.detach()

        return save

    with _registered((point, saver(name)) for name, point in hook_points(model, names_filter).items()):
        yield cache


@contextmanager
def capture_patterns(model: nn.Module) -> Iterator[dict[str, torch.Tensor]]:
    """Collect every attention pattern computed inside the block.

    Yields a dict filled during forward passes: module name of the hook point
    (e.g. ``blocks.0.attn.hook_pattern``) -> pattern (B, H, T, T), detached.

        with capture_patterns(model) as patterns:
            model(tokens)
        patterns["blocks.0.attn.hook_pattern"]
    """
    with capture(model, lambda name: name.endswith("hook_pattern")) as patterns:
        yield patterns
