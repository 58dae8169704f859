"""Variants and freeze selectors freeze exactly the parameters docs/model.md says, and the optimizer sees only the
rest; a selector that selects nothing is refused before any work."""

import json
import re

import pytest
import torch
from safetensors.torch import load_file

from mixit.catalogue import catalogue
from mixit.cli import main
from mixit.core.config import ModelConfig, TrainConfig
from mixit.core.experiment import build_model, run_config
from mixit.core.freezing import VARIANTS, Variant, apply_variant, check_attention, check_selectors, parse_selector
from mixit.core.models import Transformer
from mixit.core.models.attention import ATTENTION, SoftmaxAttention
from mixit.core.run import Run
from mixit.core.training.loop import train
from mixit.core.training.optim import build_optimizer
from mixit.errors import UsageError
from mixit.study.spec import load_study_file, plan, run_id

MLP = ("gate", "up", "down")
LINEARS = ("attn.q", "attn.k", "attn.v", "attn.o", "mlp.gate", "mlp.up", "mlp.down")


def model(attention="softmax", n_layers=2, **options):
    return Transformer(
        ModelConfig(vocab_size=11, n_ctx=8, d_model=16, n_layers=n_layers, n_heads=2, attention=attention, **options)
    )


def lin(*modules):
    """The weight and bias of each linear module named."""
    return {f"{m}.{wb}" for m in modules for wb in ("weight", "bias")}


def block(i, attention="softmax"):
    """Every parameter of block i, written out."""
    linears = [p for p in LINEARS if attention == "softmax" or p not in ("attn.q", "attn.k")]
    return {f"blocks.{i}.norm1.weight", f"blocks.{i}.norm2.weight", *lin(*(f"blocks.{i}.{p}" for p in linears))}


def everything(attention="softmax", n_layers=2, head="lm_head"):
    """Every parameter of the tiny model, written out."""
    outside = {"embed.weight", "norm_f.weight", f"{head}.weight"}
    outside |= {"pos_embed.weight"} if attention == "mixing" else set()
    return outside.union(*(block(i, attention) for i in range(n_layers)))


# -- the five paper variants: exact trainable sets, and run ids as before --------------------------------------------

PAPER_TRAINABLE = {
    ("standard", "softmax"): everything(),
    ("frozen_qk", "softmax"): everything() - lin(*(f"blocks.{i}.attn.{p}" for i in (0, 1) for p in ("q", "k"))),
    ("frozen_mlp", "softmax"): everything() - lin(*(f"blocks.{i}.mlp.{p}" for i in (0, 1) for p in MLP)),
    ("mixit", "mixing"): everything("mixing"),
    ("random", "softmax"): {"embed.weight", "lm_head.weight"},
    ("random", "mixing"): {"embed.weight", "pos_embed.weight", "lm_head.weight"},
}


@pytest.mark.parametrize("variant, attention", list(PAPER_TRAINABLE))
def test_each_paper_variant_trains_exactly_its_parameters(variant, attention):
    m = model(attention)
    report = apply_variant(m, variant)
    assert set(report.trainable) == PAPER_TRAINABLE[variant, attention]
    assert set(report.frozen) == everything(attention) - PAPER_TRAINABLE[variant, attention]
    assert {n for n, p in m.named_parameters() if p.requires_grad} == PAPER_TRAINABLE[variant, attention]
    assert all(not b.requires_grad for b in m.buffers())


# Computed at main's commit a388623 (before variants became selectors) with
# mixit.study.spec.run_id(run_config("addition", VARIANT, {"n_digits": 2}, d_model=16, n_heads=2, n_layers=2,
# steps=4, batch_size=8, test_size=16)), and attention="mixing" for random-mixing.
PAPER_RUN_IDS = {
    ("standard", "softmax"): "0d6b2654d8db",
    ("frozen_qk", "softmax"): "38a8604c7d51",
    ("frozen_mlp", "softmax"): "3addfd90b452",
    ("mixit", "mixing"): "f3525a6399a3",
    ("random", "softmax"): "d69d4488a73e",
    ("random", "mixing"): "dec0068e7457",
}


def tiny(variant="standard", attention=None, **kw):
    extra = {"attention": attention} if attention else {}
    return run_config(
        "addition", variant, {"n_digits": 2}, d_model=16, n_heads=2, n_layers=2, steps=4, batch_size=8,
        test_size=16, **extra, **kw,
    )  # fmt: skip


@pytest.mark.parametrize("variant, attention", list(PAPER_RUN_IDS))
def test_paper_variants_keep_their_run_ids(variant, attention):
    assert (
        run_id(tiny(variant, attention if variant == "random" and attention == "mixing" else None))
        == (PAPER_RUN_IDS[variant, attention])
    )


