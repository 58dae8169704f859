"""What every task shares: the registry, the example format, the fixed test
set, the seeded training stream that never repeats a test example, and scoring.

A task is registered under its CLI name in `TASKS` and declares its
parameters once, as a `TaskConfig` dataclass (``Task.Config``). It produces
whole token sequences ``seq`` (N, L) and a boolean loss mask ``mask`` (N, L):
``mask[i, t]`` says the prediction made at position t (of token t+1) is
trained and scored (docs/tasks.md, "Common rules").
The model never sees the last token, so a `Batch` holds

    inputs  = seq[:, :-1]                                   # (N, L-1)
    targets = seq[:, 1:] where mask[:, :-1] else IGNORE     # (N, L-1)

and one loss (cross-entropy with ``ignore_index=IGNORE``) serves every task.

Determinism: the held-out examples come from ``numpy.random.default_rng([seed,
0])``: one pool of test_size + val_size draws, split between the test and the
validation set by example (`split_held_out`), and training batch number
``step`` from ``default_rng([seed, 1, step])``, minus any held-out example. A
batch therefore depends only on (seed, step), never on global RNG state or on
how many batches came before, which is what makes ``--resume`` exact.

Three sets, three uses (docs/reproduction.md, "Protocol"): the model trains on
the stream, settings are chosen and training is stopped on the validation set,
and the test set gives the number that is reported.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch

from mixit.config import TaskConfig, check, short_doc
from mixit.registry import Registry

IGNORE = -100
"""Target value of a position that is neither trained nor scored."""

TASKS: Registry[type[Task]] = Registry("task")
"""CLI name -> task class. A task module registers its class with ``@TASKS.register(name)``."""


@dataclass
class Batch:
    """A batch of examples as the model and the loss see them."""

    inputs: torch.Tensor  # (N, L-1) int64 token ids
    targets: torch.Tensor  # (N, L-1) int64 next-token ids, IGNORE where not scored

    def __len__(self) -> int:
        return self.inputs.shape[0]

    def to(self, device: torch.device | str) -> Batch:
        return Batch(self.inputs.to(device, non_blocking=True), self.targets.to(device, non_blocking=True))

    def __getitem__(self, index: slice) -> Batch:
        return Batch(self.inputs[index], self.targets[index])

    @property
    def mask(self) -> torch.Tensor:
        """(N, L-1) bool: the scored positions."""
        return self.targets != IGNORE


def make_batch(seq: np.ndarray, mask: np.ndarray) -> Batch:
    """Turn whole sequences (N, L) and their loss mask (N, L) into a `Batch`."""
    seq_t = torch.from_numpy(np.ascontiguousarray(seq, dtype=np.int64))
    mask_t = torch.from_numpy(np.ascontiguousarray(mask, dtype=bool))
    targets = torch.where(mask_t[:, :-1], seq_t[:, 1:], torch.full_like(seq_t[:, 1:], IGNORE))
    return Batch(inputs=seq_t[:, :-1].contiguous(), targets=targets.contiguous())


def split_held_out(keys: np.ndarray, n_test: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Row indices (test, validation) of a pool of held-out examples with row hashes `keys`.

    The pool is split by example, not by row: the distinct examples are put in a seeded random order
    and the test set takes the first `n_test` rows, the validation set the rest less any example the
    test set holds (so it may come out a few rows short where the test set ends inside a repeated
    example). Both are then random samples of the same generator, and disjoint. Drawing the validation
    set separately and removing the test examples from it instead would leave it without the examples
    the generator draws often (Dyck's shortest strings, all of them in the test set), and so unlike it.
    """
    with np.errstate(over="ignore"):
        scrambled = (keys ^ np.uint64((seed * 0x9E3779B97F4A7C15) % 2**64)) * np.uint64(0xBF58476D1CE4E5B9)
    order = np.lexsort((np.arange(len(keys)), scrambled))  # by scrambled example, copies together
    test = np.sort(order[:n_test])
    rest = order[n_test:]
    val = np.sort(rest[~np.isin(keys[rest], keys[test])])
    return test, val


def row_hashes(seq: np.ndarray) -> np.ndarray:
    """A 64-bit hash per row (N, L) -> (N,), for test-set exclusion.

    A polynomial hash with wrap-around arithmetic; a collision can only make the
    stream reject an example it could have kept, never admit a test example.
    """
    h = np.zeros(seq.shape[0], dtype=np.uint64)
    mult = np.uint64(1_000_003)
    with np.errstate(over="ignore"):
        for col in seq.T.astype(np.uint64):
            h = h * mult + col + np.uint64(1)
    return h


