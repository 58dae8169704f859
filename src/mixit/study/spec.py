"""Studies as data: a study is a named list of runs (`RunSpec`), each an ordinary mixit run with the labels
that place it in the report. A run's id hashes its *resolved* configuration, so a run two tables ask for is
trained once, and a study run again finds its runs where it left them. Studies come from Python
(`mixit.study.paper`) or from a TOML or YAML file (`load_study_file`, docs/studies.md).
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import math
import re
import tomllib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from mixit.core.config import check, typed
from mixit.core.experiment import RunConfig, merge, resolve
from mixit.errors import UsageError


@dataclass(frozen=True)
class RunSpec:
    """One run of a study."""

    request: Mapping[str, Any]
    """The mixit request it trains."""
    labels: Mapping[str, Any] = field(default_factory=dict)
    """Where it goes in the report: table, task, variant, seed, and the value a table varies."""
    analyze: bool = False
    """Run `mixit analyze` on it once trained."""
    search: Mapping[str, tuple[Any, ...]] = field(default_factory=dict)
    """Candidate values per dotted request path (``{"train.lr": (1e-3, 3e-3)}``) to screen (`mixit.study.search`)."""
    donor: Mapping[str, Any] = field(default_factory=dict)
    """A transplant's donor: the labels of the final run whose directory becomes this run's `transplant_from`;
    this run is planned once that one has finished at its cell's longest budget (`mixit.study.executors`)."""


