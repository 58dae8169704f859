"""Memorizing a random lookup table (docs/tasks.md, "memorization"; reference
hdmemorize_512_2_1.0), the task behind the paper's capacity-in-bits
measurements (Table 4).

Every pair (x, y) in [0, n)^2 gets an independent uniform label z in [0, n),
drawn from ``default_rng([seed, 2])`` for the whole table, so a pair's label
does not depend on ``fraction``; the kept subset comes from
``default_rng([seed, 3])``. Memorization has nothing held out: what is
measured is recall of the table itself, so the test set is the whole table
and the validation set a fixed random ``val_size`` of its rows (from
``default_rng([seed, 4])``), which selection and stopping read at a fraction
of the cost.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch

from mixit.core.config import TaskConfig, check
from mixit.core.tasks.base import TASKS, Batch, FixedSplitTask, ParamCounts, Tables, bits_metrics


@dataclass
class MemorizationConfig(TaskConfig):
    """Recall a random label in [0, n) for every pair (x, y) in [0, n)^2."""

    run_defaults: ClassVar[dict[str, Any]] = {"steps": 3000, "batch_size": 512, "lr": 1e-3}

    n: int = 512
    """Keys and labels range over 0..n-1; the table has n*n pairs."""
    fraction: float = 1.0
    """Fraction of the n*n pairs kept in the table."""

    def memory_bytes(self) -> int:
        # The table (n^2 rows of 3 int64) and the temporaries it is built from.
        return 6 * 8 * self.n * self.n

    def validate(self) -> None:
        check(self.n >= 2, f"n must be an integer >= 2, got {self.n}")
        check(0 < self.fraction <= 1, f"fraction must be in (0, 1], got {self.fraction}")


@TASKS.register("memorization")
class Memorization(FixedSplitTask):
    """[x, n + y, z]: recall the random label z of the pair (x, y).

    docs/tasks.md, "memorization". There is no held-out set: the test set is
    the whole (kept) table, whatever ``test_size`` or ``test_seed`` say, the
    validation set a fixed random ``val_size`` of its rows, and training
    batches are drawn uniformly with replacement from the same table.
    """

    name = "memorization"
    report_columns = (("bits/param", "bits_per_trainable_param", 1), ("bits", "bits", 1))
    Config = MemorizationConfig
    cfg: MemorizationConfig

    @property
    def vocab_size(self) -> int:
        return 2 * self.cfg.n

    @property
    def seq_len(self) -> int:
        return 3

    def token_names(self) -> list[str]:
        """The first key x (and the label) as its id; the second key y, token n + y, as 'y<y>'."""
        return [str(i) for i in range(self.cfg.n)] + [f"y{j}" for j in range(self.cfg.n)]

    def build_tables(self) -> Tables:
        """The kept part of the labelled n*n table, for training and test alike, and a fixed part of it."""
        n, seed = self.cfg.n, self.data_config.data_seed
        x, y = np.divmod(np.arange(n * n), n)
        z = np.random.default_rng([seed, 2]).integers(0, n, size=n * n)
        table = np.stack([x, n + y, z], axis=1).astype(np.int64)  # (n*n, 3), ordered by (x, y)
        if self.cfg.fraction < 1:
            n_keep = max(1, math.floor(n * n * self.cfg.fraction))
            keep = np.sort(np.random.default_rng([seed, 3]).permutation(n * n)[:n_keep])
            table = table[keep]
        _, val_size = self.data_config.sizes
        rows = np.random.default_rng([seed, 4]).permutation(len(table))[:val_size]
        # No held-out part: the model is trained and scored on the whole table.
        return Tables(train=table, val=table[np.sort(rows)], test=table)

    def score(self, preds: torch.Tensor, batch: Batch, counts: ParamCounts | None = None) -> dict[str, float]:
        """token_acc plus capacity: bits = correct * log2(n), and bits per parameter.

        Each row has one scored position, so correct = token_acc * rows and the bits are linear in
        token_acc: their standard errors (``bits_se``, ``bits_per_trainable_param_se``, ...) are
        ``token_acc_se`` scaled alike. The test set is the whole table, the population itself, so these
        errors say how much the number would move on another table of the same size, not on this one."""
        out = super().score(preds, batch, counts)
        mask = batch.mask
        correct = int(((preds == batch.targets) & mask).any(dim=1).sum())
        out.update(bits_metrics(correct, self.cfg.n, counts, correct_se=out["token_acc_se"] * len(batch)))
        return out
