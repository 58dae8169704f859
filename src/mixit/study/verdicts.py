"""The verdict rule: a paper finding judged by an interval over independent seeds. docs/protocol.md ("The rule")
pre-registers it; this module is that rule, and nothing else.

A finding is one or more **parts** (an AND finding has one per conjunct). A part is a **margin** over its cells'
numbers with the finding's threshold built in, positive where it holds. Its cells (`Cell`) are final runs, one per
seed, each read where it was trained: at the longest budget the study trained it to, never a projection.

Per seed (`seed_margin`), the margin has a test-set standard error: each cell's, propagated, in quadrature. Over n
seeds (`over_seeds`), the one-sided interval is mean(m) -/+ sqrt((q sd(m) / sqrt(n))^2 + (z rms(se))^2). The spread
over seeds is estimated from n of them, hence Student's t; the test set's error is known from its thousands of
examples, hence the normal z, and is taken as shared by every seed so that it does not shrink with n (exact for
the text tasks, whose seeds share one test set; conservative for the synthetic ones). Both quantiles are at
1 - alpha / looks: each look of the sequential design (`Rule.schedule`) spends alpha / looks (Bonferroni), so a
false PASS (or FAIL) at any look has chance at most alpha; judged at other seed counts the level is the same,
which is conservative.

A capacity part (`Part.needs_convergence`: memorization's bits per parameter measure what a model can store, not
what it stored by some step) is UNDECIDED while any of its cells had not converged. A finding takes its worst part;
a failed precondition makes it UNTESTABLE; a missing input, n/a.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from mixit.core.training.convergence import CONVERGED
from mixit.study.cells import fmt, rows
from mixit.study.collect import Result, reported, task_class

VERDICTS = ("PASS", "FAIL", "UNTESTABLE", "UNDECIDED", "PROVISIONAL", "n/a")


def t_quantile(level: float, df: float) -> float:
    """Student's t quantile at `level` with `df` degrees of freedom. scipy.stats is imported here, not with this
    module: importing it costs every mixit command a second or more at start, and only a report judges."""
    from scipy import stats

    return float(stats.t.ppf(level, df))


@dataclass(frozen=True)
class Rule:
    """The rule's constants, pre-registered in docs/protocol.md before the runs it judges."""

    alpha: float = 0.05
    """The one-sided error rate of a PASS (and, separately, of a FAIL) over every look of the sequential design."""
    min_seeds: int = 3
    """Fewer seeds than this decide nothing: the verdict is PROVISIONAL."""
    schedule: tuple[int, ...] = (3, 5, 7)
    """The seed counts at which the sequential design looks; seeds are added only up to the last."""

    @property
    def looks(self) -> int:
        return len(self.schedule)

    @property
    def level(self) -> float:
        """The one-sided level of each look's interval: 1 - alpha / looks."""
        return 1 - self.alpha / self.looks

    def quantile(self, n: int) -> float:
        """Student's t quantile at `level` for an interval over `n` seeds."""
        if n < 2:
            raise ValueError(f"an interval over seeds needs two seeds at least, got {n}")
        return t_quantile(self.level, n - 1)

    @property
    def z(self) -> float:
        """The normal quantile at `level`, for the test set's error."""
        from scipy import stats  # here, not at the top: see t_quantile

        return float(stats.norm.ppf(self.level))

    def next_look(self, n: int) -> int | None:
        """The seed count of the design's next look after `n` seeds; None past its last."""
        return next((k for k in self.schedule if k > n), None)


RULE = Rule()


@dataclass(frozen=True)
class Reading:
    """What a finding reads of one run: its number and standard error, and the budget it was read at (steps
    trained, the step cap, whether its validation curve had converged, and the cap as a multiple of the preset's)."""

    value: float
    se: float = 0.0
    steps: int = 0
    cap: int = 0
    converged: bool = True
    budget: int = 1


@dataclass(frozen=True)
class Cell:
    """One input of a finding: the final runs whose labels match `match` (one per seed), read by `read`
    (None: the run lacks the number)."""

    name: str
    """How the report names it: "retrieval/mixit"."""
    match: Mapping[str, Any]
    read: Callable[[Result], Reading | None]
    unit: str = "%"
    digits: int = 1
    what: str = "test metric"
    """What `read` reads, for the report when a run lacks it."""


