"""Tracking sinks: a run's metrics.jsonl and summary, sent to TensorBoard, W&B, MLflow or trackio as well.

    mixit train --logger tensorboard,wandb ...     # any subset of `SINKS`; docs/tracking.md
    mixit reproduce --logger mlflow ...            # every run of the study, grouped under its name
    mixit export-logs RUN_OR_STUDY --to tensorboard  # the logs of runs trained without a sink

metrics.jsonl stays the record; a sink receives the same events, from rank 0 only, as points named
(`points`): the freeze report's numbers as freeze/<key> at step 0, each train event as train/loss,
train/lr and train/elapsed_s, each evaluation as test/<metric> and val/<metric>; and once the run is
done its summary (`summary_points`) as summary/test/<metric>, summary/val/<metric>, summary/n_params,
summary/n_trainable, summary/steps_trained, summary/converged and summary/stopped_early. The resolved
config goes with the run (W&B and trackio config, MLflow params, TensorBoard text and hparams), and so do its
name, project, group and tags (`Grouping`; the project and name a user chose, --tracking-project and
--tracking-name, are a `Naming`). Which sinks a session uses, and how it names the runs, changes no result: it
is no part of config.json or of a run id.

What a sink holds of a run is recorded in the run's tracking.json (`tracking_state`): for each sink, what
identifies the run there (W&B's id, MLflow's run id and tracking URI, trackio's project and name) and how
many of metrics.jsonl's events it has been sent, in order. A session sends each sink the events from that
count on, so that a resumed run sends no point twice: a sink the run is new to first gets every event
metrics.jsonl holds (as does `export_run`), and the events a resumed session computes again (those after
its checkpoint that the killed session had sent) are skipped, except by TensorBoard, which drops them
(SummaryWriter's purge_step) and takes them again. TensorBoard's writer is flushed after every event, so
that what it was sent is on disk.

Before any work, `check_sinks` refuses a sink that cannot work, in one line: its package missing, or its
settings (each writer's `check`): MLflow's tracking URI of a scheme MLflow does not know, or an http(s) server that
does not answer; W&B's WANDB_MODE not one of its modes; a local directory a sink writes (trackio's store, MLflow's
file or sqlite store, RUN/tensorboard/, RUN/wandb/) not writable. A sink that fails later (a network, a full disk)
is warned about once on stderr and sent nothing more in this session; training goes on, and the next session
sends it what it missed.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.metadata
import json
import os
import secrets
import socket
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Literal, Protocol, cast, get_args, get_origin

from mixit.checkpoint import is_count
from mixit.config import flatten
from mixit.errors import UsageError, require
from mixit.experiment import RunConfig
from mixit.files import check_output_dir, read_json, write_json
from mixit.run import LOCK, Run, is_number
from mixit.version import install_hint

Sink = Literal["tensorboard", "wandb", "mlflow", "trackio"]
"""A tracking sink, named as its package (and mixit's extra that installs it)."""

SINKS: tuple[str, ...] = get_args(Sink)

DEFAULT_PROJECT = "mixit"
"""W&B's and trackio's project, and MLflow's experiment, where nothing names one (each writer says what may)."""

NAME_MAX = 128
"""The longest project or run name a user may give: W&B's limit for a project."""

PROJECT_FORBIDDEN = "/\\#?%:"
"""What a project's name may not hold: the characters W&B refuses in one (trackio makes a file of it, which
takes no / either)."""


REACH_TIMEOUT_S = 2.5
"""How long an http(s) tracking server has to accept a connection before it is refused as unreachable."""


# -- the run's files of tracking: tracking.json and tensorboard/ ---------------------------------------


def tracking_path(run: Run) -> Path:
    """The run's tracking.json (module docstring)."""
    return run.path / "tracking.json"


def tracking_state(run: Run) -> dict[str, Any]:
    """tracking.json: per tracking sink, what identifies the run there and how many events it holds ({} if the run
    has been sent to none)."""
    path = tracking_path(run)
    if not path.exists():
        return {}
    data = read_json(path, path.name)
    if not isinstance(data, dict) or not all(isinstance(v, dict) and is_count(v.get("events")) for v in data.values()):
        raise UsageError(f"{path} is corrupt: not an object of sinks, each with its count of events")
    return data


def tensorboard_dir(run: Run) -> Path:
    """Where --logger tensorboard writes the run's event files."""
    return run.path / "tensorboard"


def tensorboard_events(run: Run) -> list[Path]:
    """The TensorBoard event files in the run's tensorboard/ directory."""
    directory = tensorboard_dir(run)
    return sorted(directory.glob("events.out.tfevents.*")) if directory.is_dir() else []  # TensorBoard's names


def check_sinks(names: Iterable[str], option: str = "--logger", run_dir: str | Path | None = None) -> tuple[Sink, ...]:
    """`names` (or one name) as sinks, each once, in order; refused before any work if one is unknown, its
    package is not installed (naming the command that installs it), or its settings cannot work (each writer's
    `check`: module docstring). `option` is the flag that named them, for the message; `run_dir`, the run they
    will write, whose own directories and tracking.json are checked too if it exists already."""
    chosen: list[Sink] = []
    for name in [names] if isinstance(names, str) else names:
        if name not in SINKS:
            raise UsageError(f"unknown {option} {name!r}; allowed: {', '.join(SINKS)}")
        if name in chosen:
            continue
        require(name, f"{option} {name} needs the {name} package: {install_hint(name)}")
        chosen.append(cast(Sink, name))
    run = Run(run_dir) if run_dir is not None else None
    if run is not None and run.state() == "absent":
        run = None  # a new run's directory is checked as it is made
    held = tracking_state(run) if run is not None and chosen else {}
    for name in chosen:
        try:
            WRITERS[name]().check(run, held.get(name))
        except UsageError as e:
            raise UsageError(f"{option} {name}: {e}") from None
    return tuple(chosen)


def check_writable(directory: Path, setting: str) -> None:
    """Refuse `directory`, where a sink writes, unless it is a directory (or creatable as one) and writable
    (`check_output_dir`), naming what sets it."""
    try:
        check_output_dir(directory)
    except UsageError as e:
        raise UsageError(f"{e}; {setting}") from None


def check_reachable(url: str, setting: str) -> None:
    """Refuse an http(s) server that does not accept a connection within REACH_TIMEOUT_S (through the proxy
    the environment names for it, if any), before a sink's library waits minutes on it."""
    parts = urllib.parse.urlsplit(url)
    proxy = urllib.request.getproxies().get(parts.scheme)
    if proxy and not urllib.request.proxy_bypass(parts.hostname or ""):
        parts = urllib.parse.urlsplit(proxy)  # the first hop
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
        if not parts.hostname:
            raise ValueError("no host")
        socket.create_connection((parts.hostname, port), timeout=REACH_TIMEOUT_S).close()
    except (OSError, ValueError) as e:
        reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e) or type(e).__name__
        raise UsageError(f"no server answers at {url} ({reason}); {setting}") from None


