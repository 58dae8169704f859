"""Typed, validated configuration: the model, the training run, and both together.

Every config is a dataclass validated once, at construction: a wrong value
fails there with a `UsageError` naming the key and what is allowed, before any
work starts. `from_dict` refuses unknown keys, so a config file cannot carry a
typo silently. Names follow one glossary: d_model, n_layers, n_heads, d_head,
d_mlp, n_ctx, vocab_size (../shared/STYLE.md).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

from mixit.errors import UsageError

ATTENTION_KINDS = ("softmax", "mixing")
ACTIVATIONS = ("silu", "shaped_leaky_relu")
HEADS = ("lm", "classifier")
POOLINGS = ("last", "mean")


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise UsageError(message)


def _positive_int(name: str, value: Any) -> None:
    _check(isinstance(value, int) and not isinstance(value, bool) and value > 0,
           f"{name} must be a positive integer, got {value!r}")


def _from_dict(cls, data: dict[str, Any], what: str):
    """Build dataclass `cls` from `data`, refusing keys it does not have."""
    if not isinstance(data, dict):
        raise UsageError(f"{what} must be a JSON object, got {type(data).__name__}")
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise UsageError(f"unknown {what} key(s) {', '.join(unknown)}; allowed: {', '.join(sorted(names))}")
    return cls(**data)


@dataclass
class ModelConfig:
    """The decoder of ../shared/spec/MODEL.md.

    attention: "softmax" (causal softmax with RoPE on Q and K) or "mixing"
        (MixiT: a fixed random (n_ctx, n_ctx) matrix per head; no Q or K, so
        the model gets learned absolute position embeddings instead of RoPE).
    mixing_alpha, mixing_sink: MixiT's scale on the centred random part and
        the reference's "sink head" (head 0 of each layer = 0.5 I + 0.5 on
        token 0). The sink is on by default for fidelity to the reference code.
    skip_scale, branch_scale: h = skip_scale * h + branch_scale * block(h).
        1 and 1 is the standard residual; the signal-propagation setting is
        sqrt(1/2) and sqrt(1/2) (see `shaped`).
    activation: "silu" (standard) or "shaped_leaky_relu" (LeakyReLU with
        negative slope 1 + leaky_c / sqrt(d_model), times the gain
        sqrt(2 / (1 + slope^2))).
    width_scaling: multiply the output of every linear layer inside the blocks
        by sqrt(base_width / fan_in) and initialise those weights with std
        1/sqrt(base_width), so each has effective variance 1/fan_in. The MLP
        down projection follows the same rule (fan_in = d_mlp); the reference
        passes no base there and scales by 1/sqrt(d_mlp), which shrinks the MLP
        branch as the model widens, so we do not copy it.
    seed: seeds the parameter initialisation and, separately per layer, the
        MixiT matrices, which are rebuilt identically from it.
    causal: each position reads only itself and earlier positions. False
        (sequence classification) lets every position read the whole
        unpadded sequence; the non-causal MixiT matrix is then centred over
        the whole row (MODEL.md, "Non-causal use").
    head: "lm" (logits over the vocabulary at every position) or
        "classifier" (one vector of n_classes logits per sequence, read from
        the final hidden states by `pooling`: "last", the last real token,
        or "mean", the mean over real tokens).
    pad_id: the padding token. Inputs are right-padded with it; positions
        holding it are left out of pooling and, without causality, out of
        attention, so padding never changes a classification. None: no padding.
    """

    vocab_size: int
    n_ctx: int
    d_model: int = 128
    n_layers: int = 2
    n_heads: int = 4
    d_mlp: int | None = None  # None: 4 * d_model
    attention: str = "softmax"
    bias: bool = True
    rope_base: float = 10000.0
    init_std: float = 0.02
    mixing_alpha: float = 1.0
    mixing_sink: bool = True
    skip_scale: float = 1.0
    branch_scale: float = 1.0
    activation: str = "silu"
    leaky_c: float = -1.0
    width_scaling: bool = False
    base_width: int = 512
    seed: int = 0
    causal: bool = True
    head: str = "lm"
    n_classes: int = 2
    pooling: str = "last"
    pad_id: int | None = None

    def __post_init__(self) -> None:
        if self.d_mlp is None:
            self.d_mlp = 4 * self.d_model
        for name in ("vocab_size", "n_ctx", "d_model", "n_layers", "n_heads", "d_mlp", "base_width"):
            _positive_int(name, getattr(self, name))
        _check(self.d_model % self.n_heads == 0,
               f"n_heads must divide d_model: d_model={self.d_model} is not a multiple of n_heads={self.n_heads}")
        _check(self.attention in ATTENTION_KINDS,
               f"unknown attention {self.attention!r}; allowed: {', '.join(ATTENTION_KINDS)}")
        _check(self.activation in ACTIVATIONS,
               f"unknown activation {self.activation!r}; allowed: {', '.join(ACTIVATIONS)}")
        _check(self.attention != "softmax" or self.d_head % 2 == 0,
               f"RoPE needs an even d_head, got d_model/n_heads = {self.d_head}")
        _check(self.init_std > 0, f"init_std must be > 0, got {self.init_std}")
        _check(self.rope_base > 0, f"rope_base must be > 0, got {self.rope_base}")
        _check(self.skip_scale >= 0 and self.branch_scale > 0,
               f"skip_scale must be >= 0 and branch_scale > 0, got {self.skip_scale}, {self.branch_scale}")
        _check(isinstance(self.seed, int), f"seed must be an integer, got {self.seed!r}")
        _check(self.head in HEADS, f"unknown head {self.head!r}; allowed: {', '.join(HEADS)}")
        _check(self.pooling in POOLINGS, f"unknown pooling {self.pooling!r}; allowed: {', '.join(POOLINGS)}")
        _check(isinstance(self.n_classes, int) and self.n_classes >= 2,
               f"n_classes must be an integer >= 2, got {self.n_classes!r}")
        _check(self.causal or self.head == "classifier",
               "causal=False needs the classifier head: a non-causal language model would read the tokens it predicts")
        _check(self.pad_id is None or (isinstance(self.pad_id, int) and 0 <= self.pad_id < self.vocab_size),
               f"pad_id must be None or a token id in [0, {self.vocab_size}), got {self.pad_id!r}")

    @property
    def d_head(self) -> int:
        return self.d_model // self.n_heads

    @staticmethod
    def shaped(**overrides: Any) -> dict[str, Any]:
        """The signal-propagation ("shaped") settings of MODEL.md, as keyword arguments."""
        s = math.sqrt(0.5)
        return {"skip_scale": s, "branch_scale": math.sqrt(1 - s * s),
                "activation": "shaped_leaky_relu", "width_scaling": True, **overrides}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "ModelConfig":
        return _from_dict(cls, data, "model config")


@dataclass
class TrainConfig:
    """Optimisation and bookkeeping of one training run.

    AdamW on the trainable parameters only; linear warmup over warmup_steps,
    then cosine decay to min_lr_ratio * lr at the last step; gradients clipped
    to grad_clip in global L2 norm (0 turns clipping off). The test set is
    evaluated every eval_every steps and at the end; a checkpoint is written
    every checkpoint_every steps and at the end.
    """

    steps: int = 2000
    batch_size: int = 256
    lr: float = 1e-3
    weight_decay: float = 0.01
    beta1: float = 0.9
    beta2: float = 0.98
    warmup_steps: int = 100
    min_lr_ratio: float = 0.1
    grad_clip: float = 1.0
    eval_every: int = 500
    log_every: int = 50
    checkpoint_every: int = 500
    eval_batch_size: int = 1000

    def __post_init__(self) -> None:
        for name in ("steps", "batch_size", "eval_every", "log_every", "checkpoint_every", "eval_batch_size"):
            _positive_int(name, getattr(self, name))
        _check(isinstance(self.warmup_steps, int) and 0 <= self.warmup_steps,
               f"warmup_steps must be an integer >= 0, got {self.warmup_steps!r}")
        _check(self.lr > 0, f"lr must be > 0, got {self.lr}")
        _check(self.weight_decay >= 0, f"weight_decay must be >= 0, got {self.weight_decay}")
        _check(0 <= self.beta1 < 1 and 0 <= self.beta2 < 1, f"beta1 and beta2 must be in [0, 1), got {self.beta1}, {self.beta2}")
        _check(0 <= self.min_lr_ratio <= 1, f"min_lr_ratio must be in [0, 1], got {self.min_lr_ratio}")
        _check(self.grad_clip >= 0, f"grad_clip must be >= 0 (0 = off), got {self.grad_clip}")

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "TrainConfig":
        return _from_dict(cls, data, "train config")


@dataclass
class RunConfig:
    """Everything that defines a run: task, variant, model and optimisation.

    The model's vocab_size and n_ctx come from the task; `seed` seeds the
    model and `data_seed` the task (test set and training stream), so the same
    data can be used with different initialisations.
    """

    task: str
    variant: str
    model: ModelConfig
    train: TrainConfig = field(default_factory=TrainConfig)
    task_params: dict[str, Any] = field(default_factory=dict)
    data_seed: int = 0
    test_size: int = 4000

    def __post_init__(self) -> None:
        _positive_int("test_size", self.test_size)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "RunConfig":
        data = dict(data)
        for key in ("model", "train"):
            if key not in data:
                raise UsageError(f"run config is missing {key!r}")
        data["model"] = ModelConfig.from_dict(data["model"])
        data["train"] = TrainConfig.from_dict(data["train"])
        return _from_dict(cls, data, "run config")
