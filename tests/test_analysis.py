"""Head scores on hand-built patterns and on a hand-built induction model; maps; `mixit analyze`."""

import json
import math

import numpy as np
import pytest
import torch
from matplotlib.figure import Figure

from mixit.analysis.attention_maps import (
    attention_patterns,
    fixed_patterns,
    plot_over_time,
    plot_pattern_grid,
    plot_score_tables,
)
from mixit.analysis.induction import (
    head_scores,
    icl_gap,
    input_dependence,
    repeated_sequences,
    score_patterns,
)
from mixit.cli import main
from mixit.core.config import ModelConfig
from mixit.core.models import Transformer
from tolerance import assert_close

M = 6  # copy length: sequences r r of length 12
S = 60.0  # the norm of `induction_model`'s layer-0 queries and keys: its largest scores are S^2 / sqrt(64)


def causal_uniform(T):
    return torch.tril(torch.ones(T, T)) / torch.arange(1, T + 1)[:, None]


def hand_patterns():
    """(1, 4, 12, 12): previous-token, induction, duplicate-token and uniform heads."""
    T = 2 * M
    prev, ind, dup = (torch.zeros(T, T) for _ in range(3))
    prev[0, 0] = 1
    prev[torch.arange(1, T), torch.arange(T - 1)] = 1
    ind[:M] = causal_uniform(T)[:M]
    dup[:M] = causal_uniform(T)[:M]
    second = torch.arange(M, T)
    ind[second, second - M + 1] = 1
    dup[second, second - M] = 1
    return torch.stack([prev, ind, dup, causal_uniform(T)])[None]


def test_scores_of_hand_built_patterns():
    s = score_patterns(hand_patterns(), M)
    T = 2 * M
    uniform_prev = np.mean([1 / (i + 1) for i in range(1, T)])
    uniform_second = np.mean([1 / (i + 1) for i in range(M, T)])
    # Entries 1 / (i + 1) (at most 1), each rounded to float32, then averaged over at most T rows: 2 T roundings.
    terms = 2 * T
    assert s["previous_token"][0].item() == pytest.approx(1.0)
    assert_close(s["induction"], torch.tensor([0.0, 1.0, 0.0, uniform_second]), terms=terms, scale=1.0)
    assert_close(s["duplicate_token"], torch.tensor([0.0, 0.0, 1.0, uniform_second]), terms=terms, scale=1.0)
    assert_close(s["previous_token"][3], torch.tensor(uniform_prev), terms=terms, scale=1.0)
    # The induction head's second-copy rows look one step back from the duplicate: offset m - 1.
    expected = np.mean([1 / (i + 1) for i in range(1, M)] + [0.0] * M)
    assert_close(s["previous_token"][1], torch.tensor(expected), terms=terms, scale=1.0)


def test_transformer_lens_convention_halves_a_perfect_induction_head():
    """TransformerLens's detect_head divides by every query's attention, the first copy's included: a perfect
    induction (or duplicate-token) head scores m / 2m there, 1.0 in mixit's convention."""
    patterns = hand_patterns()
    ours = score_patterns(patterns, M)
    theirs = score_patterns(patterns, M, convention="transformer_lens")
    assert ours["induction"][1].item() == pytest.approx(1.0) and ours["duplicate_token"][2].item() == pytest.approx(1.0)
    assert theirs["induction"][1].item() == pytest.approx(0.5) and theirs["duplicate_token"][2].item() == pytest.approx(
        0.5
    )
    assert theirs["previous_token"][0].item() == pytest.approx((2 * M - 1) / (2 * M))
    # A head's scores differ only by what they are averaged over: the same targets, another denominator.
    uniform_second_sum = sum(1 / (i + 1) for i in range(M, 2 * M))
    # Entries 1 / (i + 1) rounded to float32, M of them summed, divided by the pattern's sum (2m rows of 2m).
    expected = torch.tensor(uniform_second_sum / (2 * M))
    assert_close(theirs["induction"][3], expected, terms=M + 2 * (2 * M), scale=1.0)
    with pytest.raises(ValueError, match="convention must be one of mixit, transformer_lens"):
        score_patterns(patterns, M, convention="olsson")


