"""A study's stages after its finals: budget extensions of the runs that ended unconverged (`Study.extend`),
read at their longest finished budget, and rounds of further seeds (`Study.more_seeds`).

A tiny run's convergence is set by its criterion, not by how it learns: with `min_delta` 10 (ten times any
accuracy) nothing counts as improving, so patience 1 ends every run "flat" and patience 50 ends every run
"too_few" (fewer evaluations than the patience: not converged), at any budget. A study extends a flat run too
(a slow starter may not have started), and no tiny run can be made to reach a plateau or solve its task on every
CPU, so here flat stands for settled (`settled_when_flat`); which reasons extend is tested on its own."""

import json

import pytest

from mixit.cli import main
from mixit.core.experiment import merge
from mixit.errors import UsageError
from mixit.study import executors as execute_module
from mixit.study.cells import rows
from mixit.study.collect import collect
from mixit.study.executors import Pool, execute, extended, state, unconverged
from mixit.study.report import own_cells
from mixit.study.spec import Study, grid, load_study_file, plan, seed_range

BASE = {
    "task": "addition",
    "task_params": {"n_digits": 2},
    "variant": "standard",
    "model": {"d_model": 16, "n_heads": 2, "n_layers": 1},
    "train": {"steps": 8, "batch_size": 16, "checkpoint_every": 2, "min_delta": 10.0},
    "test_size": 40,
}
CONVERGES, STILL_MOVING = 1, 50  # patience: "flat", or "too_few" (module docstring)


@pytest.fixture(autouse=True)
def settled_when_flat(request, monkeypatch):
    """Every test but the one of the reasons themselves counts a flat run as settled (module docstring)."""
    if request.node.originalname != "test_a_finished_run_is_extended_by_its_convergence_reason":
        monkeypatch.setattr(execute_module, "SETTLED", (*execute_module.SETTLED, "flat"))


def tiny(patience=(CONVERGES, STILL_MOVING), seeds=1, extend=(2, 4), **kw):
    specs = grid(BASE, {"train.patience": list(patience)}, seeds, {"table": "tiny"})
    return Study("tiny", specs, seeds=seeds, extend=extend, **kw)


def recorded(out):
    return {entry["id"]: entry for entry in json.loads((out / "study.json").read_text())["runs"]}


def test_an_unconverged_final_is_trained_again_at_twice_then_four_times_its_cap(tmp_path):
    out = tmp_path / "study"
    study = tiny()
    tally = execute(study, out, Pool("sequential"), progress=False)
    assert tally == {"done": 4, "failed": 0, "skipped_failed": 0}  # the converged cell once, the other at 1x, 2x, 4x
    (converges, moving) = plan(study.specs)
    runs = recorded(out)
    assert [i for i, e in runs.items() if e["labels"][0]["patience"] == CONVERGES] == [converges.id]  # at 1x only
    by_budget = {budget_of(e): e for e in runs.values() if e["labels"][0]["patience"] == STILL_MOVING}
    assert sorted(by_budget) == [1, 2, 4] and by_budget[1]["id"] == moving.id
    for multiple in (2, 4):
        entry = by_budget[multiple]
        assert entry["role"] == "final" and entry["labels"] == [{**moving.labels[0], "budget": multiple}]
        train = entry["config"]["train"]
        assert (train["steps"], train["eval_every"]) == (8 * multiple, multiple)  # as many evaluations as at 1x
        assert (train["patience"], train["checkpoint_every"], entry["config"]["model"]["seed"]) == (50, 2, 0)
        config = json.loads((out / "runs" / entry["id"] / "config.json").read_text())
        wanted = merge(moving.cfg.request, {"train": {"steps": 8 * multiple, "eval_every": multiple}})
        assert config["request"] == wanted  # trained from scratch, from the cell's own request
        summary = json.loads((out / "runs" / entry["id"] / "summary.json").read_text())
        assert summary["steps"] == 8 * multiple and summary["convergence"]["reason"] == "too_few"
        assert "resumed_from" not in summary or not summary["resumed_from"]


def budget_of(entry):
    return entry["labels"][0].get("budget", 1)


