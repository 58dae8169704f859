"""The task contract, which every task meets (cheap construction, batches, held-out sets,
determinism), and the synthetic tasks (docs/tasks.md): token ranges, right answers, exact
loss masks, disjoint splits, scoring, registry. The text tasks: tests/test_text_tasks.py."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import pytest
import torch

from mixit import run_config
from mixit.core.config import DataConfig, TaskConfig, field_docs
from mixit.core.tasks import (
    IGNORE,
    TASKS,
    Batch,
    ParamCounts,
    Task,
    check_batch,
    make_batch,
    make_task,
    task_parameters,
)
from mixit.core.tasks.base import FixedSplitTask, SequenceTask, binomial_se, check_complete, ratio_se
from mixit.core.tasks.text import TextTask
from mixit.core.text.tokenizer import train_bpe
from mixit.errors import UsageError
from text_fixtures import english_like, sentiment_rows, write_jsonl, write_text_corpus
from tolerance import assert_close

# Small parameters: every test runs in milliseconds.
SMALL = {
    "addition": {"n_digits": 4},
    "modular_addition": {"p": 23},
    "dyck": {"max_pairs": 6},
    "memorization": {"n": 16},
    "retrieval": {"max_pairs": 5, "vocab": 64},
    "induction": {"alphabet": 4, "length": 12},
}


def small(name: str, seed: int = 0, test_size: int = 300, **params):
    return make_task(name, {**SMALL[name], **params}, seed=seed, test_size=test_size)


def rows(seq: np.ndarray) -> set[tuple[int, ...]]:
    return set(map(tuple, seq.tolist()))


def perfect_preds(batch) -> torch.Tensor:
    return torch.where(batch.mask, batch.targets, torch.zeros_like(batch.targets))


# -- the contract: every task --------------------------------------------------------
EVERY_TASK = [*SMALL, "lm", "sentiment"]
DATA_BUILDERS = (
    "mixit.core.tasks.text._lm_data",
    "mixit.core.tasks.text._sentiment_data",
    "mixit.core.text.corpora._embedded",
    "mixit.core.text.corpora.load_hub",
    "mixit.core.text.corpora.load_local",
    "mixit.core.text.tokenizer.train_bpe",
)


@pytest.fixture(scope="module")
def text_params(tmp_path_factory):
    """Small parameters of the text tasks, on local data."""
    root = tmp_path_factory.mktemp("text")
    corpus = write_text_corpus(root / "corpus.txt", n_docs=120)
    reviews = write_jsonl(root / "reviews.jsonl", sentiment_rows(400))
    return {
        "lm": {"corpus": str(corpus), "length": 16, "vocab": 300, "held_out": 0.1},
        "sentiment": {"dataset": str(reviews), "vocab": 300, "length": 12},
    }


@pytest.fixture
def no_data(monkeypatch):
    """Make building any task's data an error: generators, tables, corpora, tokenizer training."""

    def refuse(*args, **kwargs):
        raise AssertionError("a task's data was built")

    for _, cls in TASKS.items():
        for method in ("sample", "build_tables", "build_held_out"):
            if hasattr(cls, method):
                monkeypatch.setattr(cls, method, refuse)
    for target in DATA_BUILDERS:
        monkeypatch.setattr(target, refuse)


@pytest.mark.parametrize("name", EVERY_TASK)
def test_constructing_a_task_and_reading_its_shape_builds_no_data(name, tmp_path, no_data):
    # The defaults: memorization's table of 262,144 rows, lm's BPE trained on the whole English corpus.
    task = make_task(name)
    assert task.vocab_size > 0 and 0 < task.input_len <= task.reference_len
    assert task.describe().startswith(f"{name}(")
    defaults = task.model_defaults("softmax"), task.model_defaults("mixing")
    # ...and so does turning a request into a complete config (experiment.resolve).
    cfg = run_config(name, "mixit")
    assert cfg.model.vocab_size == task.vocab_size and cfg.model.n_ctx == task.reference_len
    assert {k: getattr(cfg.model, k) for k in defaults[1]} == defaults[1]


@pytest.mark.parametrize("name", ["lm", "sentiment"])
def test_a_text_task_reads_only_a_tokenizer_file_it_is_given(name, tmp_path, monkeypatch):
    path = tmp_path / "tokenizer.json"
    train_bpe(english_like(20), 270).save(path)
    monkeypatch.setattr("mixit.core.tasks.text.BPE_PAD_ID", -1)  # so pad_id must come from the file
    for target in DATA_BUILDERS:
        monkeypatch.setattr(target, lambda *args, **kwargs: pytest.fail("a task's data was built"))
    task = make_task(name, {"tokenizer": str(path)})
    assert task.vocab_size == 270
    if name == "sentiment":
        assert task.model_defaults("mixing")["pad_id"] == 1


