"""The decoder and its attention kinds: MixiT matrices, hooks, lengths, RoPE, configs."""

import math

import pytest
import torch

from mixit.core.config import ModelConfig
from mixit.core.models import Transformer, capture_patterns, mixit_matrices
from mixit.core.models.attention import apply_rope, layer_generator, rope_tables
from mixit.core.models.mlp import ShapedLeakyReLU
from mixit.errors import UsageError
from tolerance import assert_close, forward_terms, sampling_error


def tiny(attention="softmax", **kw):
    return ModelConfig(
        **{"vocab_size": 13, "n_ctx": 16, "d_model": 32, "n_layers": 2, "n_heads": 4, "attention": attention, **kw}
    )


def matrices(sink="normalised", alpha=1.0, T=12, H=3, seed=0):
    return mixit_matrices(H, T, 8, torch.Generator().manual_seed(seed), alpha=alpha, sink=sink)


@pytest.mark.parametrize("sink", ["normalised", "off"])
def test_mixit_rows_sum_to_one_and_are_causal(sink):
    a = matrices(sink=sink)
    assert a.shape == (3, 12, 12)
    # Built in float64, each entry rounded once to float32, then 12 added: 12 roundings of the row's |entries|.
    assert_close(a.sum(-1), torch.ones(3, 12), terms=12, scale=a.abs().sum(-1))
    assert torch.all(a.triu(diagonal=1) == 0)
    torch.testing.assert_close(a[:, 0], torch.eye(12)[0].expand(3, 12))


def test_mixit_centring_has_zero_mean_over_causal_support():
    # A - I restricted to row i is alpha * (W_i - mean(W_i[:i+1])): zero mean over j <= i.
    a = matrices(sink="off", alpha=0.7).double()
    centred = a - torch.eye(12, dtype=torch.float64)
    for i in range(12):
        row = a[:, i, : i + 1]  # zero mean in float64; each entry then rounded once to float32
        assert_close(centred[:, i, : i + 1].mean(-1), torch.zeros(3), dtype=torch.float32, scale=row.abs().mean(-1))
    assert centred.abs().max() > 1e-3  # the random part is really there


def test_mixit_alpha_zero_is_identity():
    torch.testing.assert_close(matrices(sink="off", alpha=0.0), torch.eye(12).expand(3, 12, 12))


def test_normalised_sink_head_is_half_identity_half_first_token():
    a = matrices(sink="normalised")
    expected = 0.5 * torch.eye(12)
    expected[:, 0] += 0.5
    torch.testing.assert_close(a[0], expected)
    # Only head 0 is replaced: the other heads are the same with or without the sink.
    torch.testing.assert_close(a[1:], matrices(sink="off")[1:])
    assert not torch.allclose(matrices(sink="off")[0], expected)


def test_mixit_sigma_range_per_head():
    # Row T-1 has T random entries with std sigma_h in [1/sqrt(T d_head), 1/sqrt(T)].
    T, d_head = 256, 16
    a = mixit_matrices(8, T, d_head, torch.Generator().manual_seed(1), sink="off")
    lower = torch.tril(a - torch.eye(T), diagonal=-1)
    n = T * (T - 1) / 2
    std = (lower.pow(2).sum((-1, -2)) / n).sqrt()
    assert torch.all(std > 0.8 / math.sqrt(T * d_head)) and torch.all(std < 1.2 / math.sqrt(T))


def test_mixit_buffers_are_seeded_and_differ_by_layer():
    m1, m2 = Transformer(tiny("mixing")), Transformer(tiny("mixing"))
    b = [blk.attn.mixing for blk in m1.blocks]
    assert torch.equal(b[0], m2.blocks[0].attn.mixing)
    assert not torch.equal(b[0], b[1])
    assert not torch.equal(b[0], Transformer(tiny("mixing", seed=1)).blocks[0].attn.mixing)
    assert "blocks.0.attn.mixing" in m1.state_dict()  # saved with the model


def test_layer_generator_is_deterministic():
    g1, g2 = layer_generator(3, 1), layer_generator(3, 1)
    assert torch.equal(torch.rand(4, generator=g1), torch.rand(4, generator=g2))