def test_the_report_reads_each_seed_at_its_longest_finished_budget(tmp_path):
    out = tmp_path / "study"
    execute(tiny(seeds=2, extend=(2,)), out, Pool("sequential"), progress=False)
    results = collect(out)
    assert len([r for r in results.results if r.role == "final"]) == 6  # 2 cells x 2 seeds, and 2 extensions
    for seed in (0, 1):
        ((converges, _),) = rows(results.final, table="tiny", patience=CONVERGES, seed=seed)
        ((moving, labels),) = rows(results.final, table="tiny", patience=STILL_MOVING, seed=seed)
        assert (converges.budget, moving.budget, labels["budget"]) == (1, 2, 2)
        assert moving.config["train"]["steps"] == 16
    assert sorted((r.budget, r.labels[0]["seed"]) for r in results.superseded) == [(1, 0), (1, 1)]
    # A study of your own is reported cell by cell: a seed at 2x is in its cell, not a cell of its own.
    cells = own_cells(results)
    assert sorted(len(found) for found in cells.values()) == [2, 2]


def test_a_resumed_study_asks_for_the_same_runs_and_trains_none_again(tmp_path):
    out = tmp_path / "study"
    execute(tiny(), out, Pool("sequential"), progress=False)
    before = recorded(out)
    stamps = {i: (out / "runs" / i / "summary.json").stat().st_mtime_ns for i in before}
    assert execute(tiny(), out, Pool("sequential"), progress=False) == {"done": 4, "failed": 0, "skipped_failed": 0}
    assert recorded(out) == before
    assert {i: (out / "runs" / i / "summary.json").stat().st_mtime_ns for i in before} == stamps
    with pytest.raises(UsageError, match="holds another study"):  # extended otherwise: another study
        execute(tiny(extend=(2,)), out, Pool("sequential"), progress=False)


def test_a_failed_run_is_not_extended_and_its_cell_reads_its_longest_finished_budget(tmp_path, monkeypatch):
    out = tmp_path / "study"
    study = tiny(patience=(STILL_MOVING,))
    (moving,) = plan(study.specs)
    doomed = extended(moving, 2).id
    real_train = execute_module.train

    def flaky(cfg, path, **kw):
        if path.name == doomed:
            raise RuntimeError("out of memory")
        return real_train(cfg, path, **kw)

    monkeypatch.setattr(execute_module, "train", flaky)
    assert execute(study, out, Pool("sequential"), progress=False) == {"done": 1, "failed": 1, "skipped_failed": 0}
    assert set(recorded(out)) == {moving.id, doomed}  # no 4x after a failed 2x
    ((read, _),) = rows(collect(out).final, seed=0)
    assert (read.id, read.budget, read.state) == (moving.id, 1, "done")
    assert [(r.id, r.state) for r in collect(out).superseded] == [(doomed, "failed")]
    monkeypatch.setattr(execute_module, "train", real_train)
    tally = execute(study, out, Pool("sequential"), retry_failed=True, progress=False)
    assert (tally["done"], tally["failed"]) == (3, 0)  # the 2x retried, then its 4x
    ((read, _),) = rows(collect(out).final, seed=0)
    assert read.budget == 4 and state(out, doomed) == "done"


def test_a_failed_final_is_not_extended(tmp_path, monkeypatch):
    out = tmp_path / "study"
    study = tiny(patience=(STILL_MOVING,))
    (moving,) = plan(study.specs)

    def fails(cfg, path, **kw):
        raise RuntimeError("the GPU fell off the bus")

    monkeypatch.setattr(execute_module, "train", fails)
    assert execute(study, out, Pool("sequential"), progress=False)["failed"] == 1
    assert set(recorded(out)) == {moving.id}
    ((read, _),) = rows(collect(out).final, seed=0)
    assert (read.budget, read.state) == (1, "failed")


@pytest.mark.parametrize(
    "summary, extend",
    [
        ({"convergence": {"reason": "improving"}}, True),
        ({"convergence": {"reason": "too_few"}}, True),
        ({"convergence": {"reason": "solved"}}, False),
        ({"convergence": {"reason": "plateau"}}, False),
        ({"convergence": {"reason": "flat"}}, True),  # never left its start: a slow starter may not have started
        ({"steps": 8}, False),  # a run of older code: nothing to judge
        ([1, 2], False),  # damaged: the report says so
    ],
)
def test_a_finished_run_is_extended_by_its_convergence_reason(tmp_path, summary, extend):
    path = tmp_path / "runs" / "r1" / "summary.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(summary))
    assert unconverged(tmp_path, "r1") is extend
    assert unconverged(tmp_path, "r2") is False  # not started


