"""Search per architecture per task: screening runs, selection on validation, the winner in every seed."""

import json

import pytest

from mixit.core.experiment import resolve
from mixit.study.executors import Pool, execute
from mixit.study.search import SCREEN_SEED, Score, beyond, decide, groups, pick, tied, upper_bound
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


def searched(seeds=1):
    return grid(BASE, {"variant": ["standard"]}, seeds, {"table": "t", "task": "addition"}, search={"train.lr": LRS})


def test_each_seed_of_a_cell_has_a_search_of_its_own_at_a_screening_seed_no_final_run_uses():
    found = groups(searched(seeds=3), fraction=0.25)
    assert len(found) == 3  # one search per seed, each serving the one cell of its seed
    for seed, group in enumerate(found):
        assert [s.labels["seed"] for s in group.specs] == [seed] and group.seed == seed
        assert group.combinations == [{"train.lr": lr} for lr in LRS] and group.rungs == (10,)  # two: one rung
        assert SCREEN_SEED + seed not in range(3)
        for screen, lr in zip(group.screens, LRS):
            assert screen.request["train"] == {**BASE["train"], "steps": 10, "lr": lr}  # a quarter of the steps
            assert screen.request["model"]["seed"] == screen.request["data_seed"] == SCREEN_SEED + seed
            assert screen.labels["table"] == "search" and screen.labels["cell"] == "t" and screen.labels["lr"] == lr
            assert screen.labels["rung"] == 0 and screen.labels["seed"] == SCREEN_SEED + seed
            assert screen.labels["cell_seed"] == seed and "tie" not in screen.labels
    assert len({g.key for g in found}) == 3
    # A task's minimum lengthens its first rung (never past the run's steps).
    assert groups(searched(), fraction=0.25, min_steps={"addition": 30})[0].rungs == (30,)
    assert groups(searched(), fraction=0.25, min_steps={"addition": 99})[0].rungs == (40,)
    assert groups(searched(), fraction=0.25, min_steps={"dyck": 30})[0].rungs == (10,)


def acc(best, mean=None):
    """A finished screening run's score on a metric where higher is better (its curve's mean: `mean`, else
    `best`)."""
    return Score(best, best if mean is None else mean, True)


def test_the_best_validation_score_wins_and_a_tie_goes_to_the_higher_curve_mean():
    assert pick([({"lr": 1}, acc(0.2)), ({"lr": 2}, acc(0.7))]) == {"lr": 2}
    assert pick([({"lr": 1}, Score(1.0, 1.5, False)), ({"lr": 2}, Score(2.0, 2.0, False))]) == {"lr": 1}  # a loss
    assert pick([({"lr": 1}, Score(float("nan"), float("nan"), True))]) is None  # no value
    # Within the tolerance (the runs' min_delta) it is a tie: the higher mean of the curve (there sooner) wins it.
    close = [({"lr": 1}, acc(0.245, mean=0.20)), ({"lr": 2}, acc(0.253, mean=0.19))]
    assert tied(close, tolerance=0.01) == [{"lr": 1}, {"lr": 2}] and tied(close) == [{"lr": 2}]
    assert pick(close, tolerance=0.01) == {"lr": 1} and pick(close, tolerance=0.0) == {"lr": 2}
    later = [({"lr": 1}, acc(0.5, mean=0.3)), ({"lr": 2}, acc(0.5, mean=0.4))]
    assert pick(later) == {"lr": 2}  # declaration order does not decide
    # Only an exactly equal curve mean falls back to the order of declaration.
    assert pick([({"lr": 1}, acc(0.5)), ({"lr": 2}, acc(0.5))]) == {"lr": 1}


def by_lr(scores):
    """A fake score function: a screening run's score from its lr label, or from (lr, steps) where given; None
    (unfinished) for any other run."""
    return lambda s: scores.get((s.labels["lr"], s.request["train"]["steps"]), scores.get(s.labels["lr"]))


