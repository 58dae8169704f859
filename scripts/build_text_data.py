"""Rebuild the text data files embedded in the mixit package (src/mixit/data/).

Outputs, all written into --out-dir (default: src/mixit/data):

* english.jsonl.xz -- the default English corpus: xz-compressed JSON Lines, one
  chapter-sized document per line, {"source": ..., "title": ..., "text": ...}:
    - Jane Austen's six novels, one document per chapter (Debian r-cran-janeaustenr),
    - Herman Melville's Moby-Dick, one document per chapter plus Etymology,
      Extracts and Epilogue (Debian r-cran-tokenizers, object `mobydick`),
    - the King James Bible, one document per book chapter, one verse per
      paragraph, without verse numbers (Debian bible-kjv-text, read through the
      `bible` program of Debian bible-kjv).
  Text is normalised: the lines of a paragraph are joined with single spaces
  (runs of whitespace collapse to one space), paragraphs are separated by one
  blank line, and Project Gutenberg headers/footers, title pages, volume
  headings, end markers and modern editorial notes are dropped.
* movie_snippets.tsv.xz -- 10,605 Rotten Tomatoes review snippets with the
  mean human sentiment rating in [-4, 4] from Hutto & Gilbert (ICWSM 2014), as
  shipped in the vaderSentiment 3.3.2 source distribution: xz-compressed TSV
  with header `id<TAB>score<TAB>text`, original order, original score strings.
* PROVENANCE.md -- where the two files come from: package versions and
  sha256 sums of the inputs, licences, counts and sha256 sums of the outputs.

Nothing is installed system-wide: Debian packages are fetched with
`apt-get download` and unpacked with `dpkg-deb -x` into a temporary directory
that is removed at the end; the PyPI sdist is fetched with `pip download`.
The R data are read in pure Python with the PyPI package `rdata`; if it cannot
be imported, it is pip-installed into the temporary directory for this run only
(mixit itself never imports rdata).

The output is deterministic: running the script again with the same input
package versions produces byte-identical files.

Usage:
    .venv/bin/python scripts/build_text_data.py [--out-dir DIR]
"""

from __future__ import annotations

import argparse
import hashlib
import html
import importlib
import io
import json
import lzma
import math
import os
import re
import statistics
import subprocess
import sys
import tarfile
import tempfile
import warnings
import zlib
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT_DIR = REPO_ROOT / "src" / "mixit" / "data"

# Debian packages and the versions this script was written against. A different
# version is accepted with a warning (the output may then differ).
DEBIAN_PACKAGES = {
    "r-cran-janeaustenr": "1.0.0-1",
    "r-cran-tokenizers": "0.3.0-1",
    "bible-kjv-text": "4.38",
    "bible-kjv": "4.38",
}
VADER_NAME = "vaderSentiment"
VADER_VERSION = "3.3.2"

XZ_PRESET = 9 | lzma.PRESET_EXTREME

# (R object name in janeaustenr, source id, novel title, expected chapter count),
# in order of publication, as janeaustenr's austen_books() lists them.
AUSTEN_NOVELS = [
    ("sensesensibility", "austen/sense-and-sensibility", "Sense and Sensibility", 50),
    ("prideprejudice", "austen/pride-and-prejudice", "Pride and Prejudice", 61),
    ("mansfieldpark", "austen/mansfield-park", "Mansfield Park", 48),
    ("emma", "austen/emma", "Emma", 55),
    ("northangerabbey", "austen/northanger-abbey", "Northanger Abbey", 31),
    ("persuasion", "austen/persuasion", "Persuasion", 24),
]

