"""Typed, validated configuration: the model, the optimisation, the data a task draws, and the base of every
task's parameters (the run as a whole is `mixit.core.experiment.RunConfig`).

Each option is one dataclass field with a type, a default and a docstring, from which the command line, its
--help, ``mixit list`` and ``config.json`` are generated (docs/extending.md). At construction each value is read
by its type as jsonargparse reads the command line (`typed`), then checked against its range; each failure is a
`UsageError` naming the key, the value and what is allowed. Names follow the glossary of docs/model.md.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import functools
import math
import types
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal, Self, TypeVar, get_args, get_origin

from mixit.errors import UsageError
from mixit.registry import Registry

C = TypeVar("C", bound="Config")


def check(ok: bool, message: str) -> None:
    """Raise `UsageError(message)` unless `ok`."""
    if not ok:
        raise UsageError(message)


def help_type(hint: Any) -> str:
    """A type hint in the words of the command line, for --help and refusals: "int", "int or null", "one of a, b
    or c", "comma-separated list of int", "comma-separated list, each one of a or b"."""
    origin, args = get_origin(hint), get_args(hint)
    if origin is Literal:
        return "one of " + alternatives([str(a) for a in args])
    if origin in (typing.Union, types.UnionType):
        values = [a for a in args if a is not type(None)]
        null = ["null"] if len(values) < len(args) else []
        if len(values) == 1 and get_origin(values[0]) is Literal:
            return "one of " + alternatives([*(str(a) for a in get_args(values[0])), *null])
        return alternatives([*(help_type(a) for a in values), *null])
    if origin in (list, tuple, collections.abc.Sequence):
        item = help_type(args[0]) if args else "str"
        return "comma-separated list" + (", each " if item.startswith("one of ") else " of ") + item
    if origin in (dict, collections.abc.Mapping):
        return f"mapping of {help_type(args[0])} to {help_type(args[1])}" if args else "mapping"
    return getattr(hint, "__name__", None) or str(hint).replace("typing.", "")


def alternatives(names: Sequence[str]) -> str:
    """``a, b or c``."""
    return " or ".join(names) if len(names) < 3 else ", ".join(names[:-1]) + " or " + names[-1]


@functools.cache
def _reader(hint: Any) -> Any:
    from jsonargparse import ArgumentParser  # here, not above: see `typed`

    parser = ArgumentParser(exit_on_error=False)
    # Required unless the type allows null: jsonargparse otherwise takes null for a value of any type.
    parser.add_argument("--value", type=hint, required=type(None) not in get_args(hint))
    return parser


@functools.lru_cache(maxsize=2**16)
def _read(hint: Any, kind: str, value: Any) -> Any:
    # A parse costs about 0.5 ms and a run's configs hold some 60 values, mostly the same from run to run;
    # `kind` is type(value)'s name, so that 1, 1.0 and True are told apart.
    return _reader(hint).parse_object({"value": value}).value


def typed(name: str, hint: Any, value: Any) -> Any:
    """`value`, given for `name`, as jsonargparse reads a value of type `hint` (the string "5" for an int is 5, a
    list for a tuple a tuple), else a `UsageError` naming `name`, the value and the type. Two rules are mixit's:
    a float must be finite, and a field typed as a config must hold one.

    Without jsonargparse (the model code of a ``--to hub`` export, loaded where mixit is not installed) `value`
    is returned as it is: it was typed when its run was written."""
    try:
        from jsonargparse import ArgumentError
    except ImportError:
        return value
    allowed = get_args(hint) if get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
    if any(isinstance(a, type) and issubclass(a, Config) for a in allowed):
        ok, out = isinstance(value, allowed), value
    else:
        try:
            if isinstance(value, (int, float, str, type(None))):
                out = _read(hint, type(value).__name__, value)
            else:
                out = _reader(hint).parse_object({"value": value}).value
            ok = not isinstance(out, float) or math.isfinite(out)
        except ArgumentError:
            ok = False
    check(ok, f"{name} must be {help_type(hint)}, got {value!r}")
    return out


_HINTS: dict[type, dict[str, Any]] = {}


def field_hints(cls: type) -> dict[str, Any]:
    """The resolved type of each dataclass field of `cls` (kept: a config reads them at every construction)."""
    if cls not in _HINTS:
        hints = typing.get_type_hints(cls)
        _HINTS[cls] = {f.name: hints[f.name] for f in dataclasses.fields(cls)}
    return _HINTS[cls]