@dataclass
class PlannedRun:
    """A RunSpec resolved: its config and stable id, and every label it was asked for under."""

    id: str
    cfg: RunConfig
    labels: list[dict[str, Any]]
    analyze: bool
    role: str = "final"
    """final (a cell) or screen (a screening run of a search)."""
    chosen: dict[str, Any] = field(default_factory=dict)
    """The values a search chose for it, by dotted request path."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "labels": self.labels,
            "analyze": self.analyze,
            "role": self.role,
            "chosen": self.chosen,
            "config": self.cfg.to_dict(),
        }


ID_OPTIONS = {
    "": ("task", "model", "variant", "recipe", "train", "task_params", "data_seed", "test_size", "val_size"),
    "model": (
        "vocab_size", "n_ctx", "d_model", "n_layers", "n_heads", "d_mlp", "attention", "bias", "rope_base",
        "init_std", "qk_init", "mixing_alpha", "mixing_sink", "mixing_centring", "skip_scale", "branch_scale",
        "depth_alpha", "base_n_layers", "activation", "leaky_c", "width_scaling", "base_width", "down_base_width",
        "width_scale_head", "width_init", "seed", "causal", "head", "n_classes", "pooling", "pad_id",
    ),
    "train": (
        "steps", "batch_size", "lr", "weight_decay", "beta1", "beta2", "warmup_steps", "schedule", "min_lr_ratio",
        "grad_clip", "grad_accum", "dtype", "eval_every", "log_every", "checkpoint_every", "eval_batch_size",
        "early_stop", "stop_at", "patience", "min_delta",
    ),
    "task_params.addition": ("n_digits", "reference_mask"),
    "task_params.dyck": ("max_pairs",),
    "task_params.induction": ("k", "alphabet", "length"),
    "task_params.memorization": ("n", "fraction"),
    "task_params.modular_addition": ("p", "train_fraction"),
    "task_params.retrieval": ("max_pairs", "vocab"),
    "task_params.lm": ("tokenizer", "data_dir", "max_documents", "corpus", "length", "vocab", "held_out", "packing"),
    "task_params.sentiment": ("tokenizer", "data_dir", "max_documents", "dataset", "length", "vocab", "held_out"),
}  # fmt: skip
"""The options of mixit 0.2.0, by section: a run id always hashes these. Frozen: never edit it when an option
is added (see `run_id`)."""


def run_id(cfg: RunConfig) -> str:
    """The first 12 hex digits of the sha256 of a resolved configuration's canonical JSON: every option of
    `ID_OPTIONS`, and a later option only where it differs from its default, so that a new option whose default
    keeps the old behaviour leaves every existing id as it was (one defaulting to None that construction resolves
    would enter every id: give it its plain default). A transplant's donor enters by its identity, not its path."""
    data = cfg.to_dict()
    sections = {
        "": (data, RunConfig),
        "model": (data["model"], type(cfg.model)),
        "train": (data["train"], type(cfg.train)),
        f"task_params.{cfg.task}": (data["task_params"], type(cfg.params)),
    }
    for section, (values, cls) in sections.items():
        known = ID_OPTIONS.get(section, ())
        for f in dataclasses.fields(cls):
            default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
            if f.name not in known and values.get(f.name) == (list(default) if isinstance(default, tuple) else default):
                del values[f.name]
    data.pop("transplant_from", None)
    text = json.dumps(data, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def plan(specs: Iterable[RunSpec], role: str = "final") -> list[PlannedRun]:
    """Resolve every spec (refusing any bad one before anything runs) and merge those that resolve alike."""
    planned: dict[str, PlannedRun] = {}
    for spec in specs:
        try:
            cfg = resolve(spec.request)
        except UsageError as e:
            where = ", ".join(f"{k}={v}" for k, v in spec.labels.items())
            raise UsageError(f"study run ({where}): {e}") from None
        key = run_id(cfg)
        if key in planned:
            planned[key].labels.append(dict(spec.labels))
            planned[key].analyze |= spec.analyze
        else:
            planned[key] = PlannedRun(key, cfg, [dict(spec.labels)], spec.analyze, role)
    return list(planned.values())


def merge_planned(*lists: Sequence[PlannedRun]) -> list[PlannedRun]:
    """The runs of several plans, each id once, with every label, final if either says so, and any choice made."""
    merged: dict[str, PlannedRun] = {}
    for planned in (p for runs in lists for p in runs):
        if planned.id not in merged:
            merged[planned.id] = dataclasses.replace(planned, labels=list(planned.labels))
            continue
        kept = merged[planned.id]
        kept.labels += [labels for labels in planned.labels if labels not in kept.labels]
        kept.analyze |= planned.analyze
        kept.role = "final" if "final" in (kept.role, planned.role) else kept.role
        kept.chosen = kept.chosen or planned.chosen
    return list(merged.values())


Seeds = int | range
"""The seeds of a study's cells: a count n (seeds 0..n-1) or the seeds themselves (`seed_range`)."""


def seed_range(seeds: int, first: int = 0) -> range:
    """Seeds first..first+seeds-1."""
    seeds, first = typed("seeds", int, seeds), typed("first_seed", int, first)
    check(seeds >= 1, f"seeds must be an integer >= 1, got {seeds!r}")
    check(first >= 0, f"first_seed must be an integer >= 0, got {first!r}")
    return range(first, first + seeds)


def seeded(request: Mapping[str, Any], seed: int) -> dict[str, Any]:
    """`request` with the model's seed and the data seed both set to `seed`."""
    return merge(request, {"model": {"seed": seed}, "data_seed": seed})


def assign(request: Mapping[str, Any], values: Mapping[str, Any]) -> dict[str, Any]:
    """`request` with each dotted path of `values` ("variant", "model.n_heads") set to its value."""
    out = dict(request)
    for path, value in values.items():
        head, _, rest = path.partition(".")
        if not rest:
            out[head] = value
            continue
        inner = out.get(head, {})
        check(isinstance(inner, Mapping), f"grid key {path}: {head} is not a section")
        out[head] = assign(inner, {rest: value})
    return out


MAX_RUNS = 10_000
"""The most final runs a study may ask for unless `--max-runs` raises it: a grid or seed count mistyped by orders
of magnitude is refused before it is built, not when it has filled the memory."""


def check_study_name(name: Any, where: str) -> None:
    """Refuse a study name that is not one directory name: the study's default output directory is named after it
    (runs/study-NAME, an atlas's runs/NAME), so "a/b" would nest it and "../x" would leave runs/."""
    check(
        isinstance(name, str) and bool(name) and not {"/", "\\"} & set(name) and name not in (".", ".."),
        f"{where}: name must be a non-empty string usable as one directory name (no '/' or '\\', not '.' or '..'), "
        f"got {name!r}",
    )


def check_size(runs: int, limit: int, what: str) -> None:
    """Refuse a study of `runs` final runs above `limit`."""
    check(
        runs <= limit,
        f"{what} asks for {runs:,} runs (cells x seeds), above the cap of {limit:,}; make it smaller, or give "
        f"--max-runs {runs} to run it",
    )


def once(values: Sequence[Any], what: str) -> None:
    """Refuse values listed twice (`0.001, 1e-3` included): one run would count as two cells' evidence."""
    repeated = [value for i, value in enumerate(values) if value in values[:i]]
    if repeated:
        raise UsageError(f"{what} lists {repeated[0]!r} more than once ({list(values)!r}); list each value once")


def grid(
    base: Mapping[str, Any],
    axes: Mapping[str, Sequence[Any]],
    seeds: Seeds = 1,
    labels: Mapping[str, Any] | None = None,
    analyze: bool = False,
    search: Mapping[str, Sequence[Any]] | None = None,
) -> list[RunSpec]:
    """Every combination of the values of `axes` (dotted request paths) applied to `base`, for each seed;
    `search` (candidate values per dotted path) is given to every run (`RunSpec.search`)."""
    for path, values in axes.items():
        check(
            isinstance(values, (list, tuple)) and len(values) > 0,
            f"grid key {path} must list one value or more, got {values!r}",
        )
        once(values, f"grid key {path}")
    for path, values in (search or {}).items():
        once(values, f"search key {path}")
    candidates = {path: tuple(values) for path, values in (search or {}).items()}
    specs = []
    names = list(axes)
    for combination in itertools.product(*(axes[n] for n in names)):
        request = assign(base, dict(zip(names, combination)))
        varied = {path.split(".")[-1]: value for path, value in zip(names, combination)}
        cell = {**(labels or {}), **varied}
        for seed in seed_range(seeds) if isinstance(seeds, int) else seeds:
            specs.append(RunSpec(seeded(request, seed), {**cell, "seed": seed}, analyze, candidates))
    return specs


BUDGET = "budget"
"""The label of a final run trained again at a multiple of its cell's step cap (`Study.extend`): the multiple."""


def budget(labels: Mapping[str, Any]) -> int:
    """The multiple of its cell's step cap that a run of these labels trained."""
    return int(labels.get(BUDGET, 1))


def budget_multiples(value: Any, where: str = "") -> tuple[int, ...]:
    """`value` as `Study.extend` (integers >= 2, increasing), else refused."""
    try:
        multiples = typed("extend", tuple[int, ...], value)
        ok = all(m >= 2 for m in multiples) and list(multiples) == sorted(set(multiples))
    except UsageError:
        ok = False
    check(
        ok,
        f"{where}extend must list multiples of the step cap, integers >= 2 in increasing order (e.g. [2, 4]), "
        f"got {value!r}",
    )
    return multiples


SEARCH_PROCEDURE = 3
"""The version of `mixit.study.search`'s procedure, in a searched study's fingerprint, so that a directory
searched by another (1: one rung at seed 0; 2: one search per cell, ties to the first candidate) is never
resumed."""


@dataclass
class Study:
    """A named list of runs, with the report's tables and checks (empty for a user's grid)."""

    name: str
    specs: list[RunSpec]
    description: str = ""
    preset: str = ""
    seeds: int = 1
    first_seed: int = 0
    extras: dict[str, Any] = field(default_factory=dict)
    """Work beside the runs (the signal sweeps of Tables 6-7): name -> options of `mixit signal`."""
    screen_fraction: float = 0.25
    """A search's first rung trains this fraction of the cell's steps (`mixit.study.search`)."""
    screen_min_steps: dict[str, int] = field(default_factory=dict)
    """Task -> the fewest steps of a search's first rung on it: what its slowest variant needs to leave chance."""
    rebuild: Callable[[int, int], Study] | None = field(default=None, repr=False, compare=False)
    """Builds this study with other (seeds, first_seed), so that it can grow in its directory (`grows`)."""
    extend: tuple[int, ...] = ()
    """Increasing multiples of the step cap: a final run that ended unconverged is trained again from scratch at
    the next (`mixit.study.executors`); the report reads the longest that finished."""
    source: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)
    """The study file's keys, recorded in study.json so that a directory refuses a changed file naming the change."""
    more_seeds: Callable[[Path], Sequence[RunSpec]] | None = field(default=None, repr=False, compare=False)
    """The further final runs to add given the study directory, a pure function of the runs finished there: the
    study runs in rounds until it returns nothing new; None: one round."""

    def __post_init__(self) -> None:
        check_study_name(self.name, "study")
        self.extend = budget_multiples(self.extend)

    def grows(self, old: Any, search: bool = True) -> bool:
        """Whether `old` (a directory's study.json) records this study with some of its seeds, so that the study
        may continue in place."""
        if self.rebuild is None or not isinstance(old, dict) or old.get("name") != self.name:
            return False
        seeds, first = old.get("seeds"), old.get("first_seed", 0)
        if not (isinstance(seeds, int) and isinstance(first, int) and seeds >= 1):
            return False
        if not (self.first_seed <= first and first + seeds <= self.first_seed + self.seeds):
            return False
        return self.rebuild(seeds, first).fingerprint(search) == old.get("fingerprint")

    def fingerprint(self, search: bool = True) -> str:
        """What identifies the study in its directory: its runs as asked for, and how they are searched."""
        text = json.dumps(
            {
                "name": self.name,
                "specs": [
                    [s.request, s.labels, s.analyze, s.search if search else {}, *([s.donor] if s.donor else [])]
                    for s in self.specs
                ],
                "screen_fraction": self.screen_fraction if search else None,
                **({"screen_min_steps": self.screen_min_steps} if search and self.screen_min_steps else {}),
                **({"search_procedure": SEARCH_PROCEDURE} if search else {}),
                **({"extend": list(self.extend)} if self.extend else {}),
                "extras": self.extras,
            },
            sort_keys=True,
            default=str,
        )
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def labelled(self, **labels: Any) -> list[RunSpec]:
        """The runs whose labels include `labels`."""
        return [s for s in self.specs if all(s.labels.get(k) == v for k, v in labels.items())]


