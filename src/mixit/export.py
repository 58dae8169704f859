"""`mixit export RUN --to hf|hub`: a trained run as a Hugging Face model directory (docs/interop.md).

``--to hf`` writes a transformers ``LlamaForCausalLM``, loadable with no mixit installed. At the
settings the two share, a softmax model is exactly a Llama with biases: RMSNorm pre-norm, RoPE,
gated SiLU MLP, untied LM head without bias (docs/model.md). The names map one to one
(`LLAMA_NAMES`); RoPE needs no permutation of the q and k weights, because mixit rotates as
Llama does: frequency i of a head pairs dimensions i and i + d_head/2 (``rotate_half``; see
`mixit.models.attention.rope_tables`). What Llama cannot express (`LLAMA_NEEDS`) is refused in
one line naming the option, with ``--to hub`` suggested. The exported model is run beside the
mixit one on a probe batch before anything is written (`check_parity`).

``--to hub`` writes any mixit model (MixiT included) in the Hub's conventions, through the
``PyTorchModelHubMixin`` of `Transformer`: config and safetensors, read back by
``Transformer.from_pretrained(DIR)`` (mixit installed).

Both write a model card (README.md: task, variant, what was frozen, test metrics, versions) and,
for a text task, the run's tokenizer. The directory is assembled beside ``--out`` and moved into
place when complete; an ``--out`` that exists and is not empty is refused before any work.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable, Mapping
from dataclasses import fields
from pathlib import Path
from typing import Any, Literal

import torch

from mixit.config import ModelConfig
from mixit.errors import UsageError
from mixit.files import check_output_dir, read_json, write_text
from mixit.freezing import VARIANTS
from mixit.models import Transformer
from mixit.run import Loaded, Run
from mixit.text.tokenizer import EOS, PAD, TOKENIZER_FILE
from mixit.version import __version__, git_commit, install_hint

Target = Literal["hf", "hub"]

LLAMA_NEEDS: dict[str, tuple[Any, str]] = {
    "attention": ("softmax", "MixiT attention"),
    "width_scaling": (False, "width scaling"),
    "skip_scale": (1.0, "a residual skip scale other than 1"),
    "branch_scale": (1.0, "a residual branch scale other than 1"),
    "activation": ("silu", "an activation other than SiLU"),
    "head": ("lm", "the classifier head"),
    "causal": (True, "non-causal attention"),
}
"""Model options Llama can express at one value only: option -> (that value, what any other value is)."""

LLAMA_MAPS = ("vocab_size", "n_ctx", "d_model", "n_layers", "n_heads", "d_mlp", "bias", "rope_base", "init_std")
"""Model options that become a field of the Llama config (`llama_config`)."""

LLAMA_IGNORES = {
    "qk_init": "initialisation only",
    "width_init": "initialisation only",
    "seed": "initialisation only (and MixiT's matrices)",
    "mixing_alpha": "MixiT only",
    "mixing_sink": "MixiT only",
    "mixing_centring": "MixiT only",
    "depth_alpha": "MixiT's matrices only; its residual scales are skip_scale and branch_scale",
    "base_n_layers": "depth scaling only (see depth_alpha)",
    "leaky_c": "the shaped activation only",
    "base_width": "width scaling only",
    "down_base_width": "width scaling only",
    "width_scale_head": "width scaling only",
    "n_classes": "the classifier head only",
    "pooling": "the classifier head only",
    "pad_id": "read only by non-causal attention and the classifier; recorded as pad_token_id",
}
"""Model options that leave a causal softmax language model's forward pass unchanged, and why."""

LLAMA_NAMES = {
    "norm1": "input_layernorm",
    "attn.q": "self_attn.q_proj",
    "attn.k": "self_attn.k_proj",
    "attn.v": "self_attn.v_proj",
    "attn.o": "self_attn.o_proj",
    "norm2": "post_attention_layernorm",
    "mlp.gate": "mlp.gate_proj",
    "mlp.up": "mlp.up_proj",
    "mlp.down": "mlp.down_proj",
}
"""Each block's modules in mixit -> in a Llama decoder layer (weights and biases alike)."""


