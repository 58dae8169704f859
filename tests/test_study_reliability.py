"""Studies and reports under bad input and killed processes (docs/reliability.md, "Studies and reports"):
every refusal is one line on stderr, exit status 2, no traceback, and leaves every byte and mtime of the
study directory as it was; a study's pool workers never outlive it."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mixit.cli import main
from mixit.study import load_study_file

ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
STUDY_FILE = """
name = "{name}"
[base]
task = "addition"
task_params = {{n_digits = 2}}
model = {{d_model = 16, n_heads = 2, n_layers = 1}}
train = {{steps = {steps}, batch_size = 16, checkpoint_every = {every}}}
test_size = 40
[grid]
variant = ["standard", "mixit"]
"""
TRAIN = ["--task", "addition", "-p", "n_digits=2", "--d-model", "16", "--n-heads", "2", "--n-layers", "1"]


def study_file(path: Path, name: str = "tiny", steps: int = 6, every: int = 2) -> Path:
    path.write_text(STUDY_FILE.format(name=name, steps=steps, every=every))
    return path


def reproduce_args(study: Path, out: Path, *more: str) -> list[str]:
    return ["reproduce", "--study", str(study), "--out", str(out), "--executor", "sequential", "--no-progress", *more]


def snapshot(root: Path) -> dict[str, tuple[bytes | None, int]]:
    """Every file's bytes and every file's and directory's mtime under `root` (and root's own)."""
    paths = [root, *sorted(root.rglob("*"))] if root.exists() else []
    return {str(p.relative_to(root)): (p.read_bytes() if p.is_file() else None, p.stat().st_mtime_ns) for p in paths}


def assert_refused(capsys, args: list[str], message: str, root: Path) -> None:
    """`mixit ARGS` exits 2 with one line on stderr naming `message`, and changes nothing under `root`."""
    before = snapshot(root)
    time.sleep(0.01)  # an mtime written now would differ from the snapshot's
    assert main(args) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err, (args, err)
    assert snapshot(root) == before, args


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A tiny finished study (two runs, its report written), and its study file."""
    root = tmp_path_factory.mktemp("study")
    spec = study_file(root / "tiny.toml")
    assert main(reproduce_args(spec, root / "study")) == 0
    return root / "study", spec


@pytest.fixture
def study(finished, tmp_path):
    """A copy of the finished study to damage, and its study file."""
    shutil.copytree(finished[0], tmp_path / "study")
    return tmp_path / "study", finished[1]


def test_reproduce_refuses_an_output_directory_that_holds_something_else(study, tmp_path, capsys):
    out, spec = study
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("my notes")
    (mine / "report.md").write_text("my report")
    assert_refused(capsys, reproduce_args(spec, mine), f"{mine} holds files that are not a mixit study", mine)
    run = tmp_path / "run"
    assert main(["train", *TRAIN, "--steps", "2", "--test-size", "20", "--no-progress", "--out", str(run)]) == 0
    capsys.readouterr()
    assert_refused(capsys, reproduce_args(spec, run), f"{run} holds a mixit run, not a study", run)
    other = study_file(tmp_path / "other.toml", name="other")
    assert_refused(capsys, reproduce_args(other, out), f"{out} holds another study (tiny, not other)", out)
    # The same name, other runs: the refusal names what changed in the file, as "KEY OLD -> NEW".
    longer = study_file(tmp_path / "tiny.toml", steps=8)
    assert_refused(
        capsys, reproduce_args(longer, out), "(tiny as its study.json records it: base.train.steps 6 -> 8)", out
    )
    wider = tmp_path / "wider.toml"
    wider.write_text(spec.read_text().replace('["standard", "mixit"]', '["standard", "mixit", "frozen_qk"]'))
    changed = 'grid.variant ["standard", "mixit"] -> ["standard", "mixit", "frozen_qk"]); choose another output'
    assert_refused(capsys, reproduce_args(wider, out), changed, out)
    # Accepted: this same study (resumed: nothing left to do), and an empty directory.
    assert main(reproduce_args(spec, out)) == 0
    assert "runs: 2 done" in capsys.readouterr().out
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(reproduce_args(spec, empty)) == 0
    (out / "study.json").write_text("[1, 2]")
    assert_refused(capsys, reproduce_args(spec, out), "holds another study (?", out)


