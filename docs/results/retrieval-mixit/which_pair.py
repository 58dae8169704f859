"""Which stored pair a trained retrieval model answers with: `python which_pair.py OUT.json RUN_DIR...`.

For each run (its latest checkpoint, on its own test set) and each number of stored pairs k: the accuracy,
the 1/k a model would score that always answers with the value of one stored pair chosen without regard to
the query, how often the prediction equals the value of the pair in slot i (1 = first in the sequence, k =
last, next to the query) or of any stored pair, and the accuracy by the slot the query asks for. Values
repeat across pairs only by chance (255 values), so the slots' fractions can add to slightly more than "any".
"""

import json
import sys
from pathlib import Path

import torch

from mixit.run import Run

torch.set_num_threads(1)


@torch.no_grad()
def by_pairs(run_dir: str) -> dict[str, object]:
    loaded = Run.open(Path(run_dir)).load("cpu")
    batch = loaded.task.test_batch()
    model = loaded.model.eval()
    preds = torch.cat([model(batch.inputs[i : i + 500]).argmax(-1) for i in range(0, len(batch), 500)])
    at = batch.mask.float().argmax(dim=1)  # (N,) the query position, 2k
    rows = torch.arange(len(batch))
    pred, answer = preds[rows, at], batch.targets[rows, at]  # (N,)
    pairs = at // 2  # (N,) k
    values = batch.inputs[:, 1::2]  # (N, max_pairs + 1) the token after each marker: slot i's value for i < k
    markers = batch.inputs[:, 0::2]  # (N, max_pairs + 1) slot i's marker for i < k
    query = batch.inputs[rows, at]  # (N,) the marker's token + max_pairs
    asked = (markers == (query - loaded.cfg.task_params.max_pairs)[:, None]).float().argmax(1)  # (N,) its slot
    right = pred == answer  # (N,)
    table = {}
    for k in sorted(pairs.unique().tolist()):
        sel = pairs == k
        slot_hits = (values[sel, :k] == pred[sel, None]).float()  # (n, k)
        table[str(k)] = {
            "examples": int(sel.sum()),
            "accuracy": round(right[sel].float().mean().item(), 4),
            "one_pair_guess": round(1 / k, 4),
            "equals_slot": [round(x, 4) for x in slot_hits.mean(0).tolist()],
            "equals_any_stored_value": round(slot_hits.amax(1).mean().item(), 4),
            "asked_slot_examples": [int((sel & (asked == i)).sum()) for i in range(k)],
            "accuracy_by_asked_slot": [round(right[sel & (asked == i)].float().mean().item(), 4) for i in range(k)],
        }
    cfg = loaded.cfg
    return {
        "run": Path(run_dir).name,
        "variant": cfg.variant,
        "max_pairs": cfg.task_params.max_pairs,
        "seed": cfg.model.seed,
        "data_seed": cfg.data_seed,
        "steps": loaded.checkpoint.name,
        "by_pairs": table,
    }


if __name__ == "__main__":
    found = [by_pairs(d) for d in sys.argv[2:]]
    Path(sys.argv[1]).write_text(json.dumps(found, indent=1) + "\n")
    for f in found:
        print(f["run"], f["variant"], f"max_pairs {f['max_pairs']}", f["steps"])
        for k, row in f["by_pairs"].items():
            slots = " ".join(f"{x:.2f}" for x in row["equals_slot"])
            asked = " ".join(f"{x:.2f}" for x in row["accuracy_by_asked_slot"])
            print(f"  k={k:>2} acc {row['accuracy']:.3f} (1/k {row['one_pair_guess']:.3f}) answers slot [{slots}]")
            print(f"       accuracy by the slot asked [{asked}]")
