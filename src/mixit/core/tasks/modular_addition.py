"""Modular addition on a fixed train/test split of all pairs
(docs/tasks.md, "modular_addition"; reference modadd / modadds_P).

Unlike the streamed tasks, the example space (p*p pairs) is small enough to
split once: the pairs are shuffled with ``default_rng([seed, 2])``, the first
floor(p*p*train_fraction) are the train part and the rest are held out, so the
model trains on exactly the pairs the reference trains on. The held-out part is
shuffled again with ``default_rng([seed, 5, test_seed])`` and split: its first
min(val_size, half of it) pairs are the validation set and the rest the test
set. ``test_seed`` therefore re-draws which held-out pairs are tested and which
validate (the two sets partition one finite held-out part, so the validation
set changes with it), and never changes the train part.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from mixit.core.config import TaskConfig, check
from mixit.core.tasks.base import TASKS, FixedSplitTask, Tables


@dataclass
class ModularAdditionConfig(TaskConfig):
    """(a + b) mod p on a fixed train/test split of all p*p pairs."""

    run_defaults: ClassVar[dict[str, Any]] = {"steps": 3000, "batch_size": 512, "lr": 1e-3}

    p: int = 599
    """The modulus; the vocabulary is 0..p-1."""
    train_fraction: float = 0.95
    """Fraction of all p*p pairs in the training part; the rest is the test set."""

    def memory_bytes(self) -> int:
        # The shuffled table of all p^2 pairs (3 int64 each) and its temporaries.
        return 6 * 8 * self.p * self.p

    def validate(self) -> None:
        check(self.p >= 2, f"p must be an integer >= 2, got {self.p}")
        check(0 < self.train_fraction < 1, f"train_fraction must be in (0, 1), got {self.train_fraction}")
        n_train = math.floor(self.p * self.p * self.train_fraction)
        check(
            1 <= n_train <= self.p * self.p - 2,
            f"train_fraction={self.train_fraction} leaves {n_train} of {self.p * self.p} pairs for training;"
            " the train part must be non-empty and at least two pairs held out (validation and test)",
        )


@TASKS.register("modular_addition")
class ModularAddition(FixedSplitTask):
    """[a, b, (a + b) mod p] with a, b in [0, p); only the sum is scored.

    docs/tasks.md, "modular_addition". ``test_size`` is ignored: the held-out
    part of the split is the validation set (min(val_size, half of it)) and the
    test set (the rest), which of its pairs go where drawn by ``test_seed``.
    """

    name = "modular_addition"
    Config = ModularAdditionConfig
    cfg: ModularAdditionConfig

    @property
    def vocab_size(self) -> int:
        return self.cfg.p

    @property
    def seq_len(self) -> int:
        return 3

    def build_tables(self) -> Tables:
        """All p*p pairs shuffled and cut: the train part, then validation and test from the rest, shuffled
        again by test_seed (module docstring)."""
        p = self.cfg.p
        n_train = math.floor(p * p * self.cfg.train_fraction)
        d = self.data_config
        order = np.random.default_rng([d.data_seed, 2]).permutation(p * p)
        a, b = np.divmod(order, p)
        table = np.stack([a, b, (a + b) % p], axis=1).astype(np.int64)  # (p*p, 3), shuffled
        held = table[n_train:]
        held = held[np.random.default_rng([d.data_seed, 5, d.test_seed]).permutation(len(held))]
        _, val_size = d.sizes
        n_val = min(val_size, len(held) // 2)
        return Tables(train=table[:n_train], val=held[:n_val], test=held[n_val:])
