"""Tracking sinks (docs/tracking.md): a run's metrics.jsonl and summary projected onto TensorBoard, W&B, MLflow or
trackio through accelerate's trackers.

metrics.jsonl is the record. tracking.json remembers each sink of a run and what identifies the run there, written
before the sink holds anything; each session reads back from every sink what it holds and sends it the rest
(`Feed`), so that every point reaches a sink once across kills.
"""

from __future__ import annotations

import abc
import contextlib
import importlib
import importlib.metadata
import json
import os
import secrets
import socket
import struct
import sys
import urllib.parse
import urllib.request
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, cast, get_args

from mixit.core.config import flatten
from mixit.core.experiment import RunConfig
from mixit.core.run import LOCK, Run, is_number
from mixit.core.training.loop import OpenFeed
from mixit.errors import UsageError, one_line, require
from mixit.files import check_output_dir, read_json, write_json
from mixit.version import install_hint

Sink = Literal["tensorboard", "wandb", "mlflow", "trackio"]
"""A tracking sink, named as its package (and mixit's extra that installs it)."""

SINKS: tuple[str, ...] = get_args(Sink)

DEFAULT_PROJECT = "mixit"  # the W&B and trackio project, and the MLflow experiment, where nothing names one
NAME_MAX = 128  # the longest project or run name a user may give: W&B's limit for a project
PROJECT_FORBIDDEN = "/\\#?%:"  # what W&B refuses in a project's name (trackio makes a file of it: no / either)
REACH_TIMEOUT_S = 2.5  # seconds an http(s) tracking server has to accept a connection


def tracking_state(run: Run) -> dict[str, dict[str, Any]]:
    """tracking.json: for each sink the run remembers, what identifies the run there ({} if it has none)."""
    path = run.path / "tracking.json"
    data = read_json(path, path.name) if path.exists() else {}
    if not isinstance(data, dict) or not all(k in SINKS and isinstance(v, dict) for k, v in data.items()):
        raise UsageError(f"{path} is corrupt: not an object of sinks ({', '.join(SINKS)}), each an object")
    return data


# -- checks before any work -----------------------------------------------------------------------


def check_sinks(names: Iterable[str], option: str = "--logger", run_dir: str | Path | None = None) -> tuple[Sink, ...]:
    """`names` (or one name) as sinks, each once, in order; refused in one line if one is unknown, lacks its package
    (or accelerate) or cannot work (its kind's `check`). `option`: the flag that named them; `run_dir`: the run
    they will write, whose own directories and tracking.json are checked too if it exists."""
    chosen: list[Sink] = []
    for name in [names] if isinstance(names, str) else names:
        if name not in SINKS:
            raise UsageError(f"unknown {option} {name!r}; allowed: {', '.join(SINKS)}")
        if name not in chosen:
            for package in (name, "accelerate"):
                require(package, f"{option} {name} needs the {package} package: {install_hint(name)}")
            chosen.append(cast(Sink, name))
    run = None if run_dir is None or Run(run_dir).state() == "absent" else Run(run_dir)  # a new run: checked as made
    held = tracking_state(run) if run is not None else {}
    for name in chosen:
        try:
            KINDS[name].check(run, held.get(name))
        except UsageError as e:
            raise UsageError(f"{option} {name}: {e}") from None
    return tuple(chosen)


def check_writable(directory: Path, setting: str) -> None:
    """Refuse `directory`, where a sink writes, unless it is (or can be made) a writable directory."""
    try:
        check_output_dir(directory)
    except UsageError as e:
        raise UsageError(f"{e}; {setting}") from None


def check_reachable(url: str, setting: str) -> None:
    """Refuse an http(s) server that does not accept a connection within REACH_TIMEOUT_S (through the environment's
    proxy for it, if any), before a sink's library retries it for minutes."""
    parts = urllib.parse.urlsplit(url)
    proxy = urllib.request.getproxies().get(parts.scheme)
    if proxy and not urllib.request.proxy_bypass(parts.hostname or ""):
        parts = urllib.parse.urlsplit(proxy)  # the first hop
    try:
        if not parts.hostname:
            raise ValueError("no host")
        port = parts.port or (443 if parts.scheme == "https" else 80)
        socket.create_connection((parts.hostname, port), timeout=REACH_TIMEOUT_S).close()
    except (OSError, ValueError) as e:
        reason = getattr(e, "strerror", None) or str(e) or type(e).__name__
        raise UsageError(f"no server answers at {url} ({reason}); {setting}") from None


