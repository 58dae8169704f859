"""Studies: the paper's comparison (or a grid of your own) in one command.

    mixit reproduce --preset quick            # the paper's tables at laptop scale, then report.md
    mixit reproduce --list                    # the presets, their run counts and estimated times here
    mixit reproduce --study my_grid.toml      # a study of your own (mixit.study.spec)
    mixit report STUDY_DIR                    # the report again, from whatever has finished

`spec` (studies as data), `presets` (the scales), `search` (the search per
architecture per task), `directory` (what a study directory may hold, and
study.json's schema), `executors` (the study directory and the executors),
`results` (what the report reads, and the verdicts), `tables` (one module per
paper table), `paper` (the paper study from the tables), `report` (report.md,
results.csv, checks.json, figures).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch

from mixit.config import check
from mixit.experiment import RunConfig
from mixit.resources import model_numel
from mixit.study.executors import Executor, Pool, execute
from mixit.study.paper import PRESETS, paper_study
from mixit.study.report import format_checks, write_report
from mixit.study.search import apply, plan_study
from mixit.study.spec import PlannedRun, Study, load_study_file, merge_planned, plan

__all__ = [
    "ReproduceOptions",
    "Study",
    "estimate_seconds",
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


def matmul_flops_per_second(samples: int = 7, seconds: float = 0.1) -> float:
    """This machine's fp32 matmul speed on the CPU: the fastest of `samples` short measurements.

    The fastest, because a core busy with something else only ever makes a sample slower: one short
    sample on a momentarily busy machine once made the quick preset's estimate 6.1 h."""
    a = torch.randn(512, 512)
    best = 0.0
    for _ in range(samples):
        start, n = time.perf_counter(), 0
        while time.perf_counter() - start < seconds:
            a @ a
            n += 1
        best = max(best, 2 * 512**3 * n / (time.perf_counter() - start))
    return best


def estimate_seconds(cfg: RunConfig, flops_per_second: float) -> float:
    """Rough wall time of training `cfg` here: 6 x parameters x tokens per step, plus the evaluations."""
    params, _ = model_numel(cfg.model)
    tc = cfg.train
    train_flops = 6 * params * tc.batch_size * cfg.model.n_ctx * tc.steps
    evals = tc.steps // (tc.cadence[1] or tc.steps) + 1
    eval_flops = 2 * params * min(cfg.test_size, 20_000) * cfg.model.n_ctx * evals
    return (train_flops + eval_flops) / (flops_per_second * EFFICIENCY)


def _study(preset: str, study: Path | None, seeds: int) -> Study:
    if study is not None:
        return load_study_file(study, seeds if seeds != 1 else None)
    return paper_study(preset, seeds)


def planned_runs(study: Study, search: bool = True) -> list[PlannedRun]:
    """Every run `study` will train, resolved: its cells (a searched cell with its first candidates, which
    the search may change for others of the same cost) and its screening runs."""
    planned = plan_study(study, search)
    cells = plan(apply(spec, g.combinations[0]) for g in planned.groups for spec in g.specs)
    return merge_planned(planned.plain, cells, list(planned.screens.values()))


def list_studies(seeds: int = 1) -> str:
    """The presets of the paper study, with their run counts and estimated time on this machine."""
    speed = matmul_flops_per_second()
    lines = [
        f"paper study presets (`mixit reproduce --preset NAME`), {seeds} seed(s); this machine: "
        f"{speed / 1e9:.0f} GFLOP/s matmul, estimates assume {EFFICIENCY:.0%} of it and every run to its step cap:"
    ]
    for name, scale in PRESETS.items():
        study = paper_study(name, seeds)
        if not scale.estimate_here:  # counted without resolving (its datasets may be on the hub)
            cells = len({json.dumps(s.request, sort_keys=True, default=str) for s in study.specs})
            lines.append(f"  {name:<7} about {cells} cells, plus their searches: {scale.description}")
            continue
        planned = planned_runs(study)
        total = sum(estimate_seconds(p.cfg, speed) for p in planned)
        when = f"about {total / 3600:.1f} h of compute" if total > 5400 else f"at most about {total / 60:.0f} min"
        screens = sum(p.role == "screen" for p in planned)
        lines.append(f"  {name:<7} {len(planned):>3} runs ({screens} screening), {when}: {scale.description}")
    return "\n".join(lines)


