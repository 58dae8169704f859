"""Modular addition on a fixed train/test split of all pairs
(../shared/spec/TASKS.md, "modular_addition"; reference modadd / modadds_P).

Unlike the streamed tasks, the example space (p*p pairs) is small enough to
split once: the pairs are shuffled with ``default_rng([seed, 2])``, the first
floor(p*p*train_fraction) are the train part and the rest the test part.
"""

from __future__ import annotations

import math

import numpy as np

from mixit.errors import UsageError
from mixit.tasks.base import FixedSplitTask


class ModularAddition(FixedSplitTask):
    """[a, b, (a + b) mod p] with a, b in [0, p); only the sum is scored.

    TASKS.md, "modular_addition". ``test_size`` is ignored: the test set is the
    whole test part of the split.
    """

    name = "modular_addition"
    description = "(a + b) mod p on a fixed train/test split of all p*p pairs"
    default_train = {"steps": 3000, "batch_size": 512, "lr": 1e-3}

    def __init__(self, p: int = 599, train_fraction: float = 0.95, seed: int = 0, test_size: int = 4000):
        super().__init__(seed=seed, test_size=test_size)
        if p < 2:
            raise UsageError(f"p must be an integer >= 2, got {p}")
        if not 0 < train_fraction < 1:
            raise UsageError(f"train_fraction must be in (0, 1), got {train_fraction}")
        n_train = math.floor(p * p * train_fraction)
        if not 1 <= n_train < p * p:
            raise UsageError(
                f"train_fraction={train_fraction} leaves {n_train} of {p * p} pairs for training;"
                " both the train and the test part must be non-empty"
            )
        self.p = p
        self.train_fraction = train_fraction
        self.vocab_size = p
        self.seq_len = 3

        order = np.random.default_rng([seed, 2]).permutation(p * p)
        a, b = np.divmod(order, p)
        table = np.stack([a, b, (a + b) % p], axis=1).astype(np.int64)  # (p*p, 3), shuffled
        self.train_table = table[:n_train]
        self.test_table = table[n_train:]

    def params(self) -> dict[str, object]:
        return {"p": self.p, "train_fraction": self.train_fraction}