# -- names, groups and tags -------------------------------------------------------------------------


@dataclass(frozen=True)
class Naming:
    """--tracking-project and --tracking-name (None: the defaults of docs/tracking.md, "Names and projects"); a bad
    value is refused at construction, in one line."""

    project: str | None = None
    name: str | None = None  # a run's name; for a study, the prefix of each of its runs' names

    def __post_init__(self) -> None:
        for option, value, forbidden in (
            ("--tracking-project", self.project, PROJECT_FORBIDDEN),
            ("--tracking-name", self.name, ""),
        ):
            if value is None:
                continue
            held = sorted({repr(c)[1:-1] for c in str(value) if c in forbidden or not c.isprintable()})
            why = (
                "it is not a string" if not isinstance(value, str)
                else f"it holds {' '.join(held)}" if held
                else "it is blank" if not value.strip()
                else f"it is {len(value)} characters long" if len(value) > NAME_MAX
                else None
            )  # fmt: skip
            if why is not None:
                refused = f", none of {' '.join(forbidden)}" if forbidden else ""
                raise UsageError(f"{option} {value!r}: {why}; give 1 to {NAME_MAX} printable characters{refused}")

    def check_sent(self, sinks: Sequence[Sink], option: str = "--logger") -> None:
        """Refuse a project or name given for runs that no sink receives: it would be accepted and do nothing."""
        given = " and ".join(f for f, v in (("--tracking-project", self.project), ("--tracking-name", self.name)) if v)
        if given and not sinks:
            raise UsageError(
                f"{given} name runs in a tracking sink, and {option} names none; "
                f"add {option} with one or more of {', '.join(SINKS)}, or leave {given} out"
            )


@dataclass(frozen=True)
class Grouping:
    """How the sinks name, group and tag a run (docs/tracking.md); plain data, so that it travels to a study's
    workers."""

    name: str
    group: str | None = None  # the study: W&B's and trackio's group, MLflow's tag study
    tags: Mapping[str, str] = field(default_factory=dict)  # MLflow's tags, W&B's as key=value
    project: str | None = None  # --tracking-project; None: each sink's default


def run_grouping(run_dir: str | Path, cfg: RunConfig, naming: Naming = Naming()) -> Grouping:
    """A run of its own: named `naming.name`, else after its directory; tagged with its task, variant and seed."""
    return Grouping(naming.name or Path(run_dir).resolve().name, None, _tags(cfg), naming.project)


def study_grouping(
    study: str, run_id: str, cfg: RunConfig, role: str, naming: Naming = Naming(), cell: Mapping[str, Any] | None = None
) -> Grouping:
    """A run of `study`, grouped under it, named (after the prefix `naming.name`) readably and then by its id, and
    tagged with its role and its cell's values beyond task and variant: addition-mixit-lr=0.01-seed0-1a2b3c4d5e6f,
    a screening run addition-mixit-rung=0-lr=0.01-screen-1a2b3c4d5e6f."""
    tags = _tags(cfg)
    shown = {k: v if isinstance(v, str) else json.dumps(v) for k, v in (cell or {}).items() if k not in tags}
    marked = "screen" if role == "screen" else f"seed{cfg.model.seed}"
    prefix = [naming.name] if naming.name else []
    name = "-".join([*prefix, cfg.task, cfg.variant, *(f"{k}={v}" for k, v in shown.items()), marked, run_id])
    return Grouping(name, study, {**shown, **tags, "role": role}, naming.project)


def _tags(cfg: RunConfig) -> dict[str, str]:
    return {"task": cfg.task, "variant": cfg.variant, "seed": str(cfg.model.seed)}


