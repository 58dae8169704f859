"""`mixit export`: a softmax run as a transformers LlamaForCausalLM with the same logits, loadable
without mixit; any run (MixiT included) through the Hub mixin and back; refusals in one line."""

import ast
import dataclasses
import json
import re
import shutil
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
import transformers

import mixit
from hub_server import Hub
from mixit import run_config, train
from mixit.cli import main
from mixit.core.config import ModelConfig
from mixit.core.models import Transformer
from mixit.core.run import Run
from mixit.errors import DamagedFile, UsageError
from mixit.export import LLAMA_FREE, LLAMA_NEEDS, export_run, llama_refusal
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
    for variant in ("standard", "mixit"):  # a classifier: causal softmax, and MixiT reading the whole text
        out["sentiment", variant] = root / f"sentiment-{variant}"
        params = {"dataset": "movies", "length": 16, "vocab": 300}
        train(run_config("sentiment", variant, params, **TINY), out["sentiment", variant], progress=False)
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


WITHOUT_MIXIT = """
import sys
# `import mixit` now fails, and so does importing what mixit needs beyond transformers: the directory must not need it
for name in ("mixit", "docstring_parser", "jsonargparse", "scipy", "matplotlib"):
    sys.modules[name] = None
try:
    import mixit
except ImportError:
    pass
else:
    raise SystemExit("mixit was importable")
"""

