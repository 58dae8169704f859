"""Studies: grids and stable ids, resuming and skipping, failures, executors, and the report."""

import csv
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mixit import Run, resolve, run_config
from mixit.cli import main
from mixit.core.training.loop import log_spaced_steps
from mixit.errors import UsageError
from mixit.study import ReproduceOptions, paper_study, reproduce
from mixit.study import executors as execute_module
from mixit.study.executors import Pool, execute, state, write_study
from mixit.study.report import write_report
from mixit.study.spec import Study, grid, load_study_file, plan, run_id
from mixit.study.tables import TABLES

CHECKS = [check for table in TABLES for check in table.checks]

ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
BASE = {
    "task": "addition",
    "task_params": {"n_digits": 2},
    "model": {"d_model": 16, "n_heads": 2, "n_layers": 1},
    "train": {"steps": 8, "batch_size": 16, "checkpoint_every": 2},
    "test_size": 40,
}
STUDY_FILE = """
name = "tiny"
seeds = 1
[base]
task = "addition"
task_params = {n_digits = 2}
model = {d_model = 16, n_heads = 2, n_layers = 1}
train = {steps = 8, batch_size = 16, checkpoint_every = 2}
test_size = 40
[grid]
variant = ["standard", "mixit"]
"""


def tiny_study(**axes):
    return Study("tiny", grid(BASE, axes or {"variant": ["standard", "mixit"]}, 1, {"table": "tiny"}))


def test_grid_expands_every_combination_with_seeds():
    specs = grid(BASE, {"variant": ["standard", "mixit"], "model.n_heads": [1, 2]}, seeds=3, labels={"table": "t"})
    assert len(specs) == 2 * 2 * 3
    assert {(s.labels["variant"], s.labels["n_heads"], s.labels["seed"]) for s in specs} == {
        (v, h, s) for v in ("standard", "mixit") for h in (1, 2) for s in range(3)
    }
    seeded = next(s for s in specs if s.labels["seed"] == 2)
    assert seeded.request["model"]["seed"] == 2 and seeded.request["data_seed"] == 2
    assert seeded.request["model"]["d_model"] == 16  # the base is kept beside the grid's values


def test_a_second_study_takes_seeds_the_first_never_used():
    first, second = paper_study("smoke", seeds=2), paper_study("smoke", seeds=1, first_seed=2)
    assert {s.labels["seed"] for s in first.specs} == {0, 1}
    assert {s.labels["seed"] for s in second.specs} == {2}
    assert {(s.request["model"]["seed"], s.request["data_seed"]) for s in second.specs} == {(2, 2)}
    assert (second.seeds, second.first_seed) == (1, 2)
    with pytest.raises(UsageError, match=r"first_seed must be an integer >= 0, got -1"):
        paper_study("smoke", first_seed=-1)
    with pytest.raises(UsageError, match=r"seeds must be an integer >= 1, got 0"):
        paper_study("smoke", seeds=0)


def test_a_study_from_python_named_as_a_path_is_refused():
    with pytest.raises(UsageError, match=r"study: name must be .* one directory name .*, got '\.\./x'"):
        Study("../x", [])


def test_a_second_study_measures_signal_at_initialisation_from_its_own_first_seed():
    assert all("first_seed" not in options for options in paper_study("smoke").extras.values())
    later = paper_study("smoke", first_seed=100).extras
    assert set(later) == {"signal", "signal-nosink"}
    assert all(options["first_seed"] == 100 for options in later.values())


def test_run_ids_are_stable_hashes_of_the_resolved_config():
    cfg = run_config("addition", "mixit", {"n_digits": 2}, d_model=16, n_heads=2)
    assert run_id(cfg) == run_id(run_config("addition", "mixit", {"n_digits": 2}, d_model=16, n_heads=2))
    # Spelling out a default does not change the run; changing a value does.
    assert run_id(cfg) == run_id(run_config("addition", "mixit", {"n_digits": 2}, d_model=16, n_heads=2, seed=0))
    assert run_id(cfg) != run_id(run_config("addition", "mixit", {"n_digits": 2}, d_model=16, n_heads=2, seed=1))
    assert len(run_id(cfg)) == 12
    # The same run asked for by two tables is planned once, with both labels.
    specs = grid(BASE, {"variant": ["standard"]}, 1, {"table": "a"}) + grid(
        BASE, {"variant": ["standard"]}, 1, {"table": "b"}
    )
    (planned,) = plan(specs)
    assert [labels["table"] for labels in planned.labels] == ["a", "b"]


