"""The paper's findings as checks, judged on hand-made results (no training): each check passes,
fails and is undecided when it should, a missing or failed run makes it n/a, and a finding is judged
per seed."""

import pytest

from mixit.study.report import search_appendix
from mixit.study.results import Result, StudyResults, variant_table
from mixit.study.tables import TABLES, table1, table2, table3, table4, table5, table6_7

IMPROVING = {
    "metric": "token_acc",
    "higher_is_better": True,
    "converged": False,
    "reason": "improving",
    "best": 0.5,
    "best_step": 120,
    "gain": 0.032,
    "window": [80, 120],
    "stopped_early": False,
    "steps_trained": 120,
}
SETTLED = {**IMPROVING, "converged": True, "reason": "plateau", "gain": 0.0}


def runs(table, task, values, metric="token_acc", scale=100, **labels):
    """One finished, converged run per seed of the cell (table, task, labels), its `metric` reading
    values[seed] / scale (a single number: one seed)."""
    values = values if isinstance(values, list) else [values]
    return [
        Result(
            id=f"{table}-{task}-{'-'.join(map(str, labels.values()))}-{seed}",
            labels=[{"table": table, "task": task, **labels, "seed": seed}],
            config={"task": task, "task_params": {}},
            state="done",
            test={metric: value / scale},
            convergence=dict(SETTLED),
        )
        for seed, value in enumerate(values)
    ]


def study(*groups, signals=None):
    return StudyResults([r for group in groups for r in group], signals or {})


def unconverged(results, seed=0):
    results[seed].convergence = dict(IMPROVING)
    return results


def table1_study(mixit_retrieval=11.0, converged=True):
    retrieval = runs("table1", "retrieval", mixit_retrieval, variant="mixit")
    if not converged:
        unconverged(retrieval)
    return study(
        runs("table1", "retrieval", 100.0, variant="standard"),
        runs("table1", "retrieval", 97.0, variant="frozen_qk"),
        retrieval,
        runs("table1", "induction", 100.0, variant="standard"),
        runs("table1", "induction", 96.7, variant="frozen_qk"),
        runs("table1", "induction", 48.6, variant="mixit"),
    )


def heads_study(frozen_qk=0.7, mixit=0.05, converged=True):
    found = []
    for variant, score in (("frozen_qk", frozen_qk), ("mixit", mixit)):
        (r,) = runs("table1", "induction", 90.0, variant=variant)
        r.heads = None if score is None else {"induction": {"score": score}}
        found.append(r)
    if not converged:
        found[0].convergence = dict(IMPROVING)
    return study(found)


def table3_study(mixit_addition=99.0, converged=True):
    groups = [runs("table3", task, 99.0, variant="standard") for task in table3.MATCHED]
    groups += [runs("table3", "modular_addition", 98.0, variant="mixit"), runs("table3", "dyck", 97.0, variant="mixit")]
    addition = runs("table3", "addition", mixit_addition, variant="mixit")
    return study(*groups, addition if converged else unconverged(addition))


def table4_study(frozen_mlp=1.1, converged=True):
    bits = {"standard": 3.0, "frozen_qk": 2.2, "mixit": 2.1, "frozen_mlp": frozen_mlp}
    groups = [runs("table4", "memorization", b, "bits_per_trainable_param", 1, variant=v) for v, b in bits.items()]
    return study(*groups[:3], groups[3] if converged else unconverged(groups[3]))


def table2_study(frozen_qk=3.0, converged=True):
    loss = {"standard": 2.8, "frozen_qk": frozen_qk, "mixit": 3.7}
    groups = [runs("table2", "lm", x, "loss", 1, variant=v, corpus="english") for v, x in loss.items()]
    return study(*groups[1:], groups[0] if converged else unconverged(groups[0]))


def table5_study(most=90.0, converged=True):
    groups = [runs("table5", "addition", acc, variant="mixit", n_heads=h) for h, acc in ((1, 30.0), (4, 50.0))]
    groups.append(runs("table5", "addition", most, variant="mixit", n_heads=16))
    return study(*groups[:2], groups[2] if converged else unconverged(groups[2]))


