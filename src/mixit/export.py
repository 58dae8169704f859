"""`mixit export RUN --to hf|hub` and `mixit.load`, which reads a run, an export or its Hub repo id back
(docs/interop.md, "Exporting to Hugging Face").

--to hf writes a transformers LlamaForCausalLM, which a softmax model at Llama's settings is exactly (`LLAMA_NAMES`);
--to hub writes any model through `Transformer`'s PyTorchModelHubMixin, with mixit's own model code for
trust_remote_code (`remote_code`). Both record the run in config.json (``mixit_export``) and write a model card.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import torch
from safetensors.torch import load_file

from mixit.core.checkpoint import mismatch
from mixit.core.config import ModelConfig
from mixit.core.experiment import build, read_record
from mixit.core.freezing import VARIANTS, Variant
from mixit.core.models import Transformer
from mixit.core.run import CONFIG, EXPORTED, Loaded, Run, is_export
from mixit.core.text.tokenizer import EOS, PAD
from mixit.errors import UsageError, damaged, faults_said, reason_of, require
from mixit.files import check_names, check_output_dir, give_open_mode, read_json, write_json, write_text
from mixit.runtime import resolve_device
from mixit.version import __version__, git_commit, install_hint

Target = Literal["hf", "hub"]

LLAMA_NEEDS: dict[str, tuple[Any, str]] = {
    "attention": ("softmax", "an attention kind other than softmax"),
    "width_scaling": (False, "width scaling"),
    "skip_scale": (1.0, "a residual skip scale other than 1"),
    "branch_scale": (1.0, "a residual branch scale other than 1"),
    "activation": ("silu", "an activation other than SiLU"),
    "head": ("lm", "the classifier head"),
    "causal": (True, "non-causal attention"),
}
"""Model options Llama can express at one value only: option -> (that value, what any other value is)."""

LLAMA_FREE = (
    *("vocab_size", "n_ctx", "d_model", "n_layers", "n_heads", "d_mlp", "bias", "rope_base", "init_std"),  # mapped
    *("qk_init", "width_init", "seed"),  # initialisation only
    *("mixing_alpha", "mixing_sink", "mixing_centring", "depth_alpha", "base_n_layers"),  # MixiT's matrices only
    *("leaky_c", "base_width", "down_base_width", "width_scale_head"),  # a refused activation or width scaling
    *("n_classes", "pooling", "pad_id"),  # the classifier head and non-causal attention (pad_id: pad_token_id)
)
"""Model options Llama takes at any value: fields of its config (`llama_config`), or options that leave a causal
softmax language model's forward pass unchanged. Every option is here or in `LLAMA_NEEDS` (a test checks it)."""

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

REMOTE_CODE = ("mixit.remote_code.configuration_mixit", "mixit.remote_code.modeling_mixit")
"""The modules a --to hub export ships for trust_remote_code, with every mixit module they import."""

AUTO_CLASSES = {
    "lm": ("AutoModelForCausalLM", "MixitForCausalLM"),
    "classifier": ("AutoModelForSequenceClassification", "MixitForSequenceClassification"),
}
"""Each head's transformers Auto class, and the shipped class it builds."""

WEIGHTS = "model.safetensors"
HUB_TIMEOUT_S = 5.0
"""How long --push-to-hub waits for the Hub's answer to its first request, made before any work."""

EXPORT_AGAIN = "export the run again with `mixit export`"
"""What to do about an exported directory whose config or weights are missing or damaged."""


