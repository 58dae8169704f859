"""What every task shares: the registry, the task contract (docs/tasks.md, "The task contract"), batches and
scoring; and, for tasks made of token sequences, the fixed held-out sets and the seeded training stream.

A `SequenceTask` produces whole sequences ``seq`` (N, L) and a loss mask ``mask`` (N, L), ``mask[i, t]`` saying
that the prediction made at t (of token t+1) is trained and scored. The model never sees the last token:

    inputs  = seq[:, :-1]                                   # (N, L-1)
    targets = seq[:, 1:] where mask[:, :-1] else IGNORE     # (N, L-1)

and one loss (cross-entropy with ``ignore_index=IGNORE``) serves every task.

Determinism: the test set is ``test_size`` draws of ``numpy.random.default_rng([data_seed, 2, test_seed])``,
the validation set ``val_size`` draws of ``default_rng([data_seed, 3])``, and training batch ``step`` comes from
``default_rng([data_seed, 1, step])`` minus any held-out example, so ``--resume`` is exact. The validation and
test sets are independent samples of one distribution (they may share an example; neither is trained on), and
``test_seed`` draws a fresh test set that no setting was chosen on (docs/reproduction.md, "Protocol").
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, NamedTuple, TypeVar

import numpy as np
import torch

from mixit.core.config import DataConfig, ModelConfig, TaskConfig, check, short_doc
from mixit.errors import Unimplemented
from mixit.registry import Registry

IGNORE = -100
"""Target value of a position that is neither trained nor scored."""

TASKS: Registry[type[Task]] = Registry("task")
"""CLI name -> task class. A task module registers its class with ``@TASKS.register(name)``."""

Examples = tuple[np.ndarray, np.ndarray]
"""Whole sequences (N, L) int64 and their loss mask (N, L) bool."""

F = TypeVar("F", bound=Callable[..., Any])


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


def who(task: Task) -> str:
    """A task as refusals name it: its registered name and its class."""
    return f"task {getattr(task, 'name', type(task).__name__)!r} ({type(task).__name__})"


def missing(task: Task, what: str) -> Unimplemented:
    """The refusal of a task class that lacks a member it must have: `what` it must do."""
    return Unimplemented(f"{who(task)} must {what}: docs/extending.md, 'A task: copying'")


def needed(*callers: str) -> Callable[[F], F]:
    """Mark a base class's method that only refuses (`missing`) as one a subclass must override, unless it
    overrides every one of `callers`, the base class's methods that call it (none: it must, always)."""

    def mark(method: F) -> F:
        method.needed_unless = callers  # type: ignore[attr-defined]
        return method

    return mark


def check_complete(task: Task) -> None:
    """Refuse `task` if its class lacks a method it must implement (`needed`): met when a run is resolved, so that a
    study refuses it before any run starts, rather than each run failing on its first batch."""
    for base in type(task).__mro__:
        for name, method in vars(base).items():
            callers = getattr(method, "needed_unless", None)
            if callers is None or getattr(type(task), name) is not method:
                continue
            if not callers or any(getattr(type(task), caller) is vars(base)[caller] for caller in callers):
                raise missing(task, f"implement {name}()")


def check_batch(task: Task, batch: Batch, model: ModelConfig) -> None:
    """Refuse a batch of `task` that `model` cannot read, naming the task: an empty one, token ids outside the
    vocabulary, sequences longer than n_ctx, or scored targets the head cannot predict. A task of one's own meets
    this on its first training batch, before any work, rather than as an index error once the run is written."""
    inputs, targets = batch.inputs, batch.targets
    check(
        inputs.dim() == 2 and inputs.numel() > 0,
        f"{who(task)}: a batch must hold (examples, tokens), got {list(inputs.shape)}",
    )
    low, high = int(inputs.min()), int(inputs.max())
    check(
        0 <= low and high < model.vocab_size,
        f"{who(task)}: token ids must be in 0..{model.vocab_size - 1} (its vocab_size), got {low}..{high}",
    )
    check(
        inputs.shape[1] <= model.n_ctx,
        f"{who(task)}: its model reads {inputs.shape[1]} tokens, more than n_ctx={model.n_ctx}",
    )
    outputs = model.n_classes if model.head == "classifier" else model.vocab_size
    scored = targets[targets != IGNORE]
    if scored.numel():
        low, high = int(scored.min()), int(scored.max())
        check(
            0 <= low and high < outputs,
            f"{who(task)}: scored targets must be in 0..{outputs - 1} (its {model.head} head), got {low}..{high}",
        )