def _contract_task(name, text_params, seed=1):
    return make_task(name, SMALL.get(name) or text_params[name], seed=seed, test_size=40, val_size=30)


def _examples(task, batch) -> set:
    """The examples of `batch` as hashable rows: the inputs without their padding, and the targets."""
    pad = task.model_defaults("softmax").get("pad_id")
    out = set()
    for x, y in zip(batch.inputs.tolist(), batch.targets.tolist()):
        while pad is not None and x and x[-1] == pad:
            x.pop()
        out.add((tuple(x), tuple(y) if isinstance(y, list) else y))
    return out


def _batches(task) -> tuple[list[Batch], Batch, Batch]:
    """Four training batches of 16, the test set and the validation set."""
    return [task.train_batch(step, 16) for step in range(4)], task.test_batch(), task.val_batch()


@pytest.mark.parametrize("name", EVERY_TASK)
def test_every_task_meets_the_contract(name, text_params):
    task = _contract_task(name, text_params)
    defaults = task.model_defaults("softmax")
    classifier = defaults.get("head") == "classifier"
    n_answers = defaults["n_classes"] if classifier else task.vocab_size
    train, test, val = _batches(task)
    for batch in (*train, test, val):
        assert isinstance(batch, Batch) and batch.inputs.dtype == batch.targets.dtype == torch.int64
        assert batch.inputs.ndim == 2 and len(batch) > 0
        assert batch.targets.shape == ((len(batch),) if classifier else batch.inputs.shape)
        assert 0 <= batch.inputs.min() and batch.inputs.max() < task.vocab_size
        answers = batch.targets[batch.targets != IGNORE]
        assert len(answers) and 0 <= answers.min() and answers.max() < n_answers
    assert [len(b) for b in train] == [16] * 4
    # The shape facts are what the data says: the widest batch is input_len tokens, which n_ctx holds.
    assert max(b.inputs.shape[1] for b in (*train, test, val)) == task.input_len <= task.reference_len
    if isinstance(task, TextTask):
        assert task.vocab_size == task.tokenizer.vocab_size
    if classifier:
        assert defaults["pad_id"] == task.tokenizer.pad_id
    # Deterministic: a batch depends on (seed, step) only; the held-out sets are fixed.
    again, other_seed = _contract_task(name, text_params), _contract_task(name, text_params, seed=2)
    train_again, test_again, val_again = _batches(again)
    for a, b in zip((*train, test, val), (*train_again, test_again, val_again)):
        assert torch.equal(a.inputs, b.inputs) and torch.equal(a.targets, b.targets)
    assert not torch.equal(train[0].inputs, train[1].inputs)
    assert not torch.equal(train[0].inputs, other_seed.train_batch(0, 16).inputs)
    # Held out: test and validation sets never trained on; but memorization's, which are the table it
    # learns and a part of it (docs/tasks.md, "memorization"). The two may share examples: the generated
    # tasks draw them independently (tests of the held-out sets below).
    if name != "memorization":
        seen = set().union(*(_examples(task, b) for b in train))
        assert not seen & (_examples(task, test) | _examples(task, val))


@pytest.mark.parametrize("name", EVERY_TASK)
def test_every_built_in_task_implements_what_a_task_must(name, text_params):
    check_complete(_contract_task(name, text_params))


def test_a_task_class_lacking_a_method_it_must_implement_is_refused():
    """`check_complete`: a method is owed unless the base methods that call it are all overridden."""

    class Bare(Task):  # none of the three batch methods
        name = "bare"

    class NoSample(SequenceTask):
        name = "no_sample"

    class OwnStream(SequenceTask):  # needs no sample(): it draws its held-out sets and stream itself
        name = "own_stream"

        def build_held_out(self):
            raise AssertionError("not called")

        def train_examples(self, step, n):
            raise AssertionError("not called")

    class HalfStream(OwnStream):  # the base's train_examples again, which calls sample()
        train_examples = SequenceTask.train_examples

    class NoTables(FixedSplitTask):
        name = "no_tables"

    for cls, owed in [(Bare, "train_batch"), (NoSample, "sample"), (HalfStream, "sample"), (NoTables, "build_tables")]:
        with pytest.raises(UsageError, match=f"^task '{cls.name}' \\({cls.__name__}\\) must implement {owed}\\(\\)"):
            check_complete(cls())
    check_complete(OwnStream())


