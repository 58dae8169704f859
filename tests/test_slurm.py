"""`mixit reproduce --slurm KEY=VALUE` (docs/scaling.md, "Slurm"): any parameter submitit's Slurm executor takes
reaches submitit, typed as submitit types it; the same parameters run a tiny study through submitit's local
executor; a bad key, value or item is refused with one line and exit status 2 before anything is written."""

import collections.abc
import math
import os
import shlex
import sys
import typing
from pathlib import Path

import pytest
import submitit

from mixit.cli import build_parser, main
from mixit.errors import UsageError
from mixit.flags import Parser, arguments
from mixit.study import ReproduceOptions
from mixit.study.executors import _submitit, slurm_parameters

STUDY = """
name = "tiny"
[base]
task = "addition"
task_params = {n_digits = 2}
model = {d_model = 16, n_heads = 2, n_layers = 1}
train = {steps = 4, batch_size = 16}
test_size = 40
variant = "standard"
"""

CLUSTER = [
    "partition=gpu",
    "account=abc",
    "qos=high",
    "mem=32G",
    "constraint=a100",
    "gpus_per_node=4",
    "time=720",
    "array_parallelism=16",
    "exclusive=true",
    "setup=module load cuda",
    "setup=source .venv/bin/activate",
    "additional_parameters.reservation=big-run",
    "additional_parameters.requeue=true",
]
"""--slurm items of a real cluster's study, one of each kind of value submitit takes."""


def slurm_args(items: list[str], option: str = "--slurm") -> list[str]:
    return [arg for item in items for arg in (option, item)]


def options(*args: str) -> ReproduceOptions:
    """The options `mixit reproduce ARGS` builds, as the CLI builds them."""
    parsed = build_parser().parse_args(["reproduce", *args], defaults=False).clone(with_meta=False).as_dict()
    return ReproduceOptions(**arguments(ReproduceOptions, parsed["reproduce"]))


@pytest.fixture
def recorded(monkeypatch):
    """The submitit executors that mixit makes, recorded; their submissions go nowhere when `submit` is false."""
    made = []

    class Recording(submitit.AutoExecutor):
        submit = True

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            made.append(self)

        def map_array(self, *args, **kwargs):
            return super().map_array(*args, **kwargs) if self.submit else []

    monkeypatch.setattr(submitit, "AutoExecutor", Recording)
    return Recording, made


def test_the_sbatch_script_carries_every_parameter_given(tmp_path, recorded, monkeypatch):
    from submitit.slurm.slurm import SlurmExecutor, _make_sbatch_string

    executor, made = recorded
    # There is no Slurm here: submitit's executor is made as on a cluster, submits nothing, and writes its script.
    monkeypatch.setattr(SlurmExecutor, "affinity", classmethod(lambda cls: 1))
    executor.submit = False
    pool = options("--executor", "slurm", *slurm_args(CLUSTER)).pool()
    _submitit("slurm", tmp_path, [("study", "run", {}, False)], pool.slurm, lambda result: None)
    assert made[0].cluster == "slurm"
    script = _make_sbatch_string(command="true", folder=tmp_path, map_count=40, **made[0]._executor.parameters)
    lines = set(script.splitlines())
    for flag in (
        "--partition=gpu",
        "--account=abc",
        "--qos=high",
        "--mem=32G",
        "--constraint=a100",
        "--gpus-per-node=4",
        "--ntasks-per-node=4",  # one task per GPU
        "--cpus-per-task=2",  # mixit's default
        "--time=720",
        "--array=0-39%16",  # 40 runs, at most 16 at once
        "--exclusive",
        "--reservation=big-run",
        "--requeue",
    ):
        assert f"#SBATCH {flag}" in lines, (flag, script)
    assert {"module load cuda", "source .venv/bin/activate"} <= lines


def test_the_documented_template_is_accepted_as_written():
    text = (Path(__file__).parents[1] / "docs" / "scaling.md").read_text()
    block = text.partition("```sh\nmixit reproduce --preset paper --executor slurm")[2].partition("```")[0]
    words = shlex.split(block.replace("\\\n", " "))
    items = [words[i + 1] for i, word in enumerate(words) if word == "--slurm"]
    assert len(items) == 11, block
    parameters = slurm_parameters(options("--executor", "slurm", *slurm_args(items)).slurm)
    assert parameters["slurm_additional_parameters"] == {"reservation": "my-reservation"}
    assert parameters["tasks_per_node"] == parameters["gpus_per_node"] == 4


def test_values_are_typed_as_submitit_types_them():
    given = {"cpus-per-task": "8", "mem_gb": 32, "timeout_min": "90", "exclusive": "user", "use_srun": "false"}
    assert slurm_parameters(given) == {
        "cpus_per_task": 8,
        "mem_gb": 32,
        "timeout_min": 90,
        "slurm_exclusive": "user",
        "slurm_use_srun": False,
        "tasks_per_node": 1,
    }
    # A default gives way to what replaces it: Slurm refuses --cpus-per-task beside --cpus-per-gpu.
    per_gpu = slurm_parameters({"cpus_per_gpu": 4, "gpus_per_task": 1})
    assert per_gpu["slurm_cpus_per_gpu"] == 4 and "cpus_per_task" not in per_gpu
    assert slurm_parameters({"ntasks_per_node": 2})["slurm_ntasks_per_node"] == 2
    with pytest.raises(UsageError, match=r"--slurm timeout_min must be int, got 1.5"):
        slurm_parameters({"timeout_min": 1.5})