def export_run(run_dir: Path, to: Target = "hf", out: Path | None = None) -> Path:
    """Write a run's latest checkpoint as a Hugging Face model directory.

    Returns where it was written.

    Args:
        run_dir: The run directory.
        to: The format: hf (a transformers LlamaForCausalLM, loadable without mixit; softmax variants at
            Llama's settings only) or hub (any mixit model, for Transformer.from_pretrained; needs mixit).
        out: The directory to write, which must be absent or empty; null means RUN_DIR-hf or RUN_DIR-hub beside
            the run.
    """
    run = Run.open(run_dir)
    out = Path(out) if out is not None else run.path.with_name(f"{run.path.name}-{to}")
    if to == "hf":
        llama_refusal(run.config.model)
        require_transformers()
    check_export_dir(out)
    loaded = run.load("cpu")
    writers: dict[str, Callable[[Loaded, Path], None]] = {"hf": write_llama, "hub": write_hub}
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        writers[to](loaded, tmp)
        write_text(tmp / "README.md", model_card(run, loaded, to))
        os.replace(tmp, out)  # an empty --out is replaced whole
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def check_export_dir(out: Path) -> None:
    """Refuse `out` unless it is absent or an empty directory that can be written."""
    if out.is_dir() and any(out.iterdir()):
        raise UsageError(f"output directory {out} is not empty; choose a new or empty directory")
    check_output_dir(out)


def require_transformers() -> None:
    """Refuse --to hf without the transformers package."""
    try:
        import transformers  # noqa: F401
    except ImportError:
        raise UsageError(f"--to hf needs the transformers package: {install_hint('bench')}") from None


# -- --to hf: a transformers LlamaForCausalLM -----------------------------------------------


def llama_refusal(cfg: ModelConfig) -> None:
    """Refuse, in one line naming the option, a model that a Llama cannot compute exactly."""
    defaults = ModelConfig(vocab_size=cfg.vocab_size, n_ctx=cfg.n_ctx, d_model=cfg.d_model)
    for f in fields(cfg):
        value = getattr(cfg, f.name)
        needed, what = LLAMA_NEEDS.get(f.name, (None, ""))
        if f.name in LLAMA_NEEDS and value != needed:
            reason = f"{f.name}={value!r}: {what}"
        elif f.name not in (*LLAMA_NEEDS, *LLAMA_MAPS, *LLAMA_IGNORES) and value != getattr(defaults, f.name):
            reason = f"{f.name}={value!r}, a setting the Llama export does not know"
        else:
            continue
        raise UsageError(f"a Hugging Face Llama cannot express {reason}; export with --to hub instead")


def llama_config(loaded: Loaded) -> Any:
    """The LlamaConfig of the run's model: the same shapes, RoPE base and norm epsilon, no tied head."""
    from transformers import LlamaConfig

    cfg = loaded.cfg.model
    tokenizer = getattr(loaded.task, "tokenizer", None)
    eos = tokenizer.eos_id if tokenizer is not None else None
    # from_dict: rope_theta is the field in transformers 4 and read into rope_parameters by transformers 5.
    return LlamaConfig.from_dict(
        {
            "vocab_size": cfg.vocab_size,
            "hidden_size": cfg.d_model,
            "intermediate_size": cfg.d_mlp,
            "num_hidden_layers": cfg.n_layers,
            "num_attention_heads": cfg.n_heads,
            "num_key_value_heads": cfg.n_heads,
            "head_dim": cfg.d_head,
            "max_position_embeddings": cfg.n_ctx,
            "rope_theta": cfg.rope_base,
            "rms_norm_eps": loaded.model.norm_f.eps,
            "attention_bias": cfg.bias,
            "mlp_bias": cfg.bias,
            "hidden_act": "silu",
            "tie_word_embeddings": False,
            "initializer_range": cfg.init_std,
            "bos_token_id": eos,  # a document starts after EOS; synthetic tasks have neither
            "eos_token_id": eos,
            "pad_token_id": cfg.pad_id if cfg.pad_id is not None else getattr(tokenizer, "pad_id", None),
        }
    )


