"""The atlas (docs/atlas.md): its grid freezes exactly the parts it names, a transplant joins the study a stage
after its donor (searched like any cell), a study file may grid over transplant options, the map's words follow
the paper's rule from the bounds, seeds are added only where a word is undecided, and every entry point refuses bad
input in one line, exit 2, writing nothing."""

import json
import re
import shlex
from pathlib import Path

import pytest

from mixit.cli import main
from mixit.core.experiment import build, resolve
from mixit.core.run import Run
from mixit.core.training.loop import train
from mixit.core.transplant import donor_id
from mixit.study import ReproduceOptions, atlas_study, reproduce
from mixit.study.atlas import PARTS, TOLERANCE, atlas_map, parts_of
from mixit.study.collect import collect
from mixit.study.executors import Pool, execute, run_dir
from mixit.study.presets import PRESETS
from mixit.study.spec import RunSpec, Study, load_study_file, seeded

DOC = Path(__file__).resolve().parents[1] / "docs" / "atlas.md"
SMOKE = PRESETS["smoke"].tasks["addition"]


def names(params) -> set[str]:
    return {n for n, _ in params}


def test_each_regime_freezes_exactly_its_part():
    """Frozen alone: exactly the part's tensors frozen; alone: exactly them trainable; the parts cover the model."""
    study = atlas_study(["addition"], "smoke", seeds=1)
    assert parts_of(SMOKE) == [p for p in PARTS if p != "pos"]  # rotary attention learns no positions
    _, model, _ = build(resolve(SMOKE))
    every = names(model.named_parameters())
    prefixes = {
        "embed": ("embed.",),
        "qk": (".attn.q.", ".attn.k."),
        "v": (".attn.v.",),
        "o": (".attn.o.",),
        "mlp": (".mlp.",),
        "norms": ("norm",),
        "head": ("lm_head.",),
    }
    covered = set()
    for part, marks in prefixes.items():
        mine = {n for n in every if any(m in n or n.startswith(m) for m in marks)}
        covered |= mine
        (frozen,) = study.labelled(regime="frozen", part=part)
        (alone,) = study.labelled(regime="alone", part=part)
        _, _, report = build(resolve(frozen.request))
        assert set(report.frozen) == mine
        _, _, report = build(resolve(alone.request))
        assert set(report.trainable) == mine
    assert covered == every
    (transplant,) = study.labelled(regime="transplant")
    standard = {"table": "atlas", "task": "addition", "regime": "standard", "variant": "standard", "seed": 0}
    assert transplant.donor == standard


def test_the_paper_study_is_unmoved():
    from mixit.study.paper import paper_study

    assert paper_study("quick").fingerprint() == "fb6a26c4c43f899a"


def tiny(lr: float, **more) -> dict:
    return seeded({**SMOKE, "train": {**SMOKE["train"], "steps": 8, "lr": lr}, **more}, 0)


def test_a_transplant_is_searched_a_stage_after_its_donor(tmp_path):
    """The donor's search chooses, the donor trains, then the transplant is planned with that run as its
    transplant_from, and searched in turn; again, nothing is trained twice."""
    search = {"train.lr": (1e-3, 3e-3)}
    donor = {"table": "t", "variant": "standard", "seed": 0}
    specs = [
        RunSpec(tiny(1e-3), donor, search=search),
        RunSpec(tiny(1e-3, transplant_part="pattern"), {"table": "t", "variant": "transplant", "seed": 0}, False,
                search, donor),
    ]  # fmt: skip
    study = Study("staged", specs)
    tally = execute(study, tmp_path, Pool("sequential"), progress=False)
    assert tally["failed"] == 0
    record = json.loads((tmp_path / "study.json").read_text())
    finals = [r for r in record["runs"] if r["role"] == "final"]
    screens = [r for r in record["runs"] if r["role"] == "screen"]
    (standard,) = [r for r in finals if r["labels"][0]["variant"] == "standard"]
    (transplant,) = [r for r in finals if r["labels"][0]["variant"] == "transplant"]
    assert transplant["config"]["transplant_from"] == str(run_dir(tmp_path, standard["id"]).resolve())
    assert transplant["config"]["model"]["attention"] == "transplant"
    assert transplant["config"]["transplant_donor"] == donor_id(Run.open(run_dir(tmp_path, standard["id"])).config)
    pattern = [s for s in screens if s["config"]["model"]["attention"] == "transplant"]
    assert pattern and len(pattern) < len(screens)  # the donor's search, then the transplant's
    assert {s["config"]["transplant_from"] for s in pattern} == {transplant["config"]["transplant_from"]}
    grid = [s for s in pattern if s["labels"][0]["rung"] == 0 and "extends" not in s["labels"][0]]
    assert {s["config"]["train"]["lr"] for s in grid} == {1e-3, 3e-3}
    again = execute(study, tmp_path, Pool("sequential"), progress=False)
    assert again["done"] == len(record["runs"])


