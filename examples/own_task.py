# %% [markdown]
# # A task of your own, and a small study on it
#
# This example adds a task to mixit (reversing a sequence, a few lines of numpy) and runs a small study
# on it from Python: three variants, `standard`, `frozen_mlp` (the MLPs frozen at initialisation) and
# `mixit` (a fixed random mixing matrix per head instead of attention), each with two seeds. Unlike the
# retrieval of `compare_variants.py`, where the position to read depends on the input, reversal reads
# each token from a fixed position, which fixed mixing matrices, with trained layers around them, can
# serve.
#
# At its default size (`laptop`: width 64, 2 layers, 800 steps, 6 runs) it took 57 seconds on 2 CPU
# cores; all three variants reversed 100% of the test sequences in both seeds, MixiT more slowly (400
# steps to get 99% of the tokens right, against 160 to 240; docs/results/examples).
# `MIXIT_EXAMPLE_SIZE=tiny` runs it in seconds (a check that it works, not a result).
#
# Run it with `python examples/own_task.py`, or open it as a notebook:
# `jupytext --to notebook examples/own_task.py`. It writes a study directory under
# `runs/examples/own_task/SIZE` (or `MIXIT_EXAMPLE_OUT`): `runs/<id>/` per run, `report.md`,
# `results.csv` and `checks.json`. Run again, it skips the finished runs.

# %%
import os
from dataclasses import dataclass
from pathlib import Path
from statistics import mean
from typing import Any, ClassVar

import numpy as np

from mixit.core.config import TaskConfig, check
from mixit.core.tasks.base import TASKS, Examples, SequenceTask
from mixit.study import Study, write_report
from mixit.study.collect import collect
from mixit.study.executors import Pool, execute
from mixit.study.spec import grid

SIZES = {  # the options of every run (the shape of a run's config.json), and the seeds per variant
    "laptop": ({"model": {"d_model": 64, "n_layers": 2, "n_heads": 4}, "train": {"steps": 800}, "test_size": 1000}, 2),
    "tiny": ({"model": {"d_model": 16, "n_layers": 1, "n_heads": 2}, "train": {"steps": 10}, "test_size": 50}, 1),
}
SIZE = os.environ.get("MIXIT_EXAMPLE_SIZE", "laptop")
if SIZE not in SIZES:
    raise SystemExit(f"MIXIT_EXAMPLE_SIZE must be one of {', '.join(SIZES)}, got {SIZE!r}")
OUT = Path(os.environ.get("MIXIT_EXAMPLE_OUT", f"runs/examples/own_task/{SIZE}"))

# %% [markdown]
# ## The task
#
# A task made of token sequences derives from `SequenceTask` (docs/extending.md, "A task"). It declares
# its parameters as a `TaskConfig` dataclass, each field typed, with a default and a docstring, and
# checked in `validate`; it says how many token ids it uses (`vocab_size`) and how long a whole sequence
# is (`seq_len`); and `sample` draws `n` examples with a seeded generator: the token sequences and the
# loss mask, where `mask[i, t]` scores the prediction made at position t, of token t + 1. The base class
# makes the fixed test and validation sets and the training stream from `sample`, and scores the model
# (token accuracy, and exact match over each sequence since `exact_match` is set).
#
# `@TASKS.register("reverse")` makes the name known to `run_config`, to config files and to studies.
# Running the cell again (in a notebook, after editing the class) registers the new class in its place;
# another class under a name already taken is refused.


# %%
@dataclass
class ReverseConfig(TaskConfig):
    """Repeat a random sequence of `length` tokens backwards after a separator."""

    run_defaults: ClassVar[dict[str, Any]] = {"steps": 800, "batch_size": 64, "lr": 3e-3}

    length: int = 6
    """Tokens to reverse."""
    alphabet: int = 10
    """Tokens are 0..alphabet-1; the separator is the token alphabet."""

    def validate(self) -> None:
        check(self.length >= 2, f"length must be an integer >= 2, got {self.length}")
        check(self.alphabet >= 2, f"alphabet must be an integer >= 2, got {self.alphabet}")