def test_a_batch_the_model_cannot_read_is_refused_naming_the_task():
    """`check_batch`, which a run applies to its first training batch before any work: the task's own batches
    pass; token ids past the vocabulary, sequences past n_ctx and targets the head cannot predict are refused."""
    cfg = run_config("addition", "standard", {"n_digits": 2})
    task = make_task("addition", {"n_digits": 2})
    good = task.train_batch(0, 8)
    check_batch(task, good, cfg.model)
    past = cfg.model.vocab_size
    bad = {
        "token ids must be in": Batch(good.inputs.clone().fill_(past), good.targets),
        "its model reads": Batch(torch.zeros(8, cfg.model.n_ctx + 1, dtype=torch.int64), good.targets),
        "scored targets must be in": Batch(good.inputs, torch.where(good.mask, past, IGNORE)),
        "a batch must hold": Batch(good.inputs[:0], good.targets[:0]),
    }
    for message, batch in bad.items():
        with pytest.raises(UsageError, match=f"^task 'addition' \\(Addition\\): {message}"):
            check_batch(task, batch, cfg.model)
    with pytest.raises(UsageError, match="sequences and loss mask must be arrays of one"):
        make_batch(np.zeros((4, 6), dtype=np.int64), np.ones((4, 5), dtype=bool))


@pytest.mark.parametrize("name", EVERY_TASK)
def test_every_token_has_one_name(name, text_params):
    task = _contract_task(name, text_params)
    names = task.token_names()
    assert len(names) == task.vocab_size and all(isinstance(n, str) and n for n in names)
    if name != "modular_addition":  # (its tokens are numbers: the default)
        assert names != [str(i) for i in range(task.vocab_size)]


def test_token_names_by_hand():
    def spelled(name, ids, **params):
        names = small(name, **params).token_names()
        return " ".join(names[i] for i in ids)

    # 123 + 989 = 1112 (digits least-significant first), then stop: docs/tasks.md's example.
    assert spelled("addition", [3, 2, 1, 10, 9, 8, 9, 11, 22, 21, 21, 21, 30, 12], n_digits=3) == (
        "3 2 1 + 9 8 9 = 2' 1' 1' 1' stop PAD"
    )
    assert spelled("dyck", [1, 2, 1, 3, 1, 0]) == "( ) ( ? ( PAD"
    # vocab 64, max_pairs 5: key j's marker is 32 + j, its query 37 + j.
    assert spelled("retrieval", [35, 17, 32, 42, 37, 42, 0]) == "k3 17 k0 42 q0 42 PAD"
    assert spelled("induction", [0, 3, 4]) == "0 3 NONE"
    assert spelled("memorization", [5, 16 + 7, 9]) == "5 y7 9"
    assert small("modular_addition").token_names() == [str(i) for i in range(23)]


def test_a_text_tasks_token_names_are_its_tokens(text_params):
    task = _contract_task("lm", text_params)
    names, tok = task.token_names(), task.tokenizer
    assert names[tok.eos_id] == "EOS" and names[tok.pad_id] == "PAD"
    ids = tok.encode("the cat")
    assert "".join(names[i] for i in ids) == tok.decode(ids)


# -- the synthetic tasks -----------------------------------------------------------


def test_registry_has_every_task():
    assert set(TASKS) == set(SMALL) | {"lm", "sentiment"}  # the real-text tasks: tests/test_text_tasks.py
    for name, cls in TASKS.items():
        assert cls.name == name
        assert "docs/tasks.md" in cls.__doc__
        assert cls.description() and "\n" not in cls.description()
        assert set(cls.Config.run_defaults) <= {
            "steps",
            "batch_size",
            "lr",
            "d_model",
            "n_layers",
            "n_heads",
            "eval_batch_size",
        }
        # Every parameter has a docstring (it becomes --help and `mixit list`).
        assert set(field_docs(cls.Config)) == set(task_parameters(name))
        assert all(field_docs(cls.Config).values())


@pytest.mark.parametrize(
    "name, seq_len, vocab_size",
    [
        ("addition", 34, 31),
        ("modular_addition", 3, 599),
        ("dyck", 63, 4),
        ("memorization", 3, 1024),
        ("retrieval", 63, 512),
        ("induction", 128, 17),
    ],
)
def test_default_sizes(name, seq_len, vocab_size):
    task = make_task(name)
    assert (task.seq_len, task.vocab_size) == (seq_len, vocab_size)
    assert set(task.params()) == set(task_parameters(name))


@pytest.mark.parametrize("name", SMALL)
def test_same_seed_same_examples_and_step_changes_batch(name):
    a, b = small(name), small(name)
    for x, y in zip(a.test_examples(), b.test_examples()):
        np.testing.assert_array_equal(x, y)
    for x, y in zip(a.train_examples(3, 64), b.train_examples(3, 64)):
        np.testing.assert_array_equal(x, y)
    assert not np.array_equal(a.train_examples(3, 64)[0], a.train_examples(4, 64)[0])
    assert not np.array_equal(a.train_examples(3, 64)[0], small(name, seed=1).train_examples(3, 64)[0])


@pytest.mark.parametrize("name", SMALL)
def test_global_rng_state_does_not_matter(name):
    outputs = []
    for state in (1, 2):
        np.random.seed(state)
        torch.manual_seed(state)
        random.seed(state)
        task = small(name)
        outputs.append((task.test_examples()[0], task.train_examples(0, 64)[0]))
    for x, y in zip(*outputs):
        np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("name", SMALL)
