"""Plugins: what you register (a task, a variant, an attention kind; docs/extending.md) from a module of
your own, outside mixit's source, in every process that needs it.

A study trains in worker processes and Slurm jobs that start afresh: a task registered by the script or
notebook that started the study is unknown to them. A plugin module is imported by every mixit process
instead, the study's workers and jobs included (`load_plugins`), when it is named

- in the environment variable ``MIXIT_PLUGINS``: comma-separated module names (importable from
  sys.path) or paths of .py files, e.g. ``MIXIT_PLUGINS=my_tasks.py mixit reproduce --study grid.toml``
  (workers inherit the environment; so do Slurm jobs, which sbatch starts with the submitting shell's);
- or by an installed package, as an entry point of the group ``mixit.plugins`` whose value is the module
  (``[project.entry-points."mixit.plugins"]`` ``my_tasks = "my_package.tasks"`` in its pyproject.toml).

The command line loads them before it parses anything, so a plugin's task is in ``mixit list``, in
``mixit train --task`` and in ``--help``; from Python, `load_plugins()` does the same (importing the module
yourself is as good in one process).
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from importlib.metadata import entry_points
from pathlib import Path

from mixit.errors import UsageError

ENV = "MIXIT_PLUGINS"
"""The environment variable naming plugin modules or files."""

GROUP = "mixit.plugins"
"""The entry-point group of installed packages' plugin modules."""

_loaded: set[str] = set()
"""The plugins this process has imported (each once)."""


def plugin_names() -> list[str]:
    """The plugins to load: the modules of the entry points of `GROUP`, then the items of `ENV`, each once."""
    installed = [ep.value.partition(":")[0].strip() for ep in entry_points(group=GROUP)]
    named = [item.strip() for item in os.environ.get(ENV, "").split(",") if item.strip()]
    return list(dict.fromkeys([*installed, *named]))


def load_plugins() -> list[str]:
    """Import every plugin (`plugin_names`) this process has not imported yet, and return those imported now.

    A plugin that cannot be imported (not found, or raising as it runs: any exception, SystemExit of a
    ``sys.exit()`` and KeyboardInterrupt included) is refused in one line naming it and what it raised, rather
    than ending mixit silently with the plugin's exit status or with its traceback. What it raised is kept as the
    refusal's cause: a study's failure record shows its traceback, and `run_one` tells a stopped worker's
    KeyboardInterrupt from a failure."""
    imported = []
    for name in plugin_names():
        if name in _loaded:
            continue
        try:
            _import(name)
        except BaseException as e:  # a plugin's own error, whatever it is, is said in one line
            raise UsageError(
                f"plugin {name!r} (from {ENV} or the entry points of {GROUP}) cannot be imported: {_raised(e)}"
            ) from e
        _loaded.add(name)
        imported.append(name)
    return imported


def _raised(e: BaseException) -> str:
    """What `e` says, on one line: its type and its message (``SystemExit: 3`` for ``sys.exit(3)``)."""
    message = " ".join(str(e).split())
    return f"{type(e).__name__}: {message}" if message else type(e).__name__


def _import(name: str) -> None:
    """Import the module `name`, or the .py file at path `name` as a module named after the file."""
    if not name.endswith(".py"):
        importlib.import_module(name)
        return
    path = Path(name).expanduser().resolve()
    if not path.is_file():
        raise FileNotFoundError(f"no file {path}")
    spec = importlib.util.spec_from_file_location(path.stem, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"{path} is not a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[path.stem]
        raise