def export_run(run_dir: Path, to: Target = "hf", out: Path | None = None, push_to_hub: str | None = None) -> Path:
    """Write a run's latest checkpoint as a Hugging Face model directory; return where it was written.

    Args:
        run_dir: The run directory.
        to: The format: hf (a transformers LlamaForCausalLM, loadable without mixit; softmax variants at Llama's
            settings only) or hub (any model, for mixit.load, Transformer.from_pretrained or AutoModel with
            trust_remote_code).
        out: The directory to write, absent or empty; null means RUN_DIR-hf or RUN_DIR-hub beside the run.
        push_to_hub: A Hub repo id (user/name) to upload it to, created private if absent. Checked before any work:
            refused offline (HF_HUB_OFFLINE), without a token, or when the Hub does not answer within 5 s or
            refuses the token or the repo.
    """
    run = Run.open(run_dir)
    out = Path(out) if out is not None else run.path.with_name(f"{run.path.name}-{to}")
    if to == "hf":
        llama_refusal(run.config.model)
    require("transformers", f"--to {to} needs the transformers package: {install_hint('bench')}")
    check_output_dir(out)
    if out.is_dir() and any(out.iterdir()):
        raise UsageError(f"output directory {out} is not empty; choose a new or empty directory")
    run.summary()  # read for the card: a damaged summary.json is refused before any work
    with quiet_libraries():
        if push_to_hub is not None:
            check_push(push_to_hub)
        loaded = run.load("cpu")
        record = export_record(run, loaded, to)
        tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            with faults_said(out, "run the export again"):  # safetensors names no file: the fault names `out`
                tmp.mkdir(parents=True)
                entries = (write_llama if to == "hf" else write_hub)(loaded, tmp)
                save_generation_and_tokenizer(loaded, tmp, use_cache=to == "hf")  # a --to hub model keeps no cache
                config = read_json(tmp / CONFIG, "the exported config")
                write_json(tmp / CONFIG, {**config, **entries, EXPORTED: record})
                write_text(tmp / "README.md", model_card(record, loaded))
                for weights in tmp.glob("*.safetensors"):  # written by safetensors, 0600; the group may read the rest
                    give_open_mode(weights)
                os.replace(tmp, out)  # an empty --out is replaced whole
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        if push_to_hub is not None:
            push(out, push_to_hub)
    return out


@contextlib.contextmanager
def quiet_libraries() -> Iterator[None]:
    """Within: huggingface_hub's and transformers' progress bars and log lines off, so that an export says only
    mixit's own lines; their settings are put back afterwards (neither library has a context manager for them)."""
    from huggingface_hub.utils import are_progress_bars_disabled, disable_progress_bars, enable_progress_bars
    from huggingface_hub.utils import logging as hub_logging
    from transformers.utils import logging as hf_logging

    hub_bars_off, hf_bars_on = are_progress_bars_disabled(), hf_logging.is_progress_bar_enabled()
    levels = hub_logging.get_verbosity(), hf_logging.get_verbosity()
    hf_logging.disable_progress_bar()  # and huggingface_hub's
    hub_logging.set_verbosity_error()
    hf_logging.set_verbosity_error()
    try:
        yield
    finally:
        hub_logging.set_verbosity(levels[0])
        hf_logging.set_verbosity(levels[1])
        if hf_bars_on:
            hf_logging.enable_progress_bar()  # and huggingface_hub's, set right below
        (disable_progress_bars if hub_bars_off else enable_progress_bars)()


def export_record(run: Run, loaded: Loaded, to: Target) -> dict[str, Any]:
    """config.json's ``mixit_export``: enough for `load` to rebuild the model with its task, and for a reader (and
    the model card) to see what it is without mixit."""
    cfg, summary = loaded.cfg, run.summary() or {}
    return {
        "format": to,
        "task": cfg.task,
        "params": cfg.params.to_dict(),
        "variant": cfg.variant,
        "frozen": [name for name, p in loaded.model.named_parameters() if not p.requires_grad],
        "model": cfg.model.to_dict(),
        "steps": summary.get("steps"),
        "test": summary.get("test"),
        "exported_by": __version__,
        "run": read_json(run.config_path, "the run's config"),  # the record `read_record` reads back
    }


def hf_tokenizer(tokenizer_json: str, n_ctx: int) -> Any:
    """The run's byte-level BPE as a transformers fast tokenizer. As in mixit, text spelling a special token stays
    text (``split_special_tokens``) and no BOS is added."""
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