def test_shapes_vocabulary_and_mask(name):
    task = small(name)
    for seq, mask in (task.test_examples(), task.train_examples(0, 200)):
        assert seq.dtype == np.int64 and mask.dtype == bool
        assert seq.shape == mask.shape and seq.shape[1] == task.seq_len
        assert 0 <= seq.min() and seq.max() < task.vocab_size
        assert mask.any(axis=1).all()
        assert not mask[:, -1].any()  # no token to predict after the last one


@pytest.mark.parametrize("name", SMALL)
def test_perfect_predictions_score_one(name):
    task = small(name)
    batch = task.test_batch()
    metrics = task.score(perfect_preds(batch), batch)
    assert metrics["token_acc"] == 1.0
    if task.exact_match:
        assert metrics["exact_match"] == 1.0


# -- addition ----------------------------------------------------------------------


def digits(x: int, n_digits: int) -> list[int]:
    return [int(c) for c in str(x).zfill(n_digits)[::-1]]


def test_addition_hand_example_tokens_and_mask():
    task = make_task("addition", {"n_digits": 3})
    seq, mask = task.encode(np.array([digits(123, 3), digits(123, 3)]), np.array([digits(989, 3), digits(456, 3)]))
    # 123 + 989 = 1112 and 123 + 456 = 579, digits least-significant first.
    assert seq.tolist() == [
        [3, 2, 1, 10, 9, 8, 9, 11, 22, 21, 21, 21, 30],
        [3, 2, 1, 10, 6, 5, 4, 11, 29, 27, 25, 30, 12],
    ]
    assert np.flatnonzero(mask[0]).tolist() == [7, 8, 9, 10, 11]
    assert np.flatnonzero(mask[1]).tolist() == [7, 8, 9, 10]
    targets = make_batch(seq, mask).targets
    assert targets[0].tolist() == [IGNORE] * 7 + [22, 21, 21, 21, 30]
    assert targets[1].tolist() == [IGNORE] * 7 + [29, 27, 25, 30, IGNORE]


def test_addition_reference_mask_skips_first_digit_and_scores_pad():
    task = make_task("addition", {"n_digits": 3, "reference_mask": True})
    seq, mask = task.encode(np.array([digits(123, 3), digits(123, 3)]), np.array([digits(989, 3), digits(456, 3)]))
    # Current token >= 20, never the last column: the first answer digit (predicted
    # at '=', position 7) is not scored; for 579 the pad after stop is.
    assert np.flatnonzero(mask[0]).tolist() == [8, 9, 10, 11]
    assert np.flatnonzero(mask[1]).tolist() == [8, 9, 10, 11]
    assert seq[1, 12] == 12


@pytest.mark.parametrize("n_digits", [1, 4, 18])
def test_addition_answers_are_right(n_digits):
    task = make_task("addition", {"n_digits": n_digits}, test_size=200)
    seq, mask = task.train_examples(0, 300) if n_digits > 1 else task.sample(np.random.default_rng(0), 300)
    d = n_digits
    for row, row_mask in zip(seq.tolist(), mask):
        a = int("".join(map(str, row[:d][::-1])))
        b = int("".join(map(str, row[d + 1 : 2 * d + 1][::-1])))
        assert (row[d], row[2 * d + 1]) == (10, 11)
        assert len(str(a)) == d and len(str(b)) == d
        answer = str(a + b)[::-1]
        n_answer = len(answer)
        assert row[2 * d + 2 : 2 * d + 2 + n_answer] == [20 + int(c) for c in answer]
        assert row[2 * d + 2 + n_answer] == 30
        assert all(t == 12 for t in row[2 * d + 3 + n_answer :])
        assert np.flatnonzero(row_mask).tolist() == list(range(2 * d + 1, 2 * d + 2 + n_answer))


def test_addition_train_batches_never_contain_a_test_row():
    task = make_task("addition", {"n_digits": 2}, test_size=2000)  # 90 * 90 = 8100 possible examples
    test = rows(task.test_examples()[0])
    raw = rows(task.sample(np.random.default_rng(5), 2000)[0])
    assert raw & test  # without rejection, collisions would happen
    for step in range(20):
        assert not rows(task.train_examples(step, 256)[0]) & test


def test_addition_corrupting_one_digit_costs_one_example():
    task = small("addition")
    batch = task.test_batch()
    preds = perfect_preds(batch)
    row, col = 5, int(torch.nonzero(batch.mask[5])[0])
    preds[row, col] = (preds[row, col] - 20 + 1) % 10 + 20
    metrics = task.score(preds, batch)
    assert metrics["exact_match"] == pytest.approx(1 - 1 / len(batch))
    assert metrics["token_acc"] == pytest.approx(1 - 1 / int(batch.mask.sum()))
    # exact_match is a fraction of independent examples: its error is binomial.
    n = len(batch)
    assert_close(metrics["exact_match_se"], math.sqrt((1 - 1 / n) * (1 / n) / n), dtype=torch.float32, terms=4)