# The 66 books in the order the `bible` program prints them (Genesis..Revelation).
KJV_BOOKS = [
    "Genesis",
    "Exodus",
    "Leviticus",
    "Numbers",
    "Deuteronomy",
    "Joshua",
    "Judges",
    "Ruth",
    "1 Samuel",
    "2 Samuel",
    "1 Kings",
    "2 Kings",
    "1 Chronicles",
    "2 Chronicles",
    "Ezra",
    "Nehemiah",
    "Esther",
    "Job",
    "Psalms",
    "Proverbs",
    "Ecclesiastes",
    "Song of Solomon",
    "Isaiah",
    "Jeremiah",
    "Lamentations",
    "Ezekiel",
    "Daniel",
    "Hosea",
    "Joel",
    "Amos",
    "Obadiah",
    "Jonah",
    "Micah",
    "Nahum",
    "Habakkuk",
    "Zephaniah",
    "Haggai",
    "Zechariah",
    "Malachi",
    "Matthew",
    "Mark",
    "Luke",
    "John",
    "Acts",
    "Romans",
    "1 Corinthians",
    "2 Corinthians",
    "Galatians",
    "Ephesians",
    "Philippians",
    "Colossians",
    "1 Thessalonians",
    "2 Thessalonians",
    "1 Timothy",
    "2 Timothy",
    "Titus",
    "Philemon",
    "Hebrews",
    "James",
    "1 Peter",
    "2 Peter",
    "1 John",
    "2 John",
    "3 John",
    "Jude",
    "Revelation",
]
KJV_VERSES = 31102
KJV_CHAPTERS = 1189


class BuildError(Exception):
    """A failure reported to the user as a single line."""


def log(message: str) -> None:
    print(f"[build_text_data] {message}", flush=True)


def run(cmd: list[str], what: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """Run a command, raising BuildError with a one-line reason if it fails."""
    try:
        proc = subprocess.run(cmd, cwd=cwd, stdin=subprocess.DEVNULL, capture_output=True, check=False)
    except FileNotFoundError:
        raise BuildError(f"{what} failed: command not found: {cmd[0]}") from None
    if proc.returncode != 0:
        lines = [ln.strip() for ln in proc.stderr.decode("utf-8", "replace").splitlines() if ln.strip()]
        errors = [ln for ln in lines if ln.startswith(("E:", "ERROR", "error"))]
        reason = (errors or lines or [f"exit status {proc.returncode}"])[-1]
        raise BuildError(f"{what} failed: {reason}")
    return proc


def sha256_file(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# ---------------------------------------------------------------- fetching


def fetch_debs(tmp: Path) -> dict[str, dict]:
    """apt-get download the Debian packages and unpack each into tmp/root/<package>."""
    debs_dir = tmp / "debs"
    debs_dir.mkdir()
    os.chmod(debs_dir, 0o755)  # lets apt's unprivileged _apt user write here when run as root
    names = list(DEBIAN_PACKAGES)
    log(f"apt-get download {' '.join(names)}")
    run(["apt-get", "download", *names], f"apt-get download {' '.join(names)}", cwd=debs_dir)
    info = {}
    for name in names:
        found = sorted(debs_dir.glob(f"{name}_*.deb"))
        if len(found) != 1:
            raise BuildError(f"apt-get download {name} failed: expected one {name}_*.deb, found {len(found)}")
        deb = found[0]
        version = run(["dpkg-deb", "-f", str(deb), "Version"], f"dpkg-deb -f {deb.name}").stdout.decode().strip()
        if version != DEBIAN_PACKAGES[name]:
            log(f"warning: {name} is version {version}, this script was written for {DEBIAN_PACKAGES[name]}")
        root = tmp / "root" / name
        root.mkdir(parents=True)
        run(["dpkg-deb", "-x", str(deb), str(root)], f"dpkg-deb -x {deb.name}")
        info[name] = {"deb": deb.name, "version": version, "sha256": sha256_file(deb), "root": root}
        log(f"  {deb.name}: version {version}")
    return info


def fetch_vader_sdist(tmp: Path) -> dict:
    """pip download the vaderSentiment source distribution (no wheels, no dependencies)."""
    dest = tmp / "sdist"
    dest.mkdir()
    spec = f"{VADER_NAME}=={VADER_VERSION}"
    log(f"pip download --no-binary :all: --no-deps {spec}")
    run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--quiet",
            "--no-binary",
            ":all:",
            "--no-deps",
            "--dest",
            str(dest),
            spec,
        ],
        f"pip download {spec}",
    )
    found = sorted(p for p in dest.iterdir() if p.name.endswith((".tar.gz", ".zip")))
    if len(found) != 1:
        raise BuildError(
            f"pip download {spec} failed: expected one sdist in the download directory, found {len(found)}"
        )
    log(f"  {found[0].name}")
    return {"path": found[0], "file": found[0].name, "sha256": sha256_file(found[0])}


