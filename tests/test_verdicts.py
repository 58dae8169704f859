"""The verdict rule (mixit.study.verdicts; docs/protocol.md, "The rule"), one case at a time, on hand-made
readings: no training. The paper's findings built on it are tested in test_checks.py."""

import math

import numpy as np
import pytest
import torch
from scipy import stats

from mixit.study.collect import Result
from mixit.study.verdicts import (
    RULE,
    Cell,
    Part,
    Reading,
    Rule,
    difference,
    judge,
    over_seeds,
    seed_margin,
    worst_of,
)
from tolerance import assert_close


def part_of(threshold: float = 0.0, needs_convergence: bool = False) -> Part:
    a, b = Cell("a", {}, lambda r: None), Cell("b", {}, lambda r: None)
    return Part("a above b", [a, b], difference("a", "b", threshold), needs_convergence=needs_convergence)


def seeds(*margins: float, se: float = 0.0, converged: bool = True):
    """One seed per margin: cell a at 50 + margin, cell b at 50, each with standard error `se`."""
    return [
        seed_margin(part_of(), i, {"a": Reading(50.0 + m, se, converged=converged), "b": Reading(50.0, se)})
        for i, m in enumerate(margins)
    ]


def test_a_seed_s_margin_carries_its_test_set_error_in_quadrature():
    (seed,) = seeds(10.0, se=1.0)
    assert seed.margin == 10.0 and seed.holds
    assert_close(seed.se, math.sqrt(2), dtype=torch.float64, terms=4, scale=1.0)


def test_the_quantile_is_student_t_at_the_level_each_look_spends():
    rule = Rule(alpha=0.05, schedule=(3, 5, 7))
    for n in (2, 3, 5, 7, 30):  # the exact quantile, not a table: each of 3 looks spends alpha / 3
        assert rule.quantile(n) == float(stats.t.ppf(1 - 0.05 / 3, n - 1))
    assert Rule(schedule=(3,)).quantile(3) == float(stats.t.ppf(0.95, 2))  # one look: the plain 95% quantile
    assert rule.quantile(3) > rule.quantile(5) > rule.quantile(7)  # fewer seeds, wider
    with pytest.raises(ValueError):
        rule.quantile(1)


def test_the_sequential_design_looks_at_its_schedule_and_stops_at_its_last():
    assert [RULE.next_look(n) for n in (1, 2, 3, 4, 5, 6, 7, 9)] == [3, 3, 5, 5, 7, 7, None, None]


def test_fewer_seeds_than_a_verdict_needs_decide_nothing():
    for margins in ((5.0,), (5.0, 6.0), (-5.0, -6.0)):
        verdict = over_seeds(part_of(), seeds(*margins))
        assert verdict.verdict == "PROVISIONAL" and verdict.interval is None
        assert verdict.why == f"{len(margins)} seed(s): a verdict needs 3 at least"


def test_the_interval_over_seeds_decides_with_its_small_sample_law():
    tight = over_seeds(part_of(), seeds(3.0, 4.0, 5.0))
    q = float(stats.t.ppf(1 - 0.05 / 3, 2))
    assert tight.quantile == q
    assert_close(tight.interval[0], 4.0 - q * 1.0 / math.sqrt(3), dtype=torch.float64, terms=8, scale=5.0)
    assert tight.verdict == "PASS"  # 4 - 5.34 x 0.577 = +0.92
    assert over_seeds(part_of(), seeds(-3.0, -4.0, -5.0)).verdict == "FAIL"
    wide = over_seeds(part_of(), seeds(10.0, 8.0, -6.0))  # positive in two seeds, not surely on average
    assert wide.verdict == "UNDECIDED" and wide.interval[0] < 0 < wide.interval[1]
    assert wide.why.startswith("the interval")
    # The same mean and spread a z interval would pass: t with 2 degrees of freedom does not.
    close = over_seeds(part_of(), seeds(1.0, 2.0, 3.0))
    assert 2.0 - 1.645 * 1.0 / math.sqrt(3) > 0 and close.verdict == "UNDECIDED"


def test_the_test_set_error_widens_the_interval_and_does_not_shrink_with_seeds():
    without = over_seeds(part_of(), seeds(3.0, 3.0, 3.0))
    assert without.verdict == "PASS" and without.interval[0] == 3.0  # no spread, no test error
    shared = over_seeds(part_of(), seeds(3.0, 3.0, 3.0, se=1.0))  # margin error sqrt(2), not divided by sqrt(3)
    z = float(stats.norm.ppf(1 - 0.05 / 3))  # known from the test set's examples: a normal quantile
    assert RULE.z == z
    assert_close(shared.interval[0], 3.0 - z * math.sqrt(2), dtype=torch.float64, terms=8, scale=10.0)
    assert shared.verdict == "UNDECIDED"  # 3 - 2.13 x 1.41 = -0.01
    both = over_seeds(part_of(), seeds(2.0, 3.0, 4.0, se=0.5))  # the two errors add in quadrature
    half = math.hypot(both.quantile * 1.0 / math.sqrt(3), z * math.sqrt(0.5))
    assert_close(both.interval[0], 3.0 - half, dtype=torch.float64, terms=8, scale=10.0)


def test_a_capacity_is_judged_only_at_convergence():
    moving = seeds(3.0, 4.0, 5.0, converged=False)
    verdict = over_seeds(part_of(needs_convergence=True), moving)
    assert verdict.verdict == "UNDECIDED" and verdict.why.startswith("not converged at the budget trained: a")
    assert over_seeds(part_of(), moving).verdict == "PASS"  # any other part is judged at the budget trained