def llama_state_dict(model: Transformer) -> dict[str, torch.Tensor]:
    """The model's parameters under Llama's names (`LLAMA_NAMES`); the same tensors, no copy."""
    state = {
        "model.embed_tokens.weight": model.embed.weight,
        "model.norm.weight": model.norm_f.weight,
        "lm_head.weight": model.lm_head.weight,
    }
    for i, block in enumerate(model.layers):
        for ours, theirs in LLAMA_NAMES.items():
            for name, tensor in block.get_submodule(ours).named_parameters():
                state[f"model.layers.{i}.{theirs}.{name}"] = tensor
    return {k: v.detach() for k, v in state.items()}


def to_llama(loaded: Loaded) -> Any:
    """A LlamaForCausalLM holding the run's weights (every one of its parameters, strictly)."""
    from transformers import LlamaForCausalLM

    # transformers initialises from the global generator: in a fork, so the caller's state is left alone.
    with torch.random.fork_rng(devices=[]):
        llama = LlamaForCausalLM(llama_config(loaded))
    llama.load_state_dict(llama_state_dict(loaded.model), strict=True)
    return llama.eval()


@torch.no_grad()
def check_parity(model: Transformer, llama: Any, tol: float = 1e-4) -> None:
    """Raise if the Llama's logits differ from the model's on a probe batch (a mapping bug, never the user's)."""
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, model.cfg.vocab_size, (2, min(model.cfg.n_ctx, 64)), generator=g)
    ours, theirs = model.eval()(tokens), llama(input_ids=tokens).logits
    gap = (ours - theirs).abs().max().item()
    if gap > tol * max(1.0, ours.abs().max().item()):
        raise RuntimeError(f"the exported Llama's logits differ from the mixit model's by {gap:.2e}")


def write_llama(loaded: Loaded, out: Path) -> None:
    """The LlamaForCausalLM directory: config, weights, generation config and, for text, the tokenizer."""
    llama = to_llama(loaded)
    check_parity(loaded.model, llama)
    tokenizer = getattr(loaded.task, "tokenizer", None)
    if tokenizer is not None:
        llama.generation_config = generation_config(tokenizer.eos_id, tokenizer.pad_id, loaded.cfg.model.n_ctx)
        hf_tokenizer(tokenizer.to_str(), loaded.cfg.model.n_ctx).save_pretrained(out)
    llama.save_pretrained(out)


def generation_config(eos_id: int, pad_id: int, n_ctx: int) -> Any:
    """`mixit sample`'s defaults (temperature 0.8, top 50, a document starts after EOS and ends at the
    next), within the context the model was trained on."""
    from transformers import GenerationConfig

    return GenerationConfig(
        do_sample=True,
        temperature=0.8,
        top_k=50,
        max_length=n_ctx,
        bos_token_id=eos_id,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
    )


def hf_tokenizer(tokenizer_json: str, n_ctx: int) -> Any:
    """The run's byte-level BPE as a transformers fast tokenizer. Text spelling a special token stays
    text (``split_special_tokens``), as in mixit; no BOS is added, as in mixit."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(tokenizer_json),
        eos_token=EOS,
        pad_token=PAD,
        model_max_length=n_ctx,
        split_special_tokens=True,
        clean_up_tokenization_spaces=False,
    )


# -- --to hub: the Transformer's own Hub mixin ----------------------------------------------


def write_hub(loaded: Loaded, out: Path) -> None:
    """The Hub directory of `Transformer.save_pretrained`, and the run's tokenizer for a text task."""
    loaded.model.save_pretrained(out)
    tokenizer = getattr(loaded.task, "tokenizer", None)
    if tokenizer is not None:
        tokenizer.save(out / TOKENIZER_FILE)


# -- the model card ---------------------------------------------------------------------------


