"""Search per architecture per task: screening runs, selection on validation, the winner in every seed."""

import json

import pytest

from mixit.experiment import resolve
from mixit.study.executors import Pool, execute
from mixit.study.search import SCREEN_SEED, beyond, decide, groups, pick
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


def test_one_search_serves_every_seed_of_a_cell_at_a_seed_no_final_run_uses():
    (group,) = groups(searched(seeds=3), fraction=0.25)
    assert len(group.specs) == 3 and group.combinations == [{"train.lr": lr} for lr in LRS]
    assert SCREEN_SEED not in range(3) and group.rungs == (10,)  # two combinations: one rung
    for screen, lr in zip(group.screens, LRS):
        assert screen.request["train"] == {**BASE["train"], "steps": 10, "lr": lr}  # a quarter of the steps
        assert screen.request["model"]["seed"] == SCREEN_SEED and screen.request["data_seed"] == SCREEN_SEED
        assert screen.labels["table"] == "search" and screen.labels["cell"] == "t" and screen.labels["lr"] == lr
        assert screen.labels["rung"] == 0 and screen.labels["seed"] == SCREEN_SEED
    # A task's minimum lengthens its first rung (never past the run's steps).
    assert groups(searched(), fraction=0.25, min_steps={"addition": 30})[0].rungs == (30,)
    assert groups(searched(), fraction=0.25, min_steps={"addition": 99})[0].rungs == (40,)
    assert groups(searched(), fraction=0.25, min_steps={"dyck": 30})[0].rungs == (10,)


def test_the_best_validation_score_wins_and_a_tie_goes_to_the_first():
    scored = [({"lr": 1}, (0.2, True)), ({"lr": 2}, (0.7, True))]
    assert pick(scored) == {"lr": 2}
    assert pick([({"lr": 1}, (1.0, False)), ({"lr": 2}, (2.0, False))]) == {"lr": 1}  # a loss: lower wins
    assert pick([({"lr": 1}, (0.5, True)), ({"lr": 2}, (0.5, True))]) == {"lr": 1}
    assert pick([({"lr": 1}, (float("nan"), True))]) is None  # no value
    # Within the tolerance (the runs' min_delta) it is a tie, and the first declared wins.
    close = [({"lr": 1}, (0.245, True)), ({"lr": 2}, (0.253, True))]
    assert pick(close, tolerance=0.01) == {"lr": 1} and pick(close, tolerance=0.0) == {"lr": 2}


def by_lr(scores):
    """A fake score function: a screening run's score from its lr label; None (unfinished) for any other lr."""
    return lambda s: scores.get(s.labels["lr"])


def test_a_decisive_edge_winner_adds_the_next_value_and_a_tie_does_not():
    (group,) = groups(searched(), fraction=0.25)
    assert beyond(LRS, 1e-2) == 10.0 and beyond(LRS, 1e-5) == 1e-8 and beyond((1e-3, 3e-3), 3e-3) == 0.009
    assert beyond((4, 16), 16) == 64 and beyond((4, 16), 4) == 1 and beyond((64, 128), 128) == 256
    assert beyond((1, 2, 4), 2) is None and beyond(("last", "mean"), "mean") is None and beyond((4,), 4) is None
    # The top lr wins decisively: 10.0 is screened (at rung 0's length) before the choice.
    outcome = decide(group, by_lr({1e-5: (0.2, True), 1e-2: (0.7, True)}), tolerance=0.01)
    assert outcome.chosen is None and [s.labels["lr"] for s in outcome.screens] == [*LRS, 10.0]
    assert outcome.screens[-1].labels["extends"] == "train.lr" and outcome.screens[-1].request["train"]["steps"] == 10
    done = decide(group, by_lr({1e-5: (0.2, True), 1e-2: (0.7, True), 10.0: (0.9, True)}), tolerance=0.01)
    assert done.chosen == {"train.lr": 10.0}
    failed = decide(group, by_lr({1e-5: (0.2, True), 1e-2: (0.7, True), 10.0: (float("nan"), True)}), 0.01)
    assert failed.chosen == {"train.lr": 1e-2}  # the extension diverged: the winner stays
    # A tie on the edge (the first declared wins it) says nothing of beyond: no extension.
    tie = decide(group, by_lr({1e-5: (0.700, True), 1e-2: (0.705, True)}), tolerance=0.01)
    assert tie.chosen == {"train.lr": 1e-5} and len(tie.screens) == 2


def test_an_interior_winner_adds_nothing():
    specs = grid(BASE, {"variant": ["standard"]}, 1, {"table": "t"}, search={"train.lr": (1e-3, 3e-3, 1e-2)})
    (group,) = groups(specs, fraction=0.25)
    outcome = decide(group, by_lr({1e-3: (0.2, True), 3e-3: (0.9, True), 1e-2: (0.3, True)}))
    assert outcome.chosen == {"train.lr": 3e-3} and len(outcome.screens) == 3