def test_a_study_runs_on_submitit_local_with_slurm_parameters(tmp_path, recorded, capsys):
    _, made = recorded
    spec = tmp_path / "tiny.toml"
    spec.write_text(STUDY)
    out = tmp_path / "study"
    local = ["timeout_min=30", "cpus_per_task=1", "mem_gb=2", "name=tiny"]
    slurm_only = ["account=abc", "qos=high", "constraint=a100", "array_parallelism=1", "setup=true"]
    args = ["reproduce", "--study", str(spec), "--out", str(out), "--executor", "submitit-local", "--no-progress"]
    assert main([*args, *slurm_args(local + slurm_only)]) == 0
    assert "runs: 1 done" in capsys.readouterr().out
    assert made[0].cluster == "local"
    parameters = made[0]._executor.parameters
    assert parameters | {"timeout_min": 30, "cpus_per_task": 1, "mem_gb": 2.0, "tasks_per_node": 1} == parameters
    assert not {"account", "qos", "constraint", "array_parallelism", "setup"} & parameters.keys()


@pytest.mark.parametrize(
    "executor, items, message",
    [
        ("submitit-local", ["acount=abc"], "--slurm: Unknown argument 'acount' for executor 'slurm'"),
        ("submitit-local", ["gpu"], "--slurm expects KEY=VALUE (repeatable), got 'gpu'"),
        ("submitit-local", ["array_parallelism=many"], "--slurm array_parallelism must be int, got 'many'"),
        ("submitit-local", ["name=true"], "--slurm: Parameter \"name\" expected type <class 'str'>"),
        ("submitit-local", ["partition=a", "partition=b"], "--slurm partition takes one value"),
        ("submitit-local", ["nodes=2"], "--slurm: LocalExecutor can use only one node. Use nodes=1"),
        ("local", ["partition=gpu"], "--slurm sets the jobs of --executor slurm or submitit-local"),
    ],
)
def test_bad_items_are_refused_before_anything_is_written(tmp_path, capsys, executor, items, message):
    spec = tmp_path / "tiny.toml"
    spec.write_text(STUDY)
    out = tmp_path / "study"
    args = ["reproduce", "--study", str(spec), "--out", str(out), "--executor", executor, *slurm_args(items)]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert not out.exists()


