"""Attention transplants (docs/model.md, "Attention transplants"): a donor run's average pattern as the fixed mixer
of a new model, or its q and k weights frozen in one; exactly the expected trainable parameters; a resume and a
load without the donor; declarations from Python, a config file and the command line, and their refusals in one
line with nothing written."""

import json
import shutil

import pytest
import torch

from mixit import run_config, train
from mixit.cli import main
from mixit.core.experiment import build_model
from mixit.core.models import capture_patterns
from mixit.core.run import Run
from mixit.errors import UsageError
from mixit.study.spec import run_id
from tolerance import assert_close

SHAPE = {"task_params": {"n_digits": 2}, "d_model": 16, "n_heads": 2, "n_layers": 1, "batch_size": 4}
SMALL = {**SHAPE, "steps": 3, "test_size": 8}
FLAGS = ["--task", "addition", "-p", "n_digits=2", "--d-model", "16", "--n-heads", "2", "--n-layers", "1"]
FLAGS += ["--steps", "3", "--batch-size", "4", "--test-size", "8", "--no-progress"]
# Every parameter of the one-layer model, by module path, without the attention's (a softmax model has q and k
# besides v and o; transplant attention, like every input-independent mixer, adds learned position embeddings).
OTHERS = ["embed.weight", "blocks.0.norm1.weight", "blocks.0.norm2.weight", "norm_f.weight", "lm_head.weight"]
OTHERS += [f"blocks.0.mlp.{m}.{p}" for m in ("gate", "up", "down") for p in ("weight", "bias")]
V_O = [f"blocks.0.attn.{m}.{p}" for m in ("v", "o") for p in ("weight", "bias")]
Q_K = [f"blocks.0.attn.{m}.{p}" for m in ("q", "k") for p in ("weight", "bias")]


@pytest.fixture(scope="module")
def donor(tmp_path_factory):
    """A finished softmax run, trained a few steps."""
    path = tmp_path_factory.mktemp("donor") / "run"
    train(run_config("addition", **SMALL), path, progress=False)
    return path


@pytest.fixture(scope="module")
def mixer(tmp_path_factory, donor):
    """A finished pattern transplant from `donor` (a donor without q and k)."""
    path = tmp_path_factory.mktemp("mixer") / "run"
    train(run_config("addition", transplant_from=donor, **SMALL), path, progress=False)
    return path


def donor_average(donor_run, n=512):
    """The donor's patterns averaged by hand over the first n validation examples: (L, H, T, T)."""
    loaded = Run.open(donor_run).load(device="cpu")
    model = loaded.model.eval()
    with torch.no_grad(), capture_patterns(model) as patterns:
        model(loaded.task.val_batch().inputs[:n])
    return torch.stack([patterns[f"blocks.{i}.attn.hook_pattern"].double().mean(0) for i in range(len(patterns))])


def test_has_qk_is_declared_by_exactly_the_kinds_with_q_and_k():
    """A qk transplant asks the kind's declared `has_qk`, not its name: it holds for a kind exactly when each of its
    layers has q and k projections (softmax today, and no input-independent mixer)."""
    from mixit.core.config import ModelConfig
    from mixit.core.models import ATTENTION, Transformer

    for name in ATTENTION:
        attn = Transformer(ModelConfig(vocab_size=4, n_ctx=4, d_model=4, n_heads=1, attention=name)).blocks[0].attn
        has = isinstance(getattr(attn, "q", None), torch.nn.Module) and isinstance(
            getattr(attn, "k", None), torch.nn.Module
        )
        assert ATTENTION.get(name).has_qk == has, name
    assert [name for name in ATTENTION if ATTENTION.get(name).has_qk] == ["softmax"]


def freeze_event(run):
    return next(e for e in Run.open(run).metrics() if e["event"] == "freeze")


