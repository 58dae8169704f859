"""Studies as data: a study is a named list of runs, each an ordinary mixit run.

A run of a study is a `RunSpec`: the request it trains (`mixit.core.experiment`),
the labels that place it in the report (table, task, variant, seed, and the
value of whatever the table varies), and whether `mixit analyze` follows
it. Its id is a hash of its *resolved* configuration, so the same run asked
for by two tables is trained once, and a study run again finds its runs
where it left them.

Studies come from Python (`mixit.study.paper`, from the tables of `mixit.study.tables`)
or from a TOML or YAML file a user writes (`load_study_file`; docs/studies.md is its user's page):

    name = "heads"
    seeds = 2                                    # seeds 0..seeds-1 of every run (model and data)
    extend = [2, 4]                              # optional: an unconverged run again at 2x, then 4x its steps
    [base]                                       # a request every run starts from
    task = "addition"
    task_params = {n_digits = 3}
    train = {steps = 300}
    [grid]                                       # every combination of these
    variant = ["standard", "mixit"]
    "model.n_heads" = [2, 4, 8]
    [search]                                     # optional: chosen per cell on validation
    "train.lr" = [1e-3, 3e-3]                    # (screening runs of screen_fraction = 0.25 of the steps,
    [screen_min_steps]                           #  at least these steps per task: mixit.study.search)
    addition = 100

A YAML file (.yaml, .yml) holds the same keys, read as YAML 1.2 reads numbers (1e-3 is a number, as in TOML),
with TOML's refusals of a key given twice and of a key that is not a string.
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
    """Run `mixit analyze` on it once trained (head scores and attention maps)."""
    search: Mapping[str, tuple[Any, ...]] = field(default_factory=dict)
    """Candidate values per dotted request path (``{"train.lr": (1e-3, 3e-3)}``): the study screens
    every combination on the validation set and trains this run with the best one
    (`mixit.study.search`); empty: the request is trained as it is."""


@dataclass
class PlannedRun:
    """A RunSpec resolved: its config and stable id, and every label it was asked for under."""

    id: str
    cfg: RunConfig
    labels: list[dict[str, Any]]
    analyze: bool
    role: str = "final"
    """final (a cell of a table) or screen (a screening run of a search: `mixit.study.search`)."""
    chosen: dict[str, Any] = field(default_factory=dict)
    """A searched cell: the values its search chose, by dotted request path."""

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
    """A stable id of a resolved configuration: the first 12 hex digits of the sha256 of its canonical JSON.

    The JSON holds every option of `ID_OPTIONS` and each option added since only where its value differs
    from its declared default. So a new option whose default keeps the old behaviour leaves every existing
    run id, and every finished run of a study, as it was; a run that uses it gets a new id. (An option added
    with a default of None that is resolved to a value at construction would enter every id: give it its
    plain default instead.) A transplant's donor enters by its identity (`transplant_donor`), not its path: the
    same transplant from a copy of the donor elsewhere is the same run."""
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
            if f.name not in known and values.get(f.name) == _declared_default(f):
                del values[f.name]
    data.pop("transplant_from", None)
    text = json.dumps(data, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def _declared_default(f: dataclasses.Field[Any]) -> Any:
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    value = f.default
    return list(value) if isinstance(value, tuple) else value


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
    """The runs of several plans, each id once: a run planned twice keeps every label, is a final run if
    either plan says so, and keeps the search's choice if either made one."""
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
    """Seeds first..first+seeds-1, refused in one line unless both are integers, `seeds` positive and `first`
    not negative."""
    seeds, first = typed("seeds", int, seeds), typed("first_seed", int, first)
    for name, value, least in (("seeds", seeds, 1), ("first_seed", first, 0)):
        check(value >= least, f"{name} must be an integer >= {least}, got {value!r}")
    return range(first, first + seeds)


def seeded(request: Mapping[str, Any], seed: int) -> dict[str, Any]:
    """`request` with the model's seed and the data seed both set to `seed`."""
    return merge(request, {"model": {"seed": seed}, "data_seed": seed})


def assign(request: Mapping[str, Any], values: Mapping[str, Any]) -> dict[str, Any]:
    """`request` with each dotted path of `values` (e.g. "model.n_heads", "variant", "task_params.k") set to
    its value."""
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
"""The most final runs (cells x seeds) a study may ask for unless its caller raises the cap (`--max-runs`): a study
above it is refused before it is built, so a grid or a seed count mistyped by orders of magnitude costs one line,
not the machine's memory. The paper presets ask for a few hundred at most."""