def test_head_scores_records_its_convention():
    model = induction_model()
    ours = head_scores(model, range(8), m=M, batch=8)
    theirs = head_scores(model, range(8), m=M, batch=8, convention="transformer_lens")
    assert ours["probe"]["convention"] == "mixit" and theirs["probe"]["convention"] == "transformer_lens"
    # The same entries averaged two ways: over the batch of 8 and the m second-copy rows, or summed over those
    # rows and divided by the pattern's sum, 2m rows that each sum to 1 within 2 x 2m roundings.
    terms = 8 + M + 2 * (2 * M)
    assert_close(theirs["induction"][1][0], ours["induction"][1][0] / 2, dtype=torch.float32, terms=terms)


def test_repeated_sequences_are_two_copies_of_distinct_tokens():
    x = repeated_sequences(range(10, 30), m=8, batch=5, seed=1)
    assert x.shape == (5, 16)
    assert torch.equal(x[:, :8], x[:, 8:])
    assert all(len(set(row[:8].tolist())) == 8 for row in x)
    assert x.min() >= 10 and x.max() < 30
    assert torch.equal(x, repeated_sequences(range(10, 30), m=8, batch=5, seed=1))


def test_icl_gap_on_hand_made_logits():
    x = repeated_sequences(range(8), m=4, batch=2)
    logits = torch.zeros(2, 8, 8)
    # Perfect on the second copy (positions 4..6 predict x[5..7]), uniform elsewhere.
    logits[:, 4:7] = 20 * torch.nn.functional.one_hot(x[:, 5:8], 8).float()
    gap = icl_gap(logits, x, m=4)
    assert gap["acc_second_copy"] == 1.0
    # ln 8 rounded to float32 once, then averaged over the 2 x 3 first-copy predictions.
    assert_close(gap["loss_first_copy"], np.log(8), dtype=torch.float32, terms=1 + 2 * 3)
    assert gap["loss_gap"] > 2.0


def induction_model(vocab=8):
    """A 2-layer, 1-head softmax model that implements an induction head by hand.

    Residual stream (d_model 64): slot A (dims 1..8) holds the current token,
    slot B (dims 9..16) the previous token, slot C (dims 17..24) the output.
    Layer 0 attends to the previous position using only RoPE's frequency-1 pair
    (dims 0 and 32): constant q and k biases at a relative angle of 1 radian,
    so the score peaks at offset 1; its value/output copy slot A into slot B.
    Layer 1 matches query slot A against key slot B (RoPE base 1e300 makes
    these dims' rotation negligible) and copies the key's slot A into slot C,
    which the LM head reads. MLPs are zero.
    """
    cfg = ModelConfig(vocab_size=vocab, n_ctx=16, d_model=64, n_layers=2, n_heads=1, rope_base=1e300)
    model = Transformer(cfg)
    A, B, C = (torch.arange(vocab) + o for o in (1, 9, 17))
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
        for norm in (model.norm_f, *[n for b in model.blocks for n in (b.norm1, b.norm2)]):
            norm.weight.fill_(1.0)
        model.embed.weight[torch.arange(vocab), A] = 1.0
        a0, a1 = model.blocks[0].attn, model.blocks[1].attn
        s = S
        a0.q.bias[0] = s
        a0.k.bias[0], a0.k.bias[32] = s * np.cos(1.0), s * np.sin(1.0)
        a0.v.weight[B, A] = 1.0
        a0.o.weight[:] = torch.eye(64)
        a1.q.weight[A, A] = 10.0
        a1.k.weight[A, B] = 10.0
        a1.v.weight[C, A] = 1.0
        a1.o.weight[:] = torch.eye(64)
        model.lm_head.weight[torch.arange(vocab), C] = 50.0
    return model.eval()


