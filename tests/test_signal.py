"""Signal propagation: the metric on hand-built streams, a model that collapses by construction, the sweep."""

import json
import math

import pytest
import torch
from matplotlib.figure import Figure

from mixit.analysis.signal import SignalOptions, pairwise_stats, plot_signal, signal_propagation, token_similarity
from mixit.cli import main
from mixit.core.config import ModelConfig
from mixit.core.models import Transformer
from mixit.errors import UsageError
from tolerance import assert_close

TINY = dict(d_model=16, n_heads=2, n_ctx=8, vocab_size=16, batch=2)


def test_identical_rows_have_cosine_and_covariance_one():
    h = torch.tensor([1.0, -2.0, 3.0]).expand(1, 5, 3)  # (1, 5, 3): five copies of one token
    s = pairwise_stats(h)
    assert s["cosine"] == pytest.approx(1.0)
    assert s["covariance"] == pytest.approx(1.0)
    assert s["norm"] == pytest.approx(math.sqrt(14 / 3))


def test_orthogonal_rows_have_cosine_and_covariance_zero():
    s = pairwise_stats(3.0 * torch.eye(4)[None])  # (1, 4, 4)
    assert s["cosine"] == pytest.approx(0.0)
    assert s["covariance"] == pytest.approx(0.0)
    assert s["norm"] == pytest.approx(1.5)  # sqrt(4 * 9 / 16)


def test_two_tokens_by_hand():
    # X = [[1, 0], [1, 1]]: cos = 1/sqrt(2); rms^2 = 3/4, so C_01 = (X_0 . X_1) / rms^2 / d = 1 / (3/4) / 2 = 2/3.
    s = pairwise_stats(torch.tensor([[[1.0, 0.0], [1.0, 1.0]]]))
    assert s["cosine"] == pytest.approx(1 / math.sqrt(2))
    assert s["covariance"] == pytest.approx(2 / 3)
    assert s["norm"] == pytest.approx(math.sqrt(3) / 2)


def test_batch_mean_and_scale_invariance():
    same = torch.ones(1, 4, 4)
    orthogonal = torch.eye(4)[None]
    s = pairwise_stats(torch.cat([same, orthogonal]))  # (2, 4, 4)
    assert s["cosine"] == pytest.approx(0.5)
    assert s["covariance"] == pytest.approx(0.5)
    h = torch.randn(3, 6, 5, generator=torch.Generator().manual_seed(0))
    a, b = pairwise_stats(h), pairwise_stats(100.0 * h)
    # 100 h rounds each entry once in float32 (the stats are then taken in float64). That moves a unit vector by at
    # most two roundings, eps, so a cosine by at most 2 eps; a covariance likewise, on the scale of the mean of
    # |X_i| |X_j| / (d rms^2) over the pairs, at most the mean diagonal, 1; the norm by one rounding of itself.
    assert_close(b["cosine"], a["cosine"], dtype=torch.float32, terms=2, scale=1.0)
    assert_close(b["covariance"], a["covariance"], dtype=torch.float32, terms=2, scale=1.0)
    assert_close(b["norm"], 100.0 * a["norm"], dtype=torch.float32)


def test_one_token_is_refused():
    with pytest.raises(UsageError, match="T >= 2"):
        pairwise_stats(torch.ones(2, 1, 4))


def copy_token_zero_model(n_layers=2):
    """A MixiT model in which every block makes all tokens identical.

    Each mixing matrix sends every position to token 0, and skip_scale 0 drops the
    residual, so after a block every token holds f(token 0): cosine and covariance 1.
    """
    model = Transformer(
        ModelConfig(
            vocab_size=16, n_ctx=8, d_model=16, n_heads=2, n_layers=n_layers, attention="mixing", skip_scale=0.0
        )
    )
    with torch.no_grad():
        for block in model.blocks:
            block.attn.mixing.zero_()
            block.attn.mixing[:, :, 0] = 1.0
    return model


