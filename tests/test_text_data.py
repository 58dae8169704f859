"""Corpora (embedded, hub layouts read from local copies, local files) and tokenizers, all offline."""

import json
import socket

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from mixit.core.text import corpora
from mixit.core.text.corpora import hash_split, held_out, load_corpus, load_labelled
from mixit.core.text.tokenizer import (
    BPE_EOS_ID,
    BPE_PAD_ID,
    EOS,
    MIN_VOCAB,
    PAD,
    TextTokenizer,
    bpe_reaches,
    encode_documents,
    get_tokenizer,
    train_bpe,
)
from mixit.errors import UsageError
from text_fixtures import english_like, sentiment_rows, write_jsonl, write_text_corpus


def distinct_words(texts: list[str]) -> int:
    """Distinct words of two bytes or more, as the BPE's byte-level pre-tokenizer cuts them."""
    from tokenizers import pre_tokenizers

    cut = pre_tokenizers.ByteLevel(add_prefix_space=False).pre_tokenize_str
    return len({word for text in texts for word, _ in cut(text) if len(word) >= 2})


# -- splitting -----------------------------------------------------------------
def test_hash_split_is_disjoint_deterministic_and_keeps_duplicates_together():
    texts = [f"document number {i}" for i in range(2000)] + ["a repeated text"] * 5
    train, test = hash_split(texts, None, 0.1)
    assert len(train) + len(test) == len(texts)
    assert not set(train.texts) & set(test.texts)
    assert 0.07 < len(test) / len(texts) < 0.13
    again = hash_split(list(reversed(texts)), None, 0.1)
    assert set(again[1].texts) == set(test.texts)  # depends on the text, not the order
    assert held_out("a repeated text", 0.1) == ("a repeated text" in test.texts)


def test_hash_split_carries_labels_along():
    texts, labels = [f"t{i}" for i in range(300)], [i % 2 for i in range(300)]
    train, test = hash_split(texts, labels, 0.3)
    for split in (train, test):
        assert all(int(t[1:]) % 2 == y for t, y in zip(split.texts, split.labels))


# -- embedded data -------------------------------------------------------------
def test_embedded_english_corpus_loads_with_disjoint_splits():
    docs = corpora.english_documents()
    assert len(docs) > 1000
    sources = {d["source"].split("/")[0] for d in docs}
    assert {"austen", "melville", "kjv"} <= sources
    assert all(d["text"].strip() for d in docs)
    data = load_corpus("english")
    assert len(data.train) + len(data.test) == len(docs)
    assert not set(data.train.texts) & set(data.test.texts)
    assert 0.03 < len(data.test) / len(docs) < 0.07
    assert "Emma" in "".join(data.train.texts[:200] + data.test.texts)


def test_embedded_movie_snippets_are_labelled_and_split():
    data = load_labelled("movies")
    n = len(data.train) + len(data.test)
    assert 10_000 < n < 10_605  # the 10,605 snippets less those scored exactly 0
    assert set(data.train.labels) == {0, 1}
    assert not set(data.train.texts) & set(data.test.texts)
    assert 0.17 < len(data.test) / n < 0.23
    assert 0.3 < sum(data.train.labels) / len(data.train) < 0.7


# -- local files ---------------------------------------------------------------
def test_local_text_file_is_split_by_paragraph_blocks(tmp_path):
    path = write_text_corpus(tmp_path / "c.txt", n_docs=300)
    data = load_corpus(str(path), held_out_fraction=0.1)
    assert len(data.train) + len(data.test) == 300
    assert data.info["split"].startswith("hash split")


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet", ".csv", ".tsv"])
def test_local_labelled_files_in_every_format(tmp_path, suffix):
    rows = sentiment_rows(200)
    path = tmp_path / f"data{suffix}"
    if suffix == ".jsonl":
        write_jsonl(path, rows)
    elif suffix == ".parquet":
        pq.write_table(pa.Table.from_pylist(rows), path)
    else:
        sep = "," if suffix == ".csv" else "\t"
        path.write_text("text" + sep + "label\n" + "".join(f"{r['text']}{sep}{r['label']}\n" for r in rows))
    data = load_labelled(str(path))
    got = sorted(zip(data.train.texts + data.test.texts, data.train.labels + data.test.labels))
    assert got == sorted((r["text"], r["label"]) for r in rows)


def test_local_directory_uses_the_split_its_file_names_give(tmp_path):
    write_jsonl(tmp_path / "train.jsonl", [{"text": t} for t in english_like(50, seed=1)])
    write_jsonl(tmp_path / "validation.jsonl", [{"text": t} for t in english_like(7, seed=2)])
    data = load_corpus(str(tmp_path))
    assert (len(data.train), len(data.test)) == (50, 7)
    assert "own train" in data.info["split"]


