"""Studies: the paper's comparison (or a grid of your own) in one command.

    mixit reproduce --preset quick            # the paper's tables at laptop scale, then report.md
    mixit reproduce --list                    # the presets, their run counts and estimated times here
    mixit reproduce --study my_grid.toml      # a study of your own (mixit.study.spec)
    mixit report STUDY_DIR                    # the report again, from whatever has finished
    mixit export-logs STUDY_DIR --to tensorboard   # its runs' logs to a tracking sink (`export_logs`)

Studies are data (`spec`, `presets`, `tables`, `paper`), searched (`search`) and run (`executors`, `directory`);
their results are read (`collect`, `cells`), judged (`verdicts`) and reported (`render`, `figures`, `report`).
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import torch

from mixit.bench import matmul_contender, time_interleaved
from mixit.core.config import check, typed
from mixit.core.experiment import RunConfig
from mixit.core.resources import model_numel
from mixit.core.run import Run
from mixit.errors import UsageError
from mixit.study.atlas import atlas_map, atlas_study
from mixit.study.collect import collect
from mixit.study.directory import RECORD, load_study_record
from mixit.study.executors import Executor, Pool, cell_values, execute, run_dir
from mixit.study.paper import PRESETS, paper_study
from mixit.study.report import format_checks, write_report
from mixit.study.search import apply, plan_study, upper_bound
from mixit.study.spec import MAX_RUNS, PlannedRun, RunSpec, Study, load_study_file, merge_planned, plan
from mixit.tracking import SINKS, Naming, Sink, check_export, check_sinks, export_run, run_grouping, study_grouping

__all__ = [
    "AtlasOptions",
    "ReproduceOptions",
    "Study",
    "atlas",
    "atlas_study",
    "estimate_seconds",
    "export_logs",
    "list_studies",
    "load_study_file",
    "paper_study",
    "reproduce",
    "write_report",
]

# What a training step reaches of a matmul's speed on the small models of the quick preset. With the
# fastest of seven matmul samples (334 GFLOP/s on the idle 2-core machine) and every run at its step cap,
# 0.4 gave 19 minutes for a study measured at 21 (1266 s at a4c93c2, docs/reproduction.md); 0.3 gives
# about 25, above it, as "at most" promises. Estimates plan a session; they do not time it.
EFFICIENCY = 0.3


def matmul_flops_per_second(samples: int = 7, steps: int = 25) -> float:
    """This machine's fp32 matmul speed on the CPU, as `mixit bench` times its peak: the fastest of `samples` blocks
    of `steps` products, since a core busy elsewhere only makes a sample slower."""
    cpu = torch.device("cpu")
    peak = matmul_contender(cpu, torch.float32, 512)
    return peak.flops / min(time_interleaved([peak], cpu, steps, samples)[peak.name].times)


def estimate_seconds(cfg: RunConfig, flops_per_second: float) -> float:
    """Rough wall time of training `cfg` here: 6 x parameters x tokens per step, plus the evaluations."""
    params, _ = model_numel(cfg.model)
    tc = cfg.train
    train_flops = 6 * params * tc.batch_size * cfg.model.n_ctx * tc.steps
    evals = tc.steps // (tc.cadence[1] or tc.steps) + 1
    eval_flops = 2 * params * min(cfg.test_size, 20_000) * cfg.model.n_ctx * evals
    return (train_flops + eval_flops) / (flops_per_second * EFFICIENCY)


def planned_runs(study: Study, search: bool = True) -> list[PlannedRun]:
    """Every run `study` may train, resolved: its cells (a searched cell with its first candidates) and the most
    screening runs its searches can ask for (`upper_bound`). A run that waits for its donor (`RunSpec.donor`) is
    resolved without it, as a model of its donor's shape and cost, and counted apart."""

    def resolved(specs: list[RunSpec]) -> list[PlannedRun]:
        planned = plan_study(replace(study, specs=specs), search)
        cells = plan(apply(spec, g.combinations[0]) for g in planned.groups for spec in g.specs)
        screens = plan((s for g in planned.groups for s in upper_bound(g)), role="screen")
        return merge_planned(planned.plain, cells, screens)

    waiting = [spec for spec in study.specs if spec.donor]
    return [*resolved([s for s in study.specs if not s.donor]), *(resolved(waiting) if waiting else [])]


