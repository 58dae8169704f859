"""Tracking sinks (docs/tracking.md): what TensorBoard, W&B, MLflow and trackio are sent equals metrics.jsonl,
every point once after a resume; a sink changes no config or run id; a missing package is refused in one line;
a failing sink never stops training; export-logs sends the runs trained without a sink; --tracking-project and
--tracking-name name the runs, a study's runs are named readably; TensorBoard's HParams tab compares runs."""

import json
import os
import struct
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest
import torch

from mixit import Run, run_config, train
from mixit.cli import main
from mixit.study import ReproduceOptions, reproduce
from mixit.study.spec import run_id
from mixit.tracking import TensorBoard, Tracking, points, summary_points, tracking_state
from tolerance import assert_close

TINY = dict(
    d_model=16,
    n_heads=2,
    n_layers=1,
    steps=10,
    batch_size=8,
    test_size=20,
    log_every=2,
    eval_every=5,
    checkpoint_every=5,
)
"""Events: freeze and eval at 0, train every 2 steps, eval at 5 and 10; checkpoints at 5 and 10."""

STUDY_FILE = """
name = "tiny"
[base]
task = "addition"
task_params = {n_digits = 2}
model = {d_model = 16, n_heads = 2, n_layers = 1}
train = {steps = 4, batch_size = 8}
test_size = 20
[grid]
variant = ["standard", "mixit"]
"""


SEARCHED_STUDY_FILE = (
    STUDY_FILE
    + """
[search]
"train.lr" = [1e-3, 1e-2]
"""
)

TRAIN_ARGS = ["--task", "addition", "-p", "n_digits=2", "--d-model", "16", "--n-heads", "2", "--n-layers", "1"]
TRAIN_ARGS += ["--steps", "4", "--batch-size", "8", "--test-size", "20", "--no-progress"]


def tiny_cfg(**kw):
    return run_config("addition", "standard", {"n_digits": 2}, **{**TINY, **kw})


class Stop(Exception):
    pass


def stop_at(step_to_stop):
    def on_step(step, loss):
        if step == step_to_stop:
            raise Stop

    return on_step


def interrupted_then_resumed(path, logger, before=None):
    """A tiny run stopped after step 7 (its last checkpoint at 5, so steps 6 and 7 run twice), then resumed to
    its end; `before`: the sinks of the first session (default: `logger`)."""
    cfg = tiny_cfg()
    with pytest.raises(Stop):
        train(cfg, path, progress=False, on_step=stop_at(7), tracking=Tracking(logger if before is None else before))
    train(cfg, path, resume=True, progress=False, tracking=Tracking(logger))


def expected(run_dir):
    """{name: [(step, value), ...]} of the run's metrics.jsonl, as the sinks name its points."""
    found = defaultdict(list)
    for event in Run.open(run_dir).metrics():
        for name, value in points(event).items():
            found[name].append((event["step"], value))
    return dict(found)


