"""The verdict rule: a paper finding judged by its margin and the margin's uncertainty.

docs/reproduction.md, "The rule", states it for a reader; this module is that rule, and nothing else.

A finding is one or more **parts** (an AND finding, "on retrieval and on induction", has one per
conjunct). A part is a **margin**: a function of its cells' numbers with the finding's threshold built
in, positive where the part holds ("MixiT at least 30 points below both": min(standard, frozen Q/K) - 30
- MixiT). Its cells are the final runs of the study that it reads, one per seed (`Cell`).

Per seed, each part gets three numbers (`SeedMargin`):

- the **margin** m, at each cell's reported number (its test metric at its best validation evaluation);
- the **noise floor**, `Rule.z` times the margin's standard error, propagated from each cell's standard
  error over its evaluation set's examples (`<metric>_se` in the run's metrics; 0 where a metric has none);
- the **projection** [worst, best]: each cell moved by its drift towards the horizon (`Rule.horizon`
  times its run's step cap), the drift bounded by the slope of its last evaluations plus or minus `Rule.z`
  standard errors of that slope, only in the direction the bound allows, and kept within the metric's
  range; worst and best are the margin's least and greatest values over the moved cells (the margins are
  monotone in each cell, so they are reached at a corner of the cells' ranges).

In one seed a part *holds* when m > floor and worst > 0, *fails* when m < -floor and best < 0, and is
*open* otherwise: within noise, or drift to the horizon could flip its sign. Over seeds: with fewer than
`Rule.interval_seeds`, a part is PASS if it holds in every seed, FAIL if it fails in every seed, else
UNDECIDED; with more, a one-sided `Rule.confidence` t interval over the seeds decides: PASS if the lower
bound of the mean worst is above 0, FAIL if the upper bound of the mean best is below 0, else UNDECIDED
(the spread over seeds then stands for the noise: where the seeds draw their own test sets it includes
the test set's sampling, where they share one, a text corpus's, it does not). A finding takes
its worst part (FAIL before UNDECIDED before PASS). A finding whose **precondition** (a part of its
own) FAILs is UNTESTABLE, with the cause; one whose precondition is undecided is UNDECIDED. A finding
with a cell missing, failed, unfinished or without its number is n/a.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from mixit.study.cells import fmt, rows
from mixit.study.collect import Result, reported, task_class
from mixit.training.convergence import Selection

VERDICTS = ("PASS", "FAIL", "UNTESTABLE", "UNDECIDED", "n/a")


@dataclass(frozen=True)
class Rule:
    """The rule's constants, written down before the runs it judges (docs/reproduction.md, "The rule")."""

    horizon: float = 2.0
    """Drift is projected to this many times each run's step cap: a verdict holds at budgets up to there."""
    z: float = 1.645
    """One-sided 95% normal quantile: the noise floor and the drift bound are this many standard errors."""
    confidence: float = 0.95
    """The one-sided interval over seeds."""
    interval_seeds: int = 3
    """From this many seeds on, the interval over seeds decides; below it, every seed must agree."""
    min_window: int = 4
    """The drift is the slope of the last half of a curve's evaluations after step 0, at least this many."""


RULE = Rule()

_T95 = (6.314, 2.920, 2.353, 2.132, 2.015, 1.943, 1.895, 1.860, 1.833, 1.812, 1.796, 1.782, 1.771, 1.761, 1.753)
"""Student's t one-sided 95% quantiles for 1 to 15 degrees of freedom."""


def t_quantile(df: int, confidence: float = 0.95) -> float:
    """Student's t one-sided quantile: a table to 15 degrees of freedom, then the Cornish-Fisher expansion
    (within 0.001 of the exact quantile from 16 on). Only 95% is tabled."""
    if confidence != 0.95:
        raise ValueError(f"only a 95% interval is tabled, got {confidence}")
    if df < 1:
        raise ValueError(f"degrees of freedom must be at least 1, got {df}")
    if df <= len(_T95):
        return _T95[df - 1]
    z = 1.6448536269514722
    return z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)


