"""Head scores on repeated random sequences: previous-token, induction, duplicate-token,
and the behavioural in-context-learning gap (paper, Section 5: MixiT cannot form
induction heads; attention with frozen Q/K can).

Probe inputs are sequences ``r r``: m distinct tokens drawn at random without
replacement, then the same m tokens again (T = 2m). Distinct tokens make the
target positions unambiguous: in the second copy, the previous occurrence of the
token at position i is exactly i - m.

Scores are read from each head's attention pattern A (B, H, T, T), taken through
the model's one pattern hook, so softmax and MixiT heads are scored by the same
code. The targets are those of TransformerLens's head detector (`detect_head`)
and of the prefix-matching score of Olsson et al. (2022); by default
(convention "mixit") each score is the mean attention weight a query puts on its
target key, over the queries that have one:

    previous_token[l, h]  = mean over b, i in [1, T)   of A[b, h, i, i - 1]
    induction[l, h]       = mean over b, i in [m, T)   of A[b, h, i, i - m + 1]
    duplicate_token[l, h] = mean over b, i in [m, T)   of A[b, h, i, i - m]

For softmax heads each lies in [0, 1], 1 meaning all attention on the target.
MixiT rows also sum to 1 but may hold negative weights, so its scores may be
negative; they are still the weight the head gives the target.

TransformerLens's convention (convention "transformer_lens", its ``detect_head``
with error_measure "mul" and neither BOS nor the current token excluded) differs
in the denominator: the attention on the targets is divided by the attention of
every query, those with no target included (the first copy, where no induction
or duplicate is possible), then averaged over the batch:

    score[l, h] = mean over b of  sum over i of A[b, h, i, target(i)]  /  sum over i, j of A[b, h, i, j]

The denominator is T when rows sum to 1, so a perfect induction or
duplicate-token head scores m / 2m = 0.5 there (1.0 here), and a perfect
previous-token head (T - 1) / T. The mixit convention reads 1.0 as "always on
the target", whatever the probe length; the TransformerLens one is there to
compare with numbers reported with that library.

The patterns' input dependence is measured beside the scores: the largest absolute difference,
over every layer, head, row and column, between the patterns of two different probe batches (the
second drawn from seed + 1). A MixiT head's pattern is a fixed matrix, so its difference is 0 (up to
float rounding, which here is none: the same buffer is read); a softmax head's changes with the tokens.
This is what makes "MixiT has no induction head" structural rather than a score that happened to be
low: no pattern that ignores the input can attend to the token after the previous occurrence of the
current one.

The behavioural score needs no pattern: next-token loss and accuracy on the
first copy (positions 0..m-2, which cannot be predicted from context) against
the second copy (positions m..T-2, predictable by copying). The in-context gap
is loss(first) - loss(second); a model with a working induction mechanism has
a large positive gap. For a model trained on the k=1 induction task, the
label at a second-copy position is exactly the next token, so the same
measurement applies.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal, get_args

import torch
import torch.nn.functional as F

from mixit.models.hooks import capture_patterns
from mixit.models.transformer import Transformer

Convention = Literal["mixit", "transformer_lens"]
"""How a head's attention on its targets becomes a score (module docstring)."""

CONVENTIONS: tuple[str, ...] = get_args(Convention)


def repeated_sequences(tokens: Sequence[int], m: int, batch: int, seed: int = 0) -> torch.Tensor:
    """(batch, 2m) sequences ``r r`` with r = m distinct tokens from `tokens`."""
    pool = torch.as_tensor(list(tokens), dtype=torch.long)
    if m < 2 or m > len(pool):
        raise ValueError(f"need 2 <= m <= {len(pool)} distinct tokens, got m={m}")
    g = torch.Generator().manual_seed(seed)
    order = torch.argsort(torch.rand(batch, len(pool), generator=g), dim=1)[:, :m]  # (batch, m)
    r = pool[order]
    return torch.cat([r, r], dim=1)  # (batch, 2m)


