"""The input-independent mixers (randformer, uniform, synthesizer_random): causal patterns whose rows sum to 1,
the pattern hook showing the mixing actually applied, exactly the expected trainable parameters under each
variant, fixed mixers untouched by training, selection from Python, a config file and the command line with
refusals in one line, and the exports (a Hub round trip; Llama and TransformerLens refused)."""

import json

import pytest
import torch

from mixit import run_config, train
from mixit.cli import main
from mixit.core.config import ModelConfig
from mixit.core.experiment import build_model
from mixit.core.models import Transformer, capture_patterns
from mixit.core.models.attention import layer_generator
from mixit.core.run import Run
from mixit.errors import UsageError
from mixit.export import export_run
from mixit.interop import to_transformer_lens
from test_export import WITHOUT_MIXIT, python_without_mixit
from tolerance import assert_close, forward_terms

KINDS = ("randformer", "uniform", "synthesizer_random")
TINY = {"d_model": 16, "n_layers": 2, "n_heads": 2, "steps": 4, "batch_size": 8, "test_size": 16, "val_size": 16}
FLAGS = ["--d-model", "16", "--n-heads", "2", "--n-layers", "1", "--steps", "2", "--batch-size", "4"]
FLAGS += ["--test-size", "8", "--no-progress"]


def tiny(attention, **kw):
    return ModelConfig(
        **{"vocab_size": 13, "n_ctx": 16, "d_model": 32, "n_layers": 2, "n_heads": 4, "attention": attention, **kw}
    )


def tokens(batch=3, T=16):
    return torch.randint(0, 13, (batch, T), generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("kind", KINDS)
def test_each_pattern_is_causal_its_rows_sum_to_one_and_it_ignores_the_input(kind):
    model = Transformer(tiny(kind)).eval()
    with capture_patterns(model) as patterns:
        model(tokens())
    assert sorted(patterns) == ["blocks.0.attn.hook_pattern", "blocks.1.attn.hook_pattern"]
    for p in patterns.values():
        assert p.shape == (3, 4, 16, 16)
        assert torch.all(p.triu(diagonal=1) == 0) and torch.all(p >= 0)
        # The softmax's normaliser sums up to 16 terms, the row sum 16 more, of entries in [0, 1].
        assert_close(p.sum(-1), torch.ones(3, 4, 16), terms=2 * 16, scale=1.0)
        assert torch.equal(p[0], p[2])  # the same mixing for every input


def test_uniform_averages_itself_and_every_earlier_position():
    model = Transformer(tiny("uniform")).eval()
    with capture_patterns(model) as patterns:
        model(tokens(T=5))
    by_hand = torch.tensor(
        [
            [1, 0, 0, 0, 0],
            [1 / 2, 1 / 2, 0, 0, 0],
            [1 / 3, 1 / 3, 1 / 3, 0, 0],
            [1 / 4, 1 / 4, 1 / 4, 1 / 4, 0],
            [1 / 5, 1 / 5, 1 / 5, 1 / 5, 1 / 5],
        ],
        dtype=torch.float64,
    )
    # exp(0) = 1 exactly and a sum of up to 5 ones is exact: one rounding, the division's.
    assert_close(patterns["blocks.1.attn.hook_pattern"], by_hand.expand(3, 4, 5, 5), dtype=torch.float32)


def test_randformer_is_the_causal_softmax_of_a_seeded_uniform_draw():
    model = Transformer(tiny("randformer")).eval()
    logits = model.blocks[1].attn.mixing_logits
    assert logits.shape == (4, 16, 16) and torch.all((logits >= 0) & (logits < 1))
    assert torch.equal(logits, torch.rand(4, 16, 16, generator=layer_generator(0, 1)))  # MixiT's per-layer seed
    assert not torch.equal(logits, model.blocks[0].attn.mixing_logits)
    assert torch.equal(logits, Transformer(tiny("randformer")).blocks[1].attn.mixing_logits)
    assert not torch.equal(logits, Transformer(tiny("randformer", seed=1)).blocks[1].attn.mixing_logits)
    e = logits.double().exp().tril()  # (H, T, T): row i keeps positions j <= i
    by_hand = e / e.sum(-1, keepdim=True)
    with capture_patterns(model) as patterns:
        model(tokens(batch=1))
    # 16 terms in the normaliser, and an exponential and a division rounded once each; entries at most 1.
    assert_close(patterns["blocks.1.attn.hook_pattern"][0], by_hand, dtype=torch.float32, terms=16 + 2, scale=1.0)


@pytest.mark.parametrize("kind", KINDS)
def test_a_shorter_input_reads_the_top_left_block_of_the_pattern(kind):
    model = Transformer(tiny(kind)).eval()
    with capture_patterns(model) as patterns:
        model(tokens(T=7))
    full = model.blocks[1].attn.fixed_pattern  # (H, n_ctx, n_ctx)
    assert_close(patterns["blocks.1.attn.hook_pattern"][0], full[:, :7, :7], terms=2 * 16, scale=1.0)


@pytest.mark.parametrize("kind", KINDS)
def test_the_output_is_the_hooked_pattern_times_the_values(kind):
    """Block 0's attention output equals o(pattern @ v(x)) recomputed in float64 from the pattern the hook saw, to
    the roundings of float32 along v's d_model, the mixing's T and o's d_model terms, on the scale of the same
    products taken of magnitudes; and a pattern the hook returns instead is the one applied."""
    model = Transformer(tiny(kind)).eval()
    attn = model.blocks[0].attn
    names = ["blocks.0.attn.hook_pattern", "blocks.0.hook_resid_pre", "blocks.0.hook_attn_out"]
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens(), names)
    x = model.blocks[0].norm1(cache["blocks.0.hook_resid_pre"]).double()  # (B, T, d_model)
    p = cache["blocks.0.attn.hook_pattern"].double()  # (B, H, T, T)
    wv, bv, wo, bo = (t.detach().double() for t in (attn.v.weight, attn.v.bias, attn.o.weight, attn.o.bias))

    def through(p, x, wv, bv, wo, bo):
        v = (x @ wv.T + bv).view(3, 16, 4, 8).transpose(1, 2)  # (B, H, T, d_head)
        return (p @ v).transpose(1, 2).reshape(3, 16, 32) @ wo.T + bo  # (B, T, d_model)

    expected = through(p, x, wv, bv, wo, bo)
    scale = through(p.abs(), x.abs(), wv.abs(), bv.abs(), wo.abs(), bo.abs())
    assert_close(cache["blocks.0.hook_attn_out"], expected, dtype=torch.float32, terms=32 + 16 + 32, scale=scale)
    identity = torch.eye(16).expand(3, 4, 16, 16)
    replaced = {}
    with torch.no_grad():
        model.run_with_hooks(
            tokens(),
            [
                ("blocks.0.attn.hook_pattern", lambda a, hook: identity),
                ("blocks.0.hook_attn_out", lambda a, hook: replaced.setdefault("out", a)),
            ],
        )
    by_identity = through(identity.double(), x, wv, bv, wo, bo)
    scale = through(identity.double(), x.abs(), wv.abs(), bv.abs(), wo.abs(), bo.abs())
    assert_close(replaced["out"], by_identity, dtype=torch.float32, terms=32 + 16 + 32, scale=scale)


