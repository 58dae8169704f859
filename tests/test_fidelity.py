"""Reference fidelity (docs/fidelity.md): each formula checked against an
independent computation written from the equations in the docs (plain loops
over numpy arrays, not the implementation's vectorised code), and each
variant's resolved configuration against the documented reference coupling."""

import math

import numpy as np
import pytest
import torch

from mixit import ModelConfig, Transformer, run_config
from mixit.cli import main
from mixit.core.experiment import model_config
from mixit.core.models.attention import bidirectional_mixing, mixit_matrices, mixit_noise
from mixit.core.models.mlp import ShapedLeakyReLU
from tolerance import assert_close, forward_terms, sampling_error

H, T, D_HEAD = 3, 9, 8


def sums_to(a, total):
    """Assert each row of `a` sums to `total`: T entries, each rounded once from float64 to a's dtype where it
    was built in float64, then added; the scale is the row's sum of |entries| (they are signed)."""
    assert_close(a.sum(-1), np.full(a.shape[:-1], total), terms=a.shape[-1], scale=np.abs(a).sum(-1))


def noise(seed=0, depth_scaled=False):
    """The random draws W of one layer, as numpy (their distribution is tested separately)."""
    return mixit_noise(H, T, D_HEAD, torch.Generator().manual_seed(seed), depth_scaled).numpy()


def reference_causal(w, alpha=1.0, sink="reference", identity=True):
    """docs/fidelity.md, "MixiT matrix", written out entry by entry, as the reference builds it."""
    h, t, _ = w.shape
    a = np.zeros_like(w)
    for head in range(h):
        for i in range(t):
            drift = sum(w[head, i, j] for j in range(i + 1)) / (i + 1)
            for j in range(i + 1):
                a[head, i, j] = (1.0 if (i == j and identity) else 0.0) + alpha * (w[head, i, j] - drift)
    if sink != "off":
        a[0] = 0.5 * np.eye(t)
        for i in range(t):
            a[0, i, 0] = 0.5 if sink == "reference" else a[0, i, 0] + 0.5
    return a


@pytest.mark.parametrize("sink", ["reference", "normalised", "off"])
@pytest.mark.parametrize("alpha", [1.0, 0.6])
def test_causal_mixing_matrix_equals_the_written_out_formula(sink, alpha):
    built = mixit_matrices(H, T, D_HEAD, torch.Generator().manual_seed(0), alpha=alpha, sink=sink).numpy()
    expected = reference_causal(noise(), alpha, sink)
    assert_close(built, expected, scale=np.abs(expected))  # built in float64 too, then rounded once to float32


def test_sink_rows_as_the_reference_builds_them():
    ref = mixit_matrices(H, T, D_HEAD, torch.Generator().manual_seed(0), sink="reference").numpy()
    norm = mixit_matrices(H, T, D_HEAD, torch.Generator().manual_seed(0), sink="normalised").numpy()
    # Reference: A[0, 0] = 0.5, so row 0 of the sink head sums to 0.5; every other row to 1.
    assert ref[0, 0, 0] == 0.5 and ref[0, 0].sum() == pytest.approx(0.5)
    sums_to(ref[0, 1:], 1.0)
    assert all(ref[0, i, 0] == 0.5 and ref[0, i, i] == 0.5 for i in range(1, T))
    # Normalised: row 0 is e_0, every row sums to 1; the other heads are the same in both.
    assert norm[0, 0, 0] == 1.0
    sums_to(norm, 1.0)
    np.testing.assert_array_equal(ref[1:], norm[1:])
    sums_to(ref[1:], 1.0)