@dataclass(frozen=True)
class Naming:
    """The project and name a user gives the runs in the sinks (--tracking-project, --tracking-name); None: the
    defaults (docs/tracking.md, "Names and projects"). Checked at construction, before any work: a bad value is
    refused in one line naming the option."""

    project: str | None = None
    """W&B's project, MLflow's experiment, trackio's project (TensorBoard has none: noted in its tags text)."""
    name: str | None = None
    """A run's name; for a study, the prefix of each of its runs' names."""

    def __post_init__(self) -> None:
        for option, value, forbidden in (
            ("--tracking-project", self.project, PROJECT_FORBIDDEN),
            ("--tracking-name", self.name, ""),
        ):
            if value is None:
                continue
            if not isinstance(value, str):
                raise UsageError(f"{option} must be a string, got {value!r}")
            held = sorted({repr(c)[1:-1] for c in value if c in forbidden or not c.isprintable()})
            why = (
                f"it holds {' '.join(held)}" if held
                else "it is blank" if not value.strip()
                else f"it is {len(value)} characters long" if len(value) > NAME_MAX
                else None
            )  # fmt: skip
            if why is not None:
                refused = f", none of {' '.join(forbidden)}" if forbidden else ""
                raise UsageError(f"{option} {value!r}: {why}; give 1 to {NAME_MAX} printable characters{refused}")

    def check_sent(self, sinks: Sequence[Sink], option: str = "--logger") -> None:
        """Refuse a project or name given for runs that no sink receives (`option` names none): it would be
        accepted and do nothing."""
        options = (("--tracking-project", self.project), ("--tracking-name", self.name))
        given = [flag for flag, value in options if value]
        if given and not sinks:
            raise UsageError(
                f"{' and '.join(given)} name runs in a tracking sink, and {option} names none; "
                f"add {option} with one or more of {', '.join(SINKS)}, or leave {' and '.join(given)} out"
            )


