"""Tokenizers for the real-text tasks: a byte-level BPE trained on a task's training split (cached), or a
tokenizer file the user names, through Hugging Face `tokenizers`.

Every tokenizer here has two special tokens: <|endoftext|> (EOS) separates the lm task's documents and
<|pad|> (PAD) right-pads sentiment inputs. Text that spells one is encoded as ordinary text, so these ids come
only from the tasks. A byte-level BPE encodes any string and decodes it back exactly (no unknown token), and
its training is deterministic, which the cache relies on; a run keeps its own copy (``tokenizer.json``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

from mixit.core.text.cache import cache_dir
from mixit.errors import UsageError
from mixit.files import write_text

EOS = "<|endoftext|>"
PAD = "<|pad|>"
SPECIALS = (EOS, PAD)
TOKENIZER_FILE = "tokenizer.json"
MIN_VOCAB = 256 + len(SPECIALS)  # the byte alphabet and the special tokens
BPE_EOS_ID, BPE_PAD_ID = SPECIALS.index(EOS), SPECIALS.index(PAD)
"""The special tokens' ids in a BPE trained here: the trainer gives the special tokens the first ids."""


class TextTokenizer:
    """A `tokenizers.Tokenizer` with the EOS and PAD ids the tasks need."""

    def __init__(self, tokenizer):
        tokenizer.add_special_tokens([t for t in SPECIALS if tokenizer.token_to_id(t) is None])
        tokenizer.encode_special_tokens = True  # text spelling "<|pad|>" is ordinary text: only tasks place PAD
        self._tok = tokenizer
        self.eos_id: int = tokenizer.token_to_id(EOS)
        self.pad_id: int = tokenizer.token_to_id(PAD)

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [e.ids for e in self._tok.encode_batch(list(texts), add_special_tokens=False)]

    def decode(self, ids: Iterable[int]) -> str:
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=False)

    def to_str(self) -> str:
        return self._tok.to_str()

    def fingerprint(self) -> str:
        """A short hash of the whole tokenizer (vocabulary, merges, settings)."""
        return hashlib.sha256(self.to_str().encode()).hexdigest()[:16]

    def save(self, path: str | Path) -> None:
        write_text(Path(path), self.to_str())

    @classmethod
    def load(cls, path: str | Path) -> TextTokenizer:
        """A tokenizer.json file, or a directory holding one (a local Hugging Face model or run directory)."""
        from tokenizers import Tokenizer

        path = Path(path)
        if path.is_dir():
            path = path / TOKENIZER_FILE
        if not path.is_file():
            raise UsageError(
                f"tokenizer {path} not found; give 'bpe' (train one on the training split), "
                f"a tokenizer.json file, or a directory holding one"
            )
        try:
            tok = cls(Tokenizer.from_file(str(path)))
        except Exception as e:  # tokenizers raises a bare Exception on malformed files
            raise UsageError(f"tokenizer {path} could not be read ({str(e).splitlines()[0][:200]})") from None
        # Token ids index the embedding and the token counts: one beyond the vocabulary would size them.
        top = max(tok._tok.get_vocab(with_added_tokens=True).values(), default=-1)
        if top >= tok.vocab_size:
            raise UsageError(
                f"tokenizer {path} is corrupt: it holds token id {top:,} but has {tok.vocab_size:,} entries "
                f"(ids must be 0 .. {tok.vocab_size - 1:,})"
            )
        return tok


def check_bpe_vocab(vocab_size: int) -> None:
    """Refuse a BPE vocabulary too small to hold the byte alphabet and the special tokens."""
    if vocab_size < MIN_VOCAB:
        raise UsageError(
            f"vocab must be at least {MIN_VOCAB} (256 bytes + {len(SPECIALS)} special tokens), got {vocab_size}"
        )


def bpe_reaches(vocab_size: int, min_words: int) -> bool:
    """Whether a BPE trained here to `vocab_size` entries surely has exactly that many, on texts known to hold
    at least `min_words` distinct pre-tokenized words (as the byte-level pre-tokenizer cuts them) of two bytes
    or more. It has no more; it has fewer only if it runs out of merges first.

    The trainer merges the most frequent pair of tokens until the vocabulary has `vocab_size` entries or no
    pair is left, and no pair is left only when every word has become a single token. By then the
    vocabulary holds the MIN_VOCAB bytes and special tokens and one token per distinct word of two bytes or
    more, all different; so if those are at least `vocab_size`, it stopped at `vocab_size`. Otherwise only
    training tells (a corpus with few distinct words stops short: a 30-word one at about 350 entries).
    """
    return MIN_VOCAB <= vocab_size <= MIN_VOCAB + min_words


def train_bpe(texts: Iterable[str], vocab_size: int) -> TextTokenizer:
    """A byte-level BPE with `vocab_size` entries (special tokens included) trained on `texts`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    check_bpe_vocab(vocab_size)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIALS),
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(texts, trainer)
    return TextTokenizer(tok)


def texts_fingerprint(texts: Iterable[str]) -> str:
    """A hash of a sequence of texts (order and boundaries included)."""
    h = hashlib.sha256()
    for text in texts:
        data = text.encode()
        h.update(len(data).to_bytes(8, "little"))
        h.update(data)
    return h.hexdigest()[:16]


def get_tokenizer(spec: str, train_texts: Sequence[str], vocab_size: int) -> TextTokenizer:
    """The tokenizer a task asks for: "bpe", a BPE of `vocab_size` trained on `train_texts` and cached by a
    hash of the texts and the size; else a tokenizer.json file or a directory holding one (its own size)."""
    if spec != "bpe":
        return TextTokenizer.load(spec)
    import tokenizers

    key = f"bpe-{vocab_size}-{texts_fingerprint(train_texts)}-{tokenizers.__version__}"
    path = cache_dir() / "tokenizers" / f"{key}.json"
    if path.is_file():
        return TextTokenizer.load(path)
    tok = train_bpe(train_texts, vocab_size)
    path.parent.mkdir(parents=True, exist_ok=True)
    tok.save(path)
    return tok


def encode_documents(tok: TextTokenizer, documents: Sequence[str], chunk: int = 1000) -> np.ndarray:
    """All documents as one token stream, each followed by EOS: int32 (n_tokens,). Encoded `chunk` documents
    at a time, with a progress bar on a terminal for a large corpus (minutes, once: the stream is cached)."""
    from tqdm.auto import trange

    pieces = [np.zeros(0, dtype=np.int32)]
    quiet = True if len(documents) <= 20 * chunk else None  # None: a bar only on a terminal
    for start in trange(0, len(documents), chunk, desc="tokenizing", disable=quiet):
        for ids in tok.encode_batch(documents[start : start + chunk]):
            pieces.append(np.asarray([*ids, tok.eos_id], dtype=np.int32))
    return np.concatenate(pieces)
