"""Plugins (`mixit.plugins`): a variant registered by a module of one's own is found by the command line and
by a study's fresh worker processes once MIXIT_PLUGINS or an installed entry point names the module; a
plugin that cannot be imported, or a plugin's task breaking the task contract, is refused in one line; a
definition registered again replaces itself."""

import json
import os
import subprocess
import sys
from dataclasses import dataclass

import pytest

from mixit.cli import main
from mixit.errors import UsageError
from mixit.plugins import ENV, load_plugins, plugin_names
from mixit.registry import Registry

PLUGIN = """
from mixit.core.freezing import VARIANTS, Variant

VARIANTS.add("plugged", Variant("plugged", "softmax", (), "the standard model, from a plugin"))
"""

STUDY = """
name = "plugged"
[base]
task = "addition"
task_params = {n_digits = 2}
model = {d_model = 16, n_heads = 2, n_layers = 1}
train = {steps = 4, batch_size = 8}
test_size = 20
[grid]
variant = ["plugged", "standard"]
"""

TINY = ["--task", "addition", "-p", "n_digits=2", "--d-model", "16", "--n-heads", "2", "--n-layers", "1"]
TINY += ["--steps", "3", "--batch-size", "8", "--test-size", "20", "--no-progress"]


def mixit(args, cwd, **env):
    """`mixit ARGS` in a fresh process, in `cwd`, with `env` added to the environment."""
    environment = {k: v for k, v in os.environ.items() if k != ENV}
    environment.update(HF_HUB_OFFLINE="1", **env)
    command = [sys.executable, "-m", "mixit", *args]
    return subprocess.run(command, cwd=cwd, env=environment, capture_output=True, text=True, timeout=300)


def mixit_here(args, cwd, monkeypatch, capsys, **env):
    """`mixit ARGS` in this process, in `cwd`, with `env` set (PYTHONPATH put on sys.path): its exit status, stdout
    and stderr. For plugins that fail to import, which leave nothing behind in the process."""
    monkeypatch.chdir(cwd)
    monkeypatch.delenv(ENV, raising=False)
    monkeypatch.setattr(sys, "dont_write_bytecode", True)  # Python's own __pycache__ of the plugin stays unwritten
    for key, value in env.items():
        if key == "PYTHONPATH":
            monkeypatch.syspath_prepend(value)
        else:
            monkeypatch.setenv(key, value)
    capsys.readouterr()
    code = main(args)
    out, err = capsys.readouterr()
    return code, out, err


def test_a_plugin_variant_trains_from_the_command_line_and_in_a_studys_workers(tmp_path):
    (tmp_path / "my_variants.py").write_text(PLUGIN)
    (tmp_path / "grid.toml").write_text(STUDY)
    refused = mixit(["train", "--variant", "plugged", *TINY, "--out", "run"], tmp_path)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert "unknown variant 'plugged'" in refused.stderr and "MIXIT_PLUGINS" in refused.stderr
    trained = mixit(["train", "--variant", "plugged", *TINY, "--out", "run"], tmp_path, MIXIT_PLUGINS="my_variants.py")
    assert trained.returncode == 0, trained.stderr[-2000:]
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["variant"] == "plugged"
    # Two worker processes of the local pool, each started afresh, find the variant through the environment.
    args = ["reproduce", "--study", "grid.toml", "--out", "study", "--workers", "2", "--no-progress"]
    study = mixit(args, tmp_path, MIXIT_PLUGINS="my_variants.py")
    assert study.returncode == 0, study.stderr[-2000:]
    assert "runs: 2 done, 0 failed" in study.stdout
    assert not (tmp_path / "study" / "failed").exists()


def test_an_installed_entry_point_is_a_plugin(tmp_path):
    (tmp_path / "entry_variants.py").write_text(PLUGIN)
    info = tmp_path / "mixit_plugin_example-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: mixit-plugin-example\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[mixit.plugins]\nexample = entry_variants\n")
    listed = mixit(["list"], tmp_path, PYTHONPATH=str(tmp_path))
    assert listed.returncode == 0 and "plugged" in listed.stdout, listed.stderr[-2000:]


