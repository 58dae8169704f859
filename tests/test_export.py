"""`mixit export`: a softmax run as a transformers LlamaForCausalLM with the same logits, loadable
without mixit; any run (MixiT included) through the Hub mixin and back; refusals in one line."""

import dataclasses
import json
import subprocess
import sys

import pytest
import torch
import transformers

from mixit import run_config, train
from mixit.cli import main
from mixit.config import ModelConfig
from mixit.errors import UsageError
from mixit.export import LLAMA_IGNORES, LLAMA_MAPS, LLAMA_NEEDS, export_run, llama_refusal
from mixit.models import Transformer
from mixit.run import Run
from text_fixtures import write_text_corpus
from tolerance import assert_close, forward_terms

SOFTMAX = ("standard", "frozen_qk", "frozen_mlp")
TINY = {"d_model": 32, "n_layers": 2, "n_heads": 2, "steps": 12, "batch_size": 16, "test_size": 64, "val_size": 64}


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Tiny trained runs: every variant on addition, the softmax ones on lm (a local corpus)."""
    root = tmp_path_factory.mktemp("runs")
    corpus = str(write_text_corpus(root / "corpus.txt", n_docs=120))
    lm = {"corpus": corpus, "length": 16, "vocab": 300, "held_out": 0.1}
    out = {}
    for variant in (*SOFTMAX, "mixit"):
        out["addition", variant] = root / f"addition-{variant}"
        train(run_config("addition", variant, {"n_digits": 2}, **TINY), out["addition", variant], progress=False)
    for variant in SOFTMAX:
        out["lm", variant] = root / f"lm-{variant}"
        train(run_config("lm", variant, lm, **TINY), out["lm", variant], progress=False)
    return out


def mixit_logits(run_dir, tokens):
    with torch.no_grad():
        return Run.open(run_dir).load("cpu").model.eval()(tokens)


def probe(run_dir, batch=3):
    cfg = Run.open(run_dir).config.model
    return torch.randint(0, cfg.vocab_size, (batch, cfg.n_ctx), generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("task", ["addition", "lm"])
@pytest.mark.parametrize("variant", SOFTMAX)
def test_llama_export_gives_the_mixit_logits(runs, tmp_path, task, variant):
    out = export_run(runs[task, variant], "hf", tmp_path / "hf")
    llama = transformers.LlamaForCausalLM.from_pretrained(out).eval()
    tokens = probe(runs[task, variant])
    with torch.no_grad():
        theirs = llama(input_ids=tokens).logits
    terms = forward_terms(Run.open(runs[task, variant]).config.model)  # one forward pass, in another order
    assert_close(theirs, mixit_logits(runs[task, variant], tokens), terms=terms)
    card = (out / "README.md").read_text()
    assert f"`{task}`" in card and f"`{variant}`" in card and "test metrics: loss" in card
    frozen = {"standard": "nothing", "frozen_qk": "self_attn.q_proj", "frozen_mlp": "mlp.gate_proj"}[variant]
    assert frozen in card.partition("(never trained):")[2].splitlines()[0]


LOAD_WITHOUT_MIXIT = """
import json, sys
sys.modules["mixit"] = None  # `import mixit` now fails: the directory must not need it
try:
    import mixit
except ImportError:
    pass
else:
    raise SystemExit("mixit was importable")
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
directory, tokens = sys.argv[1], json.loads(sys.argv[2])
model = AutoModelForCausalLM.from_pretrained(directory).eval()
with torch.no_grad():
    logits = model(input_ids=torch.tensor(tokens)).logits
tokenizer = AutoTokenizer.from_pretrained(directory)
print(json.dumps({"class": type(model).__name__, "logits": logits.tolist(),
                  "ids": tokenizer("the cat sat <|pad|> on a mat")["input_ids"],
                  "eos": tokenizer.eos_token_id, "pad": tokenizer.pad_token_id}))