def test_test_set_covering_every_example_is_an_error_not_a_hang():
    with pytest.raises(UsageError, match="test_size"):
        make_task("addition", {"n_digits": 1}).train_examples(0, 8)  # 81 examples, 4000 test draws


# -- modular addition --------------------------------------------------------------


def test_modular_addition_fixed_split_covers_all_pairs_once():
    p = 23
    task = make_task("modular_addition", {"p": p}, seed=0)
    test_seq, test_mask = task.test_examples()
    val_seq, _ = task.val_examples()
    held = p * p - math.floor(p * p * 0.95)  # 27 pairs held out: 13 validate, 14 test
    assert (len(val_seq), len(test_seq)) == (held // 2, held - held // 2)
    for seq in (test_seq, val_seq):
        assert (seq[:, 2] == (seq[:, 0] + seq[:, 1]) % p).all()
    assert (np.flatnonzero(test_mask.any(axis=0)) == [1]).all()
    test_pairs, val_pairs = rows(test_seq[:, :2]), rows(val_seq[:, :2])
    assert len(test_pairs) == len(test_seq) and not test_pairs & val_pairs
    train_pairs: set[tuple[int, ...]] = set()
    for step in range(40):
        seq, _ = task.train_examples(step, 512)
        assert (seq[:, 2] == (seq[:, 0] + seq[:, 1]) % p).all()
        train_pairs |= rows(seq[:, :2])
    assert not train_pairs & (test_pairs | val_pairs)
    assert len(train_pairs) == math.floor(p * p * 0.95)  # 20480 draws from 502 rows see them all
    assert train_pairs | test_pairs | val_pairs == {(a, b) for a in range(p) for b in range(p)}
    # The validation set takes at most val_size of the held-out pairs.
    small = make_task("modular_addition", {"p": p}, seed=0, val_size=5)
    assert len(small.val_examples()[0]) == 5 and len(small.test_examples()[0]) == held - 5


# -- dyck --------------------------------------------------------------------------


def balanced(parens: list[int]) -> bool:
    depth = 0
    for token in parens:
        depth += 1 if token == 1 else -1
        if depth < 0:
            return False
    return depth == 0


def test_dyck_labels_and_mask():
    task = small("dyck")
    assert task.seq_len == 2 * 6 + 3
    seq, mask = task.test_examples()  # train rows lack the short strings: all are test rows
    lengths = set()
    for row, row_mask in zip(seq.tolist(), mask):
        q = row.index(3)
        lengths.add(q)
        assert np.flatnonzero(row_mask).tolist() == [q]
        assert set(row[:q]) <= {1, 2}
        assert row[q + 1] == (2 if balanced(row[:q]) else 1)
        assert all(t == 0 for t in row[q + 2 :])
    assert lengths == set(range(1, 13))


def test_dyck_balanced_rate_matches_reference_code():
    # TASKS.md says about 30%, but its own recipe (and the reference code it
    # describes) gives about 52%: 1/3 of examples are unmutated balanced
    # strings and many mutations keep a string balanced.
    seq, mask = make_task("dyck").sample(np.random.default_rng(0), 3000)
    r, c = np.nonzero(mask)
    rate = (seq[r, c + 1] == 2).mean()
    assert 0.47 < rate < 0.58


def test_dyck_train_batches_never_contain_a_test_row():
    task = make_task("dyck", {"max_pairs": 4}, test_size=200)
    test = rows(task.test_examples()[0])
    assert rows(task.sample(np.random.default_rng(5), 500)[0]) & test
    for step in range(10):
        assert not rows(task.train_examples(step, 200)[0]) & test


def test_dyck_majority_baseline_hand_example():
    # "()" balanced, "(" and ")(" not: labels ')' '(' '(' -> majority 2 of 3.
    seq = np.array([[1, 2, 3, 2, 0, 0, 0], [1, 3, 1, 0, 0, 0, 0], [2, 1, 3, 1, 0, 0, 0]])
    mask = seq == 3
    batch = make_batch(seq, mask)
    metrics = make_task("dyck", {"max_pairs": 2}).score(perfect_preds(batch), batch)
    assert metrics["token_acc"] == 1.0 and metrics["majority_baseline"] == pytest.approx(2 / 3)
    preds = torch.full_like(batch.targets, 1)  # always '(' : right on 2 of 3
    assert make_task("dyck", {"max_pairs": 2}).score(preds, batch)["token_acc"] == pytest.approx(2 / 3)


# -- memorization ------------------------------------------------------------------


def test_memorization_table_and_batches_agree():
    n = 16
    task = small("memorization")
    table, mask = task.test_examples()
    assert len(table) == n * n
    assert rows(table[:, :2]) == {(x, n + y) for x in range(n) for y in range(n)}
    assert (np.flatnonzero(mask.any(axis=0)) == [1]).all()
    label = {(x, y): z for x, y, z in table.tolist()}
    seq, _ = task.train_examples(0, 1000)
    assert all(label[(x, y)] == z for x, y, z in seq.tolist())
    half = small("memorization", fraction=0.5)
    kept = half.test_examples()[0]
    assert len(kept) == n * n // 2
    assert all(label[(x, y)] == z for x, y, z in kept.tolist())  # same labels, a subset of pairs
    assert rows(half.train_examples(0, 1000)[0]) <= rows(kept)


def test_memorization_bits():
    task = small("memorization")
    batch = task.test_batch()
    preds = perfect_preds(batch)
    preds[:10, 1] = (preds[:10, 1] + 1) % 16  # 10 wrong labels
    metrics = task.score(preds, batch, ParamCounts(trainable=100, total=400))
    correct = 16 * 16 - 10
    assert metrics["bits"] == pytest.approx(correct * 4)  # log2(16) = 4 bits each
    assert metrics["bits_per_trainable_param"] == pytest.approx(correct * 4 / 100)
    assert metrics["bits_per_param"] == pytest.approx(correct * 4 / 400)
    assert metrics["token_acc"] == pytest.approx(correct / 256)
    # The bits are linear in the correct count, so their standard errors are token_acc's scaled alike; with
    # one scored position per row that is sqrt(p (1 - p) / (N - 1)) (`ratio_se` with n_i = 1).
    p = correct / 256
    assert_close(metrics["token_acc_se"], math.sqrt(p * (1 - p) / 255), terms=256)
    assert_close(metrics["bits_se"], metrics["token_acc_se"] * 256 * 4, terms=4)
    assert_close(metrics["bits_per_trainable_param_se"], metrics["bits_se"] / 100, terms=2)
    assert_close(metrics["bits_per_param_se"], metrics["bits_se"] / 400, terms=2)


# -- retrieval ---------------------------------------------------------------------


def test_retrieval_answer_is_the_value_after_the_queried_marker():
    max_pairs, half = 5, 32
    task = small("retrieval")
    seq, mask = task.train_examples(0, 500)
    ks = set()
    for row, row_mask in zip(seq.tolist(), mask):
        (q,) = np.flatnonzero(row_mask).tolist()
        k = q // 2
        ks.add(k)
        markers, values = row[0:q:2], row[1:q:2]
        assert all(half <= m < half + max_pairs for m in markers)
        assert len(set(markers)) == k
        assert all(1 <= v < half for v in values)
        assert half + max_pairs <= row[q] < half + 2 * max_pairs  # a query, never a marker
        key = row[q] - max_pairs - half
        assert row[q + 1] == values[markers.index(key + half)]
        assert all(t == 0 for t in row[q + 2 :])
    assert ks == set(range(1, max_pairs + 1))
    targets = make_batch(seq, mask).targets
    assert (targets[mask[:, :-1]] == torch.from_numpy(seq[mask.nonzero()[0], mask.nonzero()[1] + 1])).all()


def test_retrieval_train_batches_never_contain_a_test_row():
    task = make_task("retrieval", {"max_pairs": 3, "vocab": 12}, test_size=100)
    test = rows(task.test_examples()[0])
    assert rows(task.sample(np.random.default_rng(5), 500)[0]) & test
    for step in range(10):
        assert not rows(task.train_examples(step, 200)[0]) & test


# -- registry and validation -------------------------------------------------------


def test_make_task_checks_types_strictly():
    """Parameters are typed by the task's Config, read as -p reads them wherever they come from: the string "5"
    is 5 from Python or a config file as on the command line."""
    task = make_task("addition", {"n_digits": 5, "reference_mask": True})
    assert task.params() == {"n_digits": 5, "reference_mask": True}
    task = make_task("modular_addition", {"p": 7, "train_fraction": 0.5})
    assert task.params() == {"p": 7, "train_fraction": 0.5}
    # An integer is a float (the value is converted): 1 for a float field gives 1.0.
    assert make_task("memorization", {"n": 4, "fraction": 1}).params()["fraction"] == 1.0
    assert task_parameters("addition") == {"n_digits": 10, "reference_mask": False}
    read = make_task("addition", {"n_digits": "5", "reference_mask": "true"}).params()
    assert read == {"n_digits": 5, "reference_mask": True}


@pytest.mark.parametrize(
    "name, params, message",
    [
        ("nope", {}, "unknown task 'nope'; allowed: addition"),
        ("addition", {"digits": 3}, r"unknown task parameter\(s\) digits; allowed: n_digits, reference_mask"),
        ("addition", {"n_digits": "five"}, "n_digits must be int, got 'five'"),
        ("addition", {"n_digits": 2.5}, "n_digits must be int, got 2.5"),
        ("addition", {"n_digits": True}, "n_digits must be int, got True"),
        ("addition", {"reference_mask": "maybe"}, "reference_mask must be bool, got 'maybe'"),
        ("modular_addition", {"train_fraction": "half"}, "train_fraction must be float, got 'half'"),
        ("modular_addition", {"train_fraction": float("nan")}, "train_fraction must be float, got nan"),
        ("addition", {"n_digits": 0}, r"n_digits must be an integer in \[1, 18\]"),
        ("modular_addition", {"p": 1}, "p must be"),
        ("modular_addition", {"train_fraction": 1.0}, "train_fraction must be in"),
        ("dyck", {"max_pairs": 0}, "max_pairs must be"),
        ("memorization", {"n": 1}, "n must be"),
        ("memorization", {"fraction": 0}, "fraction must be in"),
        ("retrieval", {"vocab": 63}, "vocab must be an even integer"),
        ("retrieval", {"max_pairs": 30, "vocab": 100}, "vocab must be an even integer >= 120"),
    ],
)
def test_bad_task_or_parameter_is_a_usage_error(name, params, message):
    with pytest.raises(UsageError, match=message):
        make_task(name, params)


# -- standard errors (docs/tasks.md, "Standard errors") ----------------------------------


def test_ratio_standard_error_by_hand():
    # Three examples, 2 of 2, 0 of 1 and 1 of 3 positions right: r = 3 / 6 = 0.5, x - r n = 1, -0.5, -0.5,
    # whose squares sum to 1.5; sqrt(3 / 2 * 1.5) / 6 = 1.5 / 6 = 0.25.
    assert_close(ratio_se(torch.tensor([2.0, 0.0, 1.0]), torch.tensor([2.0, 1.0, 3.0])), 0.25, terms=8)
    # One position per example: the standard error of a mean, sd (N - 1 in the denominator) / sqrt(N).
    x = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 0.5], dtype=torch.float64)
    assert_close(ratio_se(x, torch.ones(6)), float(x.std() / math.sqrt(6)), terms=16)
    # An example without a scored position is no unit; with fewer than two units there is no error.
    assert math.isnan(ratio_se(torch.tensor([1.0, 0.0]), torch.tensor([1.0, 0.0])))
    assert binomial_se(0.5, 100) == 0.05 and math.isnan(binomial_se(0.5, 0))