@pytest.mark.parametrize(
    "plugin, message",
    [
        ("no_such_module_here", "plugin 'no_such_module_here' (from MIXIT_PLUGINS"),
        ("missing.py", "plugin 'missing.py' (from MIXIT_PLUGINS"),
        ("broken.py", "cannot be imported: ZeroDivisionError: division by zero"),
    ],
)
def test_a_plugin_that_cannot_be_imported_is_refused_in_one_line(tmp_path, plugin, message, monkeypatch, capsys):
    (tmp_path / "broken.py").write_text("1 / 0\n")
    code, out, err = mixit_here(["list"], tmp_path, monkeypatch, capsys, MIXIT_PLUGINS=plugin)
    assert code == 2 and message in err, err
    assert len(err.strip().splitlines()) == 1 and out == ""


def snapshot(root):
    """Every path under `root` with its mtime and, for a file, its bytes: what a refusal leaves as it was."""
    return {str(p): (p.stat().st_mtime_ns, p.read_bytes() if p.is_file() else None) for p in sorted(root.rglob("*"))}


def installed(tmp_path, module):
    """The environment of a package in `tmp_path` whose entry point of mixit.plugins is `module`."""
    info = tmp_path / "mixit_plugin_example-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: mixit-plugin-example\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[mixit.plugins]\nexample = {module}\n")
    return {"PYTHONPATH": str(tmp_path)}


@pytest.mark.parametrize(
    "how, source, raised",
    [
        ("file", "import sys\nsys.exit(3)\n", "SystemExit: 3"),
        ("file", "import sys\nsys.exit()\n", "SystemExit"),
        ("file", "raise KeyboardInterrupt\n", "KeyboardInterrupt"),
        ("file", "def (:\n", "SyntaxError: invalid syntax"),
        ("file", "import no_such_module_here\n", "ModuleNotFoundError: No module named 'no_such_module_here'"),
        ("module", "import sys\nsys.exit('no GPU here,\\nstopping')\n", "SystemExit: no GPU here, stopping"),
        ("entry point", "raise KeyboardInterrupt\n", "KeyboardInterrupt"),
        ("entry point", "raise RuntimeError('no licence')\n", "RuntimeError: no licence"),
    ],
)
def test_a_plugin_that_exits_is_interrupted_or_raises_is_refused_before_a_study_writes(
    tmp_path, how, source, raised, monkeypatch, capsys
):
    (tmp_path / "bad_plugin.py").write_text(source)
    (tmp_path / "grid.toml").write_text(STUDY)
    name = "bad_plugin.py" if how == "file" else "bad_plugin"
    env = installed(tmp_path, name) if how == "entry point" else {ENV: name, "PYTHONPATH": str(tmp_path)}
    before = snapshot(tmp_path)
    args = ["reproduce", "--study", "grid.toml", "--out", "study", "--no-progress"]
    code, out, err = mixit_here(args, tmp_path, monkeypatch, capsys, **env)
    assert code == 2 and out == "", err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"mixit reproduce: error: plugin {name!r} (from MIXIT_PLUGINS")
    assert lines[0].endswith(f"cannot be imported: {raised}") or f"cannot be imported: {raised} (" in lines[0], lines
    assert snapshot(tmp_path) == before and not (tmp_path / "study").exists()


WORKERS_ONLY = """import multiprocessing, os
if multiprocessing.parent_process() is not None or any(name.startswith("SUBMITIT_") for name in os.environ):
    {}
"""
"""A plugin that imports in the study's own process, and does `{}` in its pool's workers and submitit's jobs."""


