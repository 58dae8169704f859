"""Running a study: its directory, the state of each run, the stages, and the executors.

    STUDY_DIR/
      .lock            held by the process running the study
      study.json       the study: its name, preset, seeds, and every run (id, labels, resolved config)
      runs/<id>/       one ordinary mixit run directory per run (its analysis/ when the table asks for one)
      failed/<id>.json the error of a run that failed (removed when it is retried and succeeds)
      signal*/         the signal sweeps of Tables 6-7 (the study's extras)
      slurm/           submitit's logs, with the Slurm executor
      report.md, results.csv, figures/   written by `mixit report`

A run is *done* once it has written its summary, *failed* when failed/<id>.json records an error, *interrupted*
when it started but did not finish, and *new* otherwise. Running a study again skips what is done and what failed
(``retry_failed`` reruns it) and resumes the rest; a failed run does not stop the others. Each stage is planned only
from the runs finished before it, so a resumed study asks for exactly the runs it asked for before.
"""

from __future__ import annotations

import concurrent.futures
import functools
import json
import math
import multiprocessing
import os
import shutil
import signal
import tempfile
import threading
import time
import traceback
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal, get_args

import torch
from tqdm.auto import tqdm

from mixit.analysis.report import analyze_run
from mixit.analysis.signal import SignalOptions, signal_command
from mixit.core.config import check, typed
from mixit.core.experiment import RunConfig, merge
from mixit.core.run import Run
from mixit.core.training.loop import KeepCheckpoints, train
from mixit.distributed import env_world
from mixit.errors import UsageError, require, show_warning
from mixit.files import DirectoryLock, check_output_dir, read_json, write_json
from mixit.plugins import load_plugins
from mixit.study.directory import check_out, check_same_study
from mixit.study.search import Group, Score, SearchPlan, apply, decide, plan_study
from mixit.study.spec import BUDGET, PlannedRun, RunSpec, Study, merge_planned, plan
from mixit.tracking import Grouping, Naming, Sink, Tracking, check_sinks, study_grouping
from mixit.version import __version__, git_commit, install_hint

Executor = Literal["local", "sequential", "slurm", "submitit-local"]
EXECUTORS: tuple[str, ...] = get_args(Executor)
Job = tuple[str, str, dict[str, Any], bool, Sequence[Sink], Grouping | None]
"""The arguments of `run_one` for one run: plain data, sent to a worker process or a Slurm job."""


def run_dir(study_dir: Path, run_id: str) -> Path:
    return Path(study_dir) / "runs" / run_id


def state(study_dir: Path, run_id: str) -> str:
    """done, failed, interrupted or new (module docstring)."""
    run = Run(run_dir(study_dir, run_id)).state()
    if run == "done":
        return "done"
    if (Path(study_dir) / "failed" / f"{run_id}.json").exists():
        return "failed"
    return "interrupted" if run == "started" else "new"


def extra_result(study_dir: Path, name: str) -> Path:
    """The result file of the study's extra `name`: a signal sweep, written by `signal_command`."""
    return Path(study_dir) / name / "signal.json"


def write_study(
    study: Study,
    study_dir: Path,
    planned: Sequence[PlannedRun],
    search: bool,
    searches: Sequence[Group] = (),
    added: Sequence[RunSpec] = (),
) -> None:
    """Write study.json, refusing a directory that holds another study. `added`: the final runs that
    `Study.more_seeds` has added so far."""
    path = Path(study_dir) / "study.json"
    record = {
        **study_settings(study, search),
        "mixit_version": __version__,
        "git_commit": git_commit(),
        "searches": [
            {
                "group": g.key,
                "seed": g.seed,
                "candidates": {k: list(v) for k, v in g.specs[0].search.items()},
                "rungs": list(g.rungs),
            }
            for g in searches
        ],
        "added": [dict(spec.labels) for spec in added],
        "runs": [p.to_dict() for p in planned],
    }
    if path.exists():  # checked before the study started (`check_out`); again here, under the lock
        old = read_json(path, "study.json")
        check_same_study(study_dir, old, record, functools.partial(study.grows, search=search))
    write_json(path, record)


