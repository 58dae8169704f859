"""The verdict rule (mixit.study.verdicts; docs/reproduction.md, "The rule"), one case at a time, on hand-made
readings: no training. The paper's findings built on it are tested in test_checks.py."""

import math

import pytest
import torch

from mixit.study.collect import Result
from mixit.study.verdicts import (
    RULE,
    Cell,
    Part,
    Reading,
    difference,
    drift,
    judge,
    over_seeds,
    projection,
    seed_margin,
    selected_curve,
    t_quantile,
    worst_of,
)
from tolerance import assert_close

FLAT = tuple((s, 50.0) for s in range(0, 1001, 100))


def rising(per_step: float, end: float = 50.0) -> tuple[tuple[int, float], ...]:
    return tuple((s, end - per_step * (1000 - s)) for s in range(0, 1001, 100))


def test_the_drift_is_the_least_squares_slope_of_the_last_half_of_the_evaluations():
    d = drift(rising(0.01))
    assert d is not None and (d.points, d.first_step, d.last_step) == (5, 600, 1000)
    assert_close(d.slope, 0.01, dtype=torch.float64, terms=10, scale=1.0)
    assert_close(d.se, 0.0, dtype=torch.float64, terms=10, scale=1.0)
    noisy = tuple((s, v + (1.0 if i % 2 else -1.0)) for i, (s, v) in enumerate(FLAT))
    assert drift(noisy).se > 0
    assert drift(((0, 1.0), (100, 2.0), (200, 3.0))) is None  # two evaluations after step 0: too few
    assert drift(FLAT, min_window=8).points == 8


def test_a_projection_moves_only_where_the_drift_bound_allows_and_stays_in_range():
    horizon = RULE.horizon * 1000 - 1000  # steps left to the horizon for a run trained to its cap of 1000
    low, high, _ = projection(Reading(50.0, curve=rising(0.01), steps=1000, cap=1000, bounds=(0, 100)))
    assert low == 50.0  # rising surely: no way down
    assert_close(high, 50.0 + 0.01 * horizon, dtype=torch.float64, terms=20, scale=60.0)
    low, high, _ = projection(Reading(50.0, curve=FLAT, steps=1000, cap=1000))
    assert (low, high) == (50.0, 50.0)
    low, high, _ = projection(Reading(95.0, curve=rising(0.1, 95.0), steps=1000, cap=1000, bounds=(0, 100)))
    assert high == 100.0  # accuracy stops at 100
    low, high, _ = projection(Reading(95.0, curve=rising(0.1, 95.0), steps=2000, cap=1000))
    assert (low, high) == (95.0, 95.0)  # trained to the horizon already
    solved = Reading(99.95, curve=rising(0.3, 99.95), steps=300, cap=1000, bounds=(0, 100), solved=True)
    assert projection(solved)[:2] == (99.95, 99.95)


def part_of(threshold: float = 0.0) -> Part:
    a, b = Cell("a", {}, lambda r: None), Cell("b", {}, lambda r: None)
    return Part("a above b", [a, b], difference("a", "b", threshold))


def test_a_seed_holds_fails_or_stays_open_within_noise_or_by_drift():
    flat = {"a": Reading(60.0, 1.0, FLAT, 1000, 1000), "b": Reading(50.0, 1.0, FLAT, 1000, 1000)}
    seed = seed_margin(part_of(), 0, flat)
    assert seed.reads == "holds" and seed.margin == 10.0
    assert_close(seed.floor, RULE.z * math.sqrt(2), dtype=torch.float64, terms=4, scale=1.0)
    assert seed_margin(part_of(20.0), 0, flat).reads == "fails"
    within = seed_margin(part_of(9.0), 0, flat)  # margin 1 against a floor of 2.3
    assert within.reads == "open" and within.why.startswith("margin within the noise floor")
    chasing = {**flat, "b": Reading(50.0, 0.0, rising(0.02), 1000, 1000)}  # b would gain 20 by the horizon
    open_ = seed_margin(part_of(), 0, chasing)
    assert open_.reads == "open" and open_.why.endswith(": b")
    assert open_.worst < 0 < open_.margin


