"""Where a study's time went: `python scripts/study_time.py STUDY_DIR [--workers N]`.

Per table and role (screening runs of the search, finals at the cap, finals trained further at 2x or 4x), the
runs finished and the wall seconds they trained (summary.json `wall_seconds_this_session`); then the study's span
(the first run's config.json written to the last run's summary.json, file times of this directory: read it where
the study ran, before a copy resets them), the workers' share of it spent training, and how long fewer than all
workers were busy. Nothing is trained or changed.

A study that ran in sessions is read one session at a time with `--since` and `--until` (UTC, as
2026-11-28T17:47:50): only the runs that finished in the window are counted, and every run's span is cut to it, so
a run stopped at one session's end and resumed in the next counts as running in neither gap.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from datetime import UTC, datetime
from pathlib import Path


def runs(study_dir: Path) -> list[dict]:
    """Every finished run of the study: its table, role, budget, wall seconds and (start, end) file times."""
    found = []
    for entry in json.loads((study_dir / "study.json").read_text())["runs"]:
        run = study_dir / "runs" / entry["id"]
        summary = run / "summary.json"
        if not summary.exists():
            continue
        labels = entry["labels"][0]
        role = entry.get("role", "final")
        if role == "final" and labels.get("budget", 1) > 1:
            role = f"final {labels['budget']}x"
        table = labels.get("cell") or labels.get("table")
        seconds = json.loads(summary.read_text()).get("wall_seconds_this_session", 0.0)
        found.append(
            {
                "table": table,
                "role": role,
                "seconds": seconds,
                "span": (run.joinpath("config.json").stat().st_mtime, summary.stat().st_mtime),
            }
        )
    return found


def busy(spans: list[tuple[float, float]], workers: int) -> tuple[float, float, float, float]:
    """(span of the study, seconds with every worker busy, with some but not all, with none) from the runs' start
    and end. "None" is mostly the gaps between sessions; a run stopped at a session's end and finished in the next
    spans its gap, so the gaps are a lower bound."""
    events = sorted([(start, 1) for start, _ in spans] + [(end, -1) for _, end in spans])
    running, full, some, none, last = 0, 0.0, 0.0, 0.0, events[0][0]
    for time, change in events:
        if running >= workers:
            full += time - last
        elif running > 0:
            some += time - last
        else:
            none += time - last
        running, last = running + change, time
    return events[-1][0] - events[0][0], full, some, none


def window(found: list[dict], since: float, until: float) -> tuple[list[dict], list[tuple[float, float]]]:
    """The runs of `found` that finished in [since, until], and every run's span cut to it (those outside dropped)."""
    finished = [r for r in found if since <= r["span"][1] <= until]
    spans = [(max(a, since), min(b, until)) for a, b in (r["span"] for r in found)]
    return finished, [(a, b) for a, b in spans if a < b]


def utc(text: str) -> float:
    """A UTC time such as 2026-11-28T17:47:50 as seconds since the epoch."""
    return datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("study_dir", type=Path)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--since", type=utc, default=float("-inf"), help="UTC: the window's start (a session's)")
    parser.add_argument("--until", type=utc, default=float("inf"), help="UTC: the window's end")
    args = parser.parse_args()
    found, spans = window(runs(args.study_dir), args.since, args.until)
    if not found:
        raise SystemExit(f"{args.study_dir}: no run finished in the window")
    table: dict[tuple[str, str], list[float]] = defaultdict(list)
    for r in found:
        table[(r["table"], r["role"])].append(r["seconds"])
    total = sum(r["seconds"] for r in found)
    print("| table | role | runs | wall seconds | share |\n|---|---|---|---|---|")
    for (name, role), seconds in sorted(table.items()):
        print(f"| {name} | {role} | {len(seconds)} | {sum(seconds):.0f} | {sum(seconds) / total:.1%} |")
    span, full, some, none = busy(spans, args.workers)
    print(
        f"\n{len(found)} runs, {total:.0f} s of training over a span of {span:.0f} s with {args.workers} workers: "
        f"{total / (span * args.workers):.1%} of the workers' time training; all {args.workers} busy for "
        f"{full:.0f} s, some but not all for {some:.0f} s, none for {none:.0f} s"
    )


if __name__ == "__main__":
    main()
