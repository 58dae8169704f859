"""Run every `mixit train` command of docs/regimes.md's shell blocks that trains (the refusals are left to
tests/test_regimes_doc.py), in order, in a scratch directory, and write transcript.md: each command and what it
printed, and each run's summary.json beside it (summaries/<out>.json).

    python docs/results/regimes-demo/run.py [SCRATCH]     # SCRATCH defaults to a new temporary directory
"""

import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
DOC = HERE.parents[1] / "regimes.md"


def commands() -> list[str]:
    """The training commands of the page's ```sh blocks (continuations joined), in order."""
    found = []
    for block in re.findall(r"```sh\n(.*?)```", DOC.read_text(), flags=re.S):
        lines = [line.strip() for line in block.replace("\\\n", " ").splitlines() if line.strip()]
        for line, after in zip(lines, [*lines[1:], ""]):
            if line.startswith("mixit train") and not after.startswith("# mixit train: error:"):
                found.append(re.sub(r"\s+", " ", line))
    return found


def main() -> None:
    scratch = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(tempfile.mkdtemp(prefix="regimes-demo-"))
    scratch.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    (HERE / "summaries").mkdir(exist_ok=True)
    lines = ["# Every training command of docs/regimes.md, as run for this record", ""]
    for command in commands():
        args = shlex.split(command)
        done = subprocess.run(
            [sys.executable, "-m", "mixit", *args[1:]], cwd=scratch, env=env, capture_output=True, text=True, check=True
        )
        out = args[args.index("--out") + 1]
        summary = json.loads((scratch / out / "summary.json").read_text())
        (HERE / "summaries" / f"{Path(out).name}.json").write_text(json.dumps(summary, indent=1) + "\n")
        printed = done.stdout.strip().splitlines()
        lines += ["    " + command, "", *("    " + line for line in printed), ""]
        print(command, "->", next(line for line in printed if ": after " in line), flush=True)
    (HERE / "transcript.md").write_text("\n".join(lines))


if __name__ == "__main__":
    main()