# -- cells and their readings ------------------------------------------------------------------------


@dataclass(frozen=True)
class Reading:
    """What a finding reads of one run: its number, that number's standard error, and its curve."""

    value: float
    se: float = 0.0
    curve: tuple[tuple[int, float], ...] = ()
    """(step, value) at each evaluation (or kept checkpoint), in the cell's units."""
    steps: int = 0
    """Steps trained."""
    cap: int = 0
    """The run's step cap."""
    bounds: tuple[float, float] = (-math.inf, math.inf)
    """The metric's range (accuracy 0-100, a head score 0-1, a loss above 0)."""
    solved: bool = False
    """The run stopped solved (validation accuracy >= 99.9%): its reported number, taken at its best validation
    evaluation, would change with more training only if validation rose above that, so it has no drift."""


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
    """Cell name -> number, to the signed margin (the finding's threshold built in)."""
    unit: str = " points"
    digits: int = 1


def difference(high: str, low: str, threshold: float = 0.0) -> Callable[[Mapping[str, float]], float]:
    """The margin of "cell `high` above cell `low` by more than `threshold`": high - low - threshold."""
    return lambda x: x[high] - x[low] - threshold


# -- drift and projection ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Drift:
    """A curve's recent slope (units per step) and its standard error, from `points` evaluations."""

    slope: float
    se: float
    points: int
    first_step: int
    last_step: int