STUDY_FILE = """
name = "tiny"
extend = [2, 4]
[base]
task = "addition"
task_params = {n_digits = 2}
model = {d_model = 16, n_heads = 2, n_layers = 1}
train = {steps = 8, batch_size = 16}
test_size = 40
[grid]
variant = ["standard"]
"""


def test_a_study_file_may_extend_and_a_bad_extend_is_refused_in_one_line(tmp_path, capsys):
    path = tmp_path / "s.toml"
    path.write_text(STUDY_FILE)
    study = load_study_file(path)
    assert study.extend == (2, 4) and study.rebuild is not None and study.rebuild(2, 0).extend == (2, 4)
    path.write_text(STUDY_FILE.replace("extend = [2, 4]\n", ""))
    assert load_study_file(path).extend == ()
    assert load_study_file(path).fingerprint() != study.fingerprint()  # extended or not, another study
    for bad in ("[4, 2]", "[1, 2]", "[2, 2]", "[2.5]", '"2"', "[true]", "2"):
        path.write_text(STUDY_FILE.replace("[2, 4]", bad))
        assert main(["reproduce", "--study", str(path), "--out", str(tmp_path / "out")]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"mixit reproduce: error: study file {path}: extend must list multiples of the step cap")
        assert err.count("\n") == 1 and not (tmp_path / "out").exists()
    assert Study("s", [], extend=[2, 4]).extend == (2, 4)
    with pytest.raises(UsageError, match=r"extend must list multiples .* got \(4, 2\)"):
        Study("s", [], extend=(4, 2))


SEARCH = {"train.lr": [1e-3, 2e-3]}


def adaptive(seeds=1, calls=None):
    """A study of one cell whose hook adds seed 1 once seed 0 has finished, and nothing after."""

    def add_seed_one(study_dir):
        if calls is not None:
            calls.append(len(collect(study_dir).results))
        done = [labels for r in collect(study_dir).final if r.state == "done" for labels in r.labels]
        if any(labels["seed"] == 0 for labels in done):
            return grid(BASE, {"variant": ["standard"]}, [1], {"table": "tiny"}, search=SEARCH)
        return []

    specs = grid(BASE, {"variant": ["standard"]}, seed_range(seeds), {"table": "tiny"}, search=SEARCH)
    return Study("tiny", specs, seeds=seeds, rebuild=lambda n, first: adaptive(n), more_seeds=add_seed_one, extend=())


def test_more_seeds_adds_runs_in_rounds_and_the_study_resumes_as_the_same_study(tmp_path):
    out = tmp_path / "study"
    calls = []
    tally = execute(adaptive(calls=calls), out, Pool("sequential"), progress=False)
    runs = len(json.loads((out / "study.json").read_text())["runs"])
    assert tally == {"done": runs, "failed": 0, "skipped_failed": 0}  # every run of both rounds, each once
    assert len(calls) == 2  # after the first round, and after the second, which added nothing new
    record = json.loads((out / "study.json").read_text())
    assert record["added"] == [{"table": "tiny", "variant": "standard", "seed": 1}] and record["seeds"] == 1
    finals = [e for e in record["runs"] if e["role"] == "final"]
    assert sorted(e["labels"][0]["seed"] for e in finals) == [0, 1]
    assert all(e["chosen"] for e in finals)  # seed 1 chose on a search of its own (mixit.study.search)
    screens = [e for e in record["runs"] if e["role"] == "screen"]
    assert {e["labels"][0]["cell_seed"] for e in screens} == {0, 1}
    assert all(r.state == "done" for r in collect(out).results)

    before = recorded(out)
    again = execute(adaptive(), out, Pool("sequential"), progress=False)
    assert again == {"done": runs, "failed": 0, "skipped_failed": 0} and recorded(out) == before
    assert json.loads((out / "study.json").read_text())["added"] == record["added"]
    # With seed 1 asked for, the study grows in place; its seed 1 is the run the hook added, trained once.
    grown = execute(adaptive(seeds=2), out, Pool("sequential"), progress=False)
    assert grown == {"done": runs, "failed": 0, "skipped_failed": 0} and recorded(out).keys() == before.keys()
    assert json.loads((out / "study.json").read_text())["added"] == []
