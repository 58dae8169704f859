"""Real-text tasks (docs/tasks.md, "Real text"): language modelling (`lm`) and sentiment classification
(`sentiment`) on a dataset of `mixit.core.text.corpora`, tokenized by `mixit.core.text.tokenizer`.

A run keeps its tokenizer in RUN_DIR/tokenizer.json; `mixit eval`, `mixit sample` and ``--resume`` rebuild the
task from that file, so a run evaluates exactly even after the cache is deleted. Construction reads nothing:
the data is built the first time a run needs it (`data`), once per process; the shape facts come from the
parameters where they decide them (`planned_vocab_size`, `Sentiment.n_classes`).

Each epoch visits every training item (a packed lm sequence, or a sentiment example) once, in an order drawn
from ``default_rng([data_seed, 1, epoch])``; training batch ``step`` holds items ``step * batch_size ...`` of
that endless sequence, so a batch depends only on (data_seed, step) and ``--resume`` sees the same batches.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Self

import numpy as np
import torch

from mixit.core.config import TaskConfig, check
from mixit.core.models.attention import ATTENTION
from mixit.core.tasks.base import IGNORE, TASKS, Batch, Examples, ParamCounts, SequenceTask, Task, binomial_se
from mixit.core.text.cache import load_or_build_array
from mixit.core.text.corpora import LABEL_CLASSES, LABELLED, LM_CORPORA, known_min_words, load_corpus, load_labelled
from mixit.core.text.tokenizer import (
    BPE_PAD_ID,
    TOKENIZER_FILE,
    TextTokenizer,
    bpe_reaches,
    check_bpe_vocab,
    encode_documents,
    get_tokenizer,
    texts_fingerprint,
)


def epoch_indices(seed: int, step: int, n: int, n_items: int) -> np.ndarray:
    """Items of training batch `step` (n of them) when every epoch visits all
    n_items once in its own random order: (n,) int64."""
    flat = np.arange(step * n, step * n + n, dtype=np.int64)
    epochs, within = np.divmod(flat, n_items)
    out = np.empty(n, dtype=np.int64)
    for epoch in np.unique(epochs):
        order = _epoch_order(seed, int(epoch), n_items)
        sel = epochs == epoch
        out[sel] = order[within[sel]]
    return out


@functools.lru_cache(maxsize=4)
def _epoch_order(seed: int, epoch: int, n_items: int) -> np.ndarray:
    return np.random.default_rng([seed, 1, epoch]).permutation(n_items)


def absolute(name: str) -> str:
    """A local path as an absolute one (so a run can be evaluated from any
    directory); dataset names and "bpe" unchanged, even if a file of that name exists."""
    if not name or name in (*LM_CORPORA, *LABELLED, "bpe") or not Path(name).exists():
        return name
    return str(Path(name).resolve())


@dataclass(frozen=True)
class TextSource:
    """Where a text task's data comes from, and its tokenizer: what the built data depends on."""

    name: str  # the corpus or dataset
    labelled: bool  # read with `load_labelled` (sentiment), else `load_corpus` (lm)
    data_dir: str
    max_documents: int
    held_out: float
    tokenizer: str
    vocab: int


def planned_vocab_size(source: TextSource) -> int | None:
    """The tokenizer's size where the parameters decide it, known without reading the data; else None: a
    BPE on an embedded dataset read whole, to a `vocab` it surely reaches (`bpe_reaches`, `known_min_words`).
    Elsewhere the BPE may stop short of `vocab` entries, and only the tokenizer itself tells."""
    if source.tokenizer != "bpe":
        return None
    check_bpe_vocab(source.vocab)
    min_words = known_min_words(source.name, source.labelled, source.max_documents, source.held_out)
    return source.vocab if bpe_reaches(source.vocab, min_words) else None