def test_token_similarity_of_a_model_that_collapses_by_construction():
    model = copy_token_zero_model(n_layers=2)
    tokens = torch.randint(16, (3, 8), generator=torch.Generator().manual_seed(0))
    s = token_similarity(model, tokens)
    assert [len(s[k]) for k in ("cosine", "covariance", "norm")] == [3, 3, 3]  # embedding + 2 blocks
    assert s["cosine"][0] < 0.9
    assert s["cosine"][1:] == pytest.approx([1.0, 1.0])
    assert s["covariance"][1:] == pytest.approx([1.0, 1.0])


def test_token_similarity_reads_the_stream_the_forward_pass_uses():
    model = Transformer(ModelConfig(vocab_size=16, n_ctx=8, d_model=16, n_heads=2, n_layers=3))
    tokens = torch.randint(16, (2, 8), generator=torch.Generator().manual_seed(1))
    seen = []
    handle = model.norm_f.register_forward_hook(lambda module, args, out: seen.append(args[0]))
    with torch.no_grad():
        model(tokens)
    handle.remove()
    s = token_similarity(model, tokens)
    assert len(s["cosine"]) == 4
    expected = pairwise_stats(seen[0])
    assert s["cosine"][-1] == pytest.approx(expected["cosine"])
    assert s["norm"][-1] == pytest.approx(expected["norm"])
    assert s["cosine"][0] == pytest.approx(pairwise_stats(model.embed(tokens))["cosine"])


@pytest.mark.parametrize("attention", ["softmax", "mixing"])
def test_token_similarity_equals_running_the_blocks_by_hand(attention):
    """The hook points give exactly the stream of embedding + positions, then each block in turn."""
    model = Transformer(ModelConfig(vocab_size=16, n_ctx=8, d_model=16, n_heads=2, n_layers=3, attention=attention))
    tokens = torch.randint(16, (2, 8), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        h = model.embed(tokens)
        if model.pos_embed is not None:
            h = h + model.pos_embed.weight[:8]
        streams = [h]
        for block in model.blocks:
            streams.append(block(streams[-1]))
    by_hand = [pairwise_stats(h) for h in streams]
    assert token_similarity(model, tokens) == {k: [s[k] for s in by_hand] for k in ("cosine", "covariance", "norm")}


def sweep(variants, depths, **settings):
    return signal_propagation(SignalOptions(variants=variants, depths=depths, **{**TINY, **settings}))


def test_signal_propagation_shape_determinism_and_json():
    a = sweep(["standard", "mixit", "random"], [1, 2], seeds=2)
    b = sweep(["standard", "mixit", "random"], [1, 2], seeds=2)
    assert json.dumps(a) == json.dumps(b)
    assert set(a["results"]) == {"standard", "mixit", "random"}
    for by_depth in a["results"].values():
        assert set(by_depth) == {"1", "2"}
        for depth, entry in by_depth.items():
            for key in ("cosine", "covariance", "norm"):
                assert len(entry[f"per_layer_{key}"]) == int(depth) + 1
                assert entry[key] == pytest.approx(entry[f"per_layer_{key}"][-1])
                assert entry[f"{key}_std"] >= 0
    # At initialisation a variant matters only through its attention kind.
    assert a["results"]["random"] == a["results"]["standard"]
    assert a["config"]["attention"] == {"standard": "softmax", "mixit": "mixing", "random": "softmax"}
    assert a["config"]["seeds"] == [0, 1] and a["config"]["model_overrides"] == {"mixing_sink": "reference"}
    shaped = sweep(["mixit"], [1], seeds=1, shaped=True)
    assert shaped["config"]["model"]["activation"] == "shaped_leaky_relu"
    assert shaped["results"]["mixit"]["1"]["cosine_std"] == 0.0


def test_a_sweep_from_another_first_seed_measures_other_initialisations():
    first, later = sweep(["mixit"], [1], seeds=2), sweep(["mixit"], [1], seeds=2, first_seed=5)
    assert (first["config"]["seeds"], later["config"]["seeds"]) == ([0, 1], [5, 6])
    assert first["results"]["mixit"]["1"]["cosine"] != later["results"]["mixit"]["1"]["cosine"]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"first_seed": -1}, "first_seed must be an integer >= 0, got -1"),
        ({"variants": ["mixit", "nope"]}, "unknown variant.*'nope'.*allowed: standard, frozen_qk"),
        ({"variants": "mixit"}, "variants must be a non-empty list"),
        ({"depths": [2, 0]}, "depths must be a non-empty list of positive integers"),
        ({"depths": [2.5]}, "depths must be"),
        ({"depths": []}, "depths must be"),
        ({"shaped": None}, "shaped must be bool, got None"),
        ({"seeds": 0}, "seeds must be a positive integer, got 0"),
        ({"batch": 0}, "batch must be a positive integer, got 0"),
        ({"n_ctx": 1}, "n_ctx must be an integer >= 2"),
        ({"mixing_sink": "nope"}, "mixing_sink must be one of reference, normalised or off"),
    ],
)
def test_bad_inputs_are_refused(kwargs, message):
    with pytest.raises(UsageError, match=message):
        sweep(**{"variants": ["standard"], "depths": [1], "seeds": 1, **kwargs})