def _size(study: Study, speed: float, search: bool = True) -> tuple[int, int, float]:
    """`study`'s final runs, the most screening runs its searches may ask for, and the most seconds they take here."""
    planned = planned_runs(study, search)
    screens = sum(p.role == "screen" for p in planned)
    return len(planned) - screens, screens, sum(estimate_seconds(p.cfg, speed) for p in planned)


def _time_here(seconds: float) -> str:
    if seconds < 60:
        return "under a minute"
    return "at most about " + (f"{seconds / 3600:.1f} h" if seconds > 5400 else f"{seconds / 60:.0f} min")


def size_line(study: Study, search: bool = True) -> str:
    """`study`'s size, said before its work: its runs and their most time here, with what may come on top."""
    finals, screens, seconds = _size(study, matmul_flops_per_second(), search)
    later = [
        *(["seeds added where a finding is undecided"] if study.more_seeds else []),
        *([f"runs still moving trained again at up to {study.extend[-1]}x their steps"] if study.extend else []),
    ]
    searched = f" and at most {screens} screening runs" if screens else ""
    return f"{study.name}: {finals} final runs{searched}, {_time_here(seconds)} on this machine" + (
        f"; then {' and '.join(later)}" if later else ""
    )


def list_studies(seeds: int | None = None) -> str:
    """The presets of the paper study, with their run counts and estimated time here (`seeds` per cell, or each
    preset's first look): an upper bound, every run and every tie of a search to its step cap."""
    speed = matmul_flops_per_second()
    per_cell = f"{seeds} seed(s)" if seeds else "each preset's own seeds"
    lines = [
        f"paper study presets (`mixit reproduce --preset NAME`), {per_cell}; this machine: "
        f"{speed / 1e9:.0f} GFLOP/s matmul, estimates assume {EFFICIENCY:.0%} of it, every run to its step cap and "
        "every tie of a search to the cap; seeds added to undecided findings and runs trained further where still "
        "moving come on top:"
    ]
    for name, scale in PRESETS.items():
        study = paper_study(name, seeds)
        if not scale.estimate_here:  # counted without resolving (its datasets may be on the hub)
            cells = len({json.dumps(s.request, sort_keys=True, default=str) for s in study.specs})
            lines.append(f"  {name:<7} about {cells} cells, plus their searches: {scale.description}")
            continue
        finals, screens, seconds = _size(study, speed)
        runs = finals + screens
        lines.append(f"  {name:<7} {runs:>3} runs ({screens} screening), {_time_here(seconds)}: {scale.description}")
    return "\n".join(lines)


@dataclass
class StudyOptions:
    """The options `reproduce` and `atlas` share: the seeds, where the study is written, and how its runs execute."""

    seeds: int | None = None
    """Seeds per cell (seed s sets the model's seed and the data seed); null means the study's own: a preset's first
    look (quick: 3, with seeds added to undecided findings up to 7: docs/protocol.md), or a study file's."""
    first_seed: int = 0
    """The first seed: the cells' seeds are first_seed..first_seed+seeds-1 (a second study, to see whether the
    verdicts hold on seeds the first never used)."""
    out: Path | None = None
    """The study directory; null means runs/study-<preset or study file's name> (mixit atlas: runs/atlas-<preset>),
    ending in -nosearch without search."""
    executor: Executor = "local"
    """Where the runs execute: local (a process pool), sequential (one after another in this process), slurm (an
    array job through submitit) or submitit-local (submitit's local executor)."""
    workers: int = 0
    """Processes of the local pool (0: one per core)."""
    threads: int = 0
    """Torch threads per worker (0: one)."""
    slurm: dict[str, Any] = field(default_factory=dict)
    """A parameter of the Slurm jobs as KEY=VALUE (repeatable): any that submitit's Slurm executor accepts, such as
    partition, account, mem, gpus_per_node, timeout_min or array_parallelism (runs at once); a list such as setup
    takes one --slurm per item, additional_parameters.NAME=VALUE sets any other sbatch option. submitit-local
    applies what its executor knows and ignores the rest. Details and defaults: docs/scaling.md, "Slurm"."""
    retry_failed: bool = False
    """Run again the runs that failed before (otherwise they are skipped)."""
    list: bool = False
    """Print what the study would run, with an estimate of its time here, and run nothing."""
    max_runs: int = MAX_RUNS
    """The most final runs (cells x seeds) the study may ask for: one that asks for more is refused before any
    work, naming how many; give a larger cap to run it."""
    progress: bool = True
    """Show a progress bar."""
    search: bool = True
    """Choose each cell's settings on validation among the candidates the study declares (screening runs, then the
    winner in full); false (--no-search) trains every cell with its fixed settings."""

    def pool(self) -> Pool:
        """Where the runs execute: the executor, the local pool, and the Slurm jobs' parameters."""
        return Pool(self.executor, self.workers, self.threads, dict(self.slurm))


