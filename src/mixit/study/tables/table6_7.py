"""Tables 6-7: depth, trained (Table 6) and at initialisation (Table 7, the signal sweeps).

The paper's findings: the random transformer (embeddings and readout trained, attention and MLPs
frozen) loses addition as it gets deeper while MixiT does not (Table 6), because at initialisation
its token representations grow alike with depth (rank collapse) while MixiT's do not (Table 7).

Two signal sweeps run beside the runs (`Study.extras`): ``signal-nosink`` builds MixiT as the paper
describes it, ``signal`` with the reference code's sink head (docs/model.md, "The sink head"). The
paper's finding is judged on the first; what the sink changes is a finding of its own.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from typing import Any

from mixit.study.cells import by_label, rows
from mixit.study.collect import StudyResults
from mixit.study.figures import plot_lines
from mixit.study.presets import Scale
from mixit.study.render import variant_table
from mixit.study.spec import RunSpec, Seeds, grid
from mixit.study.tables.base import Table
from mixit.study.verdicts import RULE, Check, Group, Part, accuracy, contrast, judge, worst_of

SWEEPS = {"signal": "reference", "signal-nosink": "off"}
"""Each signal sweep of `extras` -> how MixiT's head 0 is built (`signal_command`'s mixing_sink)."""
DEPTH_POINTS = 5.0
"""Points of accuracy the random transformer must lose with depth, and MixiT may at most."""
LEARNS = 90.0
"""The shallow random transformer's accuracy (%) from which a fall can be judged."""
RISE = 0.1
"""A change of token cosine with depth larger than this is a rise; a smaller one is flat."""


def runs(scale: Scale, seeds: Seeds) -> list[RunSpec]:
    """The random (embeddings-only) transformer against MixiT on addition by depth (the scale's "depth" request
    if it has one, else its addition), each with the scale's "depth" search."""
    return [
        spec
        for variant in ("random", "mixit")
        for spec in grid(
            scale.tasks.get("depth", scale.tasks["addition"]),
            {"variant": [variant], "model.n_layers": list(scale.depths)},
            seeds,
            {"table": "table6", "task": "addition"},
            search=scale.search_for("depth", variant),
        )
    ]


def extras(scale: Scale, seeds: Seeds) -> dict[str, dict[str, Any]]:
    """The signal sweeps at initialisation, with and without the sink head, their initialisation seeds starting
    at the study's first seed (a study from seed 0 records none: its sweeps as they always were)."""
    variants = ("standard", "mixit", "random")
    first = {} if isinstance(seeds, int) or seeds[0] == 0 else {"first_seed": seeds[0]}
    return {name: {**scale.signal, "variants": variants, "mixing_sink": sink, **first} for name, sink in SWEEPS.items()}


def signal_table(signal: dict[str, Any]) -> list[str]:
    depths = signal["config"]["depths"]
    lines = [
        "| variant | " + " | ".join(f"{d} layers" for d in depths) + " |",
        "|---" * (1 + len(depths)) + "|",
    ]
    for variant, by_depth in signal["results"].items():
        cells = [f"{by_depth[str(d)]['cosine']:.3f} / {by_depth[str(d)]['covariance']:.3f}" for d in depths]
        lines.append(f"| {variant} | " + " | ".join(cells) + " |")
    return lines


def section(study: StudyResults) -> list[str]:
    body: list[str] = []
    table = variant_table(study.final, "table6", "addition", ("random", "mixit"), by="n_layers")
    if table:
        body += ["Trained on addition:", "", table, ""]
    depth = {
        v: by_label(study.final, "n_layers", "token_acc", 100, table="table6", variant=v) for v in ("random", "mixit")
    }
    if plot_lines(depth, "layers", "accuracy (%)", "addition accuracy by depth, trained", study.figures / "depth.png"):
        body += ["![depth](figures/depth.png)", ""]
    for name, sink in SWEEPS.items():
        signal = study.signals.get(name)
        if signal is None:
            continue
        body += [
            f"Token similarity after the last block at initialisation, MixiT's sink head {sink} "
            f"(`mixit signal --mixing-sink {sink}`; cosine / covariance):",
            "",
            *signal_table(signal),
            "",
        ]
        source = study.study_dir / name / "signal.png" if study.study_dir else None
        if source is not None and source.exists():
            shutil.copy(source, study.figures / f"{name}.png")
            body += [f"![{name}](figures/{name}.png)", ""]
    return body


def check_depth(study: StudyResults) -> Check:
    name = (
        "trained on addition, the random transformer's accuracy falls with depth (by at least 5 points) while "
        "MixiT's does not (within 5 points)"
    )
    depths = sorted({labels["n_layers"] for _, labels in rows(study.final, table="table6", task="addition")})
    if len(depths) < 2:
        return Check(name, "n/a", f"missing: runs at two depths at least (found {depths or 'none'})")
    lo, hi = depths[0], depths[-1]
    cell = {
        (v, d): accuracy(f"{v} {d} layers", "addition", table="table6", variant=v, n_layers=d)
        for v in ("random", "mixit")
        for d in (lo, hi)
    }
    shallow_random, deep_random = cell["random", lo].name, cell["random", hi].name
    shallow_mixit, deep_mixit = cell["mixit", lo].name, cell["mixit", hi].name
    falls = Part(
        f"the random transformer falls {DEPTH_POINTS:g} points",
        [cell["random", lo], cell["random", hi]],
        lambda x: x[shallow_random] - x[deep_random] - DEPTH_POINTS,
    )
    holds = Part(
        f"MixiT within {DEPTH_POINTS:g} points",
        [cell["mixit", lo], cell["mixit", hi]],
        lambda x: x[deep_mixit] - (x[shallow_mixit] - DEPTH_POINTS),
    )
    learns = Part(
        f"the random transformer learns addition at {lo} layers (token accuracy >= {LEARNS:g}%), without which "
        "there is nothing to fall from",
        [cell["random", lo]],
        lambda x: x[shallow_random] - LEARNS,
    )
    return judge(name, study.final, [falls, holds], precondition=learns)