def asked(outcome):
    """(lr, steps, rung, whether a tie rung) of every screening run `outcome` asked for, in order."""
    return [(s.labels["lr"], s.request["train"]["steps"], s.labels["rung"], "tie" in s.labels) for s in outcome.screens]


def test_a_decisive_edge_winner_adds_the_next_value_and_a_tie_does_not():
    (group,) = groups(searched(), fraction=0.25)
    assert beyond(LRS, 1e-2) == 10.0 and beyond(LRS, 1e-5) == 1e-8 and beyond((1e-3, 3e-3), 3e-3) == 0.009
    assert beyond((4, 16), 16) == 64 and beyond((4, 16), 4) == 1 and beyond((64, 128), 128) == 256
    assert beyond((1, 2, 4), 2) is None and beyond(("last", "mean"), "mean") is None and beyond((4,), 4) is None
    # The top lr wins decisively: 10.0 is screened (at rung 0's length) before the choice.
    outcome = decide(group, by_lr({1e-5: acc(0.2), 1e-2: acc(0.7)}), tolerance=0.01)
    assert outcome.chosen is None and [s.labels["lr"] for s in outcome.screens] == [*LRS, 10.0]
    assert outcome.screens[-1].labels["extends"] == "train.lr" and outcome.screens[-1].request["train"]["steps"] == 10
    done = decide(group, by_lr({1e-5: acc(0.2), 1e-2: acc(0.7), 10.0: acc(0.9)}), tolerance=0.01)
    assert done.chosen == {"train.lr": 10.0}
    nan = Score(float("nan"), float("nan"), True)
    failed = decide(group, by_lr({1e-5: acc(0.2), 1e-2: acc(0.7), 10.0: nan}), 0.01)
    assert failed.chosen == {"train.lr": 1e-2}  # the extension diverged: the winner stays
    # A tie on the edge says nothing of beyond: more steps decide it (1e-2 leaves the tie at 20), no extension.
    tie = decide(group, by_lr({1e-5: acc(0.700), 1e-2: acc(0.705), (1e-2, 20): acc(0.8)}), tolerance=0.01)
    assert tie.chosen == {"train.lr": 1e-2} and asked(tie) == [
        (1e-5, 10, 0, False),
        (1e-2, 10, 0, False),
        (1e-5, 20, 1, True),
        (1e-2, 20, 1, True),
    ]


def test_a_tie_is_trained_again_for_the_tied_alone_twice_as_long_where_the_later_declared_can_win():
    specs = grid(BASE, {"variant": ["mixit"]}, 1, {"table": "t"}, search={"train.lr": (1e-3, 3e-3, 1e-2)})
    (group,) = groups(specs, fraction=0.25)
    assert group.rungs == (10,) and [group.length(r) for r in range(4)] == [10, 20, 40, 40]
    # A slow starter: 1e-3 and 3e-3 both sit at chance at rung 0 (within min_delta), 1e-2 below it.
    rung0 = {(1e-3, 10): acc(0.250), (3e-3, 10): acc(0.255), (1e-2, 10): acc(0.10)}
    outcome = decide(group, by_lr(rung0), tolerance=0.01)
    assert outcome.chosen is None  # the tie rung has not trained
    assert asked(outcome)[3:] == [(1e-3, 20, 1, True), (3e-3, 20, 1, True)]  # the tied two only, twice as long
    assert all(s.request["model"]["seed"] == SCREEN_SEED for s in outcome.screens)  # the same screening seed
    # At 20 steps 3e-3, declared after 1e-3, has left chance: it is chosen (an interior value: no extension).
    scores = {**rung0, (1e-3, 20): acc(0.26), (3e-3, 20): acc(0.9)}
    first, second = decide(group, by_lr(scores), 0.01), decide(group, by_lr(scores), 0.01)
    assert first.chosen == {"train.lr": 3e-3} and len(first.screens) == 5
    # decide is a pure function of the scores: asked again, it asks for the same runs and makes the same choice.
    assert second.chosen == first.chosen and asked(second) == asked(first)
    assert [s.request for s in second.screens] == [s.request for s in first.screens]