def test_a_declared_freeze_is_another_run():
    assert run_id(tiny(freeze=["embed"])) not in PAPER_RUN_IDS.values()
    assert run_id(tiny(freeze=["embed"])) != run_id(tiny(freeze=["head"]))


def test_the_catalogue_names_each_variants_selectors():
    variants = catalogue()["variants"]
    assert variants["frozen_qk"]["freezes"] == ["blocks.*.attn.q", "blocks.*.attn.k"]
    assert variants["standard"]["freezes"] == []


# -- each kind of selector -------------------------------------------------------------------------------------------

FOUR = 4  # layers of the model the selector tests use


@pytest.mark.parametrize(
    "selector, frozen",
    [
        ("embed", {"embed.weight"}),
        ("norm_f", {"norm_f.weight"}),
        ("lm_head", {"lm_head.weight"}),
        ("head", {"lm_head.weight"}),
        ("blocks", everything(n_layers=FOUR) - {"embed.weight", "norm_f.weight", "lm_head.weight"}),
        ("blocks.*", everything(n_layers=FOUR) - {"embed.weight", "norm_f.weight", "lm_head.weight"}),
        ("blocks.2", block(2)),
        ("blocks.*.attn.q", lin("blocks.0.attn.q", "blocks.1.attn.q", "blocks.2.attn.q", "blocks.3.attn.q")),
        ("blocks.1.mlp.up", lin("blocks.1.mlp.up")),
        ("blocks.1-2.attn.k", lin("blocks.1.attn.k", "blocks.2.attn.k")),
        ("blocks.0+3.mlp.down", lin("blocks.0.mlp.down", "blocks.3.mlp.down")),
        ("blocks.0-1+3.attn.v", lin("blocks.0.attn.v", "blocks.1.attn.v", "blocks.3.attn.v")),
        ("blocks.3.mlp", lin("blocks.3.mlp.gate", "blocks.3.mlp.up", "blocks.3.mlp.down")),
        ("blocks.2.attn", lin("blocks.2.attn.q", "blocks.2.attn.k", "blocks.2.attn.v", "blocks.2.attn.o")),
        ("blocks.0.norm2", {"blocks.0.norm2.weight"}),
        ("blocks.2.norms", {"blocks.2.norm1.weight", "blocks.2.norm2.weight"}),
        ("norms", {"norm_f.weight", *(f"blocks.{i}.norm{j}.weight" for i in range(FOUR) for j in (1, 2))}),
    ],
)
def test_each_selector_freezes_exactly_what_it_names(selector, frozen):
    m = model(n_layers=FOUR)
    report = apply_variant(m, "standard", [selector])
    assert set(report.frozen) == frozen
    assert set(report.trainable) == everything(n_layers=FOUR) - frozen


def test_position_embedding_and_classifier_head():
    report = apply_variant(model("mixing"), "mixit", ["pos_embed", "blocks.1.attn.o"])
    assert set(report.frozen) == {"pos_embed.weight", *lin("blocks.1.attn.o")}
    classifier = model(head="classifier", causal=False)
    report = apply_variant(classifier, "standard", ["head"])
    assert set(report.frozen) == {"classifier.weight"}
    assert set(report.trainable) == everything(head="classifier") - {"classifier.weight"}


def test_selectors_add_to_the_variants_own():
    report = apply_variant(model(), "frozen_qk", ["blocks.1.mlp.down", "embed"])
    assert set(report.frozen) == lin(
        "blocks.0.attn.q", "blocks.0.attn.k", "blocks.1.attn.q", "blocks.1.attn.k", "blocks.1.mlp.down"
    ) | {"embed.weight"}
    assert report.freeze == ("blocks.1.mlp.down", "embed")
    assert report.summary().startswith("variant frozen_qk with freeze blocks.1.mlp.down, embed: ")
    assert report.to_dict()["freeze"] == ["blocks.1.mlp.down", "embed"]


def test_layer_sets_parse_to_their_indices():
    assert parse_selector("blocks.0-2+5.mlp") == (("name", "blocks"), ("layers", (0, 1, 2, 5)), ("name", "mlp"))
    assert parse_selector("blocks.*") == (("name", "blocks"), ("layers", None))
    assert parse_selector("blocks.1.norms") == (("name", "blocks"), ("layers", (1,)), ("group", "norms"))


