"""docs/interop.md runs as written; TransformerLens computes the logits of the mixit models it accepts and
refuses the others in one line; nnsight reads and patches any mixit model at its hook points."""

import ast
import importlib
import math
import re
import runpy
from pathlib import Path

import pytest
import torch

from mixit.config import ModelConfig
from mixit.errors import UsageError
from mixit.models import Transformer
from tolerance import assert_close, forward_terms

PAGE = Path(__file__).resolve().parents[1] / "docs" / "interop.md"


def page_sections():
    """(title, python code) of each "## " section of docs/interop.md that has Python blocks, the blocks joined."""
    sections = re.split(r"^## ", PAGE.read_text(), flags=re.M)[1:]
    for section in sections:
        title, body = section.split("\n", 1)
        blocks = re.findall(r"^```python\n(.*?)^```", body, flags=re.M | re.S)
        if blocks:
            yield title.strip(), "\n".join(blocks)


def imported_packages(code):
    """The top-level packages `code` imports."""
    names = set()
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Import):
            names.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module.split(".")[0])
    return sorted(names)


@pytest.mark.parametrize("title, code", list(page_sections()), ids=lambda v: v if len(v) < 40 else "")
def test_the_page_snippets_run(title, code, tmp_path, monkeypatch):
    """Each section's Python blocks, in order, as one script run from a file in an empty directory (nnsight
    reads the source of its trace blocks back). Its libraries (the interop extra) are in the dev extra, so a
    section whose library is missing fails rather than passing unrun."""
    for package in imported_packages(code):
        importlib.import_module(package)
    monkeypatch.chdir(tmp_path)
    script = tmp_path / "snippets.py"
    script.write_text(code)
    runpy.run_path(str(script), run_name="__main__")


def test_the_page_has_the_sections_that_are_run():
    titles = [title for title, _ in page_sections()]
    assert {"Hook points and the cache", "nnsight", "TransformerLens", "Exporting to Hugging Face"} <= set(titles)


def tiny(**kw):
    settings = {"vocab_size": 16, "n_ctx": 8, "d_model": 32, "n_layers": 2, "n_heads": 4, "init_std": 0.3}
    return Transformer(ModelConfig(**{**settings, **kw}))


def tokens(seed=0, batch=3):
    return torch.randint(16, (batch, 8), generator=torch.Generator().manual_seed(seed))


def with_attention_biases(model):
    """`model` with random q, k, v, o biases and zero MLP biases: what TransformerLens can represent."""
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for block in model.layers:
            for layer in (block.attn.q, block.attn.k, block.attn.v, block.attn.o):
                layer.bias.copy_(torch.randn(layer.bias.shape, generator=g))
    return model


@pytest.mark.parametrize(
    "model",
    [
        pytest.param(lambda: tiny(bias=False), id="no-bias"),
        pytest.param(lambda: with_attention_biases(tiny()), id="attention-biases"),
        pytest.param(lambda: tiny(bias=False, width_scaling=True, branch_scale=0.5, rope_base=500.0), id="folded"),
        pytest.param(lambda: tiny(bias=False, d_mlp=24, n_heads=2), id="d_mlp"),
    ],
)
def test_transformer_lens_gives_the_same_logits_and_stream(model):
    from mixit.interop import to_transformer_lens

    model = model()
    x = tokens()
    random_state = torch.random.get_rng_state()
    bridge = to_transformer_lens(model)
    assert torch.equal(torch.random.get_rng_state(), random_state)  # the caller's random state is left alone
    logits, cache = bridge.run_with_cache(x)
    expected, ours = model.run_with_cache(x)
    # One float32 forward pass rounded in another order: each tensor within `forward_terms` roundings of its own
    # magnitude (tests/tolerance.py).
    terms = forward_terms(model.cfg)
    assert_close(logits, expected, terms=terms)
    for name in ["blocks.0.hook_resid_pre", "blocks.1.hook_resid_mid"]:
        assert_close(cache[name], ours[name], terms=terms, msg=name)
    # A softmax turns an error in a score into that error times the probability: the pattern's scale is the
    # scores', at most |q| |k| / sqrt(d_head).
    q, k = (cache[f"blocks.1.attn.hook_{n}"].norm(dim=-1).max() for n in "qk")  # over (B, T, H)
    scores = q * k / math.sqrt(model.cfg.d_head)
    assert_close(cache["blocks.1.attn.hook_pattern"], ours["blocks.1.attn.hook_pattern"], terms=terms, scale=scores)


