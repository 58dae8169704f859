"""Search per architecture per task (the paper's "grid-searched per architecture per task"): screen the
candidates on validation, train the winner in full. Every run whose spec declares candidates (`RunSpec.search`)
is searched once per seed of its cell, with screening seed `SCREEN_SEED + seed`, so a cell's reported seeds never
include the run its settings were chosen on (docs/protocol.md, "The search").

1. **Rung 0** trains every combination for a `screen_fraction` of the run's steps (half of it in a group of
   `HALVING_MIN` combinations or more), never fewer than the task's `screen_min_steps` (what its slowest variant
   needs to leave chance), never more than the run's.
2. **Rung 1**, in such a group: its best half, from scratch, twice as long; the choice is made there.
3. **Edge extension**: a winner on the edge of a numeric axis that beat its neighbour there by more than the
   tolerance has the value beyond it screened too (`beyond`), one per such axis, once.
4. **Selection** by the best value of the validation curve, not its last, so a slow starter that overtakes late
   is not penalised; a win needs more than the runs' `min_delta`, else it is a tie.
5. **Ties** are trained again, from scratch, on tie rungs twice as long each, until one wins or the rung reaches
   the run's steps; a tie at the full steps goes to the higher mean of the curve (the one that got there sooner),
   and only an exactly equal mean to declaration order.

Why: the choice of settings is the largest variance a search adds, so it is redrawn per seed and the interval over
seeds measures it (a choice made once would be a constant no interval sees). A tie is broken by training longer,
never by the grid's order: when every candidate of a slow starter sits at chance after a short rung, the first
declared would win by default and a verdict would rest on the preset's order. Halving costs what one rung of the
whole fraction did; an edge is extended only where its win was decisive (a tie there says nothing beyond it).

Each stage reads only finished runs, and `decide` is a pure function of their scores, so a resumed study asks for
exactly the runs it asked for before. Screening runs are ordinary runs of the study, recorded in study.json with
``role: "screen"`` and labels naming their rung, screening seed, cell seed, and ``tie`` or ``extends``. The test
set is never read.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple

from mixit.core.experiment import merge, resolve
from mixit.errors import UsageError
from mixit.study.spec import PlannedRun, RunSpec, Study, assign, plan, seeded

SCREEN_SEED = 1_000_003
"""Far above any final run's seed (about 100 at most), so no screening seed is ever a final run's."""

HALVING_MIN = 4
"""A group of at least this many combinations gets a rung 1 (its best half, trained twice as long)."""


class Score(NamedTuple):
    """What the search reads of a finished screening run: its validation curve's best value, which judges it, and
    its mean after step 0, which breaks a tie at the full steps (nan: failed or logged no value)."""

    best: float
    mean: float
    higher: bool
    """Whether a higher value is better."""


@dataclass
class Group:
    """The cells that share one search: the same request (the seed included), the same candidates."""

    key: str
    specs: list[RunSpec]
    combinations: list[dict[str, Any]]
    """Every combination of the candidates ({dotted path: value}), in declaration order."""
    base: dict[str, Any] = field(default_factory=dict)
    """The screening request (seeded) before the candidates and the steps are set."""
    rungs: tuple[int, ...] = (1,)
    """The steps of each planned rung: (rung 0,) or (rung 0, rung 1)."""
    screens: list[RunSpec] = field(default_factory=list)
    """Rung 0's runs, one per combination."""
    seed: int = 0
    steps: int = 1
    """The cells' own steps: no rung is longer."""

    def length(self, rung: int) -> int:
        """The steps of `rung`: rung 0's, doubled at every rung after it, at most the cells' steps."""
        return min(self.steps, self.rungs[0] * 2**rung)

    def screen(self, combination: Mapping[str, Any], rung: int, extends: str = "", tie: bool = False) -> RunSpec:
        """The screening run of `combination` at `rung` (`extends`: the axis an extension extends)."""
        request = merge(assign(self.base, combination), {"train": {"steps": self.length(rung)}})
        spec = self.specs[0]
        labels = {
            "table": "search",
            "cell": spec.labels.get("table"),
            "task": spec.labels.get("task", request.get("task")),
            "variant": spec.labels.get("variant", request.get("variant")),
            "group": self.key,
            "seed": SCREEN_SEED + self.seed,
            "cell_seed": self.seed,
            "rung": rung,
            **({"tie": True} if tie else {}),
            **({"extends": extends} if extends else {}),
            **{path.split(".")[-1]: value for path, value in combination.items()},
        }
        return RunSpec(request, labels)


