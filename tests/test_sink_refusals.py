"""Refusals before any work at the tracking sinks, export-logs and analyze --over-time (docs/reliability.md):
each ends in exit status 2 and one line on stderr, and leaves the run or study directory byte for byte as it was
(or not created). No test needs a network: an unreachable tracking server is a local port just closed."""

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from mixit import Run, run_config, tracking, train
from mixit.cli import main
from mixit.errors import UsageError
from text_fixtures import sentiment_rows

TINY = dict(d_model=16, n_heads=2, n_layers=1, steps=4, batch_size=8, test_size=20, checkpoint_every=2)
TRAIN = ["--task", "addition", "-p", "n_digits=2", "--d-model", "16", "--n-heads", "2", "--n-layers", "1"]
TRAIN += ["--steps", "2", "--batch-size", "8", "--test-size", "20", "--no-progress"]

STUDY_FILE = """
name = "tiny"
[base]
task = "addition"
task_params = {n_digits = 2}
model = {d_model = 16, n_heads = 2, n_layers = 1}
train = {steps = 2, batch_size = 8}
test_size = 20
"""


def snapshot(path: Path) -> dict[str, bytes] | None:
    """Every file under `path` (hidden ones, the lock file, included) with its bytes; None if `path` is absent."""
    if not path.exists():
        return None
    return {str(f.relative_to(path)): f.read_bytes() for f in sorted(path.rglob("*")) if f.is_file()}


def refused(capsys, argv: list[str], where: Path, *wanted: str) -> str:
    """Run `mixit argv`; assert exit status 2, one line `mixit COMMAND: error: ...` holding each of `wanted`,
    and `where` unchanged (or still absent). Returns the line."""
    before = snapshot(where)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"mixit {argv[0]}: error: "), err
    for text in wanted:
        assert text in err, err
    assert snapshot(where) == before
    return err.strip()


@pytest.fixture
def closed_url():
    """An http URL nothing listens at: a port bound, then closed (refused at once, no network needed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A tiny run trained without a sink, with checkpoints kept at steps 2 and 4."""
    path = tmp_path_factory.mktemp("trained") / "run"
    train(run_config("addition", "standard", {"n_digits": 2}, **TINY), path, progress=False, keep_checkpoints="all")
    return path


@pytest.fixture
def run(trained, tmp_path):
    """A copy of `trained` whose lock file names another process (so that a stamp by this one would show)."""
    path = tmp_path / "run"
    shutil.copytree(trained, path)
    (path / ".lock").write_text("1\n")
    return path


@pytest.fixture
def blocked(tmp_path):
    """A path under a file: no directory can be made there."""
    (tmp_path / "a-file").write_text("")
    return tmp_path / "a-file" / "store"


# -- train and reproduce: the sinks' settings ---------------------------------------------------


def test_an_unreachable_mlflow_server_is_refused_at_once(tmp_path, capsys, monkeypatch, closed_url):
    """At once: after one connection attempt bounded by REACH_TIMEOUT_S, not MLflow's retry loop (minutes). Told
    by the attempts made, not by the clock, which a busy machine slows."""
    monkeypatch.setenv("MLFLOW_TRACKING_URI", closed_url)
    attempts = []

    def connect(address, timeout=None, *args, **kwargs):
        attempts.append((address, timeout))
        return real_connect(address, timeout, *args, **kwargs)

    real_connect = socket.create_connection
    monkeypatch.setattr(tracking.socket, "create_connection", connect)
    out = tmp_path / "run"
    line = refused(capsys, ["train", *TRAIN, "--logger", "mlflow", "--out", str(out)], out)
    port = int(closed_url.rsplit(":", 1)[1].strip("/"))
    assert attempts == [(("127.0.0.1", port), tracking.REACH_TIMEOUT_S)], attempts
    assert line.startswith(f"mixit train: error: --logger mlflow: no server answers at {closed_url} (")
    assert line.endswith("start the MLflow server, or set MLFLOW_TRACKING_URI to one that answers")
    (tmp_path / "s.toml").write_text(STUDY_FILE)
    study = tmp_path / "study"
    argv = ["reproduce", "--study", str(tmp_path / "s.toml"), "--out", str(study), "--logger", "tensorboard,mlflow"]
    refused(capsys, argv, study, f"--logger mlflow: no server answers at {closed_url}")


def test_an_mlflow_session_leaves_the_tracking_uri_to_the_environment(tmp_path, capsys, monkeypatch, closed_url):
    """A session sent to MLflow does not pin MLflow's tracking URI for the rest of the process: a later command in
    it checks the store MLFLOW_TRACKING_URI names by then."""
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    assert main(["train", *TRAIN, "--logger", "mlflow", "--out", str(tmp_path / "first")]) == 0
    capsys.readouterr()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", closed_url)
    out = tmp_path / "second"
    line = refused(capsys, ["train", *TRAIN, "--logger", "mlflow", "--out", str(out)], out)
    assert f"--logger mlflow: no server answers at {closed_url}" in line


