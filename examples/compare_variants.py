# %% [markdown]
# # Compare two variants: trained attention against MixiT
#
# "Attention retrieves", the paper's title begins: a task that must look up a value by its key needs
# attention whose pattern depends on the input. This example trains the same small decoder twice
# on key-value retrieval, once as the `standard` model (everything trained) and once as `mixit` (each
# head's attention is a fixed random mixing matrix), then compares their test metrics and learning
# curves, read from each run's `metrics.jsonl`.
#
# At its default size (`laptop`: width 64, 2 layers, 1000 steps) it took 51 seconds on 2 CPU cores;
# the standard model reached 100% test accuracy, MixiT 17.6% (one seed; docs/results/examples).
# `MIXIT_EXAMPLE_SIZE=tiny` runs it in seconds (a check that it works, not a result).
#
# Run it with `python examples/compare_variants.py`, or open it as a notebook:
# `jupytext --to notebook examples/compare_variants.py`. It writes one run directory per variant and
# `curves.png` under `runs/examples/compare_variants/SIZE` (or `MIXIT_EXAMPLE_OUT`). Run again, it
# reuses the finished runs.

# %%
import os
import sys
from pathlib import Path

import matplotlib.pyplot as plt

from mixit import Run, run_config, train

SIZES = {
    "laptop": {"d_model": 64, "n_layers": 2, "n_heads": 4, "steps": 1000, "test_size": 1000},
    "tiny": {"d_model": 16, "n_layers": 1, "n_heads": 2, "steps": 20, "batch_size": 16, "test_size": 50},
}
SIZE = os.environ.get("MIXIT_EXAMPLE_SIZE", "laptop")
if SIZE not in SIZES:
    raise SystemExit(f"MIXIT_EXAMPLE_SIZE must be one of {', '.join(SIZES)}, got {SIZE!r}")
OUT = Path(os.environ.get("MIXIT_EXAMPLE_OUT", f"runs/examples/compare_variants/{SIZE}"))
if "ipykernel" not in sys.modules:
    plt.switch_backend("Agg")  # a script draws into files only, and never opens a window

# %% [markdown]
# ## Train both variants
#
# `run_config` resolves a complete configuration from a task, a variant, the task's parameters and any
# option by name. Both runs ask for the same options (8 key-value pairs at most per example, a
# vocabulary of 128 tokens, the same size and seeds); the variant brings its attention kind and the
# settings that go with it (`mixit list` shows them). `train` writes a run directory and returns its summary;
# `resume=True` continues a run already there (and returns a finished one's summary without training).

# %%
VARIANTS = ("standard", "mixit")
TASK_PARAMS = {"max_pairs": 8, "vocab": 128}

summaries = {}
for variant in VARIANTS:
    cfg = run_config("retrieval", variant, TASK_PARAMS, **SIZES[SIZE])
    path = OUT / variant
    summaries[variant] = train(cfg, path, resume=Run(path).state() != "absent", progress=False)

# %% [markdown]
# ## Test metrics
#
# The summary holds the final test metrics and the parameter counts. MixiT has no query or key
# projections, hence fewer parameters; every one of them is trained in both variants.

# %%
print(f"{'variant':<10} {'trainable':>10} {'test loss':>10} {'test accuracy':>14}")
for variant, summary in summaries.items():
    test = summary["test"]
    print(f"{variant:<10} {summary['n_trainable']:>10,} {test['loss']:>10.4f} {test['token_acc']:>14.1%}")

# %% [markdown]
# ## Learning curves
#
# `Run(path).metrics()` gives every event of `metrics.jsonl` in order: the freeze report first, then
# `train` events (the training loss every `log_every` steps) and `eval` events (the test metrics every
# `eval_every` steps, with the validation metrics beside them under `val_`). The standard model's
# accuracy first rests near 34%, what answering with a random one of the stored values scores (an
# example stores 1 to 8 pairs), before it learns to find the queried key.

# %%
fig, (loss_ax, acc_ax) = plt.subplots(1, 2, figsize=(10, 4), layout="constrained")
for variant in VARIANTS:
    events = Run(OUT / variant).metrics()
    steps_losses = [(e["step"], e["loss"]) for e in events if e["event"] == "train"]
    evals = [(e["step"], e["token_acc"]) for e in events if e["event"] == "eval"]
    loss_ax.plot(*zip(*steps_losses), label=variant, alpha=0.8)
    acc_ax.plot(*zip(*evals), marker="o", markersize=3, label=variant)
loss_ax.set(xlabel="step", ylabel="training loss", yscale="log", title="training loss")
acc_ax.set(xlabel="step", ylabel="test accuracy", ylim=(0, 1.02), title="test accuracy on the queried value")
for ax in (loss_ax, acc_ax):
    ax.grid(alpha=0.3)
    ax.legend(loc="center right")
fig.suptitle(f"retrieval, {TASK_PARAMS['max_pairs']} pairs at most: standard against MixiT ({SIZE})")
fig.savefig(OUT / "curves.png", dpi=110)
print(f"wrote {OUT / 'curves.png'}")
