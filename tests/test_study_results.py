"""A study's results in Python: `results_frame` is results.csv's table, and the report's figure functions return
their Figure (None when there is nothing to draw) and save it only when given a path; a study file's report, its
figures and its DataFrame give a cell the same number. What the report shows of a task is the task's declaration:
the study's machinery names no task."""

import ast
import csv
import json
import math
import shutil
import sys
from pathlib import Path

import pytest
from matplotlib.figure import Figure

from mixit.cli import main
from mixit.core.tasks import TASKS, Task
from mixit.errors import UsageError
from mixit.study.collect import collect, task_class
from mixit.study.executors import Pool, execute
from mixit.study.figures import plot_cell_curves, plot_curves, plot_lines
from mixit.study.render import paper_key, results_frame
from mixit.study.report import axis_figures, write_report
from mixit.study.spec import Study, grid
from tolerance import assert_close

BASE = {
    "task": "addition",
    "task_params": {"n_digits": 2},
    "model": {"d_model": 16, "n_heads": 2, "n_layers": 1},
    "train": {"steps": 8, "batch_size": 16, "eval_every": 4},
    "test_size": 40,
}
LR_STUDY = """
name = "lr"
seeds = 2
[base]
task = "addition"
variant = "mixit"
task_params = {n_digits = 2}
model = {d_model = 16, n_heads = 2, n_layers = 1}
train = {steps = 8, batch_size = 16, eval_every = 2}
test_size = 40
[grid]
"train.lr" = [0.001, 0.03]
"""


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


@pytest.fixture(scope="module")
def lr_study(tmp_path_factory):
    """A study file over two learning rates, two seeds each, run from the command line: 8 steps, evaluated every 2,
    so a run's best validation evaluation may be another than its last."""
    root = tmp_path_factory.mktemp("lr")
    (root / "lr.toml").write_text(LR_STUDY)
    out = root / "study"
    argv = ["reproduce", "--study", str(root / "lr.toml"), "--out", str(out), "--executor", "sequential"]
    assert main([*argv, "--no-progress"]) == 0
    return out


def cells_table(report: str) -> dict[str, dict[str, str]]:
    """The Cells table of report.md: each row's lr -> its columns' text."""
    rows = [line.strip("|").split(" | ") for line in report.splitlines() if line.startswith("| ")]
    header, *cells = [[cell.strip() for cell in row] for row in rows]
    return {row[header.index("lr")]: dict(zip(header, row, strict=True)) for row in cells}


def per_cell(frame):
    """The final runs done, by their lr, each cell's selected test token accuracy: mean and sample std (ddof=1)."""
    done = frame[(frame.role == "final") & (frame.state == "done")]
    return done.groupby("label.lr")["selected.test.token_acc"].agg(["mean", "std", "count"])


def test_a_study_files_report_figure_and_frame_give_a_cell_the_same_number(lr_study):
    frame = results_frame(lr_study)
    assert (frame["selected.test.token_acc"] != frame["test.token_acc"]).any()  # the last evaluation differs
    cells, report = per_cell(frame), (lr_study / "report.md").read_text()
    table = cells_table(report)
    assert sorted(table) == ["0.001", "0.03"] and cells["count"].tolist() == [2, 2]
    for lr, cell in cells.iterrows():
        assert table[str(lr)]["test token_acc"] == f"{cell['mean']:.4f} ± {cell['std']:.4f}"

    assert "![lr-addition](figures/lr-addition.png)" in report
    assert (lr_study / "figures" / "lr-addition.png").read_bytes().startswith(b"\x89PNG")
    figures = axis_figures(collect(lr_study))
    assert list(figures) == ["lr-addition.png"]  # lr is the one label with numbers; the table label is text
    (ax,) = figures["lr-addition.png"].axes
    (points,) = ax.containers  # one line: the study varies nothing else
    line, _, (bars,) = points
    assert line.get_xdata().tolist() == cells.index.tolist() == [0.001, 0.03] and ax.get_xscale() == "log"
    assert_close(line.get_ydata().tolist(), cells["mean"].tolist(), terms=2)  # a mean of two seeds, any order
    half = [(top - bottom) / 2 for (_, bottom), (_, top) in bars.get_segments()]
    # the bars' ends are mean +- std, rounded on the mean's scale: a few roundings of numbers that size
    assert_close(half, cells["std"].tolist(), terms=8, scale=float(cells["mean"].abs().max()))


def test_a_run_without_a_selection_is_read_at_its_last_evaluation_everywhere(lr_study, tmp_path):
    """A run of older code recorded no `selected`: the report, the DataFrame and the figure all read its last
    evaluation."""
    study = tmp_path / "study"
    shutil.copytree(lr_study, study)
    frame = results_frame(study)
    old = frame[frame["selected.test.token_acc"] != frame["test.token_acc"]].iloc[0]
    summary_path = study / "runs" / old["id"] / "summary.json"
    summary = json.loads(summary_path.read_text())
    del summary["selected"]
    summary_path.write_text(json.dumps(summary))
    write_report(study)
    frame = results_frame(study)
    row = frame[frame.id == old["id"]].iloc[0]
    assert row["selected.test.token_acc"] == row["test.token_acc"] and math.isnan(row["selected.step"])
    cells = per_cell(frame)
    cell = cells.loc[old["label.lr"]]
    assert cells_table((study / "report.md").read_text())[str(old["label.lr"])]["test token_acc"] == (
        f"{cell['mean']:.4f} ± {cell['std']:.4f}"
    )
    (line, _, _) = axis_figures(collect(study))["lr-addition.png"].axes[0].containers[0]
    assert_close(line.get_ydata().tolist(), cells["mean"].tolist(), terms=2)


def test_curves_of_a_study_files_runs(lr_study):
    """A study file's runs are labelled with its name as their table and the values of its grid, not a task or
    a variant: `plot_curves` draws one line per cell, as the report's Curves section does."""
    results = collect(lr_study).final
    fig = plot_curves(results, "lr", "addition")
    (ax,) = fig.axes
    drawn = {line.get_label(): line.get_ydata().tolist() for line in ax.lines}
    assert sorted(drawn) == ["0.001 (2)", "0.03 (2)"]
    for lr in (0.001, 0.03):
        seeds = [dict(r.curve) for r in results if r.labels[0]["lr"] == lr]
        assert len(seeds) == 2
        mean = [(a + b) / 2 for a, b in zip(seeds[0].values(), seeds[1].values(), strict=True)]
        assert_close(drawn[f"{lr} (2)"], mean, terms=2)
    assert plot_curves(results, "lr", "dyck") is None and plot_curves(results, "another", "addition") is None
    assert "![addition curves](figures/curves-addition.png)" in (lr_study / "report.md").read_text()


def test_a_grid_over_freeze_selectors_is_reported_cell_by_cell(tmp_path):
    out = tmp_path / "freeze"
    regimes = [["embed"], ["embed", "blocks.0.mlp.up"]]
    study = Study(
        "freeze", grid({**BASE, "train": {**BASE["train"], "steps": 2}}, {"freeze": regimes}, 1, {"table": "freeze"})
    )
    assert execute(study, out, Pool("sequential"), progress=False)["done"] == 2
    write_report(out)
    rows = [line.split(" | ") for line in (out / "report.md").read_text().splitlines() if line.startswith("| freeze |")]
    assert [row[1] for row in rows] == ["embed", "embed, blocks.0.mlp.up"]