def test_hand_built_induction_model_scores():
    model = induction_model()
    scores = head_scores(model, range(8), m=M, batch=32)
    # Scores hundreds apart make each softmax one-hot or an exact tie, up to the rounding of the scores: an error in
    # a score moves a probability by that error times the probability (at most the scores' scale, S^2 / sqrt(64)).
    # The stream reaching either layer is exact (one-hot copies of one-hot embeddings, zero MLPs), so a score rounds
    # in its RMSNorm and its projection (d_model each) and its product (d_head); the average over the batch adds
    # a rounding of each probability, far below that scale.
    cfg = model.cfg
    close = {"dtype": torch.float32, "terms": 2 * cfg.d_model + cfg.d_head, "scale": S**2 / math.sqrt(cfg.d_head)}
    assert_close(scores["previous_token"][0][0], 1.0, **close)
    # Row m's query (token x_0) matches key 1 (after x_0) and key 0, whose "previous
    # token" slot holds x_0 itself (position 0 attends to itself): half weight each.
    assert_close(scores["induction"][1][0], (M - 0.5) / M, **close)
    assert scores["induction"][0][0] < 0.01
    # Layer 1 finds no match in the first copy, so it attends uniformly there.
    first_copy_uniform = sum(1 / (i + 1) for i in range(1, M)) / (2 * M - 1)
    assert_close(scores["previous_token"][1][0], first_copy_uniform, **close)
    icl = scores["icl"]
    right = round(icl["acc_second_copy"] * 32 * (M - 1))  # of the 32 x (m - 1) second-copy predictions
    assert right >= 32 * (M - 2)  # every position but the tied one
    assert icl["loss_gap"] > 1.0


def test_mixit_scores_read_the_fixed_matrices():
    cfg = ModelConfig(vocab_size=20, n_ctx=12, d_model=16, n_layers=2, n_heads=2, attention="mixing")
    model = Transformer(cfg).eval()
    scores = head_scores(model, range(20), m=M, batch=4)
    fixed = fixed_patterns(model)
    assert fixed.shape == (2, 2, 12, 12)
    direct = score_patterns(torch.from_numpy(fixed)[1][None], M)
    # The same (signed) entries averaged over a batch of 4 copies and m rows, or over the m rows alone.
    big = float(np.abs(fixed).max())
    assert_close(scores["induction"][1], direct["induction"], dtype=torch.float32, terms=4 * M + M, scale=big)
    # The sink head (0.5 I + 0.5 on token 0) looks one back only from position 1: one 0.5 in each of 4 x (2m - 1).
    expected = 0.5 / (2 * M - 1)
    assert_close(scores["previous_token"][0][0], expected, dtype=torch.float32, terms=4 * (2 * M - 1), scale=0.5)
    x = torch.arange(7)
    np.testing.assert_array_equal(attention_patterns(model, x)[1], fixed[1, :, :7, :7])  # the matrices, copied
    assert fixed_patterns(Transformer(ModelConfig(vocab_size=20, n_ctx=12, d_model=16, n_heads=2))) is None


def test_pattern_input_dependence_is_zero_for_mixit_and_not_for_softmax():
    """MixiT reads one fixed matrix whatever the tokens; softmax attention's pattern follows them."""
    shape = {"vocab_size": 20, "n_ctx": 12, "d_model": 16, "n_layers": 2, "n_heads": 2}
    mixit = head_scores(Transformer(ModelConfig(**shape, attention="mixing")).eval(), range(20), m=M, batch=4)
    softmax = head_scores(Transformer(ModelConfig(**shape, qk_init="paper")).eval(), range(20), m=M, batch=4)
    assert mixit["pattern_input_dependence"] == 0.0
    assert mixit["pattern_scale"] >= 0.5  # the sink head's 0.5 at least
    assert softmax["pattern_input_dependence"] > 1e-3
    assert 0.0 < softmax["pattern_scale"] <= 1.0


