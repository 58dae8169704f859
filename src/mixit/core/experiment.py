"""A run's whole configuration (`RunConfig`), how it is resolved from what a user asks for, and how it is built
into a task and a model.

A *request* is a partial, nested mapping with the shape of a RunConfig, every key optional:

    {"task": "retrieval", "variant": "mixit", "task_params": {"max_pairs": 10},
     "model": {"d_model": 256}, "train": {"steps": 500}, "data_seed": 0, "test_size": 4000}

`resolve` fills in the rest, each layer overriding the one before: the dataclass defaults, the task's
``run_defaults``, the recipe's settings (`mixit.core.recipes`) and the request; below them, what follows from
the model chosen (`coupling`), and what only the task can say (vocab_size, n_ctx unless requested, a classifier
head for sentiment). Resolving constructs the task but loads no corpus and trains no tokenizer.

The request is data (docs/design.md, "The request is data"): the config keeps it (`RunConfig.request`), a run
records it in config.json (`record`), and ``--config RUN_DIR`` and ``--resume`` start from it, so every value that
was a default follows a changed task or step count. `read_record` reads a config.json of another mixit version.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal, Self

import yaml

from mixit.core.config import DataConfig, ModelConfig, TaskConfig, TrainConfig, check, typed
from mixit.core.freezing import FreezeReport, Variant, apply_variant, check_attention, check_selectors, get_variant
from mixit.core.models import Transformer
from mixit.core.models.attention import ATTENTION
from mixit.core.recipes import RECIPES
from mixit.core.resources import check_memory
from mixit.core.tasks import TASKS, Task
from mixit.core.tasks.base import check_complete
from mixit.errors import UsageError
from mixit.version import __version__, git_commit

DEFAULT_TASK = "addition"
DEFAULT_VARIANT = "standard"
DEFAULT_RECIPE = "laptop"


@dataclass(kw_only=True)
class RunConfig(DataConfig):
    """Everything that defines a run: task, variant, model, optimisation, the task's parameters, and the data it
    draws (the fields of `DataConfig`, its base, at the top level). Validated and written like every `Config`."""

    what: ClassVar[str] = "run config key"

    task: str
    """Task name (`mixit list`)."""
    model: ModelConfig
    """The model (resolved: vocabulary and n_ctx come from the task)."""
    variant: str = DEFAULT_VARIANT
    """Training regime: standard, frozen_qk, frozen_mlp, mixit or random (`mixit list`)."""
    recipe: str = DEFAULT_RECIPE
    """Where unset options start from: laptop (each task's defaults) or reference (the paper's code; `mixit list`)."""
    train: TrainConfig = field(default_factory=TrainConfig)
    """Optimisation and bookkeeping."""
    task_params: TaskConfig | None = None
    """The task's parameters (its Config); None means its defaults."""
    freeze: tuple[str, ...] = ()
    """Parts kept at their initialisation beside what the variant freezes, as module paths of the model:
    embed, pos_embed, norm_f, lm_head, blocks, blocks.*.attn.q (every layer), blocks.0-1.mlp (a range),
    blocks.0+3.mlp.up (a list), norms, head (docs/model.md, 'Freezing by structure')."""
    transplant_from: str | None = None
    """A finished run of the same task and shape whose attention this run takes, frozen (transplant_part);
    null means none (docs/model.md, 'Attention transplants')."""
    transplant_part: Literal["pattern", "qk"] = "pattern"
    """With transplant_from, what is taken: pattern (its attention pattern per layer and head, averaged over its
    task's validation examples, as the fixed mixer of transplant attention) or qk (its q and k weights, frozen,
    in a softmax model)."""
    transplant_donor: str | None = None
    """The donor's identity (12 hex digits of the sha256 of its config), read from transplant_from when the
    config is resolved, so that the run resumes without the donor; null unless transplant_from is set."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self._request: dict[str, Any] | None = None

    def validate(self) -> None:
        cls = TASKS.get(self.task)
        if self.task_params is None:
            self.task_params = cls.Config()
        check(
            isinstance(self.task_params, cls.Config),
            f"task {self.task} takes parameters {cls.Config.__name__}, got {type(self.task_params).__name__}",
        )
        check_pairing(get_variant(self.variant), self.model.attention)
        check_selectors(self.model, self.freeze)
        check_transplant(self)
        RECIPES.get(self.recipe)
        super().validate()

    @property
    def request(self) -> dict[str, Any]:
        """The request this config was resolved from (what the user and the recipe asked for), which a run
        records and a replay starts from; for a config built field by field, every option spelled out
        (so it resolves back to this config, though nothing in it follows a changed task any more)."""
        if self._request is not None:
            return self._request
        explicit = self.to_dict()
        explicit["model"] = {k: v for k, v in explicit["model"].items() if k not in TASK_DECIDES}
        return explicit

    @request.setter
    def request(self, request: dict[str, Any]) -> None:
        self._request = request

    @property
    def params(self) -> TaskConfig:
        """The task's parameters (never None after construction)."""
        assert self.task_params is not None
        return self.task_params

    @property
    def data_config(self) -> DataConfig:
        """The data options alone, as the task takes them."""
        return DataConfig(**{name: getattr(self, name) for name in DATA_OPTIONS})

    def to_dict(self) -> dict[str, Any]:
        """`Config.to_dict` in config.json's order: the task, variant, recipe, task parameters, model and
        optimisation, then the data options."""
        data = super().to_dict()
        return {**{k: data.pop(k) for k in ("task", "variant", "recipe", "task_params", "model", "train")}, **data}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Self:
        """`Config.from_dict`, the task parameters read by the task's own Config; options left out (by a run
        written before they were added) take today's defaults."""
        if isinstance(data, Mapping) and isinstance(data.get("task"), str) and "task_params" in data:
            data = {**data, "task_params": TASKS.get(data["task"]).Config.from_dict(data["task_params"])}
        return super().from_dict(data)


