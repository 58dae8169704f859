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

Every export carries its run in its config.json, under ``mixit_export`` (`mixit.run.EXPORTED`): the format,
task and its parameters, variant, model config, test metrics and the run's whole config record, so that
`load` rebuilds the model with its task from the directory alone (or from a Hub repo id). A ``--to hub``
directory also ships mixit's own model modules with the transformers classes of `mixit.remote_code` (`remote_code`;
``model_type`` mixit, ``auto_map`` by head), which ``transformers.AutoModelForCausalLM.from_pretrained(DIR,
trust_remote_code=True)`` (or ``...ForSequenceClassification``) runs without mixit; both formats need transformers to
be written.
``--push-to-hub REPO`` uploads the written directory with huggingface_hub (``HfApi.upload_folder``), once
`check_push` has found, before any work, that the Hub answers the token in time and lets it create or write the
repo. An export says nothing but mixit's own lines: the libraries' progress bars and log lines are off meanwhile
(`quiet_libraries`).
"""

from __future__ import annotations

import ast
import contextlib
import importlib
import importlib.resources
import json
import os
import shutil
import sys
from collections.abc import Iterator, Mapping
from dataclasses import fields
from pathlib import Path
from typing import Any, Literal

import torch
from safetensors.torch import load_file

from mixit.checkpoint import mismatch
from mixit.config import ModelConfig
from mixit.errors import UsageError, damaged, faults_said, reason_of, require
from mixit.experiment import RunConfig, build, read_record
from mixit.files import check_names, check_output_dir, give_open_mode, read_json, write_json, write_text
from mixit.freezing import VARIANTS, Variant
from mixit.models import Transformer
from mixit.run import CONFIG, EXPORTED, Loaded, Run, is_export
from mixit.runtime import resolve_device
from mixit.tasks import Task
from mixit.text.tokenizer import EOS, PAD
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

REMOTE_CODE = ("mixit.remote_code.configuration_mixit", "mixit.remote_code.modeling_mixit")
"""The modules a --to hub export ships for transformers' trust_remote_code, with every mixit module they import
(`remote_code`)."""

AUTO_MAPS = {
    "lm": {
        "AutoConfig": "configuration_mixit.MixitConfig",
        "AutoModel": "modeling_mixit.MixitForCausalLM",
        "AutoModelForCausalLM": "modeling_mixit.MixitForCausalLM",
    },
    "classifier": {
        "AutoConfig": "configuration_mixit.MixitConfig",
        "AutoModel": "modeling_mixit.MixitForSequenceClassification",
        "AutoModelForSequenceClassification": "modeling_mixit.MixitForSequenceClassification",
    },
}
"""config.json's ``auto_map`` for each head: the shipped classes transformers' Auto classes load."""

WEIGHTS = "model.safetensors"

HUB_TIMEOUT_S = 5.0
"""How long --push-to-hub waits for the Hub's answer to its first request, made before any work."""

EXPORT_AGAIN = "export the run again with `mixit export`"
"""What to do about an exported directory whose config or weights are missing or damaged."""


def export_run(run_dir: Path, to: Target = "hf", out: Path | None = None, push_to_hub: str | None = None) -> Path:
    """Write a run's latest checkpoint as a Hugging Face model directory.

    Returns where it was written.

    Args:
        run_dir: The run directory.
        to: The format: hf (a transformers LlamaForCausalLM, loadable without mixit; softmax variants at
            Llama's settings only) or hub (any mixit model, for mixit.load, Transformer.from_pretrained or
            transformers' AutoModel with trust_remote_code).
        out: The directory to write, which must be absent or empty; null means RUN_DIR-hf or RUN_DIR-hub beside
            the run.
        push_to_hub: A Hub repo id (user/name) to upload the written directory to, created if absent (private
            unless it exists) before any work; refused before any work when huggingface_hub is offline
            (HF_HUB_OFFLINE), has no token, or the Hub does not answer within 5 s, refuses the token or the repo.
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
        tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            with faults_said(out, "run the export again"):  # safetensors names no file: the fault names `out`
                tmp.mkdir(parents=True)
                (write_llama if to == "hf" else write_hub)(loaded, tmp)
                add_to_config(tmp, {EXPORTED: export_record(run, loaded, to)})
                write_text(tmp / "README.md", model_card(run, loaded, to))
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
    """Within: huggingface_hub's progress bars and log lines off, and transformers' too where it is imported (``--to
    hf`` has imported it), so that an export says only mixit's own lines (transformers' "Writing model shards" bar,
    say); each library's settings are put back afterwards."""
    from huggingface_hub.utils import are_progress_bars_disabled, disable_progress_bars, enable_progress_bars
    from huggingface_hub.utils import logging as hub_logging

    hf_logging = importlib.import_module("transformers.utils.logging") if "transformers" in sys.modules else None
    hub_bars_off, hub_level = are_progress_bars_disabled(), hub_logging.get_verbosity()
    disable_progress_bars()
    hub_logging.set_verbosity_error()
    if hf_logging is not None:
        bars_on, level = hf_logging.is_progress_bar_enabled(), hf_logging.get_verbosity()
        hf_logging.disable_progress_bar()
        hf_logging.set_verbosity_error()
    try:
        yield
    finally:
        hub_logging.set_verbosity(hub_level)
        if not hub_bars_off:
            enable_progress_bars()
        if hf_logging is not None:
            hf_logging.set_verbosity(level)
            if bars_on:
                hf_logging.enable_progress_bar()


