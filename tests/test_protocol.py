"""docs/protocol.md, the pre-registered protocol, against the code that carries it out: every constant the
protocol states is the one the verdict rule, the search and the quick preset use (so the file cannot drift
from what runs), and the report names the protocol's commit."""

from pathlib import Path

from mixit.study.presets import CONFIRMATORY_TEST_SEED, QUICK
from mixit.study.search import SCREEN_SEED
from mixit.study.tables import table1, table3, table6_7
from mixit.study.verdicts import RULE
from mixit.version import PROTOCOL

TEXT = (Path(__file__).parents[1] / PROTOCOL).read_text()


def row(first_cell: str) -> str:
    """The protocol's table row that starts with `first_cell`."""
    (found,) = [line for line in TEXT.splitlines() if line.startswith(f"| {first_cell} |")]
    return found


def test_the_rule_s_constants_are_the_protocol_s():
    assert row("`Rule.alpha`").startswith(f"| `Rule.alpha` | {RULE.alpha} |")
    assert row("`Rule.min_seeds`").startswith(f"| `Rule.min_seeds` | {RULE.min_seeds} |")
    assert row("`Rule.schedule`").startswith(f"| `Rule.schedule` | {RULE.schedule} |")
    assert f"level 1 - alpha/{RULE.looks}" in TEXT
    assert f"`extend = {QUICK.extend}`" in TEXT


def test_the_seeds_and_test_seeds_are_the_protocol_s():
    assert (QUICK.seeds, QUICK.max_seeds) == (RULE.schedule[0], RULE.schedule[-1])
    confirmatory = row("confirmatory (`make run`)")
    assert f"| {CONFIRMATORY_TEST_SEED} |" in confirmatory
    assert f"0, 1, 2 (then up to {QUICK.max_seeds - 1})" in confirmatory
    assert {t["test_seed"] for t in QUICK.tasks.values()} == {CONFIRMATORY_TEST_SEED}
    assert f"`{SCREEN_SEED:,} + seed`" in TEXT


def test_the_thresholds_are_the_protocol_s():
    assert f"min(standard, frozen Q/K) - {table1.GAP:g} - MixiT" in row("retrieval gap (Table 1)")
    assert f"MixiT - (standard - {table3.WITHIN:g})" in row("MixiT matches (Table 3)")
    depth = row("depth finding (Table 6)")
    assert f"(2 layers - 8 layers) - {table6_7.DEPTH_POINTS:g}" in depth
    assert f"random at 2 layers - {table6_7.LEARNS:g}" in depth
    assert f"> {table6_7.RISE}" in row("signal (Table 7)")


def test_the_grids_and_budgets_are_the_protocol_s():
    mixit = QUICK.search_for("addition", "mixit")
    heads, widths = mixit["model.n_heads"], mixit["model.d_model"]
    assert f"heads {{{', '.join(map(str, heads))}}} x width {{{', '.join(map(str, widths))}}}" in row(
        "addition, Dyck (MixiT)"
    )
    assert QUICK.search_for("dyck", "mixit") == mixit
    assert f"Heads swept (Table 5): {', '.join(map(str, QUICK.heads))} (" in TEXT
    assert f"{', '.join(map(str, QUICK.retrieval_pairs[:-1]))} and {QUICK.retrieval_pairs[-1]} pairs" in TEXT
    rows = {
        "retrieval (Table 1)": "retrieval",
        "induction (Table 1)": "induction",
        "language modelling (Table 2)": "lm",
        "addition (Tables 3, 5)": "addition",
        "Dyck-1 (Table 3)": "dyck",
        "modular addition (Table 3)": "modular_addition",
        "memorization (Tables 3, 4)": "memorization",
        "sentiment (Tables 3, 5)": "sentiment",
        "depth (Table 6)": "depth",
    }
    for first, task in rows.items():
        train = QUICK.tasks[task]["train"]
        assert row(first).endswith(f"| {train['steps']:,} x {train['batch_size']} |"), first
    for task, least in QUICK.screen_min_steps.items():
        assert f"{least:,} steps" in TEXT, task


def test_the_report_names_the_protocol_s_commit_in_a_checkout():
    from mixit.version import protocol_commit

    commit = protocol_commit()
    assert commit is None or len(commit) == 40
