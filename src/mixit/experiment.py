"""A run's whole configuration (`RunConfig`), how it is resolved from what a
user asks for, and how it is built into a task and a model.

A *request* is a partial, nested mapping with the shape of a RunConfig:

    {"task": "retrieval", "variant": "mixit", "task_params": {"max_pairs": 10},
     "model": {"d_model": 256}, "train": {"steps": 500}, "data_seed": 0, "test_size": 4000}

Every key is optional. `resolve` fills in the rest, each layer overriding the
one before:

    1. the dataclass defaults (`ModelConfig`, `TrainConfig`, the task's Config)
    2. the task's own defaults (``Task.defaults``: steps, batch size, lr, ...)
    3. the recipe's settings (`mixit.recipes`: ``laptop`` adds nothing, ``reference``
       the paper's code's hyperparameters)
    4. the request
    and, below all of these, what follows from the model chosen (`coupling`: the
    settings the reference switches on with MixiT attention, and those of depth
    scaling), and what only the task can say: vocab_size, n_ctx (the length the
    reference builds its model for, unless requested) and the settings a task
    needs (a classifier head for sentiment).

The command line (flags and ``--config`` files) and `run_config` build
requests; `as_request` turns a resolved config back into the smallest request
that resolves to it, which is how ``mixit train --config RUN_DIR/config.json``
replays a run and lets flags change it.
"""

from __future__ import annotations

import dataclasses
import json
import math
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from mixit.config import ModelConfig, TaskConfig, TrainConfig, check
from mixit.errors import UsageError
from mixit.freezing import FreezeReport, apply_variant, check_attention, get_variant
from mixit.models import Transformer
from mixit.models.attention import ATTENTION
from mixit.recipes import RECIPES
from mixit.resources import check_memory
from mixit.tasks import TASKS, Task

DEFAULT_TASK = "addition"
DEFAULT_VARIANT = "standard"
DEFAULT_RECIPE = "laptop"


@dataclass
class RunConfig:
    """Everything that defines a run: task, variant, model, optimisation and data seeds."""

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
    data_seed: int = 0
    """Seed of the test set and of the training stream (batch k is drawn from (data_seed, k))."""
    test_size: int = 4000
    """Examples in the fixed test set (tasks with a fixed split use their whole test part)."""
    val_size: int | None = None
    """Examples in the fixed validation set, disjoint from the training stream and the test set: settings are
    chosen and training is stopped on it (each task says where it comes from: docs/tasks.md); null means
    test_size."""

    def __post_init__(self) -> None:
        cls = TASKS.get(self.task)
        if self.task_params is None:
            self.task_params = cls.Config()
        check(
            isinstance(self.task_params, cls.Config),
            f"task {self.task} takes parameters {cls.Config.__name__}, got {type(self.task_params).__name__}",
        )
        check(
            isinstance(self.model, ModelConfig) and isinstance(self.train, TrainConfig),
            "model and train must be a ModelConfig and a TrainConfig",
        )
        variant = get_variant(self.variant)
        check_attention(variant, self.model.attention)
        RECIPES.get(self.recipe)
        if self.val_size is None:
            self.val_size = self.test_size
        for name in ("data_seed", "test_size", "val_size"):
            value = getattr(self, name)
            check(isinstance(value, int) and not isinstance(value, bool), f"{name} must be an integer, got {value!r}")
        check(self.test_size > 0, f"test_size must be a positive integer, got {self.test_size}")
        check(self.val_size > 0, f"val_size must be a positive integer, got {self.val_size}")
        check(0 <= self.data_seed < 2**63, f"data_seed must be an integer in [0, 2^63), got {self.data_seed}")

    @property
    def params(self) -> TaskConfig:
        """The task's parameters (never None after construction)."""
        assert self.task_params is not None
        return self.task_params

    def to_dict(self) -> dict[str, Any]:
        return {
            "task": self.task,
            "variant": self.variant,
            "recipe": self.recipe,
            "task_params": self.params.to_dict(),
            "model": self.model.to_dict(),
            "train": self.train.to_dict(),
            "data_seed": self.data_seed,
            "test_size": self.test_size,
            "val_size": self.val_size,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RunConfig:
        """The inverse of `to_dict`, as strict as the command line: every key known, every value typed."""
        check(isinstance(data, Mapping), f"a run config must be a mapping, got {type(data).__name__}")
        names = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(data) - set(names))
        check(not unknown, f"unknown run config key(s) {', '.join(unknown)}; allowed: {', '.join(names)}")
        missing = [k for k in ("task", "model") if k not in data]
        check(not missing, f"run config is missing {', '.join(missing)}")
        check(isinstance(data["task"], str), f"task must be a string, got {data['task']!r}")
        task_cls = TASKS.get(data["task"])
        return cls(
            task=data["task"],
            variant=data.get("variant", DEFAULT_VARIANT),
            recipe=data.get("recipe", DEFAULT_RECIPE),
            model=ModelConfig.from_dict(data["model"]),
            train=TrainConfig.from_dict(data.get("train", {})),
            task_params=task_cls.Config.from_dict(data.get("task_params", {})),
            data_seed=data.get("data_seed", 0),
            test_size=data.get("test_size", 4000),
            val_size=data.get("val_size"),
        )


