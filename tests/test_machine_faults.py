"""Faults of the machine (docs/reliability.md, "Faults of the machine"): a full disk, no permission, a read-only
filesystem, a name too long for its filesystem and too many open files are each said in one line on stderr that
names the path and what to do, never with a traceback: exit status 2 where a check finds the fault before any work
(nothing is changed), 1 where work was under way (and what continues it). The full and read-only disks are real
filesystems, a small tmpfs mounted for the test (skipped where mounting is not permitted); so are the names too
long and the open files exhausted. Only a denied permission is simulated, since root passes permission bits."""

import errno
import json
import os
import resource
import shutil
import subprocess
from pathlib import Path

import pytest
from safetensors import SafetensorError

import mixit.core.training.loop
import mixit.files
import mixit.study
from mixit import MachineFault, Run, run_config, train
from mixit.cli import main
from mixit.errors import machine_fault

TINY = [
    "--task",
    "addition",
    "-p",
    "n_digits=2",
    "--d-model",
    "16",
    "--n-heads",
    "2",
    "--n-layers",
    "1",
    "--steps",
    "4",
    "--checkpoint-every",
    "2",
    "--batch-size",
    "8",
    "--test-size",
    "20",
    "--no-progress",
]
STUDY_FILE = """
name = "tiny"
[base]
task = "addition"
task_params = {n_digits = 2}
model = {d_model = 16, n_heads = 2, n_layers = 1}
train = {steps = 4, batch_size = 8, checkpoint_every = 2}
test_size = 20
[grid]
variant = ["standard"]
"""


def said(capsys, code: int, status: int, *words: str) -> str:
    """The one line a command said on stderr, after checking its exit status is `status` and that the line holds
    each of `words` and no traceback."""
    err = capsys.readouterr().err
    assert code == status, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert all(word in err for word in words), err
    return err.strip()


def snapshot(root: Path) -> dict[str, tuple[bytes | None, int]]:
    """Every file's bytes and every file's and directory's mtime under `root`: a refusal changes none."""
    return {
        str(p.relative_to(root)): (p.read_bytes() if p.is_file() else None, p.stat().st_mtime_ns)
        for p in [root, *sorted(root.rglob("*"))]
    }