def test_dyck_standard_error_and_distinct_strings_by_hand():
    # "()" three times, "(" once; always answering '(' is wrong on "()" (balanced: ')') and right on "(".
    seq = np.array([[1, 2, 3, 2, 0, 0, 0]] * 3 + [[1, 3, 1, 0, 0, 0, 0]])
    batch = make_batch(seq, seq == 3)
    metrics = make_task("dyck", {"max_pairs": 2}).score(torch.full_like(batch.targets, 1), batch)
    assert metrics["token_acc"] == 0.25
    # Per example x = 0, 0, 0, 1 (one position each): sqrt(4 / 3 * (3 * 0.25^2 + 0.75^2)) / 4 = 0.25.
    assert_close(metrics["token_acc_se"], 0.25, terms=8)
    # Each distinct string once: (0 + 1) / 2, and over the two strings sqrt(2 * (0.25 + 0.25)) / 2 = 0.5.
    assert metrics["distinct_token_acc"] == 0.5
    assert_close(metrics["distinct_token_acc_se"], 0.5, terms=8)


@pytest.mark.parametrize("name", EVERY_TASK)
def test_every_metric_of_evaluate_has_its_standard_error(name, text_params):
    from mixit.core.experiment import build
    from mixit.core.training.evaluate import evaluate
    from mixit.core.training.step import loss_sum

    params = SMALL.get(name) or text_params[name]
    cfg = run_config(name, "standard", params, d_model=16, n_heads=2, n_layers=1, test_size=40, val_size=30)
    task, model, _ = build(cfg)
    batch = task.test_batch()
    metrics = evaluate(model, task, torch.device("cpu"), batch_size=7)
    present = [k for k in ("loss", "token_acc", "accuracy", "exact_match") if k in metrics]
    assert "loss" in present and len(present) >= 2
    assert all(math.isfinite(metrics[f"{k}_se"]) and metrics[f"{k}_se"] >= 0 for k in present), metrics
    assert metrics["loss_se"] > 0
    # The loss and its error from each example's own loss: the mean over scored positions, and `ratio_se`.
    with torch.no_grad():
        logits = model.eval()(batch.inputs)
    counts = batch.mask.reshape(len(batch), -1).sum(dim=1).double()
    sums = torch.stack([loss_sum(logits[i : i + 1], batch.targets[i : i + 1]).double() for i in range(len(batch))])
    vocab = logits.shape[-1]
    assert_close(metrics["loss"], float(sums.sum() / counts.sum()), dtype=torch.float32, terms=4 * vocab)
    assert_close(metrics["loss_se"], ratio_se(sums, counts), dtype=torch.float32, terms=4 * vocab * len(batch))
    # Chunks change nothing: the same numbers evaluated in one pass.
    assert_close(evaluate(model, task, torch.device("cpu")), metrics, dtype=torch.float32, terms=4 * vocab)


