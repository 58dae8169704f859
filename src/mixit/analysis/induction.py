"""Head scores on repeated random sequences: previous-token, induction, duplicate-token,
and the behavioural in-context-learning gap (paper, Section 5: MixiT cannot form
induction heads; attention with frozen Q/K can).

Probe inputs are sequences ``r r``: m distinct tokens drawn at random without
replacement, then the same m tokens again (T = 2m). Distinct tokens make the
target positions unambiguous: in the second copy, the previous occurrence of the
token at position i is exactly i - m.

Scores are read from each head's attention pattern A (B, H, T, T), taken through
the model's one pattern hook, so softmax and MixiT heads are scored by the same
code. Each score is the mean attention weight a query puts on one target key,
following the head-detector definitions of TransformerLens and the
prefix-matching score of Olsson et al. (2022):

    previous_token[l, h]  = mean over b, i in [1, T)   of A[b, h, i, i - 1]
    induction[l, h]       = mean over b, i in [m, T)   of A[b, h, i, i - m + 1]
    duplicate_token[l, h] = mean over b, i in [m, T)   of A[b, h, i, i - m]

For softmax heads each lies in [0, 1], 1 meaning all attention on the target.
MixiT rows also sum to 1 but may hold negative weights, so its scores may be
negative; they are still the weight the head gives the target.

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
from typing import Any

import torch
import torch.nn.functional as F

from mixit.models.hooks import capture_patterns
from mixit.models.transformer import Transformer


def repeated_sequences(tokens: Sequence[int], m: int, batch: int, seed: int = 0) -> torch.Tensor:
    """(batch, 2m) sequences ``r r`` with r = m distinct tokens from `tokens`."""
    pool = torch.as_tensor(list(tokens), dtype=torch.long)
    if m < 2 or m > len(pool):
        raise ValueError(f"need 2 <= m <= {len(pool)} distinct tokens, got m={m}")
    g = torch.Generator().manual_seed(seed)
    order = torch.argsort(torch.rand(batch, len(pool), generator=g), dim=1)[:, :m]  # (batch, m)
    r = pool[order]
    return torch.cat([r, r], dim=1)  # (batch, 2m)


def score_patterns(pattern: torch.Tensor, m: int) -> dict[str, torch.Tensor]:
    """The three scores of one layer's pattern (B, H, 2m, 2m) -> each (H,)."""
    T = pattern.shape[-1]  # pattern (B, H, 2m, 2m)
    if T != 2 * m:
        raise ValueError(f"pattern length {T} is not 2m = {2 * m}")
    i = torch.arange(T)
    second = torch.arange(m, T)
    return {
        "previous_token": pattern[:, :, i[1:], i[1:] - 1].mean(dim=(0, 2)),
        "induction": pattern[:, :, second, second - m + 1].mean(dim=(0, 2)),
        "duplicate_token": pattern[:, :, second, second - m].mean(dim=(0, 2)),
    }


@torch.no_grad()
def head_scores(
    model: Transformer, tokens: Sequence[int], m: int | None = None, batch: int = 64, seed: int = 0
) -> dict[str, Any]:
    """Per-layer, per-head scores and the in-context gap of `model` on repeated sequences.

    tokens: the token ids to draw probes from (a task's content tokens).
    m: length of each copy; default min(len(tokens), n_ctx // 2).
    Returns lists of shape [n_layers][n_heads] under "previous_token",
    "induction" and "duplicate_token", plus "icl" (loss and accuracy on each
    copy and the gap; None for a classifier, which predicts no next tokens)
    and the probe settings.
    """
    n_ctx: int = model.cfg.n_ctx
    m = min(len(tokens), n_ctx // 2) if m is None else m
    x = repeated_sequences(tokens, m, batch, seed).to(next(model.parameters()).device)
    was_training = model.training
    model.eval()
    with capture_patterns(model) as patterns:
        logits = model(x)  # (B, T, vocab)
    model.train(was_training)
    names = sorted(patterns, key=lambda n: int(n.split(".")[1]))  # blocks.<layer>.attn.hook_pattern
    per_layer = [score_patterns(patterns[n].float().cpu(), m) for n in names]
    out: dict[str, Any] = {
        key: [s[key].tolist() for s in per_layer] for key in ("previous_token", "induction", "duplicate_token")
    }
    # A classifier has no next-token predictions to score: no behavioural gap.
    out["icl"] = icl_gap(logits.float().cpu(), x.cpu(), m) if logits.dim() == 3 else None
    out["probe"] = {"m": m, "batch": batch, "seed": seed, "n_tokens": len(tokens)}
    return out


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