LOAD_WITHOUT_MIXIT = (
    WITHOUT_MIXIT
    + """
import json
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
)


def python_without_mixit(script: str, args: list[str], tmp_path: Path) -> str:
    """The output of `script` run with `args` by this Python with no mixit on its path (no PYTHONPATH, HOME in
    `tmp_path`, nothing on stdin: a question transformers asks is answered no)."""
    env = {"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-c", script, *args],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=tmp_path,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def without_mixit(script: str, out: Path, tokens: torch.Tensor, tmp_path: Path) -> dict:
    """What `script` prints last (JSON), run on the export `out` and `tokens` by this Python with no mixit on
    its path (`python_without_mixit`)."""
    said = python_without_mixit(script, [str(out), json.dumps(tokens.tolist())], tmp_path)
    return json.loads(said.strip().splitlines()[-1])


def test_the_llama_directory_loads_without_mixit(runs, tmp_path):
    run = runs["lm", "standard"]
    out = export_run(run, "hf", tmp_path / "hf")
    tokens = probe(run, batch=2)
    got = without_mixit(LOAD_WITHOUT_MIXIT, out, tokens, tmp_path)
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
    """A new ModelConfig option must say whether Llama needs one value of it or takes any."""
    names = [f.name for f in dataclasses.fields(ModelConfig)]
    tables = [*LLAMA_NEEDS, *LLAMA_FREE]
    assert sorted(tables) == sorted(names)


# -- what an export carries, and loading it back ---------------------------------------------


@pytest.mark.parametrize("to, variant", [("hub", "mixit"), ("hf", "frozen_qk")])
def test_an_export_carries_its_task_variant_and_run(runs, tmp_path, to, variant):
    run = Run.open(runs["addition", variant])
    out = export_run(run.path, to, tmp_path / to)
    meta = json.loads((out / "config.json").read_text())["mixit_export"]
    assert (meta["format"], meta["task"], meta["variant"]) == (to, "addition", variant)
    assert meta["params"] == run.config.params.to_dict() and meta["model"] == run.config.model.to_dict()
    assert meta["run"] == json.loads(run.config_path.read_text())  # the whole record: the model rebuilds with its task
    assert meta["test"] == run.summary()["test"]


@pytest.mark.parametrize(
    "task, variant, to",
    [
        ("addition", "mixit", "hub"),
        ("addition", "frozen_qk", "hf"),
        ("lm", "standard", "hub"),
        ("lm", "frozen_mlp", "hf"),
    ],
)
def test_load_gives_the_model_back_with_its_task(runs, tmp_path, task, variant, to):
    out = export_run(runs[task, variant], to, tmp_path / to)
    loaded = mixit.load(out)
    assert loaded.cfg.to_dict() == Run.open(runs[task, variant]).config.to_dict()
    assert (loaded.cfg.task, loaded.cfg.variant, loaded.checkpoint) == (task, variant, out)
    assert type(loaded.task).__name__ == type(mixit.load(runs[task, variant]).task).__name__  # a run loads too
    tokens = probe(runs[task, variant])
    with torch.no_grad():
        assert torch.equal(loaded.model.eval()(tokens), mixit_logits(runs[task, variant], tokens))
    if task == "lm":  # the tokenizer shipped in the export is the run's
        text = "the cat sat on a mat"
        assert loaded.task.tokenizer.encode(text) == Run.open(runs[task, variant]).load("cpu").task.tokenizer.encode(
            text
        )
    frozen = {n for n, p in loaded.model.named_parameters() if not p.requires_grad}
    assert frozen == {
        n for n, p in Run.open(runs[task, variant]).load("cpu").model.named_parameters() if not p.requires_grad
    }


def test_load_reads_a_hub_repo_id_from_the_cache_offline(runs, tmp_path, monkeypatch):
    """A repo id resolves through huggingface_hub's snapshot_download; offline, from its cache (laid out here as
    a download would leave it: refs/main names the commit, snapshots/COMMIT holds the files)."""
    import huggingface_hub

    out = export_run(runs["addition", "mixit"], "hub", tmp_path / "hub")
    cache = tmp_path / "hub-cache"
    commit = "0" * 40
    repo = cache / "models--someone--add-mixit"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    shutil.copytree(out, repo / "snapshots" / commit)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    tokens = probe(runs["addition", "mixit"])
    with torch.no_grad():
        logits = mixit.load("someone/add-mixit").model.eval()(tokens)
    assert torch.equal(logits, mixit_logits(runs["addition", "mixit"], tokens))
    with pytest.raises(UsageError, match="does not exist, and no Hub model someone/not-cached can be read"):
        mixit.load("someone/not-cached")


def test_sample_refuses_an_export_naming_what_to_do(runs, tmp_path, capsys):
    out = export_run(runs["addition", "mixit"], "hub", tmp_path / "hub")
    before = sorted(p.name for p in out.iterdir())
    err = refused(capsys, ["sample", str(out)])
    assert "is a mixit export, not a run" in err and "mixit.load(" in err
    assert sorted(p.name for p in out.iterdir()) == before


@pytest.mark.parametrize(
    "variant, frozen",
    [
        ("mixit", ["the attention mixing", "`blocks.0.attn.mixing`", "no queries or keys"]),
        ("frozen_qk", ["`blocks.0.attn.q`", "`blocks.1.attn.k`"]),
        ("frozen_mlp", ["`blocks.0.mlp.gate`", "`blocks.1.mlp.down`"]),
        ("standard", ["nothing"]),
    ],
)
def test_the_card_says_what_was_frozen_and_how_to_load(runs, tmp_path, variant, frozen):
    out = export_run(runs["addition", variant], "hub", tmp_path / "hub")
    card = (out / "README.md").read_text()
    line = card.partition("(never trained):")[2].splitlines()[0]
    assert all(part in line for part in frozen), line
    assert ("attn.q" in line) == (variant == "frozen_qk") and ("mixing" in line) == (variant == "mixit")
    assert "test metrics: loss" in card and "mixit.load(" in card and "trust_remote_code=True" in card


CONVENTIONS_WITHOUT_MIXIT = (
    WITHOUT_MIXIT
    + """