@dataclass
class ReproduceOptions(StudyOptions):
    """The options of `reproduce` and of ``mixit reproduce``: which study to run, where to write it, and how its
    runs execute."""

    preset: Literal["smoke", "quick", "gpu", "paper"] | None = None
    """The study to run: smoke (every code path in minutes), quick (the comparison under docs/protocol.md, hours
    on 2 CPU cores), gpu (one GPU in about an hour) or paper (the paper's scales and the reference recipes, for
    clusters); null means quick, unless --study names a file (no preset may be given beside one)."""
    study: Path | None = None
    """A study file of your own (TOML, or YAML if it ends in .yaml or .yml: docs/studies.md) instead of the
    paper's comparison."""
    test_seed: int | None = None
    """The seed every synthetic task's test set is drawn with, instead of the preset's: a replication on test sets
    no other study read. Null: the preset's (quick: its confirmatory test seed)."""
    logger: tuple[Sink, ...] = ()
    """Tracking sinks that every run's metrics and summary go to as well, any of tensorboard, wandb, mlflow and
    trackio, grouped under the study's name and tagged with task, variant, seed, role and their cell's grid values
    (docs/tracking.md)."""
    tracking_project: str | None = None
    """The W&B project, MLflow experiment and trackio project of every run (TensorBoard has none); null means
    WANDB_PROJECT for W&B if set, the study's name for MLflow, else mixit."""
    tracking_name: str | None = None
    """A prefix of every run's name in the tracking sinks, which is task-variant-[cell-]seedN-ID after it (cell: the
    grid's values that make the run's cell, such as lr=0.01; ID the run's id; a screening run's is
    task-variant-rung=R-[candidate-]screen-ID); null means no prefix."""


def reproduce(options: ReproduceOptions) -> dict[str, Any]:
    """Run the paper's comparison (or a study file), resuming what an earlier call left, then write the report.

    From Python: ``reproduce(ReproduceOptions(preset="smoke", out=Path("runs/smoke")))``."""
    if options.study is not None:  # an option of the paper study, given beside a file, would be ignored
        for flag, given, what in (
            ("--preset", options.preset is not None, "chooses the paper study's scale"),
            ("--list", options.list, "lists the paper study's presets"),
            ("--test-seed", options.test_seed is not None, "sets a preset's test sets (a file's base sets test_seed)"),
        ):
            check(not given, f"{flag} {what}, and --study runs a study file instead; give one of them, not both")
    if options.list:
        return {"listing": list_studies(options.seeds)}
    seeds, max_runs = _counts(options)
    test_seed = typed("test_seed", int | None, options.test_seed)
    check(test_seed is None or test_seed >= 0, f"test_seed must be a non-negative integer or null, got {test_seed}")
    naming = Naming(options.tracking_project, options.tracking_name)
    if options.study is not None:  # the file's own seeds, or --seeds where it sets none
        chosen = load_study_file(options.study, seeds, options.first_seed, max_runs)
    else:
        chosen = paper_study(options.preset or "quick", seeds, options.first_seed, test_seed, max_runs)
    out = options.out or Path("runs") / f"study-{chosen.name}{'' if options.search else '-nosearch'}"
    done = _run(chosen, out, options, options.logger, naming)
    return {**done, "text": format_checks(done["report"])}