def points(event: Mapping[str, Any]) -> dict[str, float]:
    """The numbers of a metrics.jsonl event but its step, named as the sinks show them: under the event's kind
    (freeze/, train/), an evaluation's under test/ and val/ (its val_ keys)."""
    kind, named = str(event.get("event", "event")), {}
    for key, value in event.items():
        if key in ("step", "event") or not is_number(value):
            continue
        if kind == "eval":  # val_loss: val/loss, exact_match: test/exact_match
            named[f"val/{key[4:]}" if key.startswith("val_") else f"test/{key}"] = float(value)
        else:
            named[f"{kind}/{key}"] = float(value)
    return named


def summary_points(summary: Mapping[str, Any]) -> dict[str, float]:
    """The numbers of a run's summary.json that the sinks keep as its summary (docs/tracking.md)."""
    named = {f"summary/{split}/{k}": float(v) for split in ("test", "val") for k, v in summary.get(split, {}).items()}
    convergence = summary.get("convergence", {})
    counts: dict[str, Any] = {k: summary.get(k) for k in ("n_params", "n_trainable")}
    counts |= {k: convergence.get(k) for k in ("steps_trained", "converged", "stopped_early")}
    return named | {f"summary/{k}": float(v) for k, v in counts.items() if is_number(v) or isinstance(v, bool)}


# -- the sinks, on accelerate's trackers ------------------------------------------------------------


class SinkKind(abc.ABC):
    """One sink in one session: the accelerate tracker that writes it, and what mixit adds: its check, what
    identifies the run there, and the points (name, step) it holds, read back as the session starts."""

    held: Collection[tuple[str, int]] = ()

    @staticmethod
    @abc.abstractmethod
    def check(run: Run | None, held: Mapping[str, Any] | None) -> None:
        """Refuse, in one line naming what to set, settings the sink cannot work with. `run`: the run it will write,
        if it exists already; `held`: tracking.json's record of the run in the sink (None: the run is new to it)."""

    def new_ids(self, grouping: Grouping) -> dict[str, Any]:
        """What identifies a run new to the sink, recorded before it starts (a session killed at once goes on
        with the same run)."""
        return {}

    @abc.abstractmethod
    def start(self, run: Run, ids: dict[str, Any], grouping: Grouping, resumed: bool) -> None:
        """Start (`resumed`: continue) the run `ids` names in the sink, with its config, and read back what it holds
        (MLflow adds its run id to `ids`)."""

    def holds(self, name: str, step: int) -> bool:
        return (name, step) in self.held

    def log(self, step: int, values: Mapping[str, float]) -> None:
        self.tracker.log(dict(values), step=step)

    def summary(self, step: int, values: Mapping[str, float]) -> None:
        """The run's summary at `step`, the steps trained: as points, unless the sink keeps summaries apart."""
        self.log(step, values)

    def finish(self, completed: bool) -> None:
        """End this session: `completed`, or stopped (interrupted, failed) to be resumed."""
        self.tracker.finish()

    def _start(self, tracker: Any) -> None:
        tracker.main_process_only = False  # mixit calls the sinks on rank 0 only
        tracker.start()
        self.tracker = tracker


