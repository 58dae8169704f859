"""Train on retrieval examples with only some numbers of stored pairs: `python forced_pairs.py OUT.json VARIANT
PAIRS STEPS LR SEED` (PAIRS comma-separated, e.g. 1 or 1,2,3,4,5,6,7,8,9,10).

The quick preset's retrieval model (10-pair task, vocab 512, n_ctx 23; d_model 64, 2 layers, 4 heads,
qk_init paper; batch 64) trained by AdamW as `mixit train` builds it, at a constant lr (no warm-up, no
clipping, no schedule). Examples come from the task's own sampler, keeping those whose number of stored pairs
is in PAIRS, so their layout (query at position 2k) is the task's. The test set is 1,000 such examples from
seed 999. Writes the test accuracy every STEPS/5 steps.
"""

import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

from mixit.experiment import build, run_config
from mixit.tasks.base import make_batch
from mixit.training.optim import build_optimizer
from mixit.training.step import loss_fn

torch.set_num_threads(1)


def sample(task, rng: np.random.Generator, n: int, pairs: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """n examples of `task` whose number of stored pairs (query position / 2) is in `pairs`."""
    seqs, masks, got = [], [], 0
    while got < n:
        seq, mask = task.sample(rng, 4 * n)
        keep = np.isin(mask.argmax(axis=1) // 2, pairs)
        seqs.append(seq[keep])
        masks.append(mask[keep])
        got += int(keep.sum())
    return np.concatenate(seqs)[:n], np.concatenate(masks)[:n]


def main(out: str, variant: str, pairs_arg: str, steps: int, lr: float, seed: int) -> None:
    pairs = [int(k) for k in pairs_arg.split(",")]
    shape = {"d_model": 64, "n_heads": 4, "n_layers": 2, "qk_init": "paper"}
    cfg = run_config("retrieval", variant, {"max_pairs": 10}, **shape, lr=lr, batch_size=64, steps=steps, seed=seed)
    task, model, _ = build(cfg)
    optimizer = build_optimizer(model, cfg.train, torch.device("cpu"))
    rng = np.random.default_rng([seed, 1])
    test = make_batch(*sample(task, np.random.default_rng(999), 1000, pairs))
    curve, start = [], time.time()
    for step in range(1, steps + 1):
        batch = make_batch(*sample(task, rng, 64, pairs))
        loss = loss_fn(model(batch.inputs), batch.targets)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % (steps // 5) == 0:
            with torch.no_grad():
                right = (model(test.inputs).argmax(-1) == test.targets) & test.mask
            point = {"step": step, "train_loss": round(loss.item(), 4), "test_acc": right.sum().item() / 1000}
            curve.append(point)
            print(json.dumps({**point, "seconds": round(time.time() - start, 1)}), flush=True)
    record = {"variant": variant, "pairs": pairs, "steps": steps, "lr": lr, "seed": seed, "curve": curve}
    Path(out).write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), float(sys.argv[5]), int(sys.argv[6]))
