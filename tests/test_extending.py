"""docs/extending.md is true: its example attention kind, variant, task and
table of the study are written to disk from the page itself, imported, and
trained with, through the Python API, the command line and `mixit reproduce`."""

import importlib
import json
import re
import sys
from pathlib import Path

import pytest

from mixit import ModelConfig, run_config, train
from mixit.catalogue import catalogue
from mixit.cli import main
from mixit.core.freezing import VARIANTS
from mixit.core.models.attention import ATTENTION
from mixit.core.tasks import TASKS
from mixit.study import paper_study, write_report
from mixit.study.executors import Pool, execute
from mixit.study.spec import Study
from mixit.study.tables import TABLES

DOC = Path(__file__).resolve().parents[1] / "docs" / "extending.md"
TINY = [
    "--d-model",
    "32",
    "--n-heads",
    "2",
    "--n-layers",
    "1",
    "--steps",
    "4",
    "--batch-size",
    "8",
    "--test-size",
    "20",
    "--no-progress",
]


@pytest.fixture
def examples(tmp_path, monkeypatch):
    """Import every `# file:` block of docs/extending.md, in order, registering
    into copies of the registries that are thrown away after the test (the list
    of tables is restored)."""
    for registry in (ATTENTION, VARIANTS, TASKS):
        monkeypatch.setattr(registry, "_items", dict(registry._items))
    tables = list(TABLES)
    blocks = re.findall(r"```python\n# file: (\S+)\n(.*?)```", DOC.read_text(), flags=re.S)
    assert [Path(p).name for p, _ in blocks] == ["previous.py", "frozen_attention.py", "copy.py", "copying.py"]
    monkeypatch.syspath_prepend(str(tmp_path))
    names = ["extending_example_" + Path(path).stem for path, _ in blocks]
    for name, (_, code) in zip(names, blocks):
        (tmp_path / f"{name}.py").write_text(code)
        importlib.import_module(name)
    yield tmp_path
    TABLES[:] = tables
    for name in names:
        sys.modules.pop(name, None)


def test_the_examples_register_and_train(examples):
    assert "previous" in ATTENTION and "frozen_attention" in VARIANTS and "copy" in TASKS
    listing = catalogue()
    assert listing["tasks"]["copy"]["parameters"]["length"] == {"default": 8, "type": "int", "doc": "Tokens to copy."}
    assert "previous" in listing["attention_kinds"]
    cfg = run_config(
        "copy",
        "frozen_attention",
        {"length": 5},
        d_model=32,
        n_heads=2,
        n_layers=1,
        steps=4,
        batch_size=8,
        test_size=20,
    )
    summary = train(cfg, examples / "run", progress=False)
    assert set(summary["test"]) == {"loss", "token_acc", "exact_match", "loss_se", "token_acc_se", "exact_match_se"}
    frozen = json.loads((examples / "run" / "metrics.jsonl").read_text().splitlines()[0])["frozen"]
    assert sorted({name.split(".")[-2] for name in frozen}) == ["k", "o", "q", "v"]
    model = run_config("copy", "random", {"length": 5}, attention="previous").model
    assert isinstance(model, ModelConfig) and model.attention == "previous"


def test_the_examples_on_the_command_line(examples, capsys):
    run = examples / "cli"
    assert (
        main(
            [
                "train",
                "--task",
                "copy",
                "-p",
                "length=6",
                "--variant",
                "random",
                "--attention",
                "previous",
                *TINY,
                "--out",
                str(run),
            ]
        )
        == 0
    )
    assert main(["analyze", str(run), "--batch", "4"]) == 0  # the previous-token pattern goes through the hook
    capsys.readouterr()
    for args, message in [
        (
            ["-p", "length=twelve"],
            "task parameter length must be int, got 'twelve'",
        ),
        (["-p", "length=0"], "length must be an integer >= 1, got 0"),
        (
            ["--schedule", "step"],
            "train.schedule: expected one of cosine, linear or constant, got 'step'",
        ),
    ]:
        assert main(["train", "--task", "copy", *args, "--out", str(examples / "bad")]) == 2
        assert message in capsys.readouterr().err
    assert not (examples / "bad").exists()


def test_the_example_table_is_planned_trained_and_reported(examples):
    copying = sys.modules["extending_example_copying"]
    assert "copying" not in {s.labels["table"] for s in paper_study("smoke").specs}
    TABLES.append(copying.TABLE)  # what its name in NAMES of src/mixit/study/tables/__init__.py does
    study = paper_study("smoke")
    runs = study.labelled(table="copying")
    assert sorted(s.labels["variant"] for s in runs) == ["mixit", "standard"]
    out = examples / "study"
    execute(Study(study.name, runs, preset="smoke"), out, Pool("sequential"), progress=False)
    result = write_report(out)
    assert "## Copying: MixiT against the standard model" in (out / "report.md").read_text()
    check = result["checks"]["MixiT within 5 points of the standard model on copying"]
    assert check["verdict"] == "PROVISIONAL" and check["seeds"] == 1  # one seed decides nothing