def save_generation_and_tokenizer(loaded: Loaded, out: Path, use_cache: bool) -> None:
    """Save a text task's tokenizer and a language model's generation config: greedy within n_ctx; for text,
    `mixit sample`'s defaults (temperature 0.8, top 50, a document starts after EOS and ends at the next)."""
    from transformers import GenerationConfig

    cfg, tokenizer = loaded.cfg.model, getattr(loaded.task, "tokenizer", None)
    if tokenizer is not None:
        hf_tokenizer(tokenizer.to_str(), cfg.n_ctx).save_pretrained(out)
    if cfg.head != "lm":
        return
    generation = GenerationConfig(max_length=cfg.n_ctx, use_cache=use_cache)
    if tokenizer is not None:
        eos = tokenizer.eos_id
        generation.update(
            do_sample=True, temperature=0.8, top_k=50, bos_token_id=eos, eos_token_id=eos, pad_token_id=tokenizer.pad_id
        )
    generation.save_pretrained(out)


# -- --to hf: a transformers LlamaForCausalLM -----------------------------------------------


def llama_refusal(cfg: ModelConfig) -> None:
    """Refuse, in one line naming the option, a model that a Llama cannot compute exactly."""
    for name, (needed, what) in LLAMA_NEEDS.items():
        if getattr(cfg, name) != needed:
            said = f"{name}={getattr(cfg, name)!r}: {what}"
            raise UsageError(f"a Hugging Face Llama cannot express {said}; export with --to hub instead")


def llama_config(cfg: ModelConfig, tokenizer: Any = None, eps: float | None = 1e-6) -> Any:
    """The LlamaConfig of a model of `cfg` (its shapes, RoPE base and RMSNorm `eps`, no tied head) with a text
    task's `tokenizer`."""
    from transformers import LlamaConfig

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
            "rms_norm_eps": eps,
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
    """The model's parameters under Llama's names (`LLAMA_NAMES`): the parameters themselves, no copy."""
    state = {
        "model.embed_tokens.weight": model.embed.weight,
        "model.norm.weight": model.norm_f.weight,
        "lm_head.weight": model.lm_head.weight,
    }
    for i, block in enumerate(model.blocks):
        for ours, theirs in LLAMA_NAMES.items():
            for name, parameter in block.get_submodule(ours).named_parameters():
                state[f"model.layers.{i}.{theirs}.{name}"] = parameter
    return state


@torch.no_grad()
def check_parity(model: Transformer, llama: Any, tol: float = 1e-4) -> None:
    """Raise if the Llama's logits differ from the model's on a probe batch (a mapping bug, never the user's)."""
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, model.cfg.vocab_size, (2, min(model.cfg.n_ctx, 64)), generator=g)
    ours, theirs = model.eval()(tokens), llama(input_ids=tokens).logits
    gap = (ours - theirs).abs().max().item()
    if gap > tol * max(1.0, ours.abs().max().item()):
        raise RuntimeError(f"the exported Llama's logits differ from the mixit model's by {gap:.2e}")


def write_llama(loaded: Loaded, out: Path) -> dict[str, Any]:
    """The LlamaForCausalLM directory, once its logits are checked against the model's; no config entries to add."""
    from transformers import LlamaForCausalLM

    with torch.random.fork_rng(devices=[]):  # transformers initialises from the caller's generator
        tokenizer = getattr(loaded.task, "tokenizer", None)
        llama = LlamaForCausalLM(llama_config(loaded.cfg.model, tokenizer, loaded.model.norm_f.eps))
    llama.load_state_dict(llama_state_dict(loaded.model), strict=True)
    check_parity(loaded.model, llama.eval())
    llama.save_pretrained(out)
    return {}


# -- --to hub: the Transformer's own Hub mixin ----------------------------------------------


