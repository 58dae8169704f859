"""mixit models in TransformerLens and nnsight (docs/interop.md).

- nnsight wraps any mixit model as it is, MixiT included: ``NNsight(model)``
  traces it, and every hook point (docs/model.md, "Hook points") is a module
  whose ``.output`` can be read or replaced. Nothing here is needed for it.
- TransformerLens (4.x) analyses models through its ``TransformerBridge``.
  `to_transformer_lens` builds one around TransformerLens's own native
  transformer with this model's weights, for the runs that transformer
  represents exactly (`transformer_lens_refusal` says which do not), and,
  given the run's task, with its token names as the bridge's tokenizer
  (`task_tokenizer`), so TransformerLens's string tools (``to_tokens``,
  ``to_str_tokens``, ``detect_head``) read the task's tokens.

Both libraries come with the ``interop`` extra (``pip install 'mixit-transformers[interop]'``)
and are imported only when called.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

import torch
from torch import nn

from mixit.errors import UsageError
from mixit.models import SoftmaxAttention, Transformer
from mixit.models.layers import Linear

if TYPE_CHECKING:
    from transformer_lens.model_bridge import TransformerBridge

    from mixit.tasks import Task

UNKNOWN = "<unk>"
"""The one entry of a task's tokenizer beyond the model's vocabulary (id vocab_size): any word that is not a
token name. The model cannot embed it, so such a word fails in the embedding instead of standing for a token."""


def transformer_lens_refusal(model: Transformer) -> str | None:
    """Why TransformerLens's native transformer cannot compute `model` exactly, or None if it can.

    It represents a causal language model with softmax attention and rotate-half RoPE of an integer
    base, pre-RMSNorm blocks on the plain residual h + branch, a SiLU-gated MLP, and an LM head without
    bias. Width multipliers and branch_scale are folded into the weights; the q, k, v, o biases and the
    MLP's gate, up and down biases are carried over (`native_model`).
    """
    cfg = model.cfg
    if cfg.attention != "softmax":
        return f"it has softmax attention only, not {cfg.attention} (read this model through nnsight: docs/interop.md)"
    if cfg.head != "lm" or not cfg.causal:
        return f"it builds causal language models only, not the {cfg.head} head"
    if cfg.activation != "silu":
        return f"its gated MLP uses SiLU, not {cfg.activation}"
    if cfg.skip_scale != 1.0:
        return f"its residual is h + branch, not skip_scale={cfg.skip_scale} times h plus the branch"
    if cfg.rope_base != int(cfg.rope_base):
        return f"its RoPE base is an integer, not rope_base={cfg.rope_base}"
    return None


def to_transformer_lens(model: Transformer, task: Task | None = None) -> TransformerBridge:
    """A TransformerLens ``TransformerBridge`` computing the same logits as `model` (up to float rounding).

    Its hook points carry TransformerLens's names (``blocks.0.hook_resid_post``, ``blocks.0.attn.hook_pattern``,
    and more: ``hook_q``, ``hook_z``, ``mlp.hook_post``). A model it cannot represent is refused in one line
    (`transformer_lens_refusal`); the copy shares no tensor with `model`. With `task` (the run's, as
    ``Run.load`` returns it), the bridge's tokenizer is `task_tokenizer`; without, it has none.
    """
    reason = transformer_lens_refusal(model)
    if reason is not None:
        raise UsageError(f"TransformerLens cannot represent this model exactly: {reason}")
    if task is not None and task.vocab_size != model.cfg.vocab_size:
        raise UsageError(
            f"task {task.name} has {task.vocab_size} tokens and the model {model.cfg.vocab_size}: not the run's task"
        )
    from transformer_lens.model_bridge.sources import build_bridge_from_module

    tl_cfg = _bridge_config(model)
    tokenizer = None if task is None else task_tokenizer(task, model.cfg.n_ctx)
    return build_bridge_from_module(
        native_model(model, tl_cfg), "TransformerLensNative", tl_config=tl_cfg, tokenizer=tokenizer, model_name="mixit"
    )


def native_model(model: Transformer, tl_cfg: Any) -> nn.Module:
    """TransformerLens's ``NativeModel`` of config `tl_cfg` holding `model`'s weights (`native_state_dict`).

    Its gated MLP is built without biases, as Llama's; each of its gate, in and out projections is replaced by
    one with a bias before loading. The bridge calls these modules as they are and names their bias in its
    processed weights (``b_gate``, ``b_in``, ``b_out`` of ``GatedMLPBridge``), so MLP biases are carried
    exactly; a model without biases gets zero ones.
    """
    from transformer_lens.model_bridge.sources.native import NativeModel

    with torch.random.fork_rng(devices=[]):  # the throw-away initialisation leaves the caller's random state alone
        native = NativeModel(tl_cfg)
        for block in native.layers:
            for name in ("gate", "in", "out"):
                plain = getattr(block.mlp, name)
                block.mlp.add_module(name, nn.Linear(plain.in_features, plain.out_features))
    native.load_state_dict(native_state_dict(model))
    return native.to(next(model.parameters()).device)


def task_tokenizer(task: Task, n_ctx: int) -> Any:
    """`task`'s tokens as a transformers fast tokenizer, the form TransformerLens's string tools read.

    A text task: the run's own byte-level BPE (`mixit.export.hf_tokenizer`). Any other task: one word per
    token, its name (`Task.token_names`: '+', '(', 'k3', 'PAD', ...) at its id, words split at whitespace
    and decoded joined by spaces, so ``"1 2 3 1 2 3"`` is ids 1 2 3 1 2 3. A word that is not a token name
    becomes `UNKNOWN`; a task's 'PAD' is the pad token. There is no BOS: mixit's tasks have none, and the
    bridge prepends none unless asked.
    """
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    text = getattr(task, "tokenizer", None)
    if text is not None:
        from mixit.export import hf_tokenizer

        return hf_tokenizer(text.to_str(), n_ctx)
    names = task.token_names()
    words = [*names, UNKNOWN]
    if len(set(words)) != len(words) or any(name.split() != [name] for name in names):
        raise UsageError(f"task {task.name}'s token names are not distinct words without spaces: {names}")
    tokenizer = Tokenizer(models.WordLevel({word: i for i, word in enumerate(words)}, unk_token=UNKNOWN))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        unk_token=UNKNOWN,
        pad_token="PAD" if "PAD" in names else None,
        model_max_length=n_ctx,
        clean_up_tokenization_spaces=False,
    )


def _bridge_config(model: Transformer) -> Any:
    """The TransformerBridgeConfig of TransformerLens's native transformer with `model`'s shape."""
    from transformer_lens.config import TransformerBridgeConfig

    cfg = model.cfg
    return TransformerBridgeConfig(
        d_model=cfg.d_model,
        d_head=cfg.d_head,
        n_layers=cfg.n_layers,
        n_ctx=cfg.n_ctx,
        n_heads=cfg.n_heads,
        d_mlp=cfg.d_mlp,
        d_vocab=cfg.vocab_size,
        architecture="TransformerLensNative",
        act_fn="silu",
        gated_mlp=True,
        normalization_type="RMS",
        final_rms=True,
        eps=model.norm_f.eps or 0.0,
        positional_embedding_type="rotary",
        rotary_dim=cfg.d_head,
        rotary_base=int(cfg.rope_base),
        default_prepend_bos=False,
        dtype=next(model.parameters()).dtype,
    )


def _rope_rows(n_heads: int, d_head: int) -> torch.Tensor:
    """Row order taking mixit's rotate-half RoPE layout to TransformerLens's adjacent pairs.

    mixit rotates dimension i of a head with dimension i + d_head/2; TransformerLens rotates 2i with 2i + 1,
    at the same frequency. Row 2i of the new layout is row i of mixit's, row 2i + 1 is row i + d_head/2.
    """
    half = torch.arange(d_head // 2)
    within = torch.stack([half, half + d_head // 2], dim=-1).flatten()  # (d_head,)
    return (torch.arange(n_heads)[:, None] * d_head + within).flatten()  # (n_heads * d_head,)


def _folded(layer: Linear, scale: float = 1.0, rows: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """`layer`'s weight (and bias) with its output multiplier and `scale` folded in, rows reordered by `rows`."""
    factor = layer.multiplier * scale
    weight = layer.weight.detach()
    bias = layer.bias.detach() * factor if layer.bias is not None else weight.new_zeros(layer.out_features)
    tensors = {"weight": weight * factor, "bias": bias}
    return tensors if rows is None else {k: v[rows] for k, v in tensors.items()}