def test_a_study_file_is_a_grid(tmp_path):
    path = tmp_path / "s.toml"
    path.write_text(STUDY_FILE)
    study = load_study_file(path)
    assert study.name == "tiny" and len(study.specs) == 2
    assert {s.labels["variant"] for s in study.specs} == {"standard", "mixit"}
    path.write_text(STUDY_FILE.replace("[grid]", "[gird]"))
    with pytest.raises(UsageError, match=r"unknown key\(s\) gird"):
        load_study_file(path)
    path.write_text(STUDY_FILE.replace('variant = ["standard", "mixit"]', 'variant = ["standard", "nope"]'))
    with pytest.raises(UsageError, match="unknown variant 'nope'"):
        plan(load_study_file(path).specs)


FULL_TOML = """
name = "full"
description = "every key"
seeds = 2
analyze = true
screen_fraction = 0.5
[base]
task = "addition"
task_params = {n_digits = 2}
model = {d_model = 16, n_layers = 1}
train = {steps = 40, batch_size = 16, lr = 1e-3}
test_size = 40
[grid]
variant = ["standard", "mixit"]
"model.n_heads" = [1, 2]
[search]
"train.lr" = [1e-3, 3e-3]
[screen_min_steps]
addition = 15
"""

FULL_YAML = """
name: full
description: every key
seeds: 2
analyze: true
screen_fraction: 0.5
base:
  task: addition
  task_params: {n_digits: 2}
  model: {d_model: 16, n_layers: 1}
  train: {steps: 40, batch_size: 16, lr: 1e-3}   # an exponent: a number, as in TOML
  test_size: 40
grid:
  variant: [standard, mixit]
  model.n_heads: [1, 2]
search:
  train.lr: [1e-3, 3e-3]
screen_min_steps:
  addition: 15
"""


def test_a_yaml_study_file_is_the_study_its_toml_twin_is(tmp_path):
    from mixit.study import planned_runs

    (tmp_path / "full.toml").write_text(FULL_TOML)
    (tmp_path / "full.yml").write_text(FULL_YAML)
    toml, yaml = load_study_file(tmp_path / "full.toml"), load_study_file(tmp_path / "full.yml")
    assert yaml == toml and len(toml.specs) == 2 * 2 * 2  # variants x heads x seeds
    assert yaml.specs[0].request["train"]["lr"] == 1e-3 and yaml.screen_min_steps == {"addition": 15}
    assert all(s.analyze for s in yaml.specs)
    assert yaml.fingerprint() == toml.fingerprint() and yaml.fingerprint(search=False) == toml.fingerprint(False)
    assert [p.id for p in planned_runs(yaml)] == [p.id for p in planned_runs(toml)]  # screening runs included
    assert yaml.rebuild(3, 1) == toml.rebuild(3, 1)  # a study grows alike in either format


