"""Running a study: the study directory, the state of each run, and the executors.

    STUDY_DIR/
      .lock            held by the process running the study
      study.json       the study: its name, preset, seeds, and every run (id, labels, resolved config)
      runs/<id>/       one ordinary mixit run directory per run (its analysis/ when the table asks for one)
      failed/<id>.json the error of a run that failed (removed when it is retried and succeeds)
      signal*/         the signal sweeps of Tables 6-7 (the study's extras)
      slurm/           submitit's logs, with the Slurm executor
      report.md, results.csv, figures/   written by `mixit report`

A run is *done* when it has written its summary (`mixit.core.run.Run.state`),
*failed* when failed/<id>.json records an error, *interrupted* when it has
started but not finished (it is resumed from its last checkpoint), and *new*
otherwise. Running a study
again skips what is done and what failed (``retry_failed`` reruns the
failed ones), resumes what was interrupted and starts the rest, so a killed
study loses at most the steps since each in-flight run's last checkpoint. A
run that fails is recorded and does not stop the others.

A study runs in stages (`execute`), each planned from the runs finished before it, so a resumed study asks
for exactly the runs it asked for before: the runs that need no search with every search's first screening
runs; the searches' later screening runs, and each searched cell once its search has chosen; then, with
`Study.extend`, each final run that ended unconverged trained again from scratch at 2x (then 4x) its step
cap. With `Study.more_seeds`, the final runs that its hook adds (new seeds where a verdict is undecided) go
through the same stages, round after round, until it adds nothing new.

Executors (`Pool`): ``local`` (a process pool: `workers` processes of `threads` torch
threads each), ``sequential`` (one after another, in this process),
``slurm`` (an array job through submitit) and ``submitit-local`` (the same
code path on this machine, for tests). Each runs `run_one` per run. A local
pool's workers end with the study's process, however it ends
(`_start_worker`), and a SIGINT to the study stops them (`_stop_pool`).
What the study directory may hold before a study starts is
`mixit.study.directory`'s.
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
from mixit.study.search import Group, Outcome, Score, SearchPlan, apply, decide, plan_study
from mixit.study.spec import BUDGET, PlannedRun, RunSpec, Study, merge_planned, plan
from mixit.tracking import Grouping, Naming, Sink, Tracking, check_sinks, study_grouping
from mixit.version import __version__, git_commit, install_hint

Executor = Literal["local", "sequential", "slurm", "submitit-local"]
EXECUTORS: tuple[str, ...] = get_args(Executor)


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
    """Write study.json; refuse a directory that holds another study (or this one searched otherwise). `added`:
    the final runs `Study.more_seeds` has added so far, listed by their labels (their runs are in `planned`)."""
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
    """What study.json records of `study` before its runs: its name, settings and fingerprint (`search`: whether
    its searches run), and the keys of the study file it was read from, if any."""
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
    """Where a study's runs execute (module docstring, "Executors")."""

    executor: Executor = "local"
    """local (a process pool), sequential (one after another, here), slurm (an array job through
    submitit) or submitit-local (the same code path on this machine)."""
    workers: int = 0
    """Processes of the local pool (0: `sized`)."""
    threads: int = 0
    """Torch threads per worker of the local pool (0: `sized`)."""
    slurm: dict[str, Any] = field(default_factory=dict)
    """Parameters of the submitit executors' jobs, as given (`slurm_parameters` reads them, submitit checks them):
    any that submitit's Slurm executor accepts, e.g. partition, account, qos, mem, timeout_min, array_parallelism."""

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
        """Refuse an executor this machine cannot run, or its jobs' parameters, before the study writes anything:
        the submitit executors without submitit, a --slurm value mixit reads wrongly (`slurm_parameters`), slurm
        without Slurm (no sbatch, or no srun, which is what submitit's own check looks for; submitit would otherwise
        run the study here, unasked), and what submitit itself refuses (`_submitit_executor`)."""
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

    def sized(self) -> Pool:
        """This pool with workers and threads left at 0 chosen for this machine: one single-threaded worker per
        core, which ran the quick preset's small models fastest on 2 cores (docs/reproduction.md)."""
        return replace(self, workers=self.workers or os.cpu_count() or 1, threads=self.threads or 1)


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
    """Run every run of `study` not yet done into `study_dir` on `pool` (default: a local pool sized by
    `Pool.sized`), then its extras; return a tally. `logger`: tracking sinks every run is sent to as well,
    grouped under the study's name and named readably, in `naming`'s project (`mixit.tracking.study_grouping`).
    `announce` is called once every check has passed, before the first write (`reproduce` says the study's size).
    Why so many parameters: each is a choice callers make apart, and an options object would only move them.

    The runs go in stages, each planned from the runs finished before it (`_stages`). With `search`, the runs
    that declare candidates are searched (`mixit.study.search`): their rung-0 screening runs train beside the
    runs that need no search, then each later stage of a search (rung 1, the edge extension) once the one
    before has finished, then each searched cell with the values chosen on validation. Without it, every run
    trains its request as it is. With `Study.extend`, each final run that ended unconverged is trained again
    at the next multiple of its step cap (`_extensions`). With `Study.more_seeds`, the study then runs in rounds
    (`_rounds`): the runs the hook adds go through the same stages, until it adds nothing new.
    """
    # The plugins every worker and job imports, imported here first: one that cannot be is refused before any work.
    load_plugins()
    pool = (pool or Pool()).sized()
    study_dir = Path(study_dir)
    planned = plan_study(study, search)
    # The searched cells with each of their candidates resolved too, so a bad one is refused at once.
    plan(apply(spec, combination) for g in planned.groups for spec in g.specs for combination in g.combinations)
    # Everything that can refuse reads only, and comes before the first write (the probe of writability).
    check_out(study_dir, study_settings(study, search), functools.partial(study.grows, search=search))
    pool.check_available()
    sinks = check_sinks(logger)
    (naming or Naming()).check_sent(sinks)
    check_output_dir(study_dir)
    if announce is not None:
        announce()
    study_dir.mkdir(parents=True, exist_ok=True)
    lock = DirectoryLock(study_dir, "mixit study")
    lock.acquire()
    try:
        tally = {"done": 0, "failed": 0, "skipped_failed": 0}
        with tqdm(total=0, disable=not progress, desc=study.name, unit="run", dynamic_ncols=True) as bar:
            grouping = functools.partial(_grouping, study.name, naming or Naming())
            sent: set[str] = set()

            def run(stage: Sequence[PlannedRun]) -> None:  # each run once per call, however many rounds ask for it
                todo = [p for p in stage if p.id not in sent]
                sent.update(p.id for p in todo)
                if todo:
                    _run_phase(todo, study_dir, pool, retry_failed, tally, bar, sinks, grouping)

            _rounds(study, study_dir, search, run)
        _run_extras(study, study_dir)
        return tally
    finally:
        lock.release()