def _counts(options: StudyOptions) -> tuple[int | None, int]:
    """--seeds and --max-runs, typed, each refused in one line unless positive (seeds may be null)."""
    seeds, max_runs = typed("seeds", int | None, options.seeds), typed("max_runs", int, options.max_runs)
    check(seeds is None or seeds >= 1, f"seeds must be a positive integer or null, got {seeds}")
    check(max_runs >= 1, f"max_runs must be a positive integer, got {max_runs!r}")
    return seeds, max_runs


def _run(
    study: Study, out: Path, options: StudyOptions, logger: Sequence[Sink] = (), naming: Naming | None = None
) -> dict[str, Any]:
    """Run what `study` has not finished into `out`, then write its report: the tally, the report and the seconds."""

    def announce() -> None:  # with the progress bar: the bar counts runs as they are planned, stage by stage
        print(size_line(study, options.search), file=sys.stderr, flush=True)

    start = time.perf_counter()
    tally = execute(
        study,
        out,
        options.pool(),
        options.retry_failed,
        options.progress,
        options.search,
        logger,
        naming,
        announce if options.progress else None,
    )
    report = write_report(out)
    return {"tally": tally, "report": report, "seconds": time.perf_counter() - start}


@dataclass
class AtlasOptions(StudyOptions):
    """The options of `atlas` and of ``mixit atlas``: which tasks to map, at which preset's sizes, where to write the
    study, and how its runs execute."""

    task: tuple[str, ...] = ()
    """A task to map (repeatable: --task addition --task dyck), one of addition, modular_addition, dyck, retrieval,
    induction and memorization."""
    preset: Literal["smoke", "quick"] = "quick"
    """Whose sizes every task takes: quick (the paper study's, under docs/protocol.md) or smoke (seconds a run)."""


def atlas(options: AtlasOptions) -> dict[str, Any]:
    """Map which parts each task needs: the standard model, each part frozen alone and trained alone, MixiT and a
    pattern transplant, searched and seeded as the paper study is, then the report with the map (docs/atlas.md).

    Resumable: the same command again skips what has finished. From Python:
    ``atlas(AtlasOptions(task=["addition"], preset="smoke", seeds=3, out=Path("runs/atlas")))``."""
    seeds, max_runs = _counts(options)
    tasks = typed("task", tuple[str, ...], options.task)
    study = atlas_study(tasks, options.preset, seeds, options.first_seed, max_runs)
    options.pool()  # its checks, before --list too
    if options.list:
        return {"listing": atlas_listing(study, options.search)}
    out = options.out or Path("runs") / f"{study.name}{'' if options.search else '-nosearch'}"
    return {**_run(study, out, options), "text": atlas_text(out)}


def atlas_listing(study: Study, search: bool = True) -> str:
    """The atlas's plan: per task its cells, final runs and the most screening runs, and the most time here."""
    speed = matmul_flops_per_second()
    lines = [
        f"{study.name}: {study.seeds} seed(s) per cell from seed {study.first_seed}"
        + ("; seeds added to undecided words up to the protocol's last look" if study.more_seeds else "")
        + (f"; runs still moving trained again at up to {study.extend[-1]}x" if study.extend else "")
        + f". This machine: {speed / 1e9:.0f} GFLOP/s matmul, estimates assume {EFFICIENCY:.0%} of it and every run "
        "to its step cap:"
    ]
    total = 0.0
    for task in dict.fromkeys(s.labels["task"] for s in study.specs):
        mine = replace(study, specs=[s for s in study.specs if s.labels["task"] == task])
        finals, screens, seconds = _size(mine, speed, search)
        total += seconds
        cells = len(
            {json.dumps({k: v for k, v in s.labels.items() if k != "seed"}, sort_keys=True) for s in mine.specs}
        )
        runs = f"{finals} final runs and at most {screens} screening runs"
        lines.append(f"  {task:<17} {cells} cells, {runs}, {_time_here(seconds)}")
    lines.append(f"  in all: {_time_here(total)} on this machine, before added seeds and extensions")
    return "\n".join(lines)