def import_rdata(tmp: Path):
    """Import rdata, pip-installing it into tmp for this run if it is not importable."""
    try:
        return importlib.import_module("rdata")
    except ImportError:
        pass
    target = tmp / "pylib"
    log("rdata is not importable here: pip install rdata into the temporary directory")
    run([sys.executable, "-m", "pip", "install", "--quiet", "--target", str(target), "rdata"], "pip install rdata")
    sys.path.insert(0, str(target))
    importlib.invalidate_caches()
    return importlib.import_module("rdata")


# ---------------------------------------------------------------- R data


def read_lazyload_db(rdata, base: Path) -> dict[str, object]:
    """Read every object of an R lazy-load database (<base>.rdx index, <base>.rdb blobs).

    The index is an ordinary .rds file: a list whose `variables` maps each name to
    (offset, length) in the .rdb file. Each blob there is a 4-byte big-endian
    uncompressed length followed by the compressed serialisation: zlib for
    compression type 1, and for types 2/3 one type byte (Z zlib, 2 bzip2, X xz,
    0 stored) before the payload.
    """
    index = rdata.read_rds(str(base.with_suffix(".rdx")))
    blob = base.with_suffix(".rdb").read_bytes()
    compressed = index.get("compressed", True)
    ctype = int(next(iter(compressed.ravel()))) if hasattr(compressed, "ravel") else int(compressed)
    objects = {}
    for name, (offset, length) in index["variables"].items():
        chunk = blob[int(offset) : int(offset) + int(length)]
        size = int.from_bytes(chunk[:4], "big")
        if ctype == 1:
            raw = zlib.decompress(chunk[4:])
        else:
            kind, payload = chunk[4:5], chunk[5:]
            if kind == b"Z":
                raw = zlib.decompress(payload)
            elif kind == b"2":
                import bz2

                raw = bz2.decompress(payload)
            elif kind == b"X":
                raw = lzma.decompress(payload)
            elif kind == b"0":
                raw = payload
            else:
                raise BuildError(f"{base.name}.rdb: unknown compression byte {kind!r} for object {name}")
        if len(raw) != size:
            raise BuildError(f"{base.name}.rdb: object {name} inflates to {len(raw)} bytes, index says {size}")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "Unknown file type: assumed RDS" for a bare serialisation
            objects[str(name)] = rdata.conversion.convert(rdata.parser.parse_data(raw))
    return objects


def as_strings(obj) -> list[str]:
    """An R character vector as a list of str (NA becomes the empty string)."""
    return ["" if x is None or (isinstance(x, float) and math.isnan(x)) else str(x) for x in list(obj)]


# ---------------------------------------------------------------- text normalisation


def paragraphs(lines: list[str]) -> list[str]:
    """Group lines into blank-line-separated paragraphs, each on one line, whitespace collapsed."""
    paras, current = [], []
    for line in lines:
        if line.strip():
            current.append(line)
        elif current:
            paras.append(" ".join(" ".join(current).split()))
            current = []
    if current:
        paras.append(" ".join(" ".join(current).split()))
    return paras