def _rounds(study: Study, study_dir: Path, search: bool, run: Callable[[Sequence[PlannedRun]], None]) -> None:
    """Run `study`'s stages (`_stages`), then those of the study with the final runs `Study.more_seeds` adds,
    round after round until it adds none that the study does not have: a spec is the same as another when its
    request, labels, analysis and candidates are. The hook reads only finished runs, so a resumed study asks
    for the same runs round by round (each round's runs already done are not trained again), and study.json's
    fingerprint stays the study's own: the added specs are listed beside it ("added"), and their runs among the
    others'."""
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
    """Run `study` stage by stage: each stage is what the finished runs ask for that no stage before did, run
    once study.json (`record`) lists it; the study has finished when a stage asks for nothing new.

    The first stage is the runs that need no search and every search's rung-0 screening runs. Each later one
    holds a search's next screening runs, the searched cells whose search has decided, and the extensions
    (`_extensions`) of the final runs finished so far, so a cell waits only for what its own runs need. Every
    stage is a pure function of the finished runs, so a resumed study asks for exactly the runs it asked for
    before; a search that cannot go on (a screening run that neither finished nor failed: a Slurm job that
    died) leaves its cells for the next call."""
    planned = plan_study(study, search)
    runs: list[PlannedRun] = []
    wanted = merge_planned(planned.plain, list(planned.screens.values()))
    while True:
        known = {p.id for p in runs}
        stage = [p for p in wanted if p.id not in known]
        runs = merge_planned(runs, wanted)  # a run asked for again keeps every label it is asked for under
        record(runs, searches=planned.groups)
        if not stage:
            return
        run(stage)
        outcomes = _search_outcomes(planned, study_dir)
        screens = plan((s for o in outcomes for s in o.screens), role="screen")
        finals = merge_planned(planned.plain, _searched_finals(planned, outcomes))
        wanted = merge_planned(screens, finals, _extensions(finals, study.extend, study_dir))


