"""Hook points: named places where analysis code can read a tensor.

Every attention kind passes its (B, H, T, T) pattern through its
``hook_pattern`` (a `HookPoint`), so analysis never branches on the variant
(docs/design.md, "Looking inside"). Fast attention kernels never materialise the
pattern; an attention module builds it explicitly only while a hook is attached
(`HookPoint.active`), which `capture_patterns` arranges.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn


class HookPoint(nn.Module):
    """Identity module whose forward hooks see the tensor passing through."""

    @property
    def active(self) -> bool:
        return bool(self._forward_hooks)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


@contextmanager
def capture_patterns(model: nn.Module) -> Iterator[dict[str, torch.Tensor]]:
    """Collect every attention pattern computed inside the block.

    Yields a dict filled during forward passes: module name of the hook point
    (e.g. ``blocks.0.attn.hook_pattern``) -> pattern (B, H, T, T), detached.

        with capture_patterns(model) as patterns:
            model(tokens)
        patterns["blocks.0.attn.hook_pattern"]
    """
    patterns: dict[str, torch.Tensor] = {}
    handles = []
    for name, module in model.named_modules():
        if isinstance(module, HookPoint) and name.endswith("hook_pattern"):

            def save(_mod, _inp, out, name=name):
                patterns[name] = out.detach()

            handles.append(module.register_forward_hook(save))
    try:
        yield patterns
    finally:
        for h in handles:
            h.remove()