import json, os
import torch
from transformers import AutoModel, AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer
def conventions(directory, tokens):
    cfg = json.load(open(os.path.join(directory, "config.json")))["cfg"]
    auto = AutoModelForCausalLM if cfg["head"] == "lm" else AutoModelForSequenceClassification
    model = auto.from_pretrained(directory, trust_remote_code=True).eval()
    labels = tokens if cfg["head"] == "lm" else torch.arange(len(tokens)) % cfg["n_classes"]
    mask = torch.ones_like(tokens)
    mask[0, 3:] = 0  # the first row right-padded after 3 tokens
    said = {"class": type(model).__name__, "type": model.config.model_type}
    said["auto"] = type(AutoModel.from_pretrained(directory, trust_remote_code=True)).__name__
    with torch.no_grad():
        out = model(input_ids=tokens, labels=labels, output_hidden_states=True)
        said.update(logits=out.logits.tolist(), loss=out.loss.item(), hidden=[h.tolist() for h in out.hidden_states])
        said["masked"] = model(input_ids=tokens, attention_mask=mask).logits.tolist()
        try:
            model(input_ids=tokens, attention_mask=mask.flip(1))
        except ValueError as e:
            said["left"] = str(e)
        if cfg["head"] == "lm":
            said["generated"] = model.generate(tokens[:1, :3], do_sample=False, max_new_tokens=3).tolist()
    if os.path.exists(os.path.join(directory, "tokenizer_config.json")):
        tokenizer = AutoTokenizer.from_pretrained(directory)
        batch = tokenizer(["the cat", "a dog sat on the mat"], padding=True, return_tensors="pt")
        said.update(ids=batch["input_ids"].tolist(), mask=batch["attention_mask"].tolist())
        said.update(pad=tokenizer.pad_token_id, eos=tokenizer.eos_token_id, bos=tokenizer.bos_token_id)
        with torch.no_grad():
            said["batch_logits"] = model(**batch).logits.tolist()
    return said
