"""Named text datasets for the real-text tasks, offline by default.

    load_corpus("english")                  # embedded public-domain English (lm default)
    load_corpus("wikitext-103")             # Hugging Face hub, when reachable
    load_corpus("wikitext-103", data_dir="/data/wikitext")   # a local copy of the hub repository
    load_corpus("path/to/texts/")           # local .txt/.jsonl/.json/.parquet/.csv/.tsv files
    load_labelled("movies")                 # embedded movie snippets (sentiment default)
    load_labelled("yelp_polarity")

Every loader returns a `TextDataset`: a train and a held-out split of documents (and labels, for
classification). The held-out split is the source's own where it has one (wikitext validation, yelp test,
local files named train / validation / test); otherwise a document is held out when a hash of its text falls
below the held-out fraction (`held_out`), so the split is the same on every machine and identical documents
land on the same side.

Embedded data (``mixit/data/``, rebuilt by scripts/build_text_data.py; see PROVENANCE.md there): six Jane
Austen novels, Moby Dick and the King James Bible, one document per chapter; and 10,605 Rotten Tomatoes
snippets with mean human sentiment scores in [-4, 4] (Hutto & Gilbert 2014), labelled positive when the score
is above 0 and negative below (score exactly 0: dropped). They need nothing beyond the base install.

Hub datasets and local files are read by Hugging Face `datasets` (``pip install 'mixit-transformers[hf]'``),
which keeps its Arrow copies under the mixit cache (`hf_cache_dir`). Before contacting the hub we check in at
most 3 s that huggingface.co is reachable, so an offline machine gets a one-line error instead of a long retry
loop; with HF_HUB_OFFLINE=1 or HF_DATASETS_OFFLINE=1 only the local datasets cache is tried.
"""

from __future__ import annotations

import csv
import glob
import hashlib
import io
import json
import lzma
import os
import re
import socket
import warnings
from collections.abc import Iterable
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from mixit.core.text.cache import hf_cache_dir
from mixit.errors import MixitWarning, UsageError, require
from mixit.version import install_hint

HUB_HOST = "huggingface.co"
FORMATS = {".txt": "text", ".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv", ".tsv": "csv"}
"""The `datasets` builder that reads each local file suffix."""


@dataclass
class TextSplit:
    texts: list[str]
    labels: list[int] | None = None  # classification only
    skipped: int = 0  # empty texts left out when reading

    def __len__(self) -> int:
        return len(self.texts)


@dataclass
class TextDataset:
    name: str
    train: TextSplit
    test: TextSplit  # the held-out split: validation (lm) or test (sentiment)
    info: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class HubSpec:
    """How one hub dataset is laid out and read."""

    repo: str
    config: str | None
    splits: dict[str, str]  # our split ("train", "test") -> hub split name
    local_dir: str  # the folder of the config's parquet files in a local copy of the repository
    label_column: str | None = None
    wikitext_articles: bool = False  # rows are lines; rebuild articles from their " = Title = " headings
    default_max_documents: int = 0  # 0: all; else stream only this many


HUB: dict[str, HubSpec] = {
    "wikitext-103": HubSpec(
        "Salesforce/wikitext",
        "wikitext-103-raw-v1",
        {"train": "train", "test": "validation"},
        "wikitext-103-raw-v1",
        wikitext_articles=True,
    ),
    "fineweb-edu": HubSpec(
        "HuggingFaceFW/fineweb-edu",
        "sample-10BT",
        {"train": "train"},
        "sample/10BT",
        default_max_documents=100_000,
    ),
    "yelp_polarity": HubSpec(
        "fancyzhx/yelp_polarity",
        "plain_text",
        {"train": "train", "test": "test"},
        "plain_text",
        label_column="label",
    ),
}
LM_CORPORA = ("english", "wikitext-103", "fineweb-edu")
"""The language-modelling corpora by name; the first is embedded in the package, the others are read from the hub."""
LABELLED = ("movies", "yelp_polarity")
"""The labelled datasets by name; the first is embedded in the package, the others are read from the hub."""
LABEL_CLASSES = {"movies": 2, "yelp_polarity": 2}
"""Classes of the named labelled datasets: both are binary (positive or negative)."""