@pytest.mark.parametrize(
    "name, text, wanted",
    [
        (
            "s.yaml",
            "name: x\ngrid: [unclosed\n",
            "cannot be parsed: while parsing a flow sequence: expected ',' or ']'",
        ),
        ("s.yml", "name: x\nname: y\n", "cannot be parsed: key 'name' is given twice (at line 2, column 1)"),
        ("s.yaml", "grid:\n  1: [a]\n", "cannot be parsed: key 1 is not a string (at line 2, column 3)"),
        ("s.yaml", "- name\n- grid\n", "must hold a mapping of keys (name, base, grid, ...), got list"),
        ("s.yaml", "name: x\nanalyze: maybe\n", ": analyze must be true or false"),
        ("s.toml", 'name = "x"\nanalyze = "maybe"\n', ": analyze must be true or false"),
        ("s.YAML", "gird: {variant: [mixit]}\n", ": unknown key(s) gird; allowed: name, description, seeds, base"),
        ("s.yaml", b"name: \xff\n", "cannot be parsed: 'utf-8' codec can't decode byte 0xff"),
        ("s.toml", 'name = "a/b"\n', ": name must be a non-empty string usable as one directory name"),
        ("s.yaml", "name: ..\n", "one directory name (no '/' or '\\', not '.' or '..'), got '..'"),
        ("s.toml", 'name = ""\n', ": name must be a non-empty string"),
    ],
)
def test_a_bad_study_file_is_refused_in_one_line_before_anything_is_written(tmp_path, capsys, name, text, wanted):
    path = tmp_path / name
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    assert main(["reproduce", "--study", str(path), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"mixit reproduce: error: study file {path}") and err.count("\n") == 1, err
    assert wanted in err, err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "more, wanted",
    [
        ('[grid]\nvariant = ["standard", "standard"]', "grid key variant lists 'standard' more than once"),
        ('[grid]\n"train.lr" = [0.001, 1e-3]', "grid key train.lr lists 0.001 more than once ([0.001, 0.001])"),
        ('[search]\n"train.lr" = [3e-3, 1e-3, 0.003]', "search key train.lr lists 0.003 more than once"),
    ],
)
def test_a_value_listed_twice_is_refused_not_merged(tmp_path, capsys, more, wanted):
    """The same value twice would be the same run counted as two cells' (or two candidates') evidence."""
    path = tmp_path / "s.toml"
    path.write_text(f'name = "twice"\n[base]\ntask = "addition"\n{more}\n')
    assert main(["reproduce", "--study", str(path), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"mixit reproduce: error: study file {path}: {wanted}") and err.count("\n") == 1, err
    assert not (tmp_path / "out").exists()


def test_a_study_too_big_is_refused_before_it_is_built(tmp_path, capsys):
    """A grid of 10^12 cells, and a preset at 10^8 seeds, are refused at once, naming how many runs they ask for:
    neither is built (building either would not end) and nothing is written. --max-runs raises the cap."""
    path = tmp_path / "big.toml"
    axes = "\n".join(f'"{key}" = {list(range(1, 11))}' for key in [f"task_params.x{i}" for i in range(12)])
    path.write_text(f'name = "big"\n[base]\ntask = "addition"\n[grid]\n{axes}\n')
    for args, least in ((["--study", str(path)], 10**12), (["--preset", "quick", "--seeds", "100000000"], 10**8)):
        assert main(["reproduce", *args, "--out", str(tmp_path / "out")]) == 2
        err = capsys.readouterr().err
        asked = re.search(r"asks for ([\d,]+) runs \(cells x seeds\), above the cap of 10,000", err)
        assert asked and int(asked[1].replace(",", "")) >= least and err.count("\n") == 1, err
        assert f"--max-runs {asked[1].replace(',', '')}" in err and not (tmp_path / "out").exists()
    small = tmp_path / "small.toml"
    small.write_text(STUDY_FILE)
    with pytest.raises(UsageError, match="asks for 2 runs"):
        load_study_file(small, max_runs=1)
    assert len(load_study_file(small, max_runs=2).specs) == 2


def test_the_examples_of_the_study_files_page_load_and_resolve(tmp_path):
    """Every TOML and YAML example of docs/studies.md is a study whose runs resolve; examples of one name (a TOML
    file and its YAML twin) are the same study."""
    from mixit.study import planned_runs

    text = (Path(__file__).resolve().parents[1] / "docs" / "studies.md").read_text()
    blocks = re.findall(r"```(toml|yaml)\n(.*?)```", text, re.S)
    studies = {}
    for i, (kind, body) in enumerate(blocks):
        path = tmp_path / f"example{i}.{kind}"
        path.write_text(body)
        study = load_study_file(path)
        assert planned_runs(study), path  # every run resolved, screening runs included
        studies.setdefault(study.name, []).append(study)
    assert sorted(studies) == ["heads", "induction-heads", "variants"]
    for name, same in studies.items():
        assert all(s == same[0] and s.fingerprint() == same[0].fingerprint() for s in same), name
    assert [len(s) for s in studies.values()] == [2, 2, 1] and len(studies["variants"][0].specs) == 12


def test_the_presets_plan_every_table():
    for preset in ("smoke", "quick", "gpu", "paper"):
        study = paper_study(preset)
        tables = {s.labels["table"] for s in study.specs}
        # Every preset sweeps the number of retrieval pairs too, beyond the paper (no finding reads it).
        assert tables == {"table1", "table2", "table3", "table4", "table5", "table6", "pairs"}
        assert study.extras["signal"]["variants"] == ("standard", "mixit", "random")
    # quick searches the learning rate per variant, and MixiT's heads and width on addition.
    quick = paper_study("quick")
    (mixit_addition,) = [
        s for s in quick.specs if s.labels == {"table": "table3", "task": "addition", "variant": "mixit", "seed": 0}
    ]
    assert set(mixit_addition.search) == {"train.lr", "model.n_heads", "model.d_model"}
    (standard_addition,) = [
        s for s in quick.specs if s.labels == {"table": "table3", "task": "addition", "variant": "standard", "seed": 0}
    ]
    assert set(standard_addition.search) == {"train.lr"}
    assert quick.screen_fraction == 0.2
    assert all(s.request["train"]["early_stop"] for s in quick.specs)
    # The protocol's first look, its sequential design and its budget extensions (docs/protocol.md).
    assert {s.labels["seed"] for s in quick.specs} == {0, 1, 2}
    assert quick.more_seeds is not None and quick.extend == (2, 4)
    assert paper_study("quick", seeds=3).more_seeds is None  # seeds asked for: exactly those
    assert {s.request["test_seed"] for s in paper_study("quick", test_seed=12).specs} == {12}
    planned = plan(paper_study("smoke").specs)
    assert len(planned) < len(paper_study("smoke").specs)  # shared runs are trained once
    with pytest.raises(UsageError, match="unknown preset 'huge'"):
        paper_study("huge")


def test_done_runs_are_skipped_and_interrupted_ones_resumed(tmp_path):
    study = tiny_study()
    out = tmp_path / "study"
    (first, second) = plan(study.specs)
    # A study killed while its first run trained: its study.json written, the run trained to step 4
    # (checkpointed), then stopped. (A directory with runs but no study.json is not a study: refused.)
    out.mkdir()
    write_study(study, out, [first, second], search=True)

    class Stop(Exception):
        pass

    def stop(step, loss):
        if step == 5:
            raise Stop

    from mixit import train

    with pytest.raises(Stop):
        train(first.cfg, out / "runs" / first.id, progress=False, on_step=stop)
    assert state(out, first.id) == "interrupted" and state(out, second.id) == "new"
    tally = execute(study, out, Pool("sequential"), progress=False)
    assert tally["done"] == 2
    summary = json.loads((out / "runs" / first.id / "summary.json").read_text())
    assert summary["resumed_from"] == 4
    stamp = (out / "runs" / second.id / "summary.json").stat().st_mtime_ns
    recorded = json.loads((out / "runs" / second.id / "config.json").read_text())["request"]
    assert recorded == second.cfg.request and resolve(recorded) == second.cfg  # the study's request, not the config
    assert execute(study, out, Pool("sequential"), progress=False)["done"] == 2  # nothing left to do
    assert (out / "runs" / second.id / "summary.json").stat().st_mtime_ns == stamp
    with pytest.raises(UsageError, match="holds another study"):
        execute(tiny_study(variant=["standard", "frozen_qk"]), out, Pool("sequential"), progress=False)


def test_a_study_file_run_from_the_command_line_is_reported_cell_by_cell(tmp_path):
    """A study file's record names its preset "file": not one of the paper's, so no paper checks or tables."""
    (tmp_path / "tiny.toml").write_text(STUDY_FILE)
    out = tmp_path / "study"
    argv = ["reproduce", "--study", str(tmp_path / "tiny.toml"), "--executor", "sequential", "--no-progress"]
    assert main([*argv, "--out", str(out)]) == 0
    report = (out / "report.md").read_text()
    assert report.startswith("# tiny\n") and "paper" not in report
    assert json.loads((out / "checks.json").read_text()) == {}
    rows = [line for line in report.splitlines() if line.startswith("| ")]
    assert rows[0].startswith("| table | variant | seeds done |") and len(rows) == 3  # the header and 2 cells
    assert (
        "![addition curves](figures/curves-addition.png)" in report
        and (out / "figures/curves-addition.png").stat().st_size
    )


def test_a_study_of_your_own_is_reported_cell_by_cell(tmp_path):
    study = Study("tiny", grid(BASE, {"variant": ["standard", "mixit"]}, 2, {"table": "tiny"}))
    out = tmp_path / "study"
    assert execute(study, out, Pool("sequential"), progress=False)["done"] == 4
    result = write_report(out)
    report = (out / "report.md").read_text()
    assert report.startswith("# tiny\n") and "paper" not in report and result["checks"] == {}
    assert json.loads((out / "checks.json").read_text()) == {}
    rows = [line for line in report.splitlines() if line.startswith("| ")]
    assert rows[0].startswith("| table | variant | seeds done | test loss |") and rows[0].endswith("| converged |")
    for variant in ("standard", "mixit"):
        losses = [
            json.loads((out / "runs" / p.id / "summary.json").read_text())["selected"]["test"]["loss"]
            for p in plan(study.specs)
            if p.cfg.variant == variant
        ]
        mean = sum(losses) / 2
        spread = (sum((x - mean) ** 2 for x in losses)) ** 0.5  # the sample std of two values
        assert any(row.startswith(f"| tiny | {variant} | 2/2 | {mean:.4f} ± {spread:.4f} |") for row in rows[1:])


def test_a_failing_run_is_recorded_and_does_not_stop_the_others(tmp_path, monkeypatch):
    study = tiny_study(variant=["standard", "mixit", "frozen_mlp"])
    out = tmp_path / "study"
    doomed = next(p.id for p in plan(study.specs) if p.cfg.variant == "mixit")
    real_train = execute_module.train

    def flaky(cfg, path, **kw):
        if path.name == doomed:
            raise RuntimeError("the GPU fell off the bus")
        return real_train(cfg, path, **kw)

    monkeypatch.setattr(execute_module, "train", flaky)
    tally = execute(study, out, Pool("sequential"), progress=False)
    assert (tally["done"], tally["failed"]) == (2, 1)
    record = json.loads((out / "failed" / f"{doomed}.json").read_text())
    assert "RuntimeError: the GPU fell off the bus" in record["error"]
    assert execute(study, out, Pool("sequential"), progress=False)["skipped_failed"] == 1  # not retried unasked
    monkeypatch.setattr(execute_module, "train", real_train)
    tally = execute(study, out, Pool("sequential"), retry_failed=True, progress=False)
    assert tally["done"] == 3 and not (out / "failed" / f"{doomed}.json").exists()


def test_a_killed_study_resumes_where_it_stopped(tmp_path):
    path = tmp_path / "s.toml"
    path.write_text(STUDY_FILE.replace("steps = 8,", "steps = 400,"))
    out = tmp_path / "study"
    args = [
        sys.executable,
        "-m",
        "mixit.cli",
        "reproduce",
        "--study",
        str(path),
        "--out",
        str(out),
        "--executor",
        "sequential",
        "--no-progress",
    ]
    proc = subprocess.Popen(args, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while time.time() < deadline and not list((out / "runs").glob("*/checkpoints/latest")):
        time.sleep(0.01)  # the kill must land within the run's 390 steps after its first checkpoint
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    interrupted = [
        p.parent.parent.name
        for p in (out / "runs").glob("*/checkpoints/latest")
        if not (p.parent.parent / "summary.json").exists()
    ]
    assert interrupted, "the study was killed before or after its runs; nothing to resume"
    done = subprocess.run(args, env=ENV, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    summary = json.loads((out / "runs" / interrupted[0] / "summary.json").read_text())
    assert summary["resumed_from"] and summary["resumed_from"] > 0 and summary["steps"] == 400


@pytest.mark.parametrize("executor, workers", [("local", 2), ("submitit-local", 0)])
def test_the_pool_and_submitit_executors(tmp_path, executor, workers):
    out = tmp_path / "study"
    tally = execute(tiny_study(), out, Pool(executor, workers), progress=False)
    assert tally["done"] == 2 and tally["failed"] == 0
    assert all(state(out, p.id) == "done" for p in plan(tiny_study().specs))


def test_the_smoke_preset_writes_the_whole_report(tmp_path):
    """The smoke preset end to end (CI runs it): every table, the checks, the CSV and the figures."""
    out = tmp_path / "smoke"
    result = reproduce(ReproduceOptions(preset="smoke", out=out, executor="sequential", progress=False))
    assert result["tally"]["failed"] == 0
    report = (out / "report.md").read_text()
    for heading in (
        "## The paper's findings, checked",
        "## Table 1",
        "## Table 2",
        "## Table 3",
        "## Table 4",
        "## Table 5",
        "## Tables 6-7",
        "## Beyond the paper",
    ):
        assert heading in report, heading
    checks = result["report"]["checks"]
    verdicts = ("PASS", "FAIL", "UNTESTABLE", "UNDECIDED", "n/a", "PROVISIONAL")
    assert len(checks) == len(CHECKS) and all(c["verdict"] in verdicts for c in checks.values())
    assert all(f"**{c['verdict']}**" in report for c in checks.values())
    assert sum(c["verdict"] != "n/a" for c in checks.values()) == len(CHECKS)  # every check had its runs
    rows = list(csv.DictReader((out / "results.csv").open()))
    record = json.loads((out / "study.json").read_text())
    assert len(rows) == len(record["runs"]) and {r["state"] for r in rows} == {"done"}
    assert "model.d_model" in rows[0] and any(k.startswith("test.") for k in rows[0])
    for figure in (
        "curves-addition.png",
        "heads.png",
        "depth.png",
        "signal.png",
        "signal-nosink.png",
        "pairs.png",
        "retrieval-by-pairs.png",
        "induction-frozen_qk-attention.png",
        "induction-over-time-retrieval.png",
        "induction-over-time-induction.png",
    ):
        assert (out / "figures" / figure).stat().st_size > 1000, figure
    # Table 1's runs, analysed, keep log-spaced checkpoints and are analysed over them; the others keep one.
    for planned in record["runs"]:
        run = Run.open(out / "runs" / planned["id"])
        if planned["analyze"]:
            kept = [s for s in log_spaced_steps(run.config.train.steps) if s <= run.checkpoints()[-1]]
            assert set(kept) <= set(run.checkpoints()) and len(kept) > 1, planned["id"]
            assert run.analysis.over_time()["steps"] == run.checkpoints()
        else:
            assert len(run.checkpoints()) == 1 and run.analysis.over_time() is None
    again = write_report(out)  # the report can be written again from the study directory alone
    assert again["checks"] == checks


def test_study_commands_on_the_command_line(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["reproduce", "--list"]) == 0
    listing = capsys.readouterr().out
    assert "smoke" in listing and "quick" in listing and "screening), at most about" in listing
    assert "gpu     about" in listing and "paper   about" in listing  # counted, not resolved: no hub
    for args, message in [
        (["reproduce", "--preset", "huge"], "preset: expected one of smoke, quick, gpu, paper or null"),
        (["reproduce", "--seeds", "0"], "seeds must be a positive integer"),
        (["reproduce", "--executor", "cloud"], "executor: expected one of"),
        (["reproduce", "--study", "missing.toml"], "study file missing.toml does not exist"),
        (["reproduce", "--out", "/proc/study"], "is not writable"),
        (["report", "nowhere"], "nowhere holds no study"),
    ]:
        assert main(args) == 2
        err = capsys.readouterr().err
        assert message in err and len(err.strip().splitlines()) == 1, (args, err)
    assert list(tmp_path.iterdir()) == []
