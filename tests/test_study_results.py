"""A study's results in Python: `results_frame` is results.csv's table, and the report's figure functions return
their Figure (None when there is nothing to draw) and save it only when given a path. What the report shows of a
task is the task's declaration: the study's machinery names no task."""

import ast
import csv
import math
import sys
from pathlib import Path

import pytest
from matplotlib.figure import Figure

from mixit.errors import UsageError
from mixit.study.collect import collect, task_class
from mixit.study.executors import Pool, execute
from mixit.study.figures import plot_cell_curves, plot_curves, plot_lines
from mixit.study.render import paper_key, results_frame
from mixit.study.report import write_report
from mixit.study.spec import Study, grid
from mixit.tasks import TASKS, Task

BASE = {
    "task": "addition",
    "task_params": {"n_digits": 2},
    "model": {"d_model": 16, "n_heads": 2, "n_layers": 1},
    "train": {"steps": 8, "batch_size": 16, "eval_every": 4},
    "test_size": 40,
}


@pytest.fixture(scope="module")
def study_dir(tmp_path_factory):
    """A finished study of two variants, one seed each, with its report written; its runs labelled with their table
    and task, as a paper table's are."""
    out = tmp_path_factory.mktemp("study") / "tiny"
    labels = {"table": "tiny", "task": "addition"}
    study = Study("tiny", grid(BASE, {"variant": ["standard", "mixit"]}, 1, labels))
    assert execute(study, out, Pool("sequential"), progress=False)["done"] == 2
    write_report(out)
    return out


def test_results_frame_is_the_table_of_results_csv(study_dir):
    frame = results_frame(study_dir)
    with (study_dir / "results.csv").open() as f:
        reader = csv.DictReader(f)
        rows = list(reader)
    assert frame.columns.tolist() == reader.fieldnames
    assert frame.id.tolist() == [row["id"] for row in rows] and len(rows) == 2
    assert sorted(frame.variant) == ["mixit", "standard"] and (frame.state == "done").all()
    for column in ("test.loss", "test.token_acc", "val.loss", "selected.test.token_acc", "train.steps"):
        # csv writes a number as its repr, which reads back as the same float
        assert frame[column].tolist() == [float(row[column]) for row in rows], column
    for column in ("role", "tables", "label.variant", "task", "chosen", "reason", "converged"):
        assert frame[column].astype(str).tolist() == [row[column] for row in rows], column
    assert all(math.isnan(x) for x in frame.error.astype(float))  # None in Python, an empty cell in the CSV


def test_results_frame_without_pandas_names_the_extra(study_dir, monkeypatch):
    monkeypatch.setitem(sys.modules, "pandas", None)  # how Python sees an environment without pandas
    with pytest.raises(UsageError, match=r"pip install 'mixit-transformers\[notebook\]'$"):
        results_frame(study_dir)


def test_curves_are_a_figure_saved_only_when_asked(study_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    results = collect(study_dir).final
    fig = plot_curves(results, "tiny", "addition")
    assert isinstance(fig, Figure) and list(tmp_path.iterdir()) == []
    (ax,) = fig.axes
    drawn = {line.get_label(): line.get_ydata().tolist() for line in ax.lines}
    expected = {f"{r.labels[0]['variant']} (1)": [acc for _, acc in r.curve] for r in results}
    assert drawn == expected and all(len(curve) == 3 for curve in drawn.values())  # evaluated at steps 0, 4, 8
    assert isinstance(plot_curves(results, "tiny", "addition", tmp_path / "curves.png"), Figure)
    assert (tmp_path / "curves.png").read_bytes().startswith(b"\x89PNG")


def test_nothing_to_draw_is_none_and_no_file(study_dir, tmp_path):
    assert plot_curves(collect(study_dir).final, "tiny", "dyck", tmp_path / "a.png") is None  # no run of dyck
    assert plot_cell_curves({"standard": []}, "addition", tmp_path / "b.png") is None
    assert plot_lines({"mixit": {}}, "x", "y", "title", tmp_path / "c.png") is None
    assert list(tmp_path.iterdir()) == []
    fig = plot_lines({"mixit": {4: 0.5, 1: 0.25}}, "heads", "accuracy", "title", log2=True)
    (line,) = fig.axes[0].lines
    assert line.get_xdata().tolist() == [1, 4] and line.get_ydata().tolist() == [0.25, 0.5]
    assert fig.axes[0].get_xscale() == "log" and list(tmp_path.iterdir()) == []


def test_a_task_declares_what_the_report_shows_of_it():
    assert Task.report_metric == ("accuracy", "token_acc", 100) and Task.report_columns == ()
    assert task_class("lm").report_metric == ("loss", "loss", 1)
    assert task_class("sentiment").report_metric == ("accuracy", "accuracy", 100)
    assert task_class("addition").report_columns == (("exact match", "exact_match", 100),)
    assert task_class("retrieval").report_metric == Task.report_metric
    assert task_class("a_plugin_not_loaded_here") is Task  # the base class's defaults: token accuracy in percent
    assert paper_key("lm", {"task_params": {"corpus": "data/wikitext-103"}}) == "lm:wikitext-103"
    assert paper_key("sentiment", {"task_params": {"dataset": "yelp_polarity"}}) == "sentiment:yelp_polarity"
    assert paper_key("addition", {"task_params": {"n_digits": 3}}) == "addition"


def test_the_study_machinery_names_no_task():
    """docs/design.md, "Layout": no string in the code of study/ names a task, docstrings and comments aside, but in
    the paper's data: its presets and table modules (study/tables/)."""
    study = Path(__file__).resolve().parents[1] / "src" / "mixit" / "study"
    named = []
    for path in sorted(study.glob("*.py")):
        if path.name == "presets.py":
            continue
        tree = ast.parse(path.read_text())
        docstrings = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Expr)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and node.value in TASKS and id(node) not in docstrings:
                named.append(f"{path.name}:{node.lineno} {node.value!r}")
    assert not named, named
