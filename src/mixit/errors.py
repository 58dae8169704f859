"""The exceptions for bad user input and for faults of the machine, and the category of mixit's own warnings.

Bad input raises `UsageError` before any work: one line, exit status 2. A fault of the machine (`WORDS`) is one
line too (`machine_fault`): refused where a check finds it before any work (`faults_refused`), a `MachineFault`
with exit status 1 once work is under way (`faults_said`; docs/reliability.md, "Faults of the machine").
"""

import contextlib
import errno
import importlib
import re
import sys
from collections.abc import Callable, Iterator
from os import PathLike
from pathlib import Path
from types import ModuleType
from typing import Any

from safetensors import SafetensorError


class UsageError(ValueError):
    """Invalid user input; the message names the problem and what is allowed."""


class Unimplemented(UsageError, NotImplementedError):
    """A task of one's own (a plugin's, say) lacks a member its base class asks for: refused as bad input, before any
    work, and still a NotImplementedError to code that catches one."""


class FaultRefused(UsageError):
    """A fault of the machine found by a check before any work (`faults_refused`); `damaged` adds nothing to it."""


class MachineFault(OSError):
    """A fault of the machine met while work was under way: one line naming the path and what to do
    (`machine_fault`), with the errno of the error it stands for."""


FAULTS: tuple[type[Exception], ...] = (OSError, SafetensorError)
"""What a fault of the machine is raised as: an OSError, or safetensors' error, whose message holds the errno."""

ACCESS = "give this user access to it, or choose a path of your own"

RUST_ERRNO = re.compile(r"\(os error (\d+)\)|Os \{ code: (\d+)")  # safetensors' wordings of Rust's io::Error

WORDS: dict[int, tuple[str, str, str]] = {
    errno.ENOSPC: ("no space left on device writing {path}", "no space left on device", "free some space on it"),
    errno.EDQUOT: ("disk quota exceeded writing {path}", "disk quota exceeded", "free some space within your quota"),
    errno.EACCES: ("permission denied on {path}", "permission denied", ACCESS),
    errno.EPERM: ("operation not permitted on {path}", "operation not permitted", ACCESS),
    errno.EROFS: (
        "{path} is on a read-only filesystem",
        "read-only filesystem",
        "remount it read-write, or choose a path on a writable one",
    ),
    errno.ENAMETOOLONG: (
        "a name in {path} is too long for its filesystem",
        "a file name is too long for its filesystem",
        "choose a shorter name",
    ),
    errno.EMFILE: (
        "too many open files in this process opening {path}",
        "too many open files in this process",
        "raise its limit ({limit} now) with ulimit -n, or run fewer processes at once",
    ),
    errno.ENFILE: (
        "too many open files on this machine opening {path}",
        "too many open files on this machine",
        "close other programs' files, or raise the system's limit (sysctl fs.file-max)",
    ),
}
"""Each fault of the machine by its errno: what happened at {path}, what happened where no path is known, and
what to do ({limit}: this process's limit of open files)."""


def fault_errno(error: BaseException) -> int | None:
    """The errno of `error` if it is a fault of the machine (one of `WORDS`), else None."""
    number: int | None = None
    if isinstance(error, OSError):
        number = error.errno
    elif isinstance(error, SafetensorError) and (found := RUST_ERRNO.search(str(error))):
        number = int(found.group(1) or found.group(2))
    return number if number in WORDS else None


def machine_fault(error: BaseException, path: str | PathLike[str] | None = None, then: str = "") -> MachineFault | None:
    """`error` as a MachineFault (`fault_line`, at the error's own file, else at `path`), or None where it is no
    fault of the machine (a bug, a missing file). A MachineFault is returned as it is."""
    if isinstance(error, MachineFault):
        return error
    number = fault_errno(error)
    if number is None:
        return None
    fault = MachineFault(fault_line(number, getattr(error, "filename", None) or path, then))
    fault.errno = number
    return fault


def fault_line(number: int, path: str | PathLike[str] | None = None, then: str = "") -> str:
    """The one line that says the fault with errno `number` (one of `WORDS`): what happened (at `path`, if known),
    what to do, and `then` what continues the work, if given."""
    import resource  # here, not at the top: Unix-only, and this module travels in every Hub export

    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    at, nowhere, fix = WORDS[number]
    what = at.format(path=path) if path is not None else nowhere
    limit = "unlimited" if soft == resource.RLIM_INFINITY else soft
    return f"{what}; {fix.format(limit=limit)}" + (f", then {then}" if then else "")


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
    """A `warnings.showwarning` for the CLI and a study's workers: a `MixitWarning` as one ``mixit: warning: ...``
    line, any other as `shown` (the previous one) shows it, with its file and line `where`."""
    if issubclass(category, MixitWarning):
        print(f"mixit: warning: {one_line(message)}", file=sys.stderr, flush=True)
    else:
        shown(message, category, *where)


@contextlib.contextmanager
def faults_said(path: str | PathLike[str] | None = None, then: str = "") -> Iterator[None]:
    """Within: a fault of the machine is met while work is under way: a MachineFault with its one line
    (`machine_fault`, at `path` where the error names no file, and `then` what continues the work)."""
    try:
        yield
    except FAULTS as e:
        fault = machine_fault(e, path, then)
        if fault is None or fault is e:
            raise
        raise fault from e


@contextlib.contextmanager
def faults_refused(path: str | PathLike[str] | None = None) -> Iterator[None]:
    """Within: a fault of the machine is found by a check before any work, so it is refused: a UsageError with its
    one line (`machine_fault`, at `path` where the error names no file)."""
    try:
        with faults_said(path):
            yield
    except MachineFault as e:
        raise FaultRefused(str(e)) from None


class DamagedFile(UsageError):
    """A file that mixit wrote and reads back is missing, truncated or corrupt: the message names it, what is
    wrong and what to do (`damaged`)."""


@contextlib.contextmanager
def damaged(file: Path, remedy: str) -> Iterator[None]:
    """Within: what reading `file` raises where it is missing, truncated or corrupt (a library's error, or a
    UsageError of mixit's own) becomes one `DamagedFile` line naming it and `remedy` (what to do). Code inside
    should read the file and no more: whatever raises there is blamed on it. A fault of the machine is refused as
    such (`faults_refused`): the file may be sound."""
    try:
        with faults_refused(file):
            yield
    except (DamagedFile, FaultRefused):
        raise
    except UsageError as e:
        raise DamagedFile(f"{e}; {remedy}") from None
    except FileNotFoundError:
        raise DamagedFile(f"{file} is missing; {remedy}") from None
    except (OSError, ValueError, KeyError, TypeError, RuntimeError, SafetensorError) as e:
        raise DamagedFile(f"{file} is corrupt or unreadable ({reason_of(e)}); {remedy}") from None


def reason_of(error: BaseException) -> str:
    """What a library's exception says, on one line: its type and first line (an OSError's strerror, without the
    path)."""
    text = error.strerror if isinstance(error, OSError) and error.strerror else str(error).strip().partition("\n")[0]
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def one_line(error: BaseException | Warning | str) -> str:
    """What `error` says, which may span lines, on one line."""
    return " ".join(str(error).split())
