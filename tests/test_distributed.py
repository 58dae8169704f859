"""Data-parallel training on the CPU with gloo, in processes spawned by the tests (docs/scaling.md):
two ranks train as one, hold identical fixed tensors, resume with another world size, and only rank 0
writes; bad distributed settings are refused with one line."""

import contextlib
import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import mixit
from mixit import Run, run_config, train
from mixit.cli import main
from tolerance import assert_close, assert_trained_alike, training_terms

ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
ARGS = [
    "train",
    "--task",
    "addition",
    "-p",
    "n_digits=2",
    "--d-model",
    "32",
    "--n-heads",
    "2",
    "--n-layers",
    "1",
    "--batch-size",
    "32",
    "--test-size",
    "100",
    "--no-progress",
]

JOB = {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "MASTER_ADDR": "localhost", "MASTER_PORT": "29500"}
"""The environment torchrun gives rank 0 of a two-process job."""


def torchrun(nproc, *args, cwd=None, **popen):
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={nproc}",
        "-m",
        "mixit",
        *args,
    ]
    if popen:
        return subprocess.Popen(
            cmd, env=ENV, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen
        )
    return subprocess.run(cmd, env=ENV, cwd=cwd, capture_output=True, text=True, timeout=600)


def cmdline(pid):
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="ignore")
    except OSError:  # gone already
        return ""


def processes():
    return [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit()]


def weights(run_dir):
    return load_file(str(Run.open(run_dir).latest_checkpoint() / "model.safetensors"))


def assert_same_test_metrics(actual, expected, cfg):
    """The test metrics of two runs of `cfg` that train alike (tests/tolerance.py, `assert_trained_alike`): the loss
    within the roundings `training_terms` counts, on the scale of a uniform guess's loss, ln of the vocabulary (about
    where training started, so at least how far it moved the loss), and its standard error, which moves by at most
    twice what each example's loss moves (the deviations x_i - r n_i move by both); the accuracies, fractions of
    argmax agreements, and their errors equal, as logits moved that little leave every argmax where it was."""
    assert actual.keys() == expected.keys()
    scale = math.log(cfg.model.vocab_size)
    assert_close(actual["loss"], expected["loss"], dtype=torch.float32, terms=training_terms(cfg), scale=scale)
    assert_close(
        actual["loss_se"], expected["loss_se"], dtype=torch.float32, terms=2 * training_terms(cfg), scale=scale
    )
    rest = ("loss", "loss_se")
    assert {k: v for k, v in actual.items() if k not in rest} == {k: v for k, v in expected.items() if k not in rest}


@pytest.mark.parametrize("variant", ["standard", "mixit"])
def test_two_ranks_train_as_one_process_with_the_same_global_batch(tmp_path, variant):
    args = [*ARGS, "--variant", variant, "--steps", "12", "--eval-every", "6"]
    two = torchrun(2, *args, "--out", str(tmp_path / "two"), "--logger", "tensorboard")
    assert two.returncode == 0, two.stderr[-3000:]
    assert main([*args, "--out", str(tmp_path / "one")]) == 0
    one_sum = json.loads((tmp_path / "one" / "summary.json").read_text())
    two_sum = json.loads((tmp_path / "two" / "summary.json").read_text())
    assert two_sum["world_size"] == 2 and one_sum["world_size"] == 1
    cfg = Run.open(tmp_path / "one").config
    assert_same_test_metrics(two_sum["test"], one_sum["test"], cfg)
    assert_trained_alike(weights(tmp_path / "two"), weights(tmp_path / "one"), cfg)
    # Rank 0 alone wrote: one line per event, the same events as one process writes.
    one_events = [(e["step"], e["event"]) for e in Run.open(tmp_path / "one").metrics()]
    assert [(e["step"], e["event"]) for e in Run.open(tmp_path / "two").metrics()] == one_events
    assert two.stdout.count("run directory:") == 1  # and printed once
    # The tracking sink too is rank 0's alone: one event file, each train loss of metrics.jsonl once.
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    assert len(list((tmp_path / "two" / "tensorboard").glob("events.out.tfevents.*"))) == 1
    reader = EventAccumulator(str(tmp_path / "two" / "tensorboard"))
    reader.Reload()
    losses = [(e["step"], e["loss"]) for e in Run.open(tmp_path / "two").metrics() if e["event"] == "train"]
    logged = [(e.step, e.value) for e in reader.Scalars("train/loss")]
    assert [s for s, _ in logged] == [s for s, _ in losses]
    assert_close([v for _, v in logged], [v for _, v in losses], dtype=torch.float32)  # stored as float32: rounded once


