"""What a study directory may hold, checked before anything is written (docs/reliability.md, "Studies and reports"):
the directory a study is given (`check_out`), study.json (`load_study_record`), a failure record, the report's paths.
Each refuses with one `UsageError` line naming the file and the problem, and reads only.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from mixit.core.config import flatten
from mixit.core.run import Run
from mixit.errors import UsageError
from mixit.files import DirectoryLock, check_names, read_json

RECORD = "study.json"
REPORT_FILES = ("report.md", "results.csv", "checks.json")
FIGURES = "figures"
ROLES = ("final", "screen")
SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
"""A run id or an extra's name: one path component of the study directory, never `..` or a path."""


def check_out(study_dir: Path, record: Mapping[str, Any], grows: Callable[[Any], bool] | None = None) -> None:
    """Refuse `study_dir` for the study whose study.json begins as `record` unless it is absent, empty (but a lock:
    a study killed before it wrote study.json), or holds this study (which resumes) or one that `grows` accepts (the
    same study with fewer seeds, which it continues): the study would write there."""
    study_dir = Path(study_dir)
    check_names(study_dir)
    if study_dir.exists() and not study_dir.is_dir():
        raise UsageError(f"output path {study_dir} exists and is not a directory")
    if not study_dir.exists():
        return
    if (study_dir / RECORD).exists():
        check_same_study(study_dir, read_json(study_dir / RECORD, RECORD), record, grows)
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
    study_dir: Path, old: Any, record: Mapping[str, Any], grows: Callable[[Any], bool] | None = None
) -> None:
    """Refuse `study_dir` unless its study.json (`old`) is the study `record` begins (its name and fingerprint) or
    one `grows` accepts, naming what changed."""
    if grows is not None and grows(old):
        return
    held = old.get("name") if isinstance(old, dict) else "?"
    if not isinstance(old, dict) or held != record["name"]:
        raise UsageError(
            f"{study_dir} holds another study ({held}, not {record['name']}); choose another output directory"
        )
    if old.get("fingerprint") == record["fingerprint"]:
        return
    changed = changes(old, record)
    raise UsageError(
        f"{study_dir} holds another study ({record['name']} "
        + (f"as its {RECORD} records it: {changed}" if changed else "with other runs or another search")
        + "); choose another output directory"
        + (", or undo the change to resume it" if changed else "")
    )


COMPARED = ("preset", "seeds", "first_seed", "search", "screen_fraction", "screen_min_steps", "extend", "extras",
            "file")  # fmt: skip
"""The settings of study.json whose change `changes` names: the study file's keys, and the options beside it."""


def changes(old: Mapping[str, Any], new: Mapping[str, Any], shown: int = 3) -> str:
    """The first `shown` settings (`COMPARED`) that differ between two study.json records as "KEY OLD -> NEW", a
    study file's keys dotted (grid.train.lr [0.001] -> [0.001, 0.1]); the file is compared where both record it."""
    keys = [k for k in COMPARED if k in new and (k != "file" or "file" in old)]
    before = flatten({k: old.get(k) for k in keys}, keep_empty=True)
    after = flatten({k: new[k] for k in keys}, keep_empty=True)
    differ = [k for k in {**before, **after} if before.get(k, ABSENT) != after.get(k, ABSENT)]
    named = [k for k in differ if k != "file.description" and f"file.{k}" not in differ]  # seeds once
    said = [f"{k.removeprefix('file.')} {_said(before.get(k, ABSENT))} -> {_said(after.get(k, ABSENT))}" for k in named]
    return "; ".join(said[:shown]) + (f"; and {len(said) - shown} more" if len(said) > shown else "")


ABSENT = object()
"""A setting one record does not hold."""


def _said(value: Any) -> str:
    return "(absent)" if value is ABSENT else json.dumps(value)


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
    return data


def _record_problem(data: Any) -> str | None:
    """What is wrong with study.json's `data`, if anything the report would trip on."""
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
    """What is wrong with one run entry of study.json, if anything."""
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
