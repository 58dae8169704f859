"""Compare a fresh quick study with the committed 3-seed record: same run ids, same metrics.

    python docs/results/structure-equivalence/compare.py runs/study-quick

From the committed files alone it compares every run's row of results.csv (test and validation metrics,
convergence, steps trained). Where the old study's run directories are present too (they are not committed:
runs/ is ignored), it also compares each run's summary.json and whole metrics.jsonl, timings left out.
"""

import csv
import json
import sys
from pathlib import Path

OLD = Path(__file__).resolve().parents[1] / "study-quick-3seeds"
COLUMNS = ("test.", "val.", "converged", "reason", "gain", "steps_trained", "stopped_early", "chosen", "state")


def rows(path: Path) -> dict[str, dict[str, str]]:
    with open(path / "results.csv") as f:
        return {r["id"]: r for r in csv.DictReader(f)}


def events(path: Path) -> list[dict]:
    lines = path.read_text().splitlines()
    return [{k: v for k, v in json.loads(line).items() if k != "elapsed_s"} for line in lines]


def main(new: Path) -> None:
    fresh, old = rows(new), rows(OLD)
    print(f"fresh runs: {len(fresh)}; with the same id in the committed record: {len(fresh.keys() & old.keys())}")
    print(f"ids not in the committed record: {sorted(fresh.keys() - old.keys())}")
    differ = 0
    for run_id in sorted(fresh.keys() & old.keys()):
        keys = [k for k in fresh[run_id] if k.startswith(COLUMNS) and fresh[run_id][k] != old[run_id].get(k, "")]
        if keys:
            differ += 1
            print("results.csv differs:", run_id, keys)
        a, b = new / "runs" / run_id, OLD / "runs" / run_id
        if (b / "summary.json").exists():
            mine, theirs = (json.loads((d / "summary.json").read_text()) for d in (a, b))
            same = all(mine.get(k) == theirs.get(k) for k in ("test", "val", "convergence", "n_trainable", "steps"))
            if not same or events(a / "metrics.jsonl") != events(b / "metrics.jsonl"):
                differ += 1
                print("summary.json or metrics.jsonl differs:", run_id)
    print(f"runs with a difference: {differ}")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