def table6_study(random_deep=30.0, random_shallow=100.0, converged=True):
    random_hi = runs("table6", "addition", random_deep, variant="random", n_layers=8)
    return study(
        runs("table6", "addition", random_shallow, variant="random", n_layers=2),
        random_hi if converged else unconverged(random_hi),
        runs("table6", "addition", 100.0, variant="mixit", n_layers=2),
        runs("table6", "addition", 99.0, variant="mixit", n_layers=8),
    )


def sweep(random, mixit, depths=(2, 32)):
    """A signal.json: the token cosine of each variant at each depth."""
    return {
        "config": {"depths": list(depths), "seeds": [0, 1, 2]},
        "results": {
            "random": {str(d): {"cosine": c, "covariance": c} for d, c in zip(depths, random)},
            "mixit": {str(d): {"cosine": c, "covariance": c} for d, c in zip(depths, mixit)},
        },
    }


def signal_study(random=(0.2, 0.9), mixit_nosink=(0.1, 0.12), mixit_sink=(0.1, 0.8)):
    return study(
        signals={"signal-nosink": sweep(random, mixit_nosink), "signal": sweep(random, mixit_sink)},
    )


CASES = [
    # (check, results, verdict)
    (table1.check_retrieval_gap, table1_study(), "PASS"),
    (table1.check_retrieval_gap, table1_study(mixit_retrieval=80.0), "FAIL"),
    (table1.check_retrieval_gap, table1_study(converged=False), "UNDECIDED"),
    (table1.check_induction_heads, heads_study(), "PASS"),
    (table1.check_induction_heads, heads_study(mixit=0.3), "FAIL"),
    (table1.check_induction_heads, heads_study(converged=False), "UNDECIDED"),
    (table1.check_induction_heads, heads_study(mixit=None), "n/a"),  # not analysed: no head scores
    (table2.check_lm, table2_study(), "PASS"),
    (table2.check_lm, table2_study(frozen_qk=3.9), "FAIL"),
    (table2.check_lm, table2_study(converged=False), "UNDECIDED"),
    (table3.check_mixit_matches, table3_study(), "PASS"),
    (table3.check_mixit_matches, table3_study(mixit_addition=80.0), "FAIL"),
    (table3.check_mixit_matches, table3_study(converged=False), "UNDECIDED"),
    (table4.check_bits, table4_study(), "PASS"),
    (table4.check_bits, table4_study(frozen_mlp=2.5), "FAIL"),
    (table4.check_bits, table4_study(converged=False), "UNDECIDED"),
    (table5.check_heads, table5_study(), "PASS"),
    (table5.check_heads, table5_study(most=20.0), "FAIL"),
    (table5.check_heads, table5_study(converged=False), "UNDECIDED"),
    (table6_7.check_depth, table6_study(), "PASS"),
    (table6_7.check_depth, table6_study(random_deep=98.0), "FAIL"),
    (table6_7.check_depth, table6_study(converged=False), "UNDECIDED"),
    (table6_7.check_depth, table6_study(random_shallow=50.0, random_deep=20.0), "UNDECIDED"),  # nothing to fall from
    (table6_7.check_signal, signal_study(), "PASS"),
    (table6_7.check_signal, signal_study(mixit_nosink=(0.1, 0.5)), "FAIL"),
    (table6_7.check_signal, study(signals={"signal": sweep((0.2, 0.9), (0.1, 0.8))}), "n/a"),
    (table6_7.check_sink, signal_study(), "PASS"),
    (table6_7.check_sink, signal_study(mixit_sink=(0.1, 0.15)), "FAIL"),
    (table6_7.check_sink, study(signals={"signal-nosink": sweep((0.2, 0.9), (0.1, 0.1))}), "n/a"),
]


@pytest.mark.parametrize(
    "check, results, verdict", CASES, ids=[f"{c.__name__}-{v}-{i}" for i, (c, _, v) in enumerate(CASES)]
)
def test_each_check_passes_fails_and_is_undecided_when_it_should(check, results, verdict):
    result = check(results)
    assert result.verdict == verdict, result.evidence
    if verdict in ("PASS", "FAIL") and check not in (table6_7.check_signal, table6_7.check_sink):
        assert result.evidence.endswith(f"holds in {result.holds} of 1 seeds")
        assert (result.seeds, result.holds) == (1, 1 if verdict == "PASS" else 0)


