"""The command line: train, eval, list, the generic rules that make a command's flags from its library
function, and one-line refusals of bad input with exit status 2."""

import dataclasses
import json
import os
import shlex
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
from jsonargparse import ArgumentError

import mixit.core.training.loop
from mixit.cli import call, command_parser, main, steps_trained
from mixit.core.training.loop import accumulated_step
from mixit.errors import UsageError

TINY = [
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
    "--steps",
    "6",
    "--batch-size",
    "16",
    "--test-size",
    "50",
    "--no-progress",
]


def run_cli(args, capsys):
    code = main(args)
    out, err = capsys.readouterr()
    return code, out, err


def test_train_then_eval_reproduces_the_test_metrics(tmp_path, capsys):
    code, out, _ = run_cli(["train", *TINY, "--variant", "mixit", "--out", str(tmp_path / "run")], capsys)
    assert code == 0
    assert "addition(n_digits=2, reference_mask=False) mixit: after 6 steps, last evaluation's test loss" in out
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    code, out, _ = run_cli(["eval", str(tmp_path / "run")], capsys)
    assert code == 0
    evaluated = json.loads(out)
    assert evaluated["checkpoint"] == "step_0000006"
    assert evaluated["test"] == pytest.approx(summary["test"])


def test_resume_from_the_command_line(tmp_path, capsys):
    run = str(tmp_path / "run")
    assert run_cli(["train", *TINY, "--out", run], capsys)[0] == 0
    code, out, _ = run_cli(["train", "--resume", "--out", run, "--no-progress"], capsys)
    assert code == 0 and "after 6 steps" in out  # complete run: resume reports it, trains nothing
    code, _, err = run_cli(["train", "--resume", "--out", run, "--lr", "0.5"], capsys)
    assert code == 2 and "holds a different run" in err and "train.lr" in err


def test_an_interrupted_training_names_the_command_that_continues_it(tmp_path, capsys, monkeypatch):
    """Ctrl-C during step 4 of 6: one line naming the run's own directory, quoted for the shell, and that command
    continues the run from its checkpoint at step 2."""
    run, steps = tmp_path / "my run", []

    def step_until_ctrl_c(*args):
        if len(steps) == 3:
            raise KeyboardInterrupt
        steps.append(args)
        return accumulated_step(*args)

    monkeypatch.setattr(mixit.core.training.loop, "accumulated_step", step_until_ctrl_c)
    code, _, err = run_cli(["train", *TINY, "--checkpoint-every", "2", "--out", str(run)], capsys)
    resume = f"mixit train --resume --out '{run}'"
    assert (code, err) == (130, f"mixit train: interrupted; `{resume}` continues the run from its last checkpoint\n")
    monkeypatch.undo()
    code, out, _ = run_cli([*shlex.split(resume)[1:], "--no-progress"], capsys)
    assert code == 0 and "after 6 steps" in out


def test_list_names_every_task_and_variant(capsys):
    code, out, _ = run_cli(["list", "--json"], capsys)
    listing = json.loads(out)
    assert set(listing["tasks"]) == {
        "addition",
        "modular_addition",
        "dyck",
        "memorization",
        "retrieval",
        "induction",
        "lm",
        "sentiment",
    }
    assert set(listing["variants"]) == {"standard", "frozen_qk", "frozen_mlp", "mixit", "random"}
    params = listing["tasks"]["addition"]["parameters"]
    assert {k: p["default"] for k, p in params.items()} == {"n_digits": 10, "reference_mask": False}
    assert params["n_digits"]["type"] == "int" and "Digits of each operand" in params["n_digits"]["doc"]
    assert listing["tasks"]["addition"]["defaults"] == {"steps": 1000, "batch_size": 128, "lr": 3e-3}
    code, out, _ = run_cli(["list"], capsys)
    assert code == 0 and "n_digits=10" in out and "frozen_qk" in out