def test_a_pattern_transplant_mixes_with_the_donors_average_pattern_after_training(donor, mixer):
    expected = donor_average(donor).float()  # (1, 2, T, T)
    loaded = Run.open(mixer).load(device="cpu")
    T = expected.shape[-1]
    with torch.no_grad(), capture_patterns(loaded.model) as patterns:
        loaded.model(loaded.task.val_batch().inputs[:3])
    got = patterns["blocks.0.attn.hook_pattern"]  # (3, 2, T, T)
    # Two float64 sums of 512 entries in [0, 1], each rounded once to float32.
    assert_close(got, expected[0].expand(3, -1, -1, -1), dtype=torch.float32, terms=2, scale=1.0)
    assert torch.all(got.triu(diagonal=1) == 0)
    assert not torch.allclose(got[0, 0], torch.ones(T, T).tril() / torch.arange(1, T + 1)[:, None])  # not uniform
    # The row beyond the task's inputs (n_ctx is the whole example, an input one token shorter) keeps the uniform
    # causal pattern.
    assert loaded.cfg.model.n_ctx == T + 1
    full = loaded.model.blocks[0].attn.fixed_pattern  # (2, T + 1, T + 1)
    assert torch.equal(full[:, T], torch.full((2, T + 1), 1 / (T + 1)))


def test_a_pattern_transplant_trains_everything_but_its_buffer(mixer):
    event = freeze_event(mixer)
    assert event["frozen"] == {} and event["freeze"] == []
    assert sorted(event["trainable"]) == sorted([*OTHERS, *V_O, "pos_embed.weight"])
    cfg = Run.open(mixer).config
    assert (cfg.model.attention, cfg.transplant_part) == ("transplant", "pattern")
    assert "blocks.0.attn.donor_pattern" in Run.open(mixer).load(device="cpu").model.state_dict()


def test_a_qk_transplant_keeps_the_donors_q_and_k_bit_for_bit_and_trains_the_rest(donor, tmp_path):
    path = tmp_path / "qk"
    cfg = run_config("addition", transplant_from=donor, transplant_part="qk", **SMALL)
    train(cfg, path, progress=False)
    event = freeze_event(path)
    assert sorted(event["frozen"]) == sorted(Q_K)
    assert sorted(event["trainable"]) == sorted([*OTHERS, *V_O])
    assert event["freeze"] == ["blocks.*.attn.q", "blocks.*.attn.k"]
    trained = Run.open(path).load(device="cpu").model.state_dict()
    source = Run.open(donor).load(device="cpu").model.state_dict()
    initial = build_model(cfg, fresh=False)[0].state_dict()  # the same seed's initialisation, without the donor
    for name in Q_K:
        assert torch.equal(trained[name], source[name]), name
        assert not torch.equal(trained[name], initial[name]), name
    for name in [*V_O, "blocks.0.mlp.up.weight", "blocks.0.mlp.down.weight"]:
        assert not torch.equal(trained[name], initial[name]), name


def test_a_transplant_resumes_and_loads_without_its_donor(donor, tmp_path):
    own = tmp_path / "donor"
    shutil.copytree(donor, own)
    cfg = run_config("addition", transplant_from=own, **{**SHAPE, "steps": 4, "checkpoint_every": 2})

    def stop(step, loss):
        if step == 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train(cfg, tmp_path / "run", progress=False, on_step=stop)
    expected = donor_average(own).float()
    shutil.rmtree(own)
    assert main(["train", "--resume", "--out", str(tmp_path / "run"), "--no-progress"]) == 0
    run = Run.open(tmp_path / "run")
    assert run.state() == "done" and run.config.transplant_donor == cfg.transplant_donor
    T = expected.shape[-1]
    pattern = run.load(device="cpu").model.blocks[0].attn.fixed_pattern[:, :T, :T]
    assert_close(pattern, expected[0], dtype=torch.float32, terms=2, scale=1.0)


def test_the_donor_identity_enters_the_run_id_and_a_run_without_one_keeps_its_id(donor):
    plain = run_config("addition", **SMALL)
    assert run_id(plain) == "db2a22f0c93d"  # its id before transplants existed (mixit 3041e2e)
    transplanted = run_config("addition", transplant_from=donor, **SMALL)
    assert transplanted.transplant_donor is not None and len(transplanted.transplant_donor) == 12
    assert transplanted.request["transplant_donor"] == transplanted.transplant_donor
    assert run_id(transplanted) != run_id(plain)
    moved = donor.parent / "copy"
    shutil.copytree(donor, moved)
    assert run_id(run_config("addition", transplant_from=moved, **SMALL)) == run_id(transplanted)  # not its path