def score_patterns(pattern: torch.Tensor, m: int, convention: Convention = "mixit") -> dict[str, torch.Tensor]:
    """The three scores of one layer's pattern (B, H, 2m, 2m) -> each (H,), in `convention` (module docstring)."""
    T = pattern.shape[-1]  # pattern (B, H, 2m, 2m)
    if T != 2 * m:
        raise ValueError(f"pattern length {T} is not 2m = {2 * m}")
    if convention not in CONVENTIONS:
        raise ValueError(f"convention must be one of {', '.join(CONVENTIONS)}, got {convention!r}")
    later = torch.arange(1, T)
    second = torch.arange(m, T)
    targets = {
        "previous_token": (later, later - 1),
        "induction": (second, second - m + 1),
        "duplicate_token": (second, second - m),
    }
    scores = {}
    for key, (queries, keys) in targets.items():
        on_target = pattern[:, :, queries, keys]  # (B, H, number of queries with a target)
        if convention == "mixit":
            scores[key] = on_target.mean(dim=(0, 2))
        else:
            scores[key] = (on_target.sum(dim=2) / pattern.sum(dim=(2, 3))).mean(dim=0)
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
    """Per-layer, per-head scores and the in-context gap of `model` on repeated sequences.

    tokens: the token ids to draw probes from (a task's content tokens).
    m: length of each copy; default min(len(tokens), n_ctx // 2).
    convention: "mixit" (a perfect head scores 1) or "transformer_lens" (its ``detect_head``; a perfect
    induction head scores 0.5): module docstring.
    Returns lists of shape [n_layers][n_heads] under "previous_token",
    "induction" and "duplicate_token", the patterns' input dependence
    (`input_dependence` on this probe and a second one drawn from seed + 1),
    "icl" (loss and accuracy on each copy and the gap; None for a classifier,
    which predicts no next tokens) and the probe settings.
    """
    n_ctx: int = model.cfg.n_ctx
    m = min(len(tokens), n_ctx // 2) if m is None else m
    x = repeated_sequences(tokens, m, batch, seed).to(next(model.parameters()).device)
    was_training = model.training
    model.eval()
    with capture_patterns(model) as patterns:
        logits = model(x)  # (B, T, vocab)
    with capture_patterns(model) as other:
        model(repeated_sequences(tokens, m, batch, seed + 1).to(x.device))
    model.train(was_training)
    names = sorted(patterns, key=lambda n: int(n.split(".")[1]))  # blocks.<layer>.attn.hook_pattern
    per_layer = [score_patterns(patterns[n].float().cpu(), m, convention) for n in names]
    out: dict[str, Any] = {
        key: [s[key].tolist() for s in per_layer] for key in ("previous_token", "induction", "duplicate_token")
    }
    out.update(input_dependence([patterns[n] for n in names], [other[n] for n in names]))
    # A classifier has no next-token predictions to score: no behavioural gap.
    out["icl"] = icl_gap(logits.float().cpu(), x.cpu(), m) if logits.dim() == 3 else None
    out["probe"] = {"m": m, "batch": batch, "seed": seed, "n_tokens": len(tokens), "convention": convention}
    return out


def input_dependence(first: Sequence[torch.Tensor], second: Sequence[torch.Tensor]) -> dict[str, float]:
    """How much the attention patterns changed between two inputs of one shape: each layer's (B, H, T, T)
    pattern on the first and on the second.

    "pattern_input_dependence": the largest |A_first - A_second| over every layer, head, example, row and
    column (0 for attention that ignores its input); "pattern_scale": the largest |A| of either, the
    magnitude a float rounding error would be relative to (1 for softmax probabilities).
    """
    pairs = [(a.float(), b.float()) for a, b in zip(first, second, strict=True)]
    return {
        "pattern_input_dependence": max(((a - b).abs().max().item() for a, b in pairs), default=0.0),
        "pattern_scale": max((max(a.abs().max().item(), b.abs().max().item()) for a, b in pairs), default=0.0),
    }


def icl_gap(logits: torch.Tensor, x: torch.Tensor, m: int) -> dict[str, float]:
    """Next-token loss/accuracy on the first copy vs the second copy of ``r r``."""
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


def strongest(scores: list[list[float]]) -> tuple[int, int, float]:
    """(layer, head, score) of the highest entry of a [layer][head] table."""
    best = max(((layer, h, s) for layer, row in enumerate(scores) for h, s in enumerate(row)), key=lambda t: t[2])
    return best
