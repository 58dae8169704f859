"""Which code this is: the package version and, in a git checkout, the commit.

In a module of its own so that any module can read them without importing
the package's `__init__` (which imports everything).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

__version__ = "0.3.0"

DISTRIBUTION = "mixit-transformers"
"""The name mixit is installed by (`pip install mixit-transformers`). The import name and the command stay
`mixit`; the distribution named `mixit` on PyPI is an unrelated mixin library that also installs a `mixit`
module, so the two cannot share an environment."""


def install_hint(extra: str | None = None) -> str:
    """The command that installs mixit with the optional dependencies `extra` (pyproject.toml's
    optional-dependencies): install_hint("hf") is "pip install 'mixit-transformers[hf]'"."""
    return f"pip install '{DISTRIBUTION}[{extra}]'" if extra else f"pip install {DISTRIBUTION}"


COMMIT_VARIABLE = "MIXIT_COMMIT"
"""Names the commit of a copy of a source tree sent to another machine (`git_commit`)."""


def git_commit() -> str | None:
    """The commit of the mixit source tree: the environment variable MIXIT_COMMIT where it is set (a copy of a
    checkout sent to another machine, whose git history, if it came along, may be an older one); else, in a git
    checkout, its HEAD, with "-dirty" appended when tracked files have uncommitted changes; else None."""
    named = os.environ.get(COMMIT_VARIABLE)
    if named:
        return named
    here = Path(__file__).parent
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=5)
        if head.returncode != 0 or not head.stdout.strip():
            return None
        status = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no", "."],
            cwd=here,
            capture_output=True,
            text=True,
            timeout=5,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    dirty = status.returncode == 0 and bool(status.stdout.strip())
    return head.stdout.strip() + ("-dirty" if dirty else "")


PROTOCOL = "docs/protocol.md"
"""The pre-registered protocol of the paper study, in a checkout: its findings, thresholds, grids, budgets, seeds and
verdict rule."""


def protocol_commit() -> str | None:
    """The commit that last changed `PROTOCOL`, in a git checkout (the report names it, so a reader can see the
    protocol was committed before the runs it judges); None outside one."""
    root = Path(__file__).resolve().parents[2]
    if not (root / PROTOCOL).exists():
        return None
    try:
        log = subprocess.run(
            ["git", "log", "-1", "--format=%H", "--", PROTOCOL], cwd=root, capture_output=True, text=True, timeout=5
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return (log.stdout.strip() or None) if log.returncode == 0 else None