@pytest.mark.parametrize("attention", ["softmax", "mixing"])
def test_shorter_input_equals_prefix_and_right_padding_is_harmless(attention):
    torch.manual_seed(0)
    model = Transformer(tiny(attention)).eval()
    x = torch.randint(0, 13, (3, 16))
    full = model(x)
    terms = forward_terms(model.cfg)  # the same forward pass, its products of another shape
    for t in (1, 5, 11):
        assert_close(model(x[:, :t]), full[:, :t], terms=terms)
    padded = x.clone()
    padded[:, 9:] = 12  # right padding with a pad token
    assert_close(model(padded)[:, :9], full[:, :9], terms=terms)


def test_short_sequence_uses_top_left_block_of_mixing_matrix():
    model = Transformer(tiny("mixing")).eval()
    with capture_patterns(model) as patterns:
        model(torch.zeros(2, 7, dtype=torch.long))
    p = patterns["blocks.1.attn.hook_pattern"]
    assert p.shape == (2, 4, 7, 7)
    torch.testing.assert_close(p[1], model.blocks[1].attn.mixing[:, :7, :7])


@pytest.mark.parametrize("attention", ["softmax", "mixing"])
def test_pattern_hook_path_matches_fast_path(attention):
    model = Transformer(tiny(attention, mixing_sink="normalised")).eval()
    x = torch.randint(0, 13, (2, 16))
    fast = model(x)
    with capture_patterns(model) as patterns:
        hooked = model(x)
    assert_close(hooked, fast, terms=forward_terms(model.cfg))  # explicit softmax or the fused attention kernel
    assert sorted(patterns) == ["blocks.0.attn.hook_pattern", "blocks.1.attn.hook_pattern"]
    for p in patterns.values():
        assert p.shape == (2, 4, 16, 16)
        # A softmax's normaliser sums 16 terms, the row sum 16 more; a MixiT row's entries are signed.
        assert_close(p.sum(-1), torch.ones(2, 4, 16), terms=2 * 16, scale=p.abs().sum(-1))
        assert torch.all(p.triu(diagonal=1) == 0)
    assert not model.blocks[0].attn.hook_pattern.active  # hooks removed afterwards


STREAM_HOOKS = ["hook_resid_pre", "hook_attn_out", "hook_resid_mid", "hook_mlp_out", "hook_resid_post"]


@pytest.mark.parametrize("attention", ["softmax", "mixing"])
def test_run_with_cache_names_the_stream_as_transformer_lens_and_is_bit_identical(attention):
    model = Transformer(tiny(attention)).eval()
    x = torch.randint(0, 13, (2, 16), generator=torch.Generator().manual_seed(0))
    residual = [n for n in model.run_with_cache(x)[1] if "pattern" not in n]
    logits, cache = model.run_with_cache(x, names_filter=residual)  # no pattern: the fast attention path
    assert torch.equal(logits, model(x))
    positions = ["hook_pos_embed"] if attention == "mixing" else []
    blocks = [f"blocks.{i}.{name}" for i in range(2) for name in STREAM_HOOKS]
    assert list(cache) == ["hook_embed", *positions, *blocks, "ln_final.hook_normalized"]
    assert all(not t.requires_grad and t.shape == (2, 16, 32) for t in cache.values())
    # The stream adds up as the block says: resid_mid = resid_pre + attn_out, resid_post = resid_mid + mlp_out.
    embed = cache["hook_embed"] + (cache["hook_pos_embed"] if positions else 0)
    assert torch.equal(cache["blocks.0.hook_resid_pre"], embed)
    for i in range(2):
        c = {name: cache[f"blocks.{i}.{name}"] for name in STREAM_HOOKS}
        assert torch.equal(c["hook_resid_mid"], c["hook_resid_pre"] + c["hook_attn_out"])
        assert torch.equal(c["hook_resid_post"], c["hook_resid_mid"] + c["hook_mlp_out"])
    normalized = cache["ln_final.hook_normalized"]  # before the gain, which is 1 here
    assert torch.equal(normalized * model.norm_f.weight, model.norm_f(cache["blocks.1.hook_resid_post"]))
    assert not any(hook.active for hook in model.modules() if hasattr(hook, "active"))  # hooks removed