def test_a_study_file_grids_over_transplant_options(tmp_path):
    """A study file's grid over transplant_part: one run takes the donor's pattern, the other its q and k."""
    donor = tmp_path / "donor"
    train(resolve(tiny(1e-3)), donor, progress=False)
    path = tmp_path / "parts.toml"
    path.write_text(
        f'name = "parts"\n[base]\ntask = "addition"\ntransplant_from = "{donor}"\n'
        "task_params = {n_digits = 2}\nmodel = {d_model = 32, n_heads = 2, n_layers = 1}\n"
        "train = {steps = 8, batch_size = 32}\ntest_size = 100\n"
        '[grid]\ntransplant_part = ["pattern", "qk"]\n'
    )
    out = tmp_path / "study"
    reproduce(ReproduceOptions(study=path, out=out, executor="sequential", progress=False))
    runs = {r.labels[0]["transplant_part"]: r for r in collect(out).final}
    assert set(runs) == {"pattern", "qk"} and all(r.state == "done" for r in runs.values())
    assert runs["pattern"].config["model"]["attention"] == "transplant"
    assert runs["qk"].config["model"]["attention"] == "softmax"
    identity = donor_id(Run.open(donor).config)
    assert {r.config["transplant_donor"] for r in runs.values()} == {identity}
    report = json.loads((run_dir(out, runs["qk"].id) / "metrics.jsonl").read_text().splitlines()[0])
    assert {n for n in report["frozen"]} == {"blocks.0.attn.q.weight", "blocks.0.attn.q.bias",
                                             "blocks.0.attn.k.weight", "blocks.0.attn.k.bias"}  # fmt: skip


def test_the_file_form_is_the_commands_study(tmp_path):
    path = tmp_path / "atlas.toml"
    path.write_text('name = "atlas-smoke"\nseeds = 3\n[atlas]\ntasks = ["addition", "dyck"]\npreset = "smoke"\n')
    from_file = load_study_file(path)
    assert from_file.fingerprint() == atlas_study(["addition", "dyck"], "smoke", 3).fingerprint()