@dataclass(frozen=True)
class Grouping:
    """How a run is named, grouped and tagged in the sinks; plain data, so that it travels to a study's workers."""

    name: str
    """The run's name: --tracking-name, else its directory's name (a study's run: `study_grouping`)."""
    group: str | None = None
    """The study it belongs to: W&B's and trackio's group, MLflow's tag study and its experiment (unless `project`
    is given); None for a run of its own."""
    tags: Mapping[str, str] = field(default_factory=dict)
    """task, variant and seed, and a study run's role (final or screen): MLflow's tags, W&B's as key=value."""
    project: str | None = None
    """--tracking-project: W&B's and trackio's project, MLflow's experiment; None: each sink's default."""


def run_grouping(run_dir: str | Path, cfg: RunConfig, naming: Naming = Naming()) -> Grouping:
    """A run of its own: named `naming.name`, else after its directory; tagged with its task, variant and seed."""
    return Grouping(naming.name or Path(run_dir).resolve().name, None, _tags(cfg), naming.project)


def study_grouping(study: str, run_id: str, cfg: RunConfig, role: str, naming: Naming = Naming()) -> Grouping:
    """A run of the study `study`, grouped under the study, tagged with its role too, and named readably first and
    unique by its id (after the prefix `naming.name`): addition-mixit-seed0-1a2b3c4d5e6f; a screening run (of the
    search's own seed) addition-mixit-screen-1a2b3c4d5e6f. Only the name changes: the run's directory is its id."""
    marked = "screen" if role == "screen" else f"seed{cfg.model.seed}"
    prefix = [naming.name] if naming.name else []
    name = "-".join([*prefix, cfg.task, cfg.variant, marked, run_id])
    return Grouping(name, study, {**_tags(cfg), "role": role}, naming.project)


def _tags(cfg: RunConfig) -> dict[str, str]:
    return {"task": cfg.task, "variant": cfg.variant, "seed": str(cfg.model.seed)}


def points(event: Mapping[str, Any]) -> dict[str, float]:
    """The numbers of a metrics.jsonl event, named as the sinks show them (module docstring): every number but
    the step, under the event's kind (freeze/, train/), an evaluation's under test/ and val/ (its val_ keys)."""
    kind = str(event.get("event", "event"))
    named = {}
    for key, value in event.items():
        if key in ("step", "event") or not is_number(value):
            continue
        if kind == "eval":
            split = "val" if key.startswith("val_") else "test"
            named[f"{split}/{key.removeprefix('val_')}"] = float(value)
        else:
            named[f"{kind}/{key}"] = float(value)
    return named


