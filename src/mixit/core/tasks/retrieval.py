"""Key-value retrieval, "needle in a haystack" (docs/tasks.md, "retrieval";
reference condattendstream_K).

With vocab V and max_pairs K, key j has marker token j + V/2 and query token
j + K + V/2; values are tokens in [1, V/2 - 1]; 0 is padding. An example with
k = 2 stored pairs, asking for the second key::

    marker(3) 17 marker(0) 42 query(0) 42 0 0 ...
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from mixit.core.config import TaskConfig, check
from mixit.core.tasks.base import TASKS, Examples, SequenceTask

PAD = 0


@dataclass
class RetrievalConfig(TaskConfig):
    """Recall the value stored under a queried key among up to max_pairs pairs."""

    run_defaults: ClassVar[dict[str, Any]] = {"steps": 1000, "batch_size": 128, "lr": 1e-3}

    max_pairs: int = 30
    """Most key-value pairs in one example (each example has 1 to max_pairs)."""
    vocab: int = 512
    """Vocabulary size: values take 1..vocab/2-1, markers and queries the tokens from vocab/2 up."""

    def validate(self) -> None:
        check(self.max_pairs >= 1, f"max_pairs must be an integer >= 1, got {self.max_pairs}")
        # Markers and queries take the 2*max_pairs tokens from vocab/2 up, and
        # values need at least one token in [1, vocab/2 - 1].
        min_vocab = max(4, 4 * self.max_pairs)
        check(
            self.vocab % 2 == 0 and self.vocab >= min_vocab,
            f"vocab must be an even integer >= {min_vocab} (4 * max_pairs, at least 4), got {self.vocab}",
        )


@TASKS.register("retrieval")
class Retrieval(SequenceTask):
    """Recall the value stored after the marker of the queried key.

    docs/tasks.md, "retrieval". Only the answer is scored: the prediction made
    at the query token.
    """

    name = "retrieval"
    Config = RetrievalConfig
    cfg: RetrievalConfig

    @property
    def vocab_size(self) -> int:
        return self.cfg.vocab

    @property
    def seq_len(self) -> int:
        return 2 * self.cfg.max_pairs + 3

    def token_names(self) -> list[str]:
        """'PAD'; values as their ids; key j's marker 'kj' and query 'qj'; the unused ids above as numbers."""
        names = [str(i) for i in range(self.cfg.vocab)]
        names[PAD] = "PAD"
        half, k = self.cfg.vocab // 2, self.cfg.max_pairs
        names[half : half + k] = [f"k{j}" for j in range(k)]
        names[half + k : half + 2 * k] = [f"q{j}" for j in range(k)]
        return names

    def sample(self, rng: np.random.Generator, n: int) -> Examples:
        max_pairs, half = self.cfg.max_pairs, self.cfg.vocab // 2
        k = rng.integers(1, max_pairs + 1, size=n)  # (n,) pairs per example
        # A random permutation of the keys per row; the first k are stored.
        keys = np.argsort(rng.random((n, max_pairs)), axis=1)  # (n, max_pairs)
        values = rng.integers(1, half, size=(n, max_pairs))  # (n, max_pairs)
        asked = rng.integers(0, k)  # (n,) which stored pair is queried

        stored = np.arange(max_pairs)[None, :] < k[:, None]  # (n, max_pairs)
        # marker, value, marker, value, ...
        pairs = np.stack([keys + half, values], axis=2).reshape(n, 2 * max_pairs)  # (n, 2*max_pairs)
        pairs[~np.repeat(stored, 2, axis=1)] = PAD

        rows = np.arange(n)
        seq = np.full((n, self.seq_len), PAD, dtype=np.int64)
        seq[:, : 2 * max_pairs] = pairs
        query_at = 2 * k  # (n,) position of the query token
        seq[rows, query_at] = keys[rows, asked] + max_pairs + half
        seq[rows, query_at + 1] = values[rows, asked]

        mask = np.zeros((n, self.seq_len), dtype=bool)
        mask[rows, query_at] = True
        return seq, mask
