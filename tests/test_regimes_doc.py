"""docs/regimes.md runs as written: every `mixit` command of its shell blocks, in order, in a fresh directory;
each trains what the page says it does (its exact frozen set), prints the kind of line the page quotes, and each
documented refusal prints exactly its line, with exit status 2, and writes nothing."""

import json
import re
import shlex
from pathlib import Path

from mixit.cli import main

DOC = Path(__file__).resolve().parents[1] / "docs" / "regimes.md"
REFUSAL = "# mixit train: error: "


def blocks(language: str) -> list[list[str]]:
    """The logical lines (backslash continuations joined) of each ```LANGUAGE block of the page, in order."""
    found = re.findall(rf"```{language}\n(.*?)```", DOC.read_text(), flags=re.S)
    return [[line.strip() for line in block.replace("\\\n", " ").splitlines() if line.strip()] for block in found]


def steps() -> list[tuple[list[str], str | None]]:
    """Each `mixit` command of the page's shell blocks, with the error line the page prints under it (or None)."""
    out: list[tuple[list[str], str | None]] = []
    for block in blocks("sh"):
        for line in block:
            if line.startswith(REFUSAL):
                assert out and out[-1][1] is None, f"an error line under no command: {line}"
                out[-1] = (out[-1][0], line.removeprefix("# "))
            else:
                args = shlex.split(line)
                assert args[0] == "mixit", f"a shell line that is not a mixit command: {line}"
                out.append((args[1:], None))
    return out


def frozen(run: Path) -> set[str]:
    """The parameters run's freeze report (the first line of its metrics.jsonl) lists as frozen."""
    report = json.loads((run / "metrics.jsonl").read_text().splitlines()[0])
    assert report["event"] == "freeze"
    return set(report["frozen"])


def test_the_page_has_the_sections_it_promises():
    headings = re.findall(r"^## (.+)$", DOC.read_text(), flags=re.M)
    assert headings == [
        "Does retrieval need trained values, or only trained queries?",
        "Which layer's MLP stores the table?",
        "Does a task need input-dependent attention, or only the right fixed pattern?",
        "Is MixiT's particular random matrix special?",
        "The refusals you will meet",
        "In one command: mixit litmus",
        "Every part at once: mixit atlas",
    ]


def test_every_command_of_the_page_runs_as_it_says(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    quoted = [line for block in blocks("text") for line in block]
    printed: list[str] = []
    printed_all = ""  # everything the commands wrote to stdout
    refusals = 0
    for args, error in steps():
        before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
        # A refusal comes before any work; were it lost, one step keeps the test short and still writes a run.
        code = main(args if error is None else [*args, "--steps", "1", "--no-progress"])
        out, err = capsys.readouterr()
        printed_all += out
        if error is None:
            assert code == 0, err[-2000:]
            printed += [line for line in out.splitlines() if "after " in line and "test loss" in line]
        else:
            refusals += 1
            assert (code, err.strip()) == (2, error), args
            assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before, args
    assert refusals == 9
    # Each quoted line is the run's own line, up to the digits of a 2-core CPU: the task, the variant, the steps
    # and the metrics it names.
    assert len(printed) == len(quoted) == 12
    for got, doc in zip(printed, quoted):
        assert got.split(" test loss ")[0] == doc.split(" test loss ")[0]
        assert re.findall(r"[a-z_]+(?= \d)", got) == re.findall(r"[a-z_]+(?= \d)", doc)

    runs = tmp_path / "runs"
    layers = (0, 1)
    assert frozen(runs / "ret") == set()
    assert frozen(runs / "ret-frozen-v") == {f"blocks.{i}.attn.v.{p}" for i in layers for p in ("weight", "bias")}
    qk = {f"blocks.{i}.attn.{m}.{p}" for i in layers for m in "qk" for p in ("weight", "bias")}
    assert frozen(runs / "ret-frozen-qk") == qk == frozen(runs / "ret-qk")
    for i in layers:
        mlp = {f"blocks.{i}.mlp.{m}.{p}" for m in ("gate", "up", "down") for p in ("weight", "bias")}
        assert frozen(runs / f"mem-frozen-mlp{i}") == mlp
    for run in ("ret-pattern", "ret-mixit", "ret-randformer", "ret-uniform", "ret-synthesizer"):
        assert frozen(runs / run) == set(), run  # their fixed patterns are buffers, not frozen parameters
    trainable = json.loads((runs / "ret-synthesizer" / "metrics.jsonl").read_text().splitlines()[0])["trainable"]
    assert {f"blocks.{i}.attn.mixing_logits" for i in layers} <= set(trainable)
    config = json.loads((runs / "ret-pattern" / "config.json").read_text())
    assert config["config"]["model"]["attention"] == "transplant"
    litmus = json.loads((runs / "litmus-retrieval" / "litmus.json").read_text())  # the last section's command
    assert sorted(path.name for path in (runs / "litmus-retrieval" / "runs").iterdir()) == [
        f"{arm}-seed{s}" for arm in ("mixit", "standard", "transplant") for s in (0, 1)
    ]
    assert litmus["answer"] in printed_all
