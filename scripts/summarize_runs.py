"""Print a markdown table of the summary.json files of the given run directories.

Usage: python scripts/summarize_runs.py RUN_DIR [RUN_DIR ...]
"""

import json
import sys
from pathlib import Path


def main(paths: list[str]) -> None:
    print("| run | task | variant | trainable / total params | test loss | token acc | exact match | train s |")
    print("|---|---|---|---|---|---|---|---|")
    for path in paths:
        s = json.loads((Path(path) / "summary.json").read_text())
        t = s["test"]
        exact = f"{t['exact_match']:.4f}" if "exact_match" in t else "-"
        print(f"| {Path(path).name} | {s['task']} | {s['variant']} | {s['n_trainable']:,} / {s['n_params']:,} "
              f"| {t['loss']:.4f} | {t['token_acc']:.4f} | {exact} | {s['train_seconds_this_session']:.0f} |")


if __name__ == "__main__":
    main(sys.argv[1:])