def export_record(run: Run, loaded: Loaded, to: Target) -> dict[str, Any]:
    """What an export says of its run (config.json's ``mixit_export``): enough for `load` to rebuild the model
    with its task, and for a reader to see what it is without mixit."""
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


def add_to_config(out: Path, entries: Mapping[str, Any]) -> None:
    """Add `entries` to the config.json the writer left in `out`."""
    config = read_json(out / CONFIG, "the exported config")
    write_json(out / CONFIG, {**config, **entries})


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


def generation_config(eos_id: int, pad_id: int, n_ctx: int, use_cache: bool = True) -> Any:
    """`mixit sample`'s defaults (temperature 0.8, top 50, a document starts after EOS and ends at the
    next), within the context the model was trained on; `use_cache` false for a model that keeps no cache of
    keys and values (a --to hub export's)."""
    from transformers import GenerationConfig

    return GenerationConfig(
        do_sample=True,
        temperature=0.8,
        top_k=50,
        max_length=n_ctx,
        use_cache=use_cache,
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
    """The Hub directory of `Transformer.save_pretrained`, the model's code for transformers' trust_remote_code
    (`remote_code`) with the config entries that point transformers at it, and a generation config (language
    models) and the run's tokenizer (text tasks) as transformers reads them."""
    cfg = loaded.cfg.model
    loaded.model.save_pretrained(out)
    for name, source in remote_code().items():
        write_text(out / name, source)
    tokenizer = getattr(loaded.task, "tokenizer", None)
    head_class = AUTO_MAPS[cfg.head]["AutoModel"].partition(".")[2]
    entries: dict[str, Any] = {"model_type": "mixit", "architectures": [head_class], "auto_map": AUTO_MAPS[cfg.head]}
    if cfg.head == "classifier":
        entries["num_labels"] = cfg.n_classes
    if tokenizer is not None:
        entries.update(eos_token_id=tokenizer.eos_id, pad_token_id=tokenizer.pad_id)
        hf_tokenizer(tokenizer.to_str(), cfg.n_ctx).save_pretrained(out)
    add_to_config(out, entries)
    if cfg.head == "lm" and tokenizer is not None:
        generation_config(tokenizer.eos_id, tokenizer.pad_id, cfg.n_ctx, use_cache=False).save_pretrained(out)
    elif cfg.head == "lm":  # a synthetic task: greedy, within n_ctx
        from transformers import GenerationConfig

        GenerationConfig(max_length=cfg.n_ctx, use_cache=False).save_pretrained(out)


def remote_code() -> dict[str, str]:
    """The files a --to hub export ships for trust_remote_code: file name -> source of each module of `REMOTE_CODE`
    and of every mixit module it imports, transitively, with each ``from mixit.PACKAGE.MODULE import`` rewritten
    ``from .MODULE import`` (transformers copies a remote module's relative imports beside it, from one folder).

    The model is mixit's own (`mixit.models`), so no second copy of it can drift. A mixit import this cannot rewrite
    (``import mixit...``, a relative one, or one of a package, which would ship nothing) is a bug of the shipped
    modules, raised here."""
    files: dict[str, str] = {}
    todo, seen = list(REMOTE_CODE), set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        path = Path(importlib.import_module(name).__file__ or "")
        lines = path.read_text().splitlines(keepends=True)
        for node in ast.walk(ast.parse("".join(lines))):
            imported = node.module if isinstance(node, ast.ImportFrom) else None
            if isinstance(node, ast.Import) and any(a.name.split(".")[0] == "mixit" for a in node.names):
                raise RuntimeError(f"{path}:{node.lineno}: `import mixit...` cannot ship; use `from mixit.X.Y import`")
            if imported is None or imported.split(".")[0] != "mixit" or not isinstance(node, ast.ImportFrom):
                continue
            if node.level or path.name == "__init__.py" or imported.count(".") < 1 or is_package(imported):
                raise RuntimeError(f"{path}:{node.lineno}: only `from mixit.X.MODULE import` of a module can ship")
            todo.append(imported)
            local = imported.rpartition(".")[2]
            lines[node.lineno - 1] = lines[node.lineno - 1].replace(f"from {imported} import", f"from .{local} import")
        file = f"{name.rpartition('.')[2]}.py"
        if file in files:
            raise RuntimeError(f"two shipped modules would both be {file}")
        files[file] = "".join(lines)
    return files


def is_package(module: str) -> bool:
    """Whether the mixit module `module` is a package (its ``__init__``)."""
    return hasattr(importlib.import_module(module), "__path__")


# -- loading back and pushing -----------------------------------------------------------------


def load(source: str | Path, device: str = "cpu") -> Loaded:
    """A trained model with its config (task, variant, model) and task, from a run directory (its latest
    checkpoint), a directory written by `mixit export` (either format) or the Hub repo id of one (through
    huggingface_hub's ``snapshot_download``, which reads its cache when offline).

    ``Loaded.checkpoint`` is the checkpoint or the exported directory read. An exported file that is missing,
    truncated or corrupt is refused in one line naming it (`DamagedFile`), as a run's is. An export of a plugin's
    variant loads without the plugin, unless the model's code or the task is the plugin's (`rebuild`).
    """
    path = locate(source)
    if not holds_export(path):
        return Run.open(path).load(device)
    config = path / CONFIG
    with damaged(config, EXPORT_AGAIN):
        meta = read_json(config, "the exported config")[EXPORTED]
        to = meta["format"]
    cfg, task, model = rebuild(meta, path)
    views = llama_state_dict(model) if to == "hf" else model.state_dict()  # tensors sharing the model's storage
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
    """The directory that `source` names: a run's or an export's, or the local copy of Hub model `source`
    (`hub_snapshot`) where no such path exists."""
    path = Path(source)
    check_names(path)  # a name too long for its filesystem, which `exists` would raise on
    return path if path.exists() else hub_snapshot(str(source))


def holds_export(path: Path) -> bool:
    """Whether directory `path` is to be read as an export (its weights file, or its config's record: `is_export`)
    rather than as a run."""
    return (path / WEIGHTS).is_file() or is_export(path)


def rebuild(meta: Mapping[str, Any], path: Path) -> tuple[RunConfig, Task, Transformer]:
    """The config, task and model (initialised, its variant's parameters frozen) that the export record `meta` of
    directory `path` describes; the task reads the tokenizer shipped beside the weights.

    A variant this process lacks (a plugin's, its module not loaded) is not needed: a variant only chooses what
    trains, and the record names the parameters it froze. Its name stands in for it while the config is read
    (`Registry.lent`), and those parameters are frozen. What the model's code needs (a plugin's attention kind
    or activation) or the task does (a plugin's task) is still needed, and refused as unknown where absent, as is
    a plugin's variant in an export recorded before the frozen parameters were."""
    config = path / CONFIG
    with damaged(config, EXPORT_AGAIN):
        run, variant, attention, frozen = meta["run"], meta["variant"], meta["model"]["attention"], meta.get("frozen")
    if variant in VARIANTS or frozen is None:
        cfg = read_record(run, str(config))
        task, model, _ = build(cfg, path)
        return cfg, task, model
    with VARIANTS.lent(variant, Variant(variant, attention, (), "as its export recorded it", any_attention=True)):
        cfg = read_record(run, str(config))
        task, model, _ = build(cfg, path)
    parameters = dict(model.named_parameters())
    with damaged(config, EXPORT_AGAIN):
        for name in frozen:
            parameters[name].requires_grad_(False)  # a KeyError where the record names no parameter of the model
    return cfg, task, model


def hub_snapshot(repo_id: str) -> Path:
    """The local copy of Hub model `repo_id` (downloaded, or from the cache when offline)."""
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(repo_id))
    except (ValueError, OSError) as e:  # an invalid id, no such repo, offline with nothing cached
        raise UsageError(
            f"run directory {repo_id} does not exist, and no Hub model {repo_id} can be read ({reason_of(e)})"
        ) from None