EMBEDDED_MIN_WORDS = {"english": 27_000, "movies": 15_000}
"""At least this many distinct pre-tokenized words of two bytes or more (see `tokenizer.bpe_reaches`) are in
the training split of each embedded dataset when it is read whole with a held-out fraction of at most
EMBEDDED_MAX_HELD_OUT (27,767 and 15,212 at 0.5; tests/test_text_data.py recounts them). A lower fraction
only adds texts: a text is held out when its hash falls below the fraction (`held_out`)."""
EMBEDDED_MAX_HELD_OUT = 0.5


# -- splitting ---------------------------------------------------------------
def held_out(text: str, fraction: float) -> bool:
    """Whether `text` belongs to the held-out split: its hash, read as a number in [0, 1), is below `fraction`."""
    digest = hashlib.sha256(text.encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < fraction


def hash_split(texts: list[str], labels: list[int] | None, fraction: float) -> tuple[TextSplit, TextSplit]:
    """The texts (and labels) split by `held_out` into a training and a held-out split, each in input order."""
    if not 0 < fraction < 1:
        raise UsageError(f"the held-out fraction must be in (0, 1), got {fraction}")
    held = [held_out(text, fraction) for text in texts]

    def side(is_held: bool) -> TextSplit:
        keep = [i for i, h in enumerate(held) if h == is_held]
        return TextSplit([texts[i] for i in keep], None if labels is None else [labels[i] for i in keep])

    return side(False), side(True)


def _limit(split: TextSplit, max_documents: int) -> TextSplit:
    if max_documents <= 0 or len(split) <= max_documents:
        return split
    return TextSplit(split.texts[:max_documents], None if split.labels is None else split.labels[:max_documents])


# -- embedded data -----------------------------------------------------------
def _embedded(name: str) -> str:
    path = resources.files("mixit") / "data" / name
    try:
        return lzma.decompress(path.read_bytes()).decode()
    except FileNotFoundError:
        raise UsageError(
            f"embedded data file mixit/data/{name} is missing from this installation; "
            f"rebuild it with scripts/build_text_data.py"
        ) from None


def english_documents() -> list[dict[str, str]]:
    """The embedded English corpus: dicts with source, title and text, one per chapter."""
    return [json.loads(line) for line in _embedded("english.jsonl.xz").splitlines() if line.strip()]


def movie_snippets() -> tuple[list[str], list[int]]:
    """The embedded movie snippets with a nonzero score: texts, labels (1 = score > 0)."""
    rows = csv.DictReader(io.StringIO(_embedded("movie_snippets.tsv.xz")), delimiter="\t", quoting=csv.QUOTE_NONE)
    scored = [(row["text"], float(row["score"])) for row in rows]
    return [text for text, score in scored if score], [int(score > 0) for _, score in scored if score]


# -- labels ------------------------------------------------------------------
MAX_CLASSES = 100_000
"""Labels are class ids in [0, MAX_CLASSES): a label sizes the classifier head and the label counts, so a
stray huge one is refused before anything is allocated."""


def labels_of(values: Iterable[Any], where: str) -> list[int]:
    """The class labels `values`, each an integer in [0, MAX_CLASSES) or a float or string that is exactly one;
    else a UsageError naming `where` and the first bad one."""
    labels = []
    for value in values:
        try:
            number = float(value) if isinstance(value, str | float) else value
        except ValueError:
            number = None
        if isinstance(number, float) and number.is_integer():
            number = int(number)
        if not (isinstance(number, int) and not isinstance(number, bool) and 0 <= number < MAX_CLASSES):
            raise UsageError(
                f"{where}: 'label' must hold integers in [0, {MAX_CLASSES:,}) (class ids 0, 1, ...), found {value!r}"
            )
        labels.append(number)
    return labels


# -- Hugging Face datasets ---------------------------------------------------
def _datasets():
    datasets = require(
        "datasets",
        "hub datasets and local files are read through Hugging Face `datasets`, which is not installed; "
        f"{install_hint('hf')} (or use the embedded default)",
    )
    datasets.disable_progress_bars()
    datasets.logging.set_verbosity(datasets.logging.CRITICAL)  # a failed read is our one-line refusal, not a log
    return datasets


def _offline() -> bool:
    return any(
        os.environ.get(v, "").strip().lower() in ("1", "true", "yes", "on")
        for v in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")
    )


def hub_reachable(timeout: float = 3.0) -> bool:
    """Whether a TCP connection to the hub opens within `timeout` seconds."""
    try:
        socket.create_connection((HUB_HOST, 443), timeout=timeout).close()
        return True
    except OSError:
        return False


def _first_line(error: BaseException) -> str:
    """An exception as one short line (`datasets` wraps the reader's error as the cause)."""
    error = error.__cause__ or error
    text = " ".join(str(error).split())
    return text[:200] if text else type(error).__name__


def _wikitext_articles(lines: list[str]) -> list[str]:
    """Wikitext rows (one per line) regrouped into articles at their level-1 headings ' = Title = '."""
    heading = re.compile(r"^ = [^=].* = $")
    articles: list[list[str]] = []
    for line in lines:
        if heading.match(line.rstrip("\n")) or not articles:
            articles.append([])
        articles[-1].append(line)
    return [text for text in ("".join(a).strip() for a in articles) if text]


def _hub_split(table, spec: HubSpec, max_documents: int) -> TextSplit:
    """The documents (and labels) of one split of a hub dataset."""
    columns = ["text"] + ([spec.label_column] if spec.label_column else [])
    missing = [c for c in columns if c not in table.column_names]
    if missing:
        raise UsageError(f"{spec.repo}: expected a {missing[0]!r} column, found {', '.join(table.column_names)}")
    texts = list(table["text"])
    if spec.wikitext_articles:
        return _limit(TextSplit(_wikitext_articles(texts)), max_documents)
    labels = labels_of(table[spec.label_column], spec.repo) if spec.label_column else None
    return _limit(TextSplit(texts, labels), max_documents)


def load_hub(
    name: str, data_dir: str | None = None, max_documents: int = 0, held_out_fraction: float = 0.05
) -> TextDataset:
    """Hub dataset `name` (a key of HUB), from the hub or from `data_dir`, a
    local copy of its repository (the layout `huggingface-cli download` makes)."""
    spec = HUB[name]
    ds_lib = _datasets()
    max_documents = max_documents or spec.default_max_documents
    local = Path(data_dir or ".", spec.local_dir)
    if data_dir and not local.is_dir():
        raise UsageError(f"data_dir {data_dir} has no folder {spec.local_dir} (a local copy of {spec.repo} has one)")
    if not data_dir and not _offline() and not hub_reachable():
        raise UsageError(
            f"dataset {name} ({spec.repo}) needs the Hugging Face hub, and {HUB_HOST} cannot be "
            f"reached from here; pass -p data_dir=LOCAL_COPY, or use the embedded default"
        )
    source = str(local) if data_dir else f"hf://{spec.repo}/{spec.config}"
    stream = not data_dir and spec.default_max_documents > 0  # a sample of a very large dataset: only what is used
    try:  # a local copy's splits are told by its file names (train-*, validation-*, test-*; else all train)
        if data_dir:
            loaded = ds_lib.load_dataset("parquet", data_dir=str(local), cache_dir=str(hf_cache_dir()))
        else:
            loaded = ds_lib.load_dataset(spec.repo, spec.config, streaming=stream, cache_dir=str(hf_cache_dir()))
        missing = [hub for hub in spec.splits.values() if hub not in loaded]
        if missing:
            raise ValueError(f"it has no {missing[0]} split")
        tables = {ours: loaded[hub] for ours, hub in spec.splits.items()}
        if stream:
            tables = {ours: ds_lib.Dataset.from_list(list(t.take(max_documents))) for ours, t in tables.items()}
    except Exception as e:  # datasets raises many kinds (ConnectionError, FileNotFoundError, ValueError...)
        raise UsageError(
            f"dataset {name} ({source}) could not be loaded ({_first_line(e)}); "
            f"pass -p data_dir=LOCAL_COPY, or use the embedded default"
        ) from None
    train = _hub_split(tables["train"], spec, max_documents)
    if "test" in tables:
        test = _hub_split(tables["test"], spec, 0)
        split_rule = f"the source's own {spec.splits['test']} split"
    else:
        train, test = hash_split(train.texts, train.labels, held_out_fraction)
        split_rule = f"hash split, held-out fraction {held_out_fraction}"
    return TextDataset(name, train, test, {"source": source, "split": split_rule})


# -- local files -------------------------------------------------------------
MAX_DEPTH = 8
MAX_FILES = 10_000
SPECIAL_FILESYSTEMS = ("/proc", "/sys", "/dev", "/run")


def _local_files(root: Path) -> list[Path]:
    """The readable text files of a file or directory, walked to at most MAX_DEPTH levels and
    MAX_FILES files, never into the kernel's special filesystems."""
    resolved = root.resolve()
    if any(resolved == Path(s) or Path(s) in resolved.parents for s in SPECIAL_FILESYSTEMS):
        raise UsageError(f"{root} is on a special filesystem ({', '.join(SPECIAL_FILESYSTEMS)}); give a data directory")
    files, seen = [], 0
    if root.is_file():
        files = [root] if root.suffix in FORMATS else []
    for here, dirs, names in os.walk(root, followlinks=False):  # nothing when root is a file
        depth = len(Path(here).relative_to(root).parts)
        dirs[:] = [d for d in dirs if depth < MAX_DEPTH and str(Path(here, d).resolve()) not in SPECIAL_FILESYSTEMS]
        seen += len(names)
        if seen > MAX_FILES:
            raise UsageError(f"{root} holds more than {MAX_FILES:,} files; give a directory of text files")
        files += [Path(here, name) for name in names if Path(name).suffix in FORMATS]
    if not files:
        raise UsageError(
            f"{root}: no readable text files; allowed: {', '.join(FORMATS)} (a file, or a directory of them)"
        )
    return sorted(files)


def _split_of(path: Path, root: Path) -> str | None:
    """'train' or 'test' when a path names its split (train / validation, valid, val, dev, test), else None."""
    rel = str(path.relative_to(root)).lower() if root.is_dir() else path.name.lower()
    if re.search(r"(^|[^a-z])train", rel):
        return "train"
    if re.search(r"(^|[^a-z])(validation|valid|val|dev|test)", rel):
        return "test"
    return None


def _read_local(path: Path, labelled: bool) -> TextSplit:
    """Documents (and labels) of one local file, read by `datasets` (`FORMATS`).

    .txt: one document per paragraph block (text between blank lines); .jsonl/.json/.parquet: a 'text' field
    per record (a .json file may also hold a mapping of columns); .csv/.tsv: a header with a 'text' column.
    Labelled data also needs an integer 'label'. Empty texts are skipped, and counted in `TextSplit.skipped`.
    """
    if path.suffix == ".txt" and labelled:
        raise UsageError(
            f"{path}: a .txt file has no labels; use .jsonl, .json, .parquet, .csv or .tsv "
            "with 'text' and 'label' columns"
        )
    builder = FORMATS[path.suffix]
    options: dict[str, dict[str, Any]] = {
        "text": {"sample_by": "document", "encoding_errors": "replace"},  # paragraphs are cut below
        # Cells as written: "NA" and numbers in the text column stay text, an empty cell is an empty text.
        "csv": {"sep": "\t" if path.suffix == ".tsv" else ",", "converters": {"text": str}, "keep_default_na": False},
    }
    if not path.stat().st_size:  # nothing to read (datasets refuses an empty file)
        return TextSplit([])
    ds_lib = _datasets()
    try:  # a file name is not a pattern: escape the glob characters `datasets` would expand
        table = ds_lib.load_dataset(
            builder,
            data_files=glob.escape(str(path)),
            split="train",
            cache_dir=str(hf_cache_dir()),
            **options.get(builder, {}),
        )
    except Exception as e:
        raise UsageError(f"{path} could not be read ({_first_line(e)})") from None
    columns = table.to_dict()
    if builder == "text":
        blocks = re.split(r"\n\s*\n", "".join(columns["text"]))
        return TextSplit([b.strip() for b in blocks if b.strip()])
    if path.suffix == ".json" and len(table) == 1 and isinstance(columns.get("text", [None])[0], list):
        columns = {name: values[0] for name, values in columns.items()}  # one mapping of columns
    missing = [c for c in ("text", "label")[: 1 + labelled] if c not in columns]
    if missing:
        raise UsageError(f"{path}: its records have no {missing[0]!r} field (found: {', '.join(columns)})")
    bad = next((t for t in columns["text"] if t is not None and not isinstance(t, str)), None)
    if bad is not None:
        raise UsageError(f"{path}: 'text' must hold strings, found {bad!r}")
    kept = [i for i, text in enumerate(columns["text"]) if text is not None and text.strip()]
    labels = labels_of((columns["label"][i] for i in kept), str(path)) if labelled else None
    return TextSplit([columns["text"][i] for i in kept], labels, skipped=len(columns["text"]) - len(kept))


def _concat(splits: list[TextSplit]) -> TextSplit:
    """One split holding the documents (and labels) of several, in order."""
    return TextSplit(
        [t for s in splits for t in s.texts],
        None if splits[0].labels is None else [y for s in splits for y in s.labels or ()],
        skipped=sum(s.skipped for s in splits),
    )


def load_local(
    path: str | Path, labelled: bool, max_documents: int = 0, held_out_fraction: float = 0.05
) -> TextDataset:
    """A local file or directory; files whose path names a split (train, validation, test) are used as that split."""
    root = Path(path)
    by_split: dict[str | None, list[TextSplit]] = {}
    for f in _local_files(root):
        by_split.setdefault(_split_of(f, root), []).append(_read_local(f, labelled))
    if set(by_split) == {"train", "test"}:
        train, test = _limit(_concat(by_split["train"]), max_documents), _concat(by_split["test"])
        rule = "the files' own train / held-out split"
    else:
        everything = _limit(_concat([s for splits in by_split.values() for s in splits]), max_documents)
        train, test = hash_split(everything.texts, everything.labels, held_out_fraction)
        rule = f"hash split, held-out fraction {held_out_fraction}"
    if not train.texts or not test.texts:
        raise UsageError(
            f"{root}: the {'held-out' if train.texts else 'training'} split is empty; "
            f"give more documents or another held-out fraction"
        )
    skipped = sum(s.skipped for splits in by_split.values() for s in splits)
    if skipped:
        warnings.warn(f"{root}: skipped {skipped} empty text(s)", MixitWarning, stacklevel=2)
    info = {"source": str(root.resolve()), "split": rule, "empty_texts_skipped": skipped}
    return TextDataset(str(root), train, test, info)


def known_min_words(name: str, labelled: bool, max_documents: int, held_out_fraction: float) -> int:
    """A lower bound on the distinct words of two bytes or more in the training split that `load_labelled`
    (`labelled`) or `load_corpus` reads for `name` with these settings, known without reading it:
    EMBEDDED_MIN_WORDS for its embedded dataset read whole with a held-out fraction of at most
    EMBEDDED_MAX_HELD_OUT, else 0 (not known)."""
    embedded = "movies" if labelled else "english"
    if name == embedded and max_documents == 0 and 0 < held_out_fraction <= EMBEDDED_MAX_HELD_OUT:
        return EMBEDDED_MIN_WORDS[name]
    return 0


# -- entry points ------------------------------------------------------------
def load_corpus(
    name: str = "english", data_dir: str | None = None, max_documents: int = 0, held_out_fraction: float = 0.05
) -> TextDataset:
    """Documents for language modelling: a name of LM_CORPORA or a local path."""
    return _load(name, False, data_dir, max_documents, held_out_fraction)


def load_labelled(
    name: str = "movies", data_dir: str | None = None, max_documents: int = 0, held_out_fraction: float = 0.2
) -> TextDataset:
    """Texts with integer labels for classification: a name of LABELLED or a local path."""
    return _load(name, True, data_dir, max_documents, held_out_fraction)


def _load(name: str, labelled: bool, data_dir: str | None, max_documents: int, held_out_fraction: float) -> TextDataset:
    """`name` as the embedded data, a hub dataset of its catalogue (LABELLED or LM_CORPORA), or a local path."""
    catalogue = LABELLED if labelled else LM_CORPORA
    if name == catalogue[0]:  # the embedded one
        file = "movie_snippets.tsv.xz" if labelled else "english.jsonl.xz"
        texts, labels = movie_snippets() if labelled else ([d["text"] for d in english_documents()], None)
        train, test = hash_split(texts, labels, held_out_fraction)
        info = {"source": f"embedded mixit/data/{file}", "split": f"hash split, held-out fraction {held_out_fraction}"}
        return TextDataset(name, _limit(train, max_documents), test, info)
    if name in HUB and name in catalogue:
        return load_hub(name, data_dir, max_documents, held_out_fraction)
    if os.sep in name or "/" in name or Path(name).suffix in FORMATS or Path(name).exists():
        return load_local(name, labelled=labelled, max_documents=max_documents, held_out_fraction=held_out_fraction)
    what = "dataset" if labelled else "corpus"
    suffixes = [suffix for suffix in FORMATS if not (labelled and FORMATS[suffix] == "text")]  # text has no labels
    raise UsageError(
        f"unknown {what} {name!r}; choose one of: {', '.join(catalogue)}, or a local file or directory "
        f"({', '.join(suffixes)})" + (" with text and label columns" if labelled else "")
    )