@functools.cache
def parsed_doc(obj: object) -> Any:
    """docstring_parser's reading of `obj`'s docstrings (its fields' too), once per object: it reads the source,
    which is slow, and every parser built for the command line asks again."""
    import docstring_parser  # here, not above: the model code a --to hub export ships imports this module

    return docstring_parser.parse_from_object(obj)


def field_docs(cls: type) -> dict[str, str]:
    """The docstring under each field of dataclass `cls` (and its bases), on one line."""
    fields, docs = {f.name for f in dataclasses.fields(cls)}, {}
    for klass in reversed(cls.__mro__):
        if dataclasses.is_dataclass(klass):
            for param in parsed_doc(klass).params:
                if param.arg_name in fields:
                    docs[param.arg_name] = " ".join((param.description or "").split())
    return docs


def short_doc(obj: object) -> str:
    """The first line of an object's docstring."""
    return (parsed_doc(obj).short_description or "").strip()


class Config:
    """Base of the config dataclasses: each value typed at construction (`typed`), then `validate`d."""

    what: ClassVar[str] = "option"  # how error messages name one field of this config

    def __post_init__(self) -> None:
        for name, hint in field_hints(type(self)).items():
            setattr(self, name, typed(name, hint, getattr(self, name)))
        self.validate()

    def validate(self) -> None:
        """Range and cross-field checks of a subclass; types are checked already."""

    @classmethod
    def from_dict(cls: type[C], data: Mapping[str, Any]) -> C:
        """Build from a mapping, refusing keys that are not fields and missing required ones; a field typed as a
        config is built from its mapping."""
        if not isinstance(data, Mapping):
            raise UsageError(f"{cls.what}s must be a mapping of names to values, got {type(data).__name__}")
        fields = dataclasses.fields(cls)  # type: ignore[arg-type]
        names = [f.name for f in fields]
        unknown = sorted(set(data) - set(names))
        check(not unknown, f"unknown {cls.what}(s) {', '.join(unknown)}; allowed: {', '.join(names)}")
        required = [
            f.name for f in fields if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        ]
        missing = [name for name in required if name not in data]
        check(not missing, f"missing {cls.what}(s) {', '.join(missing)}")
        values = dict(data)
        for name, hint in field_hints(cls).items():
            config = isinstance(hint, type) and issubclass(hint, Config)
            if config and name in values and not isinstance(values[name], hint):
                values[name] = hint.from_dict(values[name])
        return cls(**values)

    def to_dict(self) -> dict[str, Any]:
        """The fields as JSON data: a nested config as its mapping, a tuple as a list."""
        return dataclasses.asdict(
            self,  # type: ignore[call-overload]
            dict_factory=lambda items: {k: list(v) if isinstance(v, tuple) else v for k, v in items},
        )


def flatten(nested: Mapping[str, Any], prefix: str = "", keep_empty: bool = False) -> dict[str, Any]:
    """A nested config as dotted keys (model.d_model) and the values at its leaves. An empty mapping is a leaf
    with `keep_empty` (a tracker shows it as a value), else it has none (results.csv has no column for it)."""
    flat: dict[str, Any] = {}
    for key, value in nested.items():
        if isinstance(value, Mapping) and (value or not keep_empty):
            flat.update(flatten(value, f"{prefix}{key}.", keep_empty))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def positive_int(*names: str, of: Any) -> None:
    """Refuse unless each field `names` of `of` is a positive integer."""
    for name in names:
        value = getattr(of, name)
        check(value > 0, f"{name} must be a positive integer, got {value!r}")