def study_settings(study: Study, search: bool) -> dict[str, Any]:
    """What study.json records of `study` before its runs."""
    return {
        "name": study.name,
        "description": study.description,
        "preset": study.preset,
        "seeds": study.seeds,
        "first_seed": study.first_seed,
        "extras": study.extras,
        "search": search,
        "screen_fraction": study.screen_fraction if search else None,
        "screen_min_steps": study.screen_min_steps if search else None,
        "extend": list(study.extend),
        "fingerprint": study.fingerprint(search),
        **({"file": study.source} if study.source else {}),
    }


@dataclass
class Pool:
    """Where a study's runs execute: ``local`` (a process pool), ``sequential`` (one after another, here),
    ``slurm`` (an array job through submitit) or ``submitit-local`` (the same code path on this machine)."""

    executor: Executor = "local"
    workers: int = 0
    """Processes of the local pool (0: one per core)."""
    threads: int = 0
    """Torch threads per worker of the local pool (0: one)."""
    slurm: dict[str, Any] = field(default_factory=dict)
    """Parameters of the submitit executors' jobs, as given (`slurm_parameters`)."""

    def __post_init__(self) -> None:
        check(self.executor in EXECUTORS, f"unknown executor {self.executor!r}; allowed: {', '.join(EXECUTORS)}")
        check(
            not self.slurm or self.executor in ("slurm", "submitit-local"),
            f"--slurm sets the jobs of --executor slurm or submitit-local; --executor {self.executor} has none",
        )
        check(
            self.workers >= 0 and self.threads >= 0,
            f"workers and threads must be >= 0 (0: chosen), got {self.workers}, {self.threads}",
        )

    def check_available(self) -> None:
        """Refuse a submitit executor without submitit, slurm without Slurm (no sbatch, or no srun: submitit would
        then run the study here, unasked), and any --slurm item that mixit or submitit refuses."""
        if self.executor not in ("slurm", "submitit-local"):
            return
        submitit = require("submitit", f"--executor {self.executor} needs submitit: {install_hint('slurm')}")
        slurm_parameters(self.slurm)
        if self.executor == "slurm" and (shutil.which("sbatch") is None or submitit.SlurmExecutor.affinity() <= 0):
            raise UsageError(
                "--executor slurm needs Slurm, and this machine has none (no sbatch or srun on PATH); "
                "use --executor local (a process pool here) or --executor submitit-local"
            )
        with tempfile.TemporaryDirectory() as scratch:  # submitit's local executor makes its folder at once
            _submitit_executor(self.executor, Path(scratch), self.slurm)

    def run(self, jobs: Sequence[Job], study_dir: Path, finished: Callable[[dict[str, Any]], None]) -> None:
        """Run `jobs`, handing each outcome to `finished` as it comes."""
        if self.executor == "sequential" or (self.executor == "local" and (self.workers == 1 or len(jobs) <= 1)):
            for job in jobs:
                finished(run_one(*job, threads=self.threads if self.executor == "local" else 0))
        elif self.executor == "local":
            _local_pool(jobs, self, finished)
        elif jobs:
            _submitit(self.executor, study_dir, jobs, self.slurm, finished)


