# %% [markdown]
# # Inside a trained run: attention patterns and head scores
#
# This example loads a trained run, draws every head's attention pattern on one input, and scores every
# head as a previous-token, induction or duplicate-token head. Given no run, it first trains one: the
# standard model on the 1-hop induction task (at every position, predict the token that followed the
# previous occurrence of the current one), which attention solves with an induction head.
#
# At its default size (`laptop`: width 64, 2 layers, 800 steps) it took 16 seconds on 2 CPU cores; the
# model formed an induction head (layer 1 head 3, score 0.79) and predicted every token of a repeated
# sequence's second copy (one seed; docs/results/examples). `MIXIT_EXAMPLE_SIZE=tiny` runs it in seconds (a check
# that it works, not a result). To look at a run of your own instead, set `MIXIT_EXAMPLE_RUN=RUN_DIR`
# (any task and variant: MixiT's fixed heads are read through the same hook as softmax heads).
#
# Run it with `python examples/attention_and_heads.py`, or open it as a notebook:
# `jupytext --to notebook examples/attention_and_heads.py`. It writes `attention.png` and
# `head_scores.png` under `runs/examples/attention_and_heads/SIZE` (or `MIXIT_EXAMPLE_OUT`), beside the
# run it trains. `mixit analyze RUN_DIR` computes all of this and more from the command line.

# %%
import os
import sys
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np

from mixit import Run, run_config, train
from mixit.analysis.attention_maps import attention_patterns
from mixit.analysis.induction import head_scores, repeated_sequences, strongest

SIZES = {
    "laptop": {"d_model": 64, "n_layers": 2, "n_heads": 4, "steps": 800, "batch_size": 32, "test_size": 500},
    "tiny": {"d_model": 16, "n_layers": 2, "n_heads": 2, "steps": 10, "batch_size": 8, "test_size": 50},
}
SIZE = os.environ.get("MIXIT_EXAMPLE_SIZE", "laptop")
if SIZE not in SIZES:
    raise SystemExit(f"MIXIT_EXAMPLE_SIZE must be one of {', '.join(SIZES)}, got {SIZE!r}")
OUT = Path(os.environ.get("MIXIT_EXAMPLE_OUT", f"runs/examples/attention_and_heads/{SIZE}"))
if "ipykernel" not in sys.modules:
    plt.switch_backend("Agg")  # a script draws into files only, and never opens a window

# %% [markdown]
# ## The run
#
# `Run(path).load()` reads a run directory back: its config, its task (with the same test set) and its
# model at the latest checkpoint.

# %%
if "MIXIT_EXAMPLE_RUN" in os.environ:
    path = Path(os.environ["MIXIT_EXAMPLE_RUN"])
else:
    path = OUT / "run"
    cfg = run_config("induction", "standard", {"alphabet": 8, "length": 32}, **SIZES[SIZE])
    train(cfg, path, resume=Run(path).state() != "absent", progress=False)
loaded = Run.open(path).load()
task, model = loaded.task, loaded.model
print(f"{loaded.cfg.task}/{loaded.cfg.variant} at {loaded.checkpoint}")
OUT.mkdir(parents=True, exist_ok=True)

# %% [markdown]
# ## Attention patterns on one input
#
# The input is a repeated random sequence `r r`: m distinct tokens, then the same m tokens again. In
# the second copy, a previous-token head attends one position back (the diagonal just below the main
# one), and an induction head attends to the token that followed the current token's earlier
# occurrence, m - 1 positions back (a stripe parallel to the diagonal, starting at row m).
# `attention_patterns` runs the model once and returns every layer's and head's pattern, an array
# (n_layers, n_heads, T, T): row i is where position i looks.

# %%
tokens = task.analysis_tokens()  # the token ids the probes draw from (the task's content tokens)
m = min(len(tokens), model.cfg.n_ctx // 2)
x = repeated_sequences(tokens, m, batch=1)[0]  # (2m,)
patterns = attention_patterns(model, x)  # (n_layers, n_heads, 2m, 2m)
names = [task.token_names()[t] for t in x.tolist()]

n_layers, n_heads = patterns.shape[:2]
colours = {"cmap": "viridis", "vmin": 0, "vmax": 1}
if patterns.min() < 0:  # MixiT's mixing weights may be negative: a map centred on 0
    top = float(np.abs(patterns).max())
    colours = {"cmap": "RdBu_r", "vmin": -top, "vmax": top}
size = (2.8 * n_heads, 2.8 * n_layers)
fig, axes = plt.subplots(n_layers, n_heads, figsize=size, squeeze=False, layout="constrained")
for (layer, head), ax in np.ndenumerate(axes):
    image = ax.imshow(patterns[layer, head], **colours)
    ax.set_title(f"layer {layer} head {head}", fontsize=9)
    if len(names) <= 40:  # label the tokens while they are legible
        ax.set_xticks(range(len(names)), names, fontsize=5)
        ax.set_yticks(range(len(names)), names, fontsize=5)
fig.colorbar(image, ax=axes, shrink=0.8, label="attention weight (row: query, column: key)")
fig.suptitle(f"attention on r r (m = {m}): {loaded.cfg.task}/{loaded.cfg.variant}")
fig.savefig(OUT / "attention.png", dpi=110)
print(f"wrote {OUT / 'attention.png'}")

# %% [markdown]
# ## Head scores
#
# `head_scores` measures each head on a batch of such sequences: its mean attention on the target of
# each kind (1 means all of it), as lists [layer][head]. It also measures the behaviour the heads serve,
# under `icl`: next-token accuracy on the first copy, which nothing in the context predicts, and on the
# second, which copying predicts.

# %%
scores = head_scores(model, tokens, m=m, batch=64)
kinds = ("previous_token", "induction", "duplicate_token")
fig, axes = plt.subplots(1, len(kinds), figsize=(3.2 * len(kinds), 0.6 * n_layers + 2), layout="constrained")
for ax, kind in zip(axes, kinds):
    table = np.asarray(scores[kind])  # (n_layers, n_heads)
    image = ax.imshow(table, cmap="magma", vmin=min(0.0, table.min()), vmax=1)
    for (layer, head), value in np.ndenumerate(table):
        ax.text(head, layer, f"{value:.2f}", ha="center", va="center", color="white" if value < 0.6 else "black")
    ax.set(title=kind.replace("_", " "), xlabel="head", ylabel="layer", xticks=range(n_heads), yticks=range(n_layers))
fig.colorbar(image, ax=axes, shrink=0.8, label="mean attention on the target")
fig.suptitle(f"head scores: {loaded.cfg.task}/{loaded.cfg.variant}")
fig.savefig(OUT / "head_scores.png", dpi=110)
print(f"wrote {OUT / 'head_scores.png'}")

for kind in kinds:
    best = strongest(scores[kind])  # {"layer", "head", "score"}
    print(
        f"strongest {kind.replace('_', ' ')} head: layer {best['layer']} head {best['head']}, score {best['score']:.2f}"
    )
if scores["icl"] is not None:  # a classifier predicts no next tokens
    first, second = scores["icl"]["acc_first_copy"], scores["icl"]["acc_second_copy"]
    print(f"next-token accuracy on the first copy {first:.1%}, on the second {second:.1%}")
