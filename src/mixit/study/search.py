"""Search per architecture per task: screen the candidates on validation, train the winner in full.

The paper grid-searched its hyperparameters "per architecture per task". A study does the same for
every run whose spec declares candidates (`RunSpec.search`: dotted request paths -> values):

1. **Rung 0.** Every combination of the candidates is trained once for the first rung's length: a
   `screen_fraction` of the run's steps (half of it in a group that halves, step 2), but never fewer than
   the task's `screen_min_steps` (the steps its
   slowest variant needs to leave chance: MixiT on modular addition sits at chance for ~1000 steps), nor
   more than the run's own. Screening runs use `SCREEN_SEED` (model and data), which no final run uses, so
   a cell's reported seeds never include the run its settings were chosen on.
2. **Rung 1 (successive halving).** A group of `HALVING_MIN` combinations or more trains its best half
   again, from scratch, for twice as long (at most the run's steps); the choice is made on rung 1.
3. **Edge extension.** Where the winner sits on the edge of a numeric axis (its smallest or largest value)
   and beats its neighbour along that axis by more than the tolerance, the value beyond it on that axis
   (the ratio of the two outer grid values: lr 1e-3, 3e-3 -> 9e-3; n_heads 4, 16 -> 64) is screened as a
   candidate of its own, one per such axis, at the length of the rung that chose the winner. One round.
4. **Selection.** A run is scored by the best value of its validation curve (the task's selection metric,
   every evaluation of metrics.jsonl), not its last: a slow starter that overtakes late is not penalised.
   A candidate wins only by more than the runs' `min_delta`; a closer result is a tie, and a tie goes to
   the candidate declared first (the grid's order; the winner before its extensions). The test set is
   never read. Every seed of the cell is then trained in full with the chosen values.

Why this design: a group that halves screens its first rung at half the fraction and its best half at the
whole fraction, which costs what one rung of the whole fraction did; an extension costs one run per edge
axis, and an edge is extended only where the win on it was decisive (a tie on the edge says nothing about
beyond it). Only groups large enough to prune (4 combinations or more) halve.

Each stage reads only finished runs: rung 1 starts when all of rung 0 has finished, the extension when the
rung that chose the winner has, the cell when the extension has (`decide` is a pure function of the
finished runs' scores, so a resumed study asks for exactly the runs it asked for before). Screening runs
are ordinary runs of the study (ids from their resolved configs, so a screening run two cells ask for is
trained once); study.json records every one with ``role: "screen"`` and its rung in its labels, and every
cell's choice (``chosen``); the report lists them all in its appendix.
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
from mixit.study.spec import PlannedRun, RunSpec, Study, assign, plan, seeded

SCREEN_SEED = 1_000_003
"""The model seed and data seed of every screening run. Final runs have seeds 0..seeds-1, so none is a
screening run, and the cells of one search (every seed of a cell) still share their screening runs."""

HALVING_MIN = 4
"""A group of at least this many combinations gets a rung 1 (its best half, trained twice as long)."""

Score = tuple[float, bool] | None
"""What the search reads of a screening run: (its best validation value, higher is better) once it has
finished (nan if it failed or logged no value), None while it has not."""


@dataclass
class Group:
    """The cells that share one search: the same request apart from the seed, the same candidates."""

    key: str
    specs: list[RunSpec]
    combinations: list[dict[str, Any]]
    """Every combination of the candidates, in declaration order: {dotted path: value}."""
    base: dict[str, Any] = field(default_factory=dict)
    """The screening request (seeded with `SCREEN_SEED`) before the candidates and the steps are set."""
    rungs: tuple[int, ...] = (1,)
    """The steps of each rung: (rung 0,) or (rung 0, rung 1)."""
    screens: list[RunSpec] = field(default_factory=list)
    """Rung 0: one screening run per combination, in the same order."""

    def screen(self, combination: Mapping[str, Any], rung: int, extends: str = "") -> RunSpec:
        """The screening run of `combination` at `rung` (`extends`: the axis an extension candidate extends)."""
        request = merge(assign(self.base, combination), {"train": {"steps": self.rungs[rung]}})
        spec = self.specs[0]
        labels = {
            "table": "search",
            "cell": spec.labels.get("table"),
            "task": spec.labels.get("task", request.get("task")),
            "variant": spec.labels.get("variant", request.get("variant")),
            "group": self.key,
            "seed": SCREEN_SEED,
            "rung": rung,
            **({"extends": extends} if extends else {}),
            **{path.split(".")[-1]: value for path, value in combination.items()},
        }
        return RunSpec(request, labels)


def group_key(spec: RunSpec) -> str:
    """What makes two specs share a search: their request at the screening seed and their candidates."""
    text = json.dumps(
        {"request": seeded(spec.request, SCREEN_SEED), "search": spec.search}, sort_keys=True, default=str
    )
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def rung_steps(
    request: Mapping[str, Any], fraction: float, min_steps: int = 0, n_combinations: int = 1
) -> tuple[int, ...]:
    """The steps of each rung: rung 0 a `fraction` of the run's resolved steps, at least `min_steps` (and one),
    at most the run's steps; for `HALVING_MIN` combinations or more, rung 0 is half that fraction (still at
    least `min_steps`) and rung 1 twice rung 0 (at most the run's), so halving costs what one rung did."""
    try:
        steps = resolve(request).train.steps
    except UsageError:
        return (1,)  # the request is refused when the study is planned, with the run's labels
    halving = n_combinations >= HALVING_MIN
    first = min(steps, max(1, min_steps, math.ceil(steps * fraction / (2 if halving else 1))))
    second = min(steps, 2 * first)
    return (first, second) if halving and second > first else (first,)


def groups(specs: Sequence[RunSpec], fraction: float, min_steps: Mapping[str, int] | None = None) -> list[Group]:
    """The searches that `specs` ask for, each with its rung-0 screening runs; `min_steps`: task -> the
    fewest steps of its first rung."""
    found: dict[str, Group] = {}
    for spec in specs:
        if not spec.search:
            continue
        key = group_key(spec)
        if key in found:
            found[key].specs.append(spec)
            continue
        base = seeded(spec.request, SCREEN_SEED)
        paths = list(spec.search)  # every combination of the candidates, the first path varying slowest
        grid = [dict(zip(paths, values)) for values in itertools.product(*spec.search.values())]
        least = (min_steps or {}).get(str(base.get("task")), 0)
        group = Group(key, [spec], grid, base, rung_steps(base, fraction, least, len(grid)))
        group.screens = [group.screen(c, 0) for c in grid]
        found[key] = group
    return list(found.values())


def pick(scored: Sequence[tuple[dict[str, Any], Score]], tolerance: float = 0.0) -> dict[str, Any] | None:
    """The best of `scored` ((combination, score) in declaration order); None if none has a value.

    A combination wins only by more than `tolerance` (the runs' `min_delta`, the least gain the convergence
    criterion counts): a smaller difference is a tie, and a tie goes to the one declared first. Short screening
    runs of a task that learns in a sudden step often sit within noise of each other (retrieval at 400 steps:
    25.3% against 24.5%), and the first declared is the preset's preference."""
    best: tuple[float, dict[str, Any]] | None = None
    for combination, score in scored:
        value = _signed(score)
        if value is not None and (best is None or value > best[0] + tolerance):
            best = (value, combination)
    return None if best is None else best[1]


def _signed(score: Score) -> float | None:
    """`score` with higher better; None for no value (unfinished, failed or nan)."""
    if score is None or score[0] != score[0]:
        return None
    return score[0] if score[1] else -score[0]


def beyond(values: Sequence[Any], value: Any) -> Any:
    """The next value past `value` on an axis of candidate `values`, if `value` is its smallest or largest:
    the outer value times (or divided by) the ratio of the two outer values (1e-3, 3e-3 -> 9e-3 or 3.33e-4;
    4, 16 -> 64 or 1); None for an interior value, an axis of fewer than two values, or one that is not all
    positive numbers. Floats keep three significant digits; integers stay integers (and at least 1)."""
    numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 for v in values)
    ordered = sorted(set(values)) if numeric else []
    if len(ordered) < 2 or value not in (ordered[0], ordered[-1]):
        return None
    inner = ordered[1] if value == ordered[0] else ordered[-2]
    nxt = value * value / inner
    if all(isinstance(v, int) for v in values):
        nxt = round(nxt)
        return nxt if nxt >= 1 and nxt != value else None
    return float(f"{nxt:.3g}")