def make_doc(source: str, title: str, paras: list[str]) -> dict | None:
    text = "\n\n".join(p for p in paras if p)
    return {"source": source, "title": title, "text": text} if text else None


AUSTEN_CHAPTER = re.compile(r"^chapter\s+([ivxlc]+|\d+)\.?$", re.IGNORECASE)
AUSTEN_VOLUME = re.compile(r"^volume\s+[ivx]+\.?$", re.IGNORECASE)
AUSTEN_END = re.compile(r"^(the end|finis|a note on the text)\.?$", re.IGNORECASE)
# Bracketed notes of a later edition, e.g. "[End volume one of this edition. ...]".
EDITORIAL_NOTE = re.compile(r"^\[.*\bedition", re.IGNORECASE)


def austen_docs(lines: list[str], source: str, novel: str, expected: int) -> list[dict]:
    """Split one Austen novel into chapters, numbered 1..N through the whole novel.

    The title page (everything before the first chapter heading), volume headings,
    editorial notes of later editions and everything from the end marker on
    (THE END / FINIS, and Northanger Abbey's modern "A Note on the Text") are dropped.
    """
    chapters: list[list[str]] = []
    for para in paragraphs(lines):
        if AUSTEN_END.match(para):
            break
        if AUSTEN_CHAPTER.match(para):
            chapters.append([])
        elif chapters and not AUSTEN_VOLUME.match(para) and not EDITORIAL_NOTE.match(para):
            chapters[-1].append(para)
    if len(chapters) != expected:
        raise BuildError(f"{novel}: found {len(chapters)} chapters, expected {expected}")
    docs = [make_doc(source, f"{novel}, Chapter {i}", paras) for i, paras in enumerate(chapters, 1)]
    return [d for d in docs if d]


MD_CHAPTER = re.compile(r"^CHAPTER (\d+)\. (.+)$")
MD_SECTIONS = {  # unnumbered sections: heading paragraph -> title
    "ETYMOLOGY.": "Etymology",
    "EXTRACTS (Supplied by a Sub-Sub-Librarian).": "Extracts",
    "Epilogue": "Epilogue",
}
MD_DROP = {"EXTRACTS."}  # the second heading inside the Extracts section


def strip_gutenberg(text: str) -> str:
    """The text between the Project Gutenberg START and END marker lines."""
    start = re.search(r"^\*\*\* ?START OF (THIS|THE) PROJECT GUTENBERG EBOOK.*$", text, re.MULTILINE)
    end = re.search(r"^\*\*\* ?END OF (THIS|THE) PROJECT GUTENBERG EBOOK.*$", text, re.MULTILINE)
    if not start or not end:
        raise BuildError("mobydick: Project Gutenberg START/END markers not found")
    body = text[start.end() : end.start()]
    # The footer's first line ("End of Project Gutenberg's ...") stands before the END marker.
    return re.sub(r"^End of (the )?Project Gutenberg.*$", "", body, flags=re.MULTILINE | re.IGNORECASE)


def moby_dick_docs(text: str) -> list[dict]:
    """Split Moby-Dick into Etymology, Extracts, Chapters 1-135 and Epilogue.

    The transcriber's front matter before Etymology is dropped. A chapter heading
    may run over two lines (chapters 56, 57, 73); it is one paragraph here.
    """
    text = text.lstrip("\ufeff").replace("\r\n", "\n").replace("\r", "\n")
    sections: list[tuple[str, list[str]]] = []
    for para in paragraphs(strip_gutenberg(text).split("\n")):
        m = MD_CHAPTER.match(para)
        if m:
            number, name = int(m.group(1)), m.group(2).rstrip(".")
            if number != sum(1 for t, _ in sections if t.startswith("Chapter ")) + 1:
                raise BuildError(f"mobydick: chapter {number} out of order")
            sections.append((f"Chapter {number}: {name}", []))
        elif para in MD_SECTIONS:
            sections.append((MD_SECTIONS[para], []))
        elif sections and para not in MD_DROP:
            sections[-1][1].append(para)
    n_chapters = sum(1 for t, _ in sections if t.startswith("Chapter "))
    if n_chapters != 135 or len(sections) != 138:
        raise BuildError(f"mobydick: found {n_chapters} chapters and {len(sections)} sections, expected 135 and 138")
    docs = [make_doc("melville/moby-dick", f"Moby-Dick, {title}", paras) for title, paras in sections]
    return [d for d in docs if d]


