"""`mixit litmus`: does a task need input-dependent attention? A short seeded comparison that answers it.

For each seed it trains three arms at one budget, on that seed's data and test set: the standard model, MixiT and a
pattern transplant (the standard run's own average attention pattern, fixed: docs/model.md, "Attention
transplants"). Each arm is read by its selected test number (summary.json ``selected``, in the task's report units)
and the arms are compared seed by seed, each paired difference with its 95% Student's t interval; the answer is
read off the standard - transplant interval alone (docs/regimes.md, "In one command: mixit litmus").

The runs are written under OUT/runs/<arm>-seed<s>; OUT/request.json records the command, so that the same command
again resumes and another is refused. Only --seeds may change, since a seed's runs depend on that seed alone. Each
count of seeds the OUT was read at is kept (``looks``) and an answer reached after more than one says so: an
interval grown by adding seeds until it excludes 0 covers less often than its stated level.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mixit.core.experiment import DEFAULT_TASK, RunConfig, merge, resolve
from mixit.core.run import Run
from mixit.core.training.loop import train
from mixit.errors import UsageError
from mixit.files import check_output_dir, read_json, write_json, write_text
from mixit.study.collect import task_class
from mixit.study.spec import seed_range, seeded
from mixit.study.verdicts import t_quantile
from mixit.version import __version__, git_commit

ARMS = ("standard", "mixit", "transplant")
"""The arms of a litmus, in the order they train in each seed (the transplant reads the standard run)."""
LEVEL = 0.95
"""The two-sided level of every interval."""
REQUEST = "request.json"
"""The file of OUT that records the command that wrote it."""


@dataclass
class LitmusOptions:
    """What `mixit litmus` compares, at which size, and where it writes (one command-line flag per field)."""

    task: str = DEFAULT_TASK
    """The task (`mixit list`), built in or a plugin's."""
    task_params: dict[str, Any] | None = None
    """The task's parameters; null means its defaults."""
    seeds: int = 3
    """Seeds (model and data) per arm, at least 2: the interval is over seeds."""
    first_seed: int = 0
    """The first seed; the seeds are first_seed .. first_seed + seeds - 1."""
    steps: int = 300
    """Training steps of every run."""
    d_model: int = 64
    """Model width of every run."""
    n_layers: int | None = None
    """Number of blocks; null means the default of `mixit train`."""
    n_heads: int | None = None
    """Attention heads; null means the default of `mixit train`."""
    batch_size: int | None = None
    """Sequences per training step; null means the task's default."""
    lr: float | None = None
    """Peak learning rate; null means the task's default."""
    test_size: int = 1000
    """Examples in each seed's test set (and, unless val_size, its validation set)."""
    val_size: int | None = None
    """Examples in each seed's validation set; null means test_size."""
    device: str = "auto"
    """Where to train: auto (cuda if available, else cpu), cpu, cuda or cuda:N."""
    out: Path | None = None
    """The directory to write (or, with the same options, to resume); null means runs/litmus-<task>."""
    progress: bool = True
    """Show each run's progress bar, and a line as it starts."""


