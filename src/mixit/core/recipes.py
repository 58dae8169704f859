"""Named recipes: the hyperparameters a run starts from, as data (`--recipe NAME`, `mixit list`).

A recipe maps (task, attention kind) to a partial request (docs/extending.md): the
options it sets, by name, which the request then overrides. Two are built in:

- ``laptop`` (the default): each task's own defaults (``run_defaults`` on each task's Config),
  sized to train in minutes on a laptop CPU.
- ``reference``: what the paper's public code runs for each task, with the
  step count as that code actually counts it (docs/fidelity.md, "Recipes",
  says where each number comes from and where the code's scripts disagree).
  These runs are sized for GPUs.

The model settings the reference couples to MixiT (shaped residual and
activation, width scaling) are not part of a recipe: they come with the
attention kind, whatever the recipe (`mixit.core.experiment.resolve`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from mixit.registry import Registry


@dataclass(frozen=True)
class Recipe:
    """A named source of option values: ``settings(task, attention)`` is a
    request (flat option names, plus ``task_params``) that the run's own
    request overrides."""

    name: str
    description: str
    settings: Callable[[str, str], dict[str, Any]]


RECIPES: Registry[Recipe] = Registry("recipe")
"""Name -> `Recipe`; one `RECIPES.add` line per recipe."""

# The reference's algorithmic runner (depth.py): lr 1e-2 (the scripts never pass another),
# weight decay 1e-3 and warmup 500 (the task files), cosine to 0, AdamW (0.9, 0.999), clip 1.0,
# batch 1000 (the task files), 2 layers of width 512 with 4 heads (depth_array.sh's softmax grid).
# It counts steps as max_steps * train_size // batch: the README's max_steps 500 with the task files'
# train_size (80,000 up to 10 digits or 30 pairs; 200,000 for retrieval's 512-token vocabulary).
_ALGORITHMIC = {
    "d_model": 512,
    "n_layers": 2,
    "n_heads": 4,
    "batch_size": 1000,
    "lr": 1e-2,
    "weight_decay": 1e-3,
    "warmup_steps": 500,
    "schedule": "cosine",
    "min_lr_ratio": 0.0,
    "beta1": 0.9,
    "beta2": 0.999,
    "grad_clip": 1.0,
}
_HF_TRAINER = {
    "beta1": 0.9,
    "beta2": 0.999,
    "grad_clip": 1.0,
    "schedule": "linear",
    "min_lr_ratio": 0.0,
    "weight_decay": 0.01,
}

REFERENCE: dict[str, dict[str, Any]] = {
    "addition": {**_ALGORITHMIC, "steps": 500 * 80_000 // 1000},
    "dyck": {**_ALGORITHMIC, "steps": 500 * 80_000 // 1000},
    "retrieval": {**_ALGORITHMIC, "steps": 500 * 200_000 // 1000},
    # Not in the reference code: its algorithmic settings, at the paper's 5 layers.
    "induction": {**_ALGORITHMIC, "n_layers": 5, "steps": 500 * 80_000 // 1000},
    # hdmemorize_exp.py: batch forced to 32768, lr 5e-3, weight decay 1e-4, warmup 500, cosine;
    # depth_array.sh's 500 steps (so the warmup spans the whole run, as there).
    "memorization": {**_ALGORITHMIC, "batch_size": 32768, "lr": 5e-3, "weight_decay": 1e-4, "steps": 500},
    # modadd_exp.py: batch forced to 4000, lr 1e-3, weight decay 1e-3, warmup 50, cosine, 20,000 steps.
    "modular_addition": {**_ALGORITHMIC, "batch_size": 4000, "lr": 1e-3, "warmup_steps": 50, "steps": 20_000},
    # The README's trainer.py command: 12 layers of width 512, 8 heads, sequence 256, batch 512,
    # lr 5e-4, 40,000 steps, warmup max(4% of the steps, 500), linear decay to 0.
    "lm": {
        **_HF_TRAINER,
        "d_model": 512,
        "n_layers": 12,
        "n_heads": 8,
        "batch_size": 512,
        "lr": 5e-4,
        "steps": 40_000,
        "warmup_steps": 1600,
        "task_params": {"length": 256},
    },
    # The README's trainer_classifier.py command: 4 layers of width 1024, 16 heads, sequence 256,
    # batch 32, lr 5e-4, 3,000 steps, warmup 500, linear decay to 0.
    "sentiment": {
        **_HF_TRAINER,
        "d_model": 1024,
        "n_layers": 4,
        "n_heads": 16,
        "batch_size": 32,
        "lr": 5e-4,
        "steps": 3000,
        "warmup_steps": 500,
        "task_params": {"length": 256},
    },
}
"""The reference recipe of each task, by option name."""

REFERENCE_MIXING: dict[str, dict[str, Any]] = {
    # trainer.py's skip_scaling defaults to 0.5 (branch sqrt(0.75)) where every other entry point uses sqrt(1/2).
    "lm": {"skip_scale": 0.5, "branch_scale": math.sqrt(0.75)},
    # trainer_classifier.py passes no base width: every width multiplier is sqrt(1 / fan_in).
    "sentiment": {"base_width": 1},
}
"""What the reference's entry point of a task changes for MixiT attention (shaped_attention="mixing")."""


def _reference(task: str, attention: str) -> dict[str, Any]:
    return {**REFERENCE.get(task, {}), **(REFERENCE_MIXING.get(task, {}) if attention == "mixing" else {})}


RECIPES.add("laptop", Recipe("laptop", "each task's own defaults, minutes on a laptop CPU", lambda task, attention: {}))
RECIPES.add(
    "reference", Recipe("reference", "the paper's code: its sizes, optimiser, schedules and step counts", _reference)
)