@pytest.mark.parametrize("executor", ["local", "submitit-local"])
def test_a_plugin_that_exits_in_a_studys_workers_fails_their_runs_naming_it(tmp_path, executor):
    (tmp_path / "worker_plugin.py").write_text(WORKERS_ONLY.format("raise SystemExit(3)"))
    (tmp_path / "grid.toml").write_text(STUDY.replace('"plugged", ', '"mixit", '))
    args = ["reproduce", "--study", "grid.toml", "--out", "study", "--workers", "2", "--executor", executor]
    done = mixit([*args, "--no-progress"], tmp_path, MIXIT_PLUGINS="worker_plugin.py")
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert "runs: 0 done, 2 failed" in done.stdout
    for record in (tmp_path / "study" / "failed").iterdir():
        error = json.loads(record.read_text())["error"]
        assert error.endswith(
            "plugin 'worker_plugin.py' (from MIXIT_PLUGINS or the entry points of mixit.plugins) "
            "cannot be imported: SystemExit: 3"
        ), error


def test_a_worker_interrupted_while_importing_a_plugin_is_interrupted_not_failed(tmp_path):
    # The KeyboardInterrupt a worker gets when the study stops it (`_stop_pool`) may come while it imports.
    (tmp_path / "worker_plugin.py").write_text(WORKERS_ONLY.format("raise KeyboardInterrupt"))
    (tmp_path / "grid.toml").write_text(STUDY.replace('"plugged", ', '"mixit", '))
    args = ["reproduce", "--study", "grid.toml", "--out", "study", "--workers", "2", "--no-progress"]
    done = mixit(args, tmp_path, MIXIT_PLUGINS="worker_plugin.py")
    assert done.returncode == 130 and len(done.stderr.strip().splitlines()) == 1, done.stderr[-2000:]
    assert done.stderr.startswith("mixit reproduce: interrupted;")
    assert not (tmp_path / "study" / "failed").exists()


def test_a_study_from_python_imports_the_plugins_before_it_writes(tmp_path, monkeypatch):
    from mixit.study import ReproduceOptions, reproduce

    (tmp_path / "exiting_plugin.py").write_text("import sys\nsys.exit(3)\n")
    (tmp_path / "grid.toml").write_text(STUDY)
    monkeypatch.setenv(ENV, str(tmp_path / "exiting_plugin.py"))
    options = ReproduceOptions(study=tmp_path / "grid.toml", out=tmp_path / "study", progress=False)
    with pytest.raises(UsageError, match=r"exiting_plugin.py' .*cannot be imported: SystemExit: 3$"):
        reproduce(options)
    assert not (tmp_path / "study").exists()


def test_plugins_load_once_per_process_from_the_environment(tmp_path, monkeypatch):
    (tmp_path / "counted_plugin.py").write_text("import builtins\nbuiltins.mixit_plugin_loads += 1\n")
    import builtins

    monkeypatch.setattr(builtins, "mixit_plugin_loads", 0, raising=False)
    monkeypatch.setenv(ENV, f" {tmp_path / 'counted_plugin.py'} ,")
    assert plugin_names()[-1] == str(tmp_path / "counted_plugin.py")
    assert load_plugins() == [str(tmp_path / "counted_plugin.py")]
    assert load_plugins() == []
    assert builtins.mixit_plugin_loads == 1
    monkeypatch.setenv(ENV, "no_such_module_here")
    with pytest.raises(UsageError, match="no_such_module_here"):
        load_plugins()


def test_the_same_definition_registered_again_replaces_itself_and_another_is_refused():
    registry: Registry[object] = Registry("thing")

    @dataclass
    class Thing:
        size: int

    def cell(body):
        """A function `f` defined by running a notebook cell (module "cell") with `body`."""
        namespace = {"__name__": "cell"}
        exec(f"def f():\n    {body}\n", namespace)
        return namespace["f"]

    registry.add("a", Thing(1))
    registry.add("a", Thing(1))  # equal: a notebook cell run again
    registry.add("f", cell("return 1"))
    redefined = cell("return 2")  # the cell edited and run again: the same module and name
    registry.add("f", redefined)
    assert registry.get("f") is redefined
    with pytest.raises(ValueError, match="thing 'a' is registered twice"):
        registry.add("a", Thing(2))
    with pytest.raises(ValueError, match="thing 'f' is registered twice"):
        registry.add("f", lambda: 2)