def summary_points(summary: Mapping[str, Any]) -> dict[str, float]:
    """The numbers of a run's summary.json that the sinks keep as its summary (module docstring)."""
    named = {f"summary/{split}/{k}": float(v) for split in ("test", "val") for k, v in summary.get(split, {}).items()}
    convergence = summary.get("convergence", {})
    counts: dict[str, Any] = {k: summary.get(k) for k in ("n_params", "n_trainable")}
    counts |= {k: convergence.get(k) for k in ("steps_trained", "converged", "stopped_early")}
    named.update({f"summary/{k}": float(v) for k, v in counts.items() if is_number(v) or isinstance(v, bool)})
    return named


# -- the sinks ----------------------------------------------------------------------------


Held = Mapping[str, Any] | None
"""tracking.json's record of a run in a sink; None where the sink holds none of it."""


class SinkWriter(Protocol):
    """What the tracker asks of a sink (one class per sink, in `WRITERS`, each deriving from this one)."""

    name: str
    purges: bool = False
    """It can drop the points it holds from a step on (`open`'s purge_step): TensorBoard."""

    def check(self, run: Run | None, held: Held) -> None:
        """Refuse (UsageError, one line naming the setting to change), before any work, settings with which the
        sink cannot work. `run`: the run it will write, if it exists already."""
        ...

    def open(self, run: Run, held: Held, grouping: Grouping, purge_step: int | None) -> dict[str, Any]:
        """Start the run in the sink, with its config, or continue it (`held`); with `purge_step`, drop the points
        it holds from that step on. Returns what identifies the run there, which tracking.json keeps for the next
        session."""
        ...

    def log(self, step: int, values: Mapping[str, float]) -> None:
        """Points at `step`."""
        ...

    def summary(self, step: int, values: Mapping[str, float]) -> None:
        """The run's summary; `step`: the steps trained. Unless the sink has a place of its own for it, points."""
        self.log(step, values)

    def close(self, completed: bool) -> None:
        """End this session of the run: `completed`, or stopped (interrupted, failed) to be resumed."""
        ...


class TensorBoard(SinkWriter):
    """Event files in RUN/tensorboard/ (`tensorboard_dir`): ``tensorboard --logdir runs/`` shows every run,
    named by its directory (TensorBoard has no run names and no projects: the name and project are noted in the
    tags text). The config and tags are text at step 0; the summary, scalars at the last step, beside the run's
    hparams (`hparams`) for the HParams tab."""

    name = "tensorboard"
    purges = True

    def check(self, run: Run | None, held: Held) -> None:
        if run is not None:  # a new run's directory is checked by the run itself
            check_writable(tensorboard_dir(run), "TensorBoard writes its event files there")

    def open(self, run: Run, held: Held, grouping: Grouping, purge_step: int | None) -> dict[str, Any]:
        from torch.utils.tensorboard import SummaryWriter

        if held is None and tensorboard_events(run):  # files of a session that died before it was recorded
            purge_step = 0
        self.writer = SummaryWriter(str(tensorboard_dir(run)), purge_step=purge_step)
        self.hparams = hparams(run.config.to_dict(), grouping)
        if held is None:
            config = json.dumps(run.config.to_dict(), indent=2).splitlines()
            self.writer.add_text("config", "\n".join("    " + line for line in config), 0)  # markdown: a code block
            named = {"name": grouping.name, "project": grouping.project, "group": grouping.group}
            about = {**{k: v for k, v in named.items() if v}, **grouping.tags}
            self.writer.add_text("tags", ", ".join(f"{k}={v}" for k, v in about.items()), 0)
        return {}

    def log(self, step: int, values: Mapping[str, float]) -> None:
        for key, value in values.items():
            self.writer.add_scalar(key, value, step)
        self.writer.flush()

    def summary(self, step: int, values: Mapping[str, float]) -> None:
        """The summary as scalars, then the run's hparams: TensorBoard's HParams tab shows each run's config
        beside the last value of each of its scalars (summary/...: its final metrics). The experiment summary
        that torch's `add_hparams` writes too is left out: TensorBoard takes one run's for every run, whose
        config keys may differ (another task's parameters); without it, it takes the union of every run's."""
        from torch.utils.tensorboard.summary import hparams as hparams_summaries

        self.log(step, values)
        events = self.writer.file_writer  # the run's event file, which `log` has just written to
        assert events is not None
        _, start, end = hparams_summaries(self.hparams, {})  # its metrics: the run's scalars
        for part in (start, end):
            events.add_summary(part, step)
        self.writer.flush()

    def close(self, completed: bool) -> None:
        self.writer.close()