def tensorboard_scalars(run_dir):
    """{name: [(step, value), ...]} of every scalar in RUN/tensorboard, as TensorBoard reads it (purges applied)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    reader = EventAccumulator(str(Path(run_dir) / "tensorboard"))
    reader.Reload()
    return {tag: [(e.step, e.value) for e in reader.Scalars(tag)] for tag in reader.Tags()["scalars"]}


def event_files(run_dir):
    """RUN/tensorboard's event files, by TensorBoard's names for them."""
    return list((Path(run_dir) / "tensorboard").glob("events.out.tfevents.*"))


def tensorboard_reader(run_dir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    reader = EventAccumulator(str(Path(run_dir) / "tensorboard"))
    reader.Reload()
    return reader


def tensorboard_text(run_dir, name):
    """The text TensorBoard holds under `name` (config, tags) at step 0."""
    (event,) = tensorboard_reader(run_dir).Tensors(f"{name}/text_summary")
    assert event.step == 0
    return event.tensor_proto.string_val[0].decode()


def assert_same_points(got, want, resumed_in_place=False):
    """`got` holds every point of `want` once, of equal value (to float32's precision). `resumed_in_place`: a sink
    that kept the points the killed session had sent of the steps the resumed one ran again: bit-identical
    (resumption is exact), but for the wall time train/elapsed_s."""
    assert sorted(got) == sorted(want)
    for name in want:
        assert [s for s, _ in got[name]] == [s for s, _ in want[name]], name  # every step once, in order
        if not (resumed_in_place and name == "train/elapsed_s"):
            assert_close([v for _, v in got[name]], [v for _, v in want[name]], dtype=torch.float32, msg=name)


def split_summary(scalars):
    summary = {k: v for k, v in scalars.items() if k.startswith("summary/")}
    return {k: v for k, v in scalars.items() if k not in summary}, summary


# -- TensorBoard --------------------------------------------------------------------------


def test_tensorboard_reads_back_equal_to_metrics_jsonl(tmp_path):
    train(tiny_cfg(), tmp_path / "run", progress=False, tracking=Tracking(["tensorboard"]))
    scalars, summary = split_summary(tensorboard_scalars(tmp_path / "run"))
    assert_same_points(scalars, expected(tmp_path / "run"))
    assert {"train/loss", "train/lr", "test/exact_match", "val/exact_match", "freeze/n_trainable"} <= set(scalars)
    want = summary_points(Run.open(tmp_path / "run").summary())
    assert_close({k: v[0][1] for k, v in summary.items()}, want, dtype=torch.float32)  # stored as float32
    assert {v[0][0] for v in summary.values()} == {10}  # at the steps trained
    assert summary["summary/n_params"][0][1] == Run.open(tmp_path / "run").summary()["n_params"]


def test_a_resumed_run_sends_each_point_once(tmp_path):
    interrupted_then_resumed(tmp_path / "run", ["tensorboard"])
    assert len(event_files(tmp_path / "run")) == 1  # rewritten whole by each session
    assert_same_points(split_summary(tensorboard_scalars(tmp_path / "run"))[0], expected(tmp_path / "run"))


def test_a_sink_new_to_a_resumed_run_gets_what_came_before(tmp_path):
    interrupted_then_resumed(tmp_path / "run", ["tensorboard"], before=[])
    assert_same_points(split_summary(tensorboard_scalars(tmp_path / "run"))[0], expected(tmp_path / "run"))


def test_the_logger_changes_no_config_and_no_run_id(tmp_path):
    train(tiny_cfg(steps=2), tmp_path / "with", progress=False, tracking=Tracking(["tensorboard"]))
    train(tiny_cfg(steps=2), tmp_path / "without", progress=False)
    assert (tmp_path / "with" / "config.json").read_bytes() == (tmp_path / "without" / "config.json").read_bytes()
    assert run_id(Run.open(tmp_path / "with").config) == run_id(Run.open(tmp_path / "without").config)
    assert (tmp_path / "with" / "tracking.json").exists() and not (tmp_path / "without" / "tracking.json").exists()


def test_a_failing_sink_is_warned_about_once_and_training_goes_on(tmp_path, monkeypatch, capsys):
    log = TensorBoard.log
    calls = []

    def flaky(self, step, values):
        calls.append(step)
        if len(calls) > 3:
            raise OSError(28, "No space left on device")
        log(self, step, values)

    monkeypatch.setattr(TensorBoard, "log", flaky)
    with pytest.raises(Stop):  # training goes on past the failure (step 4), to where it is stopped
        train(tiny_cfg(), tmp_path / "run", progress=False, on_step=stop_at(7), tracking=Tracking(["tensorboard"]))
    warnings = [line for line in capsys.readouterr().err.splitlines() if "logger failed" in line]
    assert warnings == [
        "mixit: warning: the tensorboard logger failed (OSError: [Errno 28] No space left on device); nothing more "
        "goes to it in this session (metrics.jsonl holds every event; the next session sends it what it lacks)"
    ]
    assert calls == [0, 0, 2, 4]  # freeze and eval at 0, train at 2, then the failure: never called again
    assert [e["step"] for e in Run.open(tmp_path / "run").metrics() if e["event"] == "train"] == [2, 4, 6]
    assert tracking_state(Run.open(tmp_path / "run")) == {"tensorboard": {}}  # the run remembers its sink
    # The next session sends it what it missed, though not named again.
    monkeypatch.setattr(TensorBoard, "log", log)
    train(tiny_cfg(), tmp_path / "run", resume=True, progress=False, tracking=Tracking())
    assert_same_points(split_summary(tensorboard_scalars(tmp_path / "run"))[0], expected(tmp_path / "run"))


def test_a_resume_without_tracking_leaves_the_sinks_to_the_next_session_given_one(tmp_path, capsys):
    """From Python, `train(..., resume=True)` without `tracking` sends nothing to the sinks the run remembers; then
    `mixit train --resume` without --logger goes on in them, and they hold every point once."""
    path, cfg = tmp_path / "run", tiny_cfg(steps=15)  # checkpoints at 5, 10 and 15
    with pytest.raises(Stop):
        train(cfg, path, progress=False, on_step=stop_at(7), tracking=Tracking(["tensorboard"]))
    with pytest.raises(Stop):
        train(cfg, path, resume=True, progress=False, on_step=stop_at(12))
    assert [step for step, _ in tensorboard_scalars(path)["train/loss"]] == [2, 4, 6]  # the first session's alone
    assert tracking_state(Run.open(path)) == {"tensorboard": {}}
    assert main(["train", "--resume", "--out", str(path), "--no-progress"]) == 0
    capsys.readouterr()
    scalars, summary = split_summary(tensorboard_scalars(path))
    assert_same_points(scalars, expected(path))
    assert set(summary) == set(summary_points(Run.open(path).summary()))


# -- refusals -------------------------------------------------------------------------------


def test_a_missing_package_is_refused_in_one_line_before_anything_is_written(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "wandb", None)  # `import wandb` fails
    line = "--logger wandb needs the wandb package: pip install 'mixit-transformers[wandb]'"
    args = ["--task", "addition", "-p", "n_digits=2", "--d-model", "16", "--n-heads", "2", "--steps", "2"]
    assert main(["train", *args, "--logger", "tensorboard,wandb", "--out", str(tmp_path / "run")]) == 2
    assert capsys.readouterr().err == f"mixit train: error: {line}\n"
    assert not (tmp_path / "run").exists()
    (tmp_path / "s.toml").write_text(STUDY_FILE)
    study = ["reproduce", "--study", str(tmp_path / "s.toml"), "--out", str(tmp_path / "study"), "--logger", "wandb"]
    assert main(study) == 2
    assert capsys.readouterr().err == f"mixit reproduce: error: {line}\n"
    assert not (tmp_path / "study").exists()
    assert main(["train", "--logger", "neptune", "--out", str(tmp_path / "run")]) == 2
    assert "neptune" in capsys.readouterr().err and not (tmp_path / "run").exists()


# -- export-logs ------------------------------------------------------------------------------


def test_export_logs_sends_a_run_trained_without_a_sink_once(tmp_path, capsys):
    train(tiny_cfg(), tmp_path / "run", progress=False)
    assert main(["export-logs", str(tmp_path / "run"), "--to", "tensorboard"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        f"sent {tmp_path / 'run'} to tensorboard",
        f"open with: tensorboard --logdir {tmp_path / 'run'}",
    ]
    scalars, summary = split_summary(tensorboard_scalars(tmp_path / "run"))
    assert_same_points(scalars, expected(tmp_path / "run"))
    assert set(summary) == set(summary_points(Run.open(tmp_path / "run").summary()))
    # Again: the event files are written again, each point still once.
    assert main(["export-logs", str(tmp_path / "run")]) == 0
    capsys.readouterr()
    assert len(event_files(tmp_path / "run")) == 1
    assert_same_points(split_summary(tensorboard_scalars(tmp_path / "run"))[0], expected(tmp_path / "run"))
    assert main(["export-logs", str(tmp_path)]) == 2
    assert "holds no mixit run and no study" in capsys.readouterr().err


# -- studies ----------------------------------------------------------------------------------


def test_a_study_groups_its_runs_and_keeps_its_ids(tmp_path, mlflow_uri, capsys):
    from mlflow.tracking import MlflowClient

    (tmp_path / "s.toml").write_text(STUDY_FILE)

    def study(out, logger):
        reproduce(
            ReproduceOptions(study=tmp_path / "s.toml", out=out, executor="sequential", progress=False, logger=logger)
        )
        return json.loads((out / "study.json").read_text())["runs"]

    logged = study(tmp_path / "logged", ("tensorboard", "mlflow"))
    assert [r["id"] for r in logged] == [r["id"] for r in study(tmp_path / "plain", ())]
    client = MlflowClient(mlflow_uri)
    experiment = client.get_experiment_by_name("tiny")
    runs = {r.info.run_name: r for r in client.search_runs([experiment.experiment_id])}
    names = {entry["id"]: f"addition-{entry['config']['variant']}-seed0-{entry['id']}" for entry in logged}
    assert sorted(runs) == sorted(names.values())  # readable, then the run id (study.json's, the directory's)
    for entry in logged:
        run_dir = tmp_path / "logged" / "runs" / entry["id"]
        plain = tmp_path / "plain" / "runs" / entry["id"]
        assert (run_dir / "config.json").read_bytes() == (plain / "config.json").read_bytes()
        variant = entry["config"]["variant"]
        tags = {"task": "addition", "variant": variant, "seed": "0", "role": "final", "study": "tiny"}
        assert {k: runs[names[entry["id"]]].data.tags[k] for k in tags} == tags
        assert tensorboard_text(run_dir, "tags").startswith(f"name={names[entry['id']]}, group=tiny, task=addition")
        assert split_summary(tensorboard_scalars(run_dir))[0].keys() == expected(run_dir).keys()
    # export-logs of a study made without a sink groups its runs alike
    assert main(["export-logs", str(tmp_path / "plain"), "--to", "mlflow"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 2
    assert len(client.search_runs([experiment.experiment_id])) == 4


def test_a_grids_cells_are_told_apart_by_name_and_tags(tmp_path, mlflow_uri, capsys):
    """Two cells of a grid over the learning rate: each run's name and tags carry its cell's value (lr=0.001,
    lr=0.01) in MLflow and in TensorBoard's tags text; export-logs names a study's runs alike."""
    from mlflow.tracking import MlflowClient

    grid = STUDY_FILE.replace('variant = ["standard", "mixit"]', '"train.lr" = [1e-3, 1e-2]')
    (tmp_path / "lr.toml").write_text(grid.replace('name = "tiny"', 'name = "lrs"'))
    argv = ["reproduce", "--study", str(tmp_path / "lr.toml"), "--executor", "sequential", "--no-progress"]
    assert main([*argv, "--out", str(tmp_path / "logged"), "--logger", "tensorboard,mlflow"]) == 0
    assert main([*argv, "--out", str(tmp_path / "plain")]) == 0
    assert main(["export-logs", str(tmp_path / "plain"), "--to", "mlflow", "--tracking-project", "exported"]) == 0
    capsys.readouterr()
    client = MlflowClient(mlflow_uri)
    record = json.loads((tmp_path / "logged" / "study.json").read_text())["runs"]
    ids = {entry["config"]["train"]["lr"]: entry["id"] for entry in record}
    assert sorted(ids) == [1e-3, 1e-2]
    want = {f"addition-standard-lr={text}-seed0-{ids[float(text)]}": text for text in ("0.001", "0.01")}
    for experiment in ("lrs", "exported"):
        held = client.search_runs([client.get_experiment_by_name(experiment).experiment_id])
        assert {run.info.run_name: run.data.tags["lr"] for run in held} == want
    for name, text in want.items():
        tags = tensorboard_text(tmp_path / "logged" / "runs" / ids[float(text)], "tags")
        assert tags == f"name={name}, group=lrs, lr={text}, task=addition, variant=standard, seed=0, role=final"


# -- W&B, MLflow and trackio in their local modes ---------------------------------------------


@pytest.fixture(scope="module")
def mlflow_store(tmp_path_factory):
    """One MLflow store for the module (creating its database takes seconds)."""
    return f"sqlite:///{tmp_path_factory.mktemp('mlflow') / 'mlflow.db'}"


@pytest.fixture
def mlflow_uri(mlflow_store, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_store)
    return mlflow_store


def mlflow_points(client, run):
    """{name: [(step, value), ...]} of every metric of an MLflow run but the summary's, as MLflow holds them."""
    names = [k for k in run.data.metrics if not k.startswith("summary/")]
    return {
        k: [(m.step, m.value) for m in sorted(client.get_metric_history(run.info.run_id, k), key=lambda m: m.step)]
        for k in names
    }


def test_mlflow_holds_every_point_once_after_a_resume(tmp_path, mlflow_uri):
    from mlflow.tracking import MlflowClient

    interrupted_then_resumed(tmp_path / "run", ["mlflow"])
    held = tracking_state(Run.open(tmp_path / "run"))["mlflow"]
    assert held["tracking_uri"] == mlflow_uri
    client = MlflowClient(mlflow_uri)
    run = client.get_run(held["run_id"])
    assert run.info.status == "FINISHED" and run.info.run_name == "run"
    assert run.data.params["model.d_model"] == "16" and run.data.tags["variant"] == "standard"
    assert_same_points(mlflow_points(client, run), expected(tmp_path / "run"), resumed_in_place=True)
    want = summary_points(Run.open(tmp_path / "run").summary())
    assert {k: v for k, v in run.data.metrics.items() if k.startswith("summary/")} == pytest.approx(want)


def wandb_records(run_dir):
    """Every record of the run's offline W&B files (all its sessions), read as W&B writes them: a LevelDB-style
    log of 32 KiB blocks after a 7-byte header, each record chunk with a 7-byte header (crc, length, type)."""
    from wandb.proto import wandb_internal_pb2

    records = []
    for path in sorted(Path(run_dir).glob("wandb/offline-run-*/run-*.wandb")):
        data, pos, chunk = path.read_bytes(), 7, b""
        while pos + 7 <= len(data):
            if 32768 - pos % 32768 < 7:  # a block's tail too short for a header is padding
                pos += 32768 - pos % 32768
                continue
            _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
            if kind == 0:
                break
            chunk += data[pos + 7 : pos + 7 + length]
            pos += 7 + length
            if kind in (1, 4):  # a whole record, or its last chunk
                record = wandb_internal_pb2.Record()
                record.ParseFromString(chunk)
                records.append(record)
                chunk = b""
    return records


def wandb_points(records):
    """{name: [(step, value), ...]} of the history rows among W&B `records`."""
    got = defaultdict(list)
    for record in records:
        if record.WhichOneof("record_type") == "history":
            row = {"/".join(i.nested_key) or i.key: json.loads(i.value_json) for i in record.history.item}
            for name, value in row.items():
                if not name.startswith("_"):
                    got[name].append((row["_step"], value))
    return dict(got)


def wandb_summary(records):
    """The run's summary, as the summary records among W&B `records` leave it."""
    summary = {}
    for record in records:
        if record.WhichOneof("record_type") == "summary":
            summary.update({"/".join(u.nested_key) or u.key: json.loads(u.value_json) for u in record.summary.update})
    return summary


@pytest.fixture
def wandb_offline(tmp_path, monkeypatch):
    """W&B offline and quiet, with nothing in the home directory."""
    for key, value in {"MODE": "offline", "SILENT": "true", "CONSOLE": "off", "X_DISABLE_STATS": "true"}.items():
        monkeypatch.setenv(f"WANDB_{key}", value)
    for key in ("CACHE_DIR", "CONFIG_DIR", "DATA_DIR"):
        monkeypatch.setenv(f"WANDB_{key}", str(tmp_path / "wandb-home" / key.lower()))


def test_wandb_offline_holds_every_point_once_after_a_resume(tmp_path, monkeypatch, wandb_offline):
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "elsewhere"))  # the run directory wins
    interrupted_then_resumed(tmp_path / "run", ["wandb"])
    records = wandb_records(tmp_path / "run")
    runs = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    assert {r.run_id for r in runs} == {tracking_state(Run.open(tmp_path / "run"))["wandb"]["id"]} and len(runs) == 2
    assert runs[0].project == "mixit" and runs[0].display_name == "run"
    assert set(runs[0].tags) == {"task=addition", "variant=standard", "seed=0"}
    assert_same_points(wandb_points(records), expected(tmp_path / "run"), resumed_in_place=True)
    want = summary_points(Run.open(tmp_path / "run").summary())
    assert {k: wandb_summary(records)[k] for k in want} == pytest.approx(want)