KJV_VERSE = re.compile(r"^(\d?[A-Za-z]+)(\d+):(\d+) (.*)$")


def kjv_docs(bible_bin: Path, data_dir: Path) -> list[dict]:
    """One document per chapter of the King James Bible; one verse per paragraph, no verse numbers."""
    proc = run([str(bible_bin), "-f", "-p", str(data_dir), "Gen1:1-Rev22:21"], "running bible-kjv's bible program")
    out = proc.stdout.decode("ascii")
    abbrevs: list[str] = []
    chapters: dict[tuple[int, int], list[str]] = {}
    n_verses = 0
    for line in out.splitlines():
        if not line.strip():
            continue
        m = KJV_VERSE.match(line)
        if not m:
            raise BuildError(f"bible: unexpected output line {line[:60]!r}")
        abbrev, chapter, verse = m.group(1), int(m.group(2)), m.group(4)
        if not abbrevs or abbrevs[-1] != abbrev:
            abbrevs.append(abbrev)
        chapters.setdefault((len(abbrevs) - 1, chapter), []).append(" ".join(verse.split()))
        n_verses += 1
    if len(abbrevs) != len(KJV_BOOKS) or len(set(abbrevs)) != len(abbrevs):
        raise BuildError(f"bible: found {len(abbrevs)} books, expected {len(KJV_BOOKS)}")
    if n_verses != KJV_VERSES or len(chapters) != KJV_CHAPTERS:
        raise BuildError(
            f"bible: found {n_verses} verses in {len(chapters)} chapters, expected {KJV_VERSES} in {KJV_CHAPTERS}"
        )
    docs = []
    for (book_index, chapter), verses in chapters.items():  # insertion order = Bible order
        book = KJV_BOOKS[book_index]
        source = "kjv/" + book.lower().replace(" ", "-")
        docs.append(make_doc(source, f"{book} {chapter}", verses))
    return [d for d in docs if d]


# ---------------------------------------------------------------- movie snippets


def decode_text(raw: bytes) -> tuple[str, str]:
    """Decode as UTF-8 if valid, else as Windows-1252 (Latin-1 for bytes cp1252 leaves undefined)."""
    try:
        return raw.decode("utf-8"), "utf-8"
    except UnicodeDecodeError:
        pass
    undefined = {0x81, 0x8D, 0x8F, 0x90, 0x9D}
    return "".join(chr(b) if b in undefined else bytes([b]).decode("cp1252") for b in raw), "cp1252"


