"""Attention transplants (docs/model.md, "Attention transplants"): a finished run's attention, frozen into a new
model whose other parts are trained from scratch. It asks whether a task needs attention that depends on the
input, or only the right pattern, which no variant of the paper can tell apart.

    transplant_part pattern   every layer's and head's pattern of the donor, averaged over the first
                              `PATTERN_EXAMPLES` examples of its task's validation set (drawn from the donor's
                              data_seed), becomes the fixed mixer of the new model's transplant attention
    transplant_part qk        the donor's q and k projections (weights and biases) are copied into the new
                              softmax model and frozen (`TRANSPLANT_FREEZE`, in its freeze report)

The donor is read twice: when a config is resolved (`identify`: a finished run of the same task and shape,
whose identity enters the config and its request), and when a fresh model is built (`install`, which
refuses a donor that is no longer the one identified). A resumed, loaded or exported run takes the
transplant from its own checkpoint, so it needs no donor.
"""

from __future__ import annotations

import hashlib
import json

import torch

from mixit.core.experiment import RunConfig
from mixit.core.models import Transformer, capture_patterns
from mixit.core.models.attention import ATTENTION, TransplantAttention
from mixit.core.run import Run
from mixit.core.tasks import Task
from mixit.errors import UsageError

PATTERN_EXAMPLES = 512
"""Validation examples the donor's patterns are averaged over (all of them if its set is smaller)."""
SHAPE = ("vocab_size", "n_ctx", "n_layers", "n_heads")
"""Model options a donor must share with the new model."""
QK_SHAPE = (*SHAPE, "d_model", "bias", "rope_base", "width_scaling", "base_width")
"""What a q/k donor must share besides: the shape of q and k, and what their outputs mean."""


def donor_id(cfg: RunConfig) -> str:
    """A donor's identity: the first 12 hex digits of the sha256 of its resolved config as canonical JSON."""
    text = json.dumps(cfg.to_dict(), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def open_donor(cfg: RunConfig) -> Run:
    """The donor run of `cfg` (transplant_from), refused in one line unless it is a finished run of the same task
    and shape (`SHAPE`; `QK_SHAPE` and softmax attention for a qk transplant), naming what differs."""
    path = cfg.transplant_from
    assert path is not None
    try:
        run = Run.open(path)
    except UsageError as e:
        raise UsageError(f"transplant_from: {e}") from None
    if run.state() != "done":
        raise UsageError(
            f"transplant_from {path} is not a finished run (no summary yet): finish it first "
            f"(mixit train --resume --out {path})"
        )
    donor = run.config
    differ = [f"task {donor.task} != {cfg.task}"] if donor.task != cfg.task else []
    for name in QK_SHAPE if cfg.transplant_part == "qk" else SHAPE:
        ours, theirs = getattr(cfg.model, name), getattr(donor.model, name)
        if ours != theirs:
            differ.append(f"{name} {theirs} != {ours}")
    if differ:
        raise UsageError(f"transplant_from {path} differs from this run (donor != this run): " + "; ".join(differ))
    if cfg.transplant_part == "qk" and not ATTENTION.get(donor.model.attention).has_qk:
        raise UsageError(
            f"transplant_part qk takes a donor's q and k, which softmax attention has; "
            f"{path} has {donor.model.attention} attention"
        )
    return run


def identify(cfg: RunConfig) -> str:
    """The identity (`donor_id`) of `cfg`'s donor, once it is checked (`open_donor`)."""
    return donor_id(open_donor(cfg).config)


@torch.no_grad()
def average_pattern(model: Transformer, task: Task, n_examples: int = PATTERN_EXAMPLES) -> torch.Tensor:
    """Every layer's and head's attention pattern, through the pattern hook, averaged over the first `n_examples`
    examples of `task`'s validation set: (n_layers, n_heads, T, T), T the task's input length."""
    inputs = task.val_batch().inputs[:n_examples]
    was_training = model.training
    model.eval()
    total = torch.zeros(0, dtype=torch.float64)
    for chunk in inputs.split(128):
        with capture_patterns(model) as patterns:
            model(chunk)
        names = sorted(patterns, key=lambda n: int(n.split(".")[1]))
        summed = torch.stack([patterns[n].double().sum(dim=0) for n in names])  # (L, H, T, T)
        total = summed if total.numel() == 0 else total + summed
    model.train(was_training)
    return (total / len(inputs)).float()


@torch.no_grad()
def install(model: Transformer, cfg: RunConfig) -> None:
    """Copy `cfg`'s transplant from its donor into the fresh `model` (freezing is `build_model`'s): the average
    pattern into each layer's ``donor_pattern`` (top-left T x T block), or the q and k projections."""
    run = open_donor(cfg)
    if donor_id(run.config) != cfg.transplant_donor:
        raise UsageError(
            f"transplant_from {cfg.transplant_from} holds the run {donor_id(run.config)}, not the donor "
            f"{cfg.transplant_donor} this run was declared with"
        )
    donor = run.load(device="cpu")
    if cfg.transplant_part == "pattern":
        average = average_pattern(donor.model, donor.task)  # (L, H, T, T)
        T = average.shape[-1]
        for block, pattern in zip(model.blocks, average):
            assert isinstance(block.attn, TransplantAttention)  # check_transplant: a pattern goes to this kind
            block.attn.donor_pattern[:, :T, :T] = pattern
    else:
        for block, source in zip(model.blocks, donor.model.blocks):
            for name in ("q", "k"):
                getattr(block.attn, name).load_state_dict(getattr(source.attn, name).state_dict())
