"""What a study directory may hold, checked before anything is written (docs/reliability.md, "Studies and reports").

    check_out(study_dir, name, fingerprint)   `mixit reproduce --out`: absent, empty, this same study, or
                                              (`grows`) this study with fewer seeds, which it continues
    load_study_record(study_dir)              study.json, its schema checked (`mixit report`, resume)
    failure_record(study_dir, run_id)         failed/<id>.json, checked
    check_report_paths(study_dir)             report.md, results.csv, checks.json and figures/ writable as such

Each refuses with one `UsageError` line naming the file and the problem, and reads only: a refused
command changes nothing in the directory.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mixit.errors import UsageError
from mixit.files import DirectoryLock, check_names, read_json
from mixit.run import Run

RECORD = "study.json"
REPORT_FILES = ("report.md", "results.csv", "checks.json")
FIGURES = "figures"
ROLES = ("final", "screen")
SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
"""A run id or an extra's name: one path component of the study directory, never `..` or a path."""


def check_out(study_dir: Path, name: str, fingerprint: str, grows: Callable[[Any], bool] | None = None) -> None:
    """Refuse `study_dir` as the directory of the study `name` unless it is absent, empty (a lock file
    aside: a study killed before it wrote study.json) or holds this same study, which is resumed, or one
    `grows` accepts (given its study.json: the same study with fewer seeds, `Study.grows`), which it continues.

    A directory holding a `mixit train` run, another study, or files of a user's own is refused: the
    study would write into it, and its report would overwrite a report.md, results.csv or checks.json there."""
    study_dir = Path(study_dir)
    check_names(study_dir)
    if study_dir.exists() and not study_dir.is_dir():
        raise UsageError(f"output path {study_dir} exists and is not a directory")
    if not study_dir.exists():
        return
    if (study_dir / RECORD).exists():
        check_same_study(study_dir, read_json(study_dir / RECORD, RECORD), name, fingerprint, grows)
        return
    if Run(study_dir).state() != "absent":
        raise UsageError(f"{study_dir} holds a mixit run, not a study; choose another output directory")
    held = sorted(p.name for p in study_dir.iterdir() if p.name != DirectoryLock.NAME)
    if held:
        shown = ", ".join(held[:3]) + (f" and {len(held) - 3} more" if len(held) > 3 else "")
        raise UsageError(
            f"{study_dir} holds files that are not a mixit study ({shown}); choose an empty or new output directory"
        )


def check_same_study(
    study_dir: Path, old: Any, name: str, fingerprint: str, grows: Callable[[Any], bool] | None = None
) -> None:
    """Refuse `study_dir` if its study.json (`old`) is not the study `name` with `fingerprint`, nor one that
    `grows` accepts."""
    if grows is not None and grows(old):
        return
    if not isinstance(old, dict) or old.get("name") != name or old.get("fingerprint") != fingerprint:
        raise UsageError(
            f"{study_dir} holds another study ({old.get('name') if isinstance(old, dict) else '?'}, "
            f"or the same one with other runs or another search); choose another output directory"
        )


def load_study_record(study_dir: Path) -> dict[str, Any]:
    """study.json, refused in one line naming what is wrong unless it has the shape the report reads."""
    study_dir = Path(study_dir)
    path = study_dir / RECORD
    if not study_dir.is_dir():
        raise UsageError(f"{study_dir} holds no study (not a directory)")
    if not path.exists():
        raise UsageError(f"{study_dir} holds no study (no {RECORD})")
    data = read_json(path, RECORD)
    problem = _record_problem(data)
    if problem:
        raise UsageError(f"{path} is damaged: {problem}")
    return data  # its shape checked by _record_problem


def _record_problem(data: Any) -> str | None:
    """What is wrong with study.json's `data` (None: nothing the report would trip on)."""
    if not isinstance(data, dict):
        return f"not a JSON object but {type(data).__name__}"
    if not isinstance(data.get("name"), str) or not data["name"]:
        return "'name' is not a non-empty string"
    extras = data.get("extras", {})
    if not isinstance(extras, dict) or not all(isinstance(k, str) and SAFE_NAME.fullmatch(k) for k in extras):
        return "'extras' is not an object of names"
    runs = data.get("runs")
    if not isinstance(runs, list):
        return "'runs' is missing" if runs is None else f"'runs' is not a list but {type(runs).__name__}"
    for i, entry in enumerate(runs):
        problem = _entry_problem(entry)
        if problem:
            return f"runs[{i}] {problem}"
    return None


def _entry_problem(entry: Any) -> str | None:
    """What is wrong with one run entry of study.json (None: nothing)."""
    if not isinstance(entry, dict):
        return f"is not a JSON object but {type(entry).__name__}"
    missing = [key for key in ("id", "labels", "config") if key not in entry]
    if missing:
        return f"has no {', '.join(repr(k) for k in missing)}"
    if not isinstance(entry["id"], str) or not SAFE_NAME.fullmatch(entry["id"]):
        return f"has an id that is not a run id: {entry['id']!r}"
    labels = entry["labels"]
    if not isinstance(labels, list) or not labels or not all(isinstance(x, dict) for x in labels):
        return "has 'labels' that are not a non-empty list of objects"
    config = entry["config"]
    if not isinstance(config, dict) or not isinstance(config.get("task"), str):
        return "has a 'config' without a task"
    if not isinstance(config.get("task_params"), dict):
        return "has a 'config' whose task_params are not an object"
    if entry.get("role", "final") not in ROLES:
        return f"has role {entry.get('role')!r}; allowed: {', '.join(ROLES)}"
    if not isinstance(entry.get("chosen") or {}, dict):
        return "has 'chosen' settings that are not an object"
    return None


def failure_record(study_dir: Path, run_id: str) -> dict[str, Any]:
    """failed/<run_id>.json, refused unless it is an object whose 'error' is a string."""
    path = Path(study_dir) / "failed" / f"{run_id}.json"
    data = read_json(path, "a failure record")
    if not isinstance(data, dict):
        raise UsageError(f"{path} is damaged: a failure record is a JSON object, not {type(data).__name__}")
    if not isinstance(data.get("error"), str):
        raise UsageError(f"{path} is damaged: its 'error' is not a string")
    return data


def check_report_paths(study_dir: Path) -> None:
    """Refuse a report whose files or figures/ exist as something else (a directory, a file)."""
    study_dir = Path(study_dir)
    for name in REPORT_FILES:
        if (study_dir / name).exists() and not (study_dir / name).is_file():
            raise UsageError(f"{study_dir / name} exists and is not a file; the report cannot write it")
    figures = study_dir / FIGURES
    if figures.exists() and not figures.is_dir():
        raise UsageError(f"{figures} exists and is not a directory; the report writes its figures there")