@dataclass
class ReproduceOptions:
    """The options of `reproduce` and of ``mixit reproduce``: which study to run, where to write it, and
    how its runs execute."""

    preset: Literal["smoke", "quick", "gpu", "paper"] = "quick"
    """smoke (every code path in minutes), quick (the comparison in 30 minutes on 2 CPU cores), gpu (one GPU in
    about an hour) or paper (the paper's scales and the reference recipes, for clusters)."""
    study: Path | None = None
    """A TOML study file of your own instead of the paper's comparison."""
    seeds: int = 1
    """Seeds per cell (seed s sets the model's seed and the data seed)."""
    out: Path | None = None
    """The study directory (default runs/study-<preset or study name>, with -nosearch without search)."""
    executor: Executor = "local"
    """local (a process pool), sequential, slurm (an array job through submitit) or submitit-local."""
    workers: int = 0
    """Processes of the local pool (0: one per core)."""
    threads: int = 0
    """Torch threads per worker (0: one)."""
    retry_failed: bool = False
    """Run again the runs that failed before (otherwise they are skipped)."""
    list: bool = False
    """List the presets with their run counts and estimated time here, and run nothing."""
    slurm_partition: str = ""
    """Slurm partition (slurm executor)."""
    slurm_time_min: int = 240
    """Time limit of each Slurm job, minutes."""
    slurm_gpus_per_node: int = 0
    """GPUs per Slurm job."""
    slurm_cpus_per_task: int = 2
    """CPU cores per Slurm job."""
    progress: bool = True
    """Show a progress bar."""
    search: bool = True
    """Choose each cell's settings on validation among the candidates the preset declares (screening runs, then
    the winner in full); false (--no-search) trains every cell with the preset's fixed settings."""

    def pool(self) -> Pool:
        """Where the runs execute: the executor, the local pool, and the Slurm parameters that are set."""
        slurm: dict[str, Any] = {}
        if self.executor == "slurm":
            slurm = {
                "partition": self.slurm_partition,
                "timeout_min": self.slurm_time_min,
                "gpus_per_node": self.slurm_gpus_per_node,
                "cpus_per_task": self.slurm_cpus_per_task,
            }
        return Pool(self.executor, self.workers, self.threads, {k: v for k, v in slurm.items() if v != ""})


def reproduce(options: ReproduceOptions) -> dict[str, Any]:
    """Run the paper's comparison (or a study file), resuming what an earlier call left, then write the report.

    From Python: ``reproduce(ReproduceOptions(preset="smoke", out=Path("runs/smoke")))``."""
    if options.list:
        return {"listing": list_studies(options.seeds)}
    seeds = options.seeds
    check(isinstance(seeds, int) and seeds >= 1, f"seeds must be a positive integer, got {seeds}")
    chosen = _study(options.preset, options.study, seeds)
    out = options.out or Path("runs") / f"study-{chosen.name}{'' if options.search else '-nosearch'}"
    start = time.perf_counter()
    tally = execute(chosen, out, options.pool(), options.retry_failed, options.progress, options.search)
    report = write_report(out)
    return {"tally": tally, "report": report, "seconds": time.perf_counter() - start, "text": format_checks(report)}


def report(study_dir: Path) -> dict[str, Any]:
    """Write report.md, results.csv and figures/ from what a study has finished so far.

    Args:
        study_dir: the study directory.
    """
    result = write_report(study_dir)
    return {"report": result, "text": format_checks(result)}