def check_push(repo_id: str) -> None:
    """Refuse --push-to-hub before any work: an invalid repo id, huggingface_hub offline, no token, a Hub that does
    not answer within `HUB_TIMEOUT_S` or refuses the token, or a repo the token may not create or write to. The repo
    is created here (private) if absent, which tries the right to write it."""
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


def model_card(run: Run, loaded: Loaded, to: Target) -> str:
    """README.md of the exported directory: what the model is, how it was trained, how to load it."""
    cfg = loaded.cfg
    summary = run.summary() or {}
    record = read_json(run.config_path, "the run's config")
    front = (
        "library_name: transformers\ntags: [mixit, llama]"
        if to == "hf"
        else "library_name: mixit\ntags: [mixit, custom_code]"
    )
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
        usage(to, loaded),
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
    """What `model` never trained, on one line: its frozen parameters (as its variant left them), counted and
    named by module as the exported directory names them; its fixed random buffers (MixiT's mixing matrices);
    and, for attention without q and k projections, that it has none."""
    name = llama_name if to == "hf" else str
    parts = []
    frozen = dict.fromkeys(n.rpartition(".")[0] for n, p in model.named_parameters() if not p.requires_grad)
    if frozen:
        count = sum(p.numel() for p in model.parameters() if not p.requires_grad)
        parts.append(f"{count:,} parameters: " + ", ".join(f"`{name(n)}`" for n in frozen))
    parameters = dict(model.named_parameters())
    fixed = {n: b for n, b in model.state_dict().items() if n not in parameters}  # the saved buffers
    if fixed:
        count = sum(b.numel() for b in fixed.values())
        parts.append(f"the attention mixing, {count:,} fixed random values: " + ", ".join(f"`{n}`" for n in fixed))
    if not any(hasattr(block.attn, name) for block in model.layers for name in ("q", "k")):
        parts.append("the attention has no queries or keys (nothing computes its pattern from the input)")
    return "; ".join(parts) or "nothing"