def litmus(options: LitmusOptions, say: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Ask whether a task needs input-dependent attention: train the standard model, MixiT and a pattern transplant
    for each seed, and compare them seed by seed, with the gap and its 95% interval.

    From Python: ``litmus(LitmusOptions(task="addition", seeds=3))``. `say` is called with a line of text as each run
    starts (with `LitmusOptions.progress`). Returns what OUT/litmus.json holds, with ``text`` (the table and the
    answer, as printed) and ``out``."""
    seeds = seed_range(options.seeds, options.first_seed)
    if len(seeds) < 2:
        raise UsageError(f"seeds must be an integer >= 2 (the interval is over seeds), got {options.seeds}")
    out = options.out or Path("runs") / f"litmus-{options.task}"
    runs = out / "runs"

    def given(*names: str) -> dict[str, Any]:
        return {k: getattr(options, k) for k in names if getattr(options, k) is not None}

    base = {
        "task": options.task,
        "task_params": options.task_params or {},
        "model": given("d_model", "n_layers", "n_heads"),
        "train": given("steps", "batch_size", "lr"),
        **given("test_size", "val_size"),
    }

    def config(arm: str, seed: int) -> RunConfig:
        transplant = {"transplant_from": str(runs / f"standard-seed{seed}"), "transplant_part": "pattern"}
        arm_request = {"variant": "standard", **transplant} if arm == "transplant" else {"variant": arm}
        return resolve(seeded(merge(base, arm_request), seed))

    checked = [config(arm, seed) for seed in seeds for arm in ARMS[:2]]  # a bad option is refused before any write
    donor = checked[0]
    if not donor.model.causal:
        raise UsageError(f"task {options.task} trains a non-causal model, which a pattern transplant cannot take")
    request = {**base, "task_params": donor.params.to_dict(), "seeds": options.seeds, "first_seed": options.first_seed}
    check_output_dir(out)
    looks = check_same_command(out, request)
    looks += [options.seeds] if looks[-1:] != [options.seeds] else []
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / REQUEST, {**request, "looks": looks})  # this OUT is now this command's

    column, key, scale = task_class(options.task).report_metric
    values: dict[str, list[float]] = {arm: [] for arm in ARMS}
    for i, (seed, arm) in enumerate((seed, arm) for seed in seeds for arm in ARMS):
        run_dir = runs / f"{arm}-seed{seed}"
        if options.progress and say is not None:
            say(f"{arm} seed {seed} ({i + 1} of {len(seeds) * len(ARMS)}): {run_dir}")
        summary = trained(config(arm, seed), run_dir, options)
        values[arm].append(float(summary["selected"]["test"][key]) * scale)

    differences = {
        f"standard-{other}": paired([a - b for a, b in zip(values["standard"], values[other], strict=True)])
        for other in ("transplant", "mixit")
    }
    result = {
        "mixit_version": __version__,
        "git_commit": git_commit(),
        "request": request,
        "task": options.task,
        "metric": {"column": column, "test_metric": key, "scale": scale},
        "level": LEVEL,
        "seeds": list(seeds),
        "arms": {arm: paired(values[arm]) for arm in ARMS},
        "differences": differences,
        "looks": looks,
        "answer": answer(differences["standard-transplant"], differences["standard-mixit"], looks),
        "runs": {arm: [str(runs / f"{arm}-seed{s}") for s in seeds] for arm in ARMS},
    }
    write_json(out / "litmus.json", result)
    write_text(out / "litmus.md", markdown(result))
    return {**result, "text": f"{table(result)}\n\n{options.task}: {result['answer']}", "out": str(out)}


def check_same_command(out: Path, request: Mapping[str, Any]) -> list[int]:
    """Refuse `out` unless it is absent or empty, or holds a litmus of the same `request` but perhaps its number of
    seeds (which it resumes or extends). Returns the counts of seeds `out` was read at before (its ``looks``)."""
    if not (out / REQUEST).exists():
        if out.exists() and any(out.iterdir()):
            raise UsageError(f"{out} is not empty and holds no litmus ({REQUEST}); choose another --out")
        return []
    before = read_json(out / REQUEST, "the command of the litmus in it")
    looks = before.pop("looks", [before["seeds"]])
    changed = [
        f"{key} {before.get(key)!r} -> {request.get(key)!r}"
        for key in sorted(set(before) | set(request))
        if key != "seeds" and before.get(key) != request.get(key)
    ]
    if changed:
        raise UsageError(
            f"{out} holds a litmus of another command ({'; '.join(changed)}); give the same options to resume it, "
            "or another --out (only --seeds may change)"
        )
    return list(looks)


def trained(cfg: RunConfig, run_dir: Path, options: LitmusOptions) -> dict[str, Any]:
    """The summary of the run of `cfg` in `run_dir`: a finished run's own (its files left untouched), else that of
    training it, resumed from its last checkpoint where it had started."""
    run = Run(run_dir)
    if (state := run.state()) == "done":
        run.check_same(cfg)
        summary = run.summary()
        assert summary is not None
        return summary
    return train(cfg, run_dir, device=options.device, resume=state == "started", progress=options.progress)


def paired(values: Sequence[float]) -> dict[str, Any]:
    """`values` (one per seed), their mean and its two-sided `LEVEL` Student's t interval."""
    n, mean = len(values), statistics.fmean(values)
    half = t_quantile(1 - (1 - LEVEL) / 2, n - 1) * statistics.stdev(values) / math.sqrt(n)
    return {"per_seed": list(values), "n": n, "mean": mean, "low": mean - half, "high": mean + half}


def side(difference: Mapping[str, Any]) -> str:
    """Where 0 lies for an interval: "above" (the interval lies above it), "below", or "contains"."""
    return "above" if difference["low"] > 0 else "below" if difference["high"] < 0 else "contains"


TRANSPLANT_SAYS = {
    "above": "needs input-dependent attention: the standard model beats its own average pattern held fixed (the "
    "standard - transplant interval lies above 0)",
    "below": "the transplant does better: the standard model's own average pattern, held fixed, beats attention that "
    "depends on the input (the standard - transplant interval lies below 0)",
    "contains": "undecided at this budget: the standard - transplant interval contains 0; more seeds narrow it, and "
    "more steps let every arm get closer to where it converges",
}
MIXIT_SAYS = {"above": "does worse than", "below": "does better than", "contains": "is not told apart from"}


def answer(transplant: Mapping[str, Any], mixit: Mapping[str, Any], looks: Sequence[int]) -> str:
    """The answer in words, from the intervals alone (standard - transplant, then standard - mixit), and whether
    the seeds were added after looking (`looks`)."""
    text = f"{TRANSPLANT_SAYS[side(transplant)]}; a random fixed pattern (MixiT) {MIXIT_SAYS[side(mixit)]} the "
    text += "standard model"
    if transplant["n"] < 3:
        text += f" (with {transplant['n']} seeds the t quantile is large and every interval wide)"
    if len(looks) > 1:
        text += f" (read before at {', '.join(map(str, looks[:-1]))} seeds: an interval reached by adding seeds "
        text += f"after looking covers the difference less often than {round(100 * LEVEL)}%)"
    return text


def table(result: Mapping[str, Any]) -> str:
    """The table `mixit litmus` prints: each arm's and each difference's mean, interval and per-seed values."""
    level, seeds = round(100 * result["level"]), " ".join(map(str, result["seeds"]))
    rows = [("", f"{result['metric']['column']}: mean [{level}% t-interval]", f"seeds {seeds}")]
    for name, v in [*(("arm " + k, v) for k, v in result["arms"].items()), *result["differences"].items()]:
        per_seed = " ".join(f"{x:.2f}" for x in v["per_seed"])
        rows.append((name, f"{v['mean']:.2f} [{v['low']:.2f}, {v['high']:.2f}]", per_seed))
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows]
    return "\n".join(lines)


def markdown(result: Mapping[str, Any]) -> str:
    """litmus.md: the question, what was run, the table and the answer."""
    request = {k: v for k, v in result["request"].items() if v not in ({}, None)}
    title = f"# Litmus: does {result['task']} need input-dependent attention?"
    provenance = f"mixit {result['mixit_version']}, commit {result['git_commit']}; request `{request}`."
    return f"{title}\n\n{provenance}\n\n```\n{table(result)}\n```\n\n**Answer:** {result['answer']}.\n"