def _extensions(finals: Sequence[PlannedRun], multiples: Sequence[int], study_dir: Path) -> list[PlannedRun]:
    """The budget extensions that the finished runs of `finals` ask for: each final run that ended unconverged
    (`unconverged`) trained again at the first of `multiples` times its step cap (`extended`), and each of those
    that ended unconverged at the next, as far as the finished runs go. A failed or unfinished run is not
    extended; its extension, if it has one, waits until it has finished."""
    found: list[PlannedRun] = []
    chains = [(final, final) for final in finals]  # (the run at its own cap, its longest extension so far)
    for multiple in multiples:
        chains = [(first, extended(first, multiple)) for first, last in chains if unconverged(study_dir, last.id)]
        found += [last for _, last in chains]
    return found


def extended(final: PlannedRun, multiple: int) -> PlannedRun:
    """`final` trained again from scratch at `multiple` times its step cap: its request with `train.steps` and
    `train.eval_every` both multiplied, so its learning-rate schedule stretches over the longer budget and it
    evaluates as many times as before; everything else it asked for (its seed, the values its search chose,
    its analysis) as it was, and what it left to the run's length (warmup, logging and checkpoint cadences) as
    for any run of that many steps. Each of its labels gets the multiple as `BUDGET`, so the report knows the
    run for its cell's at a longer budget."""
    train = final.cfg.train
    longer = {"train": {"steps": multiple * train.steps, "eval_every": multiple * train.cadence[1]}}
    request = merge(final.cfg.request, longer)
    (run,) = plan(RunSpec(request, {**labels, BUDGET: multiple}, final.analyze) for labels in final.labels)
    run.chosen = dict(final.chosen)
    return run


SETTLED = ("solved", "plateau")
"""The convergence reasons of a run that is not trained further (`unconverged`)."""


def unconverged(study_dir: Path, run_id: str) -> bool:
    """Whether a run has finished still moving or not yet started: its summary's convergence reason is neither
    solved nor plateau. That is a run still improving at its step cap, one with too few evaluations to tell, and
    one whose curve never left where it started (flat), which a slow starter does for a while (MixiT on
    retrieval sits at chance for about 3,000 steps and then learns: docs/results/retrieval-mixit). Where early
    stopping is off, the reason is judged all the same. A failed or unfinished run is not, nor one that recorded
    no reason (older code) or whose summary cannot be read (the report shows it as damaged)."""
    if state(study_dir, run_id) != "done":
        return False
    try:
        convergence = (Run(run_dir(study_dir, run_id)).summary() or {}).get("convergence")
    except UsageError:
        return False
    reason = convergence.get("reason") if isinstance(convergence, dict) else None
    return reason is not None and reason not in SETTLED


def _run_extras(study: Study, study_dir: Path) -> None:
    """The study's extras (signal measurements) not yet written, each into its own directory of `study_dir`."""
    for name, options in study.extras.items():
        if not extra_result(study_dir, name).exists():
            signal_command(SignalOptions(study_dir / name, **options))


def _search_outcomes(planned: SearchPlan, study_dir: Path) -> list[Outcome]:
    """Where each search stands, from the screening runs finished in `study_dir` (`mixit.study.search.decide`)."""
    ids: dict[str, str] = {}

    def score(screen: RunSpec) -> Score | None:
        key = json.dumps(screen.request, sort_keys=True, default=str)
        if key not in ids:
            ids[key] = plan([screen], role="screen")[0].id
        return screen_score(ids[key], study_dir)

    return [decide(g, score, planned.screen(g.screens[0]).cfg.train.min_delta) for g in planned.groups]