@pytest.mark.parametrize(
    "uri, wanted",
    [
        (
            "nosuchscheme://x",
            "tracking URI 'nosuchscheme://x' has a scheme MLflow does not know; set MLFLOW_TRACKING_URI",
        ),
        ("{blocked}", "cannot create {blocked}"),
        ("file://{blocked}", "cannot create {blocked}"),
        ("sqlite:///{blocked}/mlflow.db", "cannot create {blocked}"),
    ],
)
def test_an_mlflow_store_that_cannot_work_is_refused(tmp_path, capsys, monkeypatch, blocked, uri, wanted):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri.format(blocked=blocked))
    out = tmp_path / "run"
    refused(capsys, ["train", *TRAIN, "--logger", "mlflow", "--out", str(out)], out, wanted.format(blocked=blocked))


@pytest.mark.parametrize("mode", ["bogus", ""])
def test_a_wandb_mode_wandb_does_not_know_is_refused(tmp_path, capsys, monkeypatch, mode):
    monkeypatch.setenv("WANDB_MODE", mode)
    out = tmp_path / "run"
    line = refused(capsys, ["train", *TRAIN, "--logger", "wandb", "--out", str(out)], out)
    assert line == (
        f"mixit train: error: --logger wandb: WANDB_MODE {mode!r} is not a W&B mode; set it to one of online, "
        f"offline, shared, disabled, dryrun, run"
    )


def test_a_trackio_store_that_cannot_be_written_is_refused(tmp_path, capsys, monkeypatch, blocked):
    # trackio reads TRACKIO_DIR once, when imported: the check asks trackio where its store is.
    monkeypatch.setattr("trackio.utils.TRACKIO_DIR", blocked)
    out = tmp_path / "run"
    refused(
        capsys,
        ["train", *TRAIN, "--logger", "trackio", "--out", str(out)],
        out,
        f"--logger trackio: cannot create {blocked}",
        "set TRACKIO_DIR to a writable directory",
    )


def test_a_resume_checks_the_run_s_own_sink_directories_and_mlflow_store(run, capsys, monkeypatch, closed_url):
    resume = ["train", "--resume", "--out", str(run), "--no-progress"]
    (run / "tensorboard").write_text("not a directory")
    refused(capsys, [*resume, "--logger", "tensorboard"], run, "--logger tensorboard: output path", "tensorboard")
    (run / "tensorboard").unlink()
    # The MLflow run of a resumed run lives where tracking.json says, whatever MLFLOW_TRACKING_URI says now.
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{run.parent / 'mlflow.db'}")
    (run / "tracking.json").write_text(json.dumps({"mlflow": {"run_id": "x", "tracking_uri": closed_url, "events": 3}}))
    refused(capsys, [*resume, "--logger", "mlflow"], run, f"no server answers at {closed_url}", "tracking.json")
    # A sink the run remembers is checked though --logger does not name it, from the CLI and from Python.
    refused(capsys, resume, run, f"--logger mlflow: no server answers at {closed_url}", "tracking.json")
    before = snapshot(run)
    with pytest.raises(UsageError, match=f"--logger mlflow: no server answers at {closed_url}"):
        train(Run.open(run).config, run, resume=True, progress=False, tracking=tracking.Tracking())
    assert snapshot(run) == before


@pytest.mark.parametrize(
    "option, value, why",
    [
        ("--tracking-project", "team/mixit", "it holds /; give 1 to 128 printable characters, none of / \\ # ? % :"),
        ("--tracking-project", "a:b", "it holds :"),
        ("--tracking-project", "", "it is blank"),
        ("--tracking-project", "p" * 129, "it is 129 characters long"),
        ("--tracking-name", "  ", "it is blank; give 1 to 128 printable characters"),
        ("--tracking-name", "two\nlines", "it holds \\n"),
    ],
)
def test_a_bad_tracking_project_or_name_is_refused_before_anything_is_written(
    run, tmp_path, capsys, option, value, why
):
    """By every command that takes them, in one line naming the option, before the sinks are checked: train,
    reproduce (whose workers get them as checked), export-logs."""
    wanted = f"{option} {value!r}: {why}"
    out = tmp_path / "new"
    refused(capsys, ["train", *TRAIN, "--logger", "tensorboard", option, value, "--out", str(out)], out, wanted)
    (tmp_path / "s.toml").write_text(STUDY_FILE)
    study = tmp_path / "study"
    argv = ["reproduce", "--study", str(tmp_path / "s.toml"), "--out", str(study), "--logger", "tensorboard"]
    refused(capsys, [*argv, option, value], study, wanted)
    refused(capsys, ["export-logs", str(run), "--to", "tensorboard", option, value], run, wanted)


def test_a_tracking_project_or_name_without_a_sink_is_refused(tmp_path, capsys):
    """Without --logger they would be accepted and do nothing: train and reproduce refuse them in one line."""
    wanted = "--tracking-project and --tracking-name name runs in a tracking sink, and --logger names none"
    named = ["--tracking-project", "proj", "--tracking-name", "trial"]
    out = tmp_path / "new"
    line = refused(capsys, ["train", *TRAIN, *named, "--out", str(out)], out, wanted)
    assert "add --logger with one or more of tensorboard, wandb, mlflow, trackio" in line
    (tmp_path / "s.toml").write_text(STUDY_FILE)
    study = tmp_path / "study"
    argv = ["reproduce", "--study", str(tmp_path / "s.toml"), "--out", str(study), "--tracking-name", "trial"]
    refused(capsys, argv, study, "--tracking-name name runs in a tracking sink, and --logger names none")


