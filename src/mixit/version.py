"""Which code this is: the package version and, in a git checkout, the commit.

In a module of its own so that any module can read them without importing
the package's `__init__` (which imports everything).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

__version__ = "0.2.0"


def git_commit() -> str | None:
    """The commit of the mixit source tree, if it is a git checkout, with
    "-dirty" appended when tracked files have uncommitted changes."""
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
