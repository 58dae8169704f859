"""The record behind the numbers the examples quote: each example of examples/ run at its default size
(`laptop`), one after another, from a fresh output directory, timed.

    python docs/results/examples/record_examples.py [OUT_DIR]    # default runs/examples-record (removed first)

Writes docs/results/examples/: per example its printed output (output.txt), its figures, each run's
config.json and summary.json, and summary.md (the commit, the wall time of each example, each run's test
metrics). A few minutes on 2 CPU cores; run it on an otherwise idle machine, since the times are quoted.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from mixit.version import git_commit

RECORD = Path(__file__).resolve().parent
ROOT = RECORD.parents[2]
EXAMPLES = ("compare_variants", "own_task", "attention_and_heads")


def run_example(name: str, out: Path) -> tuple[float, str]:
    """Run examples/NAME.py at its default size into `out`; its wall time in seconds and its printed output."""
    env = {**os.environ, "MIXIT_EXAMPLE_SIZE": "laptop", "MIXIT_EXAMPLE_OUT": str(out), "HF_HUB_OFFLINE": "1"}
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / f"{name}.py")], env=env, cwd=ROOT, capture_output=True, text=True
    )
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"examples/{name}.py failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    return seconds, done.stdout


def keep(name: str, out: Path, seconds: float, output: str) -> list[str]:
    """Copy what example `name` wrote into the record; the lines of summary.md for its runs."""
    dest = RECORD / name
    dest.mkdir(parents=True)
    (dest / "output.txt").write_text(output)
    for figure in sorted(out.glob("*.png")):
        shutil.copy(figure, dest / figure.name)
    lines = [f"## {name} ({seconds:.0f} s)", "", "| run | task | variant | seed | test |", "|---|---|---|---|---|"]
    for summary_path in sorted(out.rglob("summary.json")):
        run_dir = summary_path.parent
        rel = run_dir.relative_to(out)
        kept = dest / "runs" / rel
        kept.mkdir(parents=True)
        shutil.copy(summary_path, kept / "summary.json")
        shutil.copy(run_dir / "config.json", kept / "config.json")
        summary = json.loads(summary_path.read_text())
        seed = json.loads((run_dir / "config.json").read_text())["config"]["model"]["seed"]
        test = ", ".join(f"{k} {v:.4f}" for k, v in summary["test"].items() if isinstance(v, float))
        lines.append(f"| {rel} | {summary['task']} | {summary['variant']} | {seed} | {test} |")
    return [*lines, ""]


def main() -> None:
    out_root = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "runs" / "examples-record"
    shutil.rmtree(out_root, ignore_errors=True)
    for name in EXAMPLES:  # what an earlier record wrote; the record's directory also holds this script
        shutil.rmtree(RECORD / name, ignore_errors=True)
    lines = [
        "# The examples at their default size",
        "",
        f"Commit {git_commit()}; `python docs/results/examples/record_examples.py`; each example run once,",
        f"one after another, on {os.cpu_count()} CPU cores, from an empty output directory. Times are wall seconds",
        "of the whole script.",
        "",
    ]
    for name in EXAMPLES:
        seconds, output = run_example(name, out_root / name)
        lines += keep(name, out_root / name, seconds, output)
        print(f"{name}: {seconds:.0f} s", flush=True)
    (RECORD / "summary.md").write_text("\n".join(lines))


if __name__ == "__main__":
    main()