# -- requests --------------------------------------------------------------------------

DATA_OPTIONS = tuple(f.name for f in dataclasses.fields(DataConfig))
"""The run options that choose the task's data (its held-out sets and training stream): `DataConfig`'s."""
TASK_DECIDES = ("vocab_size",)
"""Model options that the task decides; a request may not choose them."""
SECTIONS = ("model", "train", "task_params")
"""The keys of a request whose value is a mapping of options (merged key by key)."""


def flat_options() -> dict[str, str]:
    """Every option a flat keyword override (`run_config(..., d_model=64)`) may name -> the request section it
    belongs to ("model", "train", or "" for the top level)."""
    names = {f.name: "model" for f in dataclasses.fields(ModelConfig) if f.name not in TASK_DECIDES}
    return {**names, **{f.name: "train" for f in dataclasses.fields(TrainConfig)}, **dict.fromkeys(DATA_OPTIONS, "")}


def nest(overrides: Mapping[str, Any]) -> dict[str, Any]:
    """Flat option overrides as a nested request: {"d_model": 64} -> {"model": {"d_model": 64}}."""
    names = flat_options()
    unknown = sorted(set(overrides) - set(names))
    check(not unknown, f"unknown option(s) {', '.join(unknown)}; allowed: {', '.join(sorted(names))}")
    request: dict[str, Any] = {}
    for name, value in overrides.items():
        if names[name]:
            request.setdefault(names[name], {})[name] = value
        else:
            request[name] = value
    return request


def merge(*requests: Mapping[str, Any]) -> dict[str, Any]:
    """Later requests override earlier ones, key by key inside each section."""
    out: dict[str, Any] = {}
    for request in requests:
        for key, value in request.items():
            if key in SECTIONS and isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
                out[key] = {**out[key], **value}
            else:
                out[key] = value
    return out


def _section(request: Mapping[str, Any], key: str) -> dict[str, Any]:
    value = request.get(key, {})
    if isinstance(value, TaskConfig):
        return value.to_dict()
    check(isinstance(value, Mapping), f"{key} must be a mapping of names to values, got {value!r}")
    return dict(value)


def _name(request: Mapping[str, Any], key: str, default: str) -> str:
    value = request.get(key, default)
    check(isinstance(value, str), f"{key} must be a string, got {value!r}")
    return value