def test_input_dependence_of_hand_made_patterns():
    a = causal_uniform(4)[None, None]  # (1, 1, 4, 4)
    b = a.clone()
    b[0, 0, 3] = torch.tensor([0.1, 0.2, 0.3, 0.4])  # the last row moved by at most 0.15
    found = input_dependence([a, a], [a, b])
    assert found["pattern_input_dependence"] == pytest.approx(0.15)
    assert found["pattern_scale"] == 1.0
    assert input_dependence([a], [a.clone()])["pattern_input_dependence"] == 0.0


def test_the_plots_return_their_figures_and_save_only_when_asked(tmp_path, monkeypatch):
    """plot_pattern_grid draws each head's pattern as it is (a signed set on a map centred on 0), plot_score_tables
    writes every score in its cell, plot_over_time draws each series; none writes a file unless given a path."""
    monkeypatch.chdir(tmp_path)
    patterns = hand_patterns().numpy()  # (1, 4, 12, 12)
    grid = plot_pattern_grid(patterns, title="hand-built")
    images = [ax.images[0] for ax in grid.axes if ax.images]  # the colour bar's axes hold no image
    assert [image.get_array().tolist() for image in images] == [p.tolist() for p in patterns[0]]
    assert [ax.get_title() for ax in grid.axes[:4]] == ["L0 H0", "L0 H1", "L0 H2", "L0 H3"]
    assert images[0].get_cmap().name == "viridis" and images[0].get_clim() == (0.0, 1.0)
    signed = plot_pattern_grid(patterns - 0.25).axes[0].images[0]  # weights in [-0.25, 0.75]
    assert signed.get_cmap().name == "RdBu_r" and signed.get_clim() == (-0.75, 0.75)

    scores = {"previous_token": [[1.0, 0.25]], "induction": [[0.5, 0.125]], "duplicate_token": [[0.0, 0.75]]}
    tables = plot_score_tables(scores, title="hand-written")
    axes = [ax for ax in tables.axes if ax.texts]
    assert [ax.get_title() for ax in axes] == ["previous token", "induction", "duplicate token"]
    assert [[t.get_text() for t in ax.texts] for ax in axes] == [["1.00", "0.25"], ["0.50", "0.12"], ["0.00", "0.75"]]

    over_time = plot_over_time([1, 10, 100], {"induction": [0.1, 0.5, 0.9]}, {"test token_acc": [0.2, 0.6, 1.0]}, "t")
    (ax,) = over_time.axes
    assert ax.get_xscale() == "log"
    assert [(line.get_label(), line.get_ydata().tolist()) for line in ax.lines] == [
        ("induction", [0.1, 0.5, 0.9]),
        ("test token acc", [0.2, 0.6, 1.0]),
    ]
    assert list(tmp_path.iterdir()) == []

    saved = [
        plot_pattern_grid(patterns, tmp_path / "grid.png", "hand-built"),
        plot_score_tables(scores, tmp_path / "tables.png", "hand-written"),
        plot_over_time([1, 10], {"induction": [0.1, 0.5]}, {}, "t", tmp_path / "over_time.png"),
    ]
    assert all(isinstance(fig, Figure) for fig in saved)
    for name in ("grid.png", "tables.png", "over_time.png"):
        assert (tmp_path / name).read_bytes().startswith(b"\x89PNG")


TINY = [
    "--task",
    "addition",
    "-p",
    "n_digits=2",
    "--d-model",
    "32",
    "--n-heads",
    "2",
    "--n-layers",
    "2",
    "--steps",
    "4",
    "--batch-size",
    "16",
    "--test-size",
    "40",
    "--no-progress",
]