def make_batch(seq: np.ndarray, mask: np.ndarray) -> Batch:
    """Turn whole sequences (N, L) and their loss mask (N, L) into a `Batch`."""
    check(
        seq.ndim == 2 and seq.shape == mask.shape,
        f"a task's sequences and loss mask must be arrays of one (examples, length) shape, got {list(seq.shape)} "
        f"and {list(mask.shape)}",
    )
    seq_t = torch.from_numpy(np.ascontiguousarray(seq, dtype=np.int64))
    mask_t = torch.from_numpy(np.ascontiguousarray(mask, dtype=bool))
    targets = torch.where(mask_t[:, :-1], seq_t[:, 1:], torch.full_like(seq_t[:, 1:], IGNORE))
    return Batch(inputs=seq_t[:, :-1].contiguous(), targets=targets.contiguous())


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


def per_example(values: torch.Tensor) -> torch.Tensor:
    """(N, ...) -> (N,): each example's sum (of right predictions, scored positions, losses), as float64."""
    return values.reshape(len(values), -1).double().sum(dim=1)


def ratio_se(sums: torch.Tensor, counts: torch.Tensor) -> float:
    """Standard error of the ratio r = sum(sums) / sum(counts), the examples being the independent units.

    A metric averaged over all scored positions (loss, token_acc) is such a ratio, with per-example sums
    x_i (losses, right predictions) and counts n_i (scored positions); the positions of one example are not
    independent, so the error is the ratio estimator's (cluster) one,
    sqrt(N / (N - 1) * sum_i (x_i - r n_i)^2) / sum_i n_i over the N examples with a scored position,
    which is what a bootstrap over examples estimates. nan with fewer than two such examples.
    """
    keep = counts > 0
    x, n = sums[keep].double(), counts[keep].double()
    if len(x) < 2:
        return float("nan")
    total = n.sum()
    r = x.sum() / total
    return math.sqrt(len(x) / (len(x) - 1) * float(((x - r * n) ** 2).sum())) / float(total)


def binomial_se(p: float, n: int) -> float:
    """Standard error sqrt(p (1 - p) / n) of a fraction p of n independent examples (nan when n is 0)."""
    return math.sqrt(p * (1 - p) / n) if n > 0 else float("nan")


@dataclass(frozen=True)
class ParamCounts:
    """Parameter counts that some metrics (bits per parameter) divide by."""

    trainable: int
    total: int