def execute(
    study: Study,
    study_dir: Path,
    pool: Pool | None = None,
    retry_failed: bool = False,
    progress: bool = True,
    search: bool = True,
    logger: Sequence[Sink] = (),
    naming: Naming | None = None,
    announce: Callable[[], None] | None = None,
) -> dict[str, Any]:
    """Run every run of `study` not yet done into `study_dir` on `pool` (default: a local pool), then its extras;
    return a tally. `search`: whether the runs that declare candidates are searched (`mixit.study.search`) or train
    their request as it is. `logger`: tracking sinks every run is sent to as well, named in `naming`'s project.
    `announce` is called once every check has passed, before the first write."""
    load_plugins()  # those every worker and job imports: one that cannot be is refused before any work
    pool = pool or Pool()
    # Left at 0: one single-threaded worker per core, the quick preset's fastest on 2 cores (docs/reproduction.md).
    pool = replace(pool, workers=pool.workers or os.cpu_count() or 1, threads=pool.threads or 1)
    study_dir = Path(study_dir)
    planned = plan_study(study, search)
    # The searched cells with each of their candidates resolved too, so a bad one is refused at once.
    plan(apply(spec, combination) for g in planned.groups for spec in g.specs for combination in g.combinations)
    # Everything that can refuse reads only, and comes before the first write (the probe of writability).
    check_out(study_dir, study_settings(study, search), functools.partial(study.grows, search=search))
    pool.check_available()
    sinks = check_sinks(logger)
    naming = naming or Naming()
    naming.check_sent(sinks)
    check_output_dir(study_dir)
    if announce is not None:
        announce()
    study_dir.mkdir(parents=True, exist_ok=True)
    lock = DirectoryLock(study_dir, "mixit study")
    lock.acquire()
    try:
        tally = {"done": 0, "failed": 0, "skipped_failed": 0}
        sent: set[str] = set()
        with tqdm(total=0, disable=not progress, desc=study.name, unit="run", dynamic_ncols=True) as bar:

            def finished(result: dict[str, Any]) -> None:
                tally[result["state"]] += 1
                bar.update(1)
                bar.set_postfix(done=tally["done"], failed=tally["failed"], left=bar.total - bar.n)

            def run(stage: Sequence[PlannedRun]) -> None:
                """Run what of `stage` was not sent before and is not done (nor failed, but with `retry_failed`)."""
                todo = []
                for p in stage:
                    if p.id in sent:
                        continue
                    sent.add(p.id)
                    got = state(study_dir, p.id)
                    if got == "done":
                        tally["done"] += 1
                    elif got == "failed" and not retry_failed:
                        tally["skipped_failed"] += 1
                    else:
                        todo.append(p)
                bar.total += len(todo)
                bar.refresh()
                jobs = [
                    (
                        str(study_dir),
                        p.id,
                        {"config": p.cfg.to_dict(), "request": p.cfg.request},
                        p.analyze,
                        sinks,
                        study_grouping(study.name, p.id, p.cfg, p.role, naming, cell_values(p.labels)),
                    )
                    for p in todo
                ]
                pool.run(jobs, study_dir, finished)

            _rounds(study, study_dir, search, run)
        for name, options in study.extras.items():  # the signal sweeps not yet written
            if not extra_result(study_dir, name).exists():
                signal_command(SignalOptions(study_dir / name, **options))
        return tally
    finally:
        lock.release()


def _rounds(study: Study, study_dir: Path, search: bool, run: Callable[[Sequence[PlannedRun]], None]) -> None:
    """Run `study`'s stages, then again with the final runs `Study.more_seeds` adds, until it adds none new. The
    hook reads only finished runs, so a resumed study asks for the same runs round by round; study.json lists the
    added specs ("added") beside the study's own, whose fingerprint stays the study's."""
    added: list[RunSpec] = []  # grown in place: study.json lists what has been added when it is written
    record = functools.partial(write_study, study, study_dir, search=search, added=added)
    while True:
        _stages(replace(study, specs=[*study.specs, *added]), study_dir, search, run, record)
        if study.more_seeds is None:
            return
        known = {_spec_key(s) for s in [*study.specs, *added]}
        new = {_spec_key(s): s for s in study.more_seeds(study_dir) if _spec_key(s) not in known}
        if not new:
            return
        added.extend(new.values())


def _spec_key(spec: RunSpec) -> str:
    """What makes two specs the same run of a study (as `Study.fingerprint` reads a spec)."""
    return json.dumps([spec.request, spec.labels, spec.analyze, spec.search], sort_keys=True, default=str)


def _stages(
    study: Study,
    study_dir: Path,
    search: bool,
    run: Callable[[Sequence[PlannedRun]], None],
    record: Callable[..., None],
) -> None:
    """Run `study` stage by stage, each once study.json (`record`) lists it, until a stage asks for nothing new.

    The first stage is the runs that need no search and every search's rung-0 screening runs; each later one, what
    the runs finished so far ask for: a search's next screening runs, the searched cells whose search has chosen,
    and the extensions of the final runs (`_extensions`). A search that cannot go on (a screening run neither
    finished nor failed: a Slurm job that died) leaves its cells for the next call. A run with a donor
    (`RunSpec.donor`: a transplant) joins, with its search, in the stage after its donor has finished at its
    longest budget."""
    ready = [spec for spec in study.specs if not spec.donor]
    waiting = [spec for spec in study.specs if spec.donor]
    planned = plan_study(replace(study, specs=ready), search)
    runs: list[PlannedRun] = []
    wanted = merge_planned(planned.plain, list(planned.screens.values()))
    given: list[RunSpec] = []  # the waiting runs whose donors have finished, with their donors' directories
    while True:
        known = {p.id for p in runs}
        stage = [p for p in wanted if p.id not in known]
        runs = merge_planned(runs, wanted)  # a run asked for again keeps every label it is asked for under
        record(runs, searches=planned.groups)
        if not stage:
            return
        run(stage)
        screens, finals = _decided(planned, study_dir)
        now = _donated(waiting, finals, study.extend, study_dir)
        if len(now) > len(given):  # new transplants: the study planned again with them and their searches
            given = now
            planned = plan_study(replace(study, specs=[*ready, *given]), search)
            screens, finals = _decided(planned, study_dir)
        wanted = merge_planned(screens, finals, _extensions(finals, study.extend, study_dir))