# -- requests --------------------------------------------------------------------------

GROUPS: dict[str, type[Any]] = {"model": ModelConfig, "train": TrainConfig}
"""The nested sections of a request and the config class each is checked by."""
TOP_LEVEL = ("task", "variant", "recipe", "task_params", "data_seed", "test_size", "val_size")
DERIVED = {"model": ("vocab_size",)}
"""Options a request may not choose: the task decides them."""
SOURCES = {"model": ("d_model", "n_layers", "depth_alpha", "base_n_layers"), "train": ("steps",)}
"""Options whose value other defaults are computed from (d_mlp from d_model, the residual scales
from the depth, the cadences from steps)."""


def _flat_names() -> dict[str, str]:
    """Option name -> its group ('model', 'train' or '' for the top level), for flat overrides."""
    names: dict[str, str] = {}
    for group, cls in GROUPS.items():
        for f in dataclasses.fields(cls):
            if f.name not in DERIVED.get(group, ()):
                assert f.name not in names, f"option {f.name} is declared twice"
                names[f.name] = group
    for name in ("data_seed", "test_size", "val_size"):
        names[name] = ""
    return names


FLAT_NAMES = _flat_names()
"""Every option that a flat keyword override (`run_config(..., d_model=64)`) may name, with its group."""


def nest(overrides: Mapping[str, Any]) -> dict[str, Any]:
    """Flat option overrides as a nested request: {"d_model": 64} -> {"model": {"d_model": 64}}."""
    unknown = sorted(set(overrides) - set(FLAT_NAMES))
    check(not unknown, f"unknown option(s) {', '.join(unknown)}; allowed: {', '.join(sorted(FLAT_NAMES))}")
    request: dict[str, Any] = {}
    for name, value in overrides.items():
        group = FLAT_NAMES[name]
        if group:
            request.setdefault(group, {})[name] = value
        else:
            request[name] = value
    return request


def merge(*requests: Mapping[str, Any]) -> dict[str, Any]:
    """Later requests override earlier ones, key by key inside each section."""
    out: dict[str, Any] = {}
    for request in requests:
        for key, value in request.items():
            if key in (*GROUPS, "task_params") and isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
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


