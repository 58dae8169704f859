"""The k-hop induction task (docs/tasks.md, "induction"): hand-worked
labels, agreement with a loop-per-position reference written straight from the
definition, the [x, labels] row layout and its batch, determinism, disjoint
splits, validation and scoring."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from mixit.core.tasks import IGNORE, TASKS, make_task, task_parameters
from mixit.core.tasks.induction import Induction, hop_labels
from mixit.errors import UsageError

# Worked by hand, 1-based positions i as in the definition
#   find(i) = largest j <= i with x_{j-1} = x_i, or 0;  hop_k(x)_i = x_{find^k(i)}.
#
#   i          1 2 3 4 5 6 7 8 9
#   x_i        0 1 2 0 1 3 3 2 0
#   find(i)    0 0 0 2 3 0 7 4 5     e.g. i=8: x_8=2 last seen at 3, so j=4
#   hop_1      - - - 1 2 - 3 0 1     x_{find(i)}
#   find^2(i)  0 0 0 0 0 0 7 2 3     find(2) = find(3) = 0, find(7) = 7
#   hop_2      - - - - - - 3 1 2
#
# i=7 is the x_{i-1} = x_i case: find(7) = 7, a fixed point, so hop_k = 3 for all k.
HAND_X = [0, 1, 2, 0, 1, 3, 3, 2, 0]
N = 4  # NONE for alphabet 4
HAND_HOP = {
    1: [N, N, N, 1, 2, N, 3, 0, 1],
    2: [N, N, N, N, N, N, 3, 1, 2],
}


def reference_hop(x: list[int], k: int, none: int) -> list[int]:
    """hop_k(x) from the definition, one position at a time (1-based, 0 = none)."""

    def find(i: int) -> int:
        for j in range(i, 1, -1):
            if x[j - 2] == x[i - 1]:  # x_{j-1} = x_i
                return j
        return 0

    out = []
    for i in range(1, len(x) + 1):
        j = i
        for _ in range(k):
            j = find(j) if j else 0
        out.append(x[j - 1] if j else none)
    return out


def rows(seq: np.ndarray) -> set[tuple[int, ...]]:
    return set(map(tuple, seq.tolist()))


@pytest.mark.parametrize("k", [1, 2])
def test_hand_example(k):
    labels = hop_labels(np.array([HAND_X]), k, none=N)
    assert labels.tolist() == [HAND_HOP[k]]
    assert reference_hop(HAND_X, k, none=N) == HAND_HOP[k]


def test_repeated_token_is_its_own_answer_at_every_k():
    # x_{i-1} = x_i: find(i) = i, so hop_k(x)_i = x_i for every k.
    x = np.array([[2, 2, 1, 1, 1]])
    for k in (1, 2, 5):
        assert hop_labels(x, k, none=3).tolist() == [[3, 2, 3, 1, 1]]


@pytest.mark.parametrize("k", [1, 2, 3, 4])
@pytest.mark.parametrize("alphabet", [2, 3, 8])
def test_vectorised_labels_match_the_reference(k, alphabet):
    x = np.random.default_rng([k, alphabet]).integers(0, alphabet, size=(200, 17))
    expected = [reference_hop(row, k, none=alphabet) for row in x.tolist()]
    assert hop_labels(x, k, none=alphabet).tolist() == expected


def test_sample_layout_shapes_and_vocabulary():
    task = make_task("induction", {"k": 2, "alphabet": 5, "length": 12})
    assert (task.vocab_size, task.seq_len, task.input_len) == (6, 24, 12)
    seq, mask = task.sample(np.random.default_rng(0), 300)
    assert seq.dtype == np.int64 and mask.dtype == bool
    assert seq.shape == mask.shape == (300, 24)
    x, labels = seq[:, :12], seq[:, 12:]
    assert 0 <= x.min() and x.max() < 5  # NONE is never an input
    assert 0 <= labels.min() and labels.max() <= 5
    assert (labels == 5).any() and (labels < 5).any()
    assert mask[:, :12].all() and not mask[:, 12:].any()  # every position scored, once
    assert labels.tolist() == [reference_hop(row, 2, none=5) for row in x.tolist()]


def test_to_batch_reads_x_and_targets_the_labels():
    task = make_task("induction", {"alphabet": 4, "length": 9})
    seq = np.array([HAND_X + HAND_HOP[1]])
    mask = np.zeros_like(seq, dtype=bool)
    mask[:, :9] = True
    batch = task.to_batch(seq, mask)
    assert batch.inputs.dtype == batch.targets.dtype == torch.int64
    assert batch.inputs.is_contiguous() and batch.targets.is_contiguous()
    assert batch.inputs.tolist() == [HAND_X]
    assert batch.targets.tolist() == [HAND_HOP[1]]
    mask[0, 3] = False  # an unscored position is IGNORE
    assert task.to_batch(seq, mask).targets[0, 3] == IGNORE
    full = task.train_batch(0, 16)
    assert full.inputs.shape == full.targets.shape == (16, 9)
    assert full.mask.all()


def test_same_seed_same_examples_and_step_changes_batch():
    a, b = make_task("induction", {"length": 10}, test_size=50), make_task("induction", {"length": 10}, test_size=50)
    for x, y in zip(a.test_examples(), b.test_examples()):
        np.testing.assert_array_equal(x, y)
    np.testing.assert_array_equal(a.train_examples(3, 64)[0], b.train_examples(3, 64)[0])
    assert not np.array_equal(a.train_examples(3, 64)[0], a.train_examples(4, 64)[0])
    other_seed = make_task("induction", {"length": 10}, seed=1)
    assert not np.array_equal(a.train_examples(3, 64)[0], other_seed.train_examples(3, 64)[0])


def test_train_batches_never_contain_a_test_row():
    task = make_task("induction", {"alphabet": 2, "length": 6}, test_size=20)  # 2^6 = 64 possible sequences
    test = rows(task.test_examples()[0])
    assert rows(task.sample(np.random.default_rng(5), 200)[0]) & test  # collisions without rejection
    for step in range(10):
        assert not rows(task.train_examples(step, 100)[0]) & test


def test_perfect_predictions_score_one():
    task = make_task("induction", {"alphabet": 4, "length": 16}, test_size=100)
    batch = task.test_batch()
    metrics = task.score(batch.targets.clone(), batch)
    assert metrics["token_acc"] == metrics["answered_acc"] == 1.0
    assert metrics["none_fraction"] == pytest.approx((batch.targets == 4).float().mean().item())
    assert "exact_match" not in metrics


def test_wrong_answer_on_a_none_position_costs_token_acc_only():
    task = make_task("induction", {"alphabet": 4, "length": 9})
    seq = np.array([HAND_X + HAND_HOP[1]])
    mask = np.zeros_like(seq, dtype=bool)
    mask[:, :9] = True
    batch = task.to_batch(seq, mask)  # targets - - - 1 2 - 3 0 1: 4 NONE, 5 answered
    preds = batch.targets.clone()
    preds[0, 0] = 1  # NONE expected
    metrics = task.score(preds, batch)
    assert math.isnan(metrics.pop("token_acc_se"))  # one example: no standard error
    assert metrics == {"token_acc": pytest.approx(8 / 9), "answered_acc": 1.0, "none_fraction": pytest.approx(4 / 9)}
    preds[0, 3] = 0  # 1 expected
    metrics = task.score(preds, batch)
    assert metrics["token_acc"] == pytest.approx(7 / 9)
    assert metrics["answered_acc"] == pytest.approx(4 / 5)


@pytest.mark.parametrize(
    "params, message",
    [
        ({"k": 0}, "k must be an integer >= 1, got 0"),
        ({"alphabet": 1}, "alphabet must be an integer >= 2, got 1"),
        ({"length": 1}, "length must be an integer >= 2, got 1"),
        ({"k": "two"}, "k must be int, got 'two'"),
    ],
)
def test_bad_parameters_are_usage_errors(params, message):
    with pytest.raises(UsageError, match=message):
        make_task("induction", params)


def test_registry_and_parameters():
    assert TASKS["induction"] is Induction
    assert "docs/tasks.md" in Induction.__doc__
    assert Induction.description() and "\n" not in Induction.description()
    assert task_parameters("induction") == {"k": 1, "alphabet": 16, "length": 64}
    task = make_task("induction", {"k": 2})
    assert task.params() == {"k": 2, "alphabet": 16, "length": 64}
    assert (task.vocab_size, task.seq_len, task.input_len) == (17, 128, 64)
    assert task.describe() == "induction(k=2, alphabet=16, length=64)"
    assert list(task.analysis_tokens()) == list(range(16))