"""


def test_the_llama_directory_loads_without_mixit(runs, tmp_path):
    run = runs["lm", "standard"]
    out = export_run(run, "hf", tmp_path / "hf")
    tokens = probe(run, batch=2)
    env = {"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}  # no PYTHONPATH, no mixit
    done = subprocess.run(
        [sys.executable, "-c", LOAD_WITHOUT_MIXIT, str(out), json.dumps(tokens.tolist())],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["class"] == "LlamaForCausalLM"
    terms = forward_terms(Run.open(run).config.model)
    assert_close(torch.tensor(got["logits"]), mixit_logits(run, tokens), terms=terms)
    tokenizer = Run.open(run).load("cpu").task.tokenizer
    assert got["ids"] == tokenizer.encode("the cat sat <|pad|> on a mat")  # special tokens spelled in text stay text
    assert (got["eos"], got["pad"]) == (tokenizer.eos_id, tokenizer.pad_id)
    generation = json.loads((out / "generation_config.json").read_text())
    assert generation["eos_token_id"] == tokenizer.eos_id and generation["max_length"] == 16


@pytest.mark.parametrize("task, variant", [("addition", "mixit"), ("addition", "frozen_qk"), ("lm", "standard")])
def test_hub_export_round_trips_through_from_pretrained(runs, tmp_path, task, variant):
    out = export_run(runs[task, variant], "hub", tmp_path / "hub")
    model = Transformer.from_pretrained(out)
    assert model.cfg == Run.open(runs[task, variant]).config.model
    tokens = probe(runs[task, variant])
    with torch.no_grad():
        assert torch.equal(model(tokens), mixit_logits(runs[task, variant], tokens))
    assert (out / "tokenizer.json").is_file() == (task == "lm")


def test_from_pretrained_refuses_an_unknown_config_key(runs, tmp_path):
    out = export_run(runs["addition", "mixit"], "hub", tmp_path / "hub")
    config = json.loads((out / "config.json").read_text())
    config["cfg"]["d_modle"] = 8
    (out / "config.json").write_text(json.dumps(config))
    with pytest.raises(UsageError, match="unknown model option"):
        Transformer.from_pretrained(out)


def refused(capsys, argv):
    code = main(argv)
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    return err


def test_mixit_with_to_hf_is_refused_in_one_line(runs, tmp_path, capsys):
    err = refused(capsys, ["export", str(runs["addition", "mixit"]), "--to", "hf", "--out", str(tmp_path / "x")])
    assert "attention='mixing'" in err and "--to hub" in err
    assert not (tmp_path / "x").exists()


def test_a_non_empty_out_is_refused_and_left_alone(runs, tmp_path, capsys):
    out = tmp_path / "full"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    err = refused(capsys, ["export", str(runs["addition", "standard"]), "--to", "hub", "--out", str(out)])
    assert "not empty" in err
    assert [p.name for p in out.iterdir()] == ["keep.txt"]


def test_the_command_writes_into_an_empty_out(runs, tmp_path, capsys):
    out = tmp_path / "empty"
    out.mkdir()
    assert main(["export", str(runs["addition", "standard"]), "--out", str(out)]) == 0
    assert "written to" in capsys.readouterr().out
    assert transformers.AutoConfig.from_pretrained(out).model_type == "llama"


@pytest.mark.parametrize(
    "option, value",
    [
        ("width_scaling", True),
        ("skip_scale", 0.5),
        ("branch_scale", 0.5),
        ("activation", "shaped_leaky_relu"),
        ("head", "classifier"),
        ("attention", "mixing"),
    ],
)
def test_what_llama_cannot_express_is_refused_by_name(option, value):
    cfg = dataclasses.replace(ModelConfig(vocab_size=10, n_ctx=8), **{option: value})
    with pytest.raises(UsageError, match=f"{option}=.*--to hub"):
        llama_refusal(cfg)
    llama_refusal(ModelConfig(vocab_size=10, n_ctx=8, qk_init="paper", seed=3, bias=False))  # no effect or mapped


def test_every_model_option_is_classified_for_the_llama_export():
    """A new ModelConfig option must say whether Llama maps it, needs one value of it, or ignores it."""
    names = [f.name for f in dataclasses.fields(ModelConfig)]
    tables = [*LLAMA_NEEDS, *LLAMA_MAPS, *LLAMA_IGNORES]
    assert sorted(tables) == sorted(names)