class Task:
    """The contract every task meets; the rest of mixit calls nothing else (docs/tasks.md, "The task contract").

    Constructing a task is cheap: the shape facts come from its parameters (``cfg``, its Config) and data options
    (``data_config``); the data is built the first time a batch (or a tokenizer) is asked for. A subclass sets
    ``name`` and ``Config`` and implements the three batch methods, ``vocab_size`` and ``input_len``; most do so
    by deriving from `SequenceTask`.
    """

    name: ClassVar[str]
    Config: ClassVar[type[TaskConfig]] = TaskConfig
    exact_match: ClassVar[bool] = False  # report whole-answer accuracy (multi-token answers)
    selection: ClassVar[tuple[str, bool]] = ("token_acc", True)
    """The validation metric that settings are chosen and convergence is judged by, and whether higher is better."""
    report_metric: ClassVar[tuple[str, str, int]] = ("accuracy", "token_acc", 100)
    """The number a study's report judges the task by: its column's name, the test metric, and the scale to the
    report's units (100: a fraction shown in percent; 1: as it is)."""
    report_columns: ClassVar[tuple[tuple[str, str, int], ...]] = ()
    """Further test metrics the report's tables show after it, each (column name, metric, scale)."""
    report_dataset: ClassVar[str | None] = None
    """For a task that reads one of several datasets, the parameter naming it: the paper's tables name the task
    by it ("lm:wikitext-103", the last part of the parameter's path). None: by the task's name alone."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Refuse a task that declares its run defaults where mixit 0.3.0 read them (``defaults`` on the task
        class): they would be ignored without a word."""
        super().__init_subclass__(**kwargs)
        check(
            "defaults" not in vars(cls),
            f"task class {cls.__name__} sets defaults, which mixit no longer reads; declare them as run_defaults "
            f"on its Config ({cls.Config.__name__})",
        )

    def __init__(self, cfg: TaskConfig | None = None, data: DataConfig | None = None):
        """`cfg`: the task's parameters (None: their defaults); `data`: which examples it draws (None: the
        defaults). A task reads both where it needs them (``self.cfg.n_digits``), never copying them."""
        self.cfg = self.Config() if cfg is None else cfg
        check(
            isinstance(self.cfg, self.Config),
            f"task {self.name} takes {self.Config.__name__}, got {type(self.cfg).__name__}",
        )
        self.data_config = DataConfig() if data is None else data

    @classmethod
    def description(cls) -> str:
        """One line on what the task is: the first line of its Config's docstring."""
        return short_doc(cls.Config)

    def params(self) -> dict[str, Any]:
        """The task's own parameters."""
        return self.cfg.to_dict()

    def describe(self) -> str:
        args = ", ".join(f"{k}={v}" for k, v in self.params().items())
        return f"{self.name}({args})"

    # -- shape facts (from the parameters: no data is built) ------------------------
    @property
    def vocab_size(self) -> int:
        """Tokens the model embeds (and, with a language-model head, predicts): ids 0 .. vocab_size-1."""
        raise missing(self, "define vocab_size")

    @property
    def input_len(self) -> int:
        """Length of the sequences the model reads (n_ctx must be at least this)."""
        raise missing(self, "define input_len")

    @property
    def reference_len(self) -> int:
        """The sequence length the reference code builds its model for, the default n_ctx: the tokens it reads."""
        return self.input_len

    def model_defaults(self, attention: str) -> dict[str, Any]:
        """ModelConfig values this task needs unless the user sets them (a
        classifier head, padding, causality); `attention` is the run's kind."""
        return {}

    def analysis_tokens(self) -> Sequence[int]:
        """Token ids that probes of the trained model (repeated random sequences)
        draw from: the whole vocabulary unless a task says otherwise."""
        return range(self.vocab_size)

    def token_names(self) -> list[str]:
        """A readable name for each token id 0 .. vocab_size-1 ('+', '(', 'PAD', ...), for figures and
        printouts; by default the ids themselves, as strings."""
        return [str(i) for i in range(self.vocab_size)]

    # -- data -------------------------------------------------------------------
    @needed()
    def train_batch(self, step: int, batch_size: int) -> Batch:
        """Training batch number `step` of `batch_size` examples, none of them a test or validation example."""
        raise missing(self, "implement train_batch()")

    @needed()
    def test_batch(self) -> Batch:
        """The fixed test set: the number a run reports."""
        raise missing(self, "implement test_batch()")

    @needed()
    def val_batch(self) -> Batch:
        """The fixed validation set: what settings are chosen and training is stopped on."""
        raise missing(self, "implement val_batch()")

    def save_artifacts(self, run_dir: Path) -> None:
        """Write what evaluating the run later needs besides its config (a tokenizer); nothing by default."""

    # -- scoring --------------------------------------------------------------
    def score(self, preds: torch.Tensor, batch: Batch, counts: ParamCounts | None = None) -> dict[str, float]:
        """Metrics of predictions `preds` (N, L-1) (argmax of the logits) on `batch`, each with its standard
        error ``<name>_se`` (docs/tasks.md, "Standard errors").

        token_acc: fraction of scored positions predicted right; its error is `ratio_se` over examples.
        exact_match (tasks with multi-token answers): fraction of examples whose
        every scored position is right; its error is `binomial_se`.
        """
        mask = batch.mask
        right = (preds == batch.targets) & mask
        n_scored = int(mask.sum())
        out = {
            "token_acc": right.sum().item() / max(n_scored, 1),
            "token_acc_se": ratio_se(per_example(right), per_example(mask)),
        }
        if self.exact_match:
            all_right = (right | ~mask).all(dim=1)
            out["exact_match"] = all_right.float().mean().item()
            out["exact_match_se"] = binomial_se(out["exact_match"], len(all_right))
        return out

    def loss_metrics(self, loss: float) -> dict[str, float]:
        """Metrics derived from the mean test loss (perplexity for language modelling)."""
        return {}