def test_several_sinks_at_once_each_hold_every_point(tmp_path, mlflow_uri, wandb_offline):
    """Three live sinks in one run, interrupted and resumed: each holds every point of metrics.jsonl once (the first
    sink alone used to get them: a short-circuiting any() stopped at the first that took an event)."""
    from mlflow.tracking import MlflowClient

    interrupted_then_resumed(tmp_path / "run", ["tensorboard", "wandb", "mlflow"])
    want = expected(tmp_path / "run")
    held = tracking_state(Run.open(tmp_path / "run"))
    assert_same_points(split_summary(tensorboard_scalars(tmp_path / "run"))[0], want)
    assert_same_points(wandb_points(wandb_records(tmp_path / "run")), want, resumed_in_place=True)
    client = MlflowClient(mlflow_uri)
    assert_same_points(mlflow_points(client, client.get_run(held["mlflow"]["run_id"])), want, resumed_in_place=True)


KILLED_SCRIPT = """
import json, os, signal, sys
import accelerate.tracking, mlflow, tensorboard, wandb  # imported once: each session is a fork of this process
from mixit import run_config, train
from mixit.tracking import Tracking
run_dir, sessions = sys.argv[1], json.loads(sys.argv[2])
cfg = run_config("addition", "standard", {"n_digits": 2}, **json.loads(sys.argv[3]))
for kill_at, logger, resume in sessions:
    pid = os.fork()
    if pid == 0:
        def on_step(step, loss):
            if step == kill_at:
                os.kill(os.getpid(), signal.SIGKILL)
        train(cfg, run_dir, resume=resume, progress=False, on_step=on_step, tracking=Tracking(logger))
        os._exit(0)
    status = os.waitpid(pid, 0)[1]
    print(os.waitstatus_to_exitcode(status), flush=True)
"""