def write_hub(loaded: Loaded, out: Path) -> dict[str, Any]:
    """`Transformer.save_pretrained`'s directory with the model's code for trust_remote_code (`remote_code`); return
    the config entries that point transformers' Auto classes at that code."""
    cfg, tokenizer = loaded.cfg.model, getattr(loaded.task, "tokenizer", None)
    loaded.model.save_pretrained(out)
    for name, source in remote_code().items():
        write_text(out / name, source)
    auto, ours = AUTO_CLASSES[cfg.head]
    entries: dict[str, Any] = {
        "model_type": "mixit",
        "architectures": [ours],
        "auto_map": {
            "AutoConfig": "configuration_mixit.MixitConfig",
            **dict.fromkeys(("AutoModel", auto), f"modeling_mixit.{ours}"),
        },
    }
    if cfg.head == "classifier":
        entries["num_labels"] = cfg.n_classes
    if tokenizer is not None:
        entries.update(eos_token_id=tokenizer.eos_id, pad_token_id=tokenizer.pad_id)
    return entries


def remote_code() -> dict[str, str]:
    """File name -> source of each module of `REMOTE_CODE` and every mixit module it imports, transitively, each
    ``from mixit.PACKAGE.MODULE import`` made ``from .MODULE import``: transformers copies a remote module's relative
    imports beside it, from one folder. The model is mixit's own, so no second copy of it can drift."""
    files: dict[str, str] = {}
    todo = list(REMOTE_CODE)
    while todo:
        path = Path(importlib.import_module(todo.pop()).__file__ or "")
        if path.name in files:
            continue
        source = path.read_text()
        todo += re.findall(r"^from (mixit\.[\w.]+) import", source, flags=re.M)
        files[path.name] = re.sub(r"^from mixit\.(?:\w+\.)*(\w+) import", r"from .\1 import", source, flags=re.M)
    return files


# -- loading back and pushing -----------------------------------------------------------------


def load(source: str | Path, device: str = "cpu") -> Loaded:
    """A trained model with its config and task from a run directory (its latest checkpoint), a `mixit export`
    directory (either format) or the Hub repo id of one. A damaged exported file is refused in one line naming it.

    A variant only chooses what trains, so a plugin's variant this process lacks is not needed: its name stands in
    for it while the config is read (`Registry.lent`), and the parameters the record names are frozen. A plugin's
    attention kind, activation or task is still needed.
    """
    path = locate(source)
    if not holds_export(path):
        return Run.open(path).load(device)
    config = path / CONFIG
    with damaged(config, EXPORT_AGAIN):
        meta = read_json(config, "the exported config")[EXPORTED]
        to, run, variant, attention = meta["format"], meta["run"], meta["variant"], meta["model"]["attention"]
        frozen = None if variant in VARIANTS else meta.get("frozen")  # the parameters a lent variant freezes
    stand_in = Variant(variant, attention, (), "as its export recorded it", any_attention=True)
    with VARIANTS.lent(variant, stand_in) if frozen is not None else contextlib.nullcontext():
        cfg = read_record(run, str(config))
        task, model, _ = build(cfg, path)
    parameters = dict(model.named_parameters())
    with damaged(config, EXPORT_AGAIN):
        for name in frozen or ():
            parameters[name].requires_grad_(False)  # a KeyError where the record names no parameter of the model
    views = llama_state_dict(model) if to == "hf" else model.state_dict()  # the model's own storage
    with damaged(path / WEIGHTS, EXPORT_AGAIN):
        weights = load_file(path / WEIGHTS)
        why = mismatch(weights, views)
        if why is not None:
            raise UsageError(f"{path / WEIGHTS} does not match the model of its {CONFIG} ({why})")
    with torch.no_grad():
        for name, view in views.items():
            view.copy_(weights[name])
    return Loaded(cfg, task, model.to(resolve_device(device)), path)


def locate(source: str | Path) -> Path:
    """The directory `source` names, or else the local copy of Hub model `source` (``snapshot_download``, which
    reads its cache when offline)."""
    path = Path(source)
    check_names(path)  # a name too long for its filesystem, which `exists` would raise on
    if path.exists():
        return path
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(str(source)))
    except (ValueError, OSError) as e:  # an invalid id, no such repo, offline with nothing cached
        raise UsageError(
            f"run directory {source} does not exist, and no Hub model {source} can be read ({reason_of(e)})"
        ) from None