def test_a_submitit_executor_without_submitit_is_refused_with_its_install_command(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "submitit", None)  # how Python sees an environment without submitit
    spec = tmp_path / "tiny.toml"
    spec.write_text(STUDY)
    out = tmp_path / "study"
    assert main(["reproduce", "--study", str(spec), "--out", str(out), "--executor", "submitit-local"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines == [
        "mixit reproduce: error: --executor submitit-local needs submitit: pip install 'mixit-transformers[slurm]'"
    ]
    assert not out.exists()


@pytest.mark.parametrize(
    "executor, item, allowed",
    [
        ("submitit-local", "timeout_min=-5", "a time limit in minutes, at least 1"),
        ("submitit-local", "timeout_min=0", "a time limit in minutes, at least 1"),
        ("slurm", "time=0", "a time limit in minutes, at least 1"),
        ("submitit-local", "gpus_per_node=-1", "a number of GPUs, at least 0"),
        ("slurm", "gpus_per_task=-2", "a number of GPUs, at least 0"),
        ("slurm", "nodes=0", "a number of nodes, at least 1"),
        ("submitit-local", "tasks_per_node=0", "a number of tasks, at least 1"),
        ("slurm", "ntasks_per_node=-1", "a number of tasks, at least 1"),
        ("submitit-local", "cpus_per_task=0", "a number of CPUs, at least 1"),
        ("slurm", "cpus_per_gpu=0", "a number of CPUs, at least 1"),
        ("slurm", "array_parallelism=0", "a number of jobs at once, at least 1"),
        ("submitit-local", "mem_gb=0", "memory in GB, at least 0.001"),
        ("slurm", "mem_gb=0.0005", "memory in GB, at least 0.001"),
        ("slurm", "signal_delay_s=-1", "seconds between the warning signal and the time limit, at least 0"),
    ],
)
def test_numbers_out_of_range_are_refused_before_anything_is_written(tmp_path, capsys, executor, item, allowed):
    spec = tmp_path / "tiny.toml"
    spec.write_text(STUDY)
    out = tmp_path / "study"
    out.mkdir()  # an empty --out, which a study would take: left as it was
    before = out.stat().st_mtime_ns
    assert main(["reproduce", "--study", str(spec), "--out", str(out), "--executor", executor, "--slurm", item]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines == [f"mixit reproduce: error: --slurm {item} is out of range: {allowed}"]
    assert list(out.iterdir()) == [] and out.stat().st_mtime_ns == before


def test_each_least_value_passes_and_a_number_of_the_wrong_kind_is_refused():
    from mixit.study.executors import SLURM_NUMBERS

    least = {key: minimum for key, (minimum, _) in SLURM_NUMBERS.items() if key not in ("time", "ntasks_per_node")}
    assert slurm_parameters(least)["gpus_per_node"] == 0
    for key, value in {"mem_gb": math.inf, "timeout_min": True, "gpus_per_node": 1.0, "nodes": "1.0"}.items():
        with pytest.raises(UsageError, match=f"^--slurm {key} must be (int|float), got {value!r}$"):
            slurm_parameters({key: value})


def test_submitits_slurm_executor_judges_the_rest_before_anything_is_written(tmp_path, capsys, monkeypatch):
    """On a machine with Slurm (here two stand-in commands: nothing is submitted), submitit's Slurm executor checks
    the parameters as it writes its sbatch script; what it refuses or warns of is one line, and the study unwritten."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for command in ("sbatch", "srun"):
        (bin_dir / command).write_text("#!/bin/sh\nexit 1\n")
        (bin_dir / command).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    spec = tmp_path / "tiny.toml"
    spec.write_text(STUDY)
    out = tmp_path / "study"
    for item, message in [
        ("num_gpus=2", '--slurm: "num_gpus" is deprecated, please use "gpus_per_node" instead'),
        ("acount=abc", "--slurm: Unknown argument 'acount' for executor 'slurm' in parameter 'slurm_acount'"),
        ("stderr_to_stdout=maybe", "--slurm: Parameter \"stderr_to_stdout\" expected type <class 'bool'>"),
    ]:
        assert main(["reproduce", "--study", str(spec), "--out", str(out), "--executor", "slurm", "--slurm", item]) == 2
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("mixit reproduce: error: ") and message in lines[0], lines
        assert not out.exists()


def test_a_mapping_parameter_takes_repeatable_key_value_items():
    def command(env: dict[str, str] | None = None, retries: int = 0) -> None:
        """A command.

        Args:
            env: A variable as KEY=VALUE.
            retries: How often to try again.
        """

    parser = Parser()
    parser.add_options(command)
    assert parser._option_string_actions["--env"].help == "A variable as KEY=VALUE."
    items = ["a=1", "b = two words", "a=3", "c.x=4", "c.y=5=6"]
    parsed = parser.parse_args(slurm_args(items, "--env"), defaults=False)
    assert arguments(command, parsed.as_dict()) == {
        "env": {"a": ["1", "3"], "b": "two words", "c": {"x": "4", "y": "5=6"}}
    }
    for bad in ("a", "=1", "c.=1"):
        with pytest.raises(UsageError, match=f"--env expects KEY=VALUE \\(repeatable\\), got '{bad}'"):
            arguments(command, {"env": [bad]})
    with pytest.raises(UsageError, match=r"--env c is given both as c=VALUE and c.NAME=VALUE"):
        arguments(command, {"env": ["c.x=1", "c=2"]})


def test_the_parameters_mixit_reads_are_submitits_own():
    """`SLURM_NUMBERS`, `SLURM_SHAPES` and `SLURM_SHARED` say what the installed submitit reads (its private tables,
    read here and only here), so a parameter that a submitit release adds or retypes fails this test rather than
    a user's study: a number mixit would pass on as a string, or a list it would pass as one string."""
    from submitit.slurm.slurm import SlurmExecutor, _make_sbatch_string

    from mixit.study.executors import SLURM_NUMBERS, SLURM_SHAPES, SLURM_SHARED

    def kinds(hint):  # submitit's hint without None, and its generic types by their origin (list, dict)
        args = typing.get_args(hint) if typing.get_origin(hint) is typing.Union else (hint,)
        return {typing.get_origin(a) or a for a in args if a is not type(None)}

    generic = submitit.AutoExecutor._typed_parameters()
    sbatch = typing.get_type_hints(_make_sbatch_string)
    hints = {name: kinds(sbatch[name]) for name in SlurmExecutor._valid_parameters() - {"num_gpus"}}
    hints |= {name: {hint} for name, hint in generic.items()}
    assert set(SLURM_SHARED) == generic.keys()
    assert {name for name, kind in hints.items() if kind <= {int, float}} == SLURM_NUMBERS.keys()
    assert {name: float in kind for name, kind in hints.items() if name in SLURM_NUMBERS} == {
        name: isinstance(least, float) for name, (least, _) in SLURM_NUMBERS.items()
    }
    shaped = {name: kind for name, kind in hints.items() if kind & {list, dict, collections.abc.Iterable}}
    assert {name: SLURM_SHAPES.get(name) for name in shaped} == {
        name: dict if dict in kind else list for name, kind in shaped.items()
    }