# One process for every export (importing torch and transformers takes seconds): [directory, tokens] pairs in argv[1]
said = [conventions(directory, torch.tensor(tokens)) for directory, tokens in json.loads(sys.argv[1])]
print("\\n" + json.dumps(said))  # a line of its own, after any question transformers asked
"""
)

HIDDEN = ["blocks.0.hook_resid_pre", "blocks.0.hook_resid_post", "blocks.1.hook_resid_post"]
"""The hidden states transformers' ``output_hidden_states`` returns, as mixit's hook points (TINY has 2 layers)."""

CLASSES = {"lm": "MixitForCausalLM", "classifier": "MixitForSequenceClassification"}


CONVENTION_CASES = [
    ("addition", "mixit"),
    ("addition", "frozen_qk"),
    ("lm", "standard"),
    ("sentiment", "mixit"),
    ("sentiment", "standard"),
]


@pytest.fixture(scope="module")
def conventions(runs, tmp_path_factory):
    """What `CONVENTIONS_WITHOUT_MIXIT` says of the hub export of each case, all read by one process."""
    root = tmp_path_factory.mktemp("conventions")
    jobs = [
        [str(export_run(runs[case], "hub", root / "-".join(case))), probe(runs[case]).tolist()]
        for case in CONVENTION_CASES
    ]
    said = python_without_mixit(CONVENTIONS_WITHOUT_MIXIT, [json.dumps(jobs)], root)
    return dict(zip(CONVENTION_CASES, json.loads(said.strip().splitlines()[-1]), strict=True))


@pytest.mark.parametrize("task, variant", CONVENTION_CASES)
def test_the_hub_export_keeps_transformers_conventions_without_mixit(runs, conventions, task, variant):
    """Loaded by transformers' Auto classes with mixit (and what only mixit needs) impossible to import: the class
    of its head, mixit's logits, the loss of `labels`, the hidden states at mixit's hook points, right padding
    read as mixit reads it and left padding refused, greedy generation, a tokenizer that pads."""
    run = Run.open(runs[task, variant])
    model, cfg = run.load("cpu").model.eval(), run.config.model
    tokens = probe(run.path)
    got = conventions[task, variant]
    assert (got["class"], got["auto"], got["type"]) == (CLASSES[cfg.head], CLASSES[cfg.head], "mixit")
    terms = forward_terms(cfg)
    with torch.no_grad():
        logits, cache = model.run_with_cache(tokens, HIDDEN)
    assert_close(torch.tensor(got["logits"]), logits, terms=terms)
    for name, state in zip(HIDDEN, got["hidden"], strict=True):
        assert_close(torch.tensor(state), cache[name], terms=terms, msg=name)
    if cfg.head == "lm":
        loss = F.cross_entropy(logits[:, :-1].reshape(-1, cfg.vocab_size), tokens[:, 1:].reshape(-1))
    else:
        loss = F.cross_entropy(logits, torch.arange(len(tokens)) % cfg.n_classes)
    assert_close(
        torch.tensor(got["loss"]), loss, dtype=torch.float32, terms=terms + cfg.vocab_size, scale=logits.abs().max()
    )
    with torch.no_grad():
        if cfg.head == "lm":  # causal: the real positions of a right-padded row are read as without the pads
            masked, real = torch.tensor(got["masked"])[0, :3], logits[0, :3]
        else:  # a classifier reads the pads as mixit's own padding
            padded = tokens.clone()
            padded[0, 3:] = cfg.pad_id
            masked, real = torch.tensor(got["masked"]), model(padded)
    assert_close(masked, real, terms=terms)
    assert "attention_mask must be right padding" in got["left"]
    if cfg.head == "lm":
        greedy = tokens[:1, :3]
        with torch.no_grad():
            for _ in range(3):
                greedy = torch.cat([greedy, model(greedy)[:, -1:].argmax(-1)], dim=1)
        assert got["generated"] == greedy.tolist()
    assert ("ids" in got) == (task != "addition")
    if "ids" in got:
        tokenizer = run.load("cpu").task.tokenizer
        short, long = tokenizer.encode("the cat"), tokenizer.encode("a dog sat on the mat")
        assert got["ids"] == [short + [tokenizer.pad_id] * (len(long) - len(short)), long]
        assert got["mask"] == [[1] * len(short) + [0] * (len(long) - len(short)), [1] * len(long)]
        assert (got["pad"], got["eos"], got["bos"]) == (tokenizer.pad_id, tokenizer.eos_id, None)
        with torch.no_grad():
            alone = model(torch.tensor([short]))
        batch_logits = torch.tensor(got["batch_logits"])
        assert_close(batch_logits[0, : len(short)] if cfg.head == "lm" else batch_logits[0], alone[0], terms=terms)


def test_the_hub_export_ships_mixits_own_model_code_importing_no_mixit(runs, tmp_path):
    """The shipped files are mixit's modules line for line but for their mixit imports, which are relative; when
    imported they import nothing beyond the standard library and what transformers itself requires (an import inside
    a function runs only if it is called: the export never calls config.py's --help readers)."""
    out = export_run(runs["addition", "mixit"], "hub", tmp_path / "hub")
    source = Path(mixit.__file__).parent
    shipped = {p.name for p in out.glob("*.py")}
    assert {"modeling_mixit.py", "transformer.py", "attention.py", "config.py"} <= shipped
    allowed = set(sys.stdlib_module_names) | {"torch", "numpy", "transformers", "huggingface_hub", "safetensors"}
    for name in shipped:
        tree = ast.parse((out / name).read_text())
        imported = [a.name for node in tree.body if isinstance(node, ast.Import) for a in node.names]
        imported += [node.module for node in tree.body if isinstance(node, ast.ImportFrom) and node.level == 0]
        assert {module.split(".")[0] for module in imported if module} <= allowed, name
        original = next(source.rglob(name)).read_text().splitlines()
        for ours, theirs in zip((out / name).read_text().splitlines(), original, strict=True):
            assert ours == theirs or (theirs.startswith("from mixit.") and ours.startswith("from .")), (name, ours)


def card_blocks(out: Path) -> list[str]:
    """The Python blocks of the export's model card, with THIS_DIRECTORY made `out`."""
    card = (out / "README.md").read_text()
    return [block.replace("THIS_DIRECTORY", str(out)) for block in re.findall(r"```python\n(.*?)```", card, re.S)]


CARD_CASES = [
    ("addition", "mixit", "hub"),
    ("lm", "standard", "hub"),
    ("sentiment", "mixit", "hub"),
    ("addition", "standard", "hf"),
]

RUN_CARDS = """
import json
# Each card's block in a namespace of its own, one process for all (importing torch and transformers takes seconds)
for block in json.loads(sys.argv[1]):
    exec(block, {})
print("ran")
"""


@pytest.fixture(scope="module")
def cards(runs, tmp_path_factory):
    """The Python blocks of each case's model card; the first blocks, which must need no mixit, are run by one
    process without it."""
    root = tmp_path_factory.mktemp("cards")
    exported = {case: export_run(runs[case[:2]], case[2], root / "-".join(case)) for case in CARD_CASES}
    blocks = {case: card_blocks(out) for case, out in exported.items()}
    ran = python_without_mixit(WITHOUT_MIXIT + RUN_CARDS, [json.dumps([b[0] for b in blocks.values()])], root)
    assert ran.strip().splitlines()[-1] == "ran"
    return blocks


@pytest.mark.parametrize("task, variant, to", CARD_CASES)
def test_the_cards_code_runs_as_written(cards, task, variant, to):
    """The card's first block without mixit (it imports no tokenizer the export does not ship; the `cards` fixture
    runs it), its second with mixit."""
    with_transformers, with_mixit = cards[task, variant, to]
    assert ("AutoTokenizer" in with_transformers) == (task != "addition")
    scope: dict = {}
    exec(with_mixit, scope)
    assert scope["logits"].shape[0] == 1


def test_from_pretrained_refuses_a_llama_export_in_one_line(exported):
    with pytest.raises(UsageError) as refused:
        Transformer.from_pretrained(exported["hf"])
    message = str(refused.value)
    assert "`mixit export --to hf` Llama" in message and "mixit.load()" in message and "\n" not in message


def test_push_is_refused_offline_before_anything_is_written(runs, tmp_path, capsys):
    out = tmp_path / "pushed"
    argv = ["export", str(runs["addition", "mixit"]), "--to", "hub", "--out", str(out), "--push-to-hub", "me/add"]
    err = refused(capsys, argv)
    assert "HF_HUB_OFFLINE" in err and not out.exists()
    err = refused(capsys, [*argv[:-1], "not a repo id"])
    assert "not a Hub repo id" in err and not out.exists()


LOAD_FROM_THE_HUB = """
import json, sys
import torch
import mixit
loaded = mixit.load(sys.argv[1])
with torch.no_grad():
    logits = loaded.model.eval()(torch.tensor(json.loads(sys.argv[2])))
print(json.dumps({"task": loaded.cfg.task, "variant": loaded.cfg.variant, "logits": logits.tolist()}))
"""


def test_push_to_hub_uploads_the_export_and_load_reads_it_back(runs, tmp_path):
    """`--push-to-hub` against a Hub on localhost (tests/hub_server.py) through huggingface_hub itself: the repo
    is created private, every exported file arrives byte for byte, the command says the repo and its URL at that
    endpoint, and `mixit.load(repo id)` downloads it and gives the run's logits. The commands run in fresh
    processes, as huggingface_hub reads its endpoint and offline flag when imported."""
    run_dir, out = runs["addition", "mixit"], tmp_path / "pushed"
    hub = Hub()
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(tmp_path),
        "HF_HOME": str(tmp_path / "hf-home"),
        "HF_ENDPOINT": hub.endpoint,
        "HF_TOKEN": "hf_local_test_token",
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "NO_PROXY": "127.0.0.1",
        "PYTHONPATH": str(Path(mixit.__file__).parents[1]),  # the mixit under test, not another one installed
    }

    def mixit_process(*argv: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, *argv], capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path
        )

    try:
        pushed = mixit_process(
            "-m", "mixit", "export", str(run_dir), "--to", "hub", "--out", str(out), "--push-to-hub", "me/add"
        )
        assert pushed.returncode == 0, pushed.stderr[-2000:]
        assert pushed.stdout.splitlines() == [f"written to {out}", f"pushed to me/add ({hub.endpoint}/me/add)"]
        repo = hub.repos["me/add"]
        assert repo.private and len(repo.commits) == 1
        written = {p.relative_to(out).as_posix(): p.read_bytes() for p in out.rglob("*") if p.is_file()}
        assert repo.files == written
        assert hub.cards and hub.cards[-1].get("library_name") == "mixit"  # the card's metadata, validated
        tokens = probe(run_dir)
        loaded = mixit_process("-c", LOAD_FROM_THE_HUB, "me/add", json.dumps(tokens.tolist()))
        assert loaded.returncode == 0, loaded.stderr[-2000:]
        got = json.loads(loaded.stdout.strip().splitlines()[-1])
        assert ("GET", "/me/add/resolve/" + repo.sha + "/model.safetensors") in hub.requests
        assert (got["task"], got["variant"]) == ("addition", "mixit")
        assert torch.equal(torch.tensor(got["logits"]), mixit_logits(run_dir, tokens))
    finally:
        hub.close()