def movie_rows(sdist: Path) -> tuple[list[tuple[str, str, str]], str]:
    """(id, score, text) rows of movieReviewSnippets_GroundTruth.txt inside the sdist's inner tarball."""
    with tarfile.open(sdist) as outer:
        inner_member = next(
            (m for m in outer.getmembers() if m.name.endswith("additional_resources/hutto_ICWSM_2014.tar.gz")), None
        )
        if inner_member is None:
            raise BuildError(f"{sdist.name}: additional_resources/hutto_ICWSM_2014.tar.gz not found")
        inner_bytes = outer.extractfile(inner_member).read()
    with tarfile.open(fileobj=io.BytesIO(inner_bytes)) as inner:
        member = next((m for m in inner.getmembers() if m.name.endswith("movieReviewSnippets_GroundTruth.txt")), None)
        if member is None:
            raise BuildError("hutto_ICWSM_2014.tar.gz: movieReviewSnippets_GroundTruth.txt not found")
        raw = inner.extractfile(member).read()
    text, encoding = decode_text(raw)
    rows, seen = [], set()
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        fields = line.split("\t")
        if len(fields) < 3:
            raise BuildError(f"movieReviewSnippets_GroundTruth.txt line {lineno}: {len(fields)} fields, expected 3")
        ident, score, snippet = fields[0].strip(), fields[1].strip(), " ".join(fields[2:])
        if not ident.isdigit() or ident in seen:
            raise BuildError(f"movieReviewSnippets_GroundTruth.txt line {lineno}: bad or repeated id {ident!r}")
        if not -4.0 <= float(score) <= 4.0:
            raise BuildError(f"movieReviewSnippets_GroundTruth.txt line {lineno}: score {score} outside [-4, 4]")
        seen.add(ident)
        # One line per row: tabs/newlines and runs of spaces become one space;
        # "&amp;" (the only HTML entity in the file) is unescaped.
        snippet = " ".join(html.unescape(snippet).split())
        rows.append((ident, score, snippet))
    return rows, encoding


# ---------------------------------------------------------------- writing


