"""k-hop induction heads (docs/tasks.md, "induction"; Sanford, Hsu &
Telgarsky 2024; the paper's "5-layer, 16-hop" row of Table 1). Not in the
public reference code.

On a sequence x_1..x_N (1-based here, as in the definition):

    find(i)   = the largest j <= i with x_{j-1} = x_i, or 0 (none)
    hop_k(x)_i = x_{find^k(i)}, or NONE where some application of find is 0

find(i) is the position right after the most recent earlier occurrence of x_i
(j = i is allowed: x_{i-1} = x_i gives find(i) = i). k = 1 is the classic
induction head: predict the token that followed the previous occurrence of the
current token. For instance, with k = 1::

    x       0 1 2 0 1 3 3 2 0
    hop_1   - - - 1 2 - 3 0 1      (- = NONE)

This is not next-token prediction: the model reads x (N tokens) and at every
position i outputs hop_k(x)_i. An example is stored as one row
``[x, hop_k(x)]`` of length 2N, so the shared test-set exclusion (row hashes)
works unchanged, and `to_batch` splits it into inputs x and targets hop_k(x).

Distribution: x_i i.i.d. uniform over the alphabet 0..alphabet-1; NONE =
alphabet is only ever a target. Every position is scored, NONE being a
legitimate answer; `score` also reports the accuracy on the positions that
have an answer and the fraction that do not. Measured fraction of positions
with an answer (alphabet=16, length=64, 100k sequences): 0.754 for k=1
(its expectation is 1 - (1 - (15/16)^64) / 4 = 0.754), 0.541 for k=2, 0.231 for k=4,
0.062 for k=16. A smaller alphabet raises it: alphabet=4 gives 0.94, 0.89,
0.80, 0.30.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch

from mixit.core.config import TaskConfig, check
from mixit.core.tasks.base import IGNORE, TASKS, Batch, Examples, ParamCounts, SequenceTask


def find_positions(x: np.ndarray) -> np.ndarray:
    """find for every position of every row, 0-based: (n, N) -> (n, N) int64,
    -1 where there is none.

    In 0-based indices find(p) = q + 1, q the previous position holding the
    token x[p] (q < p). A stable sort by token lists each token's positions in
    increasing order, so each entry's previous occurrence is its left
    neighbour in the sorted row when both hold the same token.
    """
    n, length = x.shape
    order = np.argsort(x, axis=1, kind="stable")  # (n, N) positions grouped by token
    tokens = np.take_along_axis(x, order, axis=1)  # (n, N) sorted tokens
    same = tokens[:, 1:] == tokens[:, :-1]  # (n, N-1)
    found = np.full((n, length), -1, dtype=np.int64)
    rows = np.arange(n)[:, None]
    found[rows, order[:, 1:]] = np.where(same, order[:, :-1] + 1, -1)
    return found


def hop_labels(x: np.ndarray, k: int, none: int) -> np.ndarray:
    """hop_k(x) for every row: (n, N) -> (n, N) int64, `none` where undefined."""
    found = find_positions(x)  # (n, N)
    at = np.broadcast_to(np.arange(x.shape[1]), x.shape).copy()  # (n, N) find^0 = identity
    for _ in range(k):
        # -1 stays -1: once a hop has no answer, neither has any later one.
        at = np.where(at >= 0, np.take_along_axis(found, np.maximum(at, 0), axis=1), -1)
    return np.where(at >= 0, np.take_along_axis(x, np.maximum(at, 0), axis=1), none)


@dataclass
class InductionConfig(TaskConfig):
    """At every position, output the token reached by k induction hops (find^k) back."""

    run_defaults: ClassVar[dict[str, Any]] = {"steps": 1000, "batch_size": 64, "lr": 1e-3}

    k: int = 1
    """Induction hops; 1 is the classic induction head."""
    alphabet: int = 16
    """Input tokens are 0..alphabet-1; the answer NONE is the token alphabet."""
    length: int = 64
    """Tokens per input sequence."""

    def validate(self) -> None:
        check(self.k >= 1, f"k must be an integer >= 1, got {self.k}")
        check(self.alphabet >= 2, f"alphabet must be an integer >= 2, got {self.alphabet}")
        check(self.length >= 2, f"length must be an integer >= 2, got {self.length}")


@TASKS.register("induction")
class Induction(SequenceTask):
    """At every position, the token k induction hops back (hop_k(x)_i).

    docs/tasks.md, "induction". Rows are ``[x, hop_k(x)]``; the model reads x
    and every one of its positions is scored. `score` adds answered_acc
    (accuracy where the answer is not NONE) and none_fraction.
    """

    name = "induction"
    report_columns = (("answered acc", "answered_acc", 100),)
    Config = InductionConfig
    cfg: InductionConfig

    @property
    def none(self) -> int:
        """The answer where find^k is undefined, NONE: the token `alphabet`, never an input."""
        return self.cfg.alphabet

    @property
    def vocab_size(self) -> int:
        return self.cfg.alphabet + 1

    @property
    def seq_len(self) -> int:
        return 2 * self.cfg.length  # [x, hop_k(x)]

    @property
    def input_len(self) -> int:
        return self.cfg.length

    @property
    def reference_len(self) -> int:
        """Not in the reference code: the input length."""
        return self.cfg.length

    def token_names(self) -> list[str]:
        """The alphabet's tokens as their ids, and 'NONE' (an answer only)."""
        return [str(i) for i in range(self.cfg.alphabet)] + ["NONE"]

    def analysis_tokens(self) -> range:
        """NONE is never an input token."""
        return range(self.cfg.alphabet)

    def sample(self, rng: np.random.Generator, n: int) -> Examples:
        x = rng.integers(0, self.cfg.alphabet, size=(n, self.cfg.length), dtype=np.int64)  # (n, N)
        seq = np.concatenate([x, hop_labels(x, self.cfg.k, self.none)], axis=1)  # (n, 2N)
        mask = np.zeros((n, self.seq_len), dtype=bool)
        mask[:, : self.cfg.length] = True  # every position of x is scored
        return seq, mask

    def to_batch(self, seq: np.ndarray, mask: np.ndarray) -> Batch:
        """inputs x = seq[:, :N], targets hop_k(x) = seq[:, N:] where scored."""
        seq_t = torch.from_numpy(np.ascontiguousarray(seq, dtype=np.int64))
        mask_t = torch.from_numpy(np.ascontiguousarray(mask, dtype=bool))
        n = self.cfg.length
        labels = seq_t[:, n:]  # (B, N)
        targets = torch.where(mask_t[:, :n], labels, torch.full_like(labels, IGNORE))
        return Batch(inputs=seq_t[:, :n].contiguous(), targets=targets.contiguous())

    def score(self, preds: torch.Tensor, batch: Batch, counts: ParamCounts | None = None) -> dict[str, float]:
        """token_acc over every position, plus answered_acc: accuracy over the
        positions whose answer is not NONE, and none_fraction: the fraction of
        scored positions whose answer is NONE (the token_acc of always
        answering NONE)."""
        out = super().score(preds, batch, counts)
        mask = batch.mask
        answered = mask & (batch.targets != self.none)
        n_scored, n_answered = int(mask.sum()), int(answered.sum())
        right = int(((preds == batch.targets) & answered).sum())
        out["answered_acc"] = right / max(n_answered, 1)
        out["none_fraction"] = (n_scored - n_answered) / max(n_scored, 1)
        return out