class Wandb(SinkWriter):
    """A W&B run whose local files are in RUN/wandb/, resumed by its id (resume="allow"). Mode, entity and the
    rest come from W&B's own environment variables (WANDB_MODE=offline, WANDB_ENTITY, ...); the project from
    --tracking-project, else WANDB_PROJECT, else "mixit". Tags are key=value."""

    name = "wandb"

    def check(self, run: Run | None, held: Held) -> None:
        """WANDB_MODE, if set, one of the modes the installed W&B accepts; RUN/wandb/ writable (WANDB_DIR is not
        used: the run directory is given to `wandb.init`)."""
        mode = os.environ.get("WANDB_MODE")
        declared = getattr(importlib.import_module("wandb").Settings, "model_fields", {}).get("mode")  # pydantic's
        annotation = getattr(declared, "annotation", None)
        modes = get_args(annotation) if get_origin(annotation) is Literal else ()
        if mode is not None and modes and mode not in modes:
            raise UsageError(f"WANDB_MODE {mode!r} is not a W&B mode; set it to one of {', '.join(modes)}")
        if run is not None:
            check_writable(run.path / "wandb", "W&B keeps its local files there")

    def open(self, run: Run, held: Held, grouping: Grouping, purge_step: int | None) -> dict[str, Any]:
        wandb = importlib.import_module("wandb")
        run_id = held["id"] if held else secrets.token_hex(6)
        project = held["project"] if held else grouping.project or os.environ.get("WANDB_PROJECT") or DEFAULT_PROJECT
        self.run = wandb.init(
            id=run_id,
            project=project,
            dir=str(run.path),
            name=grouping.name,
            group=grouping.group,
            tags=[f"{k}={v}" for k, v in grouping.tags.items()],
            config=run.config.to_dict(),
            resume="allow",
            reinit="create_new",
        )
        return {"id": run_id, "project": project}

    def log(self, step: int, values: Mapping[str, float]) -> None:
        self.run.log(dict(values), step=step)

    def summary(self, step: int, values: Mapping[str, float]) -> None:
        self.run.summary.update(dict(values))

    def close(self, completed: bool) -> None:
        self.run.finish(exit_code=0 if completed else 1)