# -- refusals ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "selector, attention, message",
    [
        ("blocks.5.attn.q", "softmax", "freeze 'blocks.5.attn.q' selects nothing: blocks has layers 0-1"),
        ("blocks.1-3", "softmax", "freeze 'blocks.1-3' names layer(s) 2, 3, which do not exist: blocks has layers 0-1"),
        ("pos_embed", "softmax", "freeze 'pos_embed' selects nothing: the model has no pos_embed "
         "(it has embed, blocks, norm_f, lm_head)"),
        ("blocks.*.attn.q", "mixing", "freeze 'blocks.*.attn.q' selects nothing: blocks.0.attn has no q (it has v, o)"),
        ("blocks.0.mlp.act", "softmax", "freeze 'blocks.0.mlp.act' selects nothing: blocks.0.mlp has no act "
         "(it has gate, up, down)"),
        ("blocks.*.head", "softmax", "freeze 'blocks.*.head' selects nothing: blocks.0 holds no head "
         "(it has norm1, attn, norm2, mlp)"),
        ("embed.0", "softmax", "freeze 'embed.0' selects nothing: embed is not a list of layers"),
        ("blocks.3-1", "softmax", "freeze 'blocks.3-1': the layer range 3-1 runs backwards; write 1-3"),
        ("norms.weight", "softmax", "freeze 'norms.weight': the group norms selects modules of a kind, "
         "so it comes last"),
        ("blocks[0].attn", "softmax", "freeze 'blocks[0].attn' is not a selector ('blocks[0]' is no segment): "
         "a selector is a module path such as blocks.*.attn.q"),
        ("blocks..q", "softmax", "freeze 'blocks..q' is not a selector ('' is no segment)"),
    ],
)  # fmt: skip
def test_a_bad_selector_is_refused_in_one_line_naming_what_exists(selector, attention, message):
    variant = "mixit" if attention == "mixing" else "standard"
    with pytest.raises(UsageError) as refused:
        tiny(variant, freeze=[selector])
    assert str(refused.value).startswith(message) and "\n" not in str(refused.value)
    with pytest.raises(UsageError, match="^" + re.escape(message)):
        apply_variant(model(attention), variant, [selector])


def test_freeze_must_be_a_list_of_strings():
    with pytest.raises(UsageError, match=r"^freeze must be comma-separated list of str, got 'embed'$"):
        tiny(freeze="embed")


def test_a_variant_whose_selector_selects_nothing_is_refused():
    refusal = "variant 'frozen_qk': freeze 'blocks.*.attn.q' selects nothing: blocks.0.attn has no q (it has v, o)"
    with pytest.raises(UsageError, match="^" + re.escape(refusal) + "$"):
        apply_variant(model("mixing"), "frozen_qk")
    with pytest.raises(UsageError, match="variant 'frozen_qk' uses softmax attention"):
        check_attention(VARIANTS["frozen_qk"], "mixing")
    check_attention(VARIANTS["random"], "mixing")  # random works with either kind


def test_unknown_variant():
    with pytest.raises(UsageError, match="unknown variant 'frozen'; allowed: standard, frozen_qk"):
        apply_variant(model(), "frozen")


CLI_TINY = ["--task", "addition", "-p", "n_digits=2", "--d-model", "16", "--n-heads", "2", "--n-layers", "1"]


@pytest.mark.parametrize(
    "freeze, message",
    [
        ("embed,blocks.1.attn.q", "freeze 'blocks.1.attn.q' selects nothing: blocks has layer 0 only"),
        ("blocks.0.attn.w", "freeze 'blocks.0.attn.w' selects nothing: blocks.0.attn has no w (it has q, k, v, o)"),
    ],
)
def test_the_command_line_refuses_a_bad_selector_before_any_work(tmp_path, capsys, freeze, message):
    code = main(["train", *CLI_TINY, "--steps", "2", "--freeze", freeze, "--out", str(tmp_path / "run")])
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    assert err == f"mixit train: error: {message}\n"
    assert not (tmp_path / "run").exists()


