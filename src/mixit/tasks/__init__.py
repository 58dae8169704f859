"""The tasks (../shared/spec/TASKS.md): synthetic ones, and the real-text lm
and sentiment; and the one place that builds them from a CLI name and parameters.

    task = make_task("addition", {"n_digits": "5"}, seed=0)

Parameters may come as strings from a command line; each is converted to the
type of its constructor default, and anything unknown or malformed raises
`UsageError` naming it.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

from mixit.errors import UsageError
from mixit.tasks.addition import Addition
from mixit.tasks.base import IGNORE, Batch, ParamCounts, Task, make_batch
from mixit.tasks.dyck import Dyck
from mixit.tasks.induction import Induction
from mixit.tasks.memorization import Memorization
from mixit.tasks.modular_addition import ModularAddition
from mixit.tasks.retrieval import Retrieval
from mixit.tasks.text import LanguageModeling, Sentiment
from mixit.text.tokenizer import TOKENIZER_FILE

__all__ = [
    "IGNORE",
    "TASKS",
    "Batch",
    "ParamCounts",
    "Task",
    "make_batch",
    "make_run_task",
    "make_task",
    "task_parameters",
]

TASKS: dict[str, type[Task]] = {
    cls.name: cls for cls in (Addition, ModularAddition, Dyck, Memorization, Retrieval, Induction,
                              LanguageModeling, Sentiment)
}
"""CLI name -> task class."""

_NOT_TASK_PARAMETERS = ("self", "seed", "test_size")
_TRUE = ("true", "1", "yes")
_FALSE = ("false", "0", "no")


def _task_class(name: str) -> type[Task]:
    if name not in TASKS:
        raise UsageError(f"unknown task {name!r}; choose one of: {', '.join(TASKS)}")
    return TASKS[name]


def task_parameters(name: str) -> dict[str, Any]:
    """Each parameter of task `name` and its default, in constructor order."""
    signature = inspect.signature(_task_class(name).__init__)
    return {
        key: param.default
        for key, param in signature.parameters.items()
        if key not in _NOT_TASK_PARAMETERS
    }


def _coerce(key: str, value: Any, default: Any) -> Any:
    """`value` as the type of `default` (bool, int or float); strings are parsed."""
    text = value.strip().lower() if isinstance(value, str) else None
    if isinstance(default, bool):
        if isinstance(value, bool):
            return value
        if text in _TRUE or (isinstance(value, int) and value == 1):
            return True
        if text in _FALSE or (isinstance(value, int) and value == 0):
            return False
        raise UsageError(f"{key} must be true or false, got {value!r}")
    if isinstance(default, int):
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if text is not None:
            try:
                return int(text)
            except ValueError:
                pass
        raise UsageError(f"{key} must be an integer, got {value!r}")
    if isinstance(default, float):
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if text is not None:
            try:
                return float(text)
            except ValueError:
                pass
        raise UsageError(f"{key} must be a number, got {value!r}")
    return value


def make_task(name: str, params: dict[str, Any] | None = None, seed: int = 0, test_size: int = 4000) -> Task:
    """Build task `name` with `params` (missing ones take their defaults)."""
    cls = _task_class(name)
    defaults = task_parameters(name)
    kwargs = {}
    for key, value in (params or {}).items():
        if key not in defaults:
            allowed = ", ".join(f"{k}={v}" for k, v in defaults.items())
            raise UsageError(f"unknown parameter {key!r} for task {name}; allowed: {allowed}")
        kwargs[key] = _coerce(key, value, defaults[key])
    return cls(**kwargs, seed=seed, test_size=test_size)


def make_run_task(name: str, params: dict[str, Any], seed: int, test_size: int, run_dir: Any = None) -> Task:
    """`make_task` for an existing run: a task with a tokenizer reads the one
    saved in `run_dir` (RUN_DIR/tokenizer.json) instead of training or
    fetching it again, so the run is evaluated with exactly its own."""
    saved = Path(run_dir) / TOKENIZER_FILE if run_dir is not None else None
    if saved is not None and saved.is_file() and "tokenizer" in task_parameters(name):
        params = {**params, "tokenizer": str(saved)}
    return make_task(name, params, seed=seed, test_size=test_size)