def test_a_tie_that_survives_the_full_steps_goes_to_the_higher_curve_mean():
    (group,) = groups(searched(), fraction=0.25)
    # Both at chance at every length; at the full 40 steps 1e-2 (declared last) has the higher curve mean.
    scores = {1e-5: acc(0.25, mean=0.20), 1e-2: acc(0.25, mean=0.20), (1e-2, 40): acc(0.25, mean=0.22)}
    outcome = decide(group, by_lr(scores), tolerance=0.01)
    assert outcome.chosen == {"train.lr": 1e-2}
    assert [steps for _, steps, _, _ in asked(outcome)] == [10, 10, 20, 20, 40, 40]  # no rung past the full steps
    # Only curves with exactly equal means fall back to the order of declaration.
    assert decide(group, by_lr({lr: acc(0.25, mean=0.2) for lr in LRS}), 0.01).chosen == {"train.lr": 1e-5}


def test_upper_bound_counts_every_candidate_tied_up_to_the_full_steps():
    (group,) = groups(searched(), fraction=0.25)
    bound = [(s.labels["lr"], s.request["train"]["steps"]) for s in upper_bound(group)]
    # Both candidates at 10, 20 and 40 steps, and the extension beyond the top edge (10.0) at each as well.
    assert sorted(bound) == sorted((lr, steps) for lr in (*LRS, 10.0) for steps in (10, 20, 40))
    lrs = (1e-3, 3e-3, 1e-2, 3e-2)
    specs = grid(BASE, {"variant": ["mixit"]}, 1, {"table": "t"}, search={"train.lr": lrs})
    (halving,) = groups(specs, fraction=0.25)
    bound = [(s.labels["lr"], s.request["train"]["steps"]) for s in upper_bound(halving)]
    # Rung 0 at 5 steps, all four at rung 1 (10) and after it (20, 40); 9e-2 from rung 1 on.
    assert len(bound) == len(set(bound)) == 4 * 4 + 3
    assert {steps for lr, steps in bound if lr == 0.09} == {10, 20, 40}
    # Every candidate tied at every rung (the cut of the halving too) asks for the four at every length.
    tie = decide(halving, by_lr({lr: acc(0.25) for lr in lrs}), tolerance=0.01)
    assert tie.chosen == {"train.lr": 1e-3} and {(lr, steps) for lr, steps, _, _ in asked(tie)} < set(bound)
    assert len(tie.screens) == 16


def test_best_over_the_curve_picks_a_late_bloomer_over_an_early_leader_that_fades(tmp_path):
    from mixit.core.run import Run
    from mixit.study.executors import screen_score

    curves = {"early": [0.6, 0.5, 0.4], "late": [0.1, 0.1, 0.8]}  # the leader fades, the slow starter blooms
    for name, curve in curves.items():
        run = Run(tmp_path / "runs" / name)
        run.path.mkdir(parents=True)
        lines = [{"step": 0, "event": "eval", "val_token_acc": 0.05}]
        lines += [{"step": 10 * (i + 1), "event": "eval", "val_token_acc": v} for i, v in enumerate(curve)]
        run.metrics_path.write_text("".join(json.dumps(e) + "\n" for e in lines))
        run.write_summary({"convergence": {"metric": "token_acc", "higher_is_better": True}, "val": {"token_acc": 0}})
    assert screen_score("early", tmp_path) == Score(0.6, pytest.approx(0.5), True)  # the mean: after step 0
    assert screen_score("late", tmp_path) == Score(0.8, pytest.approx(1 / 3), True)
    assert pick([({"lr": 1}, screen_score("early", tmp_path)), ({"lr": 2}, screen_score("late", tmp_path))]) == {
        "lr": 2
    }
    assert screen_score("absent", tmp_path) is None  # not finished