def drift(curve: Sequence[tuple[int, float]], min_window: int = RULE.min_window) -> Drift | None:
    """The least-squares slope of the last half of `curve`'s evaluations after step 0 (at least `min_window`,
    all of them if fewer), and its standard error; None with fewer than three points."""
    later = [(s, v) for s, v in curve if s > 0]
    points = later[-max(min_window, math.ceil(len(later) / 2)) :]
    if len(points) < 3:
        return None
    xs, ys = [float(s) for s, _ in points], [v for _, v in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    residual = sum((y - my - slope * (x - mx)) ** 2 for x, y in zip(xs, ys))
    se = math.sqrt(residual / (len(points) - 2) / sxx)
    return Drift(slope, se, len(points), int(xs[0]), int(xs[-1]))


def projection(reading: Reading, rule: Rule = RULE) -> tuple[float, float, Drift | None]:
    """The range [low, high] `reading`'s number may reach by `rule.horizon` times its cap, at the drift
    bound (slope -/+ z standard errors, each side only where it moves that way), within its bounds."""
    d = None if reading.solved else drift(reading.curve, rule.min_window)
    low = high = reading.value
    remaining = max(0.0, rule.horizon * reading.cap - reading.steps)
    if d is not None and remaining > 0:
        low += min(0.0, d.slope - rule.z * d.se) * remaining
        high += max(0.0, d.slope + rule.z * d.se) * remaining
    lo, hi = reading.bounds
    return max(lo, min(hi, low)), max(lo, min(hi, high)), d


# -- judging a part in one seed, then over seeds ---------------------------------------------------------


@dataclass
class CellDrift:
    """One cell in one seed, as the report shows it."""

    cell: str
    value: float
    se: float
    slope: float | None
    """Units per 1,000 steps; None: too few evaluations to tell."""
    slope_se: float | None
    low: float
    high: float
    """Its projected range at the horizon."""
    horizon: int
    """The step the projection reaches (`Rule.horizon` x its cap)."""


@dataclass
class SeedMargin:
    """One part in one seed."""

    seed: int
    margin: float
    floor: float
    worst: float
    best: float
    reads: str
    """holds, fails or open."""
    why: str = ""
    """For an open seed: within noise, or which cells' drift could flip it."""
    cells: list[CellDrift] = field(default_factory=list)


def _corners(margin: Callable[[Mapping[str, float]], float], ranges: Mapping[str, tuple[float, float]]) -> list[float]:
    """The margin at every corner of the cells' ranges (cells whose range is a point vary not)."""
    names = list(ranges)
    choices = [sorted({ranges[n][0], ranges[n][1]}) for n in names]
    return [margin(dict(zip(names, corner))) for corner in itertools.product(*choices)]


def seed_margin(part: Part, seed: int, readings: Mapping[str, Reading], rule: Rule = RULE) -> SeedMargin:
    """`part` judged in one seed from its cells' readings (module docstring)."""
    values = {name: r.value for name, r in readings.items()}
    m = part.margin(values)
    variance = 0.0
    for name, r in readings.items():  # the margin's change over one standard error of each cell, in quadrature
        if r.se > 0:
            up, down = part.margin({**values, name: r.value + r.se}), part.margin({**values, name: r.value - r.se})
            variance += ((up - down) / 2) ** 2
    floor = rule.z * math.sqrt(variance)
    ranges, cells = {}, []
    for name, r in readings.items():
        low, high, d = projection(r, rule)
        ranges[name] = (low, high)
        cells.append(
            CellDrift(
                name,
                r.value,
                r.se,
                None if d is None else 1000 * d.slope,
                None if d is None else 1000 * d.se,
                low,
                high,
                int(rule.horizon * r.cap),
            )
        )
    corners = _corners(part.margin, ranges)
    worst, best = min(corners), max(corners)
    if m > floor and worst > 0:
        reads, why = "holds", ""
    elif m < -floor and best < 0:
        reads, why = "fails", ""
    else:
        reads, why = "open", _why_open(part, m, floor, worst, best, values, ranges)
    return SeedMargin(seed, m, floor, worst, best, reads, why, cells)


def _why_open(
    part: Part,
    m: float,
    floor: float,
    worst: float,
    best: float,
    values: Mapping[str, float],
    ranges: Mapping[str, tuple[float, float]],
) -> str:
    """Why a seed neither holds nor fails: its margin within the noise floor, or the cells whose drift
    alone could flip the margin's sign."""
    if abs(m) <= floor:
        return f"margin within the noise floor ({m:+.{part.digits}f} against ±{floor:.{part.digits}f})"
    flips = []
    for name, (low, high) in ranges.items():
        for end in (low, high):
            moved = part.margin({**values, name: end})
            if (moved > 0) != (m > 0):
                flips.append(name)
                break
    cells = ", ".join(flips) or "their drift together"
    return f"drift could flip its sign by the horizon ({worst:+.{part.digits}f} to {best:+.{part.digits}f}): {cells}"


@dataclass
class PartVerdict:
    """One part judged over seeds."""

    name: str
    verdict: str
    seeds: list[SeedMargin]
    interval: tuple[float, float] | None = None
    """With `Rule.interval_seeds` seeds or more: (lower bound of the mean worst, upper bound of the mean best)."""
    unit: str = ""
    digits: int = 1

    @property
    def held(self) -> int:
        return sum(s.reads == "holds" for s in self.seeds)

    def blocking(self) -> list[str]:
        return [f"{self.name}, seed {s.seed}: {s.why}" for s in self.seeds if s.reads == "open"]


def over_seeds(part: Part, seeds: Sequence[SeedMargin], rule: Rule = RULE) -> PartVerdict:
    """`part`'s verdict from its seeds (module docstring)."""
    n = len(seeds)
    verdict = PartVerdict(part.name, "UNDECIDED", list(seeds), unit=part.unit, digits=part.digits)
    if n < rule.interval_seeds:
        if all(s.reads == "holds" for s in seeds):
            verdict.verdict = "PASS"
        elif all(s.reads == "fails" for s in seeds):
            verdict.verdict = "FAIL"
        return verdict
    t = t_quantile(n - 1, rule.confidence)

    def bound(xs: list[float], sign: float) -> float:
        return statistics.fmean(xs) + sign * t * statistics.stdev(xs) / math.sqrt(n)

    lower = bound([s.worst for s in seeds], -1)
    upper = bound([s.best for s in seeds], +1)
    verdict.interval = (lower, upper)
    if lower > 0:
        verdict.verdict = "PASS"
    elif upper < 0:
        verdict.verdict = "FAIL"
    return verdict


def worst_of(verdicts: Sequence[str]) -> str:
    """An AND finding's verdict from its parts': FAIL if any fails, else UNDECIDED if any is, else PASS."""
    for v in ("FAIL", "UNDECIDED"):
        if v in verdicts:
            return v
    return "PASS"


# -- a finding ------------------------------------------------------------------------------------------


@dataclass
class Check:
    """A finding of the paper, judged on a study's results."""

    name: str
    verdict: str
    """PASS, FAIL, UNTESTABLE (its precondition fails), UNDECIDED, or n/a (an input run is missing or failed)."""
    evidence: str
    """The numbers behind the verdict, in a line."""
    seeds: int = 0
    holds: int = 0
    """Seeds in which every part holds."""
    horizon: float = RULE.horizon
    parts: list[PartVerdict] = field(default_factory=list)
    precondition: PartVerdict | None = None

    @property
    def blocking(self) -> list[str]:
        """Why an undecided finding is undecided: each open seed of each part, and why."""
        found = [b for p in self.parts for b in p.blocking()]
        return found + (self.precondition.blocking() if self.precondition else [])

    def to_dict(self) -> dict[str, Any]:
        """Its entry in checks.json, which is keyed by the name: every other field, in their order, and
        `blocking`."""
        return {**{k: v for k, v in asdict(self).items() if k != "name"}, "blocking": self.blocking}


def judge(
    name: str,
    results: Sequence[Result],
    parts: Sequence[Part],
    precondition: Part | None = None,
    rule: Rule = RULE,
) -> Check:
    """Judge the finding `name` on the final runs among `results` (module docstring)."""
    final = [r for r in results if r.role == "final"]
    cells = list({c.name: c for p in [*parts, *([precondition] if precondition else [])] for c in p.cells}.values())
    readings, seeds, missing = _inputs(name, final, cells)
    if missing or not seeds:
        return Check(name, "n/a", "missing: " + ("; ".join(missing) or "no runs"), len(seeds))

    def judged(part: Part) -> PartVerdict:
        return over_seeds(
            part, [seed_margin(part, s, {c.name: readings[c.name][s] for c in part.cells}, rule) for s in seeds], rule
        )

    verdicts = [judged(p) for p in parts]
    held = sum(all(v.seeds[i].reads == "holds" for v in verdicts) for i in range(len(seeds)))
    check = Check(name, worst_of([v.verdict for v in verdicts]), "", len(seeds), held, rule.horizon, parts=verdicts)
    numbers = "; ".join(f"{c.name} {fmt([readings[c.name][s].value for s in seeds], c.digits)}{c.unit}" for c in cells)
    if precondition is not None:
        check.precondition = judged(precondition)
        if check.precondition.verdict == "FAIL":
            check.verdict = "UNTESTABLE"
            check.evidence = f"precondition not met: {precondition.name} ({_margins(check.precondition)}); {numbers}"
            return check
        if check.precondition.verdict == "UNDECIDED":
            check.verdict = "UNDECIDED"
    parts_text = "; ".join(f"{v.name}: {v.verdict} ({_margins(v)})" for v in verdicts)
    budget = f"holds at budgets up to {rule.horizon:g}x each run's step cap" if check.verdict == "PASS" else ""
    check.evidence = "; ".join(x for x in (parts_text, budget, numbers) if x)
    return check


def _margins(v: PartVerdict) -> str:
    """A part's margins in a phrase: "margin +55.2 points (floor 1.3)" or, over seeds, their mean and the
    interval."""
    d, unit = v.digits, v.unit
    if len(v.seeds) == 1:
        s = v.seeds[0]
        horizon = f"{s.worst:+.{d}f} to {s.best:+.{d}f}"
        return f"margin {s.margin:+.{d}f}{unit}, noise floor {s.floor:.{d}f}, at the horizon {horizon}"
    mean = statistics.fmean(s.margin for s in v.seeds)
    text = f"mean margin {mean:+.{d}f}{unit} over {len(v.seeds)} seeds, {v.held} holding"
    if v.interval is not None:
        text += f", one-sided bounds at the horizon {v.interval[0]:+.{d}f} / {v.interval[1]:+.{d}f}"
    return text


def _inputs(
    name: str, results: Sequence[Result], cells: Sequence[Cell]
) -> tuple[dict[str, dict[int, Reading]], list[int], list[str]]:
    """Each cell's readings by seed, the seeds, and what is missing of them (a run that is absent, failed or
    unfinished, or lacks its number)."""
    missing: list[str] = []
    readings: dict[str, dict[int, Reading]] = {}
    seen: dict[str, set[int]] = {}
    for cell in cells:
        found = rows(results, **cell.match)
        if not found:
            missing.append(f"{cell.name}: no run")
        readings[cell.name], seen[cell.name] = {}, set()
        for r, labels in found:
            seed = labels.get("seed", 0)
            if seed in seen[cell.name]:
                raise ValueError(f"check {name!r}: cell {cell.name} selects two runs of seed {seed}")
            seen[cell.name].add(seed)
            reading = cell.read(r) if r.state == "done" else None
            if r.state != "done":
                missing.append(f"{cell.name} seed {seed}: {r.state}")
            elif reading is None:
                missing.append(f"{cell.name} seed {seed}: no {cell.what}")
            else:
                readings[cell.name][seed] = reading
    seeds = sorted(set().union(*seen.values())) if seen else []
    missing += [f"{c.name} seed {s}: no run" for c in cells if seen[c.name] for s in seeds if s not in seen[c.name]]
    return readings, seeds, missing


# -- cells of the paper's findings ----------------------------------------------------------------------


def metric(
    key: str, scale: float = 1.0, bounds: tuple[float, float] = (0.0, math.inf)
) -> Callable[[Result], Reading | None]:
    """A reader of the test metric `key` times `scale`: its value at the run's best validation evaluation,
    its standard error (`<key>_se`, 0 where the run has none), its curve over the run's evaluations."""

    def read(r: Result) -> Reading | None:
        test = reported(r)
        if key not in test:
            return None
        curve = tuple((step, scale * value) for step, value in selected_curve(r, key))
        steps, cap = budget(r, curve)
        solved = (r.convergence or {}).get("reason") == "solved"
        return Reading(scale * test[key], scale * test.get(f"{key}_se", 0.0), curve, steps, cap, bounds, solved)

    return read


def budget(r: Result, curve: Sequence[tuple[int, float]]) -> tuple[int, int]:
    """(steps trained, step cap) of a run: its convergence record's steps, else its curve's last step; its
    config's cap, else the steps trained."""
    steps = int((r.convergence or {}).get("steps_trained") or (curve[-1][0] if curve else 0))
    return steps, int(r.config.get("train", {}).get("steps") or steps)


def selected_curve(r: Result, key: str) -> list[tuple[int, float]]:
    """The test metric `key` as the run reports it after each evaluation: at the best validation evaluation so
    far (`mixit.training.convergence.Selection`, as the run itself chose it), or at each evaluation where the
    run recorded no validation metric. Past its best, an overfitting run's curve is flat: more training would
    not change what it reports unless validation improved again."""
    c = r.convergence or {}
    selection = Selection(str(c.get("metric")), bool(c.get("higher_is_better", True)))
    curve: list[tuple[int, float]] = []
    for e in r.evals:
        if key in e:
            selection.extend([{**e, "event": "eval"}], up_to=int(e["step"]))
            curve.append((int(e["step"]), selection.test[key] if selection.step is not None else e[key]))
    return curve


def accuracy(name: str, task: str, **match: Any) -> Cell:
    """The cell `name` read by the number the report judges `task` by (`Task.report_metric`: accuracy in %, or
    loss in nats)."""
    column, key, scale = task_class(task).report_metric
    if column == "accuracy":
        return Cell(name, {"task": task, **match}, metric(key, scale, (0.0, 100.0)), "%", 1)
    return Cell(name, {"task": task, **match}, metric(key, scale), " nats", 3)