def holds_export(path: Path) -> bool:
    """Whether directory `path` is read as an export (its weights file or its config's record) rather than a run."""
    return (path / WEIGHTS).is_file() or is_export(path)


def check_push(repo_id: str) -> None:
    """Refuse --push-to-hub before any work: an invalid repo id, offline, no token, no answer within `HUB_TIMEOUT_S`,
    the token refused, or a repo it may not create or write (created here, private, if absent, to try that right)."""
    from huggingface_hub import HfApi, constants, get_token
    from huggingface_hub.utils import build_hf_headers, get_session, hf_raise_for_status, validate_repo_id

    try:
        validate_repo_id(repo_id)
    except ValueError as e:
        raise UsageError(f"--push-to-hub {repo_id!r} is not a Hub repo id ({e})") from None
    # offline: huggingface_hub's flag as it was read when imported, or HF_HUB_OFFLINE set since
    if constants.is_offline_mode() or os.environ.get("HF_HUB_OFFLINE", "").upper() in {"1", "ON", "YES", "TRUE"}:
        raise UsageError(f"--push-to-hub {repo_id} needs the network, and HF_HUB_OFFLINE is set; unset it to push")
    if get_token() is None:
        raise UsageError(f"--push-to-hub {repo_id} needs a Hub token: set HF_TOKEN, or log in with `hf auth login`")
    api = HfApi()
    try:  # huggingface_hub's own calls wait without limit: this one request, which needs the token, is bounded
        answer = get_session().get(f"{api.endpoint}/api/whoami-v2", headers=build_hf_headers(), timeout=HUB_TIMEOUT_S)
        hf_raise_for_status(answer)
    except Exception as e:  # no network, no answer in time (requests or httpx, by version), the token refused
        answered = getattr(e, "response", None) is not None
        said = "answers the token with an error" if answered else f"does not answer within {HUB_TIMEOUT_S:g} s"
        raise UsageError(
            f"--push-to-hub {repo_id}: the Hub at {api.endpoint} {said} ({reason_of(e)}); nothing was written"
        ) from None
    try:
        api.create_repo(repo_id, private=True, exist_ok=True)
    except Exception as e:  # no right to create the repo or to write to it
        raise UsageError(
            f"--push-to-hub {repo_id}: the repo cannot be created or written ({reason_of(e)}); nothing was written"
        ) from None


def push(out: Path, repo_id: str) -> None:
    """Upload the exported directory to Hub model `repo_id` (which `check_push` created if absent)."""
    from huggingface_hub import HfApi

    try:
        HfApi().upload_folder(repo_id=repo_id, folder_path=out, commit_message=f"mixit {__version__} export")
    except Exception as e:  # the network gone since `check_push`, say: the export itself stands
        raise UsageError(
            f"{out} was written and is complete, but pushing it to {repo_id} failed ({reason_of(e)}); "
            f"push it again with `hf upload {repo_id} {out}`"
        ) from None


def hub_url(repo_id: str) -> str:
    """The page of Hub model `repo_id` at huggingface_hub's endpoint (``HF_ENDPOINT``, huggingface.co by default)."""
    from huggingface_hub import HfApi

    return f"{HfApi().endpoint}/{repo_id}"


# -- the model card ---------------------------------------------------------------------------


