"""Parenthesis balancing, Dyck-1 (docs/tasks.md, "dyck"; reference
dyckstream_K).

An example is a string of '(' and ')', then '?', then the label: ')' if the
string is balanced, '(' if not. For instance ``( ) ( ? )`` is tokens
1 2 1 3 1 (unbalanced), padded with 0 to 2*max_pairs + 3.

A third of the strings are uniformly random (almost never balanced); the rest
start balanced, and half of those get a mutation code m in {0, 1, 2, 3}
(bit 1: swaps, bit 2: flips), so that the unbalanced examples include near
misses of even length.

Where the task's description is silent the public reference code (task_dyckstream.py of
Zhong & Andreas) decides: the random strings get a mutation code too, and a
swap whose two positions are not in increasing order is skipped. The result is
about 52% balanced examples (the reference's own rate), not the "about 30%"
one might expect from the description, so the majority baseline is about 52%.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch

from mixit.core.config import TaskConfig, check
from mixit.core.tasks.base import TASKS, Batch, Examples, ParamCounts, SequenceTask, per_example, ratio_se

PAD = 0
OPEN = 1
CLOSE = 2
QUERY = 3
_PENDING_CLOSE = -1  # work-stack entry of `_balanced_string`: emit ')'


def _balanced_string(n_pairs: int, uniforms: list[float]) -> list[int]:
    """A random balanced string of n_pairs pairs, built as docs/tasks.md describes:
    with probability 1/2 wrap a string of t-1 pairs in parentheses, else
    concatenate strings of u and t-u pairs, u uniform in [1, t-1].

    The recursion runs on an explicit stack (no recursion limit). `uniforms`
    supplies the random draws: one per node of two or more pairs for the
    wrap/concatenate choice and one more for u, at most 4 * n_pairs in all.
    """
    out: list[int] = []
    todo = [n_pairs]
    used = 0
    while todo:
        t = todo.pop()
        if t == _PENDING_CLOSE:
            out.append(CLOSE)
            continue
        wrap = True  # one pair can only be wrapped: "()"
        if t >= 2:
            wrap = uniforms[used] < 0.5
            used += 1
        if wrap:
            out.append(OPEN)
            todo.append(_PENDING_CLOSE)
            if t > 1:
                todo.append(t - 1)
        else:
            left = 1 + int(uniforms[used] * (t - 1))
            used += 1
            todo.append(t - left)  # popped second: the right part
            todo.append(left)
    return out


def is_balanced(parens: np.ndarray) -> np.ndarray:
    """(N, T) rows of 1 '(' / 2 ')' / 0 pad -> (N,) bool: every prefix has at
    least as many '(' as ')' and the counts end equal (pads are ignored)."""
    steps = np.where(parens == OPEN, 1, np.where(parens == CLOSE, -1, 0))
    depth = np.cumsum(steps, axis=1)  # (N, T)
    return (depth.min(axis=1) >= 0) & (depth[:, -1] == 0)


@dataclass
class DyckConfig(TaskConfig):
    """Say whether a string of up to 2*max_pairs parentheses is balanced."""

    run_defaults: ClassVar[dict[str, Any]] = {"steps": 1000, "batch_size": 128, "lr": 3e-3}

    max_pairs: int = 30
    """Longest string: 2 * max_pairs parentheses."""

    def validate(self) -> None:
        check(self.max_pairs >= 1, f"max_pairs must be an integer >= 1, got {self.max_pairs}")


@TASKS.register("dyck")
class Dyck(SequenceTask):
    """Is a string of parentheses balanced? The answer token follows '?'.

    docs/tasks.md, "dyck". Only the label is scored (the prediction made at
    '?'). `score` also reports the majority-class baseline of the batch (the
    accuracy of always giving the more frequent label) beside the accuracy.
    """

    name = "dyck"
    report_columns = (("distinct strings", "distinct_token_acc", 100), ("majority", "majority_baseline", 100))
    Config = DyckConfig
    cfg: DyckConfig

    @property
    def vocab_size(self) -> int:
        return 4

    @property
    def seq_len(self) -> int:
        return 2 * self.cfg.max_pairs + 3

    def token_names(self) -> list[str]:
        """'PAD', '(', ')', '?'."""
        names = ["", "", "", ""]
        names[PAD], names[OPEN], names[CLOSE], names[QUERY] = "PAD", "(", ")", "?"
        return names

    def sample(self, rng: np.random.Generator, n: int) -> Examples:
        max_len = 2 * self.cfg.max_pairs
        cols = np.arange(max_len)[None, :]  # (1, max_len)
        rows = np.arange(n)

        # Every random draw is made for the whole batch up front; each row uses
        # the ones its branch needs.
        is_random = rng.random(n) < 1 / 3
        random_len = rng.integers(1, max_len + 1, size=n)
        random_tokens = rng.integers(OPEN, CLOSE + 1, size=(n, max_len))
        n_pairs = rng.integers(1, self.cfg.max_pairs + 1, size=n)
        tree_uniforms = rng.random((n, 4 * self.cfg.max_pairs)).tolist()
        # As in the reference code, the random strings are mutated too (which
        # leaves them uniformly random) and half of the balanced ones are not.
        kept = ~is_random & (rng.random(n) < 0.5)
        code = np.where(kept, 0, rng.integers(0, 4, size=n))  # bit 1: swaps, bit 2: flips
        n_swaps = np.where(code & 1, rng.geometric(0.5, size=n), 0)
        n_flips = np.where(code & 2, rng.geometric(0.5, size=n) * np.where(rng.random(n) < 2 / 3, 2, 1), 0)
        swap_uniforms = rng.random((n, int(n_swaps.max(initial=0)), 2))
        flip_uniforms = rng.random((n, int(n_flips.max(initial=0))))

        lengths = np.where(is_random, random_len, 2 * n_pairs)  # (n,)
        parens = np.where(is_random[:, None] & (cols < random_len[:, None]), random_tokens, PAD)  # (n, max_len)
        for i in np.flatnonzero(~is_random):
            parens[i, : lengths[i]] = _balanced_string(int(n_pairs[i]), tree_uniforms[i])

        # Swaps in order (they do not commute), then flips (they do). A swap
        # draws positions p and q and, as in the reference, does nothing unless
        # p < q.
        for j in range(swap_uniforms.shape[1]):
            r = np.flatnonzero(n_swaps > j)
            p = (swap_uniforms[r, j, 0] * lengths[r]).astype(np.int64)
            q = (swap_uniforms[r, j, 1] * lengths[r]).astype(np.int64)
            r, p, q = r[p < q], p[p < q], q[p < q]
            parens[r, p], parens[r, q] = parens[r, q], parens[r, p]
        flip_count = np.zeros((n, max_len), dtype=np.int64)
        for j in range(flip_uniforms.shape[1]):
            r = np.flatnonzero(n_flips > j)
            p = (flip_uniforms[r, j] * lengths[r]).astype(np.int64)
            flip_count[r, p] += 1
        parens = np.where(flip_count % 2 == 1, OPEN + CLOSE - parens, parens)

        label = np.where(is_balanced(parens), CLOSE, OPEN)
        seq = np.full((n, self.seq_len), PAD, dtype=np.int64)
        seq[:, :max_len] = parens
        seq[rows, lengths] = QUERY
        seq[rows, lengths + 1] = label
        mask = np.zeros((n, self.seq_len), dtype=bool)
        mask[rows, lengths] = True
        return seq, mask

    def score(self, preds: torch.Tensor, batch: Batch, counts: ParamCounts | None = None) -> dict[str, float]:
        """token_acc, plus majority_baseline: the accuracy of always answering
        the batch's most frequent label, and distinct_token_acc (`distinct_token_acc`)."""
        out = super().score(preds, batch, counts)
        labels = batch.targets[batch.mask]
        out["majority_baseline"] = torch.bincount(labels).max().item() / len(labels) if len(labels) else 0.0
        out.update(distinct_token_acc(preds, batch))
        return out


def distinct_token_acc(preds: torch.Tensor, batch: Batch) -> dict[str, float]:
    """Token accuracy with every distinct string counted once: the mean over the batch's distinct input
    rows of each one's token accuracy (averaged over its copies, which a model answers alike), and its
    standard error over the distinct strings.

    The generator draws short strings over and over ("()" is about one example in twenty), so the
    per-example ``token_acc`` weighs a few strings heavily; this is the accuracy on the variety of strings.
    """
    _, string = torch.unique(batch.inputs, dim=0, return_inverse=True)  # (N,) each row's distinct string
    n_strings = int(string.max()) + 1 if len(string) else 0
    acc = per_example((preds == batch.targets) & batch.mask) / per_example(batch.mask).clamp(min=1)  # (N,)
    copies = torch.bincount(string, minlength=n_strings).double()
    per_string = torch.zeros(n_strings, dtype=torch.float64).index_add_(0, string, acc) / copies  # (n_strings,)
    return {
        "distinct_token_acc": per_string.mean().item() if n_strings else 0.0,
        "distinct_token_acc_se": ratio_se(per_string, torch.ones_like(per_string)),
    }