INCOMPLETE = """
import numpy as np

from mixit.core.tasks.base import TASKS, SequenceTask


@TASKS.register("shapeless")
class Shapeless(SequenceTask):  # no seq_len: met when the run is resolved
    name = "shapeless"
    vocab_size = 5


@TASKS.register("sampleless")
class Sampleless(SequenceTask):  # no sample(): met when the run is resolved
    name = "sampleless"
    vocab_size = 5
    seq_len = 6


@TASKS.register("wordy")
class Wordy(SequenceTask):  # token ids past its vocabulary: an index error once the run was written
    name = "wordy"
    vocab_size = 5
    seq_len = 6

    def sample(self, rng, n):
        seq = rng.integers(0, 9, size=(n, 6))
        return seq, np.ones_like(seq, dtype=bool)
"""


@pytest.mark.parametrize(
    "task, message",
    [
        ("shapeless", "mixit train: error: task 'shapeless' (Shapeless) must define seq_len: docs/extending.md"),
        ("sampleless", "mixit train: error: task 'sampleless' (Sampleless) must implement sample(): docs/extending.md"),
        ("wordy", "mixit train: error: task 'wordy' (Wordy): token ids must be in 0..4 (its vocab_size), got 0..8"),
    ],
)
def test_a_plugin_task_breaking_the_task_contract_is_refused_in_one_line_before_any_work(tmp_path, task, message):
    (tmp_path / "incomplete.py").write_text(INCOMPLETE)
    done = mixit(["train", "--task", task, "--steps", "3", "--out", "run"], tmp_path, MIXIT_PLUGINS="incomplete.py")
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().startswith(message) and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert not (tmp_path / "run").exists()


def test_a_study_of_a_plugin_task_lacking_sample_is_refused_before_any_run(tmp_path):
    # Met when the study's runs are resolved, not by each run failing on its first batch.
    (tmp_path / "incomplete.py").write_text(INCOMPLETE)
    study = STUDY.replace('"addition"', '"sampleless"').replace("{n_digits = 2}", "{}").replace('"plugged", ', "")
    (tmp_path / "grid.toml").write_text(study)
    args = ["reproduce", "--study", "grid.toml", "--out", "study", "--no-progress"]
    done = mixit(args, tmp_path, MIXIT_PLUGINS="incomplete.py")
    assert done.returncode == 2 and done.stdout == "", done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("mixit reproduce: error: study run ("), lines
    assert "task 'sampleless' (Sampleless) must implement sample(): docs/extending.md" in lines[0], lines
    assert not (tmp_path / "study").exists()


FAILING = """
import torch

from mixit.core.models.attention import ATTENTION, Attention


@ATTENTION.register("failing")
class Failing(Attention):  # fails on any input: a bug in one's own attention kind
    any_variant = True
    learned_positions = True

    def __init__(self, cfg, layer):
        super().__init__()
        self.scale = torch.nn.Parameter(torch.ones(()))

    def forward(self, x, valid=None):
        raise RuntimeError("the failing kind fails")
"""


def test_an_attention_kind_failing_on_the_data_fails_with_its_traceback_before_the_run_is_written(tmp_path):
    (tmp_path / "failing.py").write_text(FAILING)
    done = mixit(["train", *TINY, "--attention", "failing", "--out", "run"], tmp_path, MIXIT_PLUGINS="failing.py")
    assert done.returncode == 1, done.stderr
    assert "RuntimeError: the failing kind fails" in done.stderr and "Traceback" in done.stderr
    assert "the model failed on the task's first training example, before the run was written" in done.stderr
    assert not (tmp_path / "run").exists()
