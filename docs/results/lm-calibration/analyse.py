"""The language-model calibration's numbers, from validation only: `python analyse.py runs`.

Per run: its best validation loss and the step, the verdict rule's drift (mixit.study.verdicts.drift) of the
validation loss as the run would report it after each evaluation (the best so far), and that number projected
to twice the cap at the drift bound. Per configuration: both parts of the language-model finding as the rule
would judge them in one seed, on validation numbers instead of test ones.
"""

import glob
import json
import os
import sys

from mixit.study.verdicts import RULE, drift


def reading(run: str) -> tuple[float, float, float, float, str]:
    evals = [e for e in map(json.loads, open(os.path.join(run, "metrics.jsonl"))) if e.get("event") == "eval"]
    cap = json.load(open(os.path.join(run, "config.json")))["config"]["train"]["steps"]
    best, curve = None, []
    for e in evals:
        if best is None or e["val_loss"] < best["val_loss"]:
            best = e
        curve.append((e["step"], best["val_loss"]))
    d = drift(curve)
    remaining = RULE.horizon * cap - evals[-1]["step"]
    low = best["val_loss"] + min(0.0, d.slope - RULE.z * d.se) * remaining
    high = best["val_loss"] + max(0.0, d.slope + RULE.z * d.se) * remaining
    line = (
        f"best val {best['val_loss']:.3f}±{best['val_loss_se']:.3f} at {best['step']}/{evals[-1]['step']}  "
        f"slope/1k {d.slope * 1000:+.3f}±{d.se * 1000:.3f}  projected [{low:.3f}, {high:.3f}]"
    )
    return best["val_loss"], best["val_loss_se"], low, high, line


runs = {os.path.basename(p.rstrip("/")): reading(p) for p in sorted(glob.glob(os.path.join(sys.argv[1], "*-*/")))}
for tag, r in runs.items():
    print(f"{tag:16s} {r[4]}")
for config in sorted({tag.split("-")[0] for tag in runs}):
    s, f, m = (runs[f"{config}-{v}"] for v in ("standard", "frozen_qk", "mixit"))
    for name, hi, lo in (("frozen_qk - standard", f, s), ("mixit - frozen_qk", m, f)):
        margin, floor = hi[0] - lo[0], RULE.z * (hi[1] ** 2 + lo[1] ** 2) ** 0.5
        worst, best = hi[2] - lo[3], hi[3] - lo[2]
        holds = margin > floor and worst > 0
        print(
            f"{config} {name}: margin {margin:+.3f} floor {floor:.3f} worst {worst:+.3f} best {best:+.3f} "
            + ("holds" if holds else "open")
        )