KILLED = dict(TINY, steps=12, log_every=1, eval_every=3, checkpoint_every=4)
"""Events: freeze and eval at 0, train at every step, eval every 3 steps; checkpoints at 4, 8 and 12."""


def sessions(run_dir, *plan):
    """Sessions of a run, each `(kill_at, logger, resume)`: a process of its own (a fork of one that has imported
    the sinks' libraries, which takes seconds), killed outright (SIGKILL) after step `kill_at` (0: never)."""
    argv = [str(run_dir), json.dumps(plan), json.dumps(KILLED)]
    env = {k: v for k, v in os.environ.items() if k != "WANDB_SERVICE"}  # not this process's W&B service
    result = subprocess.run([sys.executable, "-c", KILLED_SCRIPT, *argv], capture_output=True, text=True, env=env)
    assert result.returncode == 0, result.stderr
    assert [int(line) for line in result.stdout.split()] == [-9 if kill_at else 0 for kill_at, _, _ in plan]
    assert "logger failed" not in result.stderr, result.stderr


def test_every_sink_holds_every_point_once_across_kills(tmp_path, mlflow_uri, wandb_offline):
    """The acceptance test of "nothing lost across a kill": three live sinks, the run killed with SIGKILL before
    its first checkpoint and mid-way after one, resumed each time (once without --logger, as the README and the
    Ctrl-C message say): TensorBoard, MLflow and W&B (offline) each hold every point of metrics.jsonl once, and
    the summary; `export-logs` to them afterwards sends nothing twice."""
    from mlflow.tracking import MlflowClient

    run_dir, sinks = tmp_path / "run", ["tensorboard", "mlflow", "wandb"]
    # Killed before the first checkpoint (4); after it, mid-way, resumed without --logger (the run remembers its
    # sinks): steps 5 and 6 run again; then resumed with --logger, to the end.
    sessions(run_dir, (3, sinks, False), (6, [], True), (0, sinks, True))
    assert main(["export-logs", str(run_dir), "--to", ",".join(sinks)]) == 0
    run = Run.open(run_dir)
    want, summary = expected(run_dir), summary_points(run.summary())
    assert [e["step"] for e in run.metrics() if e["event"] == "train"] == list(range(1, 13))
    assert sorted(tracking_state(run)) == sorted(sinks)
    scalars, held_summary = split_summary(tensorboard_scalars(run_dir))
    assert_same_points(scalars, want)
    assert_close({k: v[0][1] for k, v in held_summary.items()}, summary, dtype=torch.float32)
    client = MlflowClient(mlflow_uri)
    mlflow_run = client.get_run(tracking_state(run)["mlflow"]["run_id"])
    assert_same_points(mlflow_points(client, mlflow_run), want, resumed_in_place=True)
    assert {k: len(client.get_metric_history(mlflow_run.info.run_id, k)) for k in summary} == dict.fromkeys(summary, 1)
    records = wandb_records(run_dir)
    assert_same_points(wandb_points(records), want, resumed_in_place=True)
    assert {k: wandb_summary(records)[k] for k in summary} == pytest.approx(summary)