def _searched_finals(planned: SearchPlan, outcomes: Sequence[Outcome]) -> list[PlannedRun]:
    """Every searched cell with its chosen values; a cell whose search has not finished (a screening run that
    neither finished nor failed: a Slurm job that died) is left for the next call, which resumes it."""
    finals: list[PlannedRun] = []
    for group, outcome in zip(planned.groups, outcomes):
        if outcome.chosen is None:
            continue
        for final in plan(apply(spec, outcome.chosen) for spec in group.specs):
            final.chosen = dict(outcome.chosen)
            finals.append(final)
    return finals


def screen_score(run_id: str, study_dir: Path) -> Score | None:
    """(the best validation value over the run's curve, the curve's mean, higher is better) of a finished
    screening run; nan for both if it failed or logged no value of its metric; None while it has not finished.

    The metric and its direction are the run's convergence record's (summary.json); the values are those of
    evaluations after step 0 in metrics.jsonl (``val_<metric>``), so a run that learns late is judged at its
    best (step 0, before training, says nothing of the learning rate). The mean breaks a tie that survives
    the full steps: the run that got there sooner has the better mean."""
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


def _run_phase(
    planned: Sequence[PlannedRun],
    study_dir: Path,
    pool: Pool,
    retry_failed: bool,
    tally: dict[str, int],
    bar: Any,
    logger: tuple[Sink, ...] = (),
    grouping: Callable[[PlannedRun], Grouping] | None = None,
) -> None:
    """Run what of `planned` is not done (and, with `retry_failed`, what failed), counting into `tally`; each
    sent to the tracking sinks `logger` too, as `grouping` names, groups and tags it."""
    states = {p.id: state(study_dir, p.id) for p in planned}
    todo = [p for p in planned if states[p.id] in ("new", "interrupted") or (retry_failed and states[p.id] == "failed")]
    tally["done"] += sum(s == "done" for s in states.values())
    tally["skipped_failed"] += 0 if retry_failed else sum(s == "failed" for s in states.values())
    jobs = [
        (
            str(study_dir),
            p.id,
            {"config": p.cfg.to_dict(), "request": p.cfg.request},
            p.analyze,
            logger,
            grouping(p) if grouping else None,
        )
        for p in todo
    ]
    bar.total += len(jobs)
    bar.refresh()
    parallel = 1 if pool.executor == "sequential" else pool.workers if pool.executor == "local" else len(jobs)
    left = [len(jobs)]

    def finished(result: dict[str, Any]) -> None:
        tally[result["state"]] += 1
        bar.update(1)
        left[0] -= 1
        bar.set_postfix(done=tally["done"], running=min(parallel, left[0]), failed=tally["failed"], left=left[0])

    if pool.executor == "sequential" or (pool.executor == "local" and (pool.workers == 1 or len(jobs) <= 1)):
        for job in jobs:
            finished(run_one(*job, threads=pool.threads if pool.executor == "local" else 0))
    elif pool.executor == "local":
        _local_pool(jobs, pool, finished)
    else:
        _submitit(pool.executor, study_dir, jobs, pool.slurm, finished)


def _grouping(study_name: str, naming: Naming, planned: PlannedRun) -> Grouping:
    """How the sinks name, group and tag the run `planned` of the study `study_name`."""
    return study_grouping(study_name, planned.id, planned.cfg, planned.role, naming, cell_values(planned.labels))


NOT_CELL = ("table", "seed", "cell", "group", "cell_seed")
"""Labels that are no value of a run's cell: its table (a study file's name), its seed (its name says it), and a
screening run's cell, search group and cell's seed."""


