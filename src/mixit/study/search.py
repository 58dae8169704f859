"""Search per architecture per task: screen the candidates on validation, train the winner in full.

The paper grid-searched its hyperparameters "per architecture per task". A study does the same for
every run whose spec declares candidates (`RunSpec.search`: dotted request paths -> values), once for
each seed of the cell:

1. **Rung 0.** Every combination of the candidates is trained once for the first rung's length: a
   `screen_fraction` of the run's steps (half of it in a group that halves, step 2), but never fewer than
   the task's `screen_min_steps` (the steps its
   slowest variant needs to leave chance: MixiT on modular addition sits at chance for ~1000 steps), nor
   more than the run's own. The search for a cell's seed s screens with seed `SCREEN_SEED + s` (model and
   data), which no final run uses, so a cell's reported seeds never include the run its settings were
   chosen on.
2. **Rung 1 (successive halving).** A group of `HALVING_MIN` combinations or more trains its best half
   again, from scratch, for twice as long (at most the run's steps); a candidate within the tolerance of
   the last one kept is kept too, so the cut never falls inside a tie. The choice is made on rung 1.
3. **Edge extension.** Where the winner sits on the edge of a numeric axis (its smallest or largest value)
   and beats its neighbour along that axis by more than the tolerance, the value beyond it on that axis
   (the ratio of the two outer grid values: lr 1e-3, 3e-3 -> 9e-3; n_heads 4, 16 -> 64) is screened as a
   candidate of its own, one per such axis, at the length of the rung that chose the winner. One round.
4. **Selection.** A run is scored by the best value of its validation curve (the task's selection metric,
   every evaluation of metrics.jsonl), not its last: a slow starter that overtakes late is not penalised.
   A candidate wins only by more than the runs' `min_delta` (the tolerance); a closer result is a tie.
5. **Ties: more evidence.** Where the rung that chooses (rung 0, rung 1 in a group that halves, or the
   winner against its extensions) leaves more than one candidate within the tolerance of the best, the
   tied candidates alone are trained again, from scratch and at the same screening seed, on a tie rung
   twice as long (at most the run's steps), and the choice is made there; again while they tie and the
   rung can still grow. A tie that survives the run's full steps goes to the higher mean of the validation
   curve over its evaluations after step 0 (the candidate that got there sooner). Only candidates with an
   exactly equal mean fall back to the order they were declared in: the one residual case.

The test set is never read. Every final run of the cell's seed is then trained in full with the values
chosen for it.

Why this design: the choice of settings is the largest source of variance a search adds, so it is redrawn
for every seed, and the interval over seeds measures it with the rest (a choice made once, at one
screening seed, would be a constant that no interval sees). A tie is broken by training longer, never by
the order of the grid: when every candidate sits at chance after a short rung (a slow starter, which
leaves chance in a sudden step), the first declared would otherwise win by default, and a verdict would
rest on the preset's order; at a longer rung the candidates may have left chance and differ. A group that
halves screens its first rung at half the fraction and its best half at the whole fraction, which costs
what one rung of the whole fraction did; an extension costs one run per edge axis, and an edge is extended
only where the win on it was decisive (a tie on the edge says nothing about beyond it). Only groups large
enough to prune (4 combinations or more) halve. Tie rungs cost runs only where the candidates tie, each
rung twice the one before: at most what training every tied candidate at every length up to the full
steps costs (`upper_bound`).

Each stage reads only finished runs: rung 1 starts when all of rung 0 has finished, a tie rung when the rung
it breaks the tie of has, the extension when the winner is chosen, the cell when the extension has (`decide`
is a pure function of the finished runs' scores, so a resumed study asks for exactly the runs it asked for
before). Screening runs are ordinary runs of the study (ids from their resolved configs, so a screening run
two cells ask for is trained once); study.json records every one with ``role: "screen"``, its rung, its
screening seed (``seed``) and its cell's (``cell_seed``) in its labels (``tie`` on a tie rung), each search
with its cell's seed, and every cell's choice (``chosen``); the report lists them all in its appendix.
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
"""The search for a cell's seed s screens with seed `SCREEN_SEED + s` (model and data). Final runs have
small seeds (0..seeds-1 from the first seed, about 100 at most), so no screening seed is ever a final
run's seed, and every seed's search screens with a seed of its own."""

HALVING_MIN = 4
"""A group of at least this many combinations gets a rung 1 (its best half, trained twice as long)."""


class Score(NamedTuple):
    """What the search reads of a finished screening run (nan for a run that failed or logged no value)."""

    best: float
    """The best value of its validation curve: what it is judged by."""
    mean: float
    """The mean of its validation curve after step 0: what breaks a tie that survives the full steps."""
    higher: bool
    """Whether a higher value is better."""


@dataclass
class Group:
    """The cells that share one search: the same request (the seed included), the same candidates."""

    key: str
    specs: list[RunSpec]
    combinations: list[dict[str, Any]]
    """Every combination of the candidates, in declaration order: {dotted path: value}."""
    base: dict[str, Any] = field(default_factory=dict)
    """The screening request (seeded with `SCREEN_SEED + seed`) before the candidates and the steps are set."""
    rungs: tuple[int, ...] = (1,)
    """The steps of each planned rung: (rung 0,) or (rung 0, rung 1)."""
    screens: list[RunSpec] = field(default_factory=list)
    """Rung 0: one screening run per combination, in the same order."""
    seed: int = 0
    """The cells' seed; the search screens with `SCREEN_SEED + seed`."""
    steps: int = 1
    """The cells' own steps: no rung is longer."""

    def length(self, rung: int) -> int:
        """The steps of `rung`: rung 0's, doubled at every rung after it (rung 1 of a group that halves, then
        the tie rungs), at most the cells' steps."""
        return min(self.steps, self.rungs[0] * 2**rung)

    def screen(self, combination: Mapping[str, Any], rung: int, extends: str = "", tie: bool = False) -> RunSpec:
        """The screening run of `combination` at `rung` (`extends`: the axis an extension candidate extends;
        `tie`: a tie rung's run)."""
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
    """(steps, model seed) of `request`; (1, 0) for one that does not resolve (it is refused when the study is
    planned, with the run's labels)."""
    try:
        cfg = resolve(request)
    except UsageError:
        return 1, 0
    return cfg.train.steps, cfg.model.seed