def test_local_file_problems_are_usage_errors(tmp_path):
    with pytest.raises(UsageError, match="its records have no 'label' field"):
        load_labelled(str(write_jsonl(tmp_path / "x.jsonl", [{"text": "a"}, {"text": "b"}])))
    with pytest.raises(UsageError, match="has no labels"):
        load_labelled(str(write_text_corpus(tmp_path / "c.txt")))
    with pytest.raises(UsageError, match="unknown corpus"):
        load_corpus("no-such-corpus")
    (tmp_path / "empty").mkdir()
    with pytest.raises(UsageError, match="no readable text files"):
        load_corpus(str(tmp_path / "empty"))


def test_an_unreadable_file_is_refused_in_one_line_naming_it(tmp_path, capfd):
    (tmp_path / "x.parquet").write_bytes(b"garbage")
    with pytest.raises(UsageError, match=r"x\.parquet could not be read \(Parquet file size is 7 bytes"):
        load_corpus(str(tmp_path / "x.parquet"))
    assert capfd.readouterr().err == ""  # the reader's own log line is silenced
    (tmp_path / "empty.jsonl").write_text("")
    with pytest.raises(UsageError, match="the training split is empty"):
        load_corpus(str(tmp_path / "empty.jsonl"))


def write_mixed_corpus(root):
    """A directory of every local format, with the corner cases on which readers disagree: paragraph breaks
    of blank lines, lines of spaces or tabs and Windows line ends; null and empty texts; a .json file of
    columns; quoted and "NA" and numeric CSV cells; a nested parquet file with a null. Files of one suffix
    side by side are read together (two .txt, two .csv) or, where a null or a clash of fields asks, one by
    one (the .jsonl, the two .json)."""
    (root / "g_sub").mkdir(parents=True)
    (root / "a_notes.txt").write_bytes(
        b"First paragraph,\nstill the first.\n\n\n\nSecond paragraph.  \n   \nThird, after a line of spaces.\r\n\r\n"
        b"Fourth, after Windows line ends.\n\t\nFifth, after a tab line.\n\n"
    )
    (root / "a_notes_2.txt").write_text("Another file's first paragraph.\n\n  Its second, indented.  \n")
    jsonl = [{"text": "jsonl one", "id": 1}, {"text": ""}, {"text": None}, {"text": "jsonl two, in unicode: café — 🐈"}]
    write_jsonl(root / "b_records.jsonl", jsonl)
    (root / "c_list.json").write_text(json.dumps([{"text": "json list one"}, {"text": "json list two"}]))
    (root / "d_columns.json").write_text(json.dumps({"text": ["json column one", "json column two"], "n": [1, 2]}))
    (root / "e_table.csv").write_text('text,score\n"csv, with a comma",1\nNA,2\n,3\n123,4\n"csv ""quoted"" text",5\n')
    (root / "e_table_2.csv").write_text("score,text\n6,second csv one\n7,second csv two\n")
    (root / "f_table.tsv").write_text("text\tscore\ntsv one\t1\ntsv two\t2\n")
    parquet = {"text": ["parquet one", "parquet two", None, "parquet three"]}
    pq.write_table(pa.table(parquet), root / "g_sub" / "h.parquet")
    return root


# What mixit's readers give for these files (at commit cef987a): the files in sorted order, each file's documents
# in order, then the hash split. Pinned so that a rewrite of the readers (one on `datasets` was tried) keeps them.
MIXED_TRAIN = [
    "First paragraph,\nstill the first.",
    "Third, after a line of spaces.",
    "Fifth, after a tab line.",
    "Another file's first paragraph.",
    "jsonl two, in unicode: café — 🐈",
    "json list one",
    "json column two",
    "csv, with a comma",
    "123",
    "tsv one",
    "tsv two",
    "parquet two",
]
MIXED_HELD_OUT = [
    "Second paragraph.",
    "Fourth, after Windows line ends.",
    "Its second, indented.",
    "jsonl one",
    "json list two",
    "json column one",
    "NA",
    'csv "quoted" text',
    "second csv one",
    "second csv two",
    "parquet one",
    "parquet three",
]


def test_local_files_give_the_documents_and_split_the_old_readers_gave(tmp_path):
    root = write_mixed_corpus(tmp_path / "mixed")
    # Skipped: the jsonl's "" and null, the csv's empty cell and the parquet's null.
    with pytest.warns(UserWarning, match="skipped 4 empty text"):
        data = load_corpus(str(root), held_out_fraction=0.3)
    assert data.train.texts == MIXED_TRAIN and data.test.texts == MIXED_HELD_OUT
    assert data.info["empty_texts_skipped"] == 4
    with pytest.warns(UserWarning):
        first = load_corpus(str(root), held_out_fraction=0.3, max_documents=9)  # the first 9 documents, then split
    assert first.train.texts == MIXED_TRAIN[:5] and first.test.texts == MIXED_HELD_OUT[:4]