def model_card(run: Run, loaded: Loaded, to: Target) -> str:
    """README.md of the exported directory: what the model is, how it was trained, how to load it."""
    cfg = loaded.cfg
    summary = run.summary() or {}
    record = read_json(run.config_path, "the run's config")
    front = "library_name: transformers\ntags: [mixit, llama]" if to == "hf" else "library_name: mixit\ntags: [mixit]"
    lines = [
        f"---\n{front}\n---\n",
        f"# mixit {cfg.task} / {cfg.variant}\n",
        f"A mixit model (Dong et al., arXiv 2506.01115) trained on task `{cfg.task}` under variant "
        f"`{cfg.variant}`: {VARIANTS.get(cfg.variant).description}.\n",
        f"- task parameters: `{json.dumps(cfg.params.to_dict())}`",
        f"- model: {cfg.model.n_layers} layers, d_model {cfg.model.d_model}, {cfg.model.n_heads} heads, "
        f"{cfg.model.attention} attention, n_ctx {cfg.model.n_ctx}, vocabulary {cfg.model.vocab_size}",
        f"- trained for {summary.get('steps', '?')} steps; test metrics: {format_metrics(summary.get('test'))}",
        f"- frozen at initialisation (never trained): {frozen_text(loaded.model, to)}",
        f"- trained by mixit {record.get('mixit_version')} (commit {record.get('git_commit') or 'unknown'}); "
        f"exported by mixit {__version__} (commit {git_commit() or 'unknown'})\n",
        "## Loading\n",
        usage(to, getattr(loaded.task, "tokenizer", None) is not None),
        "\nThe full run configuration:\n",
        f"```json\n{json.dumps(cfg.to_dict(), indent=2)}\n```\n",
    ]
    return "\n".join(lines)


def format_metrics(test: Mapping[str, Any] | None) -> str:
    """A summary's test metrics on one line (numbers only)."""
    if not test:
        return "none recorded (the run has not completed)"
    return ", ".join(f"{k} {v:.4f}" for k, v in test.items() if isinstance(v, float))


def frozen_text(model: Transformer, to: Target) -> str:
    """The frozen parameters of `model` (as its variant left them), counted and named by module
    (as the exported directory names them)."""
    frozen = dict.fromkeys(n.rpartition(".")[0] for n, p in model.named_parameters() if not p.requires_grad)
    if not frozen:
        return "nothing"
    count = sum(p.numel() for p in model.parameters() if not p.requires_grad)
    return f"{count:,} parameters: " + ", ".join(f"`{llama_name(n) if to == 'hf' else n}`" for n in frozen)


def llama_name(module: str) -> str:
    """A mixit module path under Llama's names: ``blocks.0.attn.q`` -> ``model.layers.0.self_attn.q_proj``."""
    if module == "norm_f":
        return "model.norm"
    _, layer, rest = module.split(".", 2) if module.count(".") >= 2 else (*module.split("."), "")
    return f"model.layers.{layer}" + (f".{LLAMA_NAMES[rest]}" if rest else "")


def usage(to: Target, text: bool) -> str:
    """The loading snippet of the card (`text`: the directory holds the run's tokenizer)."""
    if to == "hf":
        snippet = (
            "from transformers import AutoModelForCausalLM, AutoTokenizer\n\n"
            'model = AutoModelForCausalLM.from_pretrained("THIS_DIRECTORY")  # a LlamaForCausalLM; no mixit needed'
        )
        if text:
            snippet += '\ntokenizer = AutoTokenizer.from_pretrained("THIS_DIRECTORY")'
    else:
        snippet = (
            "from mixit.models import Transformer\n\n"
            f'model = Transformer.from_pretrained("THIS_DIRECTORY")  # needs mixit: {install_hint()}'
        )
        if text:
            snippet += '\n# the run\'s tokenizer: tokenizers.Tokenizer.from_file("THIS_DIRECTORY/tokenizer.json")'
    return f"```python\n{snippet}\n```"
