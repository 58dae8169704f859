"""The one exception type for bad user input, and the category of mixit's own warnings.

Anything a user can get wrong (an option, a value, a combination, a run
directory, a checkpoint file) raises `UsageError` before any work starts. The
CLI prints its message on one line and exits with status 2; the Python API lets
it propagate.

What mixit warns about through `warnings.warn` (empty texts skipped in a corpus)
is a `MixitWarning`: the CLI prints it as one ``mixit: warning: ...`` line, like
its other warnings; the Python API leaves it to the `warnings` module.
"""

import contextlib
import importlib
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

from safetensors import SafetensorError


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


class DamagedFile(UsageError):
    """A file that mixit wrote and reads back (an export's, a run's) is missing, truncated or corrupt: the message
    names the file, what is wrong with it and what to do (`damaged`)."""


@contextlib.contextmanager
def damaged(file: Path, remedy: str) -> Iterator[None]:
    """Turn what reading `file` raises, where it is missing, truncated or corrupt, into one `DamagedFile` line
    naming it and `remedy` (what to do).

    Libraries raise on such a file: OSError (FileNotFoundError where it is missing), ValueError (json's
    JSONDecodeError), KeyError and TypeError (an entry it lacks, or of another type), RuntimeError (torch's
    ``load_state_dict`` on a size mismatch) and safetensors' SafetensorError. A UsageError of mixit's own, which
    names the file already, gets `remedy` added. Code inside should read the file and no more: whatever raises
    there is said to be the file's fault."""
    try:
        yield
    except DamagedFile:
        raise
    except UsageError as e:
        raise DamagedFile(f"{e}; {remedy}") from None
    except FileNotFoundError:
        raise DamagedFile(f"{file} is missing; {remedy}") from None
    except (OSError, ValueError, KeyError, TypeError, RuntimeError, SafetensorError) as e:
        raise DamagedFile(f"{file} is corrupt or unreadable ({reason_of(e)}); {remedy}") from None


def reason_of(error: BaseException) -> str:
    """What a library's exception says, on one line: its type and its first line (an OSError's, its strerror, without
    the path it names)."""
    text = error.strerror if isinstance(error, OSError) and error.strerror else str(error).strip().partition("\n")[0]
    return f"{type(error).__name__}: {text}" if text else type(error).__name__