def atlas_text(study_dir: Path) -> str:
    """The map in words, one line per task: each part's word frozen and alone, then MixiT's and the transplant's."""
    found = atlas_map(collect(study_dir))
    lines = []
    for task in found["tasks"]:
        cells = [c for c in found["cells"] if c["task"] == task]
        said = [f"{c['part'] or c['regime']} {c['word']}" for c in cells if c["regime"] == "frozen"]
        alone = [f"{c['part']} {c['word']}" for c in cells if c["regime"] == "alone"]
        whole = [f"{c['regime']} {c['word']}" for c in cells if c["regime"] in ("mixit", "transplant")]
        lines.append(f"{task}: frozen alone: {', '.join(said)}; trained alone: {', '.join(alone)}; {', '.join(whole)}")
    return "\n".join([*lines, f"written to {study_dir / 'report.md'}"])


def report(study_dir: Path) -> dict[str, Any]:
    """Write report.md, results.csv and figures/ from what a study has finished so far.

    Args:
        study_dir: The study directory.
    """
    result = write_report(study_dir)
    return {"report": result, "text": format_checks(result)}


def export_logs(
    directory: Path,
    to: Sequence[Sink] = ("tensorboard",),
    tracking_project: str | None = None,
    tracking_name: str | None = None,
) -> dict[str, Any]:
    """Send the logs of a run trained without a tracking sink, or of every run of a study, to tracking sinks.

    Each run's metrics.jsonl and summary go to the sinks as `mixit train --logger` would have sent them (a study's
    runs grouped as `mixit reproduce --logger` groups them); a sink that holds some of a run already is sent what
    it lacks, and TensorBoard's files are written again (docs/tracking.md).

    Args:
        directory: A run directory, or a study directory (every run it has started).
        to: The tracking sinks, any of tensorboard, wandb, mlflow and trackio.
        tracking_project: The W&B project, MLflow experiment and trackio project of the runs (TensorBoard has
            none); null means WANDB_PROJECT for W&B if set, the study's name or MLFLOW_EXPERIMENT_NAME for
            MLflow, else mixit.
        tracking_name: The run's name in the sinks, or for a study the prefix of each run's name; null means the
            run directory's name (a study's run: task-variant-[cell-]seedN-ID, as `reproduce` names it).
    """
    naming = Naming(tracking_project, tracking_name)
    sinks = check_sinks(to, "--to")
    if not sinks:
        raise UsageError(f"--to names no sink; give one or more of {', '.join(SINKS)}")
    directory = Path(directory)
    if Run(directory).state() != "absent":
        run = Run.open(directory)
        runs = [(run, run_grouping(directory, run.config, naming))]
    elif (directory / RECORD).exists():
        record = load_study_record(directory)
        runs = []
        for entry in record["runs"]:
            if Run(run_dir(directory, entry["id"])).state() != "absent":
                run = Run.open(run_dir(directory, entry["id"]))
                role = entry.get("role", "final")
                cell = cell_values(entry["labels"])
                runs.append((run, study_grouping(record["name"], entry["id"], run.config, role, naming, cell)))
    else:
        raise UsageError(f"{directory} holds no mixit run and no study")
    logs = [check_export(run, sinks) for run, _ in runs]  # every run checked before any is sent
    failed = [
        f"{run.path} ({name})"
        for (run, grouping), (events, summary) in zip(runs, logs, strict=True)
        for name in export_run(run, sinks, grouping, events, summary)
    ]
    if failed:
        raise UsageError(f"export-logs could not send every run: {', '.join(failed)}; see the warnings above")
    return {"runs": [run.path for run, _ in runs], "sinks": sinks}