Cosines = dict[int, Group]
"""A variant's token cosine after the last block by depth, over the sweep's initialisation seeds."""


def cosines(signal: dict[str, Any], variant: str) -> Cosines:
    n = len(signal["config"].get("seeds", [0]))
    found = signal["results"].get(variant, {})
    return {int(d): Group(x["cosine"], x.get("cosine_std", 0.0), n) for d, x in found.items()}


Judged = tuple[str, str]


def signal_check(
    study: StudyResults,
    name: str,
    first: tuple[str, str],
    second: tuple[str, str],
    what: str,
    verdict: Callable[[Cosines, Cosines, int, int], Judged],
) -> Check:
    """A check of models at initialisation comparing two (sweep, variant) curves of token cosine from the
    shallowest depth to the deepest: ``verdict(first, second, lo, hi)`` gives (verdict, evidence); n/a where a
    sweep is missing or the two curves (`what`) lack two common depths. Nothing converges at initialisation: each
    change is a contrast of means over the sweep's seeds (`mixit.study.verdicts.contrast`)."""
    names = list(dict.fromkeys((first[0], second[0])))
    signals = {sweep: study.signals[sweep] for sweep in names if sweep in study.signals}
    if len(signals) < len(names):
        files = " and ".join(f"{sweep}/signal.json" for sweep in names)
        return Check(name, "n/a", f"missing: the {'sweeps' if len(names) > 1 else 'sweep'} {files}")
    a, b = (cosines(signals[sweep], variant) for sweep, variant in (first, second))
    if len(a) < 2 or set(a) != set(b):
        return Check(name, "n/a", f"missing: {what} at the same two depths at least")
    judged, evidence = verdict(a, b, min(a), max(a))
    seeds = len(signals[first[0]]["config"]["seeds"])
    if seeds < RULE.min_seeds:
        judged = "PROVISIONAL"
    evidence += f"; over the sweep's {seeds} initialisation seed(s), one-sided bounds at {RULE.level:.4f}"
    return Check(name, judged, evidence, seeds, seeds if judged == "PASS" else 0)


def above(bounds: tuple[float, float, float], threshold: float) -> str:
    """PASS if a contrast's lower bound is above `threshold`, FAIL if its upper bound is below, else UNDECIDED."""
    _, lower, upper = bounds
    return "PASS" if lower > threshold else "FAIL" if upper < threshold else "UNDECIDED"


def within(bounds: tuple[float, float, float], threshold: float) -> str:
    """PASS if a contrast's interval lies within ±threshold, FAIL if wholly outside it, else UNDECIDED."""
    _, lower, upper = bounds
    if -threshold < lower and upper < threshold:
        return "PASS"
    return "FAIL" if lower > threshold or upper < -threshold else "UNDECIDED"


def _bounds(x: tuple[float, float, float]) -> str:
    return f"{x[0]:+.3f} [{x[1]:+.3f}, {x[2]:+.3f}]"


def check_signal(study: StudyResults) -> Check:
    def verdict(random: Cosines, mixit: Cosines, lo: int, hi: int) -> Judged:
        rise, flat = (contrast([(1.0, curve[hi]), (-1.0, curve[lo])]) for curve in (random, mixit))
        return worst_of([above(rise, RISE), within(flat, RISE)]), (
            f"token cosine from {lo} to {hi} layers: random {random[lo].mean:.3f} -> {random[hi].mean:.3f} "
            f"({_bounds(rise)}), mixit {mixit[lo].mean:.3f} -> {mixit[hi].mean:.3f} ({_bounds(flat)})"
        )

    name = (
        "at initialisation, built as the paper describes (no sink head), the random transformer's token cosine "
        f"rises with depth (by > {RISE}) while MixiT's stays flat (changes by < {RISE})"
    )
    return signal_check(
        study, name, ("signal-nosink", "random"), ("signal-nosink", "mixit"), "random and MixiT", verdict
    )


def check_sink(study: StudyResults) -> Check:
    def verdict(with_sink: Cosines, without: Cosines, lo: int, hi: int) -> Judged:
        more = contrast([(1.0, with_sink[hi]), (-1.0, with_sink[lo]), (-1.0, without[hi]), (1.0, without[lo])])
        return above(more, RISE), (
            f"MixiT's token cosine at {hi} layers: {with_sink[hi].mean:.3f} with the sink, {without[hi].mean:.3f} "
            f"without; from {lo} to {hi} layers it changes by {with_sink[hi].mean - with_sink[lo].mean:+.3f} with "
            f"the sink, {without[hi].mean - without[lo].mean:+.3f} without (the difference {_bounds(more)})"
        )

    name = (
        f"the reference code's sink head makes MixiT's token cosine rise with depth (by > {RISE} more than "
        "without it): the reference code's construction differs from the paper's"
    )
    return signal_check(
        study, name, ("signal", "mixit"), ("signal-nosink", "mixit"), "MixiT with and without the sink", verdict
    )


TABLE = Table(
    "table6",
    "Tables 6-7: depth (paper: random 100% -> about 23% at 8-16 layers, MixiT 100%; covariance 0.0022 -> 0.054 "
    "for random, flat for MixiT)",
    runs,
    section,
    (check_depth, check_signal, check_sink),
    extras=extras,
)