# -- damaged exports and run files; a push that cannot happen; only mixit's lines ------------


@pytest.fixture(scope="module")
def exported(runs, tmp_path_factory):
    """The standard addition run exported in each format, for tests to copy and damage."""
    root = tmp_path_factory.mktemp("exported")
    return {to: export_run(runs["addition", "standard"], to, root / to) for to in ("hf", "hub")}


def damage(path: Path, how: str, other: Path | None = None) -> None:
    """Damage the file `path` as `how` says: truncated, missing, corrupt (not JSON) or replaced by `other`."""
    if how == "truncated":
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    elif how == "missing":
        path.unlink()
    elif how == "corrupt":
        path.write_text('{"mixit_export": ')
    else:
        shutil.copy(other, path)


@pytest.mark.parametrize("to", ["hf", "hub"])
@pytest.mark.parametrize(
    "name, how",
    [
        ("model.safetensors", "truncated"),
        ("model.safetensors", "missing"),
        ("model.safetensors", "the other format's"),
        ("config.json", "corrupt"),
        ("config.json", "missing"),
    ],
)
def test_load_refuses_a_damaged_export_in_one_line_naming_the_file(exported, tmp_path, to, name, how):
    out = shutil.copytree(exported[to], tmp_path / to)
    damage(out / name, how, exported["hub" if to == "hf" else "hf"] / name)
    with pytest.raises(DamagedFile) as refused:
        mixit.load(out)
    message = str(refused.value)
    assert f"{out / name} " in message and "export the run again with `mixit export`" in message
    assert len(message.splitlines()) == 1