@dataclass
class ModelConfig(Config):
    """The decoder (docs/model.md): width, depth, attention kind and initialisation."""

    what: ClassVar[str] = "model option"
    # Options whose value names a registered part (attention, activation): the module holding each registry adds
    # it here, so a typo fails at construction and the part's declared properties (`rotary`) are checked there.
    named: ClassVar[dict[str, Registry[Any]]] = {}

    vocab_size: int
    """Vocabulary size; always the task's, never set by hand."""
    n_ctx: int
    """Longest sequence the model is built for, and the T of MixiT's T x T matrices and of sigma_h;
    defaults to the length the reference code builds its model for (the whole example of a next-token task)."""
    d_model: int = 128
    """Model width."""
    n_layers: int = 2
    """Number of blocks."""
    n_heads: int = 4
    """Attention heads; must divide d_model."""
    d_mlp: int | None = None
    """Hidden size of the gated MLP; null means 4 * d_model."""
    attention: str = "softmax"
    """Attention kind (`mixit list`): softmax or mixing, set by the variant (only the random variant takes another),
    or randformer, uniform or synthesizer_random, input-independent mixers any variant takes (docs/model.md);
    transplant comes with a pattern transplant (the run's transplant_from)."""
    bias: bool = True
    """Biases on every linear layer inside the blocks (q, k, v, o, gate, up, down), as the reference code."""
    rope_base: float = 10000.0
    """Base of the rotary position embedding of softmax attention."""
    init_std: float = 0.02
    """Standard deviation of the normal initialisation of weights and embeddings."""
    qk_init: Literal["reference", "paper"] = "reference"
    """Query and key weights: reference (the code: N(0, init_std^2)) or paper (its text: effective N(0, 1/d_model))."""
    mixing_alpha: float = 1.0
    """MixiT: scale of the centred random part of each mixing matrix."""
    mixing_sink: Literal["reference", "normalised", "off"] = "reference"
    """MixiT head 0 of every layer: reference (0.5 I, column 0 set to 0.5: row 0 sums to 0.5),
    normalised (0.5 I + 0.5 on token 0: row 0 sums to 1), or off (an ordinary random head)."""
    mixing_centring: Literal["real_tokens", "reference"] = "real_tokens"
    """Non-causal MixiT (classifiers): centre each row over the real tokens, so rows sum to 1; or as the reference
    code, over the whole padded length but divided by i + 1 (its rows do not sum to 1)."""
    skip_scale: float = 1.0
    """Residual: h = skip_scale * h + branch_scale * block(h); 1 is the standard residual."""
    branch_scale: float = 1.0
    """Residual: the scale of each block's output (see skip_scale)."""
    depth_alpha: float = 0.0
    """Depth scaling (the reference's depth_alpha): if not 0, skip 1, branch (base_n_layers / n_layers)^depth_alpha,
    and MixiT matrices without the identity, sigma 1/sqrt(T)."""
    base_n_layers: int = 4
    """Depth scaling: the depth at which the branch scale is 1."""
    activation: str = "silu"
    """MLP activation: silu, or shaped_leaky_relu (slope 1 + leaky_c / sqrt(d_model), times its gain)."""
    leaky_c: float = -1.0
    """Shaped LeakyReLU: c in the negative slope 1 + c / sqrt(d_model)."""
    width_scaling: bool = False
    """Multiply each block linear's output by sqrt(base / fan_in): base_width, or down_base_width for the down
    projection."""
    base_width: int = 512
    """Width scaling: the width at which the multiplier of a d_model -> * linear (and the head's) is 1."""
    down_base_width: int = 1
    """Width scaling: the base of the MLP down projection; the reference's 1 gives it sqrt(1 / d_mlp)."""
    width_scale_head: bool = True
    """Width scaling: the LM or classifier head is scaled too, by sqrt(base_width / d_model), as in the reference."""
    width_init: Literal["reference", "fan_in"] = "reference"
    """Width scaling: weights N(0, init_std^2) before the multiplier (reference), or effective N(0, 1/fan_in)."""
    seed: int = 0
    """Seed of the parameter initialisation and of the MixiT matrices."""
    causal: bool = True
    """Each position reads only itself and earlier ones; false (classifiers only) reads the whole unpadded text."""
    head: Literal["lm", "classifier"] = "lm"
    """Output head: lm (next-token logits at every position) or classifier (one label per sequence)."""
    n_classes: int = 2
    """Classifier head: number of labels."""
    pooling: Literal["last", "mean"] = "last"
    """Classifier head: read the last real token, or the mean over real tokens."""
    pad_id: int | None = None
    """The padding token (inputs are right-padded with it); null means inputs are never padded."""

    def validate(self) -> None:
        kinds = {name: registry.get(getattr(self, name)) for name, registry in self.named.items()}
        if self.d_mlp is None:
            self.d_mlp = 4 * self.d_model
        sizes = ("vocab_size", "n_ctx", "d_model", "n_layers", "n_heads", "d_mlp")
        positive_int(*sizes, "base_width", "down_base_width", "base_n_layers", of=self)
        check(
            self.d_model % self.n_heads == 0,
            f"n_heads must divide d_model: d_model={self.d_model} is not a multiple of n_heads={self.n_heads}",
        )
        check(
            not kinds["attention"].rotary or self.d_head % 2 == 0,
            f"RoPE needs an even d_head, got d_model/n_heads = {self.d_head}",
        )
        check(self.init_std > 0, f"init_std must be > 0, got {self.init_std}")
        check(0 <= self.seed < 2**63, f"seed must be an integer in [0, 2^63), got {self.seed}")
        check(self.rope_base > 0, f"rope_base must be > 0, got {self.rope_base}")
        check(
            self.skip_scale >= 0 and self.branch_scale > 0,
            f"skip_scale must be >= 0 and branch_scale > 0, got {self.skip_scale}, {self.branch_scale}",
        )
        check(self.n_classes >= 2, f"n_classes must be an integer >= 2, got {self.n_classes}")
        check(
            self.causal or self.head == "classifier",
            "causal=false needs the classifier head: a non-causal language model would read the tokens it predicts",
        )
        check(
            self.pad_id is None or 0 <= self.pad_id < self.vocab_size,
            f"pad_id must be null or a token id in [0, {self.vocab_size}), got {self.pad_id!r}",
        )

    @property
    def d_head(self) -> int:
        return self.d_model // self.n_heads

    @staticmethod
    def shaped(**overrides: Any) -> dict[str, Any]:
        """The signal-propagation ("shaped") settings of docs/model.md, as keyword arguments: what the
        reference switches on with MixiT (residual sqrt(1/2), shaped LeakyReLU, width scaling)."""
        s = math.sqrt(0.5)
        return {
            "skip_scale": s,
            "branch_scale": math.sqrt(1 - s * s),
            "activation": "shaped_leaky_relu",
            "width_scaling": True,
            **overrides,
        }