def _tokenizer_for(source: TextSource, train_texts: Sequence[str]) -> TextTokenizer:
    """The source's tokenizer (`get_tokenizer`), checked against what was reported before it was built."""
    tok = get_tokenizer(source.tokenizer, train_texts, source.vocab)
    if source.tokenizer == "bpe":
        planned = (planned_vocab_size(source) or tok.vocab_size, BPE_PAD_ID)
        if (tok.vocab_size, tok.pad_id) != planned:
            raise RuntimeError(
                f"the BPE trained on {source.name} has (size, PAD id) {(tok.vocab_size, tok.pad_id)}, not the"
                f" {planned} reported before it was built (mixit.core.tasks.text.planned_vocab_size)"
            )
    return tok


@dataclass
class TextConfig(TaskConfig):
    """What both text tasks' parameters share: the tokenizer and where the data comes from."""

    tokenizer: str = "bpe"
    """The tokenizer: bpe (a byte-level BPE of `vocab` entries trained on the
    training split and cached), or a tokenizer.json file or a directory holding one."""
    data_dir: str = ""
    """A local copy of a hub dataset's repository to read instead of the hub (empty: the hub)."""
    max_documents: int = 0
    """Read at most this many documents (0: all; fineweb-edu streams its first 100,000 unless this says otherwise)."""

    def validate(self) -> None:
        check(self.max_documents >= 0, f"max_documents must be >= 0 (0 = all), got {self.max_documents}")
        # Local paths are kept absolute, so a run can be evaluated from any directory.
        self.tokenizer, self.data_dir = absolute(self.tokenizer), absolute(self.data_dir)

    def for_run(self, run_dir: Path) -> Self:
        """Read the run's own tokenizer (RUN_DIR/tokenizer.json), never train or fetch one again."""
        saved = Path(run_dir) / TOKENIZER_FILE
        return dataclasses.replace(self, tokenizer=str(saved)) if saved.is_file() else self

    def source(self) -> TextSource:
        """Where the data and the tokenizer come from."""
        raise NotImplementedError(f"{type(self).__name__} must implement source()")


@dataclass(frozen=True)
class TextData:
    """What both text tasks build from their source: at least the tokenizer."""

    tokenizer: TextTokenizer


class TextTask(Task):
    """What both text tasks share: the tokenizer, its size and its file in the run directory."""

    cfg: TextConfig

    @property
    def data(self) -> TextData:
        """The dataset, tokenized, built the first time it is asked for (a subclass makes it)."""
        raise NotImplementedError(f"{type(self).__name__} must define data")

    @functools.cached_property
    def tokenizer(self) -> TextTokenizer:
        """A tokenizer file is read, nothing else; "bpe" comes with the data (trained on its training split)."""
        spec = self.cfg.tokenizer
        return self.data.tokenizer if spec == "bpe" else TextTokenizer.load(spec)

    @property
    def vocab_size(self) -> int:
        """The tokenizer's size: from the parameters where they decide it (`planned_vocab_size`)."""
        planned = planned_vocab_size(self.cfg.source())
        return self.tokenizer.vocab_size if planned is None else planned

    @property
    def pad_id(self) -> int:
        """PAD's id: fixed in a BPE trained here (`BPE_PAD_ID`), read from a tokenizer file otherwise."""
        return BPE_PAD_ID if self.cfg.tokenizer == "bpe" else self.tokenizer.pad_id

    @property
    def reference_len(self) -> int:
        """The tokens the model reads (the reference's max_seq_len), not `SequenceTask`'s whole example."""
        return self.input_len

    def save_artifacts(self, run_dir: Path) -> None:
        """Keep the tokenizer with the run (evaluation and sampling read it from there)."""
        self.tokenizer.save(Path(run_dir) / TOKENIZER_FILE)

    def token_names(self) -> list[str]:
        """Each id's text as the tokenizer decodes it alone, with 'EOS' and 'PAD' (an id that decodes to
        nothing: its number)."""
        tok = self.tokenizer
        names = [tok.decode([i]) or str(i) for i in range(self.vocab_size)]
        names[tok.eos_id], names[tok.pad_id] = "EOS", "PAD"
        return names

    def analysis_tokens(self) -> list[int]:
        """Probe sequences use ordinary tokens only (not EOS or PAD)."""
        specials = {self.tokenizer.eos_id, self.tokenizer.pad_id}
        return [i for i in range(self.vocab_size) if i not in specials]


