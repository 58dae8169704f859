"""Using an export where a run is used: `mixit eval` and `mixit analyze` take an exported directory (either format)
and give the numbers of the run it was exported from; what an export cannot give is refused in one line; an
export of a plugin's variant loads, evaluates and analyses without the plugin."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import mixit
from mixit import run_config, train
from mixit.cli import main
from mixit.core.freezing import VARIANTS
from mixit.core.run import Analysis, Run
from mixit.export import export_run
from mixit.plugins import ENV
from tolerance import assert_close

TINY = {"d_model": 16, "n_layers": 2, "n_heads": 2, "steps": 6, "batch_size": 16, "test_size": 40, "val_size": 40}


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """A tiny frozen_qk run on addition (softmax, so both formats apply; frozen parts to carry) and its exports."""
    root = tmp_path_factory.mktemp("exports")
    run = root / "run"
    train(run_config("addition", "frozen_qk", {"n_digits": 2}, **TINY), run, progress=False)
    return {"run": run, **{to: export_run(run, to, root / to) for to in ("hf", "hub")}}


def said(capsys, argv):
    """The exit status of `mixit ARGV`, its stdout and its stderr."""
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def listing(directory):
    return sorted(str(p.relative_to(directory)) for p in directory.rglob("*"))


@pytest.mark.parametrize("to", ["hf", "hub"])
def test_eval_of_an_export_gives_the_metrics_of_its_run(exported, capsys, to):
    code, out, _ = said(capsys, ["eval", exported["run"], "--device", "cpu"])
    assert code == 0
    of_run = json.loads(out)
    before = listing(exported[to])
    code, out, _ = said(capsys, ["eval", exported[to], "--device", "cpu"])
    assert code == 0
    of_export = json.loads(out)
    assert (of_export["task"], of_export["variant"]) == (of_run["task"], of_run["variant"])
    # The same weights through the same arithmetic on the same test set (rebuilt from the recorded config): a loss
    # is a mean, so at most one rounding of float32 apart, and the counts of trainable parameters are equal.
    assert_close(of_export["test"], of_run["test"], dtype=torch.float32, terms=1)
    assert listing(exported[to]) == before  # nothing written into the export


@pytest.mark.parametrize("to", ["hf", "hub"])
def test_analyze_of_an_export_gives_the_analysis_of_its_run(exported, tmp_path, capsys, to):
    assert said(capsys, ["analyze", exported["run"], "--device", "cpu", "--batch", "8"])[0] == 0
    before = listing(exported[to])
    out = tmp_path / "analysis"
    code, printed, _ = said(capsys, ["analyze", exported[to], "--device", "cpu", "--batch", "8", "--out", out])
    assert code == 0 and f"written to {out}" in printed
    assert listing(exported[to]) == before
    ours, theirs = Run.open(exported["run"]).analysis, Analysis(out)
    assert set(listing(out)) == set(listing(ours.path))
    # Scores and similarities are means over the same arithmetic on the same inputs: a rounding apart at most.
    for name in ("head_scores", "signal"):
        mine, run = getattr(theirs, name)(), getattr(ours, name)()
        assert_close(flat(mine), flat(run), dtype=torch.float32, terms=1, msg=name)


def flat(value, prefix=""):
    """The numbers of a nested JSON value, by path (None and text left out)."""
    if isinstance(value, dict):
        return {k: v for key, item in value.items() for k, v in flat(item, f"{prefix}{key}.").items()}
    if isinstance(value, list):
        return {k: v for i, item in enumerate(value) for k, v in flat(item, f"{prefix}{i}.").items()}
    return {prefix: value} if isinstance(value, (int, float)) and not isinstance(value, bool) else {}


@pytest.mark.parametrize(
    "extra, message",
    [
        ([], "is an exported model, whose directory is left as exported: give --out DIR"),
        (["--out", "{out}", "--over-time"], "--over-time needs a run's checkpoints"),
    ],
)
def test_analyze_refuses_what_an_export_cannot_give_in_one_line(exported, tmp_path, capsys, extra, message):
    before = listing(exported["hub"])
    argv = ["analyze", exported["hub"], *(str(a).format(out=tmp_path / "out") for a in extra)]
    code, out, err = said(capsys, argv)
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1 and message in err, err
    assert "Traceback" not in err and "analyse the run directory it was exported from" in err
    assert listing(exported["hub"]) == before and not (tmp_path / "out").exists()


def test_a_missing_source_is_refused_naming_both_readings(tmp_path, capsys):
    code, _, err = said(capsys, ["eval", tmp_path / "nowhere"])
    assert code == 2 and f"run directory {tmp_path / 'nowhere'} does not exist, and no Hub model" in err


# -- a plugin's variant -----------------------------------------------------------------------------------------

PLUGIN = """
from mixit.core.freezing import VARIANTS, Variant

