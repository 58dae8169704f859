"""Search per architecture per task: screen the candidates on validation, train the winner in full.

The paper grid-searched its hyperparameters "per architecture per task". A study does the same for
every run whose spec declares candidates (`RunSpec.search`: dotted request paths -> values):

1. **Screening.** Every combination of the candidates is trained once, with seed 0, for
   `screen_fraction` of the run's steps (the learning-rate schedule is that of the shorter run). Runs
   that share the request apart from their seed share one screening: one search serves all seeds of
   a cell.
2. **Selection.** The combination whose validation metric (the task's selection metric:
   `Task.selection`) is best at the end of its screening run wins, by more than the runs' `min_delta`;
   a closer result is a tie, and a tie goes to the combination declared first (`choose`). The test
   set is never read.
3. **The cell.** Every seed of the cell is trained in full with the chosen values.

Screening runs are ordinary runs of the study (ids from their resolved configs, so a screening run
two cells ask for is trained once); study.json records every one with ``role: "screen"`` and every
cell's choice (``chosen``), and the report lists them all in its appendix.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from mixit.errors import UsageError
from mixit.experiment import merge, resolve
from mixit.study.spec import PlannedRun, RunSpec, Study, assign, plan


@dataclass
class Group:
    """The cells that share one search: the same request apart from the seed, the same candidates."""

    key: str
    specs: list[RunSpec]
    combinations: list[dict[str, Any]]
    """Every combination of the candidates, in declaration order: {dotted path: value}."""
    screens: list[RunSpec] = field(default_factory=list)
    """One screening run per combination, in the same order."""


def _unseeded(request: Mapping[str, Any]) -> dict[str, Any]:
    """`request` with seed 0 for the model and the data (the screening seed)."""
    return merge(request, {"model": {"seed": 0}, "data_seed": 0})


def group_key(spec: RunSpec) -> str:
    """What makes two specs share a search: their request at seed 0 and their candidates."""
    text = json.dumps({"request": _unseeded(spec.request), "search": spec.search}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def combinations(search: Mapping[str, Sequence[Any]]) -> list[dict[str, Any]]:
    """Every combination of the candidate values, the first path varying slowest."""
    paths = list(search)
    return [dict(zip(paths, values)) for values in itertools.product(*(search[p] for p in paths))]


def screening_steps(request: Mapping[str, Any], fraction: float) -> int:
    """The steps of a screening run: `fraction` of the run's resolved steps, at least one."""
    try:
        steps = resolve(request).train.steps
    except UsageError:
        return 1  # the request is refused when the study is planned, with the run's labels
    return max(1, math.ceil(steps * fraction))


def groups(specs: Sequence[RunSpec], fraction: float) -> list[Group]:
    """The searches that `specs` ask for, each with its screening runs."""
    found: dict[str, Group] = {}
    for spec in specs:
        if not spec.search:
            continue
        key = group_key(spec)
        if key in found:
            found[key].specs.append(spec)
            continue
        group = Group(key, [spec], combinations(spec.search))
        base = _unseeded(spec.request)
        steps = screening_steps(base, fraction)
        for combination in group.combinations:
            request = base
            for path, value in combination.items():
                request = assign(request, path, value)
            request = merge(request, {"train": {"steps": steps}})
            labels = {
                "table": "search",
                "cell": spec.labels.get("table"),
                "task": spec.labels.get("task", request.get("task")),
                "variant": spec.labels.get("variant", request.get("variant")),
                "group": key,
                "seed": 0,
                **{path.split(".")[-1]: value for path, value in combination.items()},
            }
            group.screens.append(RunSpec(request, labels))
        found[key] = group
    return list(found.values())


def choose(
    group: Group, score: Callable[[RunSpec], tuple[float, bool] | None], tolerance: float = 0.0
) -> dict[str, Any] | None:
    """The winning combination of `group`: `score(screen)` gives (validation metric, higher is better) of a
    finished screening run, or None; None if no screening run finished.

    A combination wins only by more than `tolerance` (the runs' `min_delta`, the least gain the convergence
    criterion counts): a smaller difference is a tie, and a tie goes to the combination declared first.
    Short screening runs of a task that learns in a sudden step often sit within noise of each other
    (retrieval at 400 steps: 25.3% against 24.5%), and the first declared is the preset's preference."""
    best: tuple[float, dict[str, Any]] | None = None
    for combination, screen in zip(group.combinations, group.screens):
        scored = score(screen)
        if scored is None or scored[0] != scored[0]:  # unfinished, failed or nan
            continue
        value = scored[0] if scored[1] else -scored[0]
        if best is None or value > best[0] + tolerance:
            best = (value, combination)
    return None if best is None else best[1]


def apply(spec: RunSpec, chosen: Mapping[str, Any]) -> RunSpec:
    """`spec` with the chosen values in its request, its search done."""
    request = dict(spec.request)
    for path, value in chosen.items():
        request = assign(request, path, value)
    return replace(spec, request=request, search={})


@dataclass
class SearchPlan:
    """A study's runs before its searches are decided: the groups, each screening run resolved once
    (by the identity of its spec), and the runs that need no search."""

    groups: list[Group]
    screens: dict[int, PlannedRun]
    plain: list[PlannedRun]

    def screen(self, spec: RunSpec) -> PlannedRun:
        return self.screens[id(spec)]


def plan_study(study: Study, search: bool = True) -> SearchPlan:
    """Resolve `study` (refusing a bad run before anything starts): its searches with their screening runs,
    and the runs that need none (every run, without `search`)."""
    found = groups(study.specs, study.screen_fraction) if search else []
    screens = {id(s): plan([s], role="screen")[0] for g in found for s in g.screens}
    plain = plan(spec for spec in study.specs if not (search and spec.search))
    return SearchPlan(found, screens, plain)