class StudyYamlLoader(yaml.SafeLoader):
    """YAML read as TOML would read it: 1e-3 is a float (PyYAML's YAML 1.1 reads a string), and a key given twice
    or not a string is refused."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *anchor`: keys given after it override its keys
                continue
            key = self.construct_object(key_node, deep=True)
            if not isinstance(key, str) or key in seen:
                problem = f"key {key!r} is " + ("not a string" if not isinstance(key, str) else "given twice")
                raise yaml.constructor.ConstructorError(None, None, problem, key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep)


StudyYamlLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)


def read_study_data(path: Path) -> dict[str, Any]:
    """What a study file holds, read as TOML, or as YAML if its name ends in .yaml or .yml."""
    try:
        text = Path(path).read_text()
        if Path(path).suffix.lower() not in (".yaml", ".yml"):
            return tomllib.loads(text)
        data = yaml.load(text, Loader=StudyYamlLoader)
        data = {} if data is None else data  # an empty file, as an empty TOML file
        check(
            isinstance(data, dict),
            f"study file {path} must hold a mapping of keys (name, base, grid, ...), got {type(data).__name__}",
        )
        return data
    except FileNotFoundError:
        raise UsageError(f"study file {path} does not exist") from None
    except OSError as e:  # a directory, a file it may not read, ...
        raise UsageError(f"study file {path} is not a readable file ({e.strerror or type(e).__name__})") from None
    except (tomllib.TOMLDecodeError, yaml.YAMLError, UnicodeDecodeError) as e:
        problem = " ".join(str(e).split())
        if isinstance(e, yaml.MarkedYAMLError) and e.problem:  # as TOML says it: no quote of the line
            mark = e.problem_mark
            problem = ": ".join(p for p in (e.context, e.problem) if p)
            problem += f" (at line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
        raise UsageError(f"study file {path} cannot be parsed: {problem}") from None


FILE_KEYS = (
    "name", "description", "seeds", "base", "grid", "analyze", "search", "screen_fraction", "screen_min_steps",
    "extend", "atlas",
)  # fmt: skip
"""The keys a study file may hold (docs/studies.md, "The keys")."""

ATLAS_KEYS = ("name", "description", "seeds", "atlas")
"""The keys of a study file's atlas form (docs/atlas.md): the atlas table, and its name, description and seeds."""