TRACKIO_SCRIPT = """
import json, sys
from mixit import run_config, train
from mixit.tracking import Tracking
from trackio.sqlite_storage import SQLiteStorage
resumed, named, kw = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
cfg = run_config("addition", "standard", {"n_digits": 2}, **kw)
class Stop(Exception): pass
def stop(step, loss):
    if step == 7:
        raise Stop
try:
    train(cfg, resumed, progress=False, on_step=stop, tracking=Tracking(["trackio"]))
except Stop:
    pass
train(cfg, resumed, resume=True, progress=False, tracking=Tracking(["trackio"]))
print(json.dumps(SQLiteStorage.get_logs("mixit", "run")))
train(cfg, named, progress=False, tracking=Tracking(["trackio"], "proj", "named"))
print(json.dumps([len(SQLiteStorage.get_logs("proj", "named")), len(SQLiteStorage.get_logs("mixit", "named"))]))
"""


@pytest.fixture(scope="module")
def trackio_runs(tmp_path_factory):
    """Two runs sent to one trackio store by a process of its own (trackio reads TRACKIO_DIR, where it keeps its
    store, once, when imported): RUN/run, interrupted after step 7 and resumed; RUN/named, with a project and a
    name. Their directory, and the last two lines the process printed (what the store holds of each)."""
    root = tmp_path_factory.mktemp("trackio")
    env = {**os.environ, "TRACKIO_DIR": str(root / "trackio")}
    result = subprocess.run(
        [sys.executable, "-c", TRACKIO_SCRIPT, str(root / "run"), str(root / "named"), json.dumps(TINY)],
        env=env,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
    return root, result.stdout.splitlines()[-2:]


def test_trackio_holds_every_point_once_after_a_resume(trackio_runs):
    root, (logs, _) = trackio_runs
    assert "Trackio" not in logs  # what trackio prints goes to stderr
    got = defaultdict(list)
    for row in json.loads(logs):
        for name, value in row.items():
            if name not in ("step", "timestamp") and not name.startswith("summary/"):
                got[name].append((row["step"], value))
    assert_same_points(dict(got), expected(root / "run"), resumed_in_place=True)


def test_trackio_takes_the_project_and_the_name(trackio_runs):
    root, (_, counts) = trackio_runs
    in_project, in_default = json.loads(counts)
    assert in_project == len(Run.open(root / "named").metrics()) + 1 and in_default == 0  # every event, the summary
    assert tracking_state(Run.open(root / "named"))["trackio"] == {"project": "proj", "name": "named"}


# -- names and projects -------------------------------------------------------------------------


def test_the_options_name_the_project_and_the_run_and_the_environment_names_the_project_without_them(
    tmp_path, monkeypatch, mlflow_uri, wandb_offline
):
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("WANDB_PROJECT", "from-env")
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "from-env")
    train_args = ["train", *TRAIN_ARGS, "--logger", "tensorboard,wandb,mlflow"]
    assert main([*train_args, "--out", str(tmp_path / "plain")]) == 0
    named = ["--tracking-project", "proj", "--tracking-name", "first try"]
    assert main([*train_args, *named, "--out", str(tmp_path / "named")]) == 0
    client = MlflowClient(mlflow_uri)
    for out, project, name in ((tmp_path / "plain", "from-env", "plain"), (tmp_path / "named", "proj", "first try")):
        held = tracking_state(Run.open(out))
        run = client.get_run(held["mlflow"]["run_id"])
        # MLFLOW_EXPERIMENT_NAME has the last word in MLflow (accelerate's MLflowTracker)
        assert (client.get_experiment(run.info.experiment_id).name, run.info.run_name) == ("from-env", name)
        (started,) = [r.run for r in wandb_records(out) if r.WhichOneof("record_type") == "run"]
        assert (started.project, started.display_name, held["wandb"]["project"]) == (project, name, project)
        about = "name=first try, project=proj, " if name == "first try" else "name=plain, "
        assert tensorboard_text(out, "tags") == about + "task=addition, variant=standard, seed=0"
    # Names are no part of the run: the same config, the same id.
    assert (tmp_path / "plain" / "config.json").read_bytes() == (tmp_path / "named" / "config.json").read_bytes()