def test_a_transplant_from_a_config_file_and_from_flags(donor, tmp_path, capsys):
    (tmp_path / "c.yaml").write_text(
        f"task: addition\ntask_params: {{n_digits: 2}}\nmodel: {{d_model: 16, n_heads: 2, n_layers: 1}}\n"
        f"transplant_from: {donor}\ntransplant_part: qk\n"
    )
    assert main(["train", "--config", str(tmp_path / "c.yaml"), "--print-config"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert (printed["transplant_from"], printed["transplant_part"]) == (str(donor), "qk")
    assert printed["model"]["attention"] == "softmax" and len(printed["transplant_donor"]) == 12
    assert main(["train", *FLAGS, "--transplant-from", str(donor), "--print-config"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert (printed["transplant_part"], printed["model"]["attention"]) == ("pattern", "transplant")


@pytest.fixture
def unfinished(donor, tmp_path):
    path = tmp_path / "unfinished"
    shutil.copytree(donor, path)
    (path / "summary.json").unlink()
    return path


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--transplant-from", "{tmp}/nowhere"], "transplant_from: run directory {tmp}/nowhere does not exist"),
        (
            ["--transplant-from", "{unfinished}"],
            "transplant_from {unfinished} is not a finished run (no summary yet): finish it first "
            "(mixit train --resume --out {unfinished})",
        ),
        (
            ["--transplant-from", "{donor}", "--n-layers", "2", "--n-heads", "4"],
            "transplant_from {donor} differs from this run (donor != this run): n_layers 1 != 2; n_heads 2 != 4",
        ),
        (
            ["--transplant-from", "{donor}", "--transplant-part", "qk", "--d-model", "32"],
            "transplant_from {donor} differs from this run (donor != this run): d_model 16 != 32",
        ),
        (
            ["--transplant-from", "{mixer}", "--transplant-part", "qk"],
            "transplant_part qk takes a donor's q and k, which softmax attention has; {mixer} has transplant attention",
        ),
        (["--transplant-part", "qk"], "transplant_part qk needs transplant_from, the donor run's directory"),
        (
            ["--attention", "transplant"],
            "attention transplant needs transplant_from, the donor run whose average pattern it takes",
        ),
        (
            ["--transplant-from", "{donor}", "--attention", "uniform"],
            "transplant_part pattern makes the attention transplant; it cannot be combined with 'uniform'",
        ),
        (
            ["--transplant-from", "{donor}", "--transplant-part", "qk", "--variant", "mixit"],
            "transplant_part qk needs softmax attention, whose q and k it takes; not 'mixing'",
        ),
    ],
)
def test_the_command_line_refuses_a_bad_transplant_before_any_work(
    tmp_path, capsys, donor, mixer, unfinished, extra, message
):
    names = {"tmp": tmp_path, "donor": donor, "mixer": mixer, "unfinished": unfinished}
    args = [a.format(**names) for a in extra]
    code = main(["train", *FLAGS, *args, "--out", str(tmp_path / "run")])
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    assert err == f"mixit train: error: {message.format(**names)}\n"
    assert not (tmp_path / "run").exists()


def test_a_replayed_transplant_refuses_a_donor_that_is_no_longer_the_one_declared(donor, mixer, tmp_path):
    cfg = Run.open(mixer).config
    moved = tmp_path / "other"
    shutil.copytree(donor, moved)
    config = json.loads((moved / "config.json").read_text())
    config["config"]["train"]["lr"] = 0.5  # another run at the same place
    (moved / "config.json").write_text(json.dumps(config))
    cfg.transplant_from = str(moved)
    with pytest.raises(UsageError, match=f"holds the run [0-9a-f]{{12}}, not the donor {cfg.transplant_donor} "):
        build_model(cfg)


def test_python_refuses_a_donor_of_another_task_naming_what_differs(donor):
    shape = {k: v for k, v in SHAPE.items() if k != "task_params"}
    with pytest.raises(UsageError, match=r"differs from this run \(donor != this run\): task addition != retrieval; "):
        run_config("retrieval", transplant_from=donor, **shape)