@dataclass
class Outcome:
    """Where a group's search stands: the screening runs it has asked for, and its choice once made."""

    screens: list[RunSpec]
    """Every screening run asked for so far: rung 0, then rung 1, then the extension candidates."""
    chosen: dict[str, Any] | None
    """The chosen values ({} where no screening run has a value); None while a run it needs has not finished."""


def decide(group: Group, score: Callable[[RunSpec], Score], tolerance: float = 0.0) -> Outcome:
    """Advance `group`'s search as far as its finished screening runs allow (module docstring); `score` reads
    one screening run, `tolerance` is the runs' `min_delta`."""
    asked = list(group.screens)
    scores: dict[tuple[str, int], Score] = {}

    def scored(runs: Sequence[tuple[dict[str, Any], RunSpec, int]]) -> list[tuple[dict[str, Any], Score]] | None:
        found = [(c, score(s)) for c, s, _ in runs]
        for (c, _, rung), (_, got) in zip(runs, found):
            scores[(_key(c), rung)] = got
        return None if any(got is None for _, got in found) else found

    rung = [(c, s, 0) for c, s in zip(group.combinations, group.screens)]
    found = scored(rung)
    if found is None:
        return Outcome(asked, None)
    if len(group.rungs) > 1:  # successive halving: the best half of rung 0, twice as long
        values = [_signed(got) for _, got in found]
        ranked = sorted((-v, i) for i, v in enumerate(values) if v is not None)  # best first, ties: declared first
        kept = sorted(i for _, i in ranked[: len(found) // 2])
        rung = [(group.combinations[i], group.screen(group.combinations[i], 1), 1) for i in kept]
        asked += [s for _, s, _ in rung]
        found = scored(rung)
        if found is None:
            return Outcome(asked, None)
    winner = pick(found, tolerance)
    if winner is None:
        return Outcome(asked, {})
    at = rung[0][2] if rung else 0
    extensions = [
        (candidate, group.screen(candidate, at, extends=path), at)
        for path, candidate in _extensions(group, winner, at, scores, tolerance)
    ]
    asked += [s for _, s, _ in extensions]
    tried = scored(extensions)
    if tried is None:
        return Outcome(asked, None)
    return Outcome(asked, pick([(winner, scores[(_key(winner), at)]), *tried], tolerance))


def _key(combination: Mapping[str, Any]) -> str:
    return json.dumps(combination, sort_keys=True, default=str)


def _extensions(
    group: Group, winner: dict[str, Any], at: int, scores: Mapping[tuple[str, int], Score], tolerance: float
) -> list[tuple[str, dict[str, Any]]]:
    """(axis, candidate) for every numeric axis where `winner` is on the edge and beat its neighbour along the
    axis by more than `tolerance` (at rung `at` if the neighbour trained there, else at rung 0); a candidate
    whose request does not resolve (n_heads that do not divide d_model) is left out."""
    search = group.specs[0].search
    found = []
    for path, values in search.items():
        value = winner[path]
        nxt = beyond(values, value)
        if nxt is None:
            continue
        ordered = sorted(set(values))
        neighbour = {**winner, path: ordered[1] if value == ordered[0] else ordered[-2]}
        rung = at if (_key(neighbour), at) in scores else 0
        mine, theirs = _signed(scores.get((_key(winner), rung))), _signed(scores.get((_key(neighbour), rung)))
        if mine is None or (theirs is not None and mine <= theirs + tolerance):
            continue
        candidate = {**winner, path: nxt}
        try:
            resolve(group.screen(candidate, at).request)
        except UsageError:
            continue
        found.append((path, candidate))
    return found


def upper_bound(group: Group) -> list[RunSpec]:
    """The most screening runs `group` can ask for: every rung, with the last-declared (the largest)
    candidates winning decisively and every edge extended (what `mixit reproduce --list` estimates)."""
    rank = {_key(c): i for i, c in enumerate(group.combinations)}
    return decide(group, lambda s: (float(rank.get(_key(_values(group, s)), -1)), True)).screens


def _values(group: Group, screen: RunSpec) -> dict[str, Any]:
    return {path: screen.labels[path.split(".")[-1]] for path in group.combinations[0]}


def apply(spec: RunSpec, chosen: Mapping[str, Any]) -> RunSpec:
    """`spec` with the chosen values in its request, its search done."""
    return replace(spec, request=assign(spec.request, chosen), search={})


@dataclass
class SearchPlan:
    """A study's runs before its searches are decided: the groups, each rung-0 screening run resolved once
    (by the identity of its spec), and the runs that need no search."""

    groups: list[Group]
    screens: dict[int, PlannedRun]
    plain: list[PlannedRun]

    def screen(self, spec: RunSpec) -> PlannedRun:
        return self.screens[id(spec)]


def plan_study(study: Study, search: bool = True) -> SearchPlan:
    """Resolve `study` (refusing a bad run before anything starts): its searches with their rung-0 screening
    runs, and the runs that need none (every run, without `search`)."""
    found = groups(study.specs, study.screen_fraction, study.screen_min_steps) if search else []
    screens = {id(s): plan([s], role="screen")[0] for g in found for s in g.screens}
    plain = plan(spec for spec in study.specs if not (search and spec.search))
    return SearchPlan(found, screens, plain)
