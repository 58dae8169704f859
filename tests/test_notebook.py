"""What a notebook user runs, run on a real Jupyter kernel (ipykernel, python3): each example of examples/ as
jupytext converts it, and the cells of README.md's "In a notebook", executed by nbclient in a temporary directory,
offline."""

import os
import re
from pathlib import Path

import jupytext
import nbformat
import pytest
from nbclient import NotebookClient

from mixit import run_config, train
from mixit.study.executors import Pool, execute
from mixit.study.spec import Study, grid
from test_examples import WRITES

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
CELL_TIMEOUT = 300
"""Seconds one cell may take (the examples' tiny size runs in seconds)."""


def run_notebook(notebook: nbformat.NotebookNode, cwd: Path, **env: str) -> nbformat.NotebookNode:
    """Execute every cell of `notebook` in order on a fresh python3 kernel started in `cwd`, with the Hugging Face
    hub offline and the example settings `env` and no others; return it with its outputs. A cell that raises fails
    the test with the cell and its traceback (nbclient's CellExecutionError)."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("MIXIT_EXAMPLE_")}
    environ.update({"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", **env})
    resources = {"metadata": {"path": str(cwd)}}
    NotebookClient(notebook, timeout=CELL_TIMEOUT, kernel_name="python3", resources=resources).execute(env=environ)
    return notebook


def shown(cell: nbformat.NotebookNode, kind: str) -> list[str]:
    """What `cell` shows as `kind` (a MIME type such as image/png, or stdout)."""
    if kind == "stdout":
        return [o.text for o in cell.get("outputs", []) if o.output_type == "stream" and o.name == "stdout"]
    return [o.data[kind] for o in cell.get("outputs", []) if kind in o.get("data", {})]


@pytest.mark.parametrize("name", sorted(WRITES))
def test_the_example_runs_as_a_notebook(tmp_path, name):
    """Each example runs on a kernel, writes its files, and shows each figure it writes under its cell."""
    notebook = run_notebook(jupytext.read(EXAMPLES / f"{name}.py"), tmp_path, MIXIT_EXAMPLE_SIZE="tiny")
    out = tmp_path / "runs" / "examples" / name / "tiny"
    for file in WRITES[name]:
        assert (out / file).is_file() and (out / file).stat().st_size > 0, f"{name} did not write {file}"
    figures = [shown(cell, "image/png") for cell in notebook.cells]
    assert sum(map(len, figures)) == sum(file.endswith(".png") for file in WRITES[name])
    printed = "".join(text for cell in notebook.cells for text in shown(cell, "stdout"))
    expected = {"compare_variants": "wrote ", "own_task": "runs done: 3, failed: 0", "attention_and_heads": "strongest"}
    assert expected[name] in printed


def readme_cells() -> list[str]:
    """The Python code blocks of README.md's section "In a notebook", one cell each."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index("\n## In a notebook\n") :]
    section = section[: section.index("\n## ", 1)]
    return re.findall(r"```python\n(.*?)```", section, re.DOTALL)


def test_the_readme_notebook_cells_run_on_a_kernel(tmp_path):
    """The cells read the run of "Training one run" and the study of `make run`: here tiny ones at those paths (a
    retrieval run of frozen_qk, and two runs labelled as the quick preset's Table 1 labels its retrieval runs)."""
    model, steps = {"d_model": 16, "n_heads": 2, "n_layers": 1}, {"steps": 8, "batch_size": 16, "eval_every": 4}
    cfg = run_config("retrieval", "frozen_qk", {"max_pairs": 4}, **model, **steps, test_size=40)
    train(cfg, tmp_path / "runs" / "ret-fqk", progress=False)
    base = {"task": "retrieval", "task_params": {"max_pairs": 4}, "model": model, "train": steps, "test_size": 40}
    labels = {"table": "table1", "task": "retrieval"}
    study = Study("quick", grid(base, {"variant": ["standard", "mixit"]}, 1, labels))
    assert execute(study, tmp_path / "runs" / "study-quick", Pool("sequential"), progress=False)["done"] == 2

    cells = [nbformat.v4.new_code_cell(source) for source in readme_cells()]
    _, metrics, results, patterns, curves = run_notebook(nbformat.v4.new_notebook(cells=cells), tmp_path).cells
    assert len(shown(metrics, "image/png")) == 1  # pandas' plot of the evaluations
    (table,) = shown(results, "text/html")  # the DataFrame of means by task and variant
    assert all(word in table for word in ("retrieval", "standard", "mixit", "count"))
    assert len(shown(patterns, "image/png")) == 1  # the Figure the last line returns
    assert len(shown(curves, "image/png")) == 1
    assert (tmp_path / "retrieval-curves.png").read_bytes().startswith(b"\x89PNG")