class SequenceTask(Task):
    """A task whose examples are whole token sequences and their loss masks (`Examples`).

    A subclass defines ``vocab_size`` and ``seq_len`` (from its parameters) and implements `sample`,
    a seeded generator of examples; this class makes the fixed test and validation sets and the
    training stream from it (module docstring) and turns examples into batches with `to_batch`. A task
    whose examples come from elsewhere (a table, a corpus) overrides `build_held_out` and
    `train_examples` instead. Examples are this class's business: the rest of mixit reads batches.
    """

    @property
    def seq_len(self) -> int:
        """Whole sequence length L; the model reads L-1 tokens."""
        raise missing(self, "define seq_len")

    @property
    def input_len(self) -> int:
        return self.seq_len - 1

    @property
    def reference_len(self) -> int:
        """The whole example: the reference code feeds every token and ignores the last prediction
        (docs/fidelity.md)."""
        return self.seq_len

    @needed("build_held_out", "train_examples")
    def sample(self, rng: np.random.Generator, n: int) -> Examples:
        """Draw n independent examples: (seq (n, L) int64, mask (n, L) bool)."""
        raise missing(self, "implement sample()")

    # -- test set, validation set and training stream ---------------------------
    def build_held_out(self) -> tuple[Examples, Examples]:
        """(test set, validation set): two independent samples of `sample`, seeded as the module docstring says.
        Not one pool split in two, which put every copy of a frequent example on one side (Dyck/MixiT read
        75.8% on validation and 66.6% on test)."""
        d = self.data_config
        test_size, val_size = d.sizes
        test = self.sample(np.random.default_rng([d.data_seed, 2, d.test_seed]), test_size)
        val = self.sample(np.random.default_rng([d.data_seed, 3]), val_size)
        return test, val

    @functools.cached_property
    def _held_out(self) -> tuple[Examples, Examples]:
        return self.build_held_out()

    @functools.cached_property
    def _held_keys(self) -> np.ndarray:
        """Sorted row hashes of every test and validation example, which the training stream rejects."""
        return np.sort(row_hashes(np.concatenate([self.test_examples()[0], self.val_examples()[0]])))

    def test_examples(self) -> Examples:
        """The fixed test set: test_size examples."""
        return self._held_out[0]

    def val_examples(self) -> Examples:
        """The fixed validation set: val_size examples, drawn independently of the test set."""
        return self._held_out[1]

    def train_examples(self, step: int, n: int) -> Examples:
        """Training batch number `step`: n fresh examples, none equal to a test or validation example."""
        rng = np.random.default_rng([self.data_config.data_seed, 1, step])
        seqs, masks, have, drawn = [], [], 0, 0
        while have < n:
            # Held-out sets may cover the whole example space (addition with n_digits=1: 81 pairs).
            check(
                drawn <= 100 * n + 10_000,
                f"{self.describe()}: nearly every example drawn for the training batch is held out (test set of"
                f" {self.data_config.test_size}, validation set of {self.data_config.val_size}); lower test_size"
                " and val_size or enlarge the task",
            )
            drawn += n - have
            seq, mask = self.sample(rng, n - have)
            keep = ~np.isin(row_hashes(seq), self._held_keys)
            seqs.append(seq[keep])
            masks.append(mask[keep])
            have += int(keep.sum())
        return np.concatenate(seqs), np.concatenate(masks)

    # -- batches ----------------------------------------------------------------
    def to_batch(self, seq: np.ndarray, mask: np.ndarray) -> Batch:
        """Examples as the model sees them; next-token prediction unless a task
        with per-position labels (induction) says otherwise."""
        return make_batch(seq, mask)

    def train_batch(self, step: int, batch_size: int) -> Batch:
        return self.to_batch(*self.train_examples(step, batch_size))

    def test_batch(self) -> Batch:
        return self.to_batch(*self.test_examples())

    def val_batch(self) -> Batch:
        return self.to_batch(*self.val_examples())


class Tables(NamedTuple):
    """The rows (whole sequences) of a fixed-split task's train, validation and test parts."""

    train: np.ndarray
    val: np.ndarray
    test: np.ndarray


class FixedSplitTask(SequenceTask):
    """A task over a finite table of examples with a fixed train/test split.

    Subclasses implement `build_tables`, which the first request for data calls (once), instead of
    `sample`; only the last token of each row is scored. Training batches are drawn uniformly with
    replacement from the train table; the test and validation sets are the whole test and validation
    tables (``test_size`` does not apply; each task says how ``val_size`` does).
    """

    @needed("build_held_out", "train_examples")
    def build_tables(self) -> Tables:
        """The train, validation and test tables."""
        raise missing(self, "implement build_tables()")

    @functools.cached_property
    def tables(self) -> Tables:
        """`build_tables`, built the first time data is asked for."""
        return self.build_tables()

    def _last_token_mask(self, n_rows: int) -> np.ndarray:
        mask = np.zeros((n_rows, self.seq_len), dtype=bool)
        mask[:, -2] = True  # the prediction of the last token
        return mask

    def build_held_out(self) -> tuple[Examples, Examples]:
        """The whole test and validation tables."""
        test, val = self.tables.test, self.tables.val
        return (test, self._last_token_mask(len(test))), (val, self._last_token_mask(len(val)))

    def train_examples(self, step: int, n: int) -> Examples:
        rng = np.random.default_rng([self.data_config.data_seed, 1, step])
        rows = rng.integers(0, len(self.tables.train), size=n)
        return self.tables.train[rows], self._last_token_mask(n)


def bits_metrics(
    correct: int, n_labels: int, counts: ParamCounts | None, correct_se: float | None = None
) -> dict[str, float]:
    """Capacity in bits (correct * log2 n_labels) and per trainable / total parameter; with the standard
    error of `correct`, each one's ``_se`` too (the bits are linear in `correct`, so its error scales alike)."""
    bits = correct * math.log2(n_labels)
    out = {"bits": bits}
    if correct_se is not None:
        out["bits_se"] = correct_se * math.log2(n_labels)
    if counts is not None:
        out["bits_per_trainable_param"] = bits / max(counts.trainable, 1)
        out["bits_per_param"] = bits / max(counts.total, 1)
        if correct_se is not None:
            out["bits_per_trainable_param_se"] = out["bits_se"] / max(counts.trainable, 1)
            out["bits_per_param_se"] = out["bits_se"] / max(counts.total, 1)
    return out