class Mlflow(SinkWriter):
    """An MLflow run, through MlflowClient (no active run is set): the tracking URI from MLFLOW_TRACKING_URI or
    MLflow's default (recorded, so that a resumed run goes on in the same store), the experiment
    --tracking-project, else the study's name, else MLFLOW_EXPERIMENT_NAME, else "mixit"; the config as params
    (dotted paths), the tags as tags (and a study's run tagged study=NAME)."""

    name = "mlflow"
    MAX_BATCH = 100
    """The most params MLflow takes in one log_batch."""

    def check(self, run: Run | None, held: Held) -> None:
        """The tracking URI of a scheme MLflow knows; an http(s) server answering; a local store's directory
        writable. The URI is MLFLOW_TRACKING_URI's (or MLflow's default), or for a run MLflow holds already, the
        one tracking.json records (`open` continues the run there)."""
        uri = importlib.import_module("mlflow").get_tracking_uri()
        recorded = None
        if held and run is not None and "tracking_uri" in held:
            uri = held["tracking_uri"]
            recorded = f"{tracking_path(run)} records it for the MLflow run this run continues; or leave out mlflow"
        scheme, known = _mlflow_scheme(uri)
        if scheme not in known:
            allowed = "a path or a URI of " + ", ".join(f"{s}:" for s in known if s)
            fix = f"{recorded}; allowed: {allowed}" if recorded else f"set MLFLOW_TRACKING_URI to {allowed}"
            raise UsageError(f"tracking URI {uri!r} has a scheme MLflow does not know; {fix}")
        if scheme in ("http", "https"):
            check_reachable(uri, recorded or "start the MLflow server, or set MLFLOW_TRACKING_URI to one that answers")
        elif scheme in ("", "file", "sqlite") and uri not in ("databricks", "databricks-uc", "uc"):  # on this machine
            fix = recorded or "set MLFLOW_TRACKING_URI to a writable place"
            check_writable(_mlflow_store_dir(uri, scheme), f"MLflow keeps its store there: {fix}")

    def open(self, run: Run, held: Held, grouping: Grouping, purge_step: int | None) -> dict[str, Any]:
        mlflow = importlib.import_module("mlflow")
        uri = held["tracking_uri"] if held else mlflow.get_tracking_uri()
        self.client = mlflow.tracking.MlflowClient(uri)
        if held:
            self.run_id = held["run_id"]
            self.client.update_run(self.run_id, status="RUNNING")
        else:
            name = grouping.project or grouping.group or os.environ.get("MLFLOW_EXPERIMENT_NAME") or DEFAULT_PROJECT
            tags = {**grouping.tags, **({"study": grouping.group} if grouping.group else {})}
            self.run_id = self.client.create_run(self._experiment(name), run_name=grouping.name, tags=tags).info.run_id
            flat = flatten(run.config.to_dict(), keep_empty=True).items()  # a string as it is, any other value as JSON
            params = [mlflow.entities.Param(k, v if isinstance(v, str) else json.dumps(v)) for k, v in flat]
            for i in range(0, len(params), self.MAX_BATCH):
                self.client.log_batch(self.run_id, params=params[i : i + self.MAX_BATCH])
        return {"run_id": self.run_id, "tracking_uri": uri}

    def _experiment(self, name: str) -> str:
        """The id of the experiment `name`, made if there is none. Two runs of a study, in two workers, may both
        find none and make it: the second to make it takes the first's."""
        refused = importlib.import_module("mlflow").exceptions.MlflowException
        found = self.client.get_experiment_by_name(name)
        if found is None:
            try:
                return cast(str, self.client.create_experiment(name))
            except refused:
                found = self.client.get_experiment_by_name(name)
                if found is None:
                    raise
        return cast(str, found.experiment_id)

    def log(self, step: int, values: Mapping[str, float]) -> None:
        metric = importlib.import_module("mlflow").entities.Metric
        now = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[metric(k, v, now, step) for k, v in values.items()])

    def close(self, completed: bool) -> None:
        self.client.set_terminated(self.run_id, status="FINISHED" if completed else "KILLED")


class Trackio(SinkWriter):
    """A trackio run in trackio's local store (TRACKIO_DIR, by default ~/.cache/huggingface/trackio; `trackio show`
    opens it), project --tracking-project, else "mixit", grouped by study; continued by its name (resume="allow").
    trackio has no tags; its config holds the task, variant and seed. What trackio prints goes to stderr."""

    name = "trackio"

    def check(self, run: Run | None, held: Held) -> None:
        """trackio's store writable: where the imported trackio keeps it (it reads TRACKIO_DIR when imported)."""
        store = getattr(importlib.import_module("trackio.utils"), "TRACKIO_DIR", None)
        if store is not None:
            check_writable(Path(store), "trackio keeps its store there; set TRACKIO_DIR to a writable directory")

    def open(self, run: Run, held: Held, grouping: Grouping, purge_step: int | None) -> dict[str, Any]:
        trackio = importlib.import_module("trackio")
        project, name = (
            (held["project"], held["name"]) if held else (grouping.project or DEFAULT_PROJECT, grouping.name)
        )
        with contextlib.redirect_stdout(sys.stderr):
            self.run = trackio.init(
                project=project,
                name=name,
                group=grouping.group,
                config=run.config.to_dict(),
                resume="allow" if held else "never",
                embed=False,
                auto_log_cpu=False,
                auto_log_gpu=False,
            )
        return {"project": project, "name": name}

    def log(self, step: int, values: Mapping[str, float]) -> None:
        self.run.log(dict(values), step=step)

    def close(self, completed: bool) -> None:
        with contextlib.redirect_stdout(sys.stderr):
            importlib.import_module("trackio").finish()  # the current run, ours (`trackio.init` made it so)


