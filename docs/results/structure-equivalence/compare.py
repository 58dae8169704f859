"""Compare a fresh quick study with the committed 3-seed record: same ids, same metrics."""
import json, sys
from pathlib import Path
new = Path(sys.argv[1]); old = Path(__file__).resolve().parents[1] / "study-quick-3seeds"
new_ids = {p.name for p in (new / "runs").iterdir() if (p / "summary.json").exists()}
old_ids = {p.name for p in (old / "runs").iterdir()}
missing = sorted(new_ids - old_ids)
print(f"fresh runs done: {len(new_ids)}; in the committed record too: {len(new_ids & old_ids)}; new ids: {missing}")
diffs = 0
for i in sorted(new_ids & old_ids):
    a = json.loads((new / "runs" / i / "summary.json").read_text())
    b = json.loads((old / "runs" / i / "summary.json").read_text())
    for key in ("test", "val", "convergence", "n_params", "n_trainable", "steps"):
        if a.get(key) != b.get(key):
            diffs += 1
            print("DIFF", i, key, a.get(key), b.get(key))
    ma = [{k: v for k, v in e.items() if k != "elapsed_s"} for e in map(json.loads, (new / "runs" / i / "metrics.jsonl").read_text().splitlines())]
    mb = [{k: v for k, v in e.items() if k != "elapsed_s"} for e in map(json.loads, (old / "runs" / i / "metrics.jsonl").read_text().splitlines())]
    if ma != mb:
        diffs += 1
        print("METRICS DIFF", i)
print("runs with differences:", diffs)