# -- the held-out sets (module docstring of mixit.core.tasks.base) ----------------------------


def test_validation_and_test_sets_are_independent_draws_and_test_seed_redraws_the_test_set_only():
    task = make_task("dyck", {"max_pairs": 4}, seed=3, test_size=300, val_size=200)
    test, val = task.test_examples()[0], task.val_examples()[0]
    assert np.array_equal(test, task.sample(np.random.default_rng([3, 2, 0]), 300)[0])
    assert np.array_equal(val, task.sample(np.random.default_rng([3, 3]), 200)[0])
    assert rows(test) & rows(val)  # both are held out: sharing the commonest short strings is right
    other = make_task("dyck", {"max_pairs": 4}, seed=3, test_size=300, val_size=200, test_seed=1)
    assert np.array_equal(other.val_examples()[0], val)
    assert not np.array_equal(other.test_examples()[0], test)
    # The training stream rejects every held-out string, of either set.
    held = rows(other.test_examples()[0]) | rows(other.val_examples()[0])
    assert not set().union(*(rows(other.train_examples(step, 256)[0]) for step in range(10))) & held


def test_dyck_validation_and_test_sets_hold_each_string_as_often():
    # Dyck draws its shortest strings over and over ("()" is about one example in twenty). Split by
    # distinct string, each of them fell wholly in one set, and validation read 75.8% where test read 66.6%.
    task = make_task("dyck", {"max_pairs": 10}, seed=0, test_size=4000, val_size=4000)
    test, val = task.test_examples()[0], task.val_examples()[0]
    strings, counts = np.unique(np.concatenate([test, val]), axis=0, return_counts=True)
    for string in strings[np.argsort(counts)[-5:]]:  # the five commonest
        in_test, in_val = (test == string).all(axis=1).mean(), (val == string).all(axis=1).mean()
        # Two independent samples of a share of about 5%: they differ by 0.005 (one standard error) typically.
        assert in_test > 0.005 and in_val > 0.005 and abs(in_test - in_val) < 0.02