def test_plot_signal_writes_a_png(tmp_path):
    result = sweep(["standard", "mixit"], [1, 2], seeds=2)
    path = tmp_path / "signal.png"
    assert isinstance(plot_signal(result, path), Figure)
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(data) > 1000


def test_plot_signal_returns_its_figure_and_writes_nothing_unasked(tmp_path, monkeypatch):
    """Without a path: a Figure of two panels (cosine, covariance), a line per variant through the result's means
    at each depth, and no file anywhere."""
    monkeypatch.chdir(tmp_path)
    result = sweep(["standard", "mixit"], [1, 2], seeds=2)
    fig = plot_signal(result)
    assert isinstance(fig, Figure) and list(tmp_path.iterdir()) == []
    assert len(fig.axes) == 2
    for ax, key in zip(fig.axes, ("cosine", "covariance")):
        for container, variant in zip(ax.containers, ("standard", "mixit")):
            line = container.lines[0]  # the errorbar's line through the means
            assert container.get_label().startswith(f"{variant} (")
            assert line.get_xdata().tolist() == [1, 2]
            assert line.get_ydata().tolist() == [result["results"][variant][d][key] for d in ("1", "2")]


SMALL_CLI = [
    "signal",
    "--variants",
    "standard,mixit",
    "--depths",
    "1,2",
    "--d-model",
    "16",
    "--n-heads",
    "2",
    "--n-ctx",
    "8",
    "--seeds",
    "1",
]


def test_signal_command_writes_json_and_png_and_never_overwrites(tmp_path, capsys):
    out = tmp_path / "sig"
    assert main([*SMALL_CLI, "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert printed.splitlines()[1].startswith("standard") and printed.splitlines()[2].startswith("mixit")
    result = json.loads((out / "signal.json").read_text())
    assert result["config"]["model"]["mixing_sink"] == "reference"
    assert (out / "signal.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    before = (out / "signal.json").read_bytes()
    assert main([*SMALL_CLI, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "already exists; choose another output directory" in err and len(err.strip().splitlines()) == 1
    assert (out / "signal.json").read_bytes() == before


def test_signal_command_no_sink_changes_only_mixit(tmp_path, capsys):
    assert main([*SMALL_CLI, "--out", str(tmp_path / "a")]) == 0
    assert main([*SMALL_CLI, "--mixing-sink", "off", "--out", str(tmp_path / "b")]) == 0
    capsys.readouterr()
    a, b = (json.loads((tmp_path / d / "signal.json").read_text()) for d in ("a", "b"))
    assert b["config"]["model"]["mixing_sink"] == "off"
    assert a["results"]["standard"] == b["results"]["standard"]
    assert a["results"]["mixit"]["2"]["cosine"] != pytest.approx(b["results"]["mixit"]["2"]["cosine"])