def test_load_refuses_an_export_config_without_its_run(exported, tmp_path):
    out = shutil.copytree(exported["hub"], tmp_path / "hub")
    config = json.loads((out / "config.json").read_text())
    del config["mixit_export"]["run"]
    (out / "config.json").write_text(json.dumps(config))
    with pytest.raises(DamagedFile, match=r"config.json is corrupt or unreadable \(KeyError: 'run'\)"):
        mixit.load(out)


@pytest.mark.parametrize("command", ["export", "eval"])
@pytest.mark.parametrize(
    "name, how, remedy",
    [
        ("checkpoints/step_0000012/model.safetensors", "truncated", "mixit train --config RUN_DIR --out NEW_DIR"),
        ("checkpoints/step_0000012/model.safetensors", "missing", "mixit train --config RUN_DIR --out NEW_DIR"),
        ("config.json", "corrupt", "restore it from a copy"),
    ],
)
def test_commands_refuse_a_damaged_run_in_one_line_naming_the_file_and_what_to_do(
    runs, tmp_path, capsys, command, name, how, remedy
):
    run = shutil.copytree(runs["addition", "standard"], tmp_path / "run")
    damage(run / name, how)
    err = refused(capsys, [command, str(run), *(["--out", str(tmp_path / "out")] if command == "export" else [])])
    assert str(run / name) in err and remedy in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()


