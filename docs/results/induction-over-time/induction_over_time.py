"""When do the induction heads form? The quick study's induction runs (table 1: standard, frozen Q/K and
MixiT, seeds 0-2, the same configurations and so the same run ids as docs/results/study-quick-3seeds),
trained again keeping about 20 log-spaced checkpoints, each analysed over time; then one figure of the
strongest induction head's score against step per variant and seed, and a table of when it formed.

    python docs/results/induction-over-time/induction_over_time.py [OUT_DIR]   # default runs/induction-over-time

Writes OUT_DIR/<variant>-seed<s>/ (the runs) and docs/results/induction-over-time/ (each run's config.json,
summary.json and over-time analysis, the figure, over_time.json and table.md). About 15 minutes on 2 CPU
cores; run again, it resumes where it stopped.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

from matplotlib.figure import Figure

from mixit import Run, RunConfig, train
from mixit.analysis.report import analyze_run

RECORD = Path(__file__).resolve().parent
ROOT = RECORD.parents[2]
STUDY = RECORD.parent / "study-quick-3seeds" / "study.json"
VARIANTS = ("standard", "frozen_qk", "mixit")
FORMED = 0.5
"""An induction head has formed once the strongest head's score reaches this (halfway to a perfect head)."""


def induction_runs() -> dict[tuple[str, int], tuple[str, RunConfig]]:
    """(variant, seed) -> (run id, config) of the study's table-1 induction cells."""
    found = {}
    for run in json.loads(STUDY.read_text())["runs"]:
        for labels in run["labels"]:
            if labels.get("table") == "table1" and labels.get("task") == "induction" and run["role"] == "final":
                found[labels["variant"], labels["seed"]] = (run["id"], RunConfig.from_dict(run["config"]))
    return {key: found[key] for key in sorted(found) if key[0] in VARIANTS}


def train_and_analyse(cfg: RunConfig, path: Path) -> dict:
    """The run at `path` trained (or resumed, or left as it is when done) and analysed over time."""
    state = Run(path).state()
    if state != "done":
        train(cfg, path, resume=state == "started", progress=False, keep_checkpoints="log")
    run = Run.open(path)
    if run.analysis.over_time() is None:
        analyze_run(path, over_time=True)
    history = run.analysis.over_time()
    assert history is not None
    return history


def formed_at(steps: list[int], scores: list[float]) -> int | None:
    """The first kept step at which the strongest induction score reaches FORMED (None: never)."""
    return next((s for s, v in zip(steps, scores, strict=True) if v >= FORMED), None)


def steepest(steps: list[int], scores: list[float]) -> tuple[int, int, float]:
    """The consecutive kept checkpoints between which the score rose most: (from step, to step, rise)."""
    rises = [(steps[i], steps[i + 1], scores[i + 1] - scores[i]) for i in range(len(steps) - 1)]
    return max(rises, key=lambda r: r[2])


def main(out: Path) -> None:
    rows, curves = [], {}
    for (variant, seed), (run_id, cfg) in induction_runs().items():
        path = out / f"{variant}-seed{seed}"
        history = train_and_analyse(cfg, path)
        steps = history["steps"]
        scores = [h["score"] for h in history["strongest"]["induction"]]
        curves[f"{variant}-seed{seed}"] = {"run_id": run_id, "steps": steps, "induction": scores}
        summary = Run.open(path).summary() or {}
        start, end, rise = steepest(steps, scores)
        rows.append((variant, seed, run_id, formed_at(steps, scores), scores[-1], start, end, rise, summary))
        keep = RECORD / "runs" / f"{variant}-seed{seed}"
        keep.mkdir(parents=True, exist_ok=True)
        for name in ("config.json", "summary.json"):
            shutil.copy(path / name, keep / name)
        (keep / "over_time.json").write_text(json.dumps(history, indent=1))
        print(f"{variant} seed {seed}: formed at {rows[-1][3]}, final {scores[-1]:.3f}", flush=True)
    (RECORD / "over_time.json").write_text(json.dumps(curves, indent=1))
    plot(curves, RECORD / "induction-over-time.png")
    write_summary(rows, RECORD / "table.md")


def plot(curves: dict[str, dict], path: Path) -> None:
    fig = Figure(figsize=(7, 4.2))
    ax = fig.add_subplot()
    colours = dict(zip(VARIANTS, ("tab:blue", "tab:orange", "tab:green"), strict=True))
    for name, curve in curves.items():
        variant, seed = name.rsplit("-seed", 1)
        label = variant if seed == "0" else None
        ax.plot(curve["steps"], curve["induction"], marker=".", color=colours[variant], label=label, alpha=0.8)
    ax.axhline(FORMED, color="grey", lw=0.8, ls=":")
    ax.set_xscale("log")
    ax.set_xlabel("training step (log scale)")
    ax.set_ylabel("strongest induction head score")
    ax.set_ylim(0, 1.02)
    ax.set_title("Induction task, quick preset: when the induction head forms (3 seeds per variant)", fontsize=9)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def write_summary(rows: list[tuple], path: Path) -> None:
    lines = [
        "| variant | seed | run id | formed at step (score >= 0.5) | final score | steepest rise | test token_acc |",
        "|---|---|---|---|---|---|---|",
    ]
    for variant, seed, run_id, formed, final, start, end, rise, summary in rows:
        acc = summary.get("test", {}).get("token_acc")
        lines.append(
            f"| {variant} | {seed} | {run_id} | {formed if formed is not None else 'never'} | {final:.3f} | "
            f"+{rise:.3f} from step {start} to {end} | {acc:.4f} |"
        )
    path.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "runs" / "induction-over-time")
