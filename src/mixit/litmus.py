"""`mixit litmus`: does a task need input-dependent attention? A short seeded comparison that answers it.

For each seed it trains three arms at one budget: the standard model, MixiT (a fixed random mixing matrix per
head) and a pattern transplant (the standard run's own average attention pattern, fixed: docs/model.md,
"Attention transplants"). Each arm is read by its selected test number (summary.json ``selected``: the test
metric at the best validation evaluation, in the task's report units, `Task.report_metric`). Within a seed the
arms share their data and test set, so the arms are compared seed by seed: the paired differences standard -
transplant (does the task need attention that depends on the input, beyond the right fixed pattern?) and
standard - MixiT (does any fixed random pattern do?), each with its mean and 95% Student's t interval over the
seeds. The answer is read off the standard - transplant interval alone: wholly above 0, the task needs
input-dependent attention; wholly below 0, the transplant does better; otherwise undecided at this budget.

The runs are written under OUT/runs/<arm>-seed<s>; the same command again keeps the finished runs and resumes the
others, while another command into the same OUT is refused (OUT/request.json records the command). Only --seeds
may change: a seed's runs depend on that seed alone, so more seeds train only the new ones. Each count of seeds the
OUT was read at is kept (``looks``), and an answer reached after more than one says so: an interval grown by adding
seeds until it excludes 0 covers less often than its stated level.
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
    base = base_request(options)
    configs = {(arm, s): resolve(seeded(merge(base, {"variant": arm}), s)) for arm in ARMS[:2] for s in seeds}
    donor = configs["standard", seeds[0]]
    if not donor.model.causal:
        raise UsageError(f"task {options.task} trains a non-causal model, which a pattern transplant cannot take")
    request = {**base, "task_params": donor.params.to_dict(), "seeds": options.seeds, "first_seed": options.first_seed}
    check_output_dir(out)
    looks = check_same_command(out, request)
    looks += [options.seeds] if looks[-1:] != [options.seeds] else []
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / REQUEST, {**request, "looks": looks})  # this OUT is now this command's
    runs = out / "runs"
    values: dict[str, list[float]] = {arm: [] for arm in ARMS}
    for i, s in enumerate(seeds):
        for j, arm in enumerate(ARMS):
            run_dir = runs / f"{arm}-seed{s}"
            if options.progress and say is not None:
                say(f"{arm} seed {s} ({i * len(ARMS) + j + 1} of {len(seeds) * len(ARMS)}): {run_dir}")
            if arm == "transplant":
                transplant = {"transplant_from": str(runs / f"standard-seed{s}"), "transplant_part": "pattern"}
                cfg = resolve(seeded(merge(base, {"variant": "standard"}, transplant), s))
            else:
                cfg = configs[arm, s]
            values[arm].append(reported_number(trained(cfg, run_dir, options)))
    result = compare(options.task, list(seeds), values, looks)
    result = {"mixit_version": __version__, "git_commit": git_commit(), "request": request, **result}
    result["runs"] = {arm: [str(runs / f"{arm}-seed{s}") for s in seeds] for arm in ARMS}
    write_json(out / "litmus.json", result)
    text = format_litmus(result)
    title = f"# Litmus: does {options.task} need input-dependent attention?"
    write_text(out / "litmus.md", f"{title}\n\n{markdown(result)}")
    return {**result, "text": text, "out": str(out)}


def base_request(options: LitmusOptions) -> dict[str, Any]:
    """The request every run of the litmus shares (the arm and the seed set the rest): the task, its parameters
    and the options given."""
    model = {k: getattr(options, k) for k in ("d_model", "n_layers", "n_heads") if getattr(options, k) is not None}
    training = {k: getattr(options, k) for k in ("steps", "batch_size", "lr") if getattr(options, k) is not None}
    data = {k: getattr(options, k) for k in ("test_size", "val_size") if getattr(options, k) is not None}
    return {"task": options.task, "task_params": options.task_params or {}, "model": model, "train": training, **data}


def check_same_command(out: Path, request: Mapping[str, Any]) -> list[int]:
    """Refuse `out` unless it is absent or empty, or holds a litmus of the same `request` but perhaps its number of
    seeds (which it resumes or extends). Returns the counts of seeds `out` was read at before (its ``looks``)."""
    recorded = out / REQUEST
    if not recorded.exists():
        if out.exists() and any(out.iterdir()):
            raise UsageError(f"{out} is not empty and holds no litmus ({REQUEST}); choose another --out")
        return []
    before = read_json(recorded, "the command of the litmus in it")
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
    state = run.state()
    if state == "done":
        run.check_same(cfg)
        summary = run.summary()
        assert summary is not None
        return summary
    return train(cfg, run_dir, device=options.device, resume=state == "started", progress=options.progress)


def reported_number(summary: Mapping[str, Any]) -> float:
    """A run's number: its test report metric at the best validation evaluation (summary.json ``selected``), in the
    task's report units (`Task.report_metric`)."""
    _, key, scale = task_class(summary["task"]).report_metric
    return float(summary["selected"]["test"][key]) * scale