def test_an_and_finding_takes_its_worst_part():
    assert worst_of(["PASS", "UNDECIDED", "FAIL"]) == "FAIL"
    assert worst_of(["PASS", "PROVISIONAL", "UNDECIDED"]) == "UNDECIDED"
    assert worst_of(["PASS", "PROVISIONAL"]) == "PROVISIONAL"
    assert worst_of(["PASS", "PASS"]) == "PASS"


def false_decisions(rule: Rule, correct_for_looks: bool, trials: int = 4000) -> float:
    """How often the sequential design declares PASS on a part whose true margin is 0 (seed margins drawn
    N(0, 1)): judged at 3 seeds, 2 more while undecided, up to the schedule's last look."""
    rng = np.random.default_rng(12345)
    level = 1 - rule.alpha / (rule.looks if correct_for_looks else 1)
    wrong = 0
    for _ in range(trials):
        margins = rng.standard_normal(rule.schedule[-1])
        for n in rule.schedule:
            x = margins[:n]
            lower = x.mean() - stats.t.ppf(level, n - 1) * x.std(ddof=1) / math.sqrt(n)
            upper = x.mean() + stats.t.ppf(level, n - 1) * x.std(ddof=1) / math.sqrt(n)
            if lower > 0:
                wrong += 1
                break
            if upper < 0:
                break
    return wrong / trials


def test_the_sequential_design_keeps_its_error_rate_and_uncorrected_looks_do_not():
    trials = 4000
    slack = 3 * math.sqrt(RULE.alpha * (1 - RULE.alpha) / trials)  # Monte Carlo error of the rate
    assert false_decisions(RULE, True, trials) <= RULE.alpha + slack
    assert false_decisions(RULE, False, trials) > RULE.alpha + slack  # three looks at 95% each spend more
    # The rule itself on the same draws gives the same decisions as the simulation's formula.
    rng = np.random.default_rng(7)
    margins = list(rng.standard_normal(5))
    verdict = over_seeds(part_of(), seeds(*margins))
    x = np.array(margins)
    lower = x.mean() - RULE.quantile(5) * x.std(ddof=1) / math.sqrt(5)
    assert_close(verdict.interval[0], float(lower), dtype=torch.float64, terms=10, scale=3.0)


def result(variant: str, value: float, evals=(), seed: int = 0, state: str = "done", **labels) -> Result:
    return Result(
        f"{variant}-{seed}",
        [{"variant": variant, "seed": seed, **labels}],
        {"task": "t", "train": {"steps": 1000}},
        state,
        {"token_acc": value},
        convergence={"metric": "token_acc", "higher_is_better": True, "steps_trained": 1000, "reason": "plateau"},
        evals=list(evals),
    )


def test_a_missing_or_unfinished_input_makes_a_finding_not_applicable():
    from mixit.study.verdicts import metric

    cells = [Cell(v, {"variant": v}, metric("token_acc", 100)) for v in ("a", "b")]
    part = Part("a above b", cells, difference("a", "b"))
    three = [result(v, x + 0.01 * s, seed=s) for s in range(3) for v, x in (("a", 0.6), ("b", 0.5))]
    assert judge("f", three, [part]).verdict == "PASS"
    assert judge("f", three[:2], [part]).verdict == "PROVISIONAL"
    check = judge("f", [*three[:-1], result("b", 0.5, seed=2, state="failed")], [part])
    assert check.verdict == "n/a" and "b seed 2: failed" in check.evidence
    check = judge("f", [result("a", 0.6)], [part])
    assert check.verdict == "n/a" and "b: no run" in check.evidence


def test_a_reading_carries_its_run_s_convergence_and_budget():
    from mixit.study.verdicts import metric

    read = metric("token_acc", 100)
    assert read(result("a", 0.5)).converged and read(result("a", 0.5)).budget == 1
    moving = result("a", 0.5, budget=4)
    moving.convergence = {**moving.convergence, "reason": "improving"}
    assert not read(moving).converged and read(moving).budget == 4


def test_a_run_is_reported_at_its_best_validation_evaluation():
    from mixit.study.verdicts import metric

    r = result("a", 0.5)
    r.selected = {"step": 100, "test": {"token_acc": 0.7, "token_acc_se": 0.01}}
    reading = metric("token_acc", 100)(r)
    assert (reading.value, reading.se) == (70.0, 1.0)


def test_a_contrast_of_independent_means_has_welch_s_interval():
    """The signal checks' contrast (two depths, each its own models) against scipy's Welch test on the same data."""
    from mixit.study.verdicts import Group, contrast

    hi, lo = np.array([0.91, 0.95, 0.90]), np.array([0.48, 0.50, 0.47, 0.52])
    groups = [Group(float(x.mean()), float(x.std(ddof=1)), len(x)) for x in (hi, lo)]
    value, lower, upper = contrast([(1.0, groups[0]), (-1.0, groups[1])])
    welch = stats.ttest_ind(hi, lo, equal_var=False).confidence_interval(confidence_level=2 * RULE.level - 1)
    assert_close(value, float(hi.mean() - lo.mean()), dtype=torch.float64, terms=4, scale=1.0)
    assert_close(lower, float(welch.low), dtype=torch.float64, terms=20, scale=1.0)
    assert_close(upper, float(welch.high), dtype=torch.float64, terms=20, scale=1.0)
    assert contrast([(1.0, Group(0.5, 0.1, 1))]) == (0.5, -math.inf, math.inf)  # one seed: nothing bounds it