def _decided(planned: SearchPlan, study_dir: Path) -> tuple[list[PlannedRun], list[PlannedRun]]:
    """What `planned`'s runs finished so far ask for: the screening runs of its searches (`decide`), and its final
    runs (those with no search, and the searched cells whose search has chosen, with the values chosen)."""
    ids: dict[str, str] = {}

    def score(screen: RunSpec) -> Score | None:
        key = json.dumps(screen.request, sort_keys=True, default=str)
        if key not in ids:
            ids[key] = plan([screen], role="screen")[0].id
        return screen_score(ids[key], study_dir)

    outcomes = [decide(g, score, planned.screen(g.screens[0]).cfg.train.min_delta) for g in planned.groups]
    screens = plan((s for o in outcomes for s in o.screens), role="screen")
    finals = list(planned.plain)
    for group, outcome in zip(planned.groups, outcomes):
        if outcome.chosen is not None:
            for final in plan(apply(spec, outcome.chosen) for spec in group.specs):
                final.chosen = dict(outcome.chosen)
                finals.append(final)
    return screens, merge_planned(finals)


def _donated(
    waiting: Sequence[RunSpec], finals: Sequence[PlannedRun], multiples: Sequence[int], study_dir: Path
) -> list[RunSpec]:
    """The runs of `waiting` whose donor (the labels of a run of `finals`) is done at the longest budget its cell
    trains to (its own cap, or the extension after which it settled), each with that run's directory as its
    `transplant_from` (absolute: a Slurm job may start elsewhere), in order. A donor that failed gives none."""
    found = []
    for spec in waiting:
        donors = [f for f in finals if any(all(x.get(k) == v for k, v in spec.donor.items()) for x in f.labels)]
        if not donors:
            continue
        donor = donors[0]
        for multiple in multiples:
            if not unconverged(study_dir, donor.id):
                break
            donor = extended(donors[0], multiple)
        if state(study_dir, donor.id) == "done":
            path = str(run_dir(study_dir, donor.id).resolve())
            found.append(replace(spec, request=merge(spec.request, {"transplant_from": path}), donor={}))
    return found


def _extensions(finals: Sequence[PlannedRun], multiples: Sequence[int], study_dir: Path) -> list[PlannedRun]:
    """The budget extensions the finished runs of `finals` ask for: each final run that ended `unconverged` trained
    again at the first of `multiples` times its step cap, and each of those still unconverged at the next."""
    found: list[PlannedRun] = []
    chains = [(final, final) for final in finals]  # (the run at its own cap, its longest extension so far)
    for multiple in multiples:
        chains = [(first, extended(first, multiple)) for first, last in chains if unconverged(study_dir, last.id)]
        found += [last for _, last in chains]
    return found


def extended(final: PlannedRun, multiple: int) -> PlannedRun:
    """`final` trained again from scratch at `multiple` times its step cap: `train.steps` and `train.eval_every`
    multiplied, so its schedule stretches and it evaluates as often as before. Each label gets the multiple as
    `BUDGET`, so the report knows the run for its cell's."""
    train = final.cfg.train
    longer = {"train": {"steps": multiple * train.steps, "eval_every": multiple * train.cadence[1]}}
    request = merge(final.cfg.request, longer)
    (run,) = plan(RunSpec(request, {**labels, BUDGET: multiple}, final.analyze) for labels in final.labels)
    run.chosen = dict(final.chosen)
    return run


SETTLED = ("solved", "plateau")
"""The convergence reasons of a run that is not trained further (`unconverged`)."""


