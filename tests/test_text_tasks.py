"""The lm and sentiment tasks, the classifier head, padding invariance, non-causal
MixiT, and `mixit sample`, on small local corpora (offline)."""

import dataclasses
import json

import numpy as np
import pytest
import torch

from mixit import run_config, train
from mixit.cli import main
from mixit.core.config import ModelConfig
from mixit.core.freezing import VARIANTS, apply_variant
from mixit.core.models import Transformer
from mixit.core.models.attention import bidirectional_mixing, layer_generator, mixit_noise
from mixit.core.tasks import make_task
from mixit.core.tasks.text import TextSource, _sentiment_data, epoch_indices, planned_vocab_size, split_held_out
from mixit.core.text.corpora import EMBEDDED_MIN_WORDS
from mixit.core.text.tokenizer import MIN_VOCAB, encode_documents
from mixit.errors import UsageError
from text_fixtures import sentiment_rows, write_jsonl, write_text_corpus
from tolerance import assert_close, forward_terms


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return str(write_text_corpus(tmp_path_factory.mktemp("lm") / "corpus.txt", n_docs=300))


@pytest.fixture(scope="module")
def reviews(tmp_path_factory):
    return str(write_jsonl(tmp_path_factory.mktemp("sentiment") / "reviews.jsonl", sentiment_rows(1200)))


def lm_task(corpus, **kw):
    return make_task("lm", {"corpus": corpus, "length": 16, "vocab": 300, "held_out": 0.1, **kw})


# -- packing -------------------------------------------------------------------
def test_epoch_indices_visit_every_item_once_per_epoch():
    n_items, batch = 37, 8
    flat = np.concatenate([epoch_indices(5, step, batch, n_items) for step in range(3 * n_items)])  # 8 epochs
    for epoch in range(8):
        assert sorted(flat[epoch * n_items : (epoch + 1) * n_items]) == list(range(n_items))
    assert not np.array_equal(flat[:n_items], flat[n_items : 2 * n_items])  # a fresh order each epoch
    assert np.array_equal(epoch_indices(5, 7, batch, n_items), epoch_indices(5, 7, batch, n_items))


def test_lm_packing_predicts_every_training_token_exactly_once_per_epoch(corpus):
    task = lm_task(corpus)
    stream, L, n_train = task.data.streams["training"], task.cfg.length, task.data.counts["training"]
    # One epoch of batches of 1: every sequence once.
    seqs = np.concatenate([task.train_examples(step, 1)[0] for step in range(n_train)])
    every = task.sequences("training", np.arange(n_train))[0]
    starts = sorted(int(np.flatnonzero(np.all(every == s, axis=1))[0]) for s in seqs)
    assert starts == list(range(n_train))
    # Sequence i is stream[i L : i L + L + 1]: targets tile the stream with no gap and no overlap.
    targets = every[:, 1:].reshape(-1)
    assert np.array_equal(targets, stream[1 : n_train * L + 1])
    assert len(stream) - 1 - n_train * L < L  # only a partial sequence is left out


def test_lm_streams_come_from_their_own_split(corpus):
    from mixit.core.text.corpora import load_corpus

    task = lm_task(corpus)
    data = load_corpus(corpus, held_out_fraction=0.1)
    streams = task.data.streams
    assert np.array_equal(streams["training"], encode_documents(task.tokenizer, data.train.texts))
    held_out = encode_documents(task.tokenizer, data.test.texts)
    assert np.array_equal(task.data.held_out, held_out)
    # The held-out documents are dealt alternately: the even-numbered ones to validation, the odd ones to test.
    val_tokens, test_tokens = streams["validation"], streams["test"]
    docs = [encode_documents(task.tokenizer, [text]) for text in data.test.texts]
    assert len(docs) >= 2
    assert np.array_equal(val_tokens, np.concatenate(docs[0::2]))
    assert np.array_equal(test_tokens, np.concatenate(docs[1::2]))
    seq, mask = task.test_examples()
    assert seq.shape[1] == 17 and mask.all()
    assert np.array_equal(seq[0], test_tokens[:17])
    val, _ = task.val_examples()
    assert np.array_equal(val[0], val_tokens[:17])
    assert task.vocab_size == 300 and task.input_len == 16


def test_lm_test_set_is_spread_over_the_held_out_split(corpus):
    task = make_task("lm", {"corpus": corpus, "length": 16, "vocab": 300, "held_out": 0.1}, test_size=5)
    seq, _ = task.test_examples()
    assert len(seq) == 5
    last = task.data.counts["test"] - 1
    assert np.array_equal(seq[-1], task.sequences("test", np.array([last]))[0][0])


