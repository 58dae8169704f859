"""Small synthetic text data for the real-text tests (written to a temporary directory)."""

import json
import random

WORDS = (
    "the cat sat on a mat while one dog ran far away and then came back home to eat some food "
    "with its friend who was very happy that day"
).split()
POSITIVE = "good great wonderful superb lovely".split()
NEGATIVE = "bad awful terrible poor dull".split()
FILLER = "the movie was plot acting and a story with some scenes in it".split()


def english_like(n_docs: int = 200, seed: int = 0) -> list[str]:
    """Documents of three paragraphs of random words from a small vocabulary."""
    rng = random.Random(seed)
    return [
        "\n".join(" ".join(rng.choice(WORDS) for _ in range(rng.randint(20, 50))) + "." for _ in range(3))
        for _ in range(n_docs)
    ]


def write_text_corpus(path, n_docs: int = 200, seed: int = 0):
    """A .txt file: documents separated by blank lines (each a document of the local loader)."""
    docs = english_like(n_docs, seed)
    path.write_text("\n\n".join(d.replace("\n", " ") for d in docs))
    return path


def sentiment_rows(n: int = 1000, seed: int = 0) -> list[dict]:
    """Texts whose label is given by the one sentiment word they contain."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        label = rng.randint(0, 1)
        words = [rng.choice(FILLER) for _ in range(rng.randint(3, 15))]
        words.insert(rng.randint(0, len(words)), rng.choice(POSITIVE if label else NEGATIVE))
        rows.append({"text": " ".join(words), "label": label})
    return rows


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path
