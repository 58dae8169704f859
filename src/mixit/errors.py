"""The one exception type for bad user input, and the category of mixit's own warnings.

Anything a user can get wrong (an option, a value, a combination, a run
directory, a checkpoint file) raises `UsageError` before any work starts. The
CLI prints its message on one line and exits with status 2; the Python API lets
it propagate.

What mixit warns about through `warnings.warn` (empty texts skipped in a corpus)
is a `MixitWarning`: the CLI prints it as one ``mixit: warning: ...`` line, like
its other warnings; the Python API leaves it to the `warnings` module.
"""

import importlib
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any


class UsageError(ValueError):
    """Invalid user input; the message names the problem and what is allowed."""


def require(module: str, refusal: str) -> ModuleType:
    """The optional dependency `module`, imported when a command needs it; UsageError `refusal` (naming the
    command that installs it) where it is not installed."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise UsageError(refusal) from None


class MixitWarning(UserWarning):
    """A warning of mixit's own about the user's input; the CLI prints it on one line."""


def show_warning(shown: Callable[..., None], message: Warning | str, category: type[Warning], *where: Any) -> None:
    """Show a warning as the command line says its others: one ``mixit: warning: ...`` line for mixit's own
    (`MixitWarning`); any other as it was shown before (`shown`, with its file and line `where`). The CLI and a
    study's worker processes install it as ``warnings.showwarning``."""
    if issubclass(category, MixitWarning):
        print(f"mixit: warning: {' '.join(str(message).split())}", file=sys.stderr, flush=True)
    else:
        shown(message, category, *where)
