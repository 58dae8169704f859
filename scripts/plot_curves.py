"""Plot one test metric against training step for several run directories, one line each.

Usage: python scripts/plot_curves.py --metric loss --out curves.png RUN_DIR [RUN_DIR ...]
Reads each run's metrics.jsonl (its "eval" events); the legend names each line by
the run's variant (or its directory name when two runs share a variant).
"""

import argparse
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt


def curve(run: Path, metric: str) -> tuple[list[int], list[float]]:
    steps, values = [], []
    for line in (run / "metrics.jsonl").read_text().splitlines():
        event = json.loads(line)
        if event.get("event") == "eval" and metric in event:
            steps.append(event["step"])
            values.append(event[metric])
    return steps, values


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument("--metric", default="loss")
    parser.add_argument("--title", default="")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    variants = [json.loads((r / "config.json").read_text())["config"]["variant"] for r in args.runs]
    fig, ax = plt.subplots(figsize=(6, 4))
    for run, variant in zip(args.runs, variants):
        steps, values = curve(run, args.metric)
        label = variant if variants.count(variant) == 1 else run.name
        ax.plot(steps, values, marker="o", markersize=3, label=f"{label} ({values[-1]:.3f})")
    ax.set_xlabel("step")
    ax.set_ylabel(f"test {args.metric}")
    ax.set_title(args.title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(args.out, dpi=120)
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()