def test_freeze_from_flags_and_from_a_config_file(tmp_path, capsys):
    assert main(["train", *CLI_TINY, "--freeze", "embed,blocks.0.norms", "--print-config"]) == 0
    assert json.loads(capsys.readouterr().out)["freeze"] == ["embed", "blocks.0.norms"]
    (tmp_path / "c.yaml").write_text("task: addition\nvariant: frozen_qk\nfreeze: [head, blocks.0.mlp.up]\n")
    assert main(["train", "--config", str(tmp_path / "c.yaml"), "--print-config"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert (printed["variant"], printed["freeze"]) == ("frozen_qk", ["head", "blocks.0.mlp.up"])


def test_a_study_file_declares_a_freeze_for_its_runs(tmp_path):
    (tmp_path / "s.toml").write_text(
        'name = "frozen-embeddings"\n[base]\ntask = "addition"\ntask_params = {n_digits = 2}\n'
        'model = {d_model = 16, n_heads = 2, n_layers = 2}\nfreeze = ["embed", "blocks.1.attn.q"]\n'
        '[grid]\nvariant = ["standard", "frozen_mlp"]\n'
    )
    planned = plan(load_study_file(tmp_path / "s.toml").specs)
    assert {(p.cfg.variant, p.cfg.freeze) for p in planned} == {
        ("standard", ("embed", "blocks.1.attn.q")),
        ("frozen_mlp", ("embed", "blocks.1.attn.q")),
    }
    (tmp_path / "s.toml").write_text((tmp_path / "s.toml").read_text().replace("blocks.1.", "blocks.2."))
    with pytest.raises(UsageError, match=r"freeze 'blocks.2.attn.q' selects nothing: blocks has layers 0-1$"):
        plan(load_study_file(tmp_path / "s.toml").specs)


# -- training ------------------------------------------------------------------------------------------------------


def test_optimizer_sees_only_trainable_and_frozen_stay_put():
    m = model()
    apply_variant(m, "frozen_qk")
    opt = build_optimizer(m, TrainConfig(lr=1e-2), torch.device("cpu"))
    in_opt = {id(p) for g in opt.param_groups for p in g["params"]}
    assert in_opt == {id(p) for p in m.parameters() if p.requires_grad}
    before = {n: p.detach().clone() for n, p in m.named_parameters()}
    loss = m(torch.randint(0, 11, (4, 8))).logsumexp(-1).mean()
    loss.backward()
    opt.step()
    for n, p in m.named_parameters():
        changed = not torch.equal(before[n], p)
        assert changed == p.requires_grad, n
        if not p.requires_grad:
            assert p.grad is None  # no gradient is even computed for frozen parameters


def test_a_declared_regime_trains_and_its_frozen_parameters_are_bit_identical_in_the_checkpoint(tmp_path):
    cfg = run_config(
        "addition", "frozen_mlp", {"n_digits": 2}, freeze=["embed", "blocks.0.attn.q", "blocks.1.norms"],
        d_model=16, n_heads=2, n_layers=2, steps=6, batch_size=16, test_size=32, lr=1e-2,
    )  # fmt: skip
    train(cfg, tmp_path / "run", progress=False)
    initial, report = build_model(cfg)
    frozen = lin(*(f"blocks.{i}.mlp.{p}" for i in (0, 1) for p in ("gate", "up", "down")), "blocks.0.attn.q") | {
        "embed.weight",
        "blocks.1.norm1.weight",
        "blocks.1.norm2.weight",
    }
    assert set(report.frozen) == frozen
    run = Run.open(tmp_path / "run")
    trained = load_file(str(run.latest_checkpoint() / "model.safetensors"))
    for name, p in initial.named_parameters():
        assert torch.equal(trained[name], p.detach()) == (name in frozen), name
    logged = next(e for e in run.metrics() if e["event"] == "freeze")
    assert logged["freeze"] == ["embed", "blocks.0.attn.q", "blocks.1.norms"] and set(logged["frozen"]) == frozen


class ReadsValues(SoftmaxAttention):
    """Softmax attention that reads a value of its weights while it is built, as the meta device cannot."""

    def __init__(self, cfg, layer):
        super().__init__(cfg, layer)
        float(self.q.weight.detach().abs().max())


def test_selectors_are_checked_on_a_model_whose_parts_read_values_when_built():
    with ATTENTION.lent("reads_values", ReadsValues):
        cfg = ModelConfig(vocab_size=11, n_ctx=8, d_model=16, n_layers=2, n_heads=2, attention="reads_values")
        check_selectors(cfg, ["blocks.1.attn.q"])
        with pytest.raises(UsageError, match=r"^freeze 'blocks.2.attn.q' selects nothing: blocks has layers 0-1$"):
            check_selectors(cfg, ["blocks.2.attn.q"])


def test_a_variant_declares_its_selectors_as_a_tuple_of_valid_selectors():
    with pytest.raises(TypeError, match=r"^variant 'old': freeze must be a tuple of selectors"):
        Variant("old", "softmax", lambda m: {}, "a freeze rule as a function, as before selectors")
    with pytest.raises(UsageError, match=r"^freeze 'blocks\[0\]' is not a selector"):
        Variant("typo", "softmax", ("blocks[0]",), "a selector that is none")
