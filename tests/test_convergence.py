"""The protocol's data and stopping: a validation set disjoint from training for every task and drawn like the
test set, the plateau criterion on the validation curve, the evaluation selected on it, and early stopping that
resumes exactly."""

import json
import math
import shutil

import numpy as np
import pytest

from mixit import run_config, train
from mixit.core.tasks import make_task
from mixit.core.tasks.base import row_hashes
from mixit.core.training.convergence import Convergence, Selection


def curve(values, higher=True, patience=3, min_delta=0.01):
    conv = Convergence("token_acc" if higher else "loss", higher, patience, min_delta)
    for i, v in enumerate(values):
        conv.add(100 * i, v)
    return conv


@pytest.mark.parametrize(
    "values, higher, state",
    [
        ([0.1, 0.5, 0.9, 1.0], True, "solved"),
        ([0.1, 0.5, 0.6], True, "too_few"),  # step 0 and two evaluations: no window of 3 yet
        ([0.1, 0.5, 0.6, 0.7, 0.75], True, "improving"),  # 0.75 is 0.25 above 0.5, the best before the window
        ([0.1, 0.6, 0.7, 0.705, 0.70, 0.702], True, "plateau"),  # the window adds 0.005 < 0.01
        ([0.1, 0.6, 0.7, 0.65, 0.60, 0.62], True, "plateau"),  # overfitting: the window is worse than before
        ([0.01, 0.012, 0.011, 0.01, 0.013], True, "flat"),  # never left its starting level
        ([7.6, 5.0, 4.0, 3.99, 3.995, 3.992], False, "plateau"),  # a loss: lower is better
        ([7.6, 5.0, 4.0, 3.9, 3.8, 3.7], False, "improving"),
    ],
)
def test_the_plateau_criterion(values, higher, state):
    conv = curve(values, higher)
    assert conv.state == state
    assert conv.converged == (state in ("solved", "plateau", "flat"))
    assert conv.should_stop == (state in ("solved", "plateau"))  # a flat start never stops a run


def test_a_plateau_stops_a_run_only_in_the_second_half_of_its_budget():
    values = [0.1, 0.6, 0.7, 0.705, 0.70, 0.702]  # a plateau by step 500
    early = Convergence("token_acc", True, 3, 0.01, earliest=1000)
    late = Convergence("token_acc", True, 3, 0.01, earliest=500)
    solved = Convergence("token_acc", True, 3, 0.01, earliest=1000)
    for i, v in enumerate(values):
        early.add(100 * i, v)
        late.add(100 * i, v)
        solved.add(100 * i, 1.0 if i == 2 else v)
    assert early.state == late.state == "plateau" and not early.should_stop and late.should_stop
    solved.history = solved.history[:3]  # solved at step 200: stops at once, whatever the budget
    assert solved.state == "solved" and solved.should_stop
    # With stop_at="solved" a plateau never stops a run; a solved curve still does.
    stairs = Convergence("token_acc", True, 3, 0.01, earliest=0, stop_at="solved")
    stairs.history = list(late.history)
    assert stairs.state == "plateau" and not stairs.should_stop
    stairs.add(600, 1.0)
    assert stairs.should_stop


def test_the_summary_says_how_far_from_converged():
    s = curve([0.1, 0.5, 0.6, 0.7, 0.75]).summary(stopped_early=False, steps_trained=400)
    assert s["converged"] is False and s["reason"] == "improving"
    assert s["gain"] == pytest.approx(0.25) and s["window"] == [200, 400]
    assert (s["best"], s["best_step"], s["steps_trained"]) == (0.75, 400, 400)


def test_a_resumed_curve_is_rebuilt_from_the_metrics_log():
    events = [{"event": "eval", "step": s, "val_token_acc": v} for s, v in [(0, 0.1), (10, 0.5), (20, 0.6), (30, 0.9)]]
    conv = Convergence("token_acc", True, 3, 0.01)
    conv.extend([{"event": "train", "step": 5, "loss": 1.0}, *events], up_to=20)
    assert conv.history == [(0, 0.1), (10, 0.5), (20, 0.6)]


def _keys(seq):
    return set(row_hashes(seq).tolist())


@pytest.mark.parametrize(
    "task, params",
    [
        ("addition", {"n_digits": 2}),
        ("retrieval", {"max_pairs": 4, "vocab": 32}),
        ("dyck", {"max_pairs": 4}),
        ("induction", {"k": 1, "alphabet": 4, "length": 8}),
    ],
)
def test_the_validation_set_is_disjoint_from_the_training_stream(task, params):
    t = make_task(task, params, seed=3, test_size=300, val_size=200)
    val, test = t.val_examples()[0], t.test_examples()[0]
    # Both sets are exact; they are independent draws, so they may share an example (both are held out).
    assert len(test) == 300 and len(val) == 200
    train_keys = set().union(*(_keys(t.train_examples(step, 256)[0]) for step in range(20)))
    assert not train_keys & _keys(val) and not train_keys & _keys(test)
    # Fixed: the same seed gives the same validation set, another seed another one.
    assert np.array_equal(val, make_task(task, params, seed=3, test_size=300, val_size=200).val_examples()[0])
    assert not np.array_equal(val, make_task(task, params, seed=4, test_size=300, val_size=200).val_examples()[0])