@TASKS.register("reverse")
class Reverse(SequenceTask):
    """The sequence, the separator, and the sequence backwards; scored on the reversed part."""

    name = "reverse"
    Config = ReverseConfig
    cfg: ReverseConfig
    exact_match = True

    @property
    def vocab_size(self) -> int:
        return self.cfg.alphabet + 1

    @property
    def seq_len(self) -> int:
        return 2 * self.cfg.length + 1

    def sample(self, rng: np.random.Generator, n: int) -> Examples:
        L = self.cfg.length
        x = rng.integers(0, self.cfg.alphabet, size=(n, L))  # (n, L)
        separator = np.full((n, 1), self.cfg.alphabet)
        seq = np.concatenate([x, separator, x[:, ::-1]], axis=1)  # (n, 2L + 1)
        mask = np.zeros_like(seq, dtype=bool)
        mask[:, L : 2 * L] = True  # predicted at the separator and at each reversed token but the last
        return seq, mask


# %% [markdown]
# ## The study
#
# A study is data: a named list of runs. `grid` makes one run per combination of the values it is given
# (dotted paths into a request, the shape of a run's `config.json`) for each seed, and labels each with
# what it varies, its seed, and the labels it is given (here the table the runs belong to, as a study
# file's runs are labelled by the file's name). A run's id is a hash of its resolved configuration, so running the study
# again finds its finished runs and skips them.
#
# `execute` runs the study into its directory. The task above is registered in this process only, so the
# runs execute here, one after another (`Pool("sequential")`): the worker processes of the default
# `local` pool start afresh, and would not know the task. To train in parallel (or on Slurm), put the task
# in a module of its own and name it in `MIXIT_PLUGINS` (docs/extending.md, "Plugins"): every worker then
# imports it. `write_report` then writes `report.md` (a study
# of your own has no preset, so its report is one row per cell: its labels, the seeds done, each test
# metric's mean ± standard deviation over seeds, and how many converged), `results.csv` (one row per run:
# its labels, config and metrics) and `checks.json` (empty: the paper's findings are checked on the paper's
# study only).

# %%
options, seeds = SIZES[SIZE]
base = {"task": "reverse", "task_params": {"length": 6}, **options}
study = Study(
    "reverse",
    grid(base, {"variant": ["standard", "frozen_mlp", "mixit"]}, seeds=seeds, labels={"table": "reverse"}),
    description="Reversing 6 tokens: trained attention, frozen MLPs and MixiT.",
)
tally = execute(study, OUT, Pool("sequential"), progress=False)
report = write_report(OUT)
print(f"runs done: {tally['done']}, failed: {tally['failed']}; report: {report['report']}")

# %% [markdown]
# ## The results
#
# `collect` reads what the study's runs wrote, as the report does: per run, its state, its labels
# (variant and seed here), its final test and validation metrics, and the run directory itself (`run`),
# whose `metrics()` give every evaluation: here, the first step at which 99% of the reversed tokens were
# right.

# %%
rows = {}
for r in collect(OUT).final:
    if r.state != "done":  # a failed run is listed in report.md with its error
        continue
    evals = [e for e in r.run.metrics() if e["event"] == "eval"]
    solved = next((e["step"] for e in evals if e["token_acc"] >= 0.99), None)
    rows.setdefault(r.labels[0]["variant"], []).append((r.test["exact_match"], solved))
print(f"{'variant':<12} {'seeds':>5} {'exact match (mean)':>19} {'first step at 99% of tokens, per seed':>38}")
for variant, found in rows.items():
    steps = " ".join(str(step) if step is not None else "never" for _, step in found)
    print(f"{variant:<12} {len(found):>5} {mean(e for e, _ in found):>19.1%} {steps:>38}")