def group_key(spec: RunSpec) -> str:
    """What makes two specs share a search: their request (the cell's seed included) and their candidates."""
    text = json.dumps({"request": spec.request, "search": spec.search}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def _resolved(request: Mapping[str, Any]) -> tuple[int, int]:
    """(steps, model seed) of `request`; (1, 0) for one that does not resolve (`plan` refuses it, with its labels)."""
    try:
        cfg = resolve(request)
    except UsageError:
        return 1, 0
    return cfg.train.steps, cfg.model.seed


def rung_steps(
    request: Mapping[str, Any], fraction: float, min_steps: int = 0, n_combinations: int = 1
) -> tuple[int, ...]:
    """The steps of each rung (module docstring, steps 1 and 2)."""
    steps, _ = _resolved(request)
    halving = n_combinations >= HALVING_MIN
    first = min(steps, max(1, min_steps, math.ceil(steps * fraction / (2 if halving else 1))))
    second = min(steps, 2 * first)
    return (first, second) if halving and second > first else (first,)


def groups(specs: Sequence[RunSpec], fraction: float, min_steps: Mapping[str, int] | None = None) -> list[Group]:
    """The searches that `specs` ask for, one per cell and seed, each with its rung-0 screening runs."""
    found: dict[str, Group] = {}
    for spec in specs:
        if not spec.search:
            continue
        key = group_key(spec)
        if key in found:
            found[key].specs.append(spec)
            continue
        steps, seed = _resolved(spec.request)
        base = seeded(spec.request, SCREEN_SEED + seed)
        paths = list(spec.search)  # every combination of the candidates, the first path varying slowest
        grid = [dict(zip(paths, values)) for values in itertools.product(*spec.search.values())]
        least = (min_steps or {}).get(str(base.get("task")), 0)
        rungs = rung_steps(base, fraction, least, len(grid))
        group = Group(key, [spec], grid, base, rungs, seed=seed, steps=steps)
        group.screens = [group.screen(c, 0) for c in grid]
        found[key] = group
    return list(found.values())


def tied(scored: Sequence[tuple[dict[str, Any], Score | None]], tolerance: float = 0.0) -> list[dict[str, Any]]:
    """The combinations of `scored` within `tolerance` (the runs' `min_delta`, the least gain convergence counts)
    of the best, in declaration order. Short screens of a task that learns in a sudden step often sit within it
    of each other (retrieval at 400 steps: 25.3% against 24.5%)."""
    values = [(combination, _signed(score)) for combination, score in scored]
    best = max((v for _, v in values if v is not None), default=None)
    if best is None:
        return []
    return [combination for combination, v in values if v is not None and v >= best - tolerance]


def pick(scored: Sequence[tuple[dict[str, Any], Score | None]], tolerance: float = 0.0) -> dict[str, Any] | None:
    """The best of `scored` where no more training can decide it: among the tied, the higher curve mean, then the
    first declared; None if none has a value."""
    candidates = tied(scored, tolerance)
    if not candidates:
        return None
    means = {_key(c): _signed(score, mean=True) for c, score in scored}
    return max(candidates, key=lambda c: _or_worst(means[_key(c)]))  # max keeps the first of equals


def _signed(score: Score | None, mean: bool = False) -> float | None:
    """`score`'s best value (or mean) with higher better; None for no value."""
    if score is None:
        return None
    value = score.mean if mean else score.best
    if value != value:
        return None
    return value if score.higher else -value


def _or_worst(value: float | None) -> float:
    return -math.inf if value is None else value


def beyond(values: Sequence[Any], value: Any) -> Any:
    """The value past `value` if it is the smallest or largest of the positive numbers `values`, by the ratio of
    the two outer values (1e-3, 3e-3 -> 9e-3 or 3.33e-4; 4, 16 -> 64 or 1), to three significant digits or an
    integer >= 1; else None."""
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
    """Every screening run asked for so far, each once, in the order asked."""
    chosen: dict[str, Any] | None
    """The chosen values ({} where no screening run has a value); None while a run it needs is unfinished."""


Candidate = tuple[dict[str, Any], str]
"""A combination to screen, and the axis it extends ("" for one of the grid)."""


def decide(group: Group, score: Callable[[RunSpec], Score | None], tolerance: float = 0.0) -> Outcome:
    """Advance `group`'s search as far as its finished screening runs (read by `score`) allow."""
    asked = {_key(s.request): s for s in group.screens}
    scores: dict[tuple[str, int], Score | None] = {}

    def trained(candidates: Sequence[Candidate], rung: int) -> list[tuple[dict[str, Any], Score | None]] | None:
        """`candidates` screened at `rung` (asked for if new); None while one is unfinished."""
        tie = rung >= len(group.rungs)  # past the planned rungs: a tie rung
        found = []
        for combination, extends in candidates:
            spec = group.screen(combination, rung, extends, tie)
            spec = asked.setdefault(_key(spec.request), spec)  # a run asked before keeps its labels
            scores[(_key(combination), rung)] = got = score(spec)
            found.append((combination, got))
        return None if any(got is None for _, got in found) else found

    def settled(candidates: Sequence[Candidate], rung: int) -> tuple[bool, dict[str, Any] | None]:
        """(whether it is decided, the best of `candidates` from `rung` on, tie rungs included)."""
        found = trained(candidates, rung)
        while found is not None:
            best = tied(found, tolerance)
            if len(best) < 2 or group.length(rung + 1) == group.length(rung):
                return True, pick(found, tolerance)
            rung += 1
            candidates = [(c, extends) for c, extends in candidates if c in best]
            found = trained(candidates, rung)
        return False, None

    rung = [(c, "") for c in group.combinations]
    found = trained(rung, 0)
    if found is None:
        return Outcome(list(asked.values()), None)
    at = 0
    if len(group.rungs) > 1:  # successive halving: the best half of rung 0 (and any tied with it), twice as long
        values = sorted((v for _, got in found if (v := _signed(got)) is not None), reverse=True)
        cut = values[min(len(found) // 2, len(values)) - 1] if values else math.inf
        at, rung = 1, [(c, "") for c, got in found if (v := _signed(got)) is not None and v >= cut - tolerance]
    done, winner = settled(rung, at)
    if not done:
        return Outcome(list(asked.values()), None)
    if winner is None:
        return Outcome(list(asked.values()), {})
    extensions = [(candidate, path) for path, candidate in _extensions(group, winner, at, scores, tolerance)]
    if not extensions:
        return Outcome(list(asked.values()), winner)
    done, chosen = settled([(winner, ""), *extensions], at)
    return Outcome(list(asked.values()), chosen if done else None)


def _key(values: Mapping[str, Any]) -> str:
    return json.dumps(values, sort_keys=True, default=str)


def _extensions(
    group: Group, winner: dict[str, Any], at: int, scores: Mapping[tuple[str, int], Score | None], tolerance: float
) -> list[tuple[str, dict[str, Any]]]:
    """(axis, candidate) for every axis where `winner` is on the edge and beat its neighbour by more than
    `tolerance` (at rung `at` if the neighbour trained there, else 0), but one that does not resolve (n_heads
    that do not divide d_model)."""
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
    """The most screening runs `group` can ask for (`mixit reproduce --list`): every candidate tied at every rung
    up to the full steps, and the largest winning decisively with every edge extended and tied likewise. Another
    winner extends other values but never more axes, so the count is a bound though the ids may differ."""
    rank = {_key(c): i for i, c in enumerate(group.combinations)}
    decisive = decide(group, lambda s: Score(float(rank.get(_key(_values(group, s)), -1)), 0.0, True)).screens
    top = next(r for r in itertools.count() if group.length(r) == group.length(r + 1))  # the full steps
    extensions = [(_values(group, s), s.labels["extends"], s.labels["rung"]) for s in decisive if "extends" in s.labels]
    runs = [*decisive]
    for rung in range(1, top + 1):
        runs += [group.screen(c, rung, tie=rung >= len(group.rungs)) for c in group.combinations]
    runs += [group.screen(c, rung, axis, True) for c, axis, at in extensions for rung in range(at + 1, top + 1)]
    unique: dict[str, RunSpec] = {}
    for spec in runs:  # each request once, as first asked
        unique.setdefault(_key(spec.request), spec)
    return list(unique.values())


def _values(group: Group, screen: RunSpec) -> dict[str, Any]:
    return {path: screen.labels[path.split(".")[-1]] for path in group.combinations[0]}


def apply(spec: RunSpec, chosen: Mapping[str, Any]) -> RunSpec:
    """`spec` with the chosen values in its request, its search done."""
    return replace(spec, request=assign(spec.request, chosen), search={})


@dataclass
class SearchPlan:
    """A study's runs before its searches are decided: the groups, their rung-0 runs resolved (by the spec's
    identity), and the runs that need no search."""

    groups: list[Group]
    screens: dict[int, PlannedRun]
    plain: list[PlannedRun]

    def screen(self, spec: RunSpec) -> PlannedRun:
        return self.screens[id(spec)]


def plan_study(study: Study, search: bool = True) -> SearchPlan:
    """Resolve `study`, refusing a bad run before anything starts (without `search`, no run is searched)."""
    found = groups(study.specs, study.screen_fraction, study.screen_min_steps) if search else []
    screens = {id(s): plan([s], role="screen")[0] for g in found for s in g.screens}
    plain = plan(spec for spec in study.specs if not (search and spec.search))
    return SearchPlan(found, screens, plain)