@dataclass
class TrainConfig(Config):
    """Optimisation and bookkeeping: the optimizer, its schedule, evaluation and checkpoints.

    AdamW on the trainable parameters, linear warmup then cosine decay,
    global-norm gradient clipping, periodic evaluation and checkpoints. Each
    task sets its own steps, batch size and learning rate (`mixit list`); the
    defaults below apply where it does not."""

    what: ClassVar[str] = "training option"

    steps: int = 2000
    """Optimizer steps."""
    batch_size: int = 256
    """Training examples per step."""
    lr: float = 1e-3
    """Peak learning rate."""
    weight_decay: float = 0.01
    """AdamW weight decay, applied to matrices only (not to biases or norm gains)."""
    beta1: float = 0.9
    """AdamW beta1."""
    beta2: float = 0.98
    """AdamW beta2."""
    warmup_steps: int | None = None
    """Steps of linear warmup; null means min(100, steps / 10)."""
    schedule: Literal["cosine", "linear", "constant"] = "cosine"
    """Learning rate after the warmup: cosine or linear decay to min_lr_ratio * lr at the last step, or constant."""
    min_lr_ratio: float = 0.1
    """The decaying schedules end at min_lr_ratio * lr."""
    grad_clip: float = 1.0
    """Clip gradients to this global L2 norm; 0 turns clipping off."""
    grad_accum: int = 1
    """Micro-batches per optimizer step (batch_size is the whole step's, split across them and the processes)."""
    dtype: Literal["fp32", "bf16", "fp16"] = "fp32"
    """Forward-pass precision: fp32, or bf16 / fp16 under autocast (fp16 with a gradient scaler)."""
    eval_every: int | None = None
    """Evaluate on the validation and test sets every this many steps (and at the end); null means steps / 10."""
    log_every: int | None = None
    """Log the training loss every this many steps; null means min(50, steps / 20)."""
    checkpoint_every: int | None = None
    """Write a checkpoint every this many steps (and at the end); null means steps / 4."""
    eval_batch_size: int = 1000
    """Examples per forward pass when evaluating."""
    early_stop: bool = False
    """Stop before `steps` once the validation curve has converged: at once when solved, on a plateau only
    in the second half of `steps` (docs/reproduction.md, "The protocol"); `steps` stays the cap."""
    stop_at: Literal["plateau", "solved"] = "plateau"
    """With early_stop, what stops a run: a plateau (in the second half of `steps`) or a solved validation set,
    or a solved validation set only (for curves that learn in steps, where a plateau may be a stair)."""
    patience: int = 3
    """Convergence: the number of last evaluations over which the validation metric must stop improving."""
    min_delta: float = 0.01
    """Convergence: the least improvement that counts, in the validation metric's units (accuracy as a
    fraction: 0.01 is one point; loss in nats)."""

    def validate(self) -> None:
        positive_int("steps", of=self)
        # Cadences that scale with the run's length unless given: resolved here, so
        # config.json records the numbers that were used.
        if self.warmup_steps is None:
            self.warmup_steps = min(100, self.steps // 10)
        if self.eval_every is None:
            self.eval_every = max(self.steps // 10, 1)
        if self.checkpoint_every is None:
            self.checkpoint_every = max(self.steps // 4, 1)
        if self.log_every is None:
            self.log_every = max(min(50, self.steps // 20), 1)
        cadences = ("eval_every", "log_every", "checkpoint_every")
        positive_int("batch_size", *cadences, "eval_batch_size", "grad_accum", "patience", of=self)
        check(self.warmup_steps >= 0, f"warmup_steps must be an integer >= 0, got {self.warmup_steps}")
        check(self.lr > 0, f"lr must be > 0, got {self.lr}")
        check(self.weight_decay >= 0, f"weight_decay must be >= 0, got {self.weight_decay}")
        check(
            0 <= self.beta1 < 1 and 0 <= self.beta2 < 1,
            f"beta1 and beta2 must be in [0, 1), got {self.beta1}, {self.beta2}",
        )
        check(0 <= self.min_lr_ratio <= 1, f"min_lr_ratio must be in [0, 1], got {self.min_lr_ratio}")
        check(self.grad_clip >= 0, f"grad_clip must be >= 0 (0 = off), got {self.grad_clip}")
        check(self.min_delta >= 0, f"min_delta must be >= 0, got {self.min_delta}")

    def lr_at(self, step: int | float) -> float:
        """Learning rate of optimizer step `step` (0-based): linear warmup to
        lr over warmup_steps, then the schedule down to min_lr_ratio * lr at the last step."""
        warmup = self.cadence[0]
        if step < warmup:
            return self.lr * (step + 1) / warmup
        span = max(self.steps - 1 - warmup, 1)
        progress = min((step - warmup) / span, 1.0)
        decay = {"cosine": 0.5 * (1 + math.cos(math.pi * progress)), "linear": 1 - progress, "constant": 1.0}
        floor = self.min_lr_ratio
        return self.lr * (floor + (1 - floor) * decay[self.schedule])

    @property
    def cadence(self) -> tuple[int, int, int, int]:
        """(warmup_steps, eval_every, log_every, checkpoint_every), resolved (never None after construction)."""
        values = (self.warmup_steps, self.eval_every, self.log_every, self.checkpoint_every)
        return typing.cast(tuple[int, int, int, int], values)


@dataclass
class DataConfig(Config):
    """Which examples a task draws: the seed of its held-out sets and training stream, and the sets' sizes.

    Every task takes these (`mixit.core.tasks.Task`), and a run holds them among its top-level options
    (`mixit.core.experiment.RunConfig`); each task says how they apply to it (docs/tasks.md)."""

    what: ClassVar[str] = "data option"

    data_seed: int = 0
    """Seed of the held-out sets and of the training stream (batch k is drawn from (data_seed, k))."""
    test_size: int = 4000
    """Examples in the fixed test set (tasks with a fixed split use their whole test part)."""
    val_size: int | None = None
    """Examples in the fixed validation set, disjoint from the training stream and the test set: settings are
    chosen and training is stopped on it (each task says where it comes from: docs/tasks.md); null means
    test_size."""
    test_seed: int = 0
    """Which test set is drawn, independently of the training stream's and the validation set's draws: another
    value gives a test set that no setting was chosen on. The generated tasks draw it from (data_seed, 2,
    test_seed); modular_addition re-draws which held-out pairs are tested and which validate; it has no effect
    on memorization (the test set is the whole table), lm and sentiment (the dataset's held-out split)."""

    def validate(self) -> None:
        if self.val_size is None:
            self.val_size = self.test_size
        positive_int("test_size", "val_size", of=self)
        for name in ("data_seed", "test_seed"):
            value = getattr(self, name)
            check(0 <= value < 2**63, f"{name} must be an integer in [0, 2^63), got {value}")

    @property
    def sizes(self) -> tuple[int, int]:
        """(test_size, val_size), resolved (val_size is never None after construction)."""
        return self.test_size, typing.cast(int, self.val_size)


@dataclass
class TaskConfig(Config):
    """Base of the task parameter classes: one dataclass per task, declared in
    the task's own module, validated at construction like every config."""

    what: ClassVar[str] = "task parameter"
    run_defaults: ClassVar[dict[str, Any]] = {}
    """The task's own defaults for the run's training and model options (steps, lr, n_layers, ...), by option
    name: what a run of the task uses unless a recipe or the user says otherwise (`mixit.core.experiment.resolve`)."""

    def memory_bytes(self) -> int:
        """Bytes the task allocates when it is built (a table of every example); 0 for tasks that
        draw examples as they go. Checked against the free memory before the task is built."""
        return 0

    def for_run(self, run_dir: Path) -> Self:
        """These parameters, pointing at what the task saved in `run_dir` (its
        tokenizer, say), so that an existing run is rebuilt exactly as it was
        trained; unchanged unless a task saves something."""
        return self