@dataclass(frozen=True)
class Part:
    """One conjunct of a finding: a margin over some cells, positive where it holds."""

    name: str
    cells: Sequence[Cell]
    margin: Callable[[Mapping[str, float]], float]
    """One seed's numbers by cell name -> the signed margin."""
    unit: str = " points"
    digits: int = 1
    needs_convergence: bool = False
    """A capacity: judged only once every cell has converged (module docstring)."""


def difference(high: str, low: str, threshold: float = 0.0) -> Callable[[Mapping[str, float]], float]:
    """The margin of "cell `high` above cell `low` by more than `threshold`": high - low - threshold."""
    return lambda x: x[high] - x[low] - threshold


@dataclass
class CellReading:
    """One cell in one seed, as the report shows it."""

    cell: str
    value: float
    se: float
    steps: int
    cap: int
    converged: bool
    budget: int


@dataclass
class SeedMargin:
    """One part in one seed: its margin and the margin's test-set standard error."""

    seed: int
    margin: float
    se: float
    cells: list[CellReading] = field(default_factory=list)

    @property
    def holds(self) -> bool:
        return self.margin > 0

    @property
    def moving(self) -> list[str]:
        return [c.cell for c in self.cells if not c.converged]


def seed_margin(part: Part, seed: int, readings: Mapping[str, Reading]) -> SeedMargin:
    """`part` in one seed from its cells' readings."""
    values = {name: r.value for name, r in readings.items()}
    variance = 0.0
    for name, r in readings.items():  # the margin's change over one standard error of each cell, in quadrature
        if r.se > 0:
            up, down = part.margin({**values, name: r.value + r.se}), part.margin({**values, name: r.value - r.se})
            variance += ((up - down) / 2) ** 2
    cells = [CellReading(n, r.value, r.se, r.steps, r.cap, r.converged, r.budget) for n, r in readings.items()]
    return SeedMargin(seed, part.margin(values), math.sqrt(variance), cells)


@dataclass
class PartVerdict:
    """One part judged over seeds."""

    name: str
    verdict: str
    seeds: list[SeedMargin]
    interval: tuple[float, float] | None = None
    """With `Rule.min_seeds` seeds or more: the one-sided (lower, upper) bounds of the mean margin."""
    quantile: float | None = None
    unit: str = ""
    digits: int = 1
    why: str = ""
    """Why the part is not decided."""
    cells: list[dict[str, Any]] = field(default_factory=list)
    """Each cell's `Cell.match`: where more seeds go (`Check.undecided`)."""

    @property
    def held(self) -> int:
        return sum(s.holds for s in self.seeds)

    @property
    def mean(self) -> float:
        return statistics.fmean(s.margin for s in self.seeds)


def over_seeds(part: Part, seeds: Sequence[SeedMargin], rule: Rule = RULE) -> PartVerdict:
    """`part`'s verdict from its seeds."""
    n = len(seeds)
    verdict = PartVerdict(part.name, "PROVISIONAL", list(seeds), unit=part.unit, digits=part.digits)
    verdict.cells = [dict(c.match) for c in part.cells]
    moving = sorted({c for s in seeds for c in s.moving})
    if n < rule.min_seeds:
        verdict.why = f"{n} seed(s): a verdict needs {rule.min_seeds} at least"
        return verdict
    q = rule.quantile(n)
    spread = statistics.stdev(s.margin for s in seeds) / math.sqrt(n)
    test = math.sqrt(statistics.fmean(s.se**2 for s in seeds))
    half = math.hypot(q * spread, rule.z * test)
    verdict.interval, verdict.quantile = (verdict.mean - half, verdict.mean + half), q
    d = part.digits
    if part.needs_convergence and moving:
        verdict.verdict = "UNDECIDED"
        verdict.why = f"not converged at the budget trained: {', '.join(moving)} (a capacity is judged at convergence)"
    elif verdict.interval[0] > 0:
        verdict.verdict = "PASS"
    elif verdict.interval[1] < 0:
        verdict.verdict = "FAIL"
    else:
        verdict.verdict = "UNDECIDED"
        verdict.why = f"the interval {verdict.interval[0]:+.{d}f} to {verdict.interval[1]:+.{d}f} contains 0"
    return verdict