def cell_values(labels: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The values that make the cell of a run of these labels, as the tracking sinks show them: the labels that all
    of them agree on (a run that two tables ask for is in both), but `NOT_CELL`. A grid's values (lr=0.01), a
    budget multiple, a screening run's rung and candidate."""
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

    A run to be analysed keeps log-spaced checkpoints (`train`'s keep_checkpoints="log", which changes
    neither its results nor its id) and is analysed over them (`analyze_run`'s over_time), so the report
    can show when its heads form. Runs in a worker process (or a Slurm job): everything it needs comes
    as plain data, `config` as {"config": the resolved config, "request": the request it was resolved from};
    `logger` and `grouping` are `train`'s (the study's tracking sinks, and the run's place among them)."""
    if threads:
        torch.set_num_threads(threads)
    _distributed_job()
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
            resume = got == "started"
            tracking = Tracking(logger, grouping=grouping)
            train(cfg, run.path, resume=resume, progress=False, keep_checkpoints=keep, tracking=tracking)
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


def _distributed_job() -> None:
    """In a Slurm job of several tasks (one per GPU, submitit), export what torch.distributed reads
    (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT), so the run trains on all of them."""
    try:
        import submitit

        job = submitit.JobEnvironment()
    except (ImportError, RuntimeError):  # not a submitit job
        return
    if job.num_tasks > 1:
        submitit.helpers.TorchDistributedEnvironment().export()


def _local_pool(jobs: list[tuple[Any, ...]], pool: Pool, finished: Callable[[dict[str, Any]], None]) -> None:
    """Run `jobs` on a process pool of `pool.workers` spawned workers (`_start_worker`), each running `run_one`.

    Interrupted (Ctrl-C, or a SIGINT to this process alone), it stops its workers (`_stop_pool`) and drops
    the runs not started, rather than waiting for them: each run resumes from its last checkpoint next time."""
    executor = concurrent.futures.ProcessPoolExecutor(
        pool.workers,
        mp_context=multiprocessing.get_context("spawn"),
        initializer=_start_worker,
        initargs=(pool.threads,),
    )
    try:
        futures = [executor.submit(_run_in_worker, *job) for job in jobs]
        for future in concurrent.futures.as_completed(futures):
            finished(future.result())
    except BaseException:
        _stop_pool(executor)
        raise
    executor.shutdown(wait=True)


def _start_worker(threads: int) -> None:
    """Set up a worker of the local pool: its torch threads, mixit's warnings on one line (as the CLI's), its
    SIGINT ignored, and its end with the study.

    A Ctrl-C reaches every process of the terminal's group; a worker ignores it and the study stops it instead
    (`_stop_pool`), so a SIGINT to the study alone stops its workers too, and no worker is interrupted twice.
    A worker must never outlive its study (idle, holding its memory, and locking its run directory against the
    study's resume), however the study ends, a SIGKILL included: a daemon thread waits for the study's process
    to end (`multiprocessing.parent_process`, whose sentinel is a pipe the kernel closes when the study's process
    ends) and then ends the worker at once, which is safe at any moment (its run resumes from its checkpoint)."""
    torch.set_num_threads(threads)
    warnings.showwarning = functools.partial(show_warning, warnings.showwarning)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    study = multiprocessing.parent_process()
    if study is not None:  # always, in a spawned worker
        threading.Thread(target=_end_with, args=(study,), name="mixit-end-with-study", daemon=True).start()


def _end_with(study: multiprocessing.process.BaseProcess) -> None:
    """End this worker once the study's process has ended (`_start_worker`)."""
    study.join()
    os._exit(1)


def _run_in_worker(*job: Any) -> dict[str, Any]:
    """`run_one` in a worker of the local pool. A SIGTERM from the study (`_stop_pool`) during the run interrupts
    it as a Ctrl-C would, so it closes its files (`_interrupt`); outside a run (the worker idle, or handing an
    outcome back) a SIGTERM ends the worker at once, as by default: it has nothing to close, and an interrupt
    there would print the pool's traceback."""
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        return run_one(*job)
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _interrupt(signum: int, frame: Any) -> None:
    """A SIGTERM during a worker's run: a KeyboardInterrupt, once (a second SIGTERM ends the worker)."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    raise KeyboardInterrupt


def _stop_pool(executor: concurrent.futures.ProcessPoolExecutor, grace: float = 30.0) -> None:
    """Stop `executor`'s workers, which are this process's children: SIGTERM, which interrupts each one's run so
    it exits as after a Ctrl-C (`_run_in_worker`), then SIGKILL for one still there after `grace` s."""
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

SLURM_DEFAULTS: dict[str, tuple[Any, tuple[str, ...]]] = {
    "timeout_min": (240, ("timeout_min", "time")),
    "cpus_per_task": (2, ("cpus_per_task", "cpus_per_gpu")),
}
"""mixit's default for a parameter of the submitit jobs, and the keys that, given, replace it (submitit's own
defaults are a 5-minute limit, and Slurm's one CPU per task; Slurm refuses cpus_per_task beside cpus_per_gpu)."""

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
"""The parameters that are numbers (integers, but for mem_gb), each with its least value and what it counts. They
are read and checked here because submitit checks no range: a number below would reach Slurm, or submitit's local
executor, which would refuse it only once the study is written, or run jobs that end at once (submitit writes
under 1 MB as ``--mem=0MB``, which Slurm reads as all of a node's memory)."""

SLURM_SHAPES: dict[str, type] = {"setup": list, "teardown": list, "srun_args": list, "additional_parameters": dict}
"""The parameters that take more than one value: a list of lines or arguments, one ``--slurm KEY=ITEM`` per item
(submitit takes a list, even of one), or sbatch options, one ``--slurm KEY.NAME=VALUE`` each."""

SLURM_SHARED = "name timeout_min mem_gb nodes cpus_per_task gpus_per_node tasks_per_node stderr_to_stdout".split()
"""The parameters AutoExecutor shares between its clusters (as its update_parameters documents), passed as they are;
the others are the Slurm executor's own, which AutoExecutor takes with a ``slurm_`` prefix and the local one ignores.
tests/test_slurm.py checks this list, and the two above, against the installed submitit."""


def slurm_parameters(given: Mapping[str, Any]) -> dict[str, Any]:
    """The keyword arguments of submitit's AutoExecutor.update_parameters for a study's jobs, from `given`
    (``--slurm KEY=VALUE`` items, or a dict from Python), dashes read as underscores (as sbatch spells them).

    Each value is read as `_slurm_value` says, which refuses one of the wrong shape, a number that is not one or is
    out of range; whether a key exists, and the type of the rest, are submitit's to judge (`_submitit_executor`).
    Where `given` does not say: `SLURM_DEFAULTS`, and one task per GPU (tasks_per_node = gpus_per_node, or 1), so
    that each GPU trains one rank of the run (docs/scaling.md, "Slurm")."""
    params: dict[str, Any] = {}
    for raw, value in given.items():
        key = str(raw).replace("-", "_")
        check(key not in params, f"--slurm {key} is given twice (once as {raw!r})")
        params[key] = _slurm_value(key, value)
    for key, (default, given_by) in SLURM_DEFAULTS.items():
        if not params.keys() & set(given_by):
            params[key] = default
    if not params.keys() & {"tasks_per_node", "ntasks_per_node"}:
        params["tasks_per_node"] = params.get("gpus_per_node") or 1
    return {key if key in SLURM_SHARED else f"slurm_{key}": value for key, value in params.items()}


def _slurm_value(key: str, value: Any) -> Any:
    """The value of --slurm `key` for submitit: a list or a mapping where `SLURM_SHAPES` says so (from Python, or
    from repeated items), a number where `SLURM_NUMBERS` says so (read as its type by `typed`), checked against its
    least value; otherwise one value, true or false (any case) read as a bool, anything else passed as given."""
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
    """submitit's executor for a study's jobs, writing into `folder`, its parameters set from `slurm`
    (`slurm_parameters`). What submitit refuses in them, or warns of (an unknown key, a value of the wrong type,
    nodes above 1 on this machine, the deprecated num_gpus), raises UsageError with submitit's own first line."""
    import submitit  # there: `Pool.check_available`

    # The cluster is named, never detected: AutoExecutor's own choice falls back to this machine silently. The
    # local one takes the same parameters, and ignores those only Slurm has.
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
    jobs: list[tuple[Any, ...]],
    slurm: dict[str, Any],
    finished: Callable[[dict[str, Any]], None],
) -> None:
    """Run `jobs` as one submitit array job: on Slurm, or with submitit's local executor."""
    ex = _submitit_executor(executor, study_dir / "slurm", slurm)
    if not jobs:
        return
    pending = list(ex.map_array(run_one, *zip(*jobs)))
    while pending:
        for job in [j for j in pending if j.done()]:
            pending.remove(job)
            try:
                finished(job.result())
            except Exception as e:  # the job itself died (killed, out of time): the run is interrupted
                finished({"id": "?", "state": "failed", "error": " ".join(str(e).split())[:300]})
        time.sleep(1.0)
