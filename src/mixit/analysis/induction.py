"""Head scores on repeated random sequences: previous-token, induction, duplicate-token, and the behavioural
in-context-learning gap (paper, Section 5: MixiT cannot form induction heads; attention with frozen Q/K can).

A probe is ``r r``: m distinct random tokens, then the same m again (T = 2m), so in the second copy the previous
occurrence of the token at i is exactly i - m. Each score is read from every head's pattern A (B, H, T, T),
taken through the model's one pattern hook, so softmax and MixiT heads are scored by the same code. The targets
are those of TransformerLens's `detect_head` and of Olsson et al. (2022); in the default convention ("mixit")
a score is the mean weight a query puts on its target, over the queries that have one:

    previous_token  mean over b, i in [1, T) of A[b, h, i, i - 1]
    induction       mean over b, i in [m, T) of A[b, h, i, i - m + 1]
    duplicate_token mean over b, i in [m, T) of A[b, h, i, i - m]

so a perfect head scores 1 (MixiT's signed rows may score below 0). Convention "transformer_lens" (`detect_head`
with error measure "mul") divides by the whole pattern's sum instead: a perfect induction head scores 0.5 there
(docs/analysis.md, "The induction score's convention").

`pattern_input_dependence`, the largest difference between the patterns of two probe batches, is exactly 0 for
MixiT, whose pattern is one fixed buffer: "MixiT has no induction head" is structural, not a low score. The
behavioural gap needs no pattern: next-token loss on the first copy minus that on the second.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal, get_args

import torch
import torch.nn.functional as F

from mixit.core.models.transformer import Transformer

Convention = Literal["mixit", "transformer_lens"]
"""How a head's attention on its targets becomes a score (module docstring)."""

CONVENTIONS: tuple[str, ...] = get_args(Convention)
SCORE_KINDS = ("previous_token", "induction", "duplicate_token")


def is_pattern(name: str) -> bool:
    """Whether hook point `name` is an attention pattern (``blocks.<layer>.attn.hook_pattern``)."""
    return name.endswith("hook_pattern")


def repeated_sequences(tokens: Sequence[int], m: int, batch: int, seed: int = 0) -> torch.Tensor:
    """(batch, 2m) sequences ``r r`` with r = m distinct tokens from `tokens`."""
    pool = torch.as_tensor(list(tokens), dtype=torch.long)
    if m < 2 or m > len(pool):
        raise ValueError(f"need 2 <= m <= {len(pool)} distinct tokens, got m={m}")
    g = torch.Generator().manual_seed(seed)
    r = pool[torch.argsort(torch.rand(batch, len(pool), generator=g), dim=1)[:, :m]]  # (batch, m)
    return torch.cat([r, r], dim=1)  # (batch, 2m)


def score_patterns(pattern: torch.Tensor, m: int, convention: Convention = "mixit") -> dict[str, torch.Tensor]:
    """The three scores of one layer's pattern (B, H, 2m, 2m) -> each (H,), in `convention` (module docstring)."""
    T = pattern.shape[-1]
    if T != 2 * m:
        raise ValueError(f"pattern length {T} is not 2m = {2 * m}")
    if convention not in CONVENTIONS:
        raise ValueError(f"convention must be one of {', '.join(CONVENTIONS)}, got {convention!r}")
    later, second = torch.arange(1, T), torch.arange(m, T)
    targets = zip(SCORE_KINDS, ((later, later - 1), (second, second - m + 1), (second, second - m)))
    scores = {}
    for kind, (queries, keys) in targets:
        on_target = pattern[:, :, queries, keys]  # (B, H, queries with a target)
        if convention == "mixit":
            scores[kind] = on_target.mean(dim=(0, 2))
        else:
            scores[kind] = (on_target.sum(dim=2) / pattern.sum(dim=(2, 3))).mean(dim=0)
    return scores


@torch.no_grad()
def head_scores(
    model: Transformer,
    tokens: Sequence[int],
    m: int | None = None,
    batch: int = 64,
    seed: int = 0,
    convention: Convention = "mixit",
) -> dict[str, Any]:
    """Per-layer, per-head scores and the in-context gap of `model` on `batch` repeated sequences of copies of
    length `m` (default min(len(tokens), n_ctx // 2)) drawn from the token ids `tokens`: [n_layers][n_heads]
    lists under each of `SCORE_KINDS`, the patterns' `input_dependence` between this probe and one drawn from
    seed + 1, "icl" (`icl_gap`; None for a classifier) and the probe's settings under "probe".
    """
    m = min(len(tokens), model.cfg.n_ctx // 2) if m is None else m
    x = repeated_sequences(tokens, m, batch, seed).to(next(model.parameters()).device)
    logits, patterns = model.run_with_cache(x, is_pattern)  # logits (B, T, vocab); patterns in layer order
    _, other = model.run_with_cache(repeated_sequences(tokens, m, batch, seed + 1).to(x.device), is_pattern)
    per_layer = [score_patterns(p.float().cpu(), m, convention) for p in patterns.values()]
    out: dict[str, Any] = {kind: [s[kind].tolist() for s in per_layer] for kind in SCORE_KINDS}
    out.update(input_dependence(list(patterns.values()), list(other.values())))
    out["icl"] = icl_gap(logits.float().cpu(), x.cpu(), m) if logits.dim() == 3 else None
    out["probe"] = {"m": m, "batch": batch, "seed": seed, "n_tokens": len(tokens), "convention": convention}
    return out


def input_dependence(first: Sequence[torch.Tensor], second: Sequence[torch.Tensor]) -> dict[str, float]:
    """How much each layer's (B, H, T, T) pattern changed between two inputs of one shape: the largest
    |A_first - A_second| ("pattern_input_dependence"), and the largest |A| of either ("pattern_scale", what a
    rounding error would be relative to)."""
    pairs = [(a.float(), b.float()) for a, b in zip(first, second, strict=True)]
    return {
        "pattern_input_dependence": max(((a - b).abs().max().item() for a, b in pairs), default=0.0),
        "pattern_scale": max((max(a.abs().max().item(), b.abs().max().item()) for a, b in pairs), default=0.0),
    }


def icl_gap(logits: torch.Tensor, x: torch.Tensor, m: int) -> dict[str, float]:
    """Next-token loss and accuracy on the first copy (positions 0..m-2) and the second (m..2m-2) of ``r r``,
    and the loss gap between them."""
    pred_logits, targets = logits[:, :-1], x[:, 1:]  # prediction at t is scored against x[t+1]
    loss = F.cross_entropy(pred_logits.transpose(1, 2), targets, reduction="none")  # (B, T-1)
    right = (pred_logits.argmax(-1) == targets).float()
    first, second = slice(0, m - 1), slice(m, 2 * m - 1)
    result = {
        "loss_first_copy": loss[:, first].mean().item(),
        "loss_second_copy": loss[:, second].mean().item(),
        "acc_first_copy": right[:, first].mean().item(),
        "acc_second_copy": right[:, second].mean().item(),
    }
    result["loss_gap"] = result["loss_first_copy"] - result["loss_second_copy"]
    return result


def strongest(scores: list[list[float]]) -> dict[str, Any]:
    """The highest entry of a [layer][head] table: {"layer", "head", "score"}."""
    layer, head, score = max(((i, h, s) for i, row in enumerate(scores) for h, s in enumerate(row)), key=lambda t: t[2])
    return {"layer": layer, "head": head, "score": score}