def test_labelled_files_named_by_split_keep_their_order_and_labels(tmp_path):
    (tmp_path / "validation").mkdir()
    (tmp_path / "train.csv").write_text('label,text\n1,"good, really"\n0,bad\n1.0,fine\n0, spaced \n')
    (tmp_path / "train_extra.csv").write_text("text,label\nsplendid,1\ndreadful,0\n")
    (tmp_path / "train_more.tsv").write_text("text\tlabel\nlovely\t1\n\t0\n")
    held_out = [{"text": "awful", "label": 0}, {"text": "superb", "label": 1.0}]
    write_jsonl(tmp_path / "validation" / "part.jsonl", held_out)
    with pytest.warns(UserWarning, match="skipped 1 empty text"):
        data = load_labelled(str(tmp_path))
    assert data.train.texts == ["good, really", "bad", "fine", " spaced ", "splendid", "dreadful", "lovely"]
    assert data.train.labels == [1, 0, 1, 0, 1, 0, 1]
    assert (data.test.texts, data.test.labels) == (["awful", "superb"], [0, 1])


def test_local_file_names_are_not_patterns(tmp_path):
    """Each file is read once, by its own name, whatever characters it holds (a reader taking glob patterns, as
    `datasets` does, would read b1.jsonl twice)."""
    names = ("a[1].jsonl", "b*.jsonl", "b1.jsonl", "c?.jsonl")
    for name in names:
        write_jsonl(tmp_path / name, [{"text": f"{name} document {i}"} for i in range(10)])
    data = load_corpus(str(tmp_path), held_out_fraction=0.3)
    got = data.train.texts + data.test.texts
    assert sorted(got) == sorted(f"{name} document {i}" for name in names for i in range(10))


# -- hub datasets, read from local copies of their repositories ------------------
def _parquet(path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path)


def test_wikitext_layout_is_regrouped_into_articles(tmp_path):
    def lines(title, n):
        return [{"text": ""}, {"text": f" = {title} = \n"}, {"text": ""}, {"text": " = = Section = = \n"}] + [
            {"text": f" {title} line {i} \n"} for i in range(n)
        ]

    config = tmp_path / "wikitext-103-raw-v1"
    _parquet(config / "train-00000-of-00001.parquet", lines("Alpha", 3) + lines("Beta", 2))
    _parquet(config / "validation-00000-of-00001.parquet", lines("Gamma", 4))
    data = load_corpus("wikitext-103", data_dir=str(tmp_path))
    assert len(data.train) == 2 and len(data.test) == 1
    assert data.train.texts[0].startswith("= Alpha =") and "Alpha line 2" in data.train.texts[0]
    assert "Section" in data.train.texts[1] and "Beta line 1" in data.train.texts[1]
    assert "validation split" in data.info["split"]


def test_fineweb_layout_gets_a_hash_split_and_max_documents(tmp_path):
    _parquet(
        tmp_path / "sample" / "10BT" / "000_00000.parquet",
        [{"text": t, "id": str(i), "score": 3.1} for i, t in enumerate(english_like(120))],
    )
    data = load_corpus("fineweb-edu", data_dir=str(tmp_path), max_documents=100, held_out_fraction=0.2)
    assert len(data.train) + len(data.test) == 100
    assert not set(data.train.texts) & set(data.test.texts)


def test_yelp_layout_reads_text_and_label(tmp_path):
    _parquet(tmp_path / "plain_text" / "train-00000-of-00001.parquet", sentiment_rows(80, seed=1))
    _parquet(tmp_path / "plain_text" / "test-00000-of-00001.parquet", sentiment_rows(20, seed=2))
    data = load_labelled("yelp_polarity", data_dir=str(tmp_path))
    assert (len(data.train), len(data.test)) == (80, 20)
    assert set(data.train.labels) <= {0, 1}


def test_hub_dataset_missing_from_local_copy_names_the_folder_and_split(tmp_path):
    with pytest.raises(UsageError, match="has no folder plain_text"):
        load_labelled("yelp_polarity", data_dir=str(tmp_path))
    _parquet(tmp_path / "plain_text" / "train-00000-of-00001.parquet", sentiment_rows(20))
    with pytest.raises(UsageError, match=r"could not be loaded \(it has no test split\)"):
        load_labelled("yelp_polarity", data_dir=str(tmp_path))