def split_held_out(stream: np.ndarray, eos_id: int) -> tuple[np.ndarray, np.ndarray]:
    """The held-out token stream dealt into validation (the even-numbered documents, each with its EOS) and
    test (the odd ones); cut at its middle token if it holds one document. Alternating, not halving: the
    corpus's order drifts (source, topic, length), and its two halves' losses were measured 0.75 nats apart.
    """
    starts = np.flatnonzero(stream[:-1] == eos_id) + 1  # where a document starts, the first excepted
    if not len(starts):
        return stream[: len(stream) // 2], stream[len(stream) // 2 :]
    begins = np.zeros(len(stream), dtype=np.int64)
    begins[starts] = 1
    document = np.cumsum(begins)  # (len(stream),) the number of each token's document
    return stream[document % 2 == 0], stream[document % 2 == 1]


def spread(n_items: int, n: int) -> np.ndarray:
    """Indices of n items spread evenly over n_items (all of them if there are no more than n)."""
    if n_items <= n:
        return np.arange(n_items)
    return np.linspace(0, n_items - 1, n).round().astype(np.int64)


def documents(stream: np.ndarray, eos_id: int) -> np.ndarray:
    """(start, end) of every document of a stream with at least two tokens (one prediction): (n, 2)."""
    ends = np.flatnonzero(stream == eos_id)  # each document is followed by EOS
    starts = np.concatenate([[0], ends[:-1] + 1])
    bounds = np.stack([starts, ends], axis=1)
    return bounds[bounds[:, 1] - bounds[:, 0] >= 2]


@functools.lru_cache(maxsize=2)
def _lm_data(source: TextSource) -> tuple[TextTokenizer, np.ndarray, np.ndarray]:
    """(tokenizer, train tokens, held-out tokens), built once per process and cached on disk."""
    data = load_corpus(source.name, source.data_dir or None, source.max_documents, source.held_out)
    tok = _tokenizer_for(source, data.train.texts)
    streams = []
    for split in (data.train, data.test):
        key = f"lm-{texts_fingerprint(split.texts)}-{tok.fingerprint()}"
        streams.append(load_or_build_array(key, functools.partial(encode_documents, tok, split.texts)))
    return tok, streams[0], streams[1]


@dataclass
class LanguageModelingConfig(TextConfig):
    """Language modelling on real text (embedded English by default), packed sequences."""

    # Sized for a laptop CPU (about 15 minutes on 2 cores); the paper used length 256,
    # 8-12 layers of width 512-1024 and 40,000 steps.
    run_defaults: ClassVar[dict[str, Any]] = {
        "steps": 2000,
        "batch_size": 32,
        "lr": 2e-3,
        "eval_batch_size": 64,
        "n_layers": 4,
    }

    corpus: str = "english"
    """The corpus: english (embedded), wikitext-103, fineweb-edu, or a local file
    or directory of .txt/.jsonl/.json/.parquet/.csv/.tsv."""
    length: int = 128
    """Tokens the model reads per sequence."""
    vocab: int = 4096
    """Vocabulary of the BPE tokenizer trained for the run."""
    held_out: float = 0.05
    """Fraction of documents held out (by text hash) where the corpus has no test split."""
    packing: bool = True
    """Concatenate the documents and cut them into sequences (every token predicted once per epoch); false: as the
    reference code, one document per sequence, its first length + 1 tokens, right-padded, the rest discarded."""

    def validate(self) -> None:
        super().validate()
        check(self.length >= 2, f"length must be an integer >= 2, got {self.length}")
        self.corpus = absolute(self.corpus)

    def source(self) -> TextSource:
        return TextSource(
            self.corpus, False, self.data_dir, self.max_documents, self.held_out, self.tokenizer, self.vocab
        )


SPLITS = ("training", "validation", "test")


@dataclass(frozen=True)
class LMData(TextData):
    """An lm task's data: the token stream of each split (SPLITS), and how it is cut into sequences."""

    streams: dict[str, np.ndarray]  # split -> its tokens, each document followed by EOS
    held_out: np.ndarray  # the held-out stream, its documents dealt alternately to validation and test
    docs: dict[str, np.ndarray]  # split -> (start, end) of each document (without packing; else empty)
    counts: dict[str, int]  # split -> how many sequences it holds
    unigram_logp: torch.Tensor  # (vocab_size,) log-probabilities of the add-one-smoothed training unigram


@TASKS.register("lm")
class LanguageModeling(TextTask, SequenceTask):
    """Next-token prediction on real text (docs/tasks.md, "lm").

    Documents are tokenized, each followed by EOS, into one stream per split. Training sequence i is
    stream[i*length : i*length + length + 1], so every next-token prediction of the training stream is made
    once per epoch (a last partial sequence is left out). The held-out documents are dealt alternately to
    validation and test (`split_held_out`), packed the same way; `val_size` (`test_size`) sequences spread over
    each are the validation (test) set (``test_seed`` does not apply). Metrics: `loss` (nats per token, the
    paper's "log perplexity"), `perplexity`, `token_acc`, and `unigram_loss`, the training split's
    add-one-smoothed unigram on the same targets (the floor a model must beat).
    """

    name = "lm"
    report_metric = ("loss", "loss", 1)
    report_columns = (("perplexity", "perplexity", 1), ("unigram loss", "unigram_loss", 1))
    report_dataset = "corpus"
    Config = LanguageModelingConfig
    cfg: LanguageModelingConfig
    selection: ClassVar[tuple[str, bool]] = ("loss", False)

    @property
    def seq_len(self) -> int:
        return self.cfg.length + 1

    @functools.cached_property
    def data(self) -> LMData:
        """The tokenizer and the token streams, built (or read from the cache) the first time data is needed."""
        c = self.cfg
        tok, train, held_out = _lm_data(c.source())
        streams = dict(zip(SPLITS, (train, *split_held_out(held_out, tok.eos_id))))
        if c.packing:
            docs = {}
            counts = {split: (len(stream) - 1) // c.length for split, stream in streams.items()}
        else:
            docs = {split: documents(stream, tok.eos_id) for split, stream in streams.items()}
            counts = {split: len(bounds) for split, bounds in docs.items()}
        for split, count in counts.items():
            check(
                count >= 1,
                f"corpus {c.corpus!r}: the {split} split has fewer than {c.length + 1} tokens"
                f"{' in any document' if not c.packing else ''}; lower length or use a larger corpus",
            )
        counts_by_token = np.bincount(train, minlength=tok.vocab_size).astype(np.float64) + 1.0
        unigram_logp = torch.from_numpy(np.log(counts_by_token / counts_by_token.sum()))
        return LMData(tok, streams, held_out, docs, counts, unigram_logp)

    def sequences(self, split: str, index: np.ndarray) -> Examples:
        """Sequences number `index` of `split` (one of SPLITS) and their loss masks: (len(index), length + 1) each.

        Packed: consecutive windows of the stream, every prediction scored. Not
        packed: document number `index`, its first length + 1 tokens (no EOS),
        right-padded; a prediction is scored where its target is a real token.
        """
        stream = self.data.streams[split]
        if self.cfg.packing:
            offsets = index[:, None] * self.cfg.length + np.arange(self.cfg.length + 1)
            seq = stream[offsets].astype(np.int64)
            return seq, np.ones_like(seq, dtype=bool)
        docs = self.data.docs[split]
        seq = np.full((len(index), self.cfg.length + 1), self.data.tokenizer.pad_id, dtype=np.int64)
        mask = np.zeros_like(seq, dtype=bool)
        for row, (start, end) in enumerate(docs[index]):
            n = min(end - start, self.cfg.length + 1)
            seq[row, :n] = stream[start : start + n]
            mask[row, : n - 1] = True  # the prediction at t of token t + 1
        return seq, mask

    def build_held_out(self) -> tuple[Examples, Examples]:
        """The first test_size (val_size) sequences of the test (validation) split, spread evenly over it."""
        counts, (test_size, val_size) = self.data.counts, self.data_config.sizes
        test = self.sequences("test", spread(counts["test"], test_size))
        return test, self.sequences("validation", spread(counts["validation"], val_size))

    def train_examples(self, step: int, n: int) -> Examples:
        index = epoch_indices(self.data_config.data_seed, step, n, self.data.counts["training"])
        return self.sequences("training", index)

    def loss_metrics(self, loss: float) -> dict[str, float]:
        return {"perplexity": math.exp(min(loss, 700.0))}

    def score(self, preds: torch.Tensor, batch: Batch, counts: ParamCounts | None = None) -> dict[str, float]:
        out = super().score(preds, batch, counts)
        targets = batch.targets[batch.mask]
        out["unigram_loss"] = float(-self.data.unigram_logp[targets].mean())
        return out


Labelled = tuple[np.ndarray, np.ndarray]
"""Texts as token rows (N, length), right-padded, and their labels (N,)."""


@functools.lru_cache(maxsize=2)
def _sentiment_data(source: TextSource, length: int) -> tuple[TextTokenizer, Labelled, Labelled]:
    """(tokenizer, training split, held-out split), built once per process."""
    data = load_labelled(source.name, source.data_dir or None, source.max_documents, source.held_out)
    tok = _tokenizer_for(source, data.train.texts)
    splits = []
    for split in (data.train, data.test):
        rows = np.full((len(split), length), tok.pad_id, dtype=np.int64)
        for i, ids in enumerate(tok.encode_batch(split.texts)):
            ids = ids[:length] or [tok.eos_id]  # truncate; an empty text reads as EOS alone
            rows[i, : len(ids)] = ids
        splits.append((rows, np.asarray(split.labels, dtype=np.int64)))
    return tok, splits[0], splits[1]


@dataclass
class SentimentConfig(TextConfig):
    """Sentiment classification (embedded movie snippets by default, yelp_polarity when reachable)."""

    run_defaults: ClassVar[dict[str, Any]] = {"steps": 1000, "batch_size": 64, "lr": 1e-3, "eval_batch_size": 500}

    dataset: str = "movies"
    """The dataset: movies (embedded), yelp_polarity, or a local file or directory with text and integer label
    fields."""
    length: int = 64
    """Tokens kept per text (the first ones); shorter texts are right-padded."""
    vocab: int = 2048
    """Vocabulary of the BPE tokenizer trained for the run."""
    held_out: float = 0.2
    """Fraction of texts held out (by text hash) where the dataset has no test split."""

    def validate(self) -> None:
        super().validate()
        check(self.length >= 1, f"length must be an integer >= 1, got {self.length}")
        self.dataset = absolute(self.dataset)

    def source(self) -> TextSource:
        return TextSource(
            self.dataset, True, self.data_dir, self.max_documents, self.held_out, self.tokenizer, self.vocab
        )


@dataclass(frozen=True)
class SentimentData(TextData):
    """A sentiment task's texts, as token rows, and labels: its three sets, and the label counts."""

    train: Labelled
    val: Labelled  # split off the dataset's training split
    test: Labelled  # the dataset's held-out split
    n_classes: int
    majority: int  # the most frequent label of `train`


@TASKS.register("sentiment")
class Sentiment(TextTask):
    """Binary (or n-class) text classification: read a text, output its label (docs/tasks.md, "sentiment").

    Texts are tokenized, truncated to their first `length` tokens and right-padded with PAD; a batch is cut
    to its longest text. The classifier head pools the final hidden states (``--pooling``) into class logits;
    whether the model reads causally is the attention kind's default (`Attention.classifies_causally`) unless
    ``--causal`` says. Metrics: `accuracy` and `majority_baseline`, the accuracy of always answering the
    training split's most frequent label. The test set is the dataset's own held-out split.
    """

    name = "sentiment"
    report_metric = ("accuracy", "accuracy", 100)
    report_columns = (("majority", "majority_baseline", 100),)
    report_dataset = "dataset"
    Config = SentimentConfig
    cfg: SentimentConfig
    selection: ClassVar[tuple[str, bool]] = ("accuracy", True)

    @property
    def input_len(self) -> int:
        return self.cfg.length

    @property
    def n_classes(self) -> int:
        """Classes of the labels (at least 2): known for a named dataset (LABEL_CLASSES), else read off the data."""
        return LABEL_CLASSES.get(self.cfg.dataset) or self.data.n_classes

    def model_defaults(self, attention: str) -> dict[str, Any]:
        return {
            "head": "classifier",
            "n_classes": self.n_classes,
            "pad_id": self.pad_id,
            "causal": ATTENTION.get(attention).classifies_causally,
        }

    @functools.cached_property
    def data(self) -> SentimentData:
        """The texts tokenized, split three ways, built the first time data is needed."""
        c = self.cfg
        tok, train_set, test_set = _sentiment_data(c.source(), c.length)
        # The validation set is split off the training split: a fixed random min(val_size, a fifth) of it.
        n_train = len(train_set[1])
        _, val_size = self.data_config.sizes
        n_val = min(val_size, n_train // 5)
        check(n_val >= 1, f"dataset {c.dataset!r}: {n_train} training texts leave none for validation; need >= 5")
        is_val = np.zeros(n_train, dtype=bool)
        is_val[np.random.default_rng([self.data_config.data_seed, 6]).permutation(n_train)[:n_val]] = True
        labels = np.concatenate([train_set[1], test_set[1]])
        n_classes = max(int(labels.max()) + 1, 2)
        named = LABEL_CLASSES.get(c.dataset, n_classes)
        check(n_classes == named, f"dataset {c.dataset!r}: labels must be 0 .. {named - 1}, found {labels.max()}")
        train = (train_set[0][~is_val], train_set[1][~is_val])
        majority = int(np.bincount(train[1], minlength=n_classes).argmax())
        val = (train_set[0][is_val], train_set[1][is_val])
        return SentimentData(tok, train, val, test_set, n_classes, majority)

    def _batch(self, rows: np.ndarray, labels: np.ndarray) -> Batch:
        width = int((rows != self.data.tokenizer.pad_id).sum(axis=1).max())
        return Batch(torch.from_numpy(np.ascontiguousarray(rows[:, :width])), torch.from_numpy(labels.copy()))

    def test_batch(self) -> Batch:
        """The test split, or a fixed random `test_size` of it: the split comes ordered by label
        from some sources, so its first rows would not be a fair sample."""
        rows, labels = self.data.test
        seed, test_size = self.data_config.data_seed, self.data_config.test_size
        if test_size < len(rows):
            keep = np.sort(np.random.default_rng([seed, 4]).permutation(len(rows))[:test_size])
            rows, labels = rows[keep], labels[keep]
        return self._batch(rows, labels)

    def val_batch(self) -> Batch:
        return self._batch(*self.data.val)

    def train_batch(self, step: int, batch_size: int) -> Batch:
        rows, labels = self.data.train
        index = epoch_indices(self.data_config.data_seed, step, batch_size, len(rows))
        return self._batch(rows[index], labels[index])

    def score(self, preds: torch.Tensor, batch: Batch, counts: ParamCounts | None = None) -> dict[str, float]:
        right = (preds == batch.targets) & (batch.targets != IGNORE)
        accuracy = right.float().mean().item()
        return {
            "accuracy": accuracy,
            "accuracy_se": binomial_se(accuracy, len(right)),
            "majority_baseline": (batch.targets == self.data.majority).float().mean().item(),
        }