class TensorBoard(SinkKind):
    """Event files in RUN/tensorboard/, written whole again by each session (nothing is read back). TensorBoard
    names a run by its directory and has no projects: name, project, group and tags are a text at step 0."""

    @staticmethod
    def check(run: Run | None, held: Mapping[str, Any] | None) -> None:
        if run is not None:  # a new run's directory is checked by the run itself
            check_writable(run.path / "tensorboard", "TensorBoard writes its event files there")

    def start(self, run: Run, ids: dict[str, Any], grouping: Grouping, resumed: bool) -> None:
        from accelerate.tracking import TensorBoardTracker

        for path in (run.path / "tensorboard").glob("events.out.tfevents.*"):  # an earlier session's projection
            path.unlink()
        self._start(TensorBoardTracker("tensorboard", run.path))
        config = run.config.to_dict()
        about = {"name": grouping.name, "project": grouping.project, "group": grouping.group, **grouping.tags}
        tags = ", ".join(f"{k}={v}" for k, v in about.items() if v)
        code = "\n".join("    " + line for line in json.dumps(config, indent=2).splitlines())  # markdown: code
        self.tracker.log({"config": code, "tags": tags}, step=0)
        # The HParams tab's values: the config flattened (a list as JSON, null left out), a study's run's study, role.
        study = {"study": grouping.group, "role": grouping.tags.get("role")} if grouping.group else {}
        values = {**flatten(config, keep_empty=True), **study}.items()
        self.hparams = {k: v if isinstance(v, (str, int, float)) else json.dumps(v) for k, v in values if v is not None}

    def summary(self, step: int, values: Mapping[str, float]) -> None:
        """The summary as scalars, then the hparams as a session of TensorBoard's hparams plugin in the run's own
        event file. Not accelerate's store_init_configuration (torch's add_hparams): it writes a second event file,
        shown as a run of its own, and an experiment summary that gives every run one run's config keys."""
        from torch.utils.tensorboard.summary import hparams

        self.log(step, values)
        _, start, end = hparams(self.hparams, {})
        for part in (start, end):
            self.tracker.writer.file_writer.add_summary(part, step)
        self.tracker.writer.flush()


class Wandb(SinkKind):
    """A W&B run with its local files in RUN/wandb/, resumed by its id; mode, entity and the rest from W&B's own
    environment variables. W&B takes a run's history in order of step, so it holds every point before a step:
    online, the step the server resumes the run at; offline, the step after the last row of its files."""

    @staticmethod
    def check(run: Run | None, held: Mapping[str, Any] | None) -> None:
        mode = os.environ.get("WANDB_MODE")
        modes = get_args(importlib.import_module("wandb").Settings.model_fields["mode"].annotation)
        if mode is not None and mode not in modes:
            raise UsageError(f"WANDB_MODE {mode!r} is not a W&B mode; set it to one of {', '.join(modes)}")
        if run is not None:  # WANDB_DIR is not used
            check_writable(run.path / "wandb", "W&B keeps its local files there")

    def new_ids(self, grouping: Grouping) -> dict[str, Any]:
        project = grouping.project or os.environ.get("WANDB_PROJECT") or DEFAULT_PROJECT
        return {"id": secrets.token_hex(6), "project": project}

    def start(self, run: Run, ids: dict[str, Any], grouping: Grouping, resumed: bool) -> None:
        from accelerate.tracking import WandBTracker

        tags = [f"{k}={v}" for k, v in grouping.tags.items()]
        self._start(
            WandBTracker(
                ids["project"], id=ids["id"], dir=str(run.path), name=grouping.name, group=grouping.group, tags=tags,
                config=run.config.to_dict(), resume="allow", reinit="create_new",
            )
        )  # fmt: skip
        started = self.tracker.run
        if started.offline:  # every session's files
            files = (run.path / "wandb").glob(f"offline-run-*-{started.id}/run-{started.id}.wandb")
            self.following = max((step + 1 for path in files for step in wandb_rows(path)), default=0)
        else:
            self.following = started.starting_step

    def holds(self, name: str, step: int) -> bool:
        return step < self.following

    def summary(self, step: int, values: Mapping[str, float]) -> None:
        self.tracker.run.summary.update(dict(values))

    def finish(self, completed: bool) -> None:
        self.tracker.run.finish(exit_code=0 if completed else 1)  # accelerate's finish() marks every run a success


