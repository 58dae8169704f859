"""Decimal addition with reversed digits (docs/tasks.md, "addition"; the
reference code calls it additionstream_N).

An example for n_digits=3, 123 + 989 = 1112, reads (digits least-significant
first, output digits shifted by 20)::

    3 2 1 + 9 8 9 = 2 1 1 1 stop        ->  3 2 1 10 9 8 9 11 22 21 21 21 30

padded with 12 to 3*n_digits + 4 tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from mixit.core.config import TaskConfig, check
from mixit.core.tasks.base import TASKS, Examples, SequenceTask

PLUS = 10
EQUALS = 11
PAD = 12
OUT_DIGIT = 20  # output digit d is token 20 + d
STOP = 30
VOCAB = 31


@dataclass
class AdditionConfig(TaskConfig):
    """Decimal addition of two n_digits numbers, digits least-significant first."""

    run_defaults: ClassVar[dict[str, Any]] = {"steps": 1000, "batch_size": 128, "lr": 3e-3}

    n_digits: int = 10
    """Digits of each operand, 1 to 18."""
    reference_mask: bool = False
    """Score the positions the reference code scores (never the first answer
    digit; the pad after stop instead), to compare with its results."""

    def validate(self) -> None:
        check(1 <= self.n_digits <= 18, f"n_digits must be an integer in [1, 18], got {self.n_digits}")


@TASKS.register("addition")
class Addition(SequenceTask):
    """a + b for two n_digits-digit integers, answer digits least-significant first.

    docs/tasks.md, "addition". Scored positions are the predictions of every
    answer digit and of the stop token, i.e. the positions of '=' and of each
    answer digit. ``reference_mask=True`` reproduces the reference code's mask
    (the positions whose current token is an output digit or stop), which
    never scores the first answer digit and scores the pad after stop instead;
    use it only to compare with results of that code.
    """

    name = "addition"
    report_columns = (("exact match", "exact_match", 100),)
    Config = AdditionConfig
    cfg: AdditionConfig
    exact_match = True

    @property
    def vocab_size(self) -> int:
        return VOCAB

    @property
    def seq_len(self) -> int:
        return 3 * self.cfg.n_digits + 4

    def token_names(self) -> list[str]:
        """Input digits '0'-'9', '+', '=', 'PAD', answer digits primed ("0'"-"9'"), 'stop'; the unused ids
        13-19 as numbers."""
        names = [str(i) for i in range(VOCAB)]
        names[PLUS], names[EQUALS], names[PAD], names[STOP] = "+", "=", "PAD", "stop"
        names[OUT_DIGIT : OUT_DIGIT + 10] = [f"{d}'" for d in range(10)]
        return names

    def sample(self, rng: np.random.Generator, n: int) -> Examples:
        d = self.cfg.n_digits
        # Operand digits, least-significant first; the most significant digit is
        # non-zero so both operands have exactly d digits.
        digits = rng.integers(0, 10, size=(n, 2, d))  # (n, 2, d)
        digits[:, :, d - 1] = rng.integers(1, 10, size=(n, 2))
        return self.encode(digits[:, 0], digits[:, 1])

    def encode(self, a: np.ndarray, b: np.ndarray) -> Examples:
        """Examples (seq (n, L), mask (n, L)) of the sums a + b, given the
        operands' digits (n, n_digits), least-significant first."""
        d = self.cfg.n_digits
        n = a.shape[0]
        # Schoolbook addition column by column: exact for any n_digits, where
        # forming the integers could overflow int64.
        total = np.empty((n, d), dtype=np.int64)
        carry = np.zeros(n, dtype=np.int64)
        for i in range(d):
            column = a[:, i] + b[:, i] + carry
            total[:, i] = column % 10
            carry = column // 10
        has_carry = carry == 1  # the sum has d+1 digits; its last digit is the carry, 1

        seq = np.full((n, self.seq_len), PAD, dtype=np.int64)
        seq[:, :d] = a
        seq[:, d] = PLUS
        seq[:, d + 1 : 2 * d + 1] = b
        seq[:, 2 * d + 1] = EQUALS
        seq[:, 2 * d + 2 : 3 * d + 2] = OUT_DIGIT + total
        seq[:, 3 * d + 2] = np.where(has_carry, OUT_DIGIT + 1, STOP)
        seq[:, 3 * d + 3] = np.where(has_carry, STOP, PAD)

        mask = np.zeros((n, self.seq_len), dtype=bool)
        if self.cfg.reference_mask:
            mask[:, :-1] = seq[:, :-1] >= OUT_DIGIT
        else:
            # '=' and the d always-present answer digits predict the next answer
            # token; the (d+1)-th digit, when there is one, predicts stop.
            mask[:, 2 * d + 1 : 3 * d + 2] = True
            mask[:, 3 * d + 2] = has_carry
        return seq, mask