def test_validation_and_test_sets_are_samples_of_the_same_generator():
    # Dyck draws its shortest strings often ("()" is about one example in twenty): they must fall in the
    # validation set as often as in the test set, or validation would not predict the test accuracy.
    t = make_task("dyck", {"max_pairs": 10}, seed=0, test_size=4000, val_size=4000)
    (val, val_mask), (test, test_mask) = t.val_examples(), t.test_examples()

    def short(seq, mask):
        return float((mask.argmax(axis=1) <= 4).mean())  # strings of at most 4 characters

    # Two independent samples of one distribution (here 20.9% and 20.4%); split by distinct string, each of
    # about 30 short strings fell wholly in one set (17.7% against 22.4%).
    shares = short(val, val_mask), short(test, test_mask)
    assert min(shares) > 0.1
    # The shares of two independent samples differ by sampling alone: five standard errors of a difference of
    # two binomial shares (as tolerance.sampling_error takes five of a standard deviation's).
    p = sum(shares) / 2
    assert abs(shares[0] - shares[1]) < 5 * math.sqrt(p * (1 - p) * (1 / len(val) + 1 / len(test)))


def test_selection_keeps_the_best_validation_evaluation_the_earliest_of_equals():
    picked = Selection("token_acc", True)
    for step, acc in [(0, float("nan")), (10, 0.5), (20, 0.7), (30, 0.7), (40, 0.6)]:
        picked.add(step, {"token_acc": acc - 0.1}, {"token_acc": acc})
    assert picked.summary() == {"step": 20, "test": {"token_acc": 0.6}, "val": {"token_acc": 0.7}}
    lowest = Selection("loss", False)
    events = [{"step": s, "event": "eval", "loss": 9.0, "val_loss": v} for s, v in [(0, 3.0), (5, 1.0), (9, 0.5)]]
    lowest.extend([{"step": 0, "event": "freeze"}, *events], up_to=5)  # a run resumed at step 5
    assert lowest.summary() == {"step": 5, "test": {"loss": 9.0}, "val": {"loss": 1.0}}


def test_memorization_validates_on_a_fixed_part_of_its_table():
    t = make_task("memorization", {"n": 16}, seed=0, val_size=50)
    val, table = t.val_examples()[0], t.test_examples()[0]
    assert len(val) == 50 and _keys(val) <= _keys(table) and len(table) == 256


def _tiny(**kw):
    base = dict(d_model=32, n_heads=2, n_layers=1, batch_size=64, lr=3e-3, test_size=200, val_size=200)
    return run_config("addition", "standard", {"n_digits": 1}, **{**base, **kw})


EARLY_STOP = dict(steps=3000, eval_every=50, early_stop=True, patience=2, test_size=20, val_size=20)
"""1-digit addition: 100 pairs, learnt in a few hundred steps; the budget is far more."""


@pytest.fixture(scope="module")
def stopped(tmp_path_factory):
    """A run of `EARLY_STOP` trained once for the module, stopped early: its directory and its summary. Tests that
    resume it do so in a copy."""
    run = tmp_path_factory.mktemp("stopped") / "run"
    return run, train(_tiny(**EARLY_STOP), run, progress=False)


def test_early_stopping_stops_a_converged_run_and_a_resume_does_not_train_it_further(stopped, tmp_path):
    summary = stopped[1]
    conv = summary["convergence"]
    assert conv["stopped_early"] and conv["reason"] in ("solved", "plateau")
    assert conv["steps_trained"] < 3000 and conv["steps_trained"] % 50 == 0
    shutil.copytree(stopped[0], tmp_path / "run")
    latest = (tmp_path / "run" / "checkpoints" / "latest").read_text().strip()
    assert latest == f"step_{conv['steps_trained']:07d}"  # a checkpoint where it stopped
    before = (tmp_path / "run" / "metrics.jsonl").read_text()
    again = train(_tiny(**EARLY_STOP), tmp_path / "run", resume=True, progress=False)
    assert again == summary and (tmp_path / "run" / "metrics.jsonl").read_text() == before


def test_a_run_killed_after_it_stopped_resumes_to_the_same_summary(stopped, tmp_path):
    run, summary = stopped
    shutil.copytree(run, tmp_path / "b")
    (tmp_path / "b" / "summary.json").unlink()  # killed between the last checkpoint and the summary
    resumed = train(_tiny(**EARLY_STOP), tmp_path / "b", resume=True, progress=False)
    assert (
        resumed["test"] == summary["test"]
        and resumed["convergence"]["steps_trained"] == (summary["convergence"]["steps_trained"])
    )
    events = [json.loads(line) for line in (tmp_path / "b" / "metrics.jsonl").read_text().splitlines()]
    assert max(e["step"] for e in events) == summary["convergence"]["steps_trained"]