WRITERS: dict[str, Callable[[], SinkWriter]] = {writer.name: writer for writer in (TensorBoard, Wandb, Mlflow, Trackio)}


def _mlflow_scheme(uri: str) -> tuple[str, list[str]]:
    """(the scheme of `uri` as MLflow reads it: "" for a path, a database's dialect without its driver; the schemes
    the installed MLflow accepts: a path, file:, its databases, http(s):, databricks:, plugins')."""
    engines = importlib.import_module("mlflow.store.db.db_types").DATABASE_ENGINES
    plugins = [e.name for e in importlib.metadata.entry_points(group="mlflow.tracking_store")]
    known = ["", "file", *engines, "http", "https", "databricks", *plugins]
    try:
        scheme = str(importlib.import_module("mlflow.utils.uri").get_uri_scheme(uri))
    except Exception:  # a database dialect MLflow does not know
        scheme = urllib.parse.urlsplit(uri).scheme
    return scheme, known


def _mlflow_store_dir(uri: str, scheme: str) -> Path:
    """The directory a local MLflow store is written in: a path's, a file: URI's, a sqlite database's own."""
    if scheme == "file":
        return Path(urllib.request.url2pathname(urllib.parse.urlsplit(uri).path))
    if scheme == "sqlite":  # sqlite:///relative.db, sqlite:////absolute.db
        return Path(uri.partition(":///")[2].partition("?")[0] or "mlflow.db").parent
    return Path(uri)


def hparams(config: Mapping[str, Any], grouping: Grouping) -> dict[str, Any]:
    """A run's hyperparameters as TensorBoard's HParams tab compares them: its config flattened (task, variant,
    model.d_model, train.lr, task_params.n_digits, ...; a number, string or bool as it is, null left out, a list
    as JSON), and a study's run's study and role."""
    values = {
        k: v if v is None or isinstance(v, (str, int, float)) else json.dumps(v)
        for k, v in flatten(config, keep_empty=True).items()
    }
    study = {"study": grouping.group, "role": grouping.tags.get("role")} if grouping.group else {}
    return {k: v for k, v in {**values, **study}.items() if v is not None}


# -- the tracker ----------------------------------------------------------------------------