# -- export-logs ------------------------------------------------------------------------------


def test_export_logs_with_nothing_to_export_is_refused(run, capsys):
    line = refused(capsys, ["export-logs", str(run), "--to", ""], run)
    assert (
        line == "mixit export-logs: error: --to names no sink; give one or more of tensorboard, wandb, mlflow, trackio"
    )


def test_export_logs_to_a_sink_that_cannot_work_writes_nothing(run, capsys, monkeypatch, closed_url):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", closed_url)
    refused(capsys, ["export-logs", str(run), "--to", "mlflow"], run, f"--to mlflow: no server answers at {closed_url}")
    monkeypatch.setenv("WANDB_MODE", "bogus")
    refused(capsys, ["export-logs", str(run), "--to", "wandb"], run, "--to wandb: WANDB_MODE 'bogus' is not a W&B mode")
    (run / "tensorboard").write_text("not a directory")
    refused(capsys, ["export-logs", str(run), "--to", "tensorboard"], run, "--to tensorboard: output path")
    assert not (run / "tracking.json").exists()


def test_export_logs_of_a_damaged_run_leaves_even_its_lock_file_as_it_was(run, capsys):
    lines = (run / "metrics.jsonl").read_text().splitlines()
    (run / "metrics.jsonl").write_text("\n".join([lines[0], "{torn", *lines[1:]]) + "\n")
    refused(capsys, ["export-logs", str(run), "--to", "tensorboard"], run, "metrics.jsonl is corrupt at line 2")
    assert (run / ".lock").read_text() == "1\n"


def test_export_logs_of_a_study_checks_every_run_before_sending_any(trained, tmp_path, capsys):
    study = tmp_path / "study"
    config = Run.open(trained).config.to_dict()
    entries = [{"id": name, "labels": [{"run": name}], "config": config} for name in ("a", "b")]
    (study / "runs").mkdir(parents=True)
    (study / "study.json").write_text(json.dumps({"name": "tiny", "runs": entries}))
    for name in ("a", "b"):
        shutil.copytree(trained, study / "runs" / name)
    (study / "runs" / "b" / "summary.json").write_text("[]")
    refused(capsys, ["export-logs", str(study), "--to", "tensorboard"], study, "summary.json is corrupt")


# -- analyze --over-time ------------------------------------------------------------------------


def test_analyze_over_time_with_a_damaged_checkpoint_writes_nothing(run, capsys):
    damaged = run / "checkpoints" / "step_0000002" / "model.safetensors"
    damaged.write_bytes(damaged.read_bytes()[:100])
    refused(capsys, ["analyze", str(run), "--batch", "4", "--over-time"], run, f"checkpoint file {damaged} is corrupt")
    assert not (run / "analysis").exists()


# -- warnings -----------------------------------------------------------------------------------


def test_mixit_s_own_warnings_are_one_line_on_the_command_line(tmp_path, capsys):
    rows = [*sentiment_rows(200), {"text": "", "label": 1}, {"text": None, "label": 0}]
    data = tmp_path / "gaps.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    argv = ["train", "--task", "sentiment", "-p", f"dataset={data}", "-p", "length=16", "-p", "vocab=300"]
    argv += ["--d-model", "16", "--n-heads", "2", "--n-layers", "1", "--steps", "1", "--batch-size", "8"]
    assert main([*argv, "--no-progress", "--out", str(tmp_path / "run")]) == 0
    assert capsys.readouterr().err.splitlines() == [f"mixit: warning: {data}: skipped 2 empty text(s)"]


def test_mixit_s_own_warnings_are_one_line_in_a_study_s_workers(tmp_path):
    """The pool's workers (two runs, two workers: not the study's own process) build the task, and warn there:
    the same one line, not Python's two."""
    rows = [*sentiment_rows(200), {"text": "", "label": 1}, {"text": None, "label": 0}]
    data = tmp_path / "gaps.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    study = tmp_path / "study.toml"
    study.write_text(
        f'name = "gaps"\nseeds = 2\n[base]\ntask = "sentiment"\n'
        f'task_params = {{dataset = "{data}", length = 16, vocab = 300}}\n'
        "model = {d_model = 16, n_heads = 2, n_layers = 1}\ntrain = {steps = 1, batch_size = 8}\ntest_size = 20\n"
    )
    argv = ["reproduce", "--study", str(study), "--workers", "2", "--no-progress", "--out", str(tmp_path / "out")]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-m", "mixit", *argv], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"mixit: warning: {data}: skipped 2 empty text(s)" in done.stderr.splitlines(), done.stderr
    assert "UserWarning" not in done.stderr and "MixitWarning" not in done.stderr, done.stderr