def wandb_rows(path: Path) -> list[int]:
    """The step of every history row of a W&B .wandb file, up to a record torn by a kill (wandb 0.31 ships no Python
    reader of them). LevelDB's log format: a 7-byte file header, then 32 KiB blocks of chunks, each with a 7-byte
    header (crc32c, length, type: 1 a whole record, 2 its first chunk, 3 a middle one, 4 its last); a block's tail
    too short for a header is padding."""
    block, records = 32768, importlib.import_module("wandb.proto.wandb_internal_pb2")
    data, pos, chunk, steps = path.read_bytes(), 7, b"", []
    while pos + 7 <= len(data):
        if block - pos % block < 7:
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if kind == 0 or pos + 7 + length > len(data):  # unwritten, or torn
            break
        chunk, pos = chunk + data[pos + 7 : pos + 7 + length], pos + 7 + length
        if kind in (1, 4):
            record = records.Record.FromString(chunk)
            if record.WhichOneof("record_type") == "history":
                steps.append(record.history.step.num)
            chunk = b""
    return steps


class Mlflow(SinkKind):
    """An MLflow run, MLflow's active run for the session, in the store of MLFLOW_TRACKING_URI or MLflow's default
    (recorded, so that a resumed run goes on there); the config as params (dotted paths)."""

    @staticmethod
    def check(run: Run | None, held: Mapping[str, Any] | None) -> None:
        """A tracking URI of a scheme MLflow knows; an http(s) server answering; a local store writable."""
        uri, setting = importlib.import_module("mlflow").get_tracking_uri(), "MLFLOW_TRACKING_URI"
        if held and "tracking_uri" in held and run is not None:  # a run MLflow holds goes on in its store
            uri, setting = held["tracking_uri"], f"tracking_uri in {run.path / 'tracking.json'} (this run's MLflow run)"
        engines = importlib.import_module("mlflow.store.db.db_types").DATABASE_ENGINES
        plugins = [e.name for e in importlib.metadata.entry_points(group="mlflow.tracking_store")]
        known = ["file", *engines, "http", "https", "databricks", *plugins]
        scheme = urllib.parse.urlsplit(uri).scheme.partition("+")[0]  # a database's dialect, without its driver
        if scheme and scheme not in known:
            allowed = ", ".join(f"{s}:" for s in known)
            raise UsageError(
                f"tracking URI {uri!r} has a scheme MLflow does not know; set {setting} to a path or a URI of {allowed}"
            )
        if scheme in ("http", "https"):
            check_reachable(uri, f"start the MLflow server, or set {setting} to one that answers")
        elif scheme in ("", "file", "sqlite") and uri not in ("databricks", "databricks-uc", "uc"):  # on this machine
            if scheme == "sqlite":  # sqlite:///relative.db, sqlite:////absolute.db: the database's directory
                store = Path(uri.partition(":///")[2].partition("?")[0] or "mlflow.db").parent
            else:  # a path, or a file: URI
                store = Path(importlib.import_module("mlflow.utils.file_utils").local_file_uri_to_path(uri))
            check_writable(store, f"MLflow keeps its store there: set {setting} to a writable place")

    def new_ids(self, grouping: Grouping) -> dict[str, Any]:
        return {"tracking_uri": importlib.import_module("mlflow").get_tracking_uri()}

    def start(self, run: Run, ids: dict[str, Any], grouping: Grouping, resumed: bool) -> None:
        from accelerate.tracking import MLflowTracker

        mlflow = importlib.import_module("mlflow")
        if ids["tracking_uri"] != mlflow.get_tracking_uri():  # a resumed run, in another store than MLflow uses now
            mlflow.set_tracking_uri(ids["tracking_uri"])  # for the rest of the process: MLflow's fluent API reads it
        experiment = os.environ.get("MLFLOW_EXPERIMENT_NAME") or grouping.project or grouping.group or DEFAULT_PROJECT
        # Made here, not by accelerate's start: MLflow's own takes the experiment a study's other worker made
        # at the same moment, where accelerate's fails.
        mlflow.set_experiment(experiment)
        tags = {**grouping.tags, **({"study": grouping.group} if grouping.group else {})}
        self._start(MLflowTracker(experiment, run_id=ids.get("run_id"), tags=tags, run_name=grouping.name))
        if "run_id" not in ids:  # a string as it is, any other value as JSON
            flat = flatten(run.config.to_dict(), keep_empty=True).items()
            self.tracker.store_init_configuration({k: v if isinstance(v, str) else json.dumps(v) for k, v in flat})
        ids["run_id"] = run_id = self.tracker.active_run.info.run_id
        client = mlflow.tracking.MlflowClient(ids["tracking_uri"])
        names = client.get_run(run_id).data.metrics
        self.held = {(k, m.step) for k in names for m in client.get_metric_history(run_id, k)}

    def finish(self, completed: bool) -> None:
        importlib.import_module("mlflow").end_run("FINISHED" if completed else "KILLED")  # accelerate's: FINISHED