@pytest.mark.parametrize(
    ("text", "line"),
    [
        ('[atlas]\ntasks = ["lm"]\n', "'lm' is not one"),
        ('[atlas]\ntasks = ["addition"]\n[grid]\nvariant = ["mixit"]\n', "an atlas takes only"),
        ('[atlas]\ntasks = ["addition"]\npreset = "gpu"\n', "atlas.preset must be one of smoke, quick"),
        ('[atlas]\ntasks = "addition"\n', "atlas.tasks must list the tasks"),
        ('[atlas]\ntasks = ["addition"]\nsize = 3\n', "atlas: unknown key(s) size"),
    ],
)
def test_a_bad_atlas_file_is_refused(tmp_path, capsys, text, line):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    out = tmp_path / "out"
    assert main(["reproduce", "--study", str(path), "--out", str(out), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert line in err and len(err.strip().splitlines()) == 1
    assert not out.exists()


@pytest.mark.parametrize(
    ("args", "line"),
    [
        ([], "an atlas needs one task or more"),
        (["--task", "sentiment"], "'sentiment' is not one"),
        (["--task", "dyck", "--task", "dyck"], "list each once"),
        (["--task", "dyck", "--preset", "paper"], "preset: expected one of smoke or quick"),
        (["--task", "dyck", "--seeds", "0"], "seeds must be a positive integer"),
        (["--task", "dyck", "--max-runs", "3"], "above the cap of 3"),
        (["--task", "dyck", "--executor", "slurm"], "--executor slurm needs Slurm"),
    ],
)
def test_bad_atlas_commands_are_refused(tmp_path, capsys, args, line):
    out = tmp_path / "out"
    assert main(["atlas", *args, "--out", str(out), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert line in err and len(err.strip().splitlines()) == 1
    assert not out.exists()


# -- docs/atlas.md, run as written --------------------------------------------------------------------


def commands() -> list[tuple[list[str], str | None]]:
    """Each `mixit` command of the page's shell blocks, with the error line printed under it (or None)."""
    found: list[tuple[list[str], str | None]] = []
    for block in re.findall(r"```sh\n(.*?)```", DOC.read_text(), flags=re.S):
        for line in (x.strip() for x in block.replace("\\\n", " ").splitlines() if x.strip()):
            if line.startswith("# mixit "):
                found[-1] = (found[-1][0], line.removeprefix("# "))
            else:
                args = shlex.split(line)
                assert args[0] == "mixit", line
                found.append((args[1:], None))
    return found


def test_the_page_runs_as_written(tmp_path, monkeypatch, capsys):
    """Every command of docs/atlas.md in order, in a fresh directory (its study file written from the page): each
    refusal prints its line with exit 2, the smoke atlas writes its map, and the study file finds it done."""
    monkeypatch.chdir(tmp_path)
    (toml,) = re.findall(r"```toml\n(.*?)```", DOC.read_text(), flags=re.S)
    Path("atlas.toml").write_text(toml)
    for args, refusal in commands():
        status = main(args)
        captured = capsys.readouterr()
        if refusal is not None:
            assert (status, captured.err.strip()) == (2, refusal)
            continue
        assert status == 0, captured.err
    study = collect(Path("runs/atlas-smoke"))
    assert study.final and all(r.state == "done" for r in study.final)
    assert "## The atlas: which parts each task needs" in Path("runs/atlas-smoke/report.md").read_text()
    assert Path("runs/atlas-smoke/figures/atlas-drop.png").exists()
    assert Path("runs/atlas-smoke/figures/atlas-reach.png").exists()
    found = atlas_map(study)
    assert {c["regime"] for c in found["cells"]} == {"frozen", "alone", "mixit", "transplant"}
    for cell in found["cells"]:  # the word is what the bounds say, by the rule
        gap = cell["gap"]
        needed, fine = ("not enough", "enough") if cell["regime"] == "alone" else ("needed", "not needed")
        if gap["low"] is not None and gap["low"] > TOLERANCE:
            assert cell["word"] == needed
        elif gap["high"] is not None and gap["high"] < TOLERANCE:
            assert cell["word"] == fine
        else:
            assert cell["word"] == "undecided"
    for r in study.final:  # each transplant's donor is its own seed's standard run
        if r.labels[0]["regime"] == "transplant":
            donor = Run.open(Path(r.config["transplant_from"]))
            assert donor.config.model.seed == r.labels[0]["seed"] == r.config["model"]["seed"]
            assert Path(r.config["transplant_from"]).parent == (Path("runs/atlas-smoke") / "runs").resolve()


def test_the_sequential_design_adds_seeds_to_the_cells_of_undecided_words_only(monkeypatch):
    """The atlas's `more_seeds` is the paper study's (docs/protocol.md) with the map's words as its parts: after the
    first look, the two cells an undecided word reads (its regime and the standard model) get seeds 3 and 4; the
    cells of decided words get none. Judged on hand-made results (no training)."""
    from mixit.core.tasks import TASKS
    from mixit.study import paper
    from mixit.study.collect import Result, StudyResults

    study = atlas_study(["addition"], "quick")
    _, key, scale = TASKS["addition"].report_metric
    undecided = {"regime": "frozen", "part": "mlp"}
    results = []
    for spec in study.specs:
        labels, seed = spec.labels, spec.labels["seed"]
        spread = all(labels.get(k) == v for k, v in undecided.items())
        value = [99.0, 60.0, 99.0][seed] if spread else 99.0 + 0.01 * seed  # points of accuracy
        results.append(
            Result(
                id=f"{labels['regime']}-{labels.get('part', '')}-{seed}",
                labels=[dict(labels)],
                config={"task": "addition", "task_params": {}, "train": {"steps": 100}},
                state="done",
                test={key: value / scale},
                convergence={"metric": key, "converged": True, "reason": "plateau", "steps_trained": 100},
            )
        )
    monkeypatch.setattr(paper, "collect", lambda study_dir: StudyResults(results))
    assert study.more_seeds is not None
    asked = study.more_seeds("unused")
    added = {(s.labels["regime"], s.labels.get("part"), s.labels["seed"]) for s in asked if s.labels["seed"] >= 3}
    assert added == {(r, p, seed) for r, p in (("standard", None), ("frozen", "mlp")) for seed in (3, 4)}
    first = {(s.labels["regime"], s.labels.get("part"), s.labels["seed"]) for s in study.specs}
    assert first <= {(s.labels["regime"], s.labels.get("part"), s.labels["seed"]) for s in asked}
