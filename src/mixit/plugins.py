"""Plugins: modules of your own that register a task, a variant or an attention kind (docs/extending.md,
"Plugins"), imported by every mixit process, a study's workers and Slurm jobs included (`load_plugins`). They are
named in ``MIXIT_PLUGINS`` (comma-separated module names or .py paths) or by an installed package's entry point
of the group ``mixit.plugins``; the command line loads them before it parses anything.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from importlib.metadata import entry_points
from pathlib import Path

from mixit.errors import UsageError, one_line

ENV = "MIXIT_PLUGINS"  # names plugin modules or files
GROUP = "mixit.plugins"  # the entry-point group of installed packages' plugin modules
_loaded: set[str] = set()  # the plugins this process has imported (each once)


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
            raised = f"{type(e).__name__}: {one_line(e)}" if str(e).strip() else type(e).__name__
            raise UsageError(
                f"plugin {name!r} (from {ENV} or the entry points of {GROUP}) cannot be imported: {raised}"
            ) from e
        _loaded.add(name)
        imported.append(name)
    return imported


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