def block_names(i, attention):
    return {
        f"blocks.{i}.norm1.weight",
        *attention,
        f"blocks.{i}.norm2.weight",
        *(f"blocks.{i}.mlp.{m}.{p}" for m in ("gate", "up", "down") for p in ("weight", "bias")),
    }


def mixer_names(i, kind):
    own = [f"blocks.{i}.attn.mixing_logits"] if kind == "synthesizer_random" else []
    return {*own, *(f"blocks.{i}.attn.{m}.{p}" for m in ("v", "o") for p in ("weight", "bias"))}


@pytest.mark.parametrize("kind", KINDS)
def test_each_variant_trains_exactly_the_expected_parameters(kind):
    outside = {"embed.weight", "pos_embed.weight", "norm_f.weight", "lm_head.weight"}
    everything = outside | {n for i in range(2) for n in block_names(i, mixer_names(i, kind))}
    mlps = {f"blocks.{i}.mlp.{m}.{p}" for i in range(2) for m in ("gate", "up", "down") for p in ("weight", "bias")}
    expected = {
        "standard": everything,
        "mixit": everything,
        "frozen_mlp": everything - mlps,
        "random": {"embed.weight", "pos_embed.weight", "lm_head.weight"},
    }
    for variant, trainable in expected.items():
        model, report = build_model(run_config("addition", variant, {"n_digits": 2}, attention=kind, **TINY))
        assert set(report.trainable) == trainable, variant
        assert set(report.frozen) == everything - trainable, variant
    buffers = {n for n in model.state_dict() if n not in dict(model.named_parameters())}
    assert buffers == ({f"blocks.{i}.attn.mixing_logits" for i in range(2)} if kind == "randformer" else set())
    with pytest.raises(
        UsageError, match=r"variant 'frozen_qk': freeze 'blocks\.\*\.attn\.q' selects nothing: blocks\.0\.attn has no q"
    ):
        run_config("addition", "frozen_qk", attention=kind)


@pytest.mark.parametrize("kind", KINDS)
def test_training_leaves_a_fixed_mixer_bit_identical_and_trains_the_synthesizers(kind, tmp_path):
    cfg = run_config("addition", "standard", {"n_digits": 2}, attention=kind, **TINY)
    train(cfg, tmp_path / "run", progress=False)
    trained, fresh = Run.open(tmp_path / "run").load("cpu").model, Transformer(cfg.model)
    for i in range(2):
        before, after = fresh.blocks[i].attn.fixed_pattern, trained.blocks[i].attn.fixed_pattern
        if kind == "synthesizer_random":
            assert not torch.equal(trained.blocks[i].attn.mixing_logits, fresh.blocks[i].attn.mixing_logits)
        else:
            assert torch.equal(after, before)
        if kind == "randformer":
            assert torch.equal(trained.blocks[i].attn.mixing_logits, fresh.blocks[i].attn.mixing_logits)