def test_a_study_in_worker_processes_names_its_runs_readably_under_the_project_and_prefix(tmp_path, mlflow_uri):
    """A searched study on a pool of two workers: every run is named PREFIX-task-variant-seedN-ID (a screening
    run PREFIX-task-variant-rung=R-...-lr=LR-screen-ID) in the experiment --tracking-project names, tagged with its
    study; its id and directory stay the id."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(mlflow_uri)
    client.search_experiments()  # the store's tables made here: two workers making them at once collide in MLflow
    (tmp_path / "s.toml").write_text(SEARCHED_STUDY_FILE)
    argv = ["reproduce", "--study", str(tmp_path / "s.toml"), "--out", str(tmp_path / "study"), "--no-progress"]
    argv += ["--executor", "local", "--workers", "2", "--threads", "1", "--logger", "mlflow"]
    assert main([*argv, "--tracking-project", "searched", "--tracking-name", "trial"]) == 0
    record = json.loads((tmp_path / "study" / "study.json").read_text())["runs"]
    assert {r["role"] for r in record} == {"final", "screen"}
    held = {r.info.run_name: r for r in client.search_runs([client.get_experiment_by_name("searched").experiment_id])}
    assert len(held) == len(record)
    for entry in record:
        assert Run.open(tmp_path / "study" / "runs" / entry["id"]).state() == "done"
        (labels,) = entry["labels"]
        start, config = f"trial-addition-{entry['config']['variant']}-", entry["config"]
        if entry["role"] == "screen":  # its rung and candidate: ...-rung=0-lr=0.001-screen-ID (a tie rung, tie=true)
            name = next(n for n in held if n.endswith(f"-screen-{entry['id']}"))
            assert name.startswith(f"{start}rung={labels['rung']}-") and f"-lr={config['train']['lr']}-" in name
        else:
            name = f"{start}seed{config['model']['seed']}-{entry['id']}"
        assert held[name].data.tags["role"] == entry["role"]
    assert {run.data.tags["study"] for run in held.values()} == {"tiny"}


# -- the HParams tab -----------------------------------------------------------------------------


def flattened(config, prefix=""):
    """A nested config as {dotted.key: value}, by hand."""
    flat = {}
    for key, value in config.items():
        if isinstance(value, dict) and value:
            flat.update(flattened(value, f"{prefix}{key}."))
        else:
            flat[prefix + key] = value
    return flat


def session_groups(logdir):
    """TensorBoard's HParams tab, as its backend lists it: {run: (hparams, {metric: value})}, one row per run."""
    from tensorboard import context
    from tensorboard.backend.event_processing import data_provider, plugin_event_multiplexer
    from tensorboard.plugins import base_plugin
    from tensorboard.plugins.hparams import api_pb2, backend_context, list_session_groups

    multiplexer = plugin_event_multiplexer.EventMultiplexer()
    multiplexer.AddRunsFromDirectory(str(logdir))
    multiplexer.Reload()
    provider = data_provider.MultiplexerDataProvider(multiplexer, str(logdir))
    tb = base_plugin.TBContext(logdir=str(logdir), multiplexer=multiplexer, data_provider=provider)
    request = api_pb2.ListSessionGroupsRequest(start_index=0, slice_size=100, allowed_statuses=[api_pb2.STATUS_SUCCESS])
    response = list_session_groups.Handler(context.RequestContext(), backend_context.Context(tb), "", request).run()
    return {
        group.name: (dict(group.hparams), {m.name.tag: m.value for m in group.metric_values})
        for group in response.session_groups
    }