def model_card(record: dict[str, Any], loaded: Loaded) -> str:
    """README.md of the export (`record` is its ``mixit_export``): what the model is, how it was trained, what it
    never trained, and how to load it."""
    from huggingface_hub import ModelCardData

    to, model, run = record["format"], loaded.cfg.model, record["run"]
    meta = ModelCardData(
        library_name="transformers" if to == "hf" else "mixit", tags=["mixit", "llama" if to == "hf" else "custom_code"]
    )
    metrics = ", ".join(f"{k} {v:.4f}" for k, v in (record["test"] or {}).items() if isinstance(v, float))
    metrics = metrics or "none (the run has not completed)"
    return "\n".join(
        [
            f"---\n{meta.to_yaml()}\n---\n",
            f"# mixit {record['task']} / {record['variant']}\n",
            f"Trained by mixit (arXiv 2506.01115) on task `{record['task']}` (`{json.dumps(record['params'])}`) "
            f"under variant `{record['variant']}`: "
            f"{VARIANTS.get(record['variant']).description}.\n",
            f"- model: {model.n_layers} layers, d_model {model.d_model}, {model.n_heads} heads, "
            f"{model.attention} attention, n_ctx {model.n_ctx}, vocabulary {model.vocab_size}",
            f"- trained for {record['steps'] or '?'} steps; test metrics: {metrics}",
            f"- frozen at initialisation (never trained): {frozen_text(loaded.model, to)}",
            f"- trained by mixit {run.get('mixit_version')} (commit {run.get('git_commit') or 'unknown'}), "
            f"exported by mixit {__version__} (commit {git_commit() or 'unknown'}); config.json's `mixit_export` "
            "holds the run's whole config\n",
            "## Loading\n",
            usage(to, loaded),
        ]
    )


def frozen_text(model: Transformer, to: Target) -> str:
    """What `model` never trained: its frozen parameters, by module as the export names them; its fixed random
    buffers (MixiT's mixing matrices); and attention without queries or keys."""
    parameters = dict(model.named_parameters())
    frozen = {n: p for n, p in (llama_state_dict(model) if to == "hf" else parameters).items() if not p.requires_grad}
    fixed = {n: b for n, b in model.state_dict().items() if n not in parameters}  # the saved buffers
    parts = []
    if frozen:
        modules = dict.fromkeys(n.rpartition(".")[0] for n in frozen)
        parts.append(f"{sum(p.numel() for p in frozen.values()):,} parameters: " + ", ".join(f"`{m}`" for m in modules))
    if fixed:
        count = sum(b.numel() for b in fixed.values())
        parts.append(f"the attention mixing, {count:,} fixed random values: " + ", ".join(f"`{n}`" for n in fixed))
    if not any(hasattr(block.attn, name) for block in model.blocks for name in ("q", "k")):
        parts.append("the attention has no queries or keys")
    return "; ".join(parts) or "nothing"


def usage(to: Target, loaded: Loaded) -> str:
    """The card's loading code, which runs as written once THIS_DIRECTORY is the directory or its Hub repo id: a
    block for transformers alone, one for mixit. A text task's reads the shipped tokenizer; another's a test example."""
    head, text = loaded.cfg.model.head, getattr(loaded.task, "tokenizer", None) is not None
    auto = AUTO_CLASSES[head][0]
    trust = "" if to == "hf" else ", trust_remote_code=True"
    shape = "(B, T, vocab_size)" if head == "lm" else "(B, n_classes)"
    model = f'model = {auto}.from_pretrained("THIS_DIRECTORY"{trust})  # no mixit needed'
    if text:
        tokens = 'torch.tensor([loaded.task.tokenizer.encode("The cat sat on")])'
        hf = [
            f"from transformers import {auto}, AutoTokenizer\n",
            model,
            f'tokenizer = AutoTokenizer.from_pretrained("THIS_DIRECTORY"{trust})',
            'tokens = tokenizer("The cat sat on", return_tensors="pt").input_ids',
        ]
    else:
        tokens = f"torch.tensor([{loaded.task.test_batch().inputs[0].tolist()}])  # a test example, as token ids"
        hf = [f"import torch\nfrom transformers import {auto}\n", model, f"tokens = {tokens}"]
    hf.append(f"logits = model(input_ids=tokens).logits  # {shape}")
    if text and head == "lm":
        hf.append("print(tokenizer.decode(model.generate(tokens)[0]))")
    mixit = [
        f"import torch\n\nimport mixit  # {install_hint()}\n",
        'loaded = mixit.load("THIS_DIRECTORY")  # the model, with its task, variant and config',
        f"tokens = {tokens}",
        f"logits = loaded.model(tokens)  # {shape}",
    ]
    return "\n".join(["```python", *hf, "```\n\nWith mixit installed:\n\n```python", *mixit, "```"])