def unconverged(study_dir: Path, run_id: str) -> bool:
    """Whether a done run ended with a convergence reason other than `SETTLED`: still improving at its cap, too few
    evaluations to tell, or flat (a slow starter: MixiT on retrieval sits at chance for about 3,000 steps,
    docs/results/retrieval-mixit). A run not done, or whose summary records no reason or cannot be read, is not."""
    if state(study_dir, run_id) != "done":
        return False
    try:
        convergence = (Run(run_dir(study_dir, run_id)).summary() or {}).get("convergence")
    except UsageError:
        return False
    reason = convergence.get("reason") if isinstance(convergence, dict) else None
    return reason is not None and reason not in SETTLED


def screen_score(run_id: str, study_dir: Path) -> Score | None:
    """A finished screening run's best validation value and the mean of its curve (higher is better, as its
    convergence record says); nan for both if it failed or logged no value; None while it has not finished.

    Evaluations at step 0 are left out (they say nothing of the learning rate), so a run that learns late is judged
    at its best; the mean breaks a tie: the run that got there sooner has the better mean."""
    got = state(study_dir, run_id)
    if got == "failed":
        return Score(math.nan, math.nan, True)
    if got != "done":
        return None
    run = Run(run_dir(study_dir, run_id))
    convergence = (run.summary() or {}).get("convergence", {})
    metric, higher = convergence.get("metric"), bool(convergence.get("higher_is_better", True))
    key = f"val_{metric}"
    values = [float(e[key]) for e in run.metrics() if e.get("event") == "eval" and e["step"] > 0 and key in e]
    values = [v for v in values if v == v]
    if metric is None or not values:
        return Score(math.nan, math.nan, higher)
    return Score(max(values) if higher else min(values), sum(values) / len(values), higher)


NOT_CELL = ("table", "seed", "cell", "group", "cell_seed")
"""Labels that are no value of a run's cell: its table, its seed, and a screening run's cell, group and cell's seed."""