def write_xz(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(lzma.compress(data, format=lzma.FORMAT_XZ, preset=XZ_PRESET))
    os.replace(tmp, path)


def write_provenance(path: Path, debs: dict, vader: dict, rdata_version: str, corpus: dict, movies: dict) -> None:
    what = {
        "r-cran-janeaustenr": "Jane Austen's six novels (R object per novel, one string per line)",
        "r-cran-tokenizers": "Moby-Dick (R object `mobydick`, one string)",
        "bible-kjv-text": "King James Bible, compressed text",
        "bible-kjv": "`bible` program, used to print the verses",
    }
    inputs = "\n".join(
        f"| {what[name]} | {name} | {debs[name]['version']} | `{debs[name]['sha256']}` |" for name in DEBIAN_PACKAGES
    )
    per_source = "\n".join(f"| {label} | {n:,} | {chars:,} |" for label, n, chars in corpus["groups"])
    text = f"""# Provenance of the embedded data

Generated by `scripts/build_text_data.py`; do not edit by hand. To rebuild
(fetches from Debian and PyPI; nothing is installed system-wide):

    .venv/bin/python scripts/build_text_data.py

With the same input package versions the rebuild is byte-identical.

## english.jsonl.xz

The default English corpus: xz-compressed JSON Lines, one chapter-sized document
per line, `{{"source": ..., "title": ..., "text": ...}}`, UTF-8. The lines of a
paragraph are joined with single spaces (runs of whitespace become one space)
and paragraphs are separated by one blank line.

- size: {corpus["size"]:,} bytes; sha256 `{corpus["sha256"]}`
- documents: {corpus["docs"]:,}; characters of text: {corpus["chars"]:,}
  (uncompressed JSON Lines: {corpus["raw_bytes"]:,} bytes)
- document length in characters: min {corpus["min"]:,}, median {corpus["median"]:,}, max {corpus["max"]:,}

| source | documents | characters |
|---|---:|---:|
{per_source}

Inputs:

| what | Debian package | version | sha256 of the .deb |
|---|---|---|---|
{inputs}

The R lazy-load data (`data/Rdata.rdx` and `data/Rdata.rdb`) were read in pure
Python with the PyPI package rdata {rdata_version}; the `bible` program ran from
the unpacked package against the unpacked `bible.data`.

How the documents were cut:

- Austen, in publication order (Sense and Sensibility, Pride and Prejudice,
  Mansfield Park, Emma, Northanger Abbey, Persuasion): one document per
  chapter, titled "<Novel>, Chapter N" with N counted through the whole novel
  (Emma's three volumes each restart at I in the source). Title pages, the
  chapter and volume headings, end markers (THE END, FINIS), bracketed notes
  of later editions and the modern "A Note on the Text" after Northanger Abbey
  are left out. Northanger Abbey's "Advertisement by the Authoress" stands
  before its first chapter and is left out with the title page.
  Underscores that mark italics in the source (`_them_`) are kept as they are.
- Moby-Dick (the Project Gutenberg eBook #2701 text that r-cran-tokenizers
  ships): the Project Gutenberg header and footer, the producer's credit and
  the transcriber's notes are removed; documents are Etymology, Extracts,
  Chapters 1-135 (titled "Moby-Dick, Chapter N: <chapter title>") and the
  Epilogue. As the dropped transcriber's note said, a capital L stands for the
  pound sign in chapters 24, 89 and 90.
- King James Bible: one document per chapter, titled "<Book> N", source
  `kjv/<book>`; each verse is one paragraph, without its verse number.

Licences: the texts of Austen's novels (1811-1818), Moby-Dick (1851) and the
King James Version (1611) are in the public domain (in the United Kingdom the
King James Version remains subject to the Crown's letters patent). The Debian
packaging is MIT for r-cran-janeaustenr (Julia Silge) and r-cran-tokenizers
(Lincoln Mullen et al.); the Bible Retrieval System in bible-kjv and
bible-kjv-text (Chip Chapin, Debian work by Matthew Vernon and others) may be
copied and modified freely, with Debian's additions under GPL-2+. The corpus
file contains only the literary texts, none of the packages' code, and none of
Project Gutenberg's licence text or trademark (janeaustenr's texts also come
from Project Gutenberg).

## movie_snippets.tsv.xz

Movie review snippets from Rotten Tomatoes with the mean sentiment rating given
by human raters on a scale from -4 (extremely negative) to +4 (extremely
positive). xz-compressed UTF-8 TSV with the header `id<TAB>score<TAB>text`,
one row per snippet in the original order; `score` is the original decimal
string. Tabs, line breaks and runs of spaces in the text became single spaces
and `&amp;` became `&`; the source file was decoded as {movies["encoding"]}.

- size: {movies["size"]:,} bytes; sha256 `{movies["sha256"]}`
- rows: {movies["rows"]:,}; score > 0: {movies["pos"]:,}; score < 0: {movies["neg"]:,}; score == 0: {movies["zero"]:,}

Input: the source distribution of {VADER_NAME} {VADER_VERSION} from PyPI
(`{vader["file"]}`, sha256 `{vader["sha256"]}`), file
`additional_resources/hutto_ICWSM_2014.tar.gz`, member
`hutto_ICWSM_2014/movieReviewSnippets_GroundTruth.txt`.

Licence: vaderSentiment is distributed under the MIT licence (Copyright (c)
2016 C.J. Hutto). The ratings come from the paper below, which should be cited
when the data are used; its README says the snippets were cut from the movie
reviews of Pang & Lee:

> Hutto, C.J. & Gilbert, E.E. (2014). VADER: A Parsimonious Rule-based Model
> for Sentiment Analysis of Social Media Text. Eighth International Conference
> on Weblogs and Social Media (ICWSM-14), Ann Arbor, MI, June 2014.
"""
    path.write_text(text, encoding="utf-8")


# ---------------------------------------------------------------- main


def build(out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="build_text_data_") as tmp_name:
        tmp = Path(tmp_name)
        os.chmod(tmp, 0o755)
        debs = fetch_debs(tmp)
        vader = fetch_vader_sdist(tmp)
        rdata = import_rdata(tmp)
        rdata_version = getattr(rdata, "__version__", "unknown")
        log(f"using rdata {rdata_version}")

        docs: list[dict] = []
        groups: list[tuple[str, list[dict]]] = []

        lib = debs["r-cran-janeaustenr"]["root"] / "usr/lib/R/site-library/janeaustenr/data/Rdata"
        austen = read_lazyload_db(rdata, lib)
        austen_all = []
        for obj_name, source, novel, expected in AUSTEN_NOVELS:
            if obj_name not in austen:
                raise BuildError(f"janeaustenr data has no object {obj_name!r} (has {sorted(austen)})")
            novel_docs = austen_docs(as_strings(austen[obj_name]), source, novel, expected)
            log(f"{novel}: {len(novel_docs)} chapters")
            austen_all += novel_docs
        groups.append(("austen/* (6 novels)", austen_all))

        lib = debs["r-cran-tokenizers"]["root"] / "usr/lib/R/site-library/tokenizers/data/Rdata"
        tokenizers_data = read_lazyload_db(rdata, lib)
        if "mobydick" not in tokenizers_data:
            raise BuildError(f"tokenizers data has no object 'mobydick' (has {sorted(tokenizers_data)})")
        md_docs = moby_dick_docs("\n".join(as_strings(tokenizers_data["mobydick"])))
        log(f"Moby-Dick: {len(md_docs)} documents")
        groups.append(("melville/moby-dick", md_docs))

        bible_bin = debs["bible-kjv"]["root"] / "usr/bin/bible"
        bible_data = debs["bible-kjv-text"]["root"] / "usr/lib"
        kjv = kjv_docs(bible_bin, bible_data)
        log(f"King James Bible: {len(kjv)} chapters")
        groups.append(("kjv/* (66 books)", kjv))

        for _, group in groups:
            docs += group
        payload = "".join(
            json.dumps({"source": d["source"], "title": d["title"], "text": d["text"]}, ensure_ascii=False) + "\n"
            for d in docs
        ).encode("utf-8")
        corpus_path = out_dir / "english.jsonl.xz"
        log(f"compressing {len(payload):,} bytes of JSON Lines (xz preset 9e)")
        write_xz(corpus_path, payload)
        lengths = [len(d["text"]) for d in docs]
        corpus = {
            "docs": len(docs),
            "chars": sum(lengths),
            "raw_bytes": len(payload),
            "min": min(lengths),
            "median": int(statistics.median(lengths)),
            "max": max(lengths),
            "size": corpus_path.stat().st_size,
            "sha256": sha256_file(corpus_path),
            "groups": [(label, len(g), sum(len(d["text"]) for d in g)) for label, g in groups],
        }
        log(
            f"wrote {corpus_path}: {corpus['docs']:,} documents, {corpus['chars']:,} characters, "
            f"{corpus['size']:,} bytes"
        )

        rows, encoding = movie_rows(vader["path"])
        tsv = "id\tscore\ttext\n" + "".join(f"{i}\t{s}\t{t}\n" for i, s, t in rows)
        movies_path = out_dir / "movie_snippets.tsv.xz"
        write_xz(movies_path, tsv.encode("utf-8"))
        scores = [float(s) for _, s, _ in rows]
        movies = {
            "rows": len(rows),
            "encoding": encoding,
            "pos": sum(s > 0 for s in scores),
            "neg": sum(s < 0 for s in scores),
            "zero": sum(s == 0 for s in scores),
            "size": movies_path.stat().st_size,
            "sha256": sha256_file(movies_path),
        }
        log(
            f"wrote {movies_path}: {movies['rows']:,} rows (decoded as {encoding}; score > 0: {movies['pos']:,}, "
            f"< 0: {movies['neg']:,}, == 0: {movies['zero']:,}), {movies['size']:,} bytes"
        )

        provenance_path = out_dir / "PROVENANCE.md"
        write_provenance(provenance_path, debs, vader, rdata_version, corpus, movies)
        log(f"wrote {provenance_path}")
    log("done")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--out-dir",
        type=Path,
        default=DEFAULT_OUT_DIR,
        help=f"where to write the files (default: {DEFAULT_OUT_DIR.relative_to(REPO_ROOT)})",
    )
    args = parser.parse_args(argv)
    try:
        build(args.out_dir.resolve())
    except BuildError as exc:
        print(f"build_text_data: error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