@pytest.mark.parametrize("variant", ["standard", "mixit"])
def test_analyze_command_writes_every_artifact(variant, tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", *TINY, "--variant", variant, "--out", str(run)]) == 0
    capsys.readouterr()
    assert main(["analyze", str(run), "--batch", "8"]) == 0
    out = capsys.readouterr().out
    assert "Strongest induction head: layer" in out
    files = {p.name for p in (run / "analysis").iterdir()}
    expected = {"head_scores.json", "head_scores.png", "attention.npz", "attention.png", "signal.json", "summary.md"}
    if variant == "mixit":
        expected |= {"fixed_patterns.npz", "fixed_patterns.png"}
    assert files == expected
    for png in (run / "analysis").glob("*.png"):
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    scores = json.loads((run / "analysis" / "head_scores.json").read_text())
    assert np.asarray(scores["induction"]).shape == (2, 2)
    # MixiT's patterns are the same on any input; softmax's differ, if only a little at this tiny init.
    assert (scores["pattern_input_dependence"] == 0.0) == (variant == "mixit")
    assert "on two different probe batches differ by at most" in (run / "analysis" / "summary.md").read_text()
    arrays = np.load(run / "analysis" / "attention.npz")
    n = 3 * 2 + 3  # a 2-digit addition example read by the model: its sequence without the last token
    assert arrays["patterns"].shape == (2, 2, n, n) and arrays["tokens"].shape == (n,)
    names = "0 1 2 3 4 5 6 7 8 9 + = PAD".split()  # addition's inputs: digits, '+', '=' (then answer digits)
    assert arrays["names"].tolist()[:6] == [names[t] for t in arrays["tokens"][:6]]
    assert arrays["names"][2] == "+" and arrays["names"][5] == "="
    signal = json.loads((run / "analysis" / "signal.json").read_text())
    assert len(signal["trained"]["cosine"]) == 3  # embedding + 2 layers


def test_analyze_over_time_scores_every_kept_checkpoint(tmp_path, capsys):
    run = tmp_path / "run"
    train = ["train", *TINY, "--steps", "12", "--checkpoint-every", "6", "--keep-checkpoints", "log"]
    assert main([*train, "--out", str(run)]) == 0
    capsys.readouterr()
    assert main(["analyze", str(run), "--batch", "8", "--over-time"]) == 0
    out = capsys.readouterr().out
    steps = [1, 2, 3, 4, 5, 6, 7, 8, 9, 11, 12]  # log_spaced_steps(12)
    assert f"Over training ({len(steps)} checkpoints, steps 1-12): strongest induction score" in out
    history = json.loads((run / "analysis" / "over_time.json").read_text())
    assert history["steps"] == steps and history["metric"] == "exact_match"
    assert len(history["test"]) == len(steps) and all("loss" in t for t in history["test"])
    final = json.loads((run / "summary.json").read_text())["test"]
    assert history["test"][-1]["exact_match"] == pytest.approx(final["exact_match"])
    latest = json.loads((run / "analysis" / "head_scores.json").read_text())
    for kind in ("previous_token", "induction", "duplicate_token"):
        assert len(history["strongest"][kind]) == len(steps)
        assert history["scores"][kind][-1] == latest[kind]  # the last checkpoint is the latest
        best = history["strongest"][kind][-1]
        assert best["score"] == max(max(row) for row in latest[kind])
    assert (run / "analysis" / "over_time.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "over_time.json" in (run / "analysis" / "summary.md").read_text()


@pytest.mark.parametrize(
    "args, message",
    [
        (["analyze", "nowhere"], "run directory nowhere does not exist"),
        (["analyze", "RUN", "--example", "99999"], "example must be in [0, 40)"),
        (["analyze", "RUN", "--tokens", "1,2,99"], "out-of-range ids [99]"),
        (["analyze", "RUN", "--tokens", "1,x"], "tokens: expected comma-separated list of int"),
    ],
)
def test_analyze_bad_input(args, message, tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", *TINY, "--out", str(run)]) == 0
    capsys.readouterr()
    assert main([a.replace("RUN", str(run)) for a in args]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1
    assert not (run / "analysis").exists()