def check_size(runs: int, limit: int, what: str) -> None:
    """Refuse, in one line naming the count, a study of `runs` final runs above the cap `limit`."""
    check(
        runs <= limit,
        f"{what} asks for {runs:,} runs (cells x seeds), above the cap of {limit:,}; make it smaller, or give "
        f"--max-runs {runs} to run it",
    )


def once(values: Sequence[Any], what: str) -> None:
    """Refuse a list of grid values or search candidates that holds a value twice (`"standard", "standard"`,
    `0.001, 1e-3`): the same value twice is the same run twice, which would be counted as two cells' or two
    candidates' evidence. Equal values are the same value, whatever their spelling."""
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
    """The multiple of its cell's step cap that a run of these labels trained: its `BUDGET` label, or 1."""
    return int(labels.get(BUDGET, 1))


def budget_multiples(value: Any, where: str = "") -> tuple[int, ...]:
    """`value` as `Study.extend`: integers of at least 2, in increasing order; refused in one line (beginning
    with `where`) otherwise."""
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
"""The version of `mixit.study.search`'s procedure, part of a searched study's fingerprint: a study directory
searched by another procedure (1: one rung at seed 0, judged at its end; 2: one search for every seed of a
cell, a tie to the candidate declared first) is another study, never resumed."""


@dataclass
class Study:
    """A named list of runs, with the report's tables and checks (empty for a user's grid)."""

    name: str
    specs: list[RunSpec]
    description: str = ""
    preset: str = ""
    seeds: int = 1
    first_seed: int = 0
    """The cells' seeds are first_seed..first_seed+seeds-1."""
    extras: dict[str, Any] = field(default_factory=dict)
    """Work beside the runs (the signal sweeps of Tables 6-7): name -> options of `mixit signal`."""
    screen_fraction: float = 0.25
    """A search's first rung trains this fraction of the cell's steps (`mixit.study.search`)."""
    screen_min_steps: dict[str, int] = field(default_factory=dict)
    """Task -> the fewest steps of a search's first rung on it: what its slowest variant needs to leave chance."""
    rebuild: Callable[[int, int], Study] | None = field(default=None, repr=False, compare=False)
    """Builds this study with other seeds (seeds, first_seed), so that it can grow in its directory (`grows`)."""
    extend: tuple[int, ...] = ()
    """Multiples of the step cap, increasing (the paper's protocol: (2, 4)): a final run that ended its budget
    unconverged (improving, or too few evaluations to tell) is trained again from scratch at the first multiple,
    and one still unconverged there at the next (`mixit.study.executors`); the report reads the longest that
    finished (`mixit.study.collect.StudyResults.final`). Empty: no run is extended."""
    source: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)
    """The keys of the study file it was read from, as JSON holds them ({}: a study built in Python): study.json
    records them, so that a directory refuses a changed file naming what changed (`mixit.study.directory`)."""
    more_seeds: Callable[[Path], Sequence[RunSpec]] | None = field(default=None, repr=False, compare=False)
    """Given the study directory, the further final runs to add (new seeds of cells whose verdict is undecided,
    each with its search candidates if any): a pure function of the runs finished there. The study runs in
    rounds until it returns nothing new (`mixit.study.executors.execute`); None: no round after the first."""

    def __post_init__(self) -> None:
        self.extend = budget_multiples(self.extend)

    def grows(self, old: Any, search: bool = True) -> bool:
        """Whether `old` (a directory's study.json) records this study with some of its seeds: the same study,
        built with those seeds, has `old`'s fingerprint. Its runs are then this study's runs of those seeds
        (and the screening runs of those seeds' searches), and the study may continue in place."""
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
                "specs": [[s.request, s.labels, s.analyze, s.search if search else {}] for s in self.specs],
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
        return [s for s in self.specs if all(s.labels.get(k) == v for k, v in labels.items())]


class StudyYamlLoader(yaml.SafeLoader):
    """YAML read as a study file's TOML would be: a number in exponent form (1e-3, 3E5) is a float, as in YAML
    1.2 and TOML (PyYAML, which reads YAML 1.1, would read a string), and a mapping whose key is given twice or
    is not a string is refused (`construct_mapping`)."""

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
    """What a study file holds, read as TOML, or as YAML if its name ends in .yaml or .yml (`StudyYamlLoader`);
    refused in one line if it does not exist, cannot be read, cannot be parsed or holds no mapping."""
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
        raise UsageError(f"study file {path} cannot be parsed: {_parse_error(e)}") from None