def rung_steps(
    request: Mapping[str, Any], fraction: float, min_steps: int = 0, n_combinations: int = 1
) -> tuple[int, ...]:
    """The steps of each rung: rung 0 a `fraction` of the run's resolved steps, at least `min_steps` (and one),
    at most the run's steps; for `HALVING_MIN` combinations or more, rung 0 is half that fraction (still at
    least `min_steps`) and rung 1 twice rung 0 (at most the run's), so halving costs what one rung did."""
    steps, _ = _resolved(request)
    halving = n_combinations >= HALVING_MIN
    first = min(steps, max(1, min_steps, math.ceil(steps * fraction / (2 if halving else 1))))
    second = min(steps, 2 * first)
    return (first, second) if halving and second > first else (first,)


def groups(specs: Sequence[RunSpec], fraction: float, min_steps: Mapping[str, int] | None = None) -> list[Group]:
    """The searches that `specs` ask for, one per cell and seed, each with its rung-0 screening runs;
    `min_steps`: task -> the fewest steps of its first rung."""
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
    """The combinations of `scored` ((combination, score) in declaration order) within `tolerance` of the best,
    in the same order; none if none has a value.

    `tolerance` is the runs' `min_delta`, the least gain the convergence criterion counts: a smaller difference
    is noise. Short screening runs of a task that learns in a sudden step often sit within it of each other
    (retrieval at 400 steps: 25.3% against 24.5%), and every candidate of a slow starter sits at chance."""
    values = [(combination, _signed(score)) for combination, score in scored]
    best = max((v for _, v in values if v is not None), default=None)
    if best is None:
        return []
    return [combination for combination, v in values if v is not None and v >= best - tolerance]


def pick(scored: Sequence[tuple[dict[str, Any], Score | None]], tolerance: float = 0.0) -> dict[str, Any] | None:
    """The best of `scored` ((combination, score) in declaration order) with no more training to decide it;
    None if none has a value.

    A combination wins only by more than `tolerance`; among those that tie (`tied`), the higher mean of the
    validation curve wins (the one that got there sooner), and only an exactly equal mean goes to the one
    declared first. `decide` calls this only where the tie rungs can grow no longer."""
    candidates = tied(scored, tolerance)
    if not candidates:
        return None
    means = {_key(c): _signed(score, mean=True) for c, score in scored}
    return max(candidates, key=lambda c: _or_worst(means[_key(c)]))  # max keeps the first of equals


def _signed(score: Score | None, mean: bool = False) -> float | None:
    """`score`'s best value (or its curve's mean) with higher better; None for no value (unfinished, failed
    or nan)."""
    if score is None:
        return None
    value = score.mean if mean else score.best
    if value != value:
        return None
    return value if score.higher else -value


def _or_worst(value: float | None) -> float:
    return -math.inf if value is None else value


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
    """Every screening run asked for so far, each once: rung 0, rung 1, the tie rungs after it, then the
    extension candidates and their tie rungs."""
    chosen: dict[str, Any] | None
    """The chosen values ({} where no screening run has a value); None while a run it needs has not finished."""


Candidate = tuple[dict[str, Any], str]
"""A combination to screen, and the axis it extends ("" for one of the grid)."""


def decide(group: Group, score: Callable[[RunSpec], Score | None], tolerance: float = 0.0) -> Outcome:
    """Advance `group`'s search as far as its finished screening runs allow (module docstring); `score` reads
    one screening run, `tolerance` is the runs' `min_delta`."""
    asked = {_key(s.request): s for s in group.screens}
    scores: dict[tuple[str, int], Score | None] = {}

    def trained(candidates: Sequence[Candidate], rung: int) -> list[tuple[dict[str, Any], Score | None]] | None:
        """`candidates` screened at `rung` (asked for if new); None while one has not finished."""
        tie = rung >= len(group.rungs)  # past the planned rungs: a tie rung
        found = []
        for combination, extends in candidates:
            spec = group.screen(combination, rung, extends, tie)
            spec = asked.setdefault(_key(spec.request), spec)  # a run asked before keeps its labels
            scores[(_key(combination), rung)] = got = score(spec)
            found.append((combination, got))
        return None if any(got is None for _, got in found) else found

    def settled(candidates: Sequence[Candidate], rung: int) -> tuple[bool, dict[str, Any] | None]:
        """(whether it is decided, the best of `candidates` from `rung` on): the tied retrained on ever longer
        tie rungs until one wins or the rung reaches the full steps (then `pick`)."""
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
    """The most screening runs `group` can ask for (what `mixit reproduce --list` estimates): every combination
    at every rung up to the full steps (the worst case of the ties: every candidate tied at every rung, rung 1
    of a group that halves included), and the largest candidates winning decisively, with every edge extended
    and each extension tied with the winner up to the full steps.

    It counts one winner's extensions: another winner extends other values, but never more axes, so the
    count is a bound, while the ids of those extension runs may differ."""
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