class Tracker:
    """A run's sinks in one session: each sent, in order, the events of metrics.jsonl it does not hold yet
    (module docstring), then the summary. A failing sink is warned about once and dropped (`_guard`).

        tracker = Tracker.open(run, ("tensorboard",), grouping, run.metrics())
        tracker.write(event)          # after metrics.jsonl got it
        tracker.close(summary)        # the summary (None: the run stopped before it) and the end of the session
    """

    def __init__(self, run: Run, state: dict[str, Any], events: int):
        self.run = run
        self.state = state
        """tracking.json: per sink, what identifies the run there and the number of events it holds."""
        self.events = events
        """The number of events of metrics.jsonl."""
        self.writers: dict[str, SinkWriter] = {}
        self.failed: list[str] = []

    @classmethod
    def open(cls, run: Run, sinks: Sequence[Sink], grouping: Grouping, kept: Sequence[dict[str, Any]]) -> Tracker:
        """Open `sinks` for `run`, whose metrics.jsonl holds the events `kept`, and send each what it lacks of them.
        The caller holds the run's lock."""
        tracker = cls(run, tracking_state(run), len(kept))
        for name in sinks:
            tracker._open(WRITERS[name](), grouping, kept)
        write_json(tracking_path(run), tracker.state)
        return tracker

    def _open(self, writer: SinkWriter, grouping: Grouping, kept: Sequence[dict[str, Any]]) -> None:
        name, held = writer.name, self.state.get(writer.name)
        count = min(held["events"], len(kept)) if held else 0
        purge_step = None
        if held and writer.purges and held["events"] > len(kept):  # points of steps after the resumed checkpoint
            purge_step = kept[-1]["step"] + 1 if kept else 0
        ids = self._guard(name, partial(writer.open, self.run, held, grouping, purge_step))
        if ids is None:
            return
        self.writers[name] = writer
        # A sink that holds events beyond those kept (and cannot drop them) skips them when they come again.
        self.state[name] = {**ids, "events": held["events"] if held and purge_step is None else count}
        for i in range(count, len(kept)):
            self._send(name, i, kept[i])

    def write(self, event: dict[str, Any]) -> None:
        """Send metrics.jsonl's next event (already written there) to every sink that does not hold it."""
        index = self.events
        self.events += 1
        sent = [self._send(name, index, event) for name in list(self.writers)]  # to every sink: no short circuit
        if any(sent):
            write_json(tracking_path(self.run), self.state)

    def _send(self, name: str, index: int, event: Mapping[str, Any]) -> bool:
        """Send event number `index` to sink `name` unless it holds it; whether it was sent."""
        if index < self.state[name]["events"]:
            return False
        if self._guard(name, partial(self.writers[name].log, int(event["step"]), points(event))) is None:
            return False
        self.state[name]["events"] = index + 1
        return True

    def close(self, summary: Mapping[str, Any] | None) -> None:
        """Send `summary` (None: the session stopped before the run was done) and end the session in every sink."""
        for name, writer in list(self.writers.items()):
            if summary is not None:
                step = int(summary.get("convergence", {}).get("steps_trained") or summary.get("steps") or 0)
                self._guard(name, partial(writer.summary, step, summary_points(summary)))
            if name in self.writers:  # not dropped by a failure just now
                self._guard(name, partial(writer.close, summary is not None))
        self.writers.clear()

    def _guard(self, name: str, call: Callable[[], Any]) -> Any:
        """`call`'s result (True for None), or None if it raised: then warn once on stderr and drop sink `name`."""
        try:
            result = call()
        except Exception as e:  # any failure of a sink's library (network, disk, its own bugs) is the sink's
            message = " ".join(str(e).split()) or type(e).__name__
            print(
                f"mixit: warning: the {name} logger failed ({type(e).__name__}: {message[:300]}); nothing more goes "
                f"to it in this session (metrics.jsonl holds every event)",
                file=sys.stderr,
                flush=True,
            )
            self.writers.pop(name, None)
            self.failed.append(name)
            return None
        return True if result is None else result


# -- export-logs ----------------------------------------------------------------------------


def check_export(run: Run, sinks: Sequence[Sink]) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
    """Refuse to export `run` to `sinks` before anything is written: if a sink already holds its logs
    (tracking.json records it, or RUN/tensorboard holds event files: they are never overwritten), if a sink cannot
    write the run (`check_sinks`), if its metrics.jsonl or summary.json is damaged, or if another process holds
    the run. Returns its events and summary, as read here."""
    state = tracking_state(run)
    for name in sinks:
        if name == "tensorboard" and tensorboard_events(run):
            raise UsageError(
                f"{tensorboard_dir(run)} already holds event files; export-logs never overwrites them "
                f"(remove the directory to export again)"
            )
        if name in state:
            raise UsageError(f"{run.path} has been sent to {name} already ({tracking_path(run)}); it is sent once")
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
    """Send `run`'s `events` and `summary` (as `check_export` read them) to `sinks`, as training with them would
    have: for runs trained without. Returns the sinks that failed (each warned about on stderr)."""
    run.acquire()
    try:
        tracker = Tracker.open(run, sinks, grouping, events)
        tracker.close(summary)
    finally:
        run.release()
    return tracker.failed