def llama_name(module: str) -> str:
    """A mixit module path under Llama's names: ``blocks.0.attn.q`` -> ``model.layers.0.self_attn.q_proj``."""
    if module == "norm_f":
        return "model.norm"
    _, layer, rest = module.split(".", 2) if module.count(".") >= 2 else (*module.split("."), "")
    return f"model.layers.{layer}" + (f".{LLAMA_NAMES[rest]}" if rest else "")


def usage(to: Target, loaded: Loaded) -> str:
    """The loading snippets of the card, each a Python block that runs as written once THIS_DIRECTORY is the
    directory (or its Hub repo id): one with transformers alone, one with mixit. A text task's snippets read the
    shipped tokenizer; another task's feed a test example's token ids (it has no tokenizer)."""
    cfg = loaded.cfg.model
    auto = "AutoModelForCausalLM" if cfg.head == "lm" else "AutoModelForSequenceClassification"
    trust = "" if to == "hf" else ", trust_remote_code=True"
    said = "a LlamaForCausalLM" if to == "hf" else "runs the model code shipped here"
    shape = "(B, T, vocab_size)" if cfg.head == "lm" else "(B, n_classes)"
    tokenizer = getattr(loaded.task, "tokenizer", None)
    if tokenizer is not None:
        hf_lines = [
            f"from transformers import {auto}, AutoTokenizer\n",
            f'model = {auto}.from_pretrained("THIS_DIRECTORY"{trust})  # no mixit needed: {said}',
            f'tokenizer = AutoTokenizer.from_pretrained("THIS_DIRECTORY"{trust})',
            'batch = tokenizer(["The cat sat on", "A dog"], padding=True, return_tensors="pt")  # padded on the right',
            f"logits = model(**batch).logits  # {shape}",
        ]
        if cfg.head == "lm":
            hf_lines.append('print(tokenizer.decode(model.generate(**tokenizer("The", return_tensors="pt"))[0]))')
        tokens = 'torch.tensor([loaded.task.tokenizer.encode("The cat sat on")])'
    else:
        example = loaded.task.test_batch().inputs[0].tolist()
        hf_lines = [
            f"import torch\nfrom transformers import {auto}\n",
            f'model = {auto}.from_pretrained("THIS_DIRECTORY"{trust})  # no mixit needed: {said}',
            f"tokens = torch.tensor([{example}])  # a test example of the task, as token ids",
            f"logits = model(input_ids=tokens).logits  # {shape}",
        ]
        tokens = f"torch.tensor([{example}])  # a test example of the task"
    mixit_lines = [
        f"import torch\n\nimport mixit  # {install_hint()}\n",
        'loaded = mixit.load("THIS_DIRECTORY")  # or its Hub repo id: the model, its task, variant and config',
        f"tokens = {tokens}",
        f"logits = loaded.model(tokens)  # {shape}",
    ]
    return "\n".join(["```python", *hf_lines, "```\n\nWith mixit installed:\n\n```python", *mixit_lines, "```"])