class Trackio(SinkKind):
    """A trackio run in trackio's local store (TRACKIO_DIR), grouped by study, continued by its name; trackio has
    no tags (its config holds the task, variant and seed). What trackio prints goes to stderr."""

    @staticmethod
    def check(run: Run | None, held: Mapping[str, Any] | None) -> None:
        store = Path(importlib.import_module("trackio.utils").TRACKIO_DIR)  # trackio read TRACKIO_DIR when imported
        check_writable(store, "trackio keeps its store there; set TRACKIO_DIR to a writable directory")

    def new_ids(self, grouping: Grouping) -> dict[str, Any]:
        return {"project": grouping.project or DEFAULT_PROJECT, "name": grouping.name}

    def start(self, run: Run, ids: dict[str, Any], grouping: Grouping, resumed: bool) -> None:
        from accelerate.tracking import TrackioTracker

        tracker = TrackioTracker(
            ids["project"], name=ids["name"], group=grouping.group, config=run.config.to_dict(),
            resume="allow" if resumed else "never", embed=False, auto_log_cpu=False, auto_log_gpu=False,
        )  # fmt: skip
        with contextlib.redirect_stdout(sys.stderr):
            self._start(tracker)
        rows = importlib.import_module("trackio.sqlite_storage").SQLiteStorage.get_logs(ids["project"], ids["name"])
        self.held = {(k, row["step"]) for row in rows for k in row if k not in ("step", "timestamp")}

    def finish(self, completed: bool) -> None:
        """trackio's own finish, not accelerate's: that one leaves the run trackio's current run, which trackio
        finishes again as the process exits, printing on stdout."""
        with contextlib.redirect_stdout(sys.stderr):
            importlib.import_module("trackio").finish()


KINDS: dict[str, type[SinkKind]] = {"tensorboard": TensorBoard, "wandb": Wandb, "mlflow": Mlflow, "trackio": Trackio}


# -- the feed: metrics.jsonl's records, projected onto the sinks --------------------------------------


class Feed:
    """A run's sinks in one session, opened once the caller holds the run's lock and metrics.jsonl holds the events
    `kept`: each sink is sent the points it lacks, of `kept` and then of each event `write` is given, and at
    `close` the summary. A failing sink is warned about once and dropped (`_guard`)."""

    def __init__(self, run: Run, sinks: Sequence[Sink], grouping: Grouping, kept: Sequence[Mapping[str, Any]]) -> None:
        importlib.import_module("accelerate").PartialState()  # accelerate's trackers log through its process state
        self.sinks: dict[str, SinkKind] = {}
        self.failed: list[str] = []
        state, path = tracking_state(run), run.path / "tracking.json"
        for name in sinks:
            kind, held = KINDS[name](), state.get(name)
            state[name] = dict(held) if held is not None else kind.new_ids(grouping)
            write_json(path, state)  # before the sink holds anything of the run
            with self._guard(name):
                kind.start(run, state[name], grouping, held is not None)
                write_json(path, state)  # with MLflow's run id
                self.sinks[name] = kind
        for event in kept:
            self.write(event)

    def write(self, event: Mapping[str, Any]) -> None:
        """Send the points of `event` (metrics.jsonl has it) that each sink lacks."""
        step, values = int(event["step"]), points(event)
        for name, kind in list(self.sinks.items()):
            lacking = {k: v for k, v in values.items() if not kind.holds(k, step)}
            if lacking:
                with self._guard(name):
                    kind.log(step, lacking)

    def close(self, summary: Mapping[str, Any] | None) -> None:
        """Send `summary` (None: the session stopped before the run was done) and end the session in every sink."""
        for name, kind in list(self.sinks.items()):
            with self._guard(name):
                if summary is not None:
                    step = int(summary.get("convergence", {}).get("steps_trained") or summary.get("steps") or 0)
                    kind.summary(step, {k: v for k, v in summary_points(summary).items() if not kind.holds(k, step)})
                kind.finish(summary is not None)
        self.sinks.clear()

    @contextlib.contextmanager
    def _guard(self, name: str) -> Iterator[None]:
        try:
            yield
        except Exception as e:  # any failure of a sink's library (network, disk, its own bugs) is the sink's
            message = (one_line(e) or type(e).__name__)[:300]
            print(
                f"mixit: warning: the {name} logger failed ({type(e).__name__}: {message}); nothing more goes to it in "
                "this session (metrics.jsonl holds every event; the next session sends it what it lacks)",
                file=sys.stderr,
                flush=True,
            )
            self.sinks.pop(name, None)
            self.failed.append(name)