def load_study_file(path: Path, seeds: int | None = None, first_seed: int = 0, max_runs: int = MAX_RUNS) -> Study:
    """A user's study from a TOML or YAML file, its seeds from `first_seed`: the file's count, or `seeds` where
    the file sets none (a study is its file). One of more than `max_runs` final runs is refused before it is built."""
    data = read_study_data(path)
    if seeds is not None and "seeds" in data and seeds != data["seeds"]:
        raise UsageError(
            f"--seeds {seeds} differs from seeds = {data['seeds']!r} in study file {path}, and a study is its file: "
            "change seeds there (more seeds grow the study in place), or leave --seeds out"
        )
    where = f"study file {path}"
    unknown = sorted(set(data) - set(FILE_KEYS))
    check(not unknown, f"{where}: unknown key(s) {', '.join(unknown)}; allowed: {', '.join(FILE_KEYS)}")
    name = data.get("name", Path(path).stem)
    check_study_name(name, where)
    if "atlas" in data:
        beside = sorted(set(data) - set(ATLAS_KEYS))
        check(not beside, f"{where}: an atlas takes only {', '.join(ATLAS_KEYS)}, not {', '.join(beside)}")
        # Here, not at the top: the atlas judges its cells with the report's readers, which import this module.
        from mixit.study.atlas import atlas_study, read_atlas_file

        tasks, preset = read_atlas_file(data, where)
        n_seeds = typed(f"{where}: seeds", int | None, seeds if seeds is not None else data.get("seeds"))
        study = atlas_study(tasks, preset, n_seeds, first_seed, max_runs, name)
        study.description = data.get("description", study.description)
        study.source = json.loads(json.dumps(data, default=str))
        return study
    base, axes = data.get("base", {}), data.get("grid", {})
    check(isinstance(base, dict) and isinstance(axes, dict), f"{where}: base and grid must be tables")
    analyze = data.get("analyze", False)
    check(isinstance(analyze, bool), f"{where}: analyze must be true or false")
    search = data.get("search", {})
    check(isinstance(search, dict), f"{where}: search must be a table of dotted paths to lists")
    for key, values in search.items():
        check(
            isinstance(values, list) and len(values) > 0,
            f"{where}: search key {key} must list one candidate or more, got {values!r}",
        )
    fraction = typed(f"{where}: screen_fraction", float, data.get("screen_fraction", 0.25))
    check(0 < fraction <= 1, f"{where}: screen_fraction must be a number in (0, 1], got {fraction!r}")
    least = typed(f"{where}: screen_min_steps", dict[str, int], data.get("screen_min_steps", {}))
    check(
        all(v >= 1 for v in least.values()),
        f"{where}: screen_min_steps must be a table of task names to positive integers, got {least!r}",
    )
    extend = budget_multiples(data.get("extend", []), f"{where}: ")

    def build(n_seeds: Any, first: int) -> Study:
        chosen = seed_range(n_seeds, first)
        cells = math.prod(len(values) if isinstance(values, list) else 1 for values in axes.values())  # grid checks
        check_size(cells * len(chosen), max_runs, where)
        try:
            specs = grid(base, axes, chosen, {"table": name}, analyze, search=search)
        except UsageError as e:
            raise UsageError(f"{where}: {e}") from None
        return Study(
            name,
            specs,
            data.get("description", ""),
            "file",
            n_seeds,
            first,
            screen_fraction=fraction,
            screen_min_steps=least,
            extend=extend,
            rebuild=build,
            source=json.loads(json.dumps(data, default=str)),
        )

    return build(seeds if seeds is not None else data.get("seeds", 1), first_seed)