def test_best_over_the_curve_picks_a_late_bloomer_over_an_early_leader_that_fades(tmp_path):
    from mixit.run import Run
    from mixit.study.executors import screen_score

    curves = {"early": [0.6, 0.5, 0.4], "late": [0.1, 0.1, 0.8]}  # the leader fades, the slow starter blooms
    for name, curve in curves.items():
        run = Run(tmp_path / "runs" / name)
        run.path.mkdir(parents=True)
        lines = [{"step": 0, "event": "eval", "val_token_acc": 0.05}]
        lines += [{"step": 10 * (i + 1), "event": "eval", "val_token_acc": v} for i, v in enumerate(curve)]
        run.metrics_path.write_text("".join(json.dumps(e) + "\n" for e in lines))
        run.write_summary({"convergence": {"metric": "token_acc", "higher_is_better": True}, "val": {"token_acc": 0}})
    assert screen_score("early", tmp_path) == (0.6, True) and screen_score("late", tmp_path) == (0.8, True)
    assert pick([({"lr": 1}, screen_score("early", tmp_path)), ({"lr": 2}, screen_score("late", tmp_path))]) == {
        "lr": 2
    }
    assert screen_score("absent", tmp_path) is None  # not finished


def test_halving_keeps_the_best_half_for_twice_as_long_and_chooses_on_it():
    specs = grid(BASE, {"variant": ["mixit"]}, 1, {"table": "t"}, search={"train.lr": (1e-3, 3e-3, 1e-2, 3e-2)})
    (group,) = groups(specs, fraction=0.25)
    assert group.rungs == (5, 10)  # a quarter of 40 steps, halved for rung 0, then twice that
    rung0 = {1e-3: (0.5, True), 3e-3: (0.9, True), 1e-2: (0.2, True), 3e-2: (0.6, True)}
    outcome = decide(group, lambda s: rung0[s.labels["lr"]] if s.labels["rung"] == 0 else None)
    assert outcome.chosen is None  # rung 1 has not trained
    rung1 = [s for s in outcome.screens if s.labels["rung"] == 1]
    assert [s.labels["lr"] for s in rung1] == [3e-3, 3e-2]  # the best half, in declaration order
    assert {s.request["train"]["steps"] for s in rung1} == {10}

    def score(s):
        if s.labels["rung"] == 0:
            return rung0[s.labels["lr"]]
        return {3e-3: (0.7, True), 3e-2: (0.95, True)}.get(s.labels["lr"])  # rung 1 reverses the order

    outcome = decide(group, score)  # 3e-2, the top edge, won rung 1 decisively over 1e-2 (at rung 0): 9e-2 next
    assert outcome.chosen is None and outcome.screens[-1].labels == {**outcome.screens[-1].labels, "lr": 0.09}
    assert outcome.screens[-1].labels["rung"] == 1 and outcome.screens[-1].request["train"]["steps"] == 10


def test_a_searched_study_trains_the_candidates_then_the_winner_in_every_seed(tmp_path):
    study = Study("s", searched(seeds=2), screen_fraction=0.5)
    tally = execute(study, tmp_path / "s", Pool("sequential"), progress=False)
    record = json.loads((tmp_path / "s" / "study.json").read_text())
    screens = [r for r in record["runs"] if r["role"] == "screen"]
    finals = [r for r in record["runs"] if r["role"] == "final"]
    # The two candidates, then (1e-2 winning on the top edge) 10.0 beyond it.
    assert [r["config"]["train"]["lr"] for r in screens] == [*LRS, 10.0]
    assert len(finals) == 2 and tally["done"] + tally["failed"] == 5
    assert {r["config"]["train"]["steps"] for r in screens} == {20}
    assert {r["config"]["model"]["seed"] for r in screens} == {SCREEN_SEED}
    from mixit.study.executors import screen_score

    scores = {r["config"]["train"]["lr"]: screen_score(r["id"], tmp_path / "s") for r in screens}
    best = pick([({"lr": lr}, score) for lr, score in scores.items()], tolerance=0.01)["lr"]
    assert {json.dumps(r["chosen"]) for r in finals} == {json.dumps({"train.lr": best})}
    assert {r["config"]["train"]["lr"] for r in finals} == {best}
    assert {r["config"]["model"]["seed"] for r in finals} == {0, 1} and {
        r["config"]["train"]["steps"] for r in finals
    } == {40}
    # Run again: every finished screening run is re-used, nothing is trained twice, the choice is the same.
    again = execute(study, tmp_path / "s", Pool("sequential"), progress=False)
    assert (again["done"], again["failed"]) == (tally["done"], tally["failed"])
    assert json.loads((tmp_path / "s" / "study.json").read_text())["runs"] == record["runs"]


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
