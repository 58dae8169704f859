"""The scripts in examples/ run at their tiny size and write what their first cell says they write, and
each one reads as a notebook (jupytext's percent format: markdown and code cells)."""

import csv
import os
import shutil
import subprocess
import sys
from pathlib import Path

import jupytext
import pytest
from jupytext.formats import guess_format

from mixit import run_config, train

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
WRITES = {
    "compare_variants": ["curves.png", "standard/summary.json", "mixit/summary.json"],
    "own_task": ["report.md", "results.csv", "checks.json"],
    "attention_and_heads": ["attention.png", "head_scores.png", "run/summary.json"],
}
"""Each example, and the files it writes into its output directory."""


def run_example(name: str, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """Run examples/NAME.py in `cwd` at the tiny size, with the example settings `env` and no others."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("MIXIT_EXAMPLE_")}
    environ.update({"MIXIT_EXAMPLE_SIZE": "tiny", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", **env})
    return subprocess.run(
        [sys.executable, str(EXAMPLES / f"{name}.py")],
        cwd=cwd,
        env=environ,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.fixture(scope="module")
def example_runs(tmp_path_factory):
    """`ran(name)`: examples/NAME.py run once for the module at the tiny size, in a directory of its own: that
    directory and the finished process. Tests that run the example again do so in a copy."""
    done = {}

    def ran(name):
        if name not in done:
            cwd = tmp_path_factory.mktemp(name)
            done[name] = (cwd, run_example(name, cwd))
        return done[name]

    return ran


def test_every_example_is_listed_here():
    assert sorted(p.stem for p in EXAMPLES.glob("*.py")) == sorted(WRITES)


@pytest.mark.parametrize("name", sorted(WRITES))
def test_the_example_runs_at_the_tiny_size(example_runs, name):
    cwd, done = example_runs(name)
    assert done.returncode == 0, done.stderr[-3000:]
    out = cwd / "runs" / "examples" / name / "tiny"
    for file in WRITES[name]:
        assert (out / file).is_file() and (out / file).stat().st_size > 0, f"{name} did not write {file}"
    for figure in out.glob("*.png"):
        assert figure.read_bytes().startswith(b"\x89PNG") and figure.stat().st_size > 5000
    if name == "own_task":
        rows = list(csv.DictReader((out / "results.csv").open()))
        assert sorted(r["variant"] for r in rows) == ["frozen_mlp", "mixit", "standard"]
        assert all(r["state"] == "done" and r["task"] == "reverse" for r in rows)
        assert "frozen_mlp" in done.stdout and "exact match" in done.stdout


def test_a_rerun_reuses_the_finished_runs(example_runs, tmp_path):
    cwd, first = example_runs("compare_variants")
    assert first.returncode == 0, first.stderr[-3000:]
    shutil.copytree(cwd / "runs", tmp_path / "runs")  # copy2: the files' modification times kept
    summary = tmp_path / "runs" / "examples" / "compare_variants" / "tiny" / "standard" / "summary.json"
    written = summary.stat().st_mtime_ns
    again = run_example("compare_variants", tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    assert summary.stat().st_mtime_ns == written


def test_the_attention_example_reads_a_run_it_is_given(tmp_path):
    cfg = run_config("addition", "mixit", {"n_digits": 2}, d_model=16, n_heads=2, n_layers=1, steps=3, test_size=20)
    train(cfg, tmp_path / "given", progress=False)
    done = run_example(
        "attention_and_heads", tmp_path, MIXIT_EXAMPLE_RUN=str(tmp_path / "given"), MIXIT_EXAMPLE_OUT="figures"
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "addition/mixit" in done.stdout
    assert sorted(p.name for p in (tmp_path / "figures").iterdir()) == ["attention.png", "head_scores.png"]


def test_an_unknown_size_is_refused_in_one_line(tmp_path):
    done = run_example("compare_variants", tmp_path, MIXIT_EXAMPLE_SIZE="huge")
    assert done.returncode != 0
    assert done.stderr.strip() == "MIXIT_EXAMPLE_SIZE must be one of laptop, tiny, got 'huge'"
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("name", sorted(WRITES))
def test_the_example_is_a_notebook(name):
    path = EXAMPLES / f"{name}.py"
    assert guess_format(path.read_text(), ".py")[0] == "percent"
    notebook = jupytext.read(path)
    kinds = [cell.cell_type for cell in notebook.cells]
    assert kinds[0] == "markdown" and notebook.cells[0].source.startswith("# ")
    assert kinds.count("markdown") >= 3 and kinds.count("code") >= 3
    introduction = " ".join(notebook.cells[0].source.split())
    assert "it took" in introduction and "2 CPU cores" in introduction and "MIXIT_EXAMPLE_SIZE=tiny" in introduction