@dataclass(frozen=True)
class Group:
    """A mean over `n` independent seeds, with their sample standard deviation."""

    mean: float
    std: float
    n: int


def contrast(terms: Sequence[tuple[float, Group]], rule: Rule = RULE) -> tuple[float, float, float]:
    """sum(sign x mean) of independent groups, with its one-sided (lower, upper) bounds at `rule.level` by Welch's
    t (Welch-Satterthwaite degrees of freedom): the signal checks compare models at two depths, each its own."""
    value = sum(sign * g.mean for sign, g in terms)
    if any(g.n < 2 for _, g in terms):  # one seed: no spread to bound it by
        return value, -math.inf, math.inf
    variances = [(sign * g.std) ** 2 / g.n for sign, g in terms]
    se = math.sqrt(sum(variances))
    if se == 0:
        return value, value, value
    df = se**4 / sum(v**2 / (g.n - 1) for v, (_, g) in zip(variances, terms) if v > 0)
    half = t_quantile(rule.level, df) * se
    return value, value - half, value + half


ORDER = ("FAIL", "UNDECIDED", "PROVISIONAL", "PASS")


def worst_of(verdicts: Sequence[str]) -> str:
    """An AND finding's verdict: the first of `ORDER` that any part has."""
    return next((v for v in ORDER if v in verdicts), "PASS")


@dataclass
class Check:
    """A finding of the paper, judged on a study's results."""

    name: str
    verdict: str
    """One of `VERDICTS`."""
    evidence: str
    seeds: int = 0
    holds: int = 0
    """Seeds in which every part's margin is positive."""
    parts: list[PartVerdict] = field(default_factory=list)
    precondition: PartVerdict | None = None

    @property
    def blocking(self) -> list[str]:
        """Each undecided or provisional part, and why."""
        judged = [*self.parts, *([self.precondition] if self.precondition else [])]
        return [f"{p.name}: {p.why}" for p in judged if p.why]

    def undecided(self) -> list[PartVerdict]:
        """The parts more seeds could decide: PROVISIONAL, or UNDECIDED by their interval (not by convergence)."""
        judged = [*self.parts, *([self.precondition] if self.precondition else [])]
        return [p for p in judged if p.verdict == "PROVISIONAL" or p.why.startswith("the interval")]

    def to_dict(self) -> dict[str, Any]:
        """Its entry in checks.json (keyed by the name): every other field, in order, and `blocking`."""
        return {**{k: v for k, v in asdict(self).items() if k != "name"}, "blocking": self.blocking}


def judge(
    name: str,
    results: Sequence[Result],
    parts: Sequence[Part],
    precondition: Part | None = None,
    rule: Rule = RULE,
) -> Check:
    """Judge the finding `name` on the final runs among `results`. Each part reads the seeds all its cells have:
    the sequential design adds seeds to an undecided part's cells only, so parts may have different seed counts."""
    final = [r for r in results if r.role == "final"]
    judged_parts = [*parts, *([precondition] if precondition else [])]
    cells = list({c.name: c for p in judged_parts for c in p.cells}.values())
    readings, missing = _inputs(name, final, cells)
    if missing or not any(readings.values()):
        return Check(name, "n/a", "missing: " + ("; ".join(missing) or "no runs"))

    def seeds_of(part: Part) -> list[int]:
        return sorted(set.intersection(*(set(readings[c.name]) for c in part.cells)))

    def judged(part: Part) -> PartVerdict:
        margins = [seed_margin(part, s, {c.name: readings[c.name][s] for c in part.cells}) for s in seeds_of(part)]
        return over_seeds(part, margins, rule)

    verdicts = [judged(p) for p in parts]
    common = sorted(set.intersection(*(set(seeds_of(p)) for p in parts)))
    held = sum(all(m.holds for v in verdicts for m in v.seeds if m.seed == s) for s in common)
    seeds = max(len(v.seeds) for v in verdicts)
    check = Check(name, worst_of([v.verdict for v in verdicts]), "", seeds, held, parts=verdicts)
    numbers = "; ".join(
        f"{c.name} {fmt([r.value for r in readings[c.name].values()], c.digits)}{c.unit}" for c in cells
    )
    budgets = _budgets(readings, cells)
    if precondition is not None:
        check.precondition = judged(precondition)
        if check.precondition.verdict == "FAIL":
            check.verdict = "UNTESTABLE"
            check.evidence = f"precondition not met: {precondition.name} ({_margins(check.precondition)}); {numbers}"
            return check
        if check.precondition.verdict in ("UNDECIDED", "PROVISIONAL"):
            check.verdict = worst_of([check.verdict, check.precondition.verdict])
    parts_text = "; ".join(f"{v.name}: {v.verdict} ({_margins(v)})" for v in verdicts)
    check.evidence = "; ".join(x for x in (parts_text, numbers, budgets) if x)
    return check