def test_halving_keeps_the_best_half_for_twice_as_long_and_chooses_on_it():
    specs = grid(BASE, {"variant": ["mixit"]}, 1, {"table": "t"}, search={"train.lr": (1e-3, 3e-3, 1e-2, 3e-2)})
    (group,) = groups(specs, fraction=0.25)
    assert group.rungs == (5, 10)  # a quarter of 40 steps, halved for rung 0, then twice that
    rung0 = {1e-3: acc(0.5), 3e-3: acc(0.9), 1e-2: acc(0.2), 3e-2: acc(0.6)}
    outcome = decide(group, lambda s: rung0[s.labels["lr"]] if s.labels["rung"] == 0 else None)
    assert outcome.chosen is None  # rung 1 has not trained
    rung1 = [s for s in outcome.screens if s.labels["rung"] == 1]
    assert [s.labels["lr"] for s in rung1] == [3e-3, 3e-2]  # the best half, in declaration order
    assert {s.request["train"]["steps"] for s in rung1} == {10}

    def score(s):
        if s.labels["rung"] == 0:
            return rung0[s.labels["lr"]]
        return {3e-3: acc(0.7), 3e-2: acc(0.95)}.get(s.labels["lr"])  # rung 1 reverses the order

    outcome = decide(group, score)  # 3e-2, the top edge, won rung 1 decisively over 1e-2 (at rung 0): 9e-2 next
    assert outcome.chosen is None and outcome.screens[-1].labels == {**outcome.screens[-1].labels, "lr": 0.09}
    assert outcome.screens[-1].labels["rung"] == 1 and outcome.screens[-1].request["train"]["steps"] == 10
    # The cut never falls inside a tie: 1e-3 within min_delta of 3e-2, the last of the best half, is kept too.
    close = {**rung0, 1e-3: acc(0.595)}
    tie = decide(group, lambda s: close[s.labels["lr"]] if s.labels["rung"] == 0 else None, tolerance=0.01)
    assert [s.labels["lr"] for s in tie.screens if s.labels["rung"] == 1] == [1e-3, 3e-3, 3e-2]


def test_a_searched_study_searches_each_seed_then_trains_its_winner(tmp_path):
    study = Study("s", searched(seeds=2), screen_fraction=0.5)
    tally = execute(study, tmp_path / "s", Pool("sequential"), progress=False)
    record = json.loads((tmp_path / "s" / "study.json").read_text())
    screens = [r for r in record["runs"] if r["role"] == "screen"]
    finals = [r for r in record["runs"] if r["role"] == "final"]
    assert len(finals) == 2 and tally["done"] + tally["failed"] == len(screens) + 2
    assert [(s["group"], s["seed"]) for s in record["searches"]] == [(g.key, g.seed) for g in groups(study.specs, 0.5)]
    from mixit.study.executors import screen_score

    for seed, group in enumerate(groups(study.specs, fraction=0.5)):
        mine = [r for r in screens if r["labels"][0]["cell_seed"] == seed]
        # Each seed screens the two candidates for 20 steps at a screening seed of its own, then what they ask.
        assert [r["config"]["train"]["lr"] for r in mine[:2]] == list(LRS)
        assert {r["config"]["train"]["steps"] for r in mine[:2]} == {20}
        assert {r["config"]["model"]["seed"] for r in mine} == {SCREEN_SEED + seed}
        (final,) = [r for r in finals if r["config"]["model"]["seed"] == seed]
        # The choice is the one `decide` makes of this seed's screening runs alone.
        outcome = decide(
            group,
            lambda spec: screen_score(plan([spec], role="screen")[0].id, tmp_path / "s"),
            tolerance=resolve(group.screens[0].request).train.min_delta,
        )
        assert [plan([spec], role="screen")[0].id for spec in outcome.screens] == [r["id"] for r in mine]
        assert final["chosen"] == outcome.chosen
        assert final["config"]["train"]["lr"] == outcome.chosen["train.lr"] and final["config"]["train"]["steps"] == 40
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

    with pytest.raises(UsageError, match="search false -> true"):  # what changed, named
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