def test_non_causal_reference_centring_divides_by_i_plus_one():
    w = noise()
    built = bidirectional_mixing(torch.from_numpy(w), 1.0, "off", centring="reference").numpy()
    for head in range(H):
        for i in range(T):
            drift = w[head, i].sum() / (i + 1)
            expected = [(1.0 if i == j else 0.0) + (w[head, i, j] - drift) for j in range(T)]
            # float64 both: the drift's T terms in another order, then a subtraction and an addition.
            assert_close(built[head, i], expected, terms=T + 2, scale=1 + np.abs(w[head, i]).sum())
            # Its rows do not sum to 1: 1 + S_i (1 - T / (i + 1)), S_i the row's sum.
            assert built[head, i].sum() == pytest.approx(1 + w[head, i].sum() * (1 - T / (i + 1)))
    ours = bidirectional_mixing(torch.from_numpy(w), 1.0, "off").numpy()
    sums_to(ours, 1.0)


def test_sigma_h_lies_in_its_range_and_uses_n_ctx():
    t, d_head, heads = 256, 16, 8
    w = mixit_noise(heads, t, d_head, torch.Generator().manual_seed(1))
    std = w.std(dim=(-1, -2))
    lo, hi = 1 / math.sqrt(t * d_head), 1 / math.sqrt(t)
    assert torch.all(std > 0.95 * lo) and torch.all(std < 1.05 * hi)
    assert std.max() / std.min() > 1.5  # random per head, not one value
    depth = mixit_noise(heads, t, d_head, torch.Generator().manual_seed(1), depth_scaled=True).std(dim=(-1, -2))
    assert depth.tolist() == pytest.approx([hi] * heads, rel=sampling_error(t * t))


def test_depth_scaled_form():
    w = noise(depth_scaled=True)
    built = mixit_matrices(H, T, D_HEAD, torch.Generator().manual_seed(0), depth_scaled=True).numpy()
    expected = reference_causal(w, identity=False)
    assert_close(built, expected, scale=np.abs(expected))  # built in float64 too, then rounded once to float32
    sums_to(built[1:], 0.0)  # no identity: rows sum to 0
    cfg = run_config("addition", "mixit", {"n_digits": 3}, depth_alpha=1.0, n_layers=8)
    assert (cfg.model.skip_scale, cfg.model.branch_scale) == (1.0, 0.5)  # (4 / 8)^1
    std = run_config("addition", "standard", {"n_digits": 3}, depth_alpha=2.0, n_layers=8, base_n_layers=2)
    assert (std.model.skip_scale, std.model.branch_scale) == (1.0, 1 / 16)  # every variant, as the reference
    model = Transformer(cfg.model)
    sums_to(model.blocks[0].attn.mixing[1:, : cfg.model.n_ctx].numpy(), 0.0)


# -- width scaling and initialisation --------------------------------------------------------------


def effective_std(linear):
    return (linear.weight * linear.multiplier).std().item()


@pytest.mark.parametrize("d", [256, 1024])
def test_effective_init_std_of_every_weight_under_the_reference_width_scaling(d):
    cfg = model_config("mixit", vocab_size=512, n_ctx=64, d_model=d, n_heads=8, n_layers=1)
    model = Transformer(cfg)
    block = model.blocks[0]
    expected = {
        "v": 0.02 * math.sqrt(512 / d),
        "o": 0.02 * math.sqrt(512 / d),
        "gate": 0.02 * math.sqrt(512 / d),
        "up": 0.02 * math.sqrt(512 / d),
        "down": 0.02 / math.sqrt(4 * d),  # base 1, fan-in 4d
        "lm_head": 0.02 * math.sqrt(512 / d),
    }
    measured = {
        "v": block.attn.v,
        "o": block.attn.o,
        "gate": block.mlp.gate,
        "up": block.mlp.up,
        "down": block.mlp.down,
        "lm_head": model.lm_head,
    }
    for name, layer in measured.items():
        assert effective_std(layer) == pytest.approx(expected[name], rel=sampling_error(layer.weight.numel())), name
    for table in (model.embed, model.pos_embed):
        assert table.weight.std().item() == pytest.approx(0.02, rel=sampling_error(table.weight.numel()))
    assert block.attn.v.bias.abs().max() == 0 and model.norm_f.weight.eq(1).all()


