"""Plugins (docs/extending.md): modules of your own that register a task, a variant or an attention kind, named in
``MIXIT_PLUGINS`` (module names or .py paths, comma-separated) or by an installed package's entry point of the
group ``mixit.plugins``, and imported by every mixit process (a study's workers too) before it parses anything."""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from importlib.metadata import entry_points
from pathlib import Path

from mixit.errors import UsageError, one_line

ENV = "MIXIT_PLUGINS"
GROUP = "mixit.plugins"
_loaded: set[str] = set()  # the plugins this process has imported


def plugin_names() -> list[str]:
    """The plugins to load: the modules of the entry points of `GROUP`, then the items of `ENV`, each once."""
    installed = [ep.value.partition(":")[0].strip() for ep in entry_points(group=GROUP)]
    named = [item.strip() for item in os.environ.get(ENV, "").split(",") if item.strip()]
    return list(dict.fromkeys([*installed, *named]))


def load_plugins() -> list[str]:
    """Import every plugin this process has not imported yet; return those imported now. One that cannot be imported
    (whatever it raises, SystemExit and KeyboardInterrupt included) is refused in one line, not with its exit status
    or traceback; what it raised is the refusal's cause, for a study's failure record and `run_one`."""
    imported = []
    for name in plugin_names():
        if name in _loaded:
            continue
        try:
            _import(name)
        except BaseException as e:
            raised = f"{type(e).__name__}: {one_line(e)}" if str(e).strip() else type(e).__name__
            raise UsageError(
                f"plugin {name!r} (from {ENV} or the entry points of {GROUP}) cannot be imported: {raised}"
            ) from e
        _loaded.add(name)
        imported.append(name)
    return imported


def _import(name: str) -> None:
    """Import the module `name`, or the .py file `name` as a module named after the file."""
    if not name.endswith(".py"):
        importlib.import_module(name)
        return
    path = Path(name).expanduser().resolve()  # a missing file: FileNotFoundError, naming it, as it is run
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None  # a .py path has both
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[path.stem]
        raise