def test_gradient_accumulation_is_the_same_step(tmp_path):
    common = dict(d_model=32, n_heads=2, n_layers=1, steps=8, batch_size=32, test_size=100)
    cfg = run_config("addition", "standard", {"n_digits": 2}, **common)
    a = train(cfg, tmp_path / "a", progress=False)
    b = train(
        run_config("addition", "standard", {"n_digits": 2}, grad_accum=4, **common), tmp_path / "b", progress=False
    )
    assert_same_test_metrics(b["test"], a["test"], cfg)
    assert_trained_alike(weights(tmp_path / "b"), weights(tmp_path / "a"), cfg)


SPAWN_CHECK = """
import os, sys, torch, torch.distributed as td
from mixit import ModelConfig, Transformer
from mixit.distributed import Dist, check_identical
rank = int(sys.argv[1]); world = 2
td.init_process_group("gloo", init_method="file://" + sys.argv[2], rank=rank, world_size=world)
same = Transformer(ModelConfig(vocab_size=16, n_ctx=8, d_model=16, n_heads=2, attention="mixing"))
check_identical(same, Dist(rank, world))
other = Transformer(ModelConfig(vocab_size=16, n_ctx=8, d_model=16, n_heads=2, attention="mixing", seed=rank))
try:
    check_identical(other, Dist(rank, world))
    print("not refused")
except RuntimeError as e:
    print("refused:", "different fixed tensors" in str(e))
td.destroy_process_group()
"""


def test_ranks_hold_identical_mixing_matrices_or_are_refused(tmp_path):
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", SPAWN_CHECK, str(r), str(tmp_path / "rendezvous")],
            env=ENV,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in range(2)
    ]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [o.strip() for o, _ in outs] == ["refused: True"] * 2, [e[-2000:] for _, e in outs]