def resolve(request: Mapping[str, Any]) -> RunConfig:
    """The complete, validated RunConfig that `request` asks for (module docstring); it keeps the request
    (`RunConfig.request`), which a run records beside the config.

    Only the task's parameters and shape are read (`Task` construction is cheap): no corpus is loaded and
    no tokenizer trained here."""
    check(isinstance(request, Mapping), f"a request must be a mapping, got {type(request).__name__}")
    allowed = [f.name for f in dataclasses.fields(RunConfig)]
    unknown = sorted(set(request) - set(allowed))
    check(not unknown, f"unknown key(s) {', '.join(unknown)}; allowed: {', '.join(allowed)}")
    task_name = _name(request, "task", DEFAULT_TASK)
    variant = get_variant(_name(request, "variant", DEFAULT_VARIANT))
    recipe_name = _name(request, "recipe", DEFAULT_RECIPE)
    task_cls = TASKS.get(task_name)
    requested_model = _section(request, "model")
    pattern = request.get("transplant_from") is not None and request.get("transplant_part", "pattern") == "pattern"
    attention = requested_model.setdefault("attention", "transplant" if pattern else variant.attention)
    check(isinstance(attention, str), f"attention must be a string, got {attention!r}")
    check_pairing(variant, attention)
    settings = RECIPES.get(recipe_name).settings(task_name, attention)
    recipe = nest({k: v for k, v in settings.items() if k != "task_params"})
    recipe["task_params"] = settings.get("task_params", {})
    params = task_cls.Config.from_dict({**recipe["task_params"], **_section(request, "task_params")})
    data = DataConfig.from_dict({k: request[k] for k in DATA_OPTIONS if k in request})
    check_memory(
        f"task {task_name}", {"its table of examples": params.memory_bytes()}, "cpu", "choose smaller task parameters"
    )
    task = task_cls(params, data)
    defaults = nest(task_cls.Config.run_defaults)
    # The model: the task's defaults, the recipe and the request, over what follows from them and what the task
    # needs, with the task's vocabulary and, unless requested, the length the reference builds its model for.
    model = {**defaults.get("model", {}), **recipe.get("model", {}), **requested_model}
    if "vocab_size" in model:
        check(
            model["vocab_size"] == task.vocab_size,
            f"vocab_size comes from the task: {task.describe()} has {task.vocab_size} tokens, "
            f"not {model['vocab_size']!r}",
        )
    model = {"n_ctx": task.reference_len, **task.model_defaults(attention), **coupling(model), **model}
    model["vocab_size"] = task.vocab_size
    train = {**defaults.get("train", {}), **recipe.get("train", {}), **_section(request, "train")}
    cfg = RunConfig(
        task=task_name,
        variant=variant.name,
        freeze=request.get("freeze", ()),
        recipe=recipe_name,
        task_params=params,
        model=ModelConfig.from_dict(model),
        train=TrainConfig.from_dict(train),
        **{k: request[k] for k in TRANSPLANT_OPTIONS if k in request},
        **data.to_dict(),
    )
    check_fits(cfg, task)
    check_complete(task)
    if cfg.transplant_from is not None and cfg.transplant_donor is None:
        from mixit.core.transplant import identify  # the donor is a run, and mixit.core.run sits above this module

        cfg.transplant_donor = identify(cfg)
        request = {**request, "transplant_donor": cfg.transplant_donor}  # recorded: a resume reads no donor
    if "task_params" in request:  # a task parameter object (`run_config`) is recorded as its mapping
        request = {**request, "task_params": _section(request, "task_params")}
    cfg.request = json.loads(json.dumps(request, default=str))
    return cfg


TRANSPLANT_OPTIONS = ("transplant_from", "transplant_part", "transplant_donor")
TRANSPLANT_FREEZE = {"pattern": (), "qk": ("blocks.*.attn.q", "blocks.*.attn.k")}
"""What a transplant freezes beside the variant and the run's own selectors (a pattern lives in a buffer)."""


def check_transplant(cfg: RunConfig) -> None:
    """Refuse a transplant declaration that cannot hold, without reading the donor (`mixit.core.transplant.identify`
    reads it)."""
    attention, part = cfg.model.attention, cfg.transplant_part
    if cfg.transplant_from is None:
        check(part == "pattern", "transplant_part qk needs transplant_from, the donor run's directory")
        check(cfg.transplant_donor is None, "transplant_donor needs transplant_from, the donor run's directory")
        check(
            attention != "transplant",
            "attention transplant needs transplant_from, the donor run whose average pattern it takes",
        )
    elif part == "pattern":
        check(
            attention == "transplant",
            f"transplant_part pattern makes the attention transplant; it cannot be combined with {attention!r}",
        )
        check(cfg.model.causal, "transplant_part pattern needs a causal model; use transplant_part qk")
    else:
        check(
            ATTENTION.get(attention).has_qk,
            f"transplant_part qk needs softmax attention, whose q and k it takes; not {attention!r}",
        )


