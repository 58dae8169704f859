"""Did the periphery's rebuild (issue 41) change a result? Two comparisons, before against after.

    python docs/results/periphery-equivalence/compare.py studies BEFORE_STUDY AFTER_STUDY
    python docs/results/periphery-equivalence/compare.py rerun RECORD_STUDY OUT_DIR

`studies`: two studies of one preset (the smoke preset, run at the commit before the rebuild and after it), run
by run: the ids planned; each run's row of results.csv column by column; checks.json and report.md; metrics.jsonl
event by event; summary.json key by key; every checkpoint file by its SHA-256.

`rerun`: a sample of a long study's record trained again now. For every (task, variant, attention) of the
record, its run that took the least wall time is trained again with `mixit train --config RECORD/runs/ID/config.json`
in one torch thread, as a study's worker trains it (`torch.set_num_threads(1)`), and compared with the record's
metrics.jsonl and summary.json (the record keeps no checkpoints).

Timings (any key naming seconds, elapsed_s) and run_dir are left out. A key or column that only the after side
has is a new option with its default (the freeze selectors, the transplant options); it is named, not compared.
"""

import collections
import csv
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

TIMING = "second"
LEFT_OUT = {"elapsed_s", "run_dir", "train_seconds"}


def untimed(record: dict) -> dict:
    return {k: v for k, v in record.items() if TIMING not in k and k not in LEFT_OUT}


def events(path: Path) -> list[dict]:
    return [untimed(json.loads(line)) for line in path.read_text().splitlines()]


def differences(old: dict, new: dict, where: str, added: set[str]) -> list[str]:
    """The keys of `old` whose values `new` does not share, as lines; keys only `new` has go into `added`."""
    added.update(set(new) - set(old))
    return [f"  {where}: {k}: {old[k]!r} -> {new.get(k)!r}" for k in old if old[k] != new.get(k)]


def run_differences(before: Path, after: Path, added: set[str]) -> list[str]:
    """How run directory `after` differs from `before` in metrics.jsonl and summary.json."""
    old, new = events(before / "metrics.jsonl"), events(after / "metrics.jsonl")
    if len(old) != len(new):
        return [f"  metrics.jsonl: {len(old)} events before, {len(new)} after"]
    said = [line for i, (a, b) in enumerate(zip(old, new)) for line in differences(a, b, f"event {i}", added)]
    summaries = [untimed(json.loads((run / "summary.json").read_text())) for run in (before, after)]
    return said + differences(*summaries, "summary.json", added)


def digests(run: Path) -> dict[str, str]:
    return {str(p.relative_to(run)): hashlib.sha256(p.read_bytes()).hexdigest() for p in run.rglob("*.safetensors")}


def rows(study: Path) -> dict[str, dict[str, str]]:
    with open(study / "results.csv") as f:
        return {row["id"]: row for row in csv.DictReader(f)}


def studies(before: Path, after: Path) -> bool:
    old, new = rows(before), rows(after)
    both = sorted(old.keys() & new.keys())
    print(f"runs: {len(old)} before, {len(new)} after, {len(both)} with the same id")
    print(f"ids only before: {sorted(old.keys() - new.keys())}; only after: {sorted(new.keys() - old.keys())}")
    added: set[str] = set()
    cells = [line for i in both for line in differences(untimed(old[i]), untimed(new[i]), i, added)]
    print(f"results.csv: {len(next(iter(old.values())))} columns before; {len(cells)} cells differ", *cells[:20])
    print(f"results.csv columns new after, not compared: {sorted(added)}")
    same_files = True
    for name in ("checks.json", "report.md"):
        same = (before / name).read_bytes() == (after / name).read_bytes()
        same_files &= same
        print(f"{name} identical: {same}")
    added.clear()
    runs = [i for i in both if (after / "runs" / i / "summary.json").exists()]
    changed = {i: run_differences(before / "runs" / i, after / "runs" / i, added) for i in runs}
    print(f"metrics.jsonl and summary.json: {sum(bool(d) for d in changed.values())} of {len(runs)} runs differ")
    for i, lines in changed.items():
        if lines:
            print(i, *lines[:5], sep="\n")
    print(f"keys new after, not compared: {sorted(added)}")
    files = {i: digests(before / "runs" / i) for i in runs}
    moved = [i for i in runs if files[i] != digests(after / "runs" / i)]
    print(f"checkpoint files compared: {sum(len(d) for d in files.values())}; runs whose checkpoints differ: {moved}")
    return same_files and old.keys() == new.keys() and not cells and not any(changed.values()) and not moved


def sample(runs: Path) -> list[str]:
    """The fastest run of each (task, variant, attention) of the record, by id."""
    groups: dict[tuple[str, str, str], list[tuple[float, str]]] = collections.defaultdict(list)
    for run in sorted(runs.iterdir()):
        config = json.loads((run / "config.json").read_text())["config"]
        seconds = json.loads((run / "summary.json").read_text())["wall_seconds_this_session"]
        groups[(config["task"], config["variant"], config["model"]["attention"])].append((seconds, run.name))
    return [min(group)[1] for _, group in sorted(groups.items())]


def rerun(record: Path, out: Path) -> bool:
    chosen = sample(record / "runs")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    added: set[str] = set()
    identical = 0
    for run_id in chosen:
        before, after = record / "runs" / run_id, out / run_id
        if not (after / "summary.json").exists():
            command = ["mixit", "train", "--config", str(before / "config.json"), "--out", str(after), "--no-progress"]
            subprocess.run([sys.executable, "-m", *command], env=env, check=True, capture_output=True)
        config = json.loads((before / "config.json").read_text())["config"]
        lines = run_differences(before, after, added)
        identical += not lines
        label = f"{config['task']}/{config['variant']} ({config['model']['attention']})"
        print(f"{run_id} {label}: {'DIFFERENT' if lines else 'identical'}", *lines, sep="\n")
    print(f"keys new after, not compared: {sorted(added)}")
    print(f"{identical} of {len(chosen)} runs identical (metrics.jsonl and summary.json, timings left out)")
    return identical == len(chosen)


if __name__ == "__main__":
    mode, first, second = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
    sys.exit(0 if {"studies": studies, "rerun": rerun}[mode](first, second) else 1)