def _parse_error(error: Exception) -> str:
    """A parser's error on one line; YAML's as TOML says its own, where it is: its problem (at line L, column C),
    without PyYAML's quote of the line."""
    if isinstance(error, yaml.MarkedYAMLError) and error.problem:
        mark = error.problem_mark
        where = f" (at line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
        return f"{': '.join(p for p in (error.context, error.problem) if p)}{where}"
    return " ".join(str(error).split())


def _screening(data: Mapping[str, Any], path: Path) -> tuple[float, dict[str, int]]:
    """A study file's screen_fraction and screen_min_steps, checked."""
    fraction = typed(f"study file {path}: screen_fraction", float, data.get("screen_fraction", 0.25))
    check(0 < fraction <= 1, f"study file {path}: screen_fraction must be a number in (0, 1], got {fraction!r}")
    least = typed(f"study file {path}: screen_min_steps", dict[str, int], data.get("screen_min_steps", {}))
    check(
        all(v >= 1 for v in least.values()),
        f"study file {path}: screen_min_steps must be a table of task names to positive integers, got {least!r}",
    )
    return fraction, least


def load_study_file(path: Path, seeds: int | None = None, first_seed: int = 0, max_runs: int = MAX_RUNS) -> Study:
    """A user's study from a TOML or YAML file (module docstring, docs/studies.md), its seeds starting at
    `first_seed`: the file's own, or `seeds` where the file sets none. `seeds` beside a file that sets other seeds is
    refused (a study is its file), as is one of more than `max_runs` final runs, before it is built (`check_size`)."""
    data = read_study_data(path)
    if seeds is not None and "seeds" in data and seeds != data["seeds"]:
        raise UsageError(
            f"--seeds {seeds} differs from seeds = {data['seeds']!r} in study file {path}, and a study is its file: "
            "change seeds there (more seeds grow the study in place), or leave --seeds out"
        )
    return _study_from_data(data, path, seeds, first_seed, max_runs)


def _study_from_data(
    data: Mapping[str, Any], path: Path, seeds: int | None, first_seed: int, max_runs: int = MAX_RUNS
) -> Study:
    """The study of a file's keys `data` read from `path` (`load_study_file`), with `seeds` per cell (None: the
    file's) from `first_seed`."""
    allowed = (
        "name",
        "description",
        "seeds",
        "base",
        "grid",
        "analyze",
        "search",
        "screen_fraction",
        "screen_min_steps",
        "extend",
    )
    unknown = sorted(set(data) - set(allowed))
    check(not unknown, f"study file {path}: unknown key(s) {', '.join(unknown)}; allowed: {', '.join(allowed)}")
    name = data.get("name", Path(path).stem)
    check(isinstance(name, str) and bool(name), f"study file {path}: name must be a non-empty string")
    n_seeds = seeds if seeds is not None else data.get("seeds", 1)
    base, axes = data.get("base", {}), data.get("grid", {})
    check(isinstance(base, dict) and isinstance(axes, dict), f"study file {path}: base and grid must be tables")
    analyze = data.get("analyze", False)
    check(isinstance(analyze, bool), f"study file {path}: analyze must be true or false")
    search = data.get("search", {})
    check(isinstance(search, dict), f"study file {path}: search must be a table of dotted paths to lists")
    for key, values in search.items():
        check(
            isinstance(values, list) and len(values) > 0,
            f"study file {path}: search key {key} must list one candidate or more, got {values!r}",
        )
    fraction, least = _screening(data, path)
    extend = budget_multiples(data.get("extend", []), f"study file {path}: ")
    chosen = seed_range(n_seeds, first_seed)
    cells = math.prod(len(values) if isinstance(values, list) else 1 for values in axes.values())  # grid checks
    check_size(cells * len(chosen), max_runs, f"study file {path}")
    try:
        specs = grid(base, axes, chosen, {"table": name}, analyze, search=search)
    except UsageError as e:
        raise UsageError(f"study file {path}: {e}") from None
    return Study(
        name,
        specs,
        data.get("description", ""),
        "file",
        n_seeds,
        first_seed,
        screen_fraction=fraction,
        screen_min_steps=least,
        extend=extend,
        rebuild=lambda more, first: _study_from_data(data, path, more, first, max_runs),
        source=json.loads(json.dumps(data, default=str)),
    )