def check_pairing(variant: Variant, attention: str) -> None:
    """Refuse, before any work, an attention kind `variant` cannot take: a kind the variants name unless `variant`
    names it or takes any kind (`check_attention`); a kind any variant may take (`Attention.any_variant`) where
    the variant's freeze rule finds nothing to freeze, tried on a one-layer model of the kind."""
    if not ATTENTION.get(attention).any_variant:
        check_attention(variant, attention)
        return
    apply_variant(Transformer(ModelConfig(vocab_size=2, n_ctx=2, d_model=2, n_heads=1, attention=attention)), variant)


def coupling(model: Mapping[str, Any]) -> dict[str, Any]:
    """Model options that follow from others unless set, as in the reference code: the
    settings an attention kind brings (`Attention.coupled`: MixiT's residual, activation
    and width scaling), and, with depth scaling, the residual scales it implies (which
    take precedence, as in the reference). `model` holds the options chosen so far,
    `attention` among them."""
    out = dict(ATTENTION.get(model["attention"]).coupled)
    fields = ModelConfig.__dataclass_fields__
    alpha = typed("depth_alpha", float, model.get("depth_alpha", fields["depth_alpha"].default))
    if alpha:
        base = typed("base_n_layers", int, model.get("base_n_layers", fields["base_n_layers"].default))
        depth = typed("n_layers", int, model.get("n_layers", fields["n_layers"].default))
        check(base > 0 and depth > 0, f"n_layers and base_n_layers must be positive integers, got {depth!r}, {base!r}")
        out.update(skip_scale=1.0, branch_scale=(base / depth) ** alpha)
    return out


def run_config(
    task: str = DEFAULT_TASK,
    variant: str = DEFAULT_VARIANT,
    task_params: Mapping[str, Any] | TaskConfig | None = None,
    recipe: str = DEFAULT_RECIPE,
    freeze: Sequence[str] = (),
    transplant_from: str | Path | None = None,
    transplant_part: str = "pattern",
    **overrides: Any,
) -> RunConfig:
    """A complete RunConfig for `task` and `variant`, starting from `recipe`, with the parts `freeze` selects
    frozen beside the variant's (``freeze=["embed", "blocks.0.attn.q"]``: `RunConfig.freeze`), the attention of
    the run `transplant_from` transplanted (`transplant_part` pattern or qk: `RunConfig.transplant_from`) and
    keyword overrides of any option by its name (``d_model=64, steps=500, data_seed=1``)."""
    base: dict[str, Any] = {"task": task, "variant": variant, "recipe": recipe, "task_params": task_params or {}}
    if freeze:
        base["freeze"] = freeze
    if transplant_from is not None:
        base.update(transplant_from=str(transplant_from), transplant_part=transplant_part)
    return resolve(merge(base, nest(overrides)))


def model_config(variant: str, **options: Any) -> ModelConfig:
    """The model config `variant` gets with these model options: its attention
    kind and the settings coupled to it (`coupling`), unless given. For models
    built outside a task (`mixit signal`, `mixit bench`)."""
    v = get_variant(variant)
    merged = {"attention": v.attention, **options}
    check_pairing(v, merged["attention"])
    return ModelConfig.from_dict({**coupling(merged), **merged})


def is_record(data: Any) -> bool:
    """Whether `data` is a run's config.json: {"config": ..., "request": ..., "mixit_version": ..., ...}."""
    return isinstance(data, dict) and isinstance(data.get("config"), dict) and "mixit_version" in data


def record(cfg: RunConfig) -> dict[str, Any]:
    """What a run's config.json holds: the resolved config, the request it was resolved from, and the
    mixit version and git commit that wrote it."""
    return {"config": cfg.to_dict(), "request": cfg.request, "mixit_version": __version__, "git_commit": git_commit()}


_NOTED: set[str] = set()