def test_unreachable_hub_fails_fast_with_one_message(monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    monkeypatch.setattr(corpora, "hub_reachable", lambda timeout=3.0: False)
    with pytest.raises(UsageError, match="cannot be reached"):
        load_corpus("wikitext-103")


def test_offline_mode_without_a_cached_copy_is_a_usage_error(monkeypatch):
    """Refused without a connection attempt (the hub client's retry loop would take minutes): told by the
    attempts made, not by the clock."""
    attempts = []
    real_connect = socket.socket.connect

    def connect(sock, address):
        attempts.append(address)
        return real_connect(sock, address)

    monkeypatch.setattr(socket.socket, "connect", connect)
    with pytest.raises(UsageError, match="could not be loaded"):
        load_labelled("yelp_polarity")  # the session runs with HF_DATASETS_OFFLINE=1
    assert not attempts, attempts


# -- tokenizers ----------------------------------------------------------------
def test_bpe_round_trips_any_text_and_has_the_special_tokens():
    tok = train_bpe(english_like(50), 300)
    assert tok.vocab_size == 300
    for text in ["the cat sat.", "Ünïcödé — “quotes” and emoji 🐈\n\n  spaced\ttabs", ""]:
        assert tok.decode(tok.encode(text)) == text
    assert tok.eos_id != tok.pad_id
    assert tok.decode([tok.eos_id, tok.pad_id]) == EOS + PAD
    spelled = "<|pad|> and <|endoftext|> in a text"
    assert tok.pad_id not in tok.encode(spelled) and tok.eos_id not in tok.encode(spelled)  # only tasks place them
    assert tok.decode(tok.encode(spelled)) == spelled


def test_bpe_puts_the_special_tokens_first():
    tok = train_bpe(english_like(20), 270)
    assert (tok.eos_id, tok.pad_id) == (BPE_EOS_ID, BPE_PAD_ID) == (0, 1)


@pytest.mark.parametrize("n_docs", [1, 3, 40])
def test_bpe_reaches_its_size_when_the_texts_have_enough_distinct_words(n_docs):
    texts = english_like(n_docs, seed=n_docs)
    words = distinct_words(texts)
    assert bpe_reaches(MIN_VOCAB + words, words) and not bpe_reaches(MIN_VOCAB + words + 1, words)
    for size in (MIN_VOCAB, MIN_VOCAB + words // 2, MIN_VOCAB + words):
        assert train_bpe(texts, size).vocab_size == size
    # Past that only training tells: these texts run out of merges well short of 100,000 entries.
    assert MIN_VOCAB + words <= train_bpe(texts, 100_000).vocab_size < 100_000


def test_embedded_datasets_have_the_distinct_words_the_planned_sizes_rely_on():
    """corpora.EMBEDDED_MIN_WORDS, recounted at the largest held-out fraction it covers (the fewest texts)."""
    edge = corpora.EMBEDDED_MAX_HELD_OUT
    english = load_corpus("english", held_out_fraction=edge).train.texts
    movies = load_labelled("movies", held_out_fraction=edge).train.texts
    assert distinct_words(english) >= corpora.EMBEDDED_MIN_WORDS["english"]
    assert distinct_words(movies) >= corpora.EMBEDDED_MIN_WORDS["movies"]
    # A lower fraction only adds texts: the training split at the default fraction holds all of these.
    assert set(english) <= set(load_corpus("english").train.texts)


def test_bpe_training_is_deterministic_and_cached(tmp_path):
    texts = english_like(60)
    a = get_tokenizer("bpe", texts, 280)
    b = get_tokenizer("bpe", texts, 280)  # from the cache
    assert a.fingerprint() == b.fingerprint() == train_bpe(texts, 280).fingerprint()
    assert get_tokenizer("bpe", texts, 300).vocab_size == 300


def test_tokenizer_file_save_load_and_errors(tmp_path):
    tok = train_bpe(english_like(30), 270)
    tok.save(tmp_path / "tokenizer.json")
    for spec in (tmp_path / "tokenizer.json", tmp_path):
        loaded = get_tokenizer(str(spec), [], 0)
        assert loaded.fingerprint() == tok.fingerprint()
    with pytest.raises(UsageError, match="not found"):
        TextTokenizer.load(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(UsageError, match="could not be read"):
        TextTokenizer.load(tmp_path / "bad.json")
    with pytest.raises(UsageError, match="vocab must be at least"):
        train_bpe(["x"], 100)


def test_encode_documents_ends_each_document_with_eos():
    tok = train_bpe(english_like(30), 270)
    docs = ["the cat.", "a dog ran", "home"]
    stream = encode_documents(tok, docs, chunk=2)
    assert (stream == tok.eos_id).sum() == 3 and stream[-1] == tok.eos_id
    assert tok.decode(stream) == EOS.join(docs) + EOS