def test_with_fewer_than_three_seeds_every_seed_must_agree():
    flat = {"a": Reading(60.0, 0.0, FLAT, 1000, 1000), "b": Reading(50.0, 0.0, FLAT, 1000, 1000)}
    other = {**flat, "a": Reading(40.0, 0.0, FLAT, 1000, 1000)}
    holds, fails = seed_margin(part_of(), 0, flat), seed_margin(part_of(), 1, other)
    assert over_seeds(part_of(), [holds, holds]).verdict == "PASS"
    assert over_seeds(part_of(), [fails, fails]).verdict == "FAIL"
    assert over_seeds(part_of(), [holds, fails]).verdict == "UNDECIDED"


def test_with_three_seeds_or_more_the_one_sided_interval_decides():
    def seeds(*margins):
        return [
            seed_margin(
                part_of(), i, {"a": Reading(50.0 + m, 0.0, FLAT, 1000, 1000), "b": Reading(50.0, 0.0, FLAT, 1000, 1000)}
            )
            for i, m in enumerate(margins)
        ]

    assert over_seeds(part_of(), seeds(3.0, 4.0, 5.0)).verdict == "PASS"
    assert over_seeds(part_of(), seeds(-3.0, -4.0, -5.0)).verdict == "FAIL"
    wide = over_seeds(part_of(), seeds(10.0, 8.0, -6.0))  # holds in two seeds, not surely on average
    assert wide.verdict == "UNDECIDED" and wide.interval[0] < 0 < wide.interval[1]


def test_t_quantiles():
    assert t_quantile(2) == 2.920 and t_quantile(15) == 1.753
    scipy_stats = pytest.importorskip("scipy.stats")
    for df in (16, 20, 40, 100):  # the expansion beyond the table, against the exact quantile
        assert round(t_quantile(df), 3) == round(float(scipy_stats.t.ppf(0.95, df)), 3)


def test_an_and_finding_takes_its_worst_part():
    assert worst_of(["PASS", "UNDECIDED", "FAIL"]) == "FAIL"
    assert worst_of(["PASS", "UNDECIDED"]) == "UNDECIDED"
    assert worst_of(["PASS", "PASS"]) == "PASS"


def result(variant: str, value: float, evals=(), seed: int = 0, state: str = "done") -> Result:
    return Result(
        f"{variant}-{seed}",
        [{"variant": variant, "seed": seed}],
        {"task": "t", "train": {"steps": 1000}},
        state,
        {"token_acc": value},
        convergence={"metric": "token_acc", "higher_is_better": True, "steps_trained": 1000},
        evals=list(evals),
    )


def test_a_missing_or_unfinished_input_makes_a_finding_not_applicable():
    from mixit.study.verdicts import metric

    cells = [Cell(v, {"variant": v}, metric("token_acc", 100, (0, 100))) for v in ("a", "b")]
    part = Part("a above b", cells, difference("a", "b"))
    assert judge("f", [result("a", 0.6), result("b", 0.5)], [part]).verdict == "PASS"
    check = judge("f", [result("a", 0.6), result("b", 0.5, state="failed")], [part])
    assert check.verdict == "n/a" and "b seed 0: failed" in check.evidence
    check = judge("f", [result("a", 0.6)], [part])
    assert check.verdict == "n/a" and "b: no run" in check.evidence


def test_the_reported_curve_is_the_test_metric_at_the_best_validation_so_far():
    evals = [
        {"step": 0, "token_acc": 0.1, "val_token_acc": 0.1},
        {"step": 100, "token_acc": 0.6, "val_token_acc": 0.7},
        {"step": 200, "token_acc": 0.5, "val_token_acc": 0.6},  # validation fell: still reports step 100's test
        {"step": 300, "token_acc": 0.8, "val_token_acc": 0.9},
    ]
    assert selected_curve(result("a", 0.8, evals), "token_acc") == [(0, 0.1), (100, 0.6), (200, 0.6), (300, 0.8)]
    no_val = [{"step": 0, "token_acc": 0.1}, {"step": 100, "token_acc": 0.3}]
    assert selected_curve(result("a", 0.3, no_val), "token_acc") == [(0, 0.1), (100, 0.3)]


def test_a_run_is_reported_at_its_best_validation_evaluation():
    from mixit.study.verdicts import metric

    r = result("a", 0.5)
    r.selected = {"step": 100, "test": {"token_acc": 0.7, "token_acc_se": 0.01}}
    reading = metric("token_acc", 100, (0, 100))(r)
    assert (reading.value, reading.se) == (70.0, 1.0)
