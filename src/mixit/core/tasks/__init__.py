"""The tasks (docs/tasks.md): the synthetic ones, and the real-text lm and sentiment.

Each task module declares its parameters as a `TaskConfig` dataclass and
registers its class in `TASKS`; importing the module is the one line that
makes a task available (docs/extending.md):

    task = make_task("addition", {"n_digits": 5}, seed=0)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# Importing a task module registers its task: one line per task.
from mixit.core.config import DataConfig
from mixit.core.tasks import addition, dyck, induction, memorization, modular_addition, retrieval, text  # noqa: F401
from mixit.core.tasks.base import IGNORE, TASKS, Batch, ParamCounts, Task, check_batch, make_batch

__all__ = [
    "IGNORE",
    "TASKS",
    "Batch",
    "ParamCounts",
    "Task",
    "check_batch",
    "make_batch",
    "make_task",
    "task_parameters",
]


def task_parameters(name: str) -> dict[str, Any]:
    """Each parameter of task `name` and its default, in declaration order."""
    return TASKS.get(name).Config().to_dict()


def make_task(name: str, params: Mapping[str, Any] | None = None, seed: int = 0, **data: Any) -> Task:
    """Build task `name`; `params` are checked strictly by the task's Config, the data seed `seed` and `data`
    (test_size, val_size, test_seed) by `DataConfig`; what is left out takes its default."""
    cls = TASKS.get(name)
    return cls(cls.Config.from_dict(params or {}), DataConfig.from_dict({"data_seed": seed, **data}))