def interval(values: Sequence[float]) -> dict[str, Any]:
    """The mean of `values` (independent seeds, at least two) and its two-sided `LEVEL` Student's t interval."""
    n, mean = len(values), statistics.fmean(values)
    half = t_quantile(1 - (1 - LEVEL) / 2, n - 1) * statistics.stdev(values) / math.sqrt(n)
    return {"n": n, "mean": mean, "low": mean - half, "high": mean + half}


def compare(task: str, seeds: list[int], values: Mapping[str, list[float]], looks: list[int]) -> dict[str, Any]:
    """Each arm's numbers over `seeds` and their interval, the paired differences standard - transplant and standard
    - mixit with theirs, and the answer read off the first (`answer`); `looks`: the counts of seeds read so far,
    this one last."""
    column, key, scale = task_class(task).report_metric
    arms = {arm: {"per_seed": list(values[arm]), **interval(values[arm])} for arm in ARMS}
    differences = {}
    for other in ("transplant", "mixit"):
        paired = [a - b for a, b in zip(values["standard"], values[other], strict=True)]
        differences[f"standard-{other}"] = {"per_seed": paired, **interval(paired)}
    return {
        "task": task,
        "metric": {"column": column, "test_metric": key, "scale": scale},
        "level": LEVEL,
        "seeds": seeds,
        "arms": arms,
        "differences": differences,
        "looks": looks,
        "answer": answer(differences["standard-transplant"], differences["standard-mixit"], looks),
    }


def answer(transplant: Mapping[str, Any], mixit: Mapping[str, Any], looks: Sequence[int]) -> str:
    """The answer in words, from the intervals alone: standard - transplant wholly above 0 (needs input-dependent
    attention), wholly below 0 (the transplant does better), else undecided; then what standard - mixit says, and
    whether the seeds were added after looking (`looks`)."""
    low, high = transplant["low"], transplant["high"]
    if low > 0:
        text = "needs input-dependent attention: the standard model beats its own average pattern held fixed "
        text += "(the standard - transplant interval lies above 0)"
    elif high < 0:
        text = "the transplant does better: the standard model's own average pattern, held fixed, beats attention "
        text += "that depends on the input (the standard - transplant interval lies below 0)"
    else:
        text = "undecided at this budget: the standard - transplant interval contains 0; more seeds narrow it, and "
        text += "more steps let every arm get closer to where it converges"
    if mixit["low"] > 0:
        text += "; a random fixed pattern (MixiT) does worse than the standard model"
    elif mixit["high"] < 0:
        text += "; a random fixed pattern (MixiT) does better than the standard model"
    else:
        text += "; a random fixed pattern (MixiT) is not told apart from the standard model"
    if transplant["n"] < 3:
        text += f" (with {transplant['n']} seeds the t quantile is large and every interval wide)"
    if len(looks) > 1:
        earlier = ", ".join(map(str, looks[:-1]))
        text += f" (read before at {earlier} seeds: an interval reached by adding seeds after looking covers the "
        text += f"difference less often than {round(100 * LEVEL)}%)"
    return text


def rows(result: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    """One (name, mean [interval], per-seed values) row per arm and per difference."""
    found = [*(("arm " + k, v) for k, v in result["arms"].items()), *result["differences"].items()]
    return [
        (
            name,
            f"{v['mean']:.2f} [{v['low']:.2f}, {v['high']:.2f}]",
            " ".join(f"{x:.2f}" for x in v["per_seed"]),
        )
        for name, v in found
    ]


def format_litmus(result: Mapping[str, Any]) -> str:
    """The table and the answer, as `mixit litmus` prints them."""
    metric, level = result["metric"]["column"], round(100 * result["level"])
    head = ("", f"{metric}: mean [{level}% t-interval]", "seeds " + " ".join(map(str, result["seeds"])))
    table = [head, *rows(result)]
    widths = [max(len(row[i]) for row in table) for i in range(3)]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in table]
    return "\n".join([*lines, "", f"{result['task']}: {result['answer']}"])


def markdown(result: Mapping[str, Any]) -> str:
    """litmus.md's body: what was run, the table and the answer."""
    metric, level = result["metric"]["column"], round(100 * result["level"])
    request = {k: v for k, v in result["request"].items() if v not in ({}, None)}
    lines = [
        f"mixit {result['mixit_version']}, commit {result['git_commit']}; request `{request}`.",
        "",
        f"| | {metric}: mean [{level}% t-interval] | per seed ({', '.join(map(str, result['seeds']))}) |",
        "|---|---|---|",
        *(f"| {a} | {b} | {c} |" for a, b, c in rows(result)),
        "",
        f"**Answer:** {result['answer']}.",
    ]
    return "\n".join(lines) + "\n"