def test_lm_without_packing_reads_one_document_per_sequence_as_the_reference(corpus):
    task = lm_task(corpus, packing=False)
    eos, pad = task.tokenizer.eos_id, task.tokenizer.pad_id
    stream, n_train = task.data.streams["training"], task.data.counts["training"]
    docs = np.split(stream, np.flatnonzero(stream == eos) + 1)[:-1]  # each ends with EOS
    docs = [d[:-1] for d in docs if len(d) - 1 >= 2]
    assert n_train == len(docs)
    seq, mask = task.sequences("training", np.arange(n_train))
    for row, doc, m in zip(seq, docs, mask):
        n = min(len(doc), 17)
        assert np.array_equal(row[:n], doc[:n]) and (row[n:] == pad).all() and eos not in row
        assert m.sum() == n - 1 and m[: n - 1].all()  # every prediction of a real next token, and no other
    batch = task.train_batch(0, 8)
    assert (batch.targets[~batch.mask] == -100).all() and batch.mask.any()


def test_lm_bad_parameters_are_refused(corpus):
    with pytest.raises(UsageError, match="length"):
        lm_task(corpus, length=1)
    too_long = lm_task(corpus, length=100_000)  # known only once the corpus is read: at the first batch
    with pytest.raises(UsageError, match="fewer than"):
        too_long.train_batch(0, 1)


def test_trained_tiny_lm_beats_the_unigram_baseline(corpus, tmp_path):
    cfg = run_config(
        "lm",
        "standard",
        {"corpus": corpus, "length": 16, "vocab": 300, "held_out": 0.1},
        d_model=32,
        n_layers=1,
        n_heads=2,
        steps=150,
        batch_size=16,
        lr=3e-3,
    )
    summary = train(cfg, tmp_path / "run", progress=False)
    test = summary["test"]
    assert test["perplexity"] == pytest.approx(np.exp(test["loss"]))
    # Random words from a 30-word list: the unigram floor is about ln 30 nats per word,
    # and within a word the BPE pieces are predictable, so a trained model goes well below it.
    assert test["loss"] < test["unigram_loss"] - 0.3
    assert (tmp_path / "run" / "tokenizer.json").is_file()


def test_held_out_documents_alternate_between_validation_and_test():
    # Documents "1 2", "3", "4 5", "6" and "" (EOS = 0), in stream order: 0 and 2 and 4 validate, 1 and 3 test.
    stream = np.array([1, 2, 0, 3, 0, 4, 5, 0, 6, 0, 0])
    val, test = split_held_out(stream, eos_id=0)
    assert val.tolist() == [1, 2, 0, 4, 5, 0, 0] and test.tolist() == [3, 0, 6, 0]
    # A single document is cut at its middle token.
    val, test = split_held_out(np.array([1, 2, 3, 4, 0]), eos_id=0)
    assert val.tolist() == [1, 2] and test.tolist() == [3, 4, 0]


def test_sentiment_accuracy_has_a_binomial_standard_error(reviews):
    task = make_task("sentiment", {"dataset": reviews, "vocab": 300, "length": 12}, test_size=100)
    batch = task.test_batch()
    preds = batch.targets.clone()
    preds[:20] = 1 - preds[:20]  # 80 of 100 right
    metrics = task.score(preds, batch)
    assert metrics["accuracy"] == pytest.approx(0.8)
    assert_close(metrics["accuracy_se"], (0.8 * 0.2 / 100) ** 0.5, dtype=torch.float32, terms=4)


# -- sentiment -------------------------------------------------------------------
def test_sentiment_batches_are_right_padded_and_labelled(reviews):
    task = make_task("sentiment", {"dataset": reviews, "vocab": 300, "length": 12})
    batch = task.train_batch(0, 32)
    pad = task.tokenizer.pad_id
    assert batch.inputs.shape[0] == 32 and batch.inputs.shape[1] <= 12 and batch.targets.shape == (32,)
    valid = batch.inputs != pad
    lengths = valid.sum(1)
    assert torch.equal(valid, torch.arange(batch.inputs.shape[1])[None] < lengths[:, None])  # right padding
    assert set(batch.targets.tolist()) <= {0, 1}
    defaults = task.model_defaults("mixing")
    assert defaults == {"head": "classifier", "n_classes": 2, "pad_id": pad, "causal": False}
    assert task.model_defaults("softmax")["causal"] is True


