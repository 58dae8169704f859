"""Variants freeze exactly the parameters MODEL.md says, and the optimizer sees only the rest."""

import pytest
import torch

from mixit.config import ModelConfig, TrainConfig
from mixit.errors import UsageError
from mixit.freezing import VARIANTS, apply_variant, check_attention
from mixit.models import Transformer
from mixit.training.optim import build_optimizer


def model(attention="softmax"):
    return Transformer(ModelConfig(vocab_size=11, n_ctx=8, d_model=16, n_layers=2, n_heads=2, attention=attention))


def names(prefixes, parts, layers=(0, 1)):
    return {
        f"blocks.{i}.{p}.{part}.{wb}" for i in layers for p in prefixes for part in parts for wb in ("weight", "bias")
    }


def test_standard_freezes_nothing():
    m = model()
    report = apply_variant(m, "standard")
    assert report.frozen == {}
    assert report.n_trainable == sum(p.numel() for p in m.parameters())


def test_frozen_qk_freezes_exactly_q_and_k():
    m = model()
    report = apply_variant(m, "frozen_qk")
    assert set(report.frozen) == names(["attn"], ["q", "k"])
    assert report.n_frozen == 2 * 2 * (16 * 16 + 16)
    assert "blocks.0.attn.v.weight" in report.trainable


def test_frozen_mlp_freezes_exactly_the_mlps():
    report = apply_variant(model(), "frozen_mlp")
    assert set(report.frozen) == names(["mlp"], ["gate", "up", "down"])


def test_mixit_trains_everything_but_has_no_query_key():
    m = model("mixing")
    report = apply_variant(m, "mixit")
    assert report.frozen == {}
    assert not any(".attn.q." in n or ".attn.k." in n for n in report.trainable)
    assert "pos_embed.weight" in report.trainable
    assert all(not b.requires_grad for b in m.buffers())


@pytest.mark.parametrize(
    "attention, trainable",
    [
        ("softmax", {"embed.weight", "lm_head.weight"}),
        ("mixing", {"embed.weight", "pos_embed.weight", "lm_head.weight"}),
    ],
)
def test_random_trains_only_embeddings_and_head(attention, trainable):
    report = apply_variant(model(attention), "random")
    assert set(report.trainable) == trainable
    assert "norm_f.weight" in report.frozen


def test_rule_matching_nothing_is_an_error():
    with pytest.raises(UsageError, match="matches no parameter"):
        apply_variant(model("mixing"), "frozen_qk")
    with pytest.raises(UsageError, match="variant 'frozen_qk' uses softmax attention"):
        check_attention(VARIANTS["frozen_qk"], "mixing")
    check_attention(VARIANTS["random"], "mixing")  # random works with either kind


def test_unknown_variant():
    with pytest.raises(UsageError, match="unknown variant 'frozen'; allowed: standard, frozen_qk"):
        apply_variant(model(), "frozen")


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


def test_report_summary_counts():
    m = model()
    report = apply_variant(m, "frozen_mlp")
    total = sum(p.numel() for p in m.parameters())
    assert report.n_frozen + report.n_trainable == total
    assert f"{report.n_trainable:,} of {total:,} parameters trainable" in report.summary()