def test_a_study_grows_by_seeds_in_its_directory_and_keeps_its_runs(study, tmp_path, capsys):
    out, spec = study
    kept = {p.parent.name: p.read_bytes() for p in (out / "runs").glob("*/summary.json")}
    stamps = {name: (out / "runs" / name / "summary.json").stat().st_mtime_ns for name in kept}
    # Refused, nothing changed: seeds that do not include the directory's (seed 5 only), and fewer seeds.
    assert_refused(capsys, reproduce_args(spec, out, "--first-seed", "5"), "records it: first_seed 0 -> 5)", out)
    assert main(reproduce_args(spec, out, "--seeds", "2")) == 0
    assert "runs: 4 done" in capsys.readouterr().out
    assert {p.parent.name for p in (out / "runs").glob("*/summary.json")} > set(kept)
    for name, data in kept.items():  # seed 0's runs adopted as they were, not trained again
        path = out / "runs" / name / "summary.json"
        assert path.read_bytes() == data and path.stat().st_mtime_ns == stamps[name]
    assert json.loads((out / "study.json").read_text())["seeds"] == 2
    assert_refused(capsys, reproduce_args(spec, out), "records it: seeds 2 -> 1)", out)


def test_options_of_the_paper_study_beside_a_study_file_are_refused(tmp_path, capsys):
    """Beside a file, --seeds other than the file's own, --preset, --list and --test-seed would be ignored: each is
    refused in one line naming both, before anything is written. --seeds beside a file that sets none is its seeds."""
    spec = tmp_path / "seeded.toml"
    spec.write_text(study_file(tmp_path / "tiny.toml").read_text().replace("[base]", "seeds = 2\n[base]"))
    out = tmp_path / "out"
    for more, message in (
        (["--seeds", "3"], f"--seeds 3 differs from seeds = 2 in study file {spec}, and a study is its file"),
        (["--preset", "smoke"], "--preset chooses the paper study's scale, and --study runs a study file instead"),
        (["--list"], "--list lists the paper study's presets, and --study runs a study file instead"),
        (["--test-seed", "5"], "--test-seed sets a preset's test sets"),
    ):
        assert_refused(capsys, reproduce_args(spec, out, *more), message, tmp_path)
        assert not out.exists()
    assert load_study_file(spec, seeds=2).seeds == 2  # the file's own seeds, given again
    assert load_study_file(tmp_path / "tiny.toml", seeds=3).seeds == 3  # a file that sets none: --seeds sets them


def test_a_study_says_its_size_before_its_work(study, capsys):
    """With its progress bar, a study's first line is its size: final runs and the time they may take here."""
    out, spec = study
    assert main(reproduce_args(spec, out)[:-1]) == 0  # resumed: nothing left to train
    first = capsys.readouterr().err.splitlines()[0]
    assert first == "tiny: 2 final runs, under a minute on this machine", first


def test_reproduce_refuses_a_study_path_that_is_not_a_readable_file(tmp_path, capsys):
    out = tmp_path / "out"
    assert_refused(capsys, reproduce_args(tmp_path, out), f"study file {tmp_path} is not a readable file", tmp_path)
    assert not out.exists()


def test_reproduce_refuses_slurm_without_slurm(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))  # no sbatch, no srun
    spec = study_file(tmp_path / "tiny.toml")
    args = ["reproduce", "--study", str(spec), "--out", str(tmp_path / "out"), "--executor", "slurm"]
    message = "--executor slurm needs Slurm, and this machine has none"
    assert_refused(capsys, args, message, tmp_path)
    assert main(args) == 2 and "--executor local" in capsys.readouterr().err


def damage(out: Path, how: str) -> None:
    """Damage the study in `out` as `how` says."""
    path = out / "study.json"
    record = json.loads(path.read_text())
    first = record["runs"][0]["id"]
    if how == "entry_without_config":
        del record["runs"][0]["config"]
    elif how == "runs_not_a_list":
        record["runs"] = {"a": 1}
    elif how == "entry_id_a_path":
        record["runs"][0]["id"] = "../../elsewhere"
    elif how == "figures_a_file":
        shutil.rmtree(out / "figures")
        (out / "figures").write_text("mine")
    elif how == "failure_record_a_list":
        shutil.rmtree(out / "runs" / first)
        (out / "failed").mkdir()
        (out / "failed" / f"{first}.json").write_text("[]")
    elif how == "report_a_directory":
        (out / "results.csv").unlink()
        (out / "results.csv").mkdir()
    path.write_text(json.dumps(record))


@pytest.mark.parametrize(
    "how, message",
    [
        ("entry_without_config", "study.json is damaged: runs[0] has no 'config'"),
        ("runs_not_a_list", "study.json is damaged: 'runs' is not a list but dict"),
        ("entry_id_a_path", "study.json is damaged: runs[0] has an id that is not a run id"),
        ("figures_a_file", "figures exists and is not a directory"),
        ("failure_record_a_list", ".json is damaged: a failure record is a JSON object, not list"),
        ("report_a_directory", "results.csv exists and is not a file"),
    ],
)
def test_report_refuses_a_damaged_study_in_one_line(study, capsys, how, message):
    out, _ = study
    damage(out, how)
    assert_refused(capsys, ["report", str(out)], message, out)