VARIANTS.add("frozen_vo", Variant("frozen_vo", "softmax", ("blocks.*.attn.v", "blocks.*.attn.o"),
                                  "v and o frozen, from a plugin"))
"""

PLUGGED = """
import contextlib, io, json, sys
from mixit.cli import main

exports = [["export", "run", "--to", to, "--out", to] for to in ("hub", "hf")]
for argv in (sys.argv[1:], *exports):
    assert main(argv) == 0, argv
said = io.StringIO()
with contextlib.redirect_stdout(said):
    assert main(["eval", "run", "--device", "cpu"]) == 0
print("\\n" + json.dumps(json.loads(said.getvalue())["test"]))
"""

UNPLUGGED = """
import contextlib, io, json
import mixit
from mixit.cli import main

got = {}
refusal = io.StringIO()
with contextlib.redirect_stderr(refusal):
    got["run"] = (main(["eval", "run"]), refusal.getvalue())
for to in ("hub", "hf"):
    loaded = mixit.load(to)
    frozen = [n for n, p in loaded.model.named_parameters() if not p.requires_grad]
    said = io.StringIO()
    with contextlib.redirect_stdout(said):
        code = main(["eval", to, "--device", "cpu"])
    got[to] = {"variant": loaded.cfg.variant, "frozen": frozen, "registered": "frozen_vo" in mixit.VARIANTS,
               "code": code, "test": json.loads(said.getvalue())["test"]}
print("\\n" + json.dumps(got))
"""


def mixit_process(script, args, cwd, **env):
    """`script` run with `args` by a fresh Python in `cwd` running this mixit, offline, with `env` added and no
    plugin unless `env` names one: what it printed last (JSON)."""
    environment = {k: v for k, v in os.environ.items() if k != ENV}
    source = str(Path(mixit.__file__).parents[1])  # the mixit under test, wherever the process starts
    paths = [source, *filter(None, environment.get("PYTHONPATH", "").split(os.pathsep))]
    environment.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", PYTHONPATH=os.pathsep.join(paths), **env)
    done = subprocess.run(
        [sys.executable, "-c", script, *args], cwd=cwd, env=environment, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_an_export_of_a_plugin_variant_needs_no_plugin(tmp_path):
    """Trained, exported both ways and evaluated in a process with the plugin; then, in one without it, the run is
    refused but its exports load and evaluate. Two processes, each doing its part through `mixit.cli.main`."""
    (tmp_path / "my_variant.py").write_text(PLUGIN)
    tiny = ["--task", "addition", "-p", "n_digits=2", "--d-model", "16", "--n-heads", "2", "--n-layers", "1"]
    tiny += ["--steps", "3", "--batch-size", "8", "--test-size", "20", "--no-progress"]
    train = ["train", "--variant", "frozen_vo", *tiny, "--out", "run"]
    expected = mixit_process(PLUGGED, train, tmp_path, **{ENV: "my_variant.py"})
    got = mixit_process(UNPLUGGED, [], tmp_path)
    # Without the plugin the run itself is refused: the variant is truly unknown in this process...
    code, err = got["run"]
    assert code == 2 and "unknown variant 'frozen_vo'" in err
    for to in ("hub", "hf"):
        # ... but its exports load, with exactly what the variant froze frozen, and the name lent back.
        report = got[to]
        assert report["variant"] == "frozen_vo" and not report["registered"] and report["code"] == 0
        assert set(report["frozen"]) == {f"blocks.0.attn.{m}.{w}" for m in ("v", "o") for w in ("weight", "bias")}
        # The same weights through the same arithmetic: a rounding of float32 apart at most.
        assert_close(report["test"], expected, dtype=torch.float32, terms=1)


def test_a_lent_variant_is_gone_once_read(exported):
    """The name an export's unknown variant stands in under is not left registered, so a plugin loaded later
    registers its own definition without a clash."""
    names = VARIANTS.names()
    config = exported["hub"] / "config.json"
    data = json.loads(config.read_text())
    data["mixit_export"]["variant"] = data["mixit_export"]["run"]["config"]["variant"] = "not_here"
    config.write_text(json.dumps(data))
    try:
        loaded = mixit.load(exported["hub"])
    finally:
        data["mixit_export"]["variant"] = data["mixit_export"]["run"]["config"]["variant"] = "frozen_qk"
        config.write_text(json.dumps(data))
    assert loaded.cfg.variant == "not_here" and VARIANTS.names() == names
    frozen = {n for n, p in loaded.model.named_parameters() if not p.requires_grad}
    assert frozen == {f"blocks.{i}.attn.{m}.{w}" for i in range(2) for m in ("q", "k") for w in ("weight", "bias")}