@pytest.fixture
def disk(tmp_path):
    """A real filesystem of 4 MiB (a tmpfs), mounted for the test at tmp_path/disk."""
    path = tmp_path / "disk"
    path.mkdir()
    if shutil.which("mount") is None or os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root and mount(8)")
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(path)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"a tmpfs cannot be mounted here: {mounted.stderr.decode().strip()}")
    yield path
    subprocess.run(["umount", "--lazy", str(path)], check=True)


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A tiny finished run, on the ordinary disk."""
    run = tmp_path_factory.mktemp("finished") / "run"
    assert main(["train", *TINY, "--out", str(run)]) == 0
    return run


def fill(directory: Path) -> Path:
    """Fill the filesystem of `directory` to its last page with a ballast file; removing it makes room again."""
    ballast = directory / "ballast"
    fd = os.open(ballast, os.O_WRONLY | os.O_CREAT)
    try:
        while True:
            os.write(fd, bytes(1 << 16))
    except OSError as e:
        assert e.errno == errno.ENOSPC, e
    finally:
        os.close(fd)
    return ballast


def at_checkpoint(monkeypatch, step: int, before, after=lambda: None) -> None:
    """Call `before` just before checkpoint `step` is first written, and `after` once that write has ended (as
    another program filling the disk, and freeing it, would)."""
    save, met = mixit.core.training.loop.save_checkpoint, []

    def save_checkpoint(root, at, *args, **kwargs):
        if at != step or met:
            return save(root, at, *args, **kwargs)
        met.append(before())
        try:
            return save(root, at, *args, **kwargs)
        finally:
            after()

    monkeypatch.setattr(mixit.core.training.loop, "save_checkpoint", save_checkpoint)


# -- each fault, said ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "error, number, words",
    [
        (OSError(errno.ENOSPC, "No space left on device", "/d/f"), errno.ENOSPC, "no space left on device writing /d"),
        (SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)"), 28, "no space"),
        (SafetensorError('IoError(Os { code: 13, kind: PermissionDenied, message: "Permission denied" })'), 13, "deni"),
        (OSError(errno.EDQUOT, "Disk quota exceeded"), errno.EDQUOT, "disk quota exceeded; free some space"),
        (PermissionError(errno.EACCES, "Permission denied", "/d/.lock"), errno.EACCES, "permission denied on /d/.lock"),
        (PermissionError(errno.EPERM, "Operation not permitted", "/d"), errno.EPERM, "operation not permitted on /d"),
        (OSError(errno.EROFS, "Read-only file system", "/d"), errno.EROFS, "/d is on a read-only filesystem; remount"),
        (OSError(errno.ENAMETOOLONG, "File name too long", "/d"), errno.ENAMETOOLONG, "choose a shorter name"),
        (OSError(errno.EMFILE, "Too many open files", "/d/f"), errno.EMFILE, "in this process opening /d/f; raise"),
        (OSError(errno.ENFILE, "Too many open files in system"), errno.ENFILE, "open files on this machine; close"),
    ],
)
def test_each_fault_of_the_machine_is_one_line_naming_the_path_and_what_to_do(error, number, words):
    fault = machine_fault(error, then="go on")
    assert isinstance(fault, MachineFault) and isinstance(fault, OSError) and fault.errno == number
    assert words in str(fault) and str(fault).endswith(", then go on") and "\n" not in str(fault), str(fault)


def test_other_errors_are_not_faults_of_the_machine():
    assert machine_fault(FileNotFoundError(errno.ENOENT, "No such file or directory", "f")) is None
    assert machine_fault(SafetensorError("Error while deserializing header: HeaderTooLarge")) is None
    assert machine_fault(ValueError("no")) is None


# -- a full disk ----------------------------------------------------------------------------------------------------


def test_a_full_disk_while_training_is_one_line_and_the_run_resumes_where_there_is_room(disk, monkeypatch, capsys):
    out = disk / "run"
    at_checkpoint(monkeypatch, 4, lambda: fill(disk))
    line = said(capsys, main(["train", *TINY, "--out", str(out)]), 1, f"no space left on device writing {out}; free")
    assert line.endswith(f"then `mixit train --resume --out {out}` continues the run from its last checkpoint")
    # Left: the run up to its last checkpoint (step 2), and no half-written checkpoint to fill the disk further.
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["latest", "step_0000002"]
    assert Run.open(out).state() == "started" and not list(out.glob(".*.tmp"))
    (disk / "ballast").unlink()
    assert main(["train", *TINY, "--resume", "--out", str(out)]) == 0
    assert Run.open(out).summary()["steps"] == 4 and Run.open(out).checkpoints() == [4]


def test_train_from_python_raises_a_machine_fault_with_the_same_line(disk, monkeypatch):
    cfg = run_config(
        "addition", "standard", {"n_digits": 2}, d_model=16, n_heads=2, n_layers=1, steps=2, batch_size=8, test_size=20
    )
    at_checkpoint(monkeypatch, 2, lambda: fill(disk))
    with pytest.raises(MachineFault) as raised:
        train(cfg, disk / "run", progress=False)
    assert raised.value.errno == errno.ENOSPC and "\n" not in str(raised.value)
    assert str(raised.value).startswith(f"no space left on device writing {disk / 'run'}; free some space on it")


def test_a_full_disk_while_exporting_is_one_line_and_leaves_nothing(finished, disk, capsys):
    export = ["export", str(finished), "--to", "hub", "--out", str(disk / "export")]
    fill(disk)
    said(capsys, main(export), 1, f"no space left on device writing {disk}", "then run the export again")
    assert [p.name for p in disk.iterdir()] == ["ballast"]
    (disk / "ballast").unlink()
    assert main(export) == 0 and (disk / "export" / "config.json").is_file()


def test_a_study_records_a_run_failed_on_a_full_disk_and_its_own_fault_is_one_line(disk, tmp_path, monkeypatch, capsys):
    spec = tmp_path / "tiny.toml"
    spec.write_text(STUDY_FILE)
    out = disk / "study"
    args = ["reproduce", "--study", str(spec), "--out", str(out), "--executor", "sequential", "--no-progress"]
    # The disk is full while a run writes its checkpoint (another program's file, removed a moment later).
    at_checkpoint(monkeypatch, 4, lambda: fill(disk), lambda: (disk / "ballast").unlink())
    assert main(args) == 0
    capsys.readouterr()
    (record,) = (out / "failed").iterdir()
    error = json.loads(record.read_text())["error"]
    assert error.startswith("MachineFault: no space left on device writing") and "\n" not in error, error
    assert "`mixit train --resume --out" in error
    # The study's own process meets a full disk, writing the report once the failed run has resumed and finished.
    write_report = mixit.study.write_report
    monkeypatch.setattr(mixit.study, "write_report", lambda study_dir: (fill(disk), write_report(study_dir))[1])
    code = main([*args, "--retry-failed"])
    said(capsys, code, 1, f"no space left on device writing {out}", "the same command again resumes the study")
    assert Run.open(out / "runs" / record.stem).summary()["steps"] == 4
    monkeypatch.setattr(mixit.study, "write_report", write_report)
    (disk / "ballast").unlink()
    assert main(args) == 0 and (out / "report.md").is_file()


# -- a read-only filesystem, no permission --------------------------------------------------------------------------


def test_a_read_only_filesystem_is_refused_before_any_work_and_reading_goes_on(disk, capsys):
    run = disk / "run"
    assert main(["train", *TINY, "--steps", "2", "--out", str(run)]) == 0
    subprocess.run(["mount", "-o", "remount,ro", str(disk)], check=True)
    capsys.readouterr()
    before = snapshot(disk)
    said(capsys, main(["train", "--resume", "--out", str(run)]), 2, f"{run}/.lock is on a read-only filesystem")
    said(capsys, main(["train", *TINY, "--out", str(disk / "new")]), 2, f"{disk} is on a read-only filesystem")
    said(capsys, main(["analyze", str(run)]), 2, "read-only filesystem; remount it read-write")
    assert snapshot(disk) == before
    assert main(["eval", str(run)]) == 0


def test_no_permission_on_another_users_run_is_refused_before_any_work(finished, tmp_path, monkeypatch, capsys):
    """Root passes permission bits, so the lock file of a run owned by another user, which its owner alone may
    write, is simulated: opening it raises the EACCES that a user other than its owner meets."""
    run = tmp_path / "theirs"
    shutil.copytree(finished, run)

    def open_denied(path, *args, **kwargs):
        if Path(path).name == ".lock":
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))
        return open(path, *args, **kwargs)

    monkeypatch.setattr(mixit.files, "open", open_denied, raising=False)
    before = snapshot(run)
    said(capsys, main(["train", "--resume", "--out", str(run)]), 2, f"permission denied on {run}/.lock; give this")
    assert snapshot(run) == before


# -- a name too long, too many open files ---------------------------------------------------------------------------


def test_a_name_too_long_for_its_filesystem_is_refused_before_any_work(finished, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tiny.toml").write_text(STUDY_FILE)
    long, wide = "a" * 300, "é" * 200  # 300 bytes, and 200 characters of 400 bytes: NAME_MAX counts bytes
    for args in (
        ["train", *TINY, "--out", long],
        ["train", *TINY, "--out", f"runs/{wide}/run"],
        ["train", "--resume", "--out", long],
        ["eval", long],
        ["signal", "--out", long],
        ["export", str(finished), "--out", long],
        ["reproduce", "--study", "tiny.toml", "--out", long, "--executor", "sequential"],
    ):
        said(capsys, main(args), 2, "is too long for its filesystem; choose a shorter name")
    assert os.listdir(tmp_path) == ["tiny.toml"]


def test_too_many_open_files_while_training_is_one_line_and_the_run_resumes(tmp_path, monkeypatch, capsys):
    """A real EMFILE: this process's limit of open files is lowered, and every file it allows is held open while a
    checkpoint is written."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    held: list[int] = []

    def exhaust() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (len(os.listdir("/proc/self/fd")) + 16, hard))
        try:
            while True:
                held.append(os.open(os.devnull, os.O_RDONLY))
        except OSError as e:
            assert e.errno == errno.EMFILE, e

    def release() -> None:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))

    out = tmp_path / "run"
    at_checkpoint(monkeypatch, 4, exhaust, release)
    said(capsys, main(["train", *TINY, "--out", str(out)]), 1, "too many open files in this process", "ulimit -n")
    assert Run.open(out).checkpoints() == [2]
    assert main(["train", *TINY, "--resume", "--out", str(out)]) == 0
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["latest", "step_0000004"]