def resolve(request: Mapping[str, Any]) -> RunConfig:
    """The complete, validated RunConfig that `request` asks for (module docstring)."""
    check(isinstance(request, Mapping), f"a request must be a mapping, got {type(request).__name__}")
    unknown = sorted(set(request) - set(TOP_LEVEL) - set(GROUPS))
    check(not unknown, f"unknown key(s) {', '.join(unknown)}; allowed: {', '.join((*TOP_LEVEL, *GROUPS))}")
    task_name = request.get("task", DEFAULT_TASK)
    check(isinstance(task_name, str), f"task must be a string, got {task_name!r}")
    variant_name = request.get("variant", DEFAULT_VARIANT)
    check(isinstance(variant_name, str), f"variant must be a string, got {variant_name!r}")
    recipe_name = request.get("recipe", DEFAULT_RECIPE)
    check(isinstance(recipe_name, str), f"recipe must be a string, got {recipe_name!r}")
    task_cls = TASKS.get(task_name)
    variant = get_variant(variant_name)
    requested_model = _section(request, "model")
    attention = requested_model.setdefault("attention", variant.attention)
    check(isinstance(attention, str), f"attention must be a string, got {attention!r}")
    check_attention(variant, attention)
    recipe_request = nest_request(RECIPES.get(recipe_name).settings(task_name, attention))
    params = task_cls.Config.from_dict({**recipe_request.get("task_params", {}), **_section(request, "task_params")})
    seeds = {k: request[k] for k in ("data_seed", "test_size", "val_size") if k in request}
    # Checked here as well as by RunConfig, because the task is built first.
    for name, value in seeds.items():
        check(isinstance(value, int) and not isinstance(value, bool), f"{name} must be an integer, got {value!r}")
    check(
        0 <= seeds.get("data_seed", 0) < 2**63,
        f"data_seed must be an integer in [0, 2^63), got {seeds.get('data_seed')}",
    )
    check_memory(
        f"task {task_name}", {"its table of examples": params.memory_bytes()}, "cpu", "choose smaller task parameters"
    )
    task = task_cls(
        params,
        seed=seeds.get("data_seed", 0),
        test_size=seeds.get("test_size", 4000),
        val_size=seeds.get("val_size"),
    )

    defaults = nest(task_cls.defaults)
    model = {**defaults.get("model", {}), **recipe_request.get("model", {}), **requested_model}
    train = {**defaults.get("train", {}), **recipe_request.get("train", {}), **_section(request, "train")}
    if "vocab_size" in model:
        check(
            model["vocab_size"] == task.vocab_size,
            f"vocab_size comes from the task: {task.describe()} has {task.vocab_size} tokens, "
            f"not {model['vocab_size']!r}",
        )
    model = {**task.model_defaults(attention), **coupling(model), **model, "vocab_size": task.vocab_size}
    model.setdefault("n_ctx", task.reference_len)
    cfg = RunConfig(
        task=task_name,
        variant=variant.name,
        recipe=recipe_name,
        task_params=params,
        model=ModelConfig.from_dict(model),
        train=TrainConfig.from_dict(train),
        **seeds,
    )
    check_fits(cfg, task)
    return cfg


def coupling(model: Mapping[str, Any]) -> dict[str, Any]:
    """Model options that follow from others unless set, as in the reference code: the
    settings an attention kind brings (`Attention.coupled`: MixiT's residual, activation
    and width scaling), and, with depth scaling, the residual scales it implies (which
    take precedence, as in the reference). `model` holds the options chosen so far,
    `attention` among them."""
    out = dict(ATTENTION.get(model["attention"]).coupled)
    alpha = model.get("depth_alpha", _default("depth_alpha"))
    check(
        isinstance(alpha, (int, float)) and not isinstance(alpha, bool) and math.isfinite(alpha),
        f"depth_alpha must be a finite number, got {alpha!r}",
    )
    if alpha:
        base, depth = model.get("base_n_layers", _default("base_n_layers")), model.get("n_layers", _default("n_layers"))
        check(
            isinstance(base, int) and isinstance(depth, int) and base > 0 and depth > 0,
            f"n_layers and base_n_layers must be positive integers, got {depth!r}, {base!r}",
        )
        out.update(skip_scale=1.0, branch_scale=(base / depth) ** alpha)
    return out


def _default(name: str) -> Any:
    return ModelConfig.__dataclass_fields__[name].default


def nest_request(settings: Mapping[str, Any]) -> dict[str, Any]:
    """A recipe's settings (flat option names, and task_params) as a nested request."""
    flat = {k: v for k, v in settings.items() if k != "task_params"}
    return {**nest(flat), **({"task_params": settings["task_params"]} if "task_params" in settings else {})}


def run_config(
    task: str = DEFAULT_TASK,
    variant: str = DEFAULT_VARIANT,
    task_params: Mapping[str, Any] | TaskConfig | None = None,
    recipe: str = DEFAULT_RECIPE,
    **overrides: Any,
) -> RunConfig:
    """A complete RunConfig for `task` and `variant`, starting from `recipe`, with
    keyword overrides of any option by its name (``d_model=64, steps=500, data_seed=1``)."""
    base = {"task": task, "variant": variant, "recipe": recipe, "task_params": task_params or {}}
    return resolve(merge(base, nest(overrides)))