def test_tensorboard_hparams_hold_each_runs_config_and_the_tab_compares_runs(tmp_path):
    from tensorboard.plugins.hparams import api_pb2, plugin_data_pb2

    for variant, lr in (("standard", 3e-3), ("mixit", 1e-2)):
        cfg = run_config("addition", variant, {"n_digits": 2}, **{**TINY, "lr": lr})
        train(cfg, tmp_path / "runs" / variant, progress=False, tracking=Tracking(["tensorboard"]))
    for variant, lr in (("standard", 3e-3), ("mixit", 1e-2)):
        run_dir = tmp_path / "runs" / variant
        content = tensorboard_reader(run_dir).PluginTagToContent("hparams")
        start = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/session_start_info"])
        end = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/session_end_info"])
        assert end.session_end_info.status == api_pb2.STATUS_SUCCESS
        got = {k: getattr(v, v.WhichOneof("kind")) for k, v in start.session_start_info.hparams.items()}
        config = flattened(Run.open(run_dir).config.to_dict())
        # the whole config, null left out, a list (the run's freeze selectors) as JSON
        assert got == {k: json.dumps(v) if isinstance(v, list) else v for k, v in config.items() if v is not None}
        assert got["freeze"] == "[]"
        assert {k: got[k] for k in ("task", "variant", "train.lr", "model.d_model", "model.n_heads", "model.seed")} == {
            "task": "addition",
            "variant": variant,
            "train.lr": lr,
            "model.d_model": 16,
            "model.n_heads": 2,
            "model.seed": 0,
        }
    # The HParams tab: one row per run, its config beside its final metrics.
    rows = session_groups(tmp_path / "runs")
    assert sorted(rows) == ["mixit/tensorboard", "standard/tensorboard"]
    for variant, lr in (("standard", 3e-3), ("mixit", 1e-2)):
        hparams, metrics = rows[f"{variant}/tensorboard"]
        assert (hparams["variant"].string_value, hparams["train.lr"].number_value) == (variant, lr)
        summary = Run.open(tmp_path / "runs" / variant).summary()
        assert_close(metrics["summary/test/exact_match"], summary["test"]["exact_match"], dtype=torch.float32)
        assert metrics["summary/steps_trained"] == 10
