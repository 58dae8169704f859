"""Search per architecture per task: screening runs, selection on validation, the winner in every seed."""

import json

import pytest

from mixit.experiment import resolve
from mixit.study.executors import Pool, execute
from mixit.study.search import choose, groups
from mixit.study.spec import RunSpec, Study, grid, plan

BASE = {
    "task": "addition",
    "task_params": {"n_digits": 2},
    "model": {"d_model": 16, "n_heads": 2, "n_layers": 1},
    "train": {"steps": 40, "batch_size": 32, "eval_every": 10},
    "test_size": 60,
    "val_size": 60,
}
LRS = (1e-5, 1e-2)  # 1e-5 learns nothing in a few steps; 1e-2 does (the task default is 3e-3)


def searched(seeds=2):
    return grid(BASE, {"variant": ["standard"]}, seeds, {"table": "t", "task": "addition"}, search={"train.lr": LRS})


def test_one_search_serves_every_seed_of_a_cell():
    (group,) = groups(searched(seeds=3), fraction=0.25)
    assert len(group.specs) == 3 and group.combinations == [{"train.lr": lr} for lr in LRS]
    for screen, lr in zip(group.screens, LRS):
        assert screen.request["train"] == {**BASE["train"], "steps": 10, "lr": lr}  # a quarter of the steps
        assert screen.request["model"]["seed"] == 0 and screen.request["data_seed"] == 0
        assert screen.labels["table"] == "search" and screen.labels["cell"] == "t" and screen.labels["lr"] == lr


def test_the_best_validation_score_wins_and_a_tie_goes_to_the_first():
    (group,) = groups(searched(), fraction=0.5)
    scores = {LRS[0]: (0.2, True), LRS[1]: (0.7, True)}
    assert choose(group, lambda s: scores[s.labels["lr"]]) == {"train.lr": LRS[1]}
    assert choose(group, lambda s: (1.0, False) if s.labels["lr"] == LRS[0] else (2.0, False)) == {"train.lr": LRS[0]}
    assert choose(group, lambda s: (0.5, True)) == {"train.lr": LRS[0]}
    assert choose(group, lambda s: None) is None  # no screening run finished
    # Within the tolerance (the runs' min_delta) it is a tie, and the first declared wins.
    close = {LRS[0]: (0.245, True), LRS[1]: (0.253, True)}
    assert choose(group, lambda s: close[s.labels["lr"]], tolerance=0.01) == {"train.lr": LRS[0]}
    assert choose(group, lambda s: close[s.labels["lr"]], tolerance=0.0) == {"train.lr": LRS[1]}


def test_a_searched_study_trains_the_candidates_then_the_winner_in_every_seed(tmp_path):
    study = Study("s", searched(seeds=2), screen_fraction=0.5)
    tally = execute(study, tmp_path / "s", Pool("sequential"), progress=False)
    record = json.loads((tmp_path / "s" / "study.json").read_text())
    screens = [r for r in record["runs"] if r["role"] == "screen"]
    finals = [r for r in record["runs"] if r["role"] == "final"]
    assert len(screens) == 2 and len(finals) == 2 and tally["done"] == 4
    assert {r["config"]["train"]["steps"] for r in screens} == {20}
    scores = {}
    for r in screens:
        summary = json.loads((tmp_path / "s" / "runs" / r["id"] / "summary.json").read_text())
        scores[r["config"]["train"]["lr"]] = summary["val"]["token_acc"]
    best = max(scores, key=lambda lr: scores[lr])
    assert {json.dumps(r["chosen"]) for r in finals} == {json.dumps({"train.lr": best})}
    assert {r["config"]["train"]["lr"] for r in finals} == {best}
    assert {r["config"]["model"]["seed"] for r in finals} == {0, 1} and {
        r["config"]["train"]["steps"] for r in finals
    } == {40}
    # Run again: everything is done, nothing is trained twice.
    again = execute(study, tmp_path / "s", Pool("sequential"), progress=False)
    assert again["done"] == 4 and again["failed"] == 0


def test_without_search_each_cell_trains_its_request_and_the_directory_tells_them_apart(tmp_path):
    study = Study("s", searched(seeds=1), screen_fraction=0.5)
    execute(study, tmp_path / "n", Pool("sequential"), progress=False, search=False)
    record = json.loads((tmp_path / "n" / "study.json").read_text())
    assert [r["role"] for r in record["runs"]] == ["final"] and record["runs"][0]["chosen"] == {}
    default_lr = resolve({**BASE, "variant": "standard"}).train.lr  # the task's own default: nothing searched
    assert record["runs"][0]["config"]["train"]["lr"] == default_lr and default_lr not in LRS
    from mixit.errors import UsageError

    with pytest.raises(UsageError, match="another search"):
        execute(study, tmp_path / "n", Pool("sequential"), progress=False, search=True)


def test_a_bad_candidate_is_refused_before_anything_runs(tmp_path):
    specs = grid(BASE, {"variant": ["standard"]}, 1, {"table": "t"}, search={"model.n_heads": (2, 3)})
    from mixit.errors import UsageError

    with pytest.raises(UsageError, match="n_heads must divide d_model"):
        execute(Study("bad", specs), tmp_path / "bad", Pool("sequential"), progress=False)
    assert not (tmp_path / "bad").exists()


def test_plan_merges_a_screening_run_equal_to_a_cell():
    spec = RunSpec(BASE, {"table": "t"})
    (a,) = plan([spec])
    (b,) = plan([spec], role="screen")
    assert a.id == b.id and b.role == "screen"