def test_ln_final_hook_normalized_is_the_stream_before_the_gain_which_applies_to_a_replacement_too():
    """TransformerLens's meaning of the name: h / rms(h), the final norm's gain multiplied in afterwards."""
    model = Transformer(tiny()).eval()
    with torch.no_grad():
        model.norm_f.weight.uniform_(0.5, 1.5, generator=torch.Generator().manual_seed(0))  # as if trained
    x = torch.randint(0, 13, (2, 16), generator=torch.Generator().manual_seed(3))
    logits, cache = model.run_with_cache(x, names_filter=["blocks.1.hook_resid_post", "ln_final.hook_normalized"])
    h, normalized = cache["blocks.1.hook_resid_post"], cache["ln_final.hook_normalized"]
    rms = h.pow(2).mean(-1, keepdim=True).add(1e-6).sqrt()  # (B, T, 1): a mean of d_model squares
    assert_close(normalized, h / rms, terms=model.cfg.d_model)
    assert_close(logits, model(x), terms=forward_terms(model.cfg))  # normalisation, then gain: the same product
    ones = torch.ones_like(normalized)
    patched = model.run_with_hooks(x, fwd_hooks=[("ln_final.hook_normalized", lambda a, hook: ones)])
    assert torch.equal(patched, model.lm_head(ones * model.norm_f.weight))


def test_run_with_cache_with_all_hook_points_includes_patterns_and_keeps_gradients():
    model = Transformer(tiny())
    x = torch.randint(0, 13, (2, 16), generator=torch.Generator().manual_seed(1))
    logits, cache = model.run_with_cache(x)
    assert_close(logits, model(x), terms=forward_terms(model.cfg))  # explicit softmax or the fused kernel
    assert cache["blocks.1.attn.hook_pattern"].shape == (2, 4, 16, 16)
    assert logits.requires_grad
    assert model.blocks[0].hook_resid_post.name == "blocks.0.hook_resid_post"


def test_run_with_hooks_patches_an_activation():
    model = Transformer(tiny("mixing")).eval()
    x = torch.randint(0, 13, (2, 16), generator=torch.Generator().manual_seed(2))
    seen = []

    def zero_mlp(activation, hook):
        seen.append(hook.name)
        return torch.zeros_like(activation)

    patched = model.run_with_hooks(x, fwd_hooks=[(lambda name: name.endswith("mlp_out"), zero_mlp)])
    assert seen == ["blocks.0.hook_mlp_out", "blocks.1.hook_mlp_out"]
    _, cache = model.run_with_cache(x)
    # Without its MLPs the model is the embedding plus the attention outputs, each read from the stream before it.
    h = cache["blocks.0.hook_resid_pre"]
    for block in model.blocks:
        h = h + block.attn(block.norm1(h))
    assert torch.equal(patched, model.lm_head(model.norm_f(h)))
    assert not torch.equal(patched, model(x))
    read_only = model.run_with_hooks(x, fwd_hooks=[("blocks.0.hook_resid_post", lambda activation, hook: None)])
    assert torch.equal(read_only, model(x))


def test_an_unknown_hook_point_is_refused_naming_the_hook_points():
    model = Transformer(tiny())
    x = torch.randint(0, 13, (1, 4))
    with pytest.raises(UsageError, match=r"no hook point named 'blocks.0.hook_resid'; the model has: hook_embed, "):
        model.run_with_cache(x, names_filter=["blocks.0.hook_resid"])
    assert not any(hook.active for hook in model.modules() if hasattr(hook, "active"))


@pytest.mark.parametrize("variant", ["standard", "frozen_qk"])
def test_fused_projections_match_separate_ones_and_gradients_reach_the_right_weights(variant):
    """Q, K, V through one product (standard) or Q, K through one and V alone
    (frozen_qk) give the attention of three separate projections."""
    from mixit.core.freezing import apply_variant

    model = Transformer(tiny("softmax"))
    apply_variant(model, variant)
    attn = model.blocks[0].attn
    torch.manual_seed(1)
    for p in (attn.q.bias, attn.k.bias, attn.v.bias):
        p.data.normal_()
    x = torch.randn(2, 16, 32)
    cos, sin = attn.rope_cos[:16], attn.rope_sin[:16]

    def heads(t):
        return t.view(2, 16, 4, 8).transpose(1, 2)

    q, k, v = apply_rope(heads(attn.q(x)), cos, sin), apply_rope(heads(attn.k(x)), cos, sin), heads(attn.v(x))
    y = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    expected = attn.o(y.transpose(1, 2).reshape(2, 16, 32))
    out = attn(x)
    # One attention layer in another order: a projection's d_model, the scores' d_head, the softmax's and A V's
    # n_ctx, the output projection's d_model.
    cfg = model.cfg
    assert_close(out, expected, terms=2 * cfg.d_model + cfg.d_head + 2 * cfg.n_ctx)
    out.sum().backward()
    assert attn.v.weight.grad is not None
    assert (attn.q.weight.grad is None) == (variant == "frozen_qk")


