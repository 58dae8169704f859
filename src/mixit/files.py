"""Small file helpers shared by everything that writes results: atomic writes, JSON reads that fail with one
clear line, the checks of a path to write into, and the lock of a directory."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import re
from pathlib import Path
from typing import IO, Any

from mixit.errors import UsageError, fault_errno, fault_line, faults_refused

TEMPORARY = re.compile(r"\..+\.[0-9]+\.tmp")  # `write_text`'s .NAME.PID.tmp: one left behind was a killed write's


def write_text(path: Path, text: str) -> None:
    """Write `text` to `path` atomically: into a temporary file beside it (`TEMPORARY`), flushed to disk, then
    renamed over `path`, so a reader (or a crash) sees the old file or the new one, never half of one."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:  # a failed write (a full disk) leaves no temporary file behind, to fill it further
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        if isinstance(e, OSError) and e.filename in (None, str(tmp)):  # said of the file written, not its temporary
            e.filename = str(path)
        raise


def write_json(path: Path, data: Any) -> None:
    """Write `data` as indented JSON, atomically (`write_text`)."""
    write_text(path, json.dumps(data, indent=2) + "\n")


def give_open_mode(path: Path) -> None:
    """Give the file `path` the mode `open(path, "w")` gives (0666 less the umask): safetensors writes through a
    temporary file created 0600, which a cluster's group cannot read. The umask is read from /proc/self/status
    where Linux has it, since setting it to read it changes it for every thread for a moment."""
    mask = None
    with contextlib.suppress(OSError, ValueError, StopIteration), open("/proc/self/status") as status:
        mask = int(next(line for line in status if line.startswith("Umask:")).split()[1], 8)
    if mask is None:
        mask = os.umask(0o077)
        os.umask(mask)
    with contextlib.suppress(PermissionError):  # a filesystem that keeps no modes leaves the file as it is
        os.chmod(path, 0o666 & ~mask)


def read_json(path: Path, what: str) -> Any:
    """The JSON in `path`; UsageError if it is missing, not valid JSON (`what` names it) or cannot be read (a fault
    of the machine, such as no permission: its one line)."""
    try:
        with faults_refused(path):
            return json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise UsageError(f"{path} does not exist ({what} missing)") from None
    except IsADirectoryError:
        raise UsageError(f"{path} is a directory, not {what}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise UsageError(f"{path} is corrupt ({what} is not valid JSON: {e})") from None


def remove_temporary(directory: Path) -> None:
    """Remove the temporary files that killed `write_text` calls left in `directory` (not below it). Only the
    holder of the directory's lock may: another process's write may be under way."""
    for path in Path(directory).glob(".*.tmp"):  # none where there is no such directory
        if TEMPORARY.fullmatch(path.name) and path.is_file():
            path.unlink(missing_ok=True)


def check_names(path: Path) -> None:
    """Refuse `path` before any work if a name in it is too long for its filesystem, where every write would meet
    ENAMETOOLONG: each name not there yet against the filesystem's NAME_MAX (in bytes), the whole against PATH_MAX."""
    absolute = Path(os.path.abspath(path))
    existing = absolute
    while not os.path.exists(existing):  # False for a path that cannot exist, a name too long among them
        existing = existing.parent
    try:
        longest_name, longest_path = os.pathconf(existing, "PC_NAME_MAX"), os.pathconf(existing, "PC_PATH_MAX")
    except (OSError, ValueError):  # a filesystem that does not say: the first write will
        return
    new = absolute.relative_to(existing).parts
    too_long = any(0 < longest_name < len(os.fsencode(name)) for name in new)  # -1: no limit
    if too_long or 0 < longest_path <= len(os.fsencode(absolute)):
        raise UsageError(fault_line(errno.ENAMETOOLONG, path))


def check_output_dir(path: Path, names: tuple[str, ...] = ()) -> None:
    """Refuse `path` as a directory to write `names` into, before any work: its names not too long
    (`check_names`), a directory or creatable as one, writable, and holding none of `names` (results are never
    overwritten)."""
    path = Path(path)
    check_names(path)
    if path.exists() and not path.is_dir():
        raise UsageError(f"output path {path} exists and is not a directory")
    for name in names:
        if (path / name).exists():
            raise UsageError(f"{path / name} already exists; choose another output directory")
    existing = path
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise UsageError(f"cannot create {path}: {existing} is not a directory")
    # Try it: permission bits say nothing to root, and some filesystems refuse every write. The directory's
    # times are put back, so that a command refused later has changed nothing.
    before = existing.stat()
    probe = existing / f".mixit-probe-{os.getpid()}"
    try:
        probe.touch()
        probe.unlink()
    except OSError as e:  # said of the directory, not of the probe
        number = fault_errno(e)
        reason = fault_line(number, existing) if number is not None else f"{existing} is not writable ({e.strerror})"
        raise UsageError(f"cannot write to {path}: {reason}") from None
    with contextlib.suppress(OSError):  # not this directory's owner: its times stay changed
        os.utime(existing, ns=(before.st_atime_ns, before.st_mtime_ns))


class DirectoryLock:
    """An exclusive lock on a directory: ``DIR/.lock``, an advisory ``flock`` that the kernel releases when the
    process ends, however it ends (no stale locks). The file holds the pid of the holder that last changed the
    directory (`stamp`), which a refused process names; taking the lock writes nothing, so a holder that must
    then refuse (to resume a different run, say) leaves the directory as it was."""

    NAME = ".lock"

    def __init__(self, directory: Path, what: str = "mixit process"):
        self.path = Path(directory) / self.NAME
        self.what = what
        self._handle: IO[str] | None = None

    def acquire(self, stamp: bool = True) -> None:
        """Take the lock, or refuse in one line naming the holder's pid; with `stamp`, record this process's pid at
        once (else `stamp` does, once the holder starts to change the directory). A fault of the machine opening
        the file (another user's directory, a read-only filesystem) is refused in one line."""
        with faults_refused(self.path):
            handle = open(self.path, "a+")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            handle.seek(0)
            holder = handle.read().strip() or "unknown"
            handle.close()
            raise UsageError(
                f"{self.path.parent} is in use by another {self.what} (pid {holder}); wait for it to finish or stop it"
            ) from None
        self._handle = handle
        if stamp:
            self.stamp()

    def stamp(self) -> None:
        """Record this process, which holds the lock, as the holder a refused process names."""
        assert self._handle is not None, "stamp() needs the lock held"
        self._handle.seek(0)
        self._handle.truncate()
        self._handle.write(f"{os.getpid()}\n")
        self._handle.flush()

    def release(self) -> None:
        """Give the lock back (the file stays; it holds no state)."""
        if self._handle is not None:
            fcntl.flock(self._handle, fcntl.LOCK_UN)
            self._handle.close()
            self._handle = None
