"""docs/interop.md runs as written; TransformerLens computes the logits of the mixit models it accepts (biases
included) and refuses the others in one line, and reads a run's tokens by their names; nnsight reads and patches
any mixit model at its hook points."""

import ast
import importlib
import math
import re
import runpy
from pathlib import Path

import pytest
import torch

from mixit.core.config import ModelConfig
from mixit.core.models import Transformer
from mixit.errors import UsageError
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


def with_biases(model, mlp=True):
    """`model` with random q, k, v, o biases and (with `mlp`) random gate, up, down biases; else zero MLP biases."""
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for block in model.blocks:
            layers = [block.attn.q, block.attn.k, block.attn.v, block.attn.o]
            layers += [block.mlp.gate, block.mlp.up, block.mlp.down] if mlp else []
            for layer in layers:
                layer.bias.copy_(torch.randn(layer.bias.shape, generator=g))
    return model


@pytest.mark.parametrize(
    "model",
    [
        pytest.param(lambda: tiny(bias=False), id="no-bias"),
        pytest.param(lambda: with_biases(tiny(), mlp=False), id="attention-biases"),
        pytest.param(lambda: with_biases(tiny()), id="all-biases"),
        pytest.param(lambda: with_biases(tiny(width_scaling=True, branch_scale=0.5)), id="biases-folded"),
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


def trained(model, steps, lr=1e-2):
    """`model` after `steps` AdamW steps of next-token prediction on random tokens (its trainable parameters)."""
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr)
    for step in range(steps):
        x = tokens(seed=step, batch=4)
        loss = torch.nn.functional.cross_entropy(model(x)[:, :-1].flatten(0, 1), x[:, 1:].flatten())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return model


def test_transformer_lens_converts_a_trained_variant():
    """frozen_qk after some optimizer steps (its queries and keys stay at their initialisation)."""
    from mixit.core.freezing import apply_variant
    from mixit.interop import to_transformer_lens

    model = tiny(bias=False, init_std=0.02)
    apply_variant(model, "frozen_qk")
    trained(model, steps=5)
    x = tokens(seed=9)
    assert_close(to_transformer_lens(model)(x), model(x), terms=forward_terms(model.cfg))


def test_every_hook_point_mixit_shares_with_the_bridge_holds_the_same_value_on_a_trained_model():
    """Trained norm gains (away from 1) and biases: each of mixit's hook points is the bridge's of that name, with
    TransformerLens's meaning. ``ln_final.hook_normalized`` is the normalized stream before the norm's gain, and
    ``hook_attn_out`` and ``hook_mlp_out`` are the bridge's divided by ``branch_scale``, which the conversion folds
    into the weights (docs/interop.md, "TransformerLens")."""
    from mixit.interop import to_transformer_lens

    model = trained(with_biases(tiny(width_scaling=True, branch_scale=0.5)), steps=20, lr=3e-2)
    assert (model.norm_f.weight - 1).abs().max() > 0.2  # far from the untrained gain of 1 that hid a difference
    x = tokens(seed=9)
    _, theirs = to_transformer_lens(model).run_with_cache(x)
    _, ours = model.run_with_cache(x)
    assert set(ours) <= set(theirs)  # a softmax model's hook points are all among the bridge's
    terms = forward_terms(model.cfg)
    for name, value in ours.items():
        scale = None  # each tensor's own magnitude
        if name.endswith(("hook_attn_out", "hook_mlp_out")):
            value = model.cfg.branch_scale * value  # 0.5: exact
        if name.endswith("hook_pattern"):  # the scores' scale, as in the logits test above
            layer = name.removesuffix("attn.hook_pattern")
            q, k = (theirs[f"{layer}attn.hook_{n}"].norm(dim=-1).max() for n in "qk")
            scale = q * k / math.sqrt(model.cfg.d_head)
        assert_close(theirs[name], value, terms=terms, scale=scale, msg=name)


def test_transformer_lens_reads_a_trained_run_by_its_token_names(tmp_path):
    """An induction run at mixit's defaults (biases on) converts with its task: the bridge computes the run's
    logits, reads and writes the task's token names, and TransformerLens's own detect_head, unpatched, on a
    string of those names scores every head as mixit's head_scores does in TransformerLens's convention."""
    from transformer_lens.head_detector import detect_head

    from mixit import run_config, train
    from mixit.analysis.induction import head_scores, repeated_sequences
    from mixit.core.run import Run
    from mixit.interop import to_transformer_lens

    tiny_run = {"d_model": 32, "n_layers": 2, "n_heads": 2, "batch_size": 64, "lr": 1e-2, "warmup_steps": 20}
    cfg = run_config("induction", "standard", {"alphabet": 8, "length": 16}, steps=700, test_size=64, **tiny_run)
    assert cfg.model.bias  # mixit's default: the MLP's biases are trained, not zero
    train(cfg, tmp_path / "run", progress=False)
    loaded = Run.open(tmp_path / "run").load("cpu")
    model, task = loaded.model.eval(), loaded.task
    bridge = to_transformer_lens(model, task)
    terms = forward_terms(model.cfg)
    with torch.no_grad():
        x = task.test_batch().inputs
        assert_close(bridge(x), model(x), terms=terms)

    # A probe `r r` (m distinct tokens, twice; 2m < n_ctx, detect_head's bound) written as the task's names.
    m, names = 7, task.token_names()
    probe = repeated_sequences(task.analysis_tokens(), m, batch=1, seed=3)  # (1, 2m)
    text = " ".join(names[t] for t in probe[0].tolist())
    assert torch.equal(bridge.to_tokens(text).cpu(), probe)
    assert bridge.to_str_tokens(text) == [names[t] for t in probe[0].tolist()]
    assert bridge.to_string(probe[0]) == text

    ours = head_scores(model, task.analysis_tokens(), m=m, batch=1, seed=3, convention="transformer_lens")
    # A score is r = N / D: N sums at most 2m pattern entries, D all m (2m + 1) causal ones. A score (q.k) is within
    # `terms` roundings of the scores' scale S (as in the test above), and a softmax moves each probability p by at
    # most 2 p times its scores' error, so N and D are each within 2 `terms` roundings of S relative to themselves,
    # and r within 4 `terms` of S r; the two sums add their lengths' roundings, relative to r too.
    _, cache = bridge.run_with_cache(probe)
    scale = max(
        cache[f"blocks.{i}.attn.hook_q"].norm(dim=-1).max() * cache[f"blocks.{i}.attn.hook_k"].norm(dim=-1).max()
        for i in range(model.cfg.n_layers)
    ) / math.sqrt(model.cfg.d_head)
    for head, key in [
        ("previous_token_head", "previous_token"),
        ("duplicate_token_head", "duplicate_token"),
        ("induction_head", "induction"),
    ]:
        theirs, r = detect_head(bridge, text, head), torch.tensor(ours[key])  # each (n_layers, n_heads)
        sums = 2 * m + m * (2 * m + 1)
        assert_close(theirs, r, terms=4 * terms + sums, scale=r.abs() * max(scale.item(), 1.0), msg=head)
    # The run learnt induction: its second layer holds the induction heads, as TransformerLens finds.
    induction = detect_head(bridge, text, "induction_head")
    assert induction[1].max() > 2 * induction[0].max()


def test_the_task_tokenizer_of_a_text_run_is_its_bpe(tmp_path):
    """A text task's tokenizer is the run's byte-level BPE: the bridge splits text as mixit does."""
    from mixit.core.tasks import make_task
    from mixit.interop import to_transformer_lens
    from text_fixtures import write_text_corpus

    corpus = write_text_corpus(tmp_path / "corpus.txt", n_docs=100)
    task = make_task("lm", {"corpus": str(corpus), "length": 16, "vocab": 300, "held_out": 0.1})
    model = tiny(vocab_size=task.vocab_size, n_ctx=16)
    bridge = to_transformer_lens(model, task)
    text = "the cat sat on the mat"
    ids = task.tokenizer.encode(text)
    assert bridge.to_tokens(text)[0].tolist() == ids
    assert "".join(bridge.to_str_tokens(text)) == text


def test_a_task_tokenizer_refuses_a_model_of_another_vocabulary_and_unknown_words_are_not_tokens():
    from mixit.core.tasks import make_task
    from mixit.interop import UNKNOWN, to_transformer_lens

    task = make_task("dyck", {})
    with pytest.raises(UsageError, match=f"^task dyck has {task.vocab_size} tokens and the model 16: not the run's"):
        to_transformer_lens(tiny(), task)
    bridge = to_transformer_lens(tiny(vocab_size=task.vocab_size), task)
    assert bridge.to_str_tokens("( ( ) ?") == ["(", "(", ")", "?"]
    assert bridge.tokenizer.pad_token == "PAD"  # the task's own padding
    assert bridge.to_tokens("( x")[0].tolist() == [task.token_names().index("("), task.vocab_size]
    assert bridge.tokenizer.convert_ids_to_tokens(task.vocab_size) == UNKNOWN


@pytest.mark.parametrize(
    "model, message",
    [
        (lambda: tiny(attention="mixing"), r"softmax attention only, not mixing \(read this model through nnsight"),
        (lambda: tiny(head="classifier"), "causal language models only, not the classifier head"),
        (lambda: tiny(activation="shaped_leaky_relu"), "SiLU, not shaped_leaky_relu"),
        (lambda: tiny(skip_scale=0.5), "skip_scale=0.5"),
        (lambda: tiny(rope_base=100.5), "rope_base=100.5"),
    ],
)
def test_transformer_lens_refuses_what_it_cannot_represent_in_one_line(model, message):
    from mixit.interop import to_transformer_lens

    m = model()
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