def cell_values(labels: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The values that make the cell of a run of these labels, as the tracking sinks show them (lr=0.01, a budget
    multiple, a screening run's rung and candidate): those all its labels agree on, but `NOT_CELL`."""
    first, *rest = labels or [{}]
    return {k: v for k, v in first.items() if k not in NOT_CELL and all(other.get(k) == v for other in rest)}


# -- where a run executes: here, in a worker of the local pool, or in a submitit job --------------------------


def run_one(
    study_dir: str,
    run_id: str,
    config: dict[str, Any],
    analyze: bool,
    logger: Sequence[Sink] = (),
    grouping: Grouping | None = None,
    threads: int = 0,
) -> dict[str, Any]:
    """Train (or resume) one run of a study, analyse it if asked, and record a failure instead of raising.

    It takes plain data, being sent to a worker process or a Slurm job: `config` is {"config": the resolved config,
    "request": its request}. A run to be analysed keeps log-spaced checkpoints (which change neither its results
    nor its id) and is analysed over them, so the report can show when its heads form."""
    if threads:
        torch.set_num_threads(threads)
    try:
        import submitit

        tasks = submitit.JobEnvironment().num_tasks
    except (ImportError, RuntimeError):  # not a submitit job
        tasks = 1
    if tasks > 1:  # a Slurm job of one task per GPU: what torch.distributed reads, so the run trains on all of them
        submitit.helpers.TorchDistributedEnvironment().export()
    start = time.perf_counter()
    failed = Path(study_dir) / "failed" / f"{run_id}.json"
    run = Run(run_dir(Path(study_dir), run_id))
    main = True  # until the environment says otherwise: a malformed one is this run's failure, recorded
    try:
        main = env_world().main
        load_plugins()  # a fresh worker or Slurm job: the tasks and variants of MIXIT_PLUGINS
        cfg = RunConfig.from_dict(config["config"])
        cfg.request = config["request"]
        got = run.state()
        if got != "done":
            keep: KeepCheckpoints = "log" if analyze else "latest"
            tracking = Tracking(logger, grouping=grouping)
            train(cfg, run.path, resume=got == "started", progress=False, keep_checkpoints=keep, tracking=tracking)
        if analyze and not run.analysed:
            analyze_run(run.path, batch=32, over_time=True)
        if main:
            failed.unlink(missing_ok=True)
        return {"id": run_id, "state": "done", "seconds": time.perf_counter() - start}
    except Exception as e:  # a failed run is recorded, and the study goes on
        if isinstance(e.__cause__, KeyboardInterrupt):  # a plugin's import stopped (`_stop_pool`): not a failure
            raise e.__cause__ from None
        message = " ".join(str(e).split()) or type(e).__name__
        seconds = time.perf_counter() - start
        if main:
            failed.parent.mkdir(parents=True, exist_ok=True)
            error = f"{type(e).__name__}: {message}"
            write_json(
                failed, {"id": run_id, "error": error, "traceback": traceback.format_exc()[-4000:], "seconds": seconds}
            )
        return {"id": run_id, "state": "failed", "error": message, "seconds": seconds}


def _local_pool(jobs: Sequence[Job], pool: Pool, finished: Callable[[dict[str, Any]], None]) -> None:
    """Run `jobs` on `pool.workers` spawned processes. Interrupted (Ctrl-C, or a SIGINT to this process alone), it
    stops them (`_stop_pool`) rather than wait: each run resumes from its checkpoint next time."""
    executor = concurrent.futures.ProcessPoolExecutor(
        pool.workers,
        mp_context=multiprocessing.get_context("spawn"),
        initializer=_start_worker,
        initargs=(pool.threads,),
    )
    try:
        for future in concurrent.futures.as_completed([executor.submit(_run_in_worker, *job) for job in jobs]):
            finished(future.result())
    except BaseException:
        _stop_pool(executor)
        raise
    executor.shutdown(wait=True)


def _start_worker(threads: int) -> None:
    """Set up a pool worker: its torch threads, warnings on one line (as the CLI's), SIGINT ignored (a Ctrl-C reaches
    the whole process group, and the study stops its workers itself), and its end with the study however the study
    ends, a SIGKILL included: a worker left behind would hold its memory and its run directory's lock."""
    torch.set_num_threads(threads)
    warnings.showwarning = functools.partial(show_warning, warnings.showwarning)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    threading.Thread(target=_end_with, args=(multiprocessing.parent_process(),), daemon=True).start()


def _end_with(study: multiprocessing.process.BaseProcess) -> None:
    """End this worker once the study's process has ended: safe at any moment, its run resumes from its checkpoint."""
    study.join()
    os._exit(1)


def _run_in_worker(*job: Any) -> dict[str, Any]:
    """`run_one` in a pool worker, where a SIGTERM from the study (`_stop_pool`) interrupts the run as a Ctrl-C would,
    so it closes its files; outside a run a SIGTERM ends the worker as by default (an interrupt there would print
    the pool's traceback)."""
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        return run_one(*job)
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _stop_pool(executor: concurrent.futures.ProcessPoolExecutor, grace: float = 30.0) -> None:
    """Stop `executor`'s workers, this process's children: a SIGTERM, then a SIGKILL after `grace` s."""
    workers = multiprocessing.active_children()
    for worker in workers:
        worker.terminate()
    executor.shutdown(wait=False, cancel_futures=True)
    for worker in workers:
        worker.join(grace)
        if worker.is_alive():
            worker.kill()
            worker.join()


# -- the submitit jobs and their parameters (--slurm KEY=VALUE) ---------------------------------------------------
# submitit judges the keys and the types of its shared parameters itself (`_submitit_executor`); these three small
# tables hold what it does not check, each compared with the installed submitit by tests/test_slurm.py.

SLURM_NUMBERS: dict[str, tuple[int | float, str]] = {
    "timeout_min": (1, "a time limit in minutes"),
    "time": (1, "a time limit in minutes"),
    "signal_delay_s": (0, "seconds between the warning signal and the time limit"),
    "nodes": (1, "a number of nodes"),
    "tasks_per_node": (1, "a number of tasks"),
    "ntasks_per_node": (1, "a number of tasks"),
    "cpus_per_task": (1, "a number of CPUs"),
    "cpus_per_gpu": (1, "a number of CPUs"),
    "gpus_per_node": (0, "a number of GPUs"),
    "gpus_per_task": (0, "a number of GPUs"),
    "array_parallelism": (1, "a number of jobs at once"),
    "mem_gb": (0.001, "memory in GB"),
}
"""The numbers (integers, but mem_gb) with their least value. submitit checks no range: a bad number would reach
Slurm, which refuses it only once the study is written, or runs jobs that end at once (under 1 MB is written as
``--mem=0MB``, a whole node's memory)."""

SLURM_SHAPES: dict[str, type] = {"setup": list, "teardown": list, "srun_args": list, "additional_parameters": dict}
"""The lists (one ``--slurm KEY=ITEM`` per item: a string would reach submitit as one) and the mapping of sbatch
options (one ``--slurm KEY.NAME=VALUE`` each)."""

SLURM_SHARED = "name timeout_min mem_gb nodes cpus_per_task gpus_per_node tasks_per_node stderr_to_stdout".split()
"""The parameters AutoExecutor shares between its clusters (submitit publishes no list); the others take the
``slurm_`` prefix."""


def slurm_parameters(given: Mapping[str, Any]) -> dict[str, Any]:
    """The keyword arguments of submitit's AutoExecutor.update_parameters from `given` (``--slurm KEY=VALUE`` items,
    or a dict from Python), dashes read as underscores. Defaults (docs/scaling.md, "Slurm"): a time limit of 240
    minutes (submitit's is 5), 2 CPUs per task, and one task per GPU, so that each GPU trains one rank of the run."""
    params: dict[str, Any] = {}
    for raw, value in given.items():
        key = str(raw).replace("-", "_")
        check(key not in params, f"--slurm {key} is given twice (once as {raw!r})")
        params[key] = _slurm_value(key, value)
    if not params.keys() & {"timeout_min", "time"}:
        params["timeout_min"] = 240
    if not params.keys() & {"cpus_per_task", "cpus_per_gpu"}:  # Slurm refuses the two together
        params["cpus_per_task"] = 2
    if not params.keys() & {"tasks_per_node", "ntasks_per_node"}:
        params["tasks_per_node"] = params.get("gpus_per_node") or 1
    return {key if key in SLURM_SHARED else f"slurm_{key}": value for key, value in params.items()}


def _slurm_value(key: str, value: Any) -> Any:
    """The value of --slurm `key` as `SLURM_SHAPES` and `SLURM_NUMBERS` say; else one value, true or false (any
    case) read as a bool."""
    shape = SLURM_SHAPES.get(key)
    if shape is list:
        items = value if isinstance(value, list) else [value]
        check(all(isinstance(v, str) for v in items), f"--slurm {key} takes strings, one per --slurm {key}=...")
        return items
    if shape is dict:
        ok = isinstance(value, Mapping) and not any(isinstance(v, (list, Mapping)) for v in value.values())
        check(ok, f"--slurm {key} takes one --slurm {key}.NAME=VALUE per sbatch option NAME, got {value!r}")
        return {str(name): True if v == "true" else v for name, v in value.items()}
    check(not isinstance(value, (list, Mapping)), f"--slurm {key} takes one value, got {value!r}")
    if key not in SLURM_NUMBERS:
        return value.lower() == "true" if isinstance(value, str) and value.lower() in ("true", "false") else value
    least, what = SLURM_NUMBERS[key]
    number = typed(f"--slurm {key}", type(least), value)
    check(number >= least, f"--slurm {key}={value} is out of range: {what}, at least {least}")
    return number


def _submitit_executor(executor: str, folder: Path, slurm: Mapping[str, Any]) -> Any:
    """submitit's executor for a study's jobs, writing into `folder`. What submitit refuses or warns of (an unknown
    key, a value of the wrong type, nodes above 1 here, the deprecated num_gpus) is one UsageError line."""
    import submitit  # there: `Pool.check_available`

    # The cluster is named, never detected: AutoExecutor's own choice falls back to this machine silently.
    ex = submitit.AutoExecutor(folder, cluster="local" if executor == "submitit-local" else "slurm")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            ex.update_parameters(**slurm_parameters(slurm))
    except (NameError, AssertionError, ValueError, TypeError, Warning) as e:  # how submitit says no
        raise UsageError(f"--slurm: {(str(e).strip() or type(e).__name__).splitlines()[0]}") from None
    return ex


def _submitit(
    executor: str,
    study_dir: Path,
    jobs: Sequence[Job],
    slurm: dict[str, Any],
    finished: Callable[[dict[str, Any]], None],
) -> None:
    """Run `jobs` as one submitit array job: on Slurm, or with submitit's local executor."""
    import submitit

    ex = _submitit_executor(executor, study_dir / "slurm", slurm)
    for job in submitit.helpers.as_completed(ex.map_array(run_one, *zip(*jobs)), poll_frequency=1.0):
        try:
            finished(job.result())
        except Exception as e:  # the job itself died (killed, out of time): the run is interrupted
            finished({"id": "?", "state": "failed", "error": " ".join(str(e).split())[:300]})