def test_rope_scores_depend_only_on_relative_position():
    cos, sin = rope_tables(32, 8, 10000.0)
    q, k = torch.randn(8), torch.randn(8)

    def score(i, j):
        qi = apply_rope(q.expand(1, 1, 32, 8), cos, sin)[0, 0, i]
        kj = apply_rope(k.expand(1, 1, 32, 8), cos, sin)[0, 0, j]
        return (qi * kj).sum()

    # Rotated by other angles (each table entry rounded, then a product and a sum per entry: 4 roundings), then
    # 8 products summed, each at most |q_i| |k_i|: at most |q| |k| in all.
    assert_close(score(5, 2), score(20, 17), terms=4 + 8, scale=q.norm() * k.norm())
    assert not torch.allclose(score(5, 2), score(5, 4))


def test_positions_follow_attention_kind():
    assert Transformer(tiny("softmax")).pos_embed is None
    mixing = Transformer(tiny("mixing"))
    assert mixing.pos_embed.weight.shape == (16, 32)
    assert not hasattr(mixing.blocks[0].attn, "q") and not hasattr(mixing.blocks[0].attn, "k")


def test_initialisation_follows_the_spec():
    model = Transformer(ModelConfig(vocab_size=50, n_ctx=8, d_model=256, n_layers=1, n_heads=4))
    w = model.blocks[0].mlp.up.weight
    assert w.std().item() == pytest.approx(0.02, rel=sampling_error(w.numel()))
    assert torch.all(model.blocks[0].attn.q.bias == 0)
    assert torch.all(model.blocks[0].norm1.weight == 1)
    assert torch.equal(model.embed.weight, Transformer(model.cfg).embed.weight)  # seeded


def test_too_long_input_is_refused():
    with pytest.raises(ValueError, match="exceeds the model's n_ctx=16"):
        Transformer(tiny()).forward(torch.zeros(1, 17, dtype=torch.long))


def test_shaped_settings_with_fan_in_initialisation():
    cfg = tiny("mixing", **ModelConfig.shaped(), width_init="fan_in", down_base_width=512)
    assert cfg.skip_scale == pytest.approx(math.sqrt(0.5)) and cfg.branch_scale == pytest.approx(math.sqrt(0.5))
    model = Transformer(cfg)
    assert model.blocks[0].mlp.down.multiplier == pytest.approx(math.sqrt(512 / 128))
    assert model.blocks[0].attn.v.multiplier == pytest.approx(math.sqrt(512 / 32))
    # Effective weight variance 1/fan_in.
    w = model.blocks[0].mlp.gate.weight * model.blocks[0].mlp.gate.multiplier
    assert w.var().item() * 32 == pytest.approx(1, rel=2 * sampling_error(w.numel()))  # a variance: twice a std's
    act = ShapedLeakyReLU(d_model=64, c=-1.0)
    assert act.slope == pytest.approx(1 - 1 / 8)
    x = torch.randn(200_000, generator=torch.Generator().manual_seed(0))
    # A sampling error, not a rounding one: act(x)^2 has variance about 2 (as x^2 does), so its mean over n draws
    # has standard error sqrt(2 / n); five of them.
    assert act(x).pow(2).mean().item() == pytest.approx(1.0, abs=5 * math.sqrt(2 / x.numel()))
    assert torch.isfinite(model(torch.zeros(1, 16, dtype=torch.long))).all()


@pytest.mark.parametrize(
    "bad, message",
    [
        ({"n_heads": 5}, "n_heads must divide d_model"),
        ({"attention": "linear"}, "unknown attention kind 'linear'; allowed: softmax, mixing"),
        ({"d_model": -4}, "d_model must be a positive integer"),
        ({"activation": "gelu"}, "unknown activation"),
    ],
)
def test_bad_model_config(bad, message):
    with pytest.raises(UsageError, match=message):
        tiny(**bad)


def test_unknown_config_key_is_an_error():
    with pytest.raises(UsageError, match="unknown model option"):
        ModelConfig.from_dict({"vocab_size": 3, "n_ctx": 4, "d_modle": 8})