@pytest.mark.parametrize(
    "args, message",
    [
        (["train", "--task", "sorting"], "unknown task 'sorting'; allowed: addition, dyck, induction"),
        (["train", "--variant", "frozen_v"], "unknown variant 'frozen_v'; allowed: standard, frozen_qk"),
        (["train", "--d-model", "30", "--n-heads", "4"], "n_heads must divide d_model"),
        (["train", "--n-ctx", "10"], "longer than n_ctx=10"),
        (["train", "--steps", "-5"], "steps must be a positive integer, got -5"),
        (["train", "--steps", "ten"], "train.steps: expected int, got 'ten'"),
        (["train", "--warmup-steps", "x"], "train.warmup_steps: expected int or null, got 'x'"),
        (["train", "-p", "n_digits"], "-p expects KEY=VALUE"),
        (["train", "-p", "digits=3"], "unknown parameter 'digits' for task addition; allowed: n_digits=10"),
        (["train", "-p", "n_digits=many"], "task parameter n_digits must be int, got 'many'"),
        (["train", "--variant", "frozen_qk", "--attention", "mixing"], "variant 'frozen_qk' uses softmax attention"),
        (["train", "--device", "tpu"], "unknown device 'tpu'; allowed: auto, cpu, cuda, cuda:N"),
        (["train", "--resume"], "--resume needs --out RUN_DIR"),
        (["eval", "does/not/exist"], "run directory does/not/exist does not exist"),
        (["frobnicate"], "invalid choice: 'frobnicate'"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args, message, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(args) == 2
    err = capsys.readouterr().err
    assert message in err
    assert len(err.strip().splitlines()) == 1
    assert not (tmp_path / "runs").exists()  # refused before any work


def test_cuda_requested_without_gpu(capsys, tmp_path, monkeypatch):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is present, so --device cuda is valid here")
    monkeypatch.chdir(tmp_path)
    assert main(["train", "--device", "cuda"]) == 2
    assert "no CUDA GPU is available" in capsys.readouterr().err


def test_existing_run_is_not_overwritten(tmp_path, capsys):
    run = tmp_path / "run"
    assert run_cli(["train", *TINY, "--out", str(run)], capsys)[0] == 0
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    code, _, err = run_cli(["train", *TINY, "--out", str(run)], capsys)
    assert code == 2 and "already holds a run" in err
    assert before == {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}


def test_corrupt_checkpoint_and_config(tmp_path, capsys):
    run = tmp_path / "run"
    assert run_cli(["train", *TINY, "--out", str(run)], capsys)[0] == 0
    weights = run / "checkpoints" / "step_0000006" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    code, _, err = run_cli(["eval", str(run)], capsys)
    assert code == 2 and "corrupt or unreadable" in err and len(err.strip().splitlines()) == 1
    (run / "config.json").write_text("{not json")
    code, _, err = run_cli(["eval", str(run)], capsys)
    assert code == 2 and "config.json is corrupt" in err


def test_real_process_exit_status_and_no_traceback(tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "mixit.cli", "train", "--n-heads", "3"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=env,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        "mixit train: error: n_heads must divide d_model: d_model=128 is not a multiple of n_heads=3"
    )
    assert "Traceback" not in proc.stderr and not (tmp_path / "runs").exists()


# -- the generic rules -----------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ToyOptions:
    """What a toy command does."""

    task: str | None = None
    """a task."""
    task_params: dict[str, Any] | None = None
    """its parameters."""
    depths: Sequence[int] = (2, 4)
    """depths (comma-separated)."""
    shaped: bool = False
    """a bool."""


def toy(run_dir: Path, options: ToyOptions, progress: Callable[[str], None] | None = None, seed: int = 0):
    """A toy command.

    Args:
        run_dir: a required parameter, so positional.
        options: its options.
        progress: a library hook.
        seed: a plain parameter.
    """
    return run_dir, options, progress, seed


def toy_args(*argv):
    return command_parser(toy).parse_args(list(argv), defaults=False).as_dict()


def command_help(command, capsys):
    assert main([command, "--help"]) == 0
    return capsys.readouterr().out


def test_a_dataclass_parameter_gives_its_fields_as_flags_and_is_built_from_them(capsys):
    text = command_parser(toy).format_help()
    assert "--depths" in text and "--shaped" in text and "--no-shaped" in text and "--seed" in text
    assert "--options" not in text and "a bool." in text  # flat, by field name, with the field's docstring

    def hook(message):
        return None

    args = toy_args("r", "--depths", "3,5", "--shaped", "--seed", "2")
    assert call(toy, args, progress=hook) == (Path("r"), ToyOptions(depths=[3, 5], shaped=True), hook, 2)
    assert call(toy, toy_args("r", "--depths", "8", "--shaped", "false"))[1] == ToyOptions(depths=[8])
    assert call(toy, toy_args("r"))[1] == ToyOptions()  # what is not given keeps the dataclass's default
    assert "--mixing-sink" in command_help("signal", capsys)  # a field of SignalOptions


def test_a_callable_parameter_is_a_hook_not_a_flag(capsys):
    assert "--progress" not in command_parser(toy).format_help()
    with pytest.raises(Exception, match="unrecognized arguments: --progress"):
        toy_args("r", "--progress", "x")
    assert "--progress" not in command_help("bench", capsys)  # bench_command's progress callback


def test_options_with_task_and_task_params_take_dash_p(capsys):
    text = command_parser(toy).format_help()
    assert "-p KEY=VALUE" in text and "--task_params" not in text and "--task-params" not in text
    args = toy_args("r", "--task", "addition", "-p", "n_digits=3", "-p", "reference_mask=true")
    assert call(toy, args)[1].task_params == {"n_digits": 3, "reference_mask": True}  # typed by the task's Config
    with pytest.raises(UsageError, match="-p/--task-param needs --task"):
        call(toy, toy_args("r", "-p", "n_digits=3"))
    for command in ("train", "bench"):  # RunConfig's fields, BenchOptions' fields
        text = command_help(command, capsys)
        assert "-p KEY=VALUE" in text and "--task_params" not in text


def test_a_list_option_is_bracketed_before_jsonargparse_reads_it():
    from mixit.flags import bracket_lists

    lists = {"--depths", "--tokens"}
    argv = ["--depths", "2,4", "--tokens=1,2", "--seed", "3,4", "--depths", "[8]", "--tokens", "--seed"]
    assert bracket_lists(argv, lists) == [
        "--depths",
        "[2,4]",
        "--tokens=[1,2]",
        "--seed",
        "3,4",  # not a list option
        "--depths",
        "[8]",
        "--tokens",  # no value: jsonargparse says so
        "--seed",
    ]


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--seed", "x"], "seed: expected int, got 'x'"),
        (["--depths=2,x"], "depths: expected comma-separated list of int, got 'x'"),  # the item refused
        (["--shaped", "maybe"], "shaped: expected bool, got 'maybe'"),
        (["--seed", "-x"], "argument --seed: expected one argument"),  # jsonargparse's own line, on no value
    ],
)
def test_a_wrong_value_is_said_with_its_options_type_as_help_names_it(argv, message):
    with pytest.raises(ArgumentError) as error:
        toy_args("r", *argv)
    assert str(error.value) == message


def test_train_says_where_early_stopping_ended_a_run():
    done = {"steps": 10000, "convergence": {"stopped_early": False, "steps_trained": 10000, "reason": None}}
    stopped = {"steps": 10000, "convergence": {"stopped_early": True, "steps_trained": 5000, "reason": "plateau"}}
    assert steps_trained(done) == "10000 steps"
    assert steps_trained(stopped) == "5000 of 10000 steps (stopped early: plateau)"