def test_a_damaged_run_is_reported_as_damaged_and_the_rest_still_reported(study, capsys):
    out, _ = study
    record = json.loads((out / "study.json").read_text())
    broken, intact = (entry["id"] for entry in record["runs"])
    (out / "runs" / broken / "summary.json").write_text("{torn")
    assert main(["report", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "1 done, 0 failed, 1 damaged (see the report)" in printed
    report = (out / "report.md").read_text()
    assert "## Damaged runs" in report and f"`{broken}`: " in report and "summary.json is corrupt" in report
    rows = {row.split(",")[0]: row for row in (out / "results.csv").read_text().splitlines()[1:]}
    assert ",damaged," in rows[broken] and ",done," in rows[intact]


def children(pid: int) -> list[int]:
    """The pids of the processes whose parent is `pid` (Linux /proc)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(stat.parent.name))
        except (OSError, IndexError, ValueError):
            continue
    return found


def gone(pid: int) -> bool:
    """Whether `pid` has ended (absent, or a zombie nobody has reaped yet)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except OSError:
        return True


def start_pool_study(tmp_path: Path, steps: int) -> tuple[subprocess.Popen, list[str], list[int]]:
    """`mixit reproduce` on a pool of two workers, held once both runs have a checkpoint: (process, args, workers).

    Each worker is stopped (SIGSTOP) as soon as its run has its first checkpoint, and stays stopped, so that
    neither run can finish while the other starts, however slow or busy the machine (a worker that starts late
    must not find the other run done). The caller continues them (SIGCONT) where it needs them running."""
    spec = study_file(tmp_path / "tiny.toml", steps=steps, every=10)
    out = tmp_path / "study"
    args = [sys.executable, "-m", "mixit.cli", *reproduce_args(spec, out)[:-2], "local", "--workers", "2"]
    args.append("--no-progress")
    proc = subprocess.Popen(
        args,
        env=ENV,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        # A background job of a non-interactive shell inherits SIGINT ignored (and Python then keeps it so):
        # the study must see it as a terminal's Ctrl-C would.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    held: dict[Path, int] = {}
    deadline = time.time() + 300
    while len(held) < 2 and time.time() < deadline and proc.poll() is None:
        for latest in (out / "runs").glob("*/checkpoints/latest"):
            run = latest.parent.parent
            if run not in held:  # the run's lock names the worker training it
                held[run] = int((run / ".lock").read_text())
                os.kill(held[run], signal.SIGSTOP)
        time.sleep(0.01)
    workers = [p for p in children(proc.pid) if b"spawn_main" in Path(f"/proc/{p}/cmdline").read_bytes()]
    try:
        assert sorted(held.values()) == sorted(workers), (held, workers, proc.poll())
        assert not list((out / "runs").glob("*/summary.json")), f"a run of {steps} steps ended before it was held"
    except AssertionError:
        proc.kill()  # its workers with it
        proc.wait()
        raise
    return proc, args, workers


def wait_gone(pids: list[int], seconds: float = 10.0) -> list[int]:
    """The pids of `pids` still running after up to `seconds`."""
    deadline = time.time() + seconds
    while time.time() < deadline and not all(gone(p) for p in pids):
        time.sleep(0.05)
    return [p for p in pids if not gone(p)]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_killed_studys_workers_die_with_it_and_its_runs_resume(tmp_path):
    proc, args, workers = start_pool_study(tmp_path, steps=400)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    for pid in workers:  # continued only now, so neither run can finish first: each ends once it sees its study gone
        os.kill(pid, signal.SIGCONT)
    left = wait_gone(workers, 60.0)  # a bound, not a speed: a worker ends as soon as it runs
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert not left, "pool workers outlived their study"
    done = subprocess.run(args, env=ENV, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    out = tmp_path / "study"
    assert not (out / "failed").exists()
    for summary in (out / "runs").glob("*/summary.json"):
        assert json.loads(summary.read_text())["resumed_from"] > 0


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_sigint_to_the_study_alone_stops_its_workers_cleanly(tmp_path):
    proc, _, workers = start_pool_study(tmp_path, steps=100_000)  # never finishes before the signal arrives
    for pid in workers:
        os.kill(pid, signal.SIGCONT)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert not wait_gone(workers, 60.0)  # a bound, not a speed: the study's SIGKILL follows its SIGTERM at 30 s
