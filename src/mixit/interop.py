"""mixit models in TransformerLens 4, through a ``TransformerBridge`` around its native transformer (docs/interop.md,
"TransformerLens"). nnsight needs nothing here: every hook point is a module. Both come with the ``interop`` extra.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

import torch
from torch import nn

from mixit.core.models import ATTENTION, SoftmaxAttention, Transformer
from mixit.core.models.layers import Linear
from mixit.errors import UsageError

if TYPE_CHECKING:
    from transformer_lens.model_bridge import TransformerBridge

    from mixit.core.tasks import Task

UNKNOWN = "<unk>"
"""Any word that is not a token name: id vocab_size, which the model cannot embed, so it fails there instead of
standing for some token."""


def transformer_lens_refusal(model: Transformer) -> str | None:
    """Why TransformerLens's native transformer cannot compute `model` exactly, or None if it can (width
    multipliers, branch_scale and biases are folded into its weights)."""
    cfg = model.cfg
    if not ATTENTION.get(cfg.attention).rotary:  # a kind without queries and keys of its own to rotate
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
    """A TransformerLens ``TransformerBridge`` with a copy of `model`'s weights, computing the same logits up to float
    rounding; its tokenizer is `task`'s (`task_tokenizer`), or none. A model it cannot represent is refused."""
    reason = transformer_lens_refusal(model)
    if reason is not None:
        raise UsageError(f"TransformerLens cannot represent this model exactly: {reason}")
    cfg = model.cfg
    if task is not None and task.vocab_size != cfg.vocab_size:
        raise UsageError(
            f"task {task.name} has {task.vocab_size} tokens and the model {cfg.vocab_size}: not the run's task"
        )
    from transformer_lens.config import TransformerBridgeConfig
    from transformer_lens.model_bridge.sources import build_bridge_from_module
    from transformer_lens.model_bridge.sources.native import NativeModel

    tl_cfg = TransformerBridgeConfig(
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
    with torch.random.fork_rng(devices=[]):  # the throw-away initialisation leaves the caller's random state alone
        native = NativeModel(tl_cfg)
        # Its gated MLP has no biases, as Llama's: each projection gets one, which the bridge calls as it is and
        # names in its processed weights (``b_gate``, ``b_in``, ``b_out``).
        for block in native.layers:
            for name in ("gate", "in", "out"):
                plain = getattr(block.mlp, name)
                block.mlp.add_module(name, nn.Linear(plain.in_features, plain.out_features))
    native.load_state_dict(native_state_dict(model))
    return build_bridge_from_module(
        native.to(next(model.parameters()).device),
        "TransformerLensNative",
        tl_config=tl_cfg,
        tokenizer=None if task is None else task_tokenizer(task, cfg.n_ctx),
        model_name="mixit",
    )


def task_tokenizer(task: Task, n_ctx: int) -> Any:
    """`task`'s tokens as a transformers fast tokenizer, which TransformerLens's string tools read: a text task's BPE,
    or one word per token (`Task.token_names`), split at whitespace, `UNKNOWN` for any other word, no BOS."""
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


def _folded(layer: Linear, scale: float = 1.0, rows: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """`layer`'s weight and bias (zeros if none) times its multiplier and `scale`, rows reordered by `rows`."""
    factor = layer.multiplier * scale
    weight = layer.weight.detach()
    bias = layer.bias.detach() * factor if layer.bias is not None else weight.new_zeros(layer.out_features)
    tensors = {"weight": weight * factor, "bias": bias}
    return tensors if rows is None else {k: v[rows] for k, v in tensors.items()}


def native_state_dict(model: Transformer) -> dict[str, torch.Tensor]:
    """`model`'s weights, copied, as TransformerLens's ``NativeModel`` (MLP biases added) names them, with width
    multipliers and branch_scale folded in. mixit's RoPE rotates dimension i of a head with i + d_head/2,
    TransformerLens's 2i with 2i + 1: its query and key row 2i is mixit's row i, row 2i + 1 is row i + d_head/2."""
    cfg = model.cfg
    half = torch.arange(cfg.d_head // 2)
    within = torch.stack([half, half + cfg.d_head // 2], dim=-1).flatten()  # (d_head,)
    rows = (torch.arange(cfg.n_heads)[:, None] * cfg.d_head + within).flatten()  # (n_heads * d_head,)
    state = {"tok_embed.weight": model.embed.weight.detach()}
    for i, block in enumerate(model.blocks):
        attn, mlp = cast(SoftmaxAttention, block.attn), block.mlp
        parts = {
            "attn.q": _folded(attn.q, rows=rows),
            "attn.k": _folded(attn.k, rows=rows),
            "attn.v": _folded(attn.v),
            "attn.o": _folded(attn.o, cfg.branch_scale),
            "mlp.gate": _folded(mlp.gate),
            "mlp.in": _folded(mlp.up),
            "mlp.out": _folded(mlp.down, cfg.branch_scale),
        }
        state.update({f"layers.{i}.{name}.{k}": v for name, tensors in parts.items() for k, v in tensors.items()})
        state[f"layers.{i}.ln1.weight"] = block.norm1.weight.detach()
        state[f"layers.{i}.ln2.weight"] = block.norm2.weight.detach()
    state["ln_out.weight"] = model.norm_f.weight.detach()
    state["head.weight"] = _folded(model.lm_head)["weight"]
    return {k: v.clone() for k, v in state.items()}