def test_transformer_lens_converts_a_trained_variant():
    """frozen_qk after some optimizer steps (its queries and keys stay at their initialisation)."""
    from mixit.freezing import apply_variant
    from mixit.interop import to_transformer_lens

    model = tiny(bias=False, init_std=0.02)
    apply_variant(model, "frozen_qk")
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    for step in range(5):
        x = tokens(seed=step, batch=4)
        loss = torch.nn.functional.cross_entropy(model(x)[:, :-1].flatten(0, 1), x[:, 1:].flatten())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    x = tokens(seed=9)
    assert_close(to_transformer_lens(model)(x), model(x), terms=forward_terms(model.cfg))


@pytest.mark.parametrize(
    "model, message",
    [
        (lambda: tiny(attention="mixing"), r"softmax attention only, not mixing \(read this model through nnsight"),
        (lambda: tiny(head="classifier"), "causal language models only, not the classifier head"),
        (lambda: tiny(activation="shaped_leaky_relu", bias=False), "SiLU, not shaped_leaky_relu"),
        (lambda: tiny(skip_scale=0.5, bias=False), "skip_scale=0.5"),
        (lambda: tiny(rope_base=100.5, bias=False), "rope_base=100.5"),
        (lambda: tiny(), r"blocks.0.mlp.gate.bias is not zero \(train with --no-bias\)"),
    ],
)
def test_transformer_lens_refuses_what_it_cannot_represent_in_one_line(model, message):
    from mixit.interop import to_transformer_lens

    m = model()
    if m.cfg.bias:
        with torch.no_grad():
            m.blocks[0].mlp.gate.bias.fill_(0.1)
    with pytest.raises(UsageError, match="^TransformerLens cannot represent this model exactly: .*" + message) as err:
        to_transformer_lens(m)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("attention", ["softmax", "mixing"])
def test_nnsight_reads_and_patches_the_hook_points(attention):
    import nnsight

    model = tiny(attention=attention)
    x = tokens()
    traced = nnsight.NNsight(model)
    with traced.trace(x):
        resid = traced.blocks[0].hook_resid_post.output.save()
        logits = traced.output.save()
    expected, cache = model.run_with_cache(x, names_filter="blocks.0.hook_resid_post")
    assert torch.equal(resid, cache["blocks.0.hook_resid_post"])
    assert torch.equal(logits, expected)
    with traced.trace(x):
        traced.blocks[1].hook_attn_out.output = torch.zeros_like(traced.blocks[1].hook_attn_out.output)
        patched = traced.output.save()
    ablated = model.run_with_hooks(x, fwd_hooks=[("blocks.1.hook_attn_out", lambda a, hook: torch.zeros_like(a))])
    assert torch.equal(patched, ablated)
    assert not torch.equal(patched, expected)


@pytest.mark.parametrize("attention", ["softmax", "mixing"])
def test_nnsight_reads_and_patches_the_attention_pattern(attention):
    """hook_pattern runs under nnsight as under a torch hook (the fast path skips it when nothing watches it)."""
    import nnsight

    model = tiny(attention=attention)
    x = tokens()
    traced = nnsight.NNsight(model)
    with traced.trace(x):
        pattern = traced.blocks[0].attn.hook_pattern.output.save()
    _, cache = model.run_with_cache(x, names_filter="blocks.0.attn.hook_pattern")
    assert torch.equal(pattern, cache["blocks.0.attn.hook_pattern"])
    uniform = torch.ones_like(pattern).tril() / torch.ones_like(pattern).tril().sum(-1, keepdim=True)
    with traced.trace(x):
        traced.blocks[0].attn.hook_pattern.output = uniform
        patched = traced.output.save()
    want = model.run_with_hooks(x, fwd_hooks=[("blocks.0.attn.hook_pattern", lambda a, hook: uniform)])
    assert torch.equal(patched, want) and not torch.equal(patched, model(x))