def test_fan_in_initialisation_and_the_principled_down_projection():
    cfg = model_config(
        "mixit", vocab_size=64, n_ctx=16, d_model=256, n_heads=4, n_layers=1, width_init="fan_in", down_base_width=512
    )
    block = Transformer(cfg).blocks[0]
    for layer in (block.attn.v, block.mlp.gate, block.mlp.down):
        expected = 1 / math.sqrt(layer.in_features)
        assert effective_std(layer) == pytest.approx(expected, rel=sampling_error(layer.weight.numel()))
    assert block.mlp.down.multiplier == pytest.approx(math.sqrt(512 / 1024))


@pytest.mark.parametrize("qk_init, std", [("reference", lambda d: 0.02), ("paper", lambda d: 1 / math.sqrt(d))])
def test_query_key_initialisation(qk_init, std):
    d = 256
    model = Transformer(model_config("frozen_qk", vocab_size=64, n_ctx=16, d_model=d, n_heads=4, qk_init=qk_init))
    for block in model.blocks:
        for layer in (block.attn.q, block.attn.k):
            assert effective_std(layer) == pytest.approx(std(d), rel=sampling_error(layer.weight.numel()))
        v = block.attn.v  # only q and k
        assert effective_std(v) == pytest.approx(0.02, rel=sampling_error(v.weight.numel()))


def test_shaped_activation_constants_match_the_reference_table():
    # The reference's numbers at c = -1 (docs/fidelity.md), to its 5 decimals: slope 1 + c / sqrt(d), gain
    # sqrt(2 / (1 + slope^2)).
    for d, slope, gain in [(512, 0.95581, 1.02234), (1024, 0.96875, 1.01575)]:
        act = ShapedLeakyReLU(d, -1.0)
        assert (round(act.slope, 5), round(act.gain, 5)) == (slope, gain)
        x = torch.tensor([-2.0, 3.0])
        expected = [-2.0 * act.slope * act.gain, 3.0 * act.gain]
        # slope and gain rounded to float32, and two products: four roundings of eps / 2 each.
        assert_close(act(x), expected, dtype=torch.float32, terms=2, scale=np.abs(expected))


# -- the coupling each variant resolves to ---------------------------------------------------------

SQRT_HALF = math.sqrt(0.5)
VANILLA = {"attention": "softmax", "skip_scale": 1.0, "branch_scale": 1.0, "activation": "silu", "width_scaling": False}
MIXING = {
    "attention": "mixing",
    "skip_scale": pytest.approx(SQRT_HALF),
    "branch_scale": pytest.approx(SQRT_HALF),
    "activation": "shaped_leaky_relu",
    "leaky_c": -1.0,
    "width_scaling": True,
    "base_width": 512,
    "down_base_width": 1,
    "width_scale_head": True,
    "width_init": "reference",
    "mixing_sink": "reference",
    "mixing_alpha": 1.0,
    "depth_alpha": 0.0,
}
COUPLING = {"standard": VANILLA, "frozen_qk": VANILLA, "frozen_mlp": VANILLA, "random": VANILLA, "mixit": MIXING}


@pytest.mark.parametrize("variant", list(COUPLING))
def test_each_variant_resolves_to_the_reference_coupling(variant):
    cfg = run_config("addition", variant, {"n_digits": 5})
    model = cfg.model.to_dict()
    assert {k: model[k] for k in COUPLING[variant]} == COUPLING[variant]
    assert (model["init_std"], model["qk_init"], model["bias"]) == (0.02, "reference", True)
    assert model["n_ctx"] == 3 * 5 + 4  # the reference's T: the whole example


def test_the_random_transformer_on_mixing_attention_gets_mixits_coupling():
    model = run_config("addition", "random", {"n_digits": 5}, attention="mixing").model.to_dict()
    assert {k: model[k] for k in MIXING} == MIXING