def test_sentiment_test_subset_is_a_fair_sample_of_a_label_ordered_split(reviews):
    task = make_task("sentiment", {"dataset": reviews, "vocab": 300, "length": 12}, test_size=50)
    rows, _ = task.data.test
    labels = np.array([0] * (len(rows) // 2) + [1] * (len(rows) - len(rows) // 2))
    task.data = dataclasses.replace(task.data, test=(rows, labels))  # ordered by label, as some sources ship it
    first, again = task.test_batch(), task.test_batch()
    assert len(first.targets) == 50 and torch.equal(first.targets, again.targets)
    assert 10 <= int(first.targets.sum()) <= 40  # the first 50 rows would all be label 0


def test_sentiment_validation_set_is_split_off_the_training_split(reviews):
    task = make_task("sentiment", {"dataset": reviews, "vocab": 300, "length": 12}, val_size=100)
    full = make_task("sentiment", {"dataset": reviews, "vocab": 300, "length": 12}, val_size=100000)
    val_rows, train_rows = task.data.val[0], task.data.train[0]
    n_train = len(train_rows) + len(val_rows)
    assert len(val_rows) == 100 and len(full.data.val[0]) == n_train // 5  # at most a fifth of the training split
    # The two parts tile the dataset's training split: every text in exactly one of them.
    _, (original, _), _ = _sentiment_data(task.cfg.source(), task.cfg.length)
    both = np.concatenate([val_rows, train_rows])
    assert len(both) == len(original)
    assert sorted(map(tuple, both.tolist())) == sorted(map(tuple, original.tolist()))
    assert len(task.val_batch().targets) == 100
    assert not hasattr(task, "val_examples")  # a sentiment example is a text and a label, not a token row


# -- shape facts from the parameters ------------------------------------------------
def _source(name="english", labelled=False, max_documents=0, held_out=0.05, tokenizer="bpe", vocab=4096):
    return TextSource(name, labelled, "", max_documents, held_out, tokenizer, vocab)


def test_the_vocabulary_size_is_planned_only_where_the_parameters_decide_it(tmp_path):
    assert planned_vocab_size(_source()) == 4096  # the lm defaults
    assert planned_vocab_size(_source("movies", True, held_out=0.2, vocab=2048)) == 2048  # the sentiment defaults
    edge = MIN_VOCAB + EMBEDDED_MIN_WORDS["english"]
    assert planned_vocab_size(_source(held_out=0.5, vocab=edge)) == edge  # the edge of the rule
    for unknown in (
        _source(vocab=edge + 1),  # past the distinct words the corpus is known to hold
        _source(held_out=0.51),  # a smaller training split
        _source(max_documents=10),  # part of the corpus
        _source("movies"),  # not a corpus name for lm: a local path
        _source("english", labelled=True),  # nor for sentiment
        _source(str(tmp_path / "corpus.txt")),
        _source("wikitext-103"),
        _source(tokenizer=str(tmp_path / "tokenizer.json")),  # the file decides
    ):
        assert planned_vocab_size(unknown) is None, unknown
    with pytest.raises(UsageError, match="vocab must be at least 258"):
        planned_vocab_size(_source(vocab=100))


@pytest.mark.parametrize(
    "name, params",
    [("lm", {"vocab": 300, "length": 16, "held_out": 0.5}), ("sentiment", {"vocab": 2048, "held_out": 0.5})],
)
def test_planned_shape_facts_match_the_built_data(name, params):
    """At the edge of the rule (held_out 0.5: the fewest training texts it covers)."""
    task = make_task(name, params)
    facts = task.vocab_size, task.model_defaults("mixing")
    assert facts[0] == params["vocab"] == task.tokenizer.vocab_size
    if name == "sentiment":
        assert facts[1]["n_classes"] == task.data.n_classes and facts[1]["pad_id"] == task.tokenizer.pad_id


def _classifier(variant, causal, pooling, pad_id=1):
    v = VARIANTS[variant]
    cfg = ModelConfig(
        vocab_size=50,
        n_ctx=12,
        d_model=32,
        n_heads=4,
        n_layers=2,
        attention=v.attention,
        head="classifier",
        pooling=pooling,
        causal=causal,
        pad_id=pad_id,
        seed=3,
    )
    model = Transformer(cfg)
    apply_variant(model, v)
    return model.eval()


@pytest.mark.parametrize("pooling", ["last", "mean"])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_padding_never_changes_a_classification(variant, causal, pooling):
    model = _classifier(variant, causal, pooling)
    terms = forward_terms(model.cfg)  # one forward pass, its products of another shape
    g = torch.Generator().manual_seed(0)
    lengths = [3, 7, 12, 1]
    for length in lengths:
        x = torch.randint(2, 50, (1, length), generator=g)
        alone = model(x)
        for width in range(length + 1, 13):
            padded = torch.cat([x, torch.full((1, width - length), 1)], dim=1)
            assert_close(model(padded), alone, terms=terms)
    # ...and in a batch of mixed lengths.
    batch = torch.full((len(lengths), 12), 1)
    rows = []
    for i, length in enumerate(lengths):
        batch[i, :length] = torch.randint(2, 50, (length,), generator=g)
        rows.append(model(batch[i : i + 1, :length]))
    assert_close(model(batch), torch.cat(rows), terms=terms)


@pytest.mark.parametrize("attention", ["softmax", "mixing"])
def test_non_causal_attention_reads_later_tokens_and_causal_does_not(attention):
    h = torch.randn(1, 8, 32, generator=torch.Generator().manual_seed(0))
    changed = h.clone()
    changed[0, -1] += 1.0  # only the last position's input differs
    for causal in (True, False):
        cfg = ModelConfig(
            vocab_size=50, n_ctx=8, d_model=32, n_heads=4, attention=attention, causal=causal, head="classifier"
        )
        attn = Transformer(cfg).blocks[0].attn
        first_changed = not torch.allclose(attn(h)[0, 0], attn(changed)[0, 0])
        assert first_changed == (not causal)


def row_scale(noise):
    """What a row of I + (W - mean W) sums, bounded: 1 and twice the row's |W| (the mean's |W| at most once more).
    An entry rounds in the mean's T terms, the subtraction and the addition: T + 2 roundings of that."""
    return 1 + 2 * noise.abs().sum(-1, keepdim=True)  # (H, T, 1)


def test_bidirectional_mixit_rows_sum_to_one_over_the_real_tokens():
    noise = mixit_noise(4, 10, 8, layer_generator(0, 0)).float()
    full = bidirectional_mixing(noise, alpha=1.0, sink="normalised")
    # float32 entries (T + 2 roundings each, `row_scale`), then the row's T terms.
    assert_close(full.sum(-1), torch.ones(4, 10), terms=2 * 10 + 2, scale=row_scale(noise)[..., 0])
    assert torch.count_nonzero(torch.triu(full[1], diagonal=1)) > 0  # reads later tokens
    valid = torch.arange(10)[None] < torch.tensor([[6], [10]])
    batched = bidirectional_mixing(noise, 1.0, "normalised", valid)  # (2, 4, 10, 10)
    assert_close(batched[:, :, :6].sum(-1), torch.ones(2, 4, 6), terms=2 * 10 + 2, scale=row_scale(noise)[:, :6, 0])
    assert torch.all(batched[0, :, :6, 6:] == 0)  # real tokens never read padding
    short = bidirectional_mixing(noise[:, :6, :6], 1.0, "normalised")
    # padded == unpadded: the mean over the real columns taken as a sum over all T = 10 (padding zeroed) / 6.
    assert_close(batched[0, :, :6, :6], short, terms=10 + 2, scale=row_scale(noise[:, :6, :6]))
    assert_close(batched[1], full, terms=10 + 2, scale=row_scale(noise))  # a sum / count, or a mean
    sink = full[0]
    torch.testing.assert_close(
        sink, 0.5 * torch.eye(10) + 0.5 * torch.nn.functional.one_hot(torch.zeros(10, dtype=torch.long), 10).float()
    )


def test_non_causal_mixit_state_round_trips_and_exposes_its_pattern():
    model = _classifier("mixit", False, "last")
    attn = model.blocks[0].attn
    assert "blocks.0.attn.mixing_noise" in model.state_dict()  # saved with checkpoints
    assert not hasattr(attn, "mixing")
    # Rows sum to 1, but for row 0 of the reference sink head (docs/fidelity.md): 0.5.
    expected = torch.ones(4, 12)
    expected[0, 0] = 0.5
    # float32 entries (T + 2 roundings each, `row_scale`), then the row's T terms.
    assert_close(attn.fixed_pattern.sum(-1), expected, terms=2 * 12 + 2, scale=row_scale(attn.mixing_noise)[..., 0])
    again = _classifier("mixit", False, "last")
    assert torch.equal(again.blocks[1].attn.mixing_noise, model.blocks[1].attn.mixing_noise)


def test_sentiment_training_beats_the_majority_baseline(reviews, tmp_path):
    for variant in ("standard", "mixit"):
        cfg = run_config(
            "sentiment",
            variant,
            {"dataset": reviews, "vocab": 300, "length": 24},
            d_model=32,
            n_layers=1,
            n_heads=2,
            steps=120,
            batch_size=32,
            lr=3e-3,
            pooling="mean",
        )
        assert cfg.model.causal == (variant == "standard") and cfg.model.head == "classifier"
        test = train(cfg, tmp_path / variant, progress=False)["test"]
        assert test["accuracy"] > test["majority_baseline"] + 0.2, (variant, test)


# -- command line ------------------------------------------------------------------
LM_ARGS = [
    "--task",
    "lm",
    "-p",
    "length=16",
    "-p",
    "vocab=300",
    "-p",
    "held_out=0.1",
    "--d-model",
    "32",
    "--n-heads",
    "2",
    "--n-layers",
    "1",
    "--steps",
    "20",
    "--batch-size",
    "8",
    "--no-progress",
]


def test_sample_and_eval_use_the_runs_own_tokenizer(corpus, tmp_path, capsys, monkeypatch):
    run = tmp_path / "run"
    assert main(["train", *LM_ARGS, "-p", f"corpus={corpus}", "--out", str(run)]) == 0
    summary = json.loads((run / "summary.json").read_text())
    capsys.readouterr()
    args = ["sample", str(run), "--prompt", "the cat", "--max-new-tokens", "12", "--num-samples", "2", "--seed", "3"]
    assert main(args) == 0
    first = capsys.readouterr().out
    assert first.count("--- sample") == 2 and first.count("the cat") >= 2
    assert main(args) == 0 and capsys.readouterr().out == first  # seeded
    # With an empty cache the run still evaluates identically, from its own tokenizer (none is trained).
    monkeypatch.setenv("MIXIT_CACHE", str(tmp_path / "fresh-cache"))
    from mixit.core.tasks import text

    def no_training(*args, **kwargs):
        raise AssertionError("evaluation must not train a tokenizer")

    monkeypatch.setattr("mixit.core.text.tokenizer.train_bpe", no_training)
    text._lm_data.cache_clear()
    assert main(["eval", str(run)]) == 0
    assert json.loads(capsys.readouterr().out)["test"] == pytest.approx(summary["test"])


def test_sample_refuses_a_classifier_run_and_bad_options(reviews, tmp_path, capsys):
    run = tmp_path / "cls"
    assert (
        main(
            [
                "train",
                "--task",
                "sentiment",
                "-p",
                f"dataset={reviews}",
                "-p",
                "vocab=300",
                "--d-model",
                "32",
                "--n-heads",
                "2",
                "--n-layers",
                "1",
                "--steps",
                "5",
                "--no-progress",
                "--out",
                str(run),
            ]
        )
        == 0
    )
    capsys.readouterr()
    assert main(["sample", str(run)]) == 2
    err = capsys.readouterr().err
    assert "sampling needs a language-model run" in err and len(err.strip().splitlines()) == 1
    assert main(["sample", str(tmp_path / "missing")]) == 2
    assert main(["train", "--task", "lm", "-p", "corpus=nope", "--out", str(tmp_path / "x")]) == 2
    assert "unknown corpus" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()
    assert main(["train", "--task", "sentiment", "--pooling", "max", "--out", str(tmp_path / "y")]) == 2
    assert "model.pooling: expected one of last or mean, got 'max'" in capsys.readouterr().err
    assert (
        main(["train", "--task", "lm", "-p", f"corpus={reviews}", "--causal", "false", "--out", str(tmp_path / "z")])
        == 2
    )
    assert "would read the tokens it predicts" in capsys.readouterr().err
    assert not (tmp_path / "y").exists() and not (tmp_path / "z").exists()


def test_analyze_works_on_a_classifier_run(reviews, tmp_path, capsys):
    run = tmp_path / "cls"
    assert (
        main(
            [
                "train",
                "--task",
                "sentiment",
                "--variant",
                "mixit",
                "-p",
                f"dataset={reviews}",
                "-p",
                "vocab=300",
                "--d-model",
                "32",
                "--n-heads",
                "2",
                "--n-layers",
                "2",
                "--steps",
                "5",
                "--no-progress",
                "--out",
                str(run),
            ]
        )
        == 0
    )
    assert main(["analyze", str(run), "--batch", "4"]) == 0
    summary = (run / "analysis" / "summary.md").read_text()
    assert "Strongest induction head" in summary and "In-context learning" not in summary  # no next-token head
    assert (run / "analysis" / "fixed_patterns.png").is_file()


@pytest.mark.parametrize("task,length", [("lm", 16), ("sentiment", 24)])
def test_a_text_models_context_is_the_tokens_it_reads(task, length):
    """The default n_ctx of a text task is its input length, as the reference builds it (a language model is also
    a SequenceTask, whose whole example is one token longer: that must not be taken)."""
    cfg = run_config(task, "standard", task_params={"length": length})
    assert cfg.model.n_ctx == length