@dataclass(frozen=True)
class Tracking:
    """A training session's tracking sinks and the names they give its run: `train`'s `tracking` (the loop's
    `Tracker`), and ``mixit train``'s --logger, --tracking-project and --tracking-name (its fields but grouping).
    Plain data, so that it travels to a study's workers."""

    logger: Sequence[Sink] = ()
    """Tracking sinks sent every event of metrics.jsonl and the summary: any of tensorboard, wandb, mlflow and
    trackio (docs/tracking.md); a resumed run goes on in those its tracking.json remembers as well."""
    tracking_project: str | None = None
    """The W&B project, MLflow experiment and trackio project of the run (TensorBoard has none); null means
    WANDB_PROJECT for W&B and MLFLOW_EXPERIMENT_NAME for MLflow if set, else mixit."""
    tracking_name: str | None = None
    """The run's name in the tracking sinks; null means its directory's name."""
    grouping: Grouping | None = None
    """How the sinks name, group and tag the run; a study sets it for its runs. Default: as the fields above say,
    tagged with its task, variant and seed (`run_grouping`)."""

    def feeder(self, run_dir: Path, cfg: RunConfig, resume: bool) -> OpenFeed | None:
        """Checked before any work: the session's sinks (`logger`, and on resume those the run remembers), refused
        in one line if one cannot work, or if a project or name is given and no sink receives the run. None if
        there are none, else how to open the feed of the locked run given the events metrics.jsonl keeps."""
        naming = Naming(self.tracking_project, self.tracking_name)
        run = Run(run_dir)
        remembered = tracking_state(run) if resume and run.state() != "absent" else {}
        sinks = check_sinks([*remembered, *self.logger], run_dir=run_dir if resume else None)
        naming.check_sent(sinks)
        if not sinks:
            return None
        grouping = self.grouping or run_grouping(run_dir, cfg, naming)
        return lambda run, kept: Feed(run, sinks, grouping, kept)


# -- export-logs ----------------------------------------------------------------------------


def check_export(run: Run, sinks: Sequence[Sink]) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
    """Refuse to export `run` to `sinks`, before anything is written, if a sink cannot write it, if its
    metrics.jsonl, summary.json or tracking.json is damaged, or if another process holds it. Returns its events
    and summary, as read here."""
    check_sinks(sinks, "--to", run.path)
    logs = run.metrics(), run.summary()
    if (run.path / LOCK).exists():  # no lock file: no process holds the run (and none is made here)
        run.acquire(stamp=False)
        run.release()
    return logs


def export_run(
    run: Run,
    sinks: Sequence[Sink],
    grouping: Grouping,
    events: Sequence[dict[str, Any]],
    summary: Mapping[str, Any] | None,
) -> list[str]:
    """Send `run`'s `events` and `summary` (as `check_export` read them) to `sinks`, each what it lacks, as training
    with them would have. Returns the sinks that failed (each warned about on stderr)."""
    run.acquire()
    try:
        feed = Feed(run, sinks, grouping, events)
        feed.close(summary)
    finally:
        run.release()
    return feed.failed
