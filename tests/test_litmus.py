"""`mixit litmus` (`mixit.litmus`): each arm's number per seed is its run's selected test metric, the paired
differences and their intervals are Student's t over those numbers, the same command again trains nothing, more
seeds train only the new ones and the answer says it was read before, bad input and another command into the same
OUT are refused in one line, and a plugin's task takes a litmus."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from scipy import stats

import mixit
from mixit.cli import main
from mixit.plugins import ENV
from tolerance import assert_close

TINY = ["-p", "n_digits=2", "--d-model", "16", "--n-heads", "2", "--n-layers", "1", "--steps", "4"]
TINY += ["--batch-size", "8", "--test-size", "20", "--seeds", "2", "--no-progress"]

REVERSE = """
from dataclasses import dataclass

import numpy as np

from mixit.core.config import TaskConfig
from mixit.core.tasks.base import TASKS, SequenceTask


@dataclass
class ReverseConfig(TaskConfig):
    length: int = 3


@TASKS.register("litmus_reverse")
class Reverse(SequenceTask):
    name = "litmus_reverse"
    Config = ReverseConfig
    exact_match = True
    vocab_size = 5
    seq_len = 7

    def sample(self, rng, n):
        x = rng.integers(0, 4, size=(n, 3))
        seq = np.concatenate([x, np.full((n, 1), 4), x[:, ::-1]], axis=1)
        mask = np.zeros_like(seq, dtype=bool)
        mask[:, 3:6] = True
        return seq, mask
"""


def snapshot(root):
    """Each file under `root` -> its modification time in ns."""
    return {p: p.stat().st_mtime_ns for p in sorted(root.rglob("*")) if p.is_file()}


def refused(args, capsys):
    """`mixit ARGS` run in this process: its one line on stderr, after checking the exit status is 2."""
    assert main(args) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in lines[0]
    return lines[0]


def test_a_litmus_reads_each_runs_selected_number_and_a_rerun_trains_nothing(tmp_path, capsys):
    out = tmp_path / "litmus"
    assert main(["litmus", "--task", "addition", *TINY, "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    result = json.loads((out / "litmus.json").read_text())
    assert result["seeds"] == [0, 1]
    assert result["metric"] == {"column": "accuracy", "test_metric": "token_acc", "scale": 100}
    for arm in ("standard", "mixit", "transplant"):
        for i, seed in enumerate((0, 1)):
            run = out / "runs" / f"{arm}-seed{seed}"
            config = json.loads((run / "config.json").read_text())["config"]
            assert (config["model"]["seed"], config["data_seed"]) == (seed, seed)
            summary = json.loads((run / "summary.json").read_text())
            assert result["arms"][arm]["per_seed"][i] == summary["selected"]["test"]["token_acc"] * 100
    config = json.loads((out / "runs" / "transplant-seed1" / "config.json").read_text())["config"]
    assert config["model"]["attention"] == "transplant" and config["transplant_from"].endswith("standard-seed1")
    standard = result["arms"]["standard"]["per_seed"]
    for other in ("transplant", "mixit"):
        paired = [a - b for a, b in zip(standard, result["arms"][other]["per_seed"])]
        found = result["differences"][f"standard-{other}"]
        assert found["per_seed"] == paired
        mean = sum(paired) / 2
        low, high = stats.t.interval(0.95, 1, loc=mean, scale=stats.sem(paired))
        assert_close(found["mean"], mean, terms=2)  # a mean of two doubles
        # mean -+ t sem: a few roundings of numbers as large as the mean and the half-width
        assert_close([found["low"], found["high"]], [low, high], terms=8, scale=abs(mean) + (high - low) / 2)
    t = result["differences"]["standard-transplant"]
    expected = "undecided"
    if t["low"] > 0 or t["high"] < 0:
        expected = "needs input-dependent" if t["low"] > 0 else "the transplant does better"
    assert result["answer"].startswith(expected) and "with 2 seeds" in result["answer"]
    assert result["answer"] in printed and f"{t['mean']:.2f} [{t['low']:.2f}, {t['high']:.2f}]" in printed
    assert result["answer"] in (out / "litmus.md").read_text()

    runs = snapshot(out / "runs")
    assert main(["litmus", "--task", "addition", *TINY, "--out", str(out)]) == 0
    assert snapshot(out / "runs") == runs
    assert json.loads((out / "litmus.json").read_text())["arms"] == result["arms"]

    everything = snapshot(out)
    line = refused(["litmus", "--task", "addition", *TINY, "--steps", "5", "--out", str(out)], capsys)
    assert "train {'steps': 4, 'batch_size': 8} -> {'steps': 5, 'batch_size': 8}" in line
    assert line.endswith("(only --seeds may change)")
    assert snapshot(out) == everything
    assert "read before" not in result["answer"] and result["looks"] == [2]

    assert main(["litmus", "--task", "addition", *TINY, "--seeds", "3", "--out", str(out)]) == 0
    more = json.loads((out / "litmus.json").read_text())
    assert {p: t for p, t in snapshot(out / "runs").items() if p in runs} == runs  # seeds 0 and 1 left as they were
    assert more["seeds"] == [0, 1, 2] and more["looks"] == [2, 3]
    for arm in ("standard", "mixit", "transplant"):
        assert more["arms"][arm]["per_seed"][:2] == result["arms"][arm]["per_seed"]
        assert (out / "runs" / f"{arm}-seed2" / "summary.json").exists()
    assert more["answer"].endswith(
        "(read before at 2 seeds: an interval reached by adding seeds after looking "
        "covers the difference less often than 95%)"
    )


@pytest.mark.parametrize(
    "args, message",
    [
        (["--task", "nope"], "unknown task 'nope'"),
        (["--task", "addition", "--seeds", "1"], "seeds must be an integer >= 2 (the interval is over seeds), got 1"),
        (["--task", "addition", "-p", "n_digits=0"], "n_digits"),
        (["--task", "addition", "--d-model", "15"], "n_heads must divide d_model"),
    ],
)
def test_bad_input_is_refused_in_one_line_before_anything_is_written(tmp_path, capsys, args, message):
    out = tmp_path / "litmus"
    line = refused(["litmus", *args, "--out", str(out), "--no-progress"], capsys)
    assert line.startswith("mixit litmus: error: ") and message in line
    assert not out.exists()


def test_a_directory_that_holds_something_else_is_refused(tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("mine")
    line = refused(["litmus", "--task", "addition", *TINY, "--out", str(tmp_path)], capsys)
    holds = f"{tmp_path} is not empty and holds no litmus (request.json); choose another --out"
    assert line == f"mixit litmus: error: {holds}"
    assert [p.name for p in tmp_path.iterdir()] == ["notes.txt"]


def test_a_plugin_task_takes_a_litmus(tmp_path):
    (tmp_path / "reverse_task.py").write_text(REVERSE)
    environment = {k: v for k, v in os.environ.items() if k != ENV}
    source = str(Path(mixit.__file__).parents[1])  # this checkout's mixit, whatever the working directory
    environment.update(HF_HUB_OFFLINE="1", PYTHONPATH=source, **{ENV: "reverse_task.py"})
    args = ["litmus", "--task", "litmus_reverse", *TINY[2:], "--out", "out"]
    command = [sys.executable, "-m", "mixit", *args]
    done = subprocess.run(command, cwd=tmp_path, env=environment, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads((tmp_path / "out" / "litmus.json").read_text())
    assert result["task"] == "litmus_reverse" and len(result["arms"]["transplant"]["per_seed"]) == 2
    assert result["answer"] in done.stdout