def test_export_refuses_a_damaged_summary_naming_what_to_do(runs, tmp_path, capsys):
    run = shutil.copytree(runs["addition", "standard"], tmp_path / "run")
    damage(run / "summary.json", "truncated")
    err = refused(capsys, ["export", str(run), "--out", str(tmp_path / "out")])
    assert f"{run / 'summary.json'} is corrupt" in err and "mixit train --resume --out RUN_DIR" in err


@pytest.fixture
def online(monkeypatch, tmp_path):
    """huggingface_hub online in this process, with a token and its files under `tmp_path`: it read
    HF_HUB_OFFLINE and HF_ENDPOINT when it was imported, so its constants are set (the endpoint by the test)."""
    import huggingface_hub

    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setenv("HF_TOKEN", "hf_local_test_token")
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    return huggingface_hub.constants


def test_a_push_to_a_hub_that_refuses_connections_is_refused_at_once_writing_nothing(runs, tmp_path, capsys, online):
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        endpoint = f"http://127.0.0.1:{closed.getsockname()[1]}"
    online.ENDPOINT = endpoint
    out = tmp_path / "pushed"
    err = refused(capsys, ["export", str(runs["addition", "standard"]), "--out", str(out), "--push-to-hub", "me/add"])
    assert f"the Hub at {endpoint} does not answer" in err and "nothing was written" in err
    assert not out.exists()


def test_a_push_to_a_hub_that_never_answers_is_refused_after_its_timeout(runs, tmp_path, capsys, online, monkeypatch):
    """A server that takes the connection and never answers (a Hub behind a firewall that drops packets hangs
    the same way); without a timeout, huggingface_hub would wait for ever. This one hangs up after 20 s, which
    would end the push with another reason: "timed out" says the timeout ended it (no clock is read: a loaded
    machine must not fail the test)."""
    silent = socket.create_server(("127.0.0.1", 0))
    hang_up = threading.Timer(20, silent.close)
    hang_up.start()
    online.ENDPOINT = f"http://127.0.0.1:{silent.getsockname()[1]}"
    monkeypatch.setattr(mixit.export, "HUB_TIMEOUT_S", 0.5)
    out = tmp_path / "pushed"
    try:
        argv = ["export", str(runs["addition", "standard"]), "--out", str(out), "--push-to-hub", "me/add"]
        err = refused(capsys, argv)
    finally:
        hang_up.cancel()
        silent.close()
    assert "does not answer within 0.5 s" in err and "timed out" in err and not out.exists()


def test_an_export_to_hf_says_only_mixits_line_and_leaves_the_libraries_settings_alone(runs, tmp_path, capfd):
    from huggingface_hub.utils import are_progress_bars_disabled
    from transformers.utils import logging as hf_logging

    before = (hf_logging.is_progress_bar_enabled(), hf_logging.get_verbosity(), are_progress_bars_disabled())
    out = tmp_path / "hf"
    assert main(["export", str(runs["lm", "standard"]), "--to", "hf", "--out", str(out)]) == 0
    said = capfd.readouterr()
    assert (said.out, said.err) == (f"written to {out}\n", "")
    assert (hf_logging.is_progress_bar_enabled(), hf_logging.get_verbosity(), are_progress_bars_disabled()) == before