def read_record(data: Any, source: str) -> RunConfig:
    """The RunConfig of a run's config.json `data` (read from `source`), with its recorded request.

    A config written by another mixit version may lack options added since: they are filled in from this
    version's defaults, and a one-line note on stderr names each (once per source and process). One this
    version cannot read (an option it does not know, a value it does not accept) is refused in one line
    naming both versions."""
    if not is_record(data):
        raise UsageError(f"{source} is corrupt: no 'config' entry")
    written = data["mixit_version"]
    try:
        cfg = RunConfig.from_dict(data["config"])
    except UsageError as e:
        if written == __version__:
            raise
        raise UsageError(
            f"{source} was written by mixit {written} and cannot be read by mixit {__version__}: {e}"
        ) from None
    filled = _filled(data["config"], cfg.to_dict())
    if filled and source not in _NOTED:
        _NOTED.add(source)
        print(
            f"mixit: note: {source} was written by mixit {written}; filled in from mixit {__version__}'s defaults: "
            + ", ".join(filled),
            file=sys.stderr,
        )
    if isinstance(data.get("request"), dict):
        cfg.request = data["request"]
    return cfg


def _filled(saved: Mapping[str, Any], full: Mapping[str, Any], prefix: str = "") -> list[str]:
    """'key=value' for each key of `full` (recursively) that `saved` does not hold."""
    out = []
    for key, value in full.items():
        if key not in saved:
            out.append(f"{prefix}{key}={json.dumps(value)}")
        elif isinstance(value, Mapping) and isinstance(saved[key], Mapping):
            out += _filled(saved[key], value, f"{prefix}{key}.")
    return out


def read_request_file(path: Path) -> dict[str, Any]:
    """The request in a config file: a user's YAML, TOML or JSON file, or a run's config.json, whose
    recorded request then replays that run (`RunConfig.request`; a run's directory: `mixit.core.run.load_request`)."""
    path = Path(path)
    if not path.is_file():
        raise UsageError(f"config file {path} does not exist")
    try:
        text = path.read_text()
        if path.suffix == ".toml":
            data: Any = tomllib.loads(text)
        elif path.suffix == ".json":
            data = json.loads(text)
        else:
            data = yaml.safe_load(text)
    except (ValueError, UnicodeDecodeError, yaml.YAMLError) as e:
        raise UsageError(f"config file {path} cannot be parsed: {' '.join(str(e).split())}") from None
    if is_record(data):
        return read_record(data, str(path)).request
    if not isinstance(data, dict):
        raise UsageError(f"config file {path} must hold a mapping of keys to values, got {type(data).__name__}")
    return data


# -- building ---------------------------------------------------------------------------


def check_fits(cfg: RunConfig, task: Task) -> None:
    """Refuse a model that cannot read the task: another vocabulary, or sequences longer than n_ctx."""
    model = cfg.model
    check(
        model.vocab_size == task.vocab_size,
        f"model vocab_size={model.vocab_size} but task {cfg.task} needs {task.vocab_size}",
    )
    check(
        task.input_len <= model.n_ctx,
        f"task {task.describe()} feeds sequences of length {task.input_len}, "
        f"longer than n_ctx={model.n_ctx}; n_ctx must be >= {task.input_len}",
    )


def build_task(cfg: RunConfig, run_dir: Path | None = None) -> Task:
    """The task of `cfg`; with `run_dir`, rebuilt from what the run saved (its tokenizer)."""
    params = cfg.params if run_dir is None else cfg.params.for_run(run_dir)
    return TASKS.get(cfg.task)(params, cfg.data_config)


def build_model(cfg: RunConfig, fresh: bool = True) -> tuple[Transformer, FreezeReport]:
    """A model initialised from cfg.model.seed, with the variant, the run's own freeze selectors and the
    transplant's applied. `fresh`: the donor's attention is installed (`mixit.core.transplant.install`, which reads
    the donor); else the weights are to come from a checkpoint, and the donor is not read."""
    model = Transformer(cfg.model)
    freeze = tuple(cfg.freeze)
    if cfg.transplant_from is not None:
        freeze += TRANSPLANT_FREEZE[cfg.transplant_part]
        if fresh:
            from mixit.core.transplant import install  # the donor is a run, and mixit.core.run sits above this module

            install(model, cfg)
    return model, apply_variant(model, cfg.variant, freeze)


def build(
    cfg: RunConfig, run_dir: Path | None = None, fresh: bool | None = None
) -> tuple[Task, Transformer, FreezeReport]:
    """The task (with `run_dir`'s saved tokenizer, if any), the model and the applied variant and freeze
    selectors. `fresh` (default: without `run_dir`): the model starts from its initialisation, not a checkpoint,
    and a transplant's donor is read (`build_model`)."""
    task = build_task(cfg, run_dir)
    check_fits(cfg, task)
    model, report = build_model(cfg, run_dir is None if fresh is None else fresh)
    return task, model, report