def as_request(cfg: RunConfig) -> dict[str, Any]:
    """The smallest request that resolves to `cfg` with this version of mixit.

    It holds the task, variant, task parameters and seeds, and each model and
    training option whose value differs from the default it would get. So
    ``resolve(as_request(cfg)) == cfg``, and a request built from it with, say,
    another task lets the values that were defaults (n_ctx, the task's steps)
    follow the new task, while every value that had been changed stays.
    """
    base: dict[str, Any] = {
        "task": cfg.task,
        "variant": cfg.variant,
        "recipe": cfg.recipe,
        "task_params": cfg.params.to_dict(),
        "data_seed": cfg.data_seed,
        "test_size": cfg.test_size,
        "val_size": cfg.val_size,
    }
    plain = resolve(base)
    # Defaults computed from the run's own source values (d_mlp from its d_model, ...).
    sources = {group: {name: getattr(getattr(cfg, group), name) for name in names} for group, names in SOURCES.items()}
    derived = resolve(merge(base, sources))
    request = dict(base)
    for group in GROUPS:
        mine, default, plain_default = getattr(cfg, group), getattr(derived, group), getattr(plain, group)
        section = {
            f.name: getattr(mine, f.name)
            for f in dataclasses.fields(mine)
            if f.name not in DERIVED.get(group, ()) and getattr(mine, f.name) != getattr(default, f.name)
        }
        for name in SOURCES.get(group, ()):
            if getattr(mine, name) != getattr(plain_default, name):
                section[name] = getattr(mine, name)
        if section:
            request[group] = section
    return request


def model_config(variant: str, **options: Any) -> ModelConfig:
    """The model config `variant` gets with these model options: its attention
    kind and the settings coupled to it (`coupling`), unless given. For models
    built outside a task (`mixit signal`, `mixit bench`)."""
    v = get_variant(variant)
    merged = {"attention": v.attention, **options}
    check_attention(v, merged["attention"])
    return ModelConfig.from_dict({**coupling(merged), **merged})


def is_record(data: Any) -> bool:
    """Whether `data` is a run's config.json: {"config": ..., "mixit_version": ..., "git_commit": ...}."""
    return isinstance(data, dict) and isinstance(data.get("config"), dict) and "mixit_version" in data


def load_request(path: Path) -> dict[str, Any]:
    """The request in a config file: a user's YAML, TOML or JSON file, or a
    run's config.json (or its directory), which becomes the smallest request
    that replays that run (`as_request`)."""
    path = Path(path)
    if path.is_dir():
        path = path / "config.json"
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
        return as_request(RunConfig.from_dict(data["config"]))
    if not isinstance(data, dict):
        raise UsageError(f"config file {path} must hold a mapping of keys to values, got {type(data).__name__}")
    return data


# -- building ---------------------------------------------------------------------------


def check_fits(cfg: RunConfig, task: Task) -> None:
    """Refuse a model that cannot read the task: another vocabulary, or sequences longer than n_ctx."""
    if cfg.model.vocab_size != task.vocab_size:
        raise UsageError(f"model vocab_size={cfg.model.vocab_size} but task {cfg.task} needs {task.vocab_size}")
    if task.input_len > cfg.model.n_ctx:
        raise UsageError(
            f"task {task.describe()} feeds sequences of length {task.input_len}, "
            f"longer than n_ctx={cfg.model.n_ctx}; n_ctx must be >= {task.input_len}"
        )


def build_task(cfg: RunConfig, run_dir: Path | None = None) -> Task:
    """The task of `cfg`; with `run_dir`, rebuilt from what the run saved (its tokenizer)."""
    params = cfg.params if run_dir is None else cfg.params.for_run(run_dir)
    return TASKS.get(cfg.task)(params, seed=cfg.data_seed, test_size=cfg.test_size, val_size=cfg.val_size)


def build_model(cfg: RunConfig) -> tuple[Transformer, FreezeReport]:
    """A fresh model initialised from cfg.model.seed, with the variant applied."""
    model = Transformer(cfg.model)
    return model, apply_variant(model, cfg.variant)


def build(cfg: RunConfig, run_dir: Path | None = None) -> tuple[Task, Transformer, FreezeReport]:
    """The task, the model (initialised from cfg.model.seed) and the applied variant.

    run_dir: the run's directory, whose saved tokenizer (if any) the task then uses.
    """
    task = build_task(cfg, run_dir)
    check_fits(cfg, task)
    model, report = build_model(cfg)
    return task, model, report