def _budgets(readings: Mapping[str, Mapping[int, Reading]], cells: Sequence[Cell]) -> str:
    """ "trained past the cap: a seed 1 (2x); not converged at the budget trained: b seed 0", or as much as applies."""
    read = [(c.name, s, r) for c in cells for s, r in sorted(readings[c.name].items())]
    longer = [f"{name} seed {s} ({r.budget}x)" for name, s, r in read if r.budget > 1]
    moving = [f"{name} seed {s}" for name, s, r in read if not r.converged]
    text = ("trained past the cap: " + ", ".join(longer)) if longer else ""
    if moving:
        text += ("; " if text else "") + "not converged at the budget trained: " + ", ".join(moving)
    return text


def _margins(v: PartVerdict) -> str:
    """A part's margins in a phrase: their mean over seeds, and the interval where there is one."""
    d, unit = v.digits, v.unit
    text = f"mean margin {v.mean:+.{d}f}{unit} over {len(v.seeds)} seed(s), {v.held} positive"
    if v.interval is not None:
        text += f", one-sided bounds {v.interval[0]:+.{d}f} / {v.interval[1]:+.{d}f} (t quantile {v.quantile:.2f})"
    return text


def _inputs(
    name: str, results: Sequence[Result], cells: Sequence[Cell]
) -> tuple[dict[str, dict[int, Reading]], list[str]]:
    """Each cell's readings by seed, and what is missing: a cell with no run, or a run failed, unfinished or without
    its number (a seed one cell has and another lacks is no gap: see `judge`)."""
    missing: list[str] = []
    readings: dict[str, dict[int, Reading]] = {}
    for cell in cells:
        found = rows(results, **cell.match)
        if not found:
            missing.append(f"{cell.name}: no run")
        readings[cell.name], seen = {}, set()
        for r, labels in found:
            seed = labels.get("seed", 0)
            if seed in seen:
                raise ValueError(f"check {name!r}: cell {cell.name} selects two runs of seed {seed}")
            seen.add(seed)
            reading = cell.read(r) if r.state == "done" else None
            if r.state != "done":
                missing.append(f"{cell.name} seed {seed}: {r.state}")
            elif reading is None:
                missing.append(f"{cell.name} seed {seed}: no {cell.what}")
            else:
                readings[cell.name][seed] = reading
    return readings, missing


def metric(key: str, scale: float = 1.0) -> Callable[[Result], Reading | None]:
    """A reader of the test metric `key` times `scale` at the run's best validation evaluation, with its standard
    error (`<key>_se`, else 0)."""

    def read(r: Result) -> Reading | None:
        test = reported(r)
        if key not in test:
            return None
        value, se = scale * test[key], scale * test.get(f"{key}_se", 0.0)
        return Reading(value, se, *budget(r), converged(r), r.budget)

    return read


def converged(r: Result) -> bool:
    """Whether the run's convergence record's reason counts as converged (a run without one does)."""
    reason = (r.convergence or {}).get("reason")
    return reason is None or reason in CONVERGED


def budget(r: Result) -> tuple[int, int]:
    """(steps trained, step cap) of a run: from its convergence record, else its last evaluation; its config."""
    last = int(r.evals[-1]["step"]) if r.evals else 0
    steps = int((r.convergence or {}).get("steps_trained") or last)
    return steps, int(r.config.get("train", {}).get("steps") or steps)


def accuracy(name: str, task: str, **match: Any) -> Cell:
    """The cell `name` read by `task`'s `Task.report_metric` (accuracy in %, or loss in nats)."""
    column, key, scale = task_class(task).report_metric
    if column == "accuracy":
        return Cell(name, {"task": task, **match}, metric(key, scale), "%", 1)
    return Cell(name, {"task": task, **match}, metric(key, scale), " nats", 3)