def test_a_config_file_and_the_command_line_choose_a_kind(tmp_path, capsys):
    config = tmp_path / "mixer.toml"
    config.write_text('task = "addition"\n[model]\nattention = "synthesizer_random"\n')
    assert main(["train", "--config", str(config), *FLAGS, "--out", str(tmp_path / "file")]) == 0
    assert Run.open(tmp_path / "file").config.model.attention == "synthesizer_random"
    cli = ["train", "--task", "addition", "--attention", "randformer", *FLAGS]
    assert main([*cli, "--out", str(tmp_path / "cli")]) == 0
    assert Run.open(tmp_path / "cli").config.model.attention == "randformer"
    assert main(["analyze", str(tmp_path / "cli"), "--batch", "4"]) == 0  # its pattern goes through the hook
    assert (tmp_path / "cli" / "analysis" / "fixed_patterns.npz").is_file()
    capsys.readouterr()


@pytest.mark.parametrize(
    "args, message",
    [
        (["--attention", "randomformer"], "unknown attention kind 'randomformer'; allowed: softmax, mixing, "),
        (
            ["--variant", "frozen_qk", "--attention", "uniform"],
            "variant 'frozen_qk': freeze 'blocks.*.attn.q' selects nothing",
        ),
        (["--variant", "standard", "--attention", "mixing"], "variant 'standard' uses softmax attention, not 'mixing'"),
    ],
)
def test_a_bad_kind_is_refused_in_one_line_before_anything_is_written(args, message, tmp_path, capsys):
    assert main(["train", "--task", "addition", *args, *FLAGS, "--out", str(tmp_path / "bad")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err, err
    assert "randformer, uniform, synthesizer_random" in err or "unknown" not in err
    assert not (tmp_path / "bad").exists()


@pytest.fixture(scope="module")
def mixer_runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("mixers")
    for kind in KINDS:
        train(run_config("addition", "standard", {"n_digits": 2}, attention=kind, **TINY), root / kind, progress=False)
    return root


@pytest.mark.parametrize("kind", KINDS)
def test_llama_and_transformer_lens_refuse_the_kind_in_one_line(mixer_runs, kind, tmp_path, capsys):
    assert main(["export", str(mixer_runs / kind), "--to", "hf", "--out", str(tmp_path / "hf")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"attention='{kind}'" in err and "--to hub" in err, err
    assert not (tmp_path / "hf").exists()
    with pytest.raises(UsageError, match=f"not {kind} .*nnsight"):
        to_transformer_lens(Run.open(mixer_runs / kind).load("cpu").model)


REMOTE_CODE_LOGITS = (
    WITHOUT_MIXIT
    + """
import json
import torch
from transformers import AutoModelForCausalLM
said = []
for directory, tokens in json.loads(sys.argv[1]):
    model = AutoModelForCausalLM.from_pretrained(directory, trust_remote_code=True).eval()
    with torch.no_grad():
        said.append(model(input_ids=torch.tensor(tokens)).logits.tolist())
print("\\n" + json.dumps(said))
"""
)


def test_the_hub_export_round_trips_with_mixit_and_without(mixer_runs, tmp_path):
    jobs, expected = [], []
    for kind in KINDS:
        run = Run.open(mixer_runs / kind)
        out = export_run(run.path, "hub", tmp_path / kind)
        probe = torch.randint(0, run.config.model.vocab_size, (2, run.config.model.n_ctx))
        with torch.no_grad():
            logits = run.load("cpu").model.eval()(probe)
            assert torch.equal(Transformer.from_pretrained(out).eval()(probe), logits), kind
        jobs.append([str(out), probe.tolist()])
        expected.append((logits, run.config.model))
    said_out = python_without_mixit(REMOTE_CODE_LOGITS, [json.dumps(jobs)], tmp_path)
    said = json.loads(said_out.strip().splitlines()[-1])
    for (logits, cfg), theirs in zip(expected, said, strict=True):
        assert_close(torch.tensor(theirs), logits, terms=forward_terms(cfg))


@pytest.mark.parametrize("kind", KINDS)
def test_without_causality_a_padded_input_is_mixed_as_its_unpadded_copy(kind):
    cfg = tiny(kind, causal=False, head="classifier", pad_id=12)
    model = Transformer(cfg).eval()
    x = torch.randint(0, 12, (2, 9), generator=torch.Generator().manual_seed(0))
    padded = torch.cat([x, torch.full((2, 7), 12)], dim=1)  # right-padded to n_ctx
    with capture_patterns(model) as patterns:
        model(padded)
    p = patterns["blocks.0.attn.hook_pattern"]  # (B, H, T, T)
    assert torch.all(p[..., 9:] == 0) and torch.all(p[..., :9] > 0)  # every row reads every real token, no pad
    assert_close(p.sum(-1), torch.ones(2, 4, 16), terms=2 * 16, scale=1.0)
    assert_close(model(padded), model(x), terms=forward_terms(cfg))
