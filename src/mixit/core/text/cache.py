"""Where everything mixit caches lives: trained tokenizers, token streams,
and the Hugging Face datasets it downloads or converts.

``$MIXIT_CACHE`` if set, else ``$XDG_CACHE_HOME/mixit``, else ``~/.cache/mixit``:

    tokenizers/     trained BPE tokenizers
    tokens/         token streams of tokenized corpora
    hf-datasets/    Hugging Face `datasets` files (hub downloads, Arrow copies of local files)

Everything here can be deleted at any time (``rm -r`` the directory): it is
rebuilt on demand, and a run directory never depends on it (it keeps its own
tokenizer).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np


def cache_dir() -> Path:
    if os.environ.get("MIXIT_CACHE"):
        return Path(os.environ["MIXIT_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "mixit"


def hf_cache_dir() -> Path:
    """Where Hugging Face `datasets` keeps what mixit loads through it."""
    return cache_dir() / "hf-datasets"


def load_or_build_array(name: str, build) -> np.ndarray:
    """The array cached as `name`.npy, or `build()` saved there first (atomically)."""
    path = cache_dir() / "tokens" / f"{name}.npy"
    if path.is_file():
        return np.load(path)
    array = build()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + f".{os.getpid()}.tmp.npy")
    np.save(tmp, array)
    os.replace(tmp, path)
    return array