@dataclass(frozen=True)
class ParamCounts:
    """Parameter counts that some metrics (bits per parameter) divide by."""

    trainable: int
    total: int


class Task:
    """Base class of the tasks.

    A subclass sets ``name``, its parameter class ``Config``, ``vocab_size``
    and ``seq_len``, and implements `sample`. Tasks with a finite example
    space that use fixed splits (modular addition, memorization) override
    `test_examples` and `train_examples` instead. ``defaults`` holds the
    task's own training (and model) defaults, by option name.
    """

    name: ClassVar[str]
    Config: ClassVar[type[TaskConfig]] = TaskConfig
    vocab_size: int
    seq_len: int  # whole sequence length L; the model reads L-1 tokens
    exact_match: ClassVar[bool] = False  # report whole-answer accuracy (multi-token answers)
    defaults: ClassVar[dict[str, Any]] = {}  # per-task option defaults (steps, lr, ...)
    selection: ClassVar[tuple[str, bool]] = ("token_acc", True)
    """The validation metric that settings are chosen and convergence is judged by, and whether higher is better."""

    def __init__(
        self, cfg: TaskConfig | None = None, seed: int = 0, test_size: int = 4000, val_size: int | None = None
    ):
        cfg = self.Config() if cfg is None else cfg
        check(isinstance(cfg, self.Config), f"task {self.name} takes {self.Config.__name__}, got {type(cfg).__name__}")
        check(test_size > 0, f"test_size must be a positive integer, got {test_size}")
        val_size = test_size if val_size is None else val_size
        check(val_size > 0, f"val_size must be a positive integer, got {val_size}")
        self.cfg = cfg
        self.seed = seed
        self.test_size = test_size
        self.val_size = val_size
        self._test: tuple[np.ndarray, np.ndarray] | None = None
        self._val: tuple[np.ndarray, np.ndarray] | None = None
        self._held_keys: np.ndarray | None = None

    @classmethod
    def description(cls) -> str:
        """One line on what the task is: the first line of its Config's docstring."""
        return short_doc(cls.Config)

    # -- to implement -------------------------------------------------------
    def sample(self, rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
        """Draw n independent examples: (seq (n, L) int64, mask (n, L) bool)."""
        raise NotImplementedError(f"{type(self).__name__} must implement sample()")

    def params(self) -> dict[str, Any]:
        """The task's own parameters."""
        return self.cfg.to_dict()

    # -- test set, validation set and training stream ---------------------------
    def test_examples(self) -> tuple[np.ndarray, np.ndarray]:
        """The fixed test set (seq, mask): test_size examples of the held-out pool (`split_held_out`)."""
        if self._test is None:
            self._test, self._val = self._held_out()
        return self._test

    def val_examples(self) -> tuple[np.ndarray, np.ndarray]:
        """The fixed validation set (seq, mask): the rest of the held-out pool, none equal to a test example."""
        if self._val is None:
            self._test, self._val = self._held_out()
        return self._val

    def _held_out(self) -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
        seq, mask = self.sample(np.random.default_rng([self.seed, 0]), self.test_size + self.val_size)
        test, val = split_held_out(row_hashes(seq), self.test_size, self.seed)
        return (seq[test], mask[test]), (seq[val], mask[val])

    def train_examples(self, step: int, n: int) -> tuple[np.ndarray, np.ndarray]:
        """Training batch number `step`: n fresh examples, none equal to a test or validation example."""
        if self._held_keys is None:
            held = np.concatenate([self.test_examples()[0], self.val_examples()[0]])
            self._held_keys = np.sort(row_hashes(held))
        rng = np.random.default_rng([self.seed, 1, step])
        seqs, masks, have, drawn = [], [], 0, 0
        while have < n:
            if drawn > 100 * n + 10_000:
                # Otherwise held-out sets covering the whole example space (e.g.
                # addition with n_digits=1: 81 pairs) loop forever.
                check(
                    False,
                    f"{self.describe()}: nearly every example drawn for the training batch is held out (test set of"
                    f" {self.test_size}, validation set of {self.val_size}); lower test_size and val_size or"
                    " enlarge the task",
                )
            drawn += n - have
            seq, mask = self.sample(rng, n - have)
            keep = ~np.isin(row_hashes(seq), self._held_keys)
            seqs.append(seq[keep])
            masks.append(mask[keep])
            have += int(keep.sum())
        return np.concatenate(seqs), np.concatenate(masks)

    @property
    def input_len(self) -> int:
        """Length of the sequences the model reads (n_ctx must be at least this)."""
        return self.seq_len - 1

    @property
    def reference_len(self) -> int:
        """The sequence length the reference code builds its model for, the default n_ctx: the
        whole example, since it feeds every token and ignores the last prediction (docs/fidelity.md)."""
        return self.seq_len

    def analysis_tokens(self) -> range:
        """Token ids that probes of the trained model (repeated random sequences)
        draw from: the whole vocabulary unless a task says otherwise."""
        return range(self.vocab_size)

    def model_defaults(self, attention: str) -> dict[str, Any]:
        """ModelConfig values this task needs unless the user sets them (a
        classifier head, padding, causality); `attention` is the run's kind."""
        return {}

    def loss_metrics(self, loss: float) -> dict[str, float]:
        """Metrics derived from the mean test loss (perplexity for language modelling)."""
        return {}

    def save_artifacts(self, run_dir: Path) -> None:
        """Write what evaluating the run later needs besides its config (a tokenizer); nothing by default."""

    def to_batch(self, seq: np.ndarray, mask: np.ndarray) -> Batch:
        """Examples as the model sees them; next-token prediction unless a task
        with per-position labels (induction) says otherwise."""
        return make_batch(seq, mask)

    def test_batch(self) -> Batch:
        return self.to_batch(*self.test_examples())

    def val_batch(self) -> Batch:
        return self.to_batch(*self.val_examples())

    def train_batch(self, step: int, batch_size: int) -> Batch:
        return self.to_batch(*self.train_examples(step, batch_size))

    # -- scoring --------------------------------------------------------------
    def score(self, preds: torch.Tensor, batch: Batch, counts: ParamCounts | None = None) -> dict[str, float]:
        """Metrics of predictions `preds` (N, L-1) (argmax of the logits) on `batch`.

        token_acc: fraction of scored positions predicted right.
        exact_match (tasks with multi-token answers): fraction of examples whose
        every scored position is right.
        """
        mask = batch.mask
        right = (preds == batch.targets) & mask
        n_scored = int(mask.sum())
        out = {"token_acc": right.sum().item() / max(n_scored, 1)}
        if self.exact_match:
            all_right = (right | ~mask).all(dim=1)
            out["exact_match"] = all_right.float().mean().item()
        return out

    def describe(self) -> str:
        args = ", ".join(f"{k}={v}" for k, v in self.params().items())
        return f"{self.name}({args})"


class FixedSplitTask(Task):
    """A task over a finite table of examples with a fixed train/test split.

    Subclasses fill ``self.train_table``, ``self.val_table`` and
    ``self.test_table`` (rows of whole sequences) in their constructor; only
    the last token of each row is scored. Training batches are drawn uniformly
    with replacement from the train table; the test and validation sets are
    the whole test and validation tables (``test_size`` does not apply; each
    task says how ``val_size`` does).
    """

    train_table: np.ndarray
    val_table: np.ndarray
    test_table: np.ndarray

    def _last_token_mask(self, n_rows: int) -> np.ndarray:
        mask = np.zeros((n_rows, self.seq_len), dtype=bool)
        mask[:, -2] = True  # the prediction of the last token
        return mask

    def test_examples(self) -> tuple[np.ndarray, np.ndarray]:
        return self.test_table, self._last_token_mask(len(self.test_table))

    def val_examples(self) -> tuple[np.ndarray, np.ndarray]:
        return self.val_table, self._last_token_mask(len(self.val_table))

    def train_examples(self, step: int, n: int) -> tuple[np.ndarray, np.ndarray]:
        rng = np.random.default_rng([self.seed, 1, step])
        rows = rng.integers(0, len(self.train_table), size=n)
        return self.train_table[rows], self._last_token_mask(n)


def bits_metrics(correct: int, n_labels: int, counts: ParamCounts | None) -> dict[str, float]:
    """Capacity in bits (correct * log2 n_labels) and per trainable / total parameter."""
    bits = correct * math.log2(n_labels)
    out = {"bits": bits}
    if counts is not None:
        out["bits_per_trainable_param"] = bits / max(counts.trainable, 1)
        out["bits_per_param"] = bits / max(counts.total, 1)
    return out