def test_an_unconverged_input_is_named_and_the_verdict_it_would_have_is_given():
    result = table1.check_retrieval_gap(table1_study(converged=False))
    assert result.verdict == "UNDECIDED" and "would PASS (holds in 1 of 1 seeds)" in result.evidence
    assert result.unconverged == ["retrieval/mixit seed 0: still improving, +3.2 points over steps 80-120"]
    result = table1.check_retrieval_gap(table1_study(mixit_retrieval=80.0, converged=False))
    assert "would FAIL" in result.evidence


def test_a_run_without_a_convergence_record_is_not_converged():
    results = table3_study()
    results.results[0].convergence = None  # written by older code
    result = table3.check_mixit_matches(results)
    assert result.verdict == "UNDECIDED"
    assert result.unconverged == ["addition/standard seed 0: no convergence record (a run of older code)"]


def test_the_random_transformer_must_learn_addition_before_it_can_lose_it():
    result = table6_7.check_depth(table6_study(random_shallow=50.0, random_deep=20.0))
    assert "learns addition at 2 layers (token accuracy >= 90%)" in result.evidence
    assert "not met in seed(s) 0" in result.evidence and not result.unconverged


def test_a_missing_or_failed_run_makes_a_check_not_applicable():
    results = table3_study()
    results.results[0].state = "failed"
    result = table3.check_mixit_matches(results)
    assert result.verdict == "n/a" and "addition/standard seed 0: failed" in result.evidence
    results.results.pop(0)
    result = table3.check_mixit_matches(results)
    assert result.verdict == "n/a" and "addition/standard: no run" in result.evidence


def test_a_finding_holding_in_two_of_three_seeds_fails():
    results = table3_study(mixit_addition=[99.0, 98.0, 70.0])
    for r in list(results.results):
        if r.labels[0]["variant"] == "standard" or r.labels[0]["task"] != "addition":
            results.results += [
                Result(**{**vars(r), "id": f"{r.id}+{s}", "labels": [{**r.labels[0], "seed": s}]}) for s in (1, 2)
            ]
    result = table3.check_mixit_matches(results)
    assert (result.verdict, result.seeds, result.holds) == ("FAIL", 3, 2)
    assert result.evidence.endswith("holds in 2 of 3 seeds")
    assert "addition/mixit 89.0 ± 16.5%" in result.evidence  # mean ± sample std over the seeds


def test_screening_runs_are_not_cells_of_a_table():
    results = table3_study(mixit_addition=80.0)
    for r in results.results:
        if r.labels[0]["task"] == "addition" and r.labels[0]["variant"] == "mixit":
            r.role = "screen"
    results.results += runs("table3", "addition", 99.0, variant="mixit")
    assert table3.check_mixit_matches(results).verdict == "PASS"


def test_every_check_of_every_table_reads_not_applicable_on_an_empty_study():
    checks = [check(StudyResults([])) for table in TABLES for check in table.checks]
    assert len(checks) == 9 and {c.verdict for c in checks} == {"n/a"}
    assert len({c.name for c in checks}) == len(checks)


def test_tables_show_convergence_and_the_chosen_settings_and_the_appendix_every_candidate():
    results = table3_study()
    late = unconverged(runs("table3", "addition", [90.0, 96.0], variant="standard"), seed=1)
    results.results = [r for r in results.results if r.labels[0]["variant"] != "standard"] + late
    for r in results.results:
        r.chosen = {"train.lr": 0.003}
    lines = variant_table(results.results, "table3", "addition", ("standard", "mixit")).splitlines()
    assert lines[0] == "| variant | accuracy | exact match | converged | chosen | runs |"
    assert lines[2] == "| standard | 93.0 ± 4.2 | - | 1/2 (seed 1: improving) | lr=0.003 | 2/2 |"
    for lr, acc in ((0.001, 0.5), (0.003, 0.9)):
        (screen,) = runs("search", "addition", 0, variant="standard", cell="table3", group="g", lr=lr)
        screen.role, screen.val = "screen", {"token_acc": acc}
        results.results.append(screen)
    appendix = search_appendix(results)
    assert appendix[0] == "**addition / standard**"
    assert "| table3 | lr=0.001 | token_acc 50.0% | yes |  |" in appendix
    assert "| table3 | lr=0.003 | token_acc 90.0% | yes | **chosen** |" in appendix