def test_an_option_given_overrides_the_coupling_and_the_recipe():
    cfg = run_config("lm", "mixit", {"corpus": "english"}, recipe="reference", activation="silu")
    assert cfg.model.activation == "silu" and cfg.model.skip_scale == 0.5  # the LM trainer's residual
    assert cfg.model.branch_scale == pytest.approx(math.sqrt(0.75))
    assert (cfg.model.d_model, cfg.model.n_layers, cfg.model.n_ctx, cfg.train.steps) == (512, 12, 256, 40_000)
    assert (cfg.train.schedule, cfg.train.min_lr_ratio, cfg.train.beta2) == ("linear", 0.0, 0.999)


def test_reference_recipes_count_steps_as_the_reference_does():
    steps = {
        task: run_config(task, "standard", recipe="reference").train.steps
        for task in ("addition", "dyck", "retrieval", "memorization", "modular_addition")
    }
    assert steps == {
        "addition": 40_000,
        "dyck": 40_000,
        "retrieval": 100_000,
        "memorization": 500,
        "modular_addition": 20_000,
    }
    mem = run_config("memorization", "standard", recipe="reference").train
    assert (mem.batch_size, mem.lr, mem.weight_decay, mem.warmup_steps) == (32768, 5e-3, 1e-4, 500)


def test_non_causal_reference_centring_pads_to_n_ctx_and_differs_from_ours():
    common = {
        "vocab_size": 20,
        "n_ctx": 10,
        "d_model": 16,
        "n_heads": 2,
        "n_layers": 1,
        "head": "classifier",
        "causal": False,
        "pad_id": 0,
    }
    ours = Transformer(model_config("mixit", **common)).eval()
    ref = Transformer(model_config("mixit", **common, mixing_centring="reference")).eval()
    x = torch.tensor([[3, 4, 5, 0, 0], [6, 7, 8, 9, 2]])
    padded = torch.cat([x, torch.zeros(2, 5, dtype=torch.long)], dim=1)
    terms = forward_terms(ours.cfg)  # one forward pass, its products of another shape
    assert_close(ref(x), ref(padded), terms=terms)  # the reference reads every input at length n_ctx
    assert_close(ours(x[:1, :3]), ours(x[:1]), terms=terms)  # ours ignores padding altogether
    assert not torch.allclose(ref(x), ours(x))


@pytest.mark.parametrize(
    "flag, value, message",
    [
        (
            "--mixing-sink",
            "yes",
            "model.mixing_sink: expected one of reference, normalised or off, got 'yes'",
        ),
        (
            "--qk-init",
            "gaussian",
            "model.qk_init: expected one of reference or paper, got 'gaussian'",
        ),
        ("--depth-alpha", "nan", "model.depth_alpha: expected float, got 'nan'"),
        ("--base-n-layers", "0", "base_n_layers must be a positive integer, got 0"),
        ("--down-base-width", "-1", "down_base_width must be a positive integer, got -1"),
        (
            "--width-init",
            "xavier",
            "model.width_init: expected one of reference or fan_in, got 'xavier'",
        ),
        (
            "--mixing-centring",
            "mean",
            "model.mixing_centring: expected one of real_tokens or reference",
        ),
        ("--recipe", "paper", "unknown recipe 'paper'; allowed: laptop, reference"),
    ],
)
def test_bad_values_of_the_fidelity_options_are_one_line_and_exit_2(flag, value, message, capsys, tmp_path):
    assert main(["train", "--variant", "mixit", flag, value, "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


def test_mixit_config_json_shows_the_reference_recipe(tmp_path, capsys):
    assert main(["train", "--variant", "mixit", "-p", "n_digits=2", "--print-config"]) == 0
    printed = capsys.readouterr().out
    for text in (
        '"skip_scale": 0.7071',
        '"activation": "shaped_leaky_relu"',
        '"width_scaling": true',
        '"mixing_sink": "reference"',
        '"n_ctx": 10',
    ):
        assert text in printed, text
    assert ModelConfig.shaped()["skip_scale"] == pytest.approx(SQRT_HALF)