def test_killed_on_two_ranks_and_resumed_on_one(tmp_path):
    args = [*ARGS, "--steps", "60", "--checkpoint-every", "5", "--eval-every", "30", "--log-every", "5"]
    assert main([*args, "--out", str(tmp_path / "whole")]) == 0
    out = tmp_path / "cut"
    proc = torchrun(2, *args, "--out", str(out), start_new_session=True)
    deadline = time.time() + 300
    while time.time() < deadline:
        latest = out / "checkpoints" / "latest"
        if latest.exists() and int(latest.read_text().strip().split("_")[1]) >= 20:
            break
        time.sleep(0.2)
    # Kill the launcher and its workers (which torchrun starts in sessions of their own).
    workers = [pid for pid in processes() if str(out) in cmdline(pid)]
    for pid in [proc.pid, *workers]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    proc.wait()
    for pid in workers:  # until each is gone, and the kernel has released its lock
        while cmdline(pid):
            time.sleep(0.1)
    assert not (out / "summary.json").exists(), "the run finished before it could be killed"
    assert main(["train", "--resume", "--out", str(out), "--no-progress"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["resumed_from"] >= 20 and summary["world_size"] == 1
    assert_trained_alike(weights(out), weights(tmp_path / "whole"), Run.open(tmp_path / "whole").config)
    steps = [e["step"] for e in Run.open(out).metrics() if e["event"] == "train"]
    assert steps == sorted(set(steps)) and steps[-1] == 60


def test_distributed_settings_are_refused_with_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    for name, value in JOB.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("WORLD_SIZE", "3")
    assert main([*ARGS, "--steps", "5", "--out", "x"]) == 2
    err = capsys.readouterr().err
    assert err.strip() == ("mixit train: error: batch_size 32 must be divisible by the world size 3 x grad_accum 1 = 3")
    monkeypatch.setenv("RANK", "1")  # the other ranks refuse silently: one line in all
    assert main([*ARGS, "--steps", "5", "--out", "x"]) == 2
    assert capsys.readouterr().err == ""
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv("RANK", "0")
    assert main([*ARGS, "--grad-accum", "5", "--out", "x"]) == 2
    assert "divisible by the world size 1 x grad_accum 5" in capsys.readouterr().err
    assert main([*ARGS, "--dtype", "fp8", "--out", "x"]) == 2
    assert "train.dtype: expected one of fp32, bf16 or fp16, got 'fp8'" in capsys.readouterr().err
    from mixit.runtime import fast_bf16

    if not fast_bf16():
        assert main([*ARGS, "--dtype", "bf16", "--out", "x"]) == 2
        assert "--allow-slow-dtype" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_mixed_precision_trains_and_resumes(tmp_path):
    args = [*ARGS, "--steps", "10", "--checkpoint-every", "5", "--dtype", "fp16"]
    assert main([*args, "--out", str(tmp_path / "fp16")]) == 0
    state = json.loads((Run.open(tmp_path / "fp16").latest_checkpoint() / "state.json").read_text())
    assert state["scaler"] and "scale" in state["scaler"]  # the gradient scale is checkpointed
    summary = json.loads((tmp_path / "fp16" / "summary.json").read_text())
    assert 0 < summary["test"]["loss"] < 10


@pytest.mark.parametrize(
    "bad, message",
    [(["--bogus", "1"], "unrecognized arguments: --bogus 1"), (["--n-heads", "3"], "n_heads must divide d_model")],
)
def test_under_torchrun_bad_input_is_refused_by_every_rank_and_said_once(tmp_path, bad, message):
    proc = torchrun(2, *ARGS, "--steps", "5", *bad, cwd=tmp_path)
    said = [line for line in proc.stderr.splitlines() if line.startswith("mixit train: error:")]
    assert len(said) == 1 and message in said[0], proc.stderr[-3000:]
    # No traceback from mixit: the one in the output is torchrun's own report of the failed ranks.
    # (mixit's package directory, not any path with a "mixit" folder in it: a clone may be called mixit.)
    assert f'File "{Path(mixit.__file__).parent}{os.sep}' not in proc.stderr, proc.stderr[-3000:]
    # torchrun's report: a rank exited with status 2, and the other did too, or was still reading its options when
    # torchrun stopped it on seeing the first fail (SIGTERM, -15): which happens first is the machine's timing.
    statuses = dict(re.findall(r"rank\s*: (\d) \(local_rank: \d\)\s*exitcode\s*: (-?\d+)", proc.stderr))
    assert sorted(statuses) == ["0", "1"] and "2" in statuses.values(), proc.stderr[-3000:]
    assert set(statuses.values()) <= {"2", "-15"}, proc.stderr[-3000:]
    assert list(tmp_path.iterdir()) == []


ENVIRONMENTS = [
    # (the variables set, the message), for `mixit train` with valid options unless the case adds some
    ({"WORLD_SIZE": "abc"}, "environment variable WORLD_SIZE must be an integer >= 1, got 'abc'"),
    ({"RANK": "0", "WORLD_SIZE": "2"}, "variables LOCAL_RANK, MASTER_ADDR and MASTER_PORT not set, but RANK and"),
    ({"RANK": "1", "WORLD_SIZE": "2"}, "variables LOCAL_RANK, MASTER_ADDR and MASTER_PORT not set"),
    ({"LOCAL_RANK": "0"}, "variables RANK and WORLD_SIZE not set, but LOCAL_RANK is"),
    ({**JOB, "RANK": "2"}, "environment variable RANK must be an integer in [0, 1], got '2'"),
    ({**JOB, "RANK": "1", "LOCAL_RANK": "x"}, "environment variable LOCAL_RANK must be an integer >= 0, got 'x'"),
    ({**JOB, "WORLD_SIZE": "0"}, "environment variable WORLD_SIZE must be an integer >= 1, got '0'"),
    ({**JOB, "MASTER_PORT": "70000"}, "environment variable MASTER_PORT must be an integer in [1, 65535]"),
    ({**JOB, "MASTER_ADDR": " "}, "environment variable MASTER_ADDR not set"),
]


@pytest.mark.parametrize("extra", [[], ["--n-heads", "3"], ["--bogus", "1"]])
@pytest.mark.parametrize("variables, message", ENVIRONMENTS)
def test_a_bad_distributed_environment_is_said_by_every_rank(variables, message, extra, tmp_path, monkeypatch, capsys):
    """Before any option is looked at, and even by a rank other than 0: there may be no rank 0 to say it."""
    monkeypatch.chdir(tmp_path)
    for name in JOB:
        monkeypatch.delenv(name, raising=False)
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    assert main([*ARGS, "--steps", "5", *extra]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert err.startswith("mixit train: error: ") and message in err and "(torchrun sets RANK, WORLD_SIZE" in err, err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("extra", [["--n-heads", "3"], ["--bogus", "1"], ["--steps", "0"]])
def test_in_a_sound_environment_a_rank_other_than_0_refuses_silently(extra, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    for name, value in {**JOB, "RANK": "1", "LOCAL_RANK": "1"}.items():
        monkeypatch.setenv(name, value)
    assert main([*ARGS, *extra]) == 2
    assert capsys.readouterr().err == ""  # rank 0 says it
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("LOCAL_RANK", "0")
    assert main([*ARGS, *extra]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1
    assert list(tmp_path.iterdir()) == []
