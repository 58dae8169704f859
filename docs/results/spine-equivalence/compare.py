"""Compare two studies of one preset, trained before and after a change, run by run.

    python docs/results/spine-equivalence/compare.py BEFORE_STUDY_DIR AFTER_STUDY_DIR

Every run's row of results.csv (its id, config, labels, test and validation metrics, convergence, steps trained,
the search's choice) column by column, train_seconds alone left out (a timing); checks.json and report.md byte
for byte; and, for every run both directories hold, its metrics.jsonl event by event (timings left out) and every
checkpoint file (safetensors) by its SHA-256. A study stopped before its end has no results.csv, checks.json or
report.md yet: then its finished runs (those with a summary.json) are compared by their files alone.
"""

import csv
import hashlib
import json
import sys
from pathlib import Path

TIMING = "second"  # train_seconds, wall_seconds_this_session, elapsed_s ... : any key naming seconds
ELAPSED = "elapsed_s"


def rows(study: Path) -> dict[str, dict[str, str]]:
    with open(study / "results.csv") as f:
        return {r["id"]: r for r in csv.DictReader(f)}


def events(path: Path) -> list[dict]:
    lines = path.read_text().splitlines()
    return [{k: v for k, v in json.loads(line).items() if TIMING not in k and k != ELAPSED} for line in lines]


def digests(run: Path) -> dict[str, str]:
    return {str(p.relative_to(run)): hashlib.sha256(p.read_bytes()).hexdigest() for p in run.rglob("*.safetensors")}


def finished(study: Path) -> dict[str, dict[str, str]]:
    """The runs of a study that have finished, by id: results.csv's rows, or for a study stopped before its end
    (no results.csv yet) an empty row for each run directory with a summary.json."""
    if (study / "results.csv").exists():
        return rows(study)
    return {p.parent.name: {} for p in sorted((study / "runs").glob("*/summary.json"))}


def main(before: Path, after: Path) -> None:
    old, new = finished(before), finished(after)
    both = sorted(old.keys() & new.keys())
    print(f"runs: {len(old)} before, {len(new)} after, {len(both)} with the same id")
    only_before, only_after = sorted(old.keys() - new.keys()), sorted(new.keys() - old.keys())
    print(f"ids only before: {len(only_before)} {only_before[:10]}; only after: {len(only_after)} {only_after[:10]}")
    if all((study / "results.csv").exists() for study in (before, after)):
        columns = sorted((set(next(iter(old.values()))) | set(next(iter(new.values())))) - {"train_seconds"})
        cells = [(i, k) for i in both for k in columns if old[i].get(k) != new[i].get(k)]
        print(f"results.csv: {len(columns)} columns of {len(both)} runs compared, {len(cells)} cells differ")
        for run_id, key in cells[:20]:
            print(f"  {run_id} {key}: {old[run_id].get(key)!r} -> {new[run_id].get(key)!r}")
        for name in ("checks.json", "report.md"):
            print(f"{name} identical: {(before / name).read_bytes() == (after / name).read_bytes()}")
    kept = [i for i in both if (before / "runs" / i / "metrics.jsonl").exists() and (after / "runs" / i).exists()]
    metrics = [
        i for i in kept if events(before / "runs" / i / "metrics.jsonl") != events(after / "runs" / i / "metrics.jsonl")
    ]
    files = {i: digests(before / "runs" / i) for i in kept}
    checkpoints = [i for i in kept if files[i] != digests(after / "runs" / i)]
    print(f"run directories in both: {len(kept)}; metrics.jsonl differs in {len(metrics)}: {metrics[:10]}")
    n = sum(len(d) for d in files.values())
    print(f"checkpoint files compared: {n}; runs whose checkpoints differ: {len(checkpoints)}: {checkpoints[:10]}")


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