def test_modular_addition_test_seed_redraws_which_held_out_pairs_are_tested():
    p = 23
    base, other = make_task("modular_addition", {"p": p}), make_task("modular_addition", {"p": p}, test_seed=1)
    assert np.array_equal(base.tables.train, other.tables.train)  # the pairs trained on stay
    held = rows(base.tables.val) | rows(base.tables.test)
    assert rows(other.tables.val) | rows(other.tables.test) == held
    assert rows(other.tables.test) != rows(base.tables.test)
    assert len(other.tables.test) == len(base.tables.test)


def test_tasks_read_their_parameters_and_data_options_instead_of_copying_them():
    """No task has a constructor of its own: each reads `self.cfg` and `self.data_config` where it needs them."""
    assert [name for name, cls in TASKS.items() if cls.__init__ is not Task.__init__] == []
    task = make_task("dyck", {"max_pairs": 4}, seed=3, test_size=30)
    assert (task.cfg.max_pairs, task.data_config) == (4, DataConfig(data_seed=3, test_size=30, val_size=30))
    with pytest.raises(UsageError, match=r"unknown data option\(s\) tset_size"):
        make_task("dyck", tset_size=30)


def test_test_seed_has_no_effect_where_the_test_set_is_given():
    base, other = make_task("memorization", {"n": 16}), make_task("memorization", {"n": 16}, test_seed=5)
    assert np.array_equal(base.test_examples()[0], other.test_examples()[0])
    with pytest.raises(UsageError, match="test_seed"):
        make_task("dyck", test_seed=-1)


def test_a_task_declaring_defaults_where_mixit_once_read_them_is_refused_when_defined():
    """0.3.0 read a task's run defaults from ``defaults`` on the task class; now they go on its Config, and a
    task written for 0.3.0 is told so, rather than trained with the defaults it meant ignored."""

    @dataclass
    class OldConfig(TaskConfig):
        """An old-style task's parameters."""

    with pytest.raises(UsageError) as refused:

        class Old(SequenceTask):
            Config = OldConfig
            defaults: ClassVar[dict[str, int]] = {"steps": 10}

    assert str(refused.value) == (
        "task class Old sets defaults, which mixit no longer reads; declare them as run_defaults on its Config "
        "(OldConfig)"
    )