def native_state_dict(model: Transformer) -> dict[str, torch.Tensor]:
    """`model`'s weights under the names of TransformerLens's ``NativeModel`` with biased MLP projections
    (`native_model`), with width multipliers and branch_scale folded in and queries and keys reordered for its
    RoPE layout (`_rope_rows`). Every projection has a bias: zeros where `model` has none."""
    cfg = model.cfg
    rows = _rope_rows(cfg.n_heads, cfg.d_head)
    branch = cfg.branch_scale
    state = {"tok_embed.weight": model.embed.weight.detach()}
    for i, block in enumerate(model.layers):
        layer, attn, mlp = f"layers.{i}", cast(SoftmaxAttention, block.attn), block.mlp
        parts = {
            "attn.q": _folded(attn.q, rows=rows),
            "attn.k": _folded(attn.k, rows=rows),
            "attn.v": _folded(attn.v),
            "attn.o": _folded(attn.o, branch),
            "mlp.gate": _folded(mlp.gate),
            "mlp.in": _folded(mlp.up),
            "mlp.out": _folded(mlp.down, branch),
        }
        state.update({f"{layer}.{name}.{k}": v for name, tensors in parts.items() for k, v in tensors.items()})
        state[f"{layer}.ln1.weight"] = block.norm1.weight.detach()
        state[f"{layer}.ln2.weight"] = block.norm2.weight.detach()
    state["ln_out.weight"] = model.norm_f.weight.detach()
    state["head.weight"] = _folded(model.lm_head)["weight"]
    return {k: v.clone() for k, v in state.items()}
