"""Print a markdown table of the summary.json files of the given run directories:
one column per test metric that any of them reports (loss, token_acc, exact_match,
perplexity, accuracy, ...), in the order they first appear.

Usage: python scripts/summarize_runs.py RUN_DIR [RUN_DIR ...]
"""

import json
import sys
from pathlib import Path


def main(paths: list[str]) -> None:
    summaries = [json.loads((Path(path) / "summary.json").read_text()) for path in paths]
    metrics: list[str] = []
    for s in summaries:
        metrics += [k for k in s["test"] if k not in metrics]
    print("| run | task | variant | trainable / total params | " + " | ".join(metrics) + " | train s |")
    print("|---|---|---|---|" + "---|" * len(metrics) + "---|")
    for path, s in zip(paths, summaries):
        values = " | ".join(f"{s['test'][k]:.4f}" if k in s["test"] else "-" for k in metrics)
        print(
            f"| {Path(path).name} | {s['task']} | {s['variant']} | {s['n_trainable']:,} / {s['n_params']:,} "
            f"| {values} | {s['train_seconds_this_session']:.0f} |"
        )


if __name__ == "__main__":
    main(sys.argv[1:])
