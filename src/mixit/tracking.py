"""Tracking sinks: a run's metrics.jsonl and summary, projected onto TensorBoard, W&B, MLflow or trackio.

    mixit train --logger tensorboard,wandb ...     # any subset of `SINKS`; docs/tracking.md
    mixit reproduce --logger mlflow ...            # every run of the study, grouped under its name
    mixit export-logs RUN_OR_STUDY --to tensorboard  # a run trained without a sink, or a sink left short

metrics.jsonl is the run's record; a sink is a projection of it, written through accelerate's trackers
(`accelerate.tracking`: one class per sink behind start, store_init_configuration, log and finish). A sink is sent
the same events, from rank 0 only, as points named by `points`: the freeze report's numbers as freeze/<key> at
step 0, each train event as train/loss, train/lr and train/elapsed_s, each evaluation as test/<metric> and
val/<metric>; and once the run is done its summary (`summary_points`) as summary/test/<metric>, summary/val/<metric>,
summary/n_params, summary/n_trainable, summary/steps_trained, summary/converged and summary/stopped_early. The
resolved config goes with the run, and so do its name, project, group and tags (`Grouping`; the project and name a
user chose, --tracking-project and --tracking-name, are a `Naming`). Which sinks a session uses, and how it names
the runs, changes no result: it is no part of config.json or of a run id.

Every point exactly once, across kills: the run's tracking.json (`tracking_state`) remembers its sinks and what
identifies the run in each (W&B's id and project, MLflow's run id and tracking URI, trackio's project and name),
written before the sink is sent a point. A session opens every sink the run remembers and those it is given
(`run_sinks`), asks each what it holds already (`SinkKind.holds`: read back from the sink itself, never counted by
mixit), and sends it the points of metrics.jsonl it lacks, then the new ones as metrics.jsonl gets them
(`Feed`). metrics.jsonl, cut back to the checkpoint a resumed session starts from, is the source; a point the sink
holds from a killed session's steps after that checkpoint is kept and not sent again (resumption is exact: the same
numbers, but for the wall time train/elapsed_s). TensorBoard's event files are a projection mixit rewrites whole
at each session's start.

Before any work, `check_sinks` refuses a sink that cannot work, in one line: its package missing, or its settings
(each kind's `check`): MLflow's tracking URI of a scheme MLflow does not know, or an http(s) server that does not
answer; W&B's WANDB_MODE not one of its modes; a local directory a sink writes (trackio's store, MLflow's file or
sqlite store, RUN/tensorboard/, RUN/wandb/) not writable. A sink that fails later (a network, a full disk) is warned
about once on stderr and sent nothing more in this session; training goes on, and the next session (or
`mixit export-logs`) sends it what it lacks.
"""

from __future__ import annotations

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
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, cast, get_args, get_origin

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
"""W&B's and trackio's project, and MLflow's experiment, where nothing names one (each kind says what may)."""

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


def tracking_state(run: Run) -> dict[str, dict[str, Any]]:
    """tracking.json: per sink the run remembers, what identifies the run there ({} if it has none)."""
    path = tracking_path(run)
    if not path.exists():
        return {}
    data = read_json(path, path.name)
    if not isinstance(data, dict) or not all(k in SINKS and isinstance(v, dict) for k, v in data.items()):
        raise UsageError(f"{path} is corrupt: not an object of sinks ({', '.join(SINKS)}), each an object")
    return data


def tensorboard_dir(run: Run) -> Path:
    """Where --logger tensorboard writes the run's event files."""
    return run.path / "tensorboard"


def tensorboard_events(run: Run) -> list[Path]:
    """The TensorBoard event files in the run's tensorboard/ directory."""
    directory = tensorboard_dir(run)
    return sorted(directory.glob("events.out.tfevents.*")) if directory.is_dir() else []  # TensorBoard's names


# -- checks before any work -----------------------------------------------------------------------


def run_sinks(names: Iterable[str], run_dir: str | Path) -> list[str]:
    """The sinks a resumed run goes to: those its tracking.json remembers, then `names`."""
    run = Run(run_dir)
    return [*(tracking_state(run) if run.state() != "absent" else {}), *names]


def check_sinks(names: Iterable[str], option: str = "--logger", run_dir: str | Path | None = None) -> tuple[Sink, ...]:
    """`names` (or one name) as sinks, each once, in order; refused before any work if one is unknown, its
    package (or accelerate, which drives it) is not installed (naming the command that installs it), or its
    settings cannot work (each kind's `check`: module docstring). `option` is the flag that named them, for the
    message; `run_dir`, the run they will write, whose own directories and tracking.json are checked too if it
    exists already."""
    chosen: list[Sink] = []
    for name in [names] if isinstance(names, str) else names:
        if name not in SINKS:
            raise UsageError(f"unknown {option} {name!r}; allowed: {', '.join(SINKS)}")
        if name in chosen:
            continue
        require(name, f"{option} {name} needs the {name} package: {install_hint(name)}")
        require("accelerate", f"{option} {name} needs the accelerate package: {install_hint(name)}")
        chosen.append(cast(Sink, name))
    run = Run(run_dir) if run_dir is not None else None
    if run is not None and run.state() == "absent":
        run = None  # a new run's directory is checked as it is made
    held = tracking_state(run) if run is not None and chosen else {}
    for name in chosen:
        try:
            KINDS[name].check(run, held.get(name))
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
    """task, variant and seed, and a study run's role (final or screen) and cell (`study_grouping`): MLflow's tags,
    W&B's as key=value."""
    project: str | None = None
    """--tracking-project: W&B's and trackio's project, MLflow's experiment; None: each sink's default."""


def run_grouping(run_dir: str | Path, cfg: RunConfig, naming: Naming = Naming()) -> Grouping:
    """A run of its own: named `naming.name`, else after its directory; tagged with its task, variant and seed."""
    return Grouping(naming.name or Path(run_dir).resolve().name, None, _tags(cfg), naming.project)


def study_grouping(
    study: str, run_id: str, cfg: RunConfig, role: str, naming: Naming = Naming(), cell: Mapping[str, Any] | None = None
) -> Grouping:
    """A run of the study `study`, grouped under the study, named readably first and unique by its id (after the
    prefix `naming.name`), and tagged with its role and the values that make its cell (`cell`: a grid's, such as
    lr=0.01; task, variant and seed are its tags already): addition-mixit-lr=0.01-seed0-1a2b3c4d5e6f; a screening
    run (of the search's own seed) addition-mixit-rung=0-lr=0.01-screen-1a2b3c4d5e6f. Only the name changes: the
    run's directory is its id."""
    tags = _tags(cfg)
    shown = {k: v if isinstance(v, str) else json.dumps(v) for k, v in (cell or {}).items() if k not in tags}
    marked = "screen" if role == "screen" else f"seed{cfg.model.seed}"
    prefix = [naming.name] if naming.name else []
    name = "-".join([*prefix, cfg.task, cfg.variant, *(f"{k}={v}" for k, v in shown.items()), marked, run_id])
    return Grouping(name, study, {**shown, **tags, "role": role}, naming.project)


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


# -- the sinks, on accelerate's trackers ------------------------------------------------------------


Held = Mapping[str, Any] | None
"""tracking.json's record of a run in a sink; None where the run is new to the sink."""

Holds = Callable[[str, int], bool]
"""Whether a sink holds the point (name, step) already (`SinkKind.holds`)."""


class SinkKind:
    """One sink in one session: the accelerate tracker that writes it (`start`), and what mixit adds around it:
    its checks, what identifies the run there, and reading back what it holds. One subclass per sink, in `KINDS`."""

    name: str

    @staticmethod
    def check(run: Run | None, held: Held) -> None:
        """Refuse (UsageError, one line naming the setting to change), before any work, settings with which the
        sink cannot work. `run`: the run it will write, if it exists already."""

    def identify(self, held: Held, grouping: Grouping) -> dict[str, Any]:
        """What identifies the run in the sink, as far as it is known before the sink is started: tracking.json
        records it first, so that a session killed at once continues the same run."""
        return dict(held or {})

    def start(self, run: Run, ids: Mapping[str, Any], grouping: Grouping, resumed: bool) -> dict[str, Any]:
        """Start the run in the sink (`resumed`: continue the one `ids` names), with its config; returns `ids`
        completed (MLflow's run id is known once the run exists)."""
        raise NotImplementedError

    def holds(self) -> Holds:
        """What the started sink holds of the run already, read back from it."""
        return lambda name, step: False

    def log(self, step: int, values: Mapping[str, float]) -> None:
        """Points at `step`."""
        self.tracker.log(dict(values), step=step)

    def summary(self, step: int, values: Mapping[str, float]) -> None:
        """The run's summary; `step`: the steps trained. Unless the sink has a place of its own for it, points."""
        self.log(step, values)

    def finish(self, completed: bool) -> None:
        """End this session of the run: `completed`, or stopped (interrupted, failed) to be resumed."""
        self.tracker.finish()

    def _started(self, tracker: Any) -> None:
        # mixit calls sinks on rank 0 only, so accelerate is told not to look up its own process state.
        tracker.main_process_only = False
        tracker.start()
        self.tracker = tracker


class TensorBoard(SinkKind):
    """Event files in RUN/tensorboard/ (`tensorboard_dir`), rewritten whole at each session's start, so that they
    hold what metrics.jsonl holds: ``tensorboard --logdir runs/`` shows every run, named by its directory
    (TensorBoard has no run names and no projects: the name and project are noted in the tags text). The config
    and tags are text at step 0; the summary, scalars at the last step, beside the run's hparams (`hparams`)."""

    name = "tensorboard"

    @staticmethod
    def check(run: Run | None, held: Held) -> None:
        if run is not None:  # a new run's directory is checked by the run itself
            check_writable(tensorboard_dir(run), "TensorBoard writes its event files there")

    def start(self, run: Run, ids: Mapping[str, Any], grouping: Grouping, resumed: bool) -> dict[str, Any]:
        from accelerate.tracking import TensorBoardTracker

        for path in tensorboard_events(run):  # an earlier session's projection: written again from metrics.jsonl
            path.unlink()
        self._started(TensorBoardTracker(tensorboard_dir(run).name, run.path))
        self.hparams = hparams(run.config.to_dict(), grouping)
        config = json.dumps(run.config.to_dict(), indent=2).splitlines()
        named = {"name": grouping.name, "project": grouping.project, "group": grouping.group}
        about = {**{k: v for k, v in named.items() if v}, **grouping.tags}
        texts = {"config": "\n".join("    " + line for line in config)}  # markdown: a code block
        self.tracker.log({**texts, "tags": ", ".join(f"{k}={v}" for k, v in about.items())}, step=0)
        return {}

    def summary(self, step: int, values: Mapping[str, float]) -> None:
        """The summary as scalars, then the run's hparams as a session of TensorBoard's hparams plugin, in the
        run's own event file: the HParams tab shows each run's config beside the last value of each of its scalars
        (summary/...: its final metrics). accelerate's store_init_configuration (torch's add_hparams) is not used:
        it writes a second event file in a directory of its own, which TensorBoard shows as a run of its own,
        and an experiment summary, which makes TensorBoard take one run's config keys for every run."""
        from torch.utils.tensorboard.summary import hparams as hparams_summaries

        self.log(step, values)
        events = self.tracker.writer.file_writer
        _, start, end = hparams_summaries(self.hparams, {})  # its metrics: the run's scalars
        for part in (start, end):
            events.add_summary(part, step)
        self.tracker.writer.flush()


class Wandb(SinkKind):
    """A W&B run whose local files are in RUN/wandb/, resumed by its id (resume="allow"). Mode, entity and the
    rest come from W&B's own environment variables (WANDB_MODE=offline, WANDB_ENTITY, ...); the project from
    --tracking-project, else WANDB_PROJECT, else "mixit". Tags are key=value. W&B takes a run's history in order of
    step, so what it holds is every point before a step: online, the step the server resumes the run at; offline,
    the step after the last row of the run's offline files in RUN/wandb/ (`wandb_rows`)."""

    name = "wandb"

    @staticmethod
    def check(run: Run | None, held: Held) -> None:
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

    def identify(self, held: Held, grouping: Grouping) -> dict[str, Any]:
        project = grouping.project or os.environ.get("WANDB_PROJECT") or DEFAULT_PROJECT
        return dict(held) if held else {"id": secrets.token_hex(6), "project": project}

    def start(self, run: Run, ids: Mapping[str, Any], grouping: Grouping, resumed: bool) -> dict[str, Any]:
        from accelerate.tracking import WandBTracker

        self.files = run.path / "wandb"
        tags = [f"{k}={v}" for k, v in grouping.tags.items()]
        config = run.config.to_dict()
        tracker = WandBTracker(
            ids["project"], id=ids["id"], dir=str(run.path), name=grouping.name, group=grouping.group, tags=tags,
            config=config, resume="allow", reinit="create_new",
        )  # fmt: skip
        self._started(tracker)
        return dict(ids)

    def holds(self) -> Holds:
        run = self.tracker.run
        if run.offline:
            files = self.files.glob(f"offline-run-*-{run.id}/run-{run.id}.wandb")  # every session's
            following = max((step + 1 for path in files for step in wandb_rows(path)), default=0)
        else:
            following = run.starting_step  # the server's: the step after its last row
        return lambda name, step: step < following

    def summary(self, step: int, values: Mapping[str, float]) -> None:
        self.tracker.run.summary.update(dict(values))

    def finish(self, completed: bool) -> None:
        self.tracker.run.finish(exit_code=0 if completed else 1)  # accelerate's finish() marks every run a success


WANDB_BLOCK = 32768
"""The block size of W&B's .wandb file (the LevelDB log format, after a 7-byte header of its own)."""


def wandb_rows(path: Path) -> list[int]:
    """The step of every history row of a W&B .wandb file, in order, up to the first record torn by a kill. Written
    here because wandb (0.31) ships no Python reader of its files: wandb-core reads them, in Go. Each record is
    one or more chunks, each with a 7-byte header (crc32c, length, type: 1 whole, 2 first, 3 middle, 4 last);
    a block's tail too short for a header is padding."""
    records = importlib.import_module("wandb.proto.wandb_internal_pb2")
    data, pos, chunk, steps = path.read_bytes(), 7, b"", []
    while pos + 7 <= len(data):
        if WANDB_BLOCK - pos % WANDB_BLOCK < 7:
            pos += WANDB_BLOCK - pos % WANDB_BLOCK
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
    """An MLflow run, through accelerate's MLflowTracker (the run is MLflow's active run for the session): the
    tracking URI from MLFLOW_TRACKING_URI or MLflow's default (recorded, so that a resumed run goes on in the same
    store), the experiment MLFLOW_EXPERIMENT_NAME (accelerate gives it the last word), else --tracking-project,
    else the study's name, else "mixit"; the config as params (dotted paths), the tags as tags (and a study's run
    tagged study=NAME). What it holds: its metrics' histories (MlflowClient.get_metric_history)."""

    name = "mlflow"

    @staticmethod
    def check(run: Run | None, held: Held) -> None:
        """The tracking URI of a scheme MLflow knows; an http(s) server answering; a local store's directory
        writable. The URI is MLFLOW_TRACKING_URI's (or MLflow's default), or for a run MLflow holds already, the
        one tracking.json records (the run goes on there)."""
        uri = importlib.import_module("mlflow").get_tracking_uri()
        recorded = None
        if held and run is not None and "tracking_uri" in held:
            uri = held["tracking_uri"]
            recorded = f"{tracking_path(run)} records it for the MLflow run this run continues"
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

    def identify(self, held: Held, grouping: Grouping) -> dict[str, Any]:
        return dict(held) if held else {"tracking_uri": importlib.import_module("mlflow").get_tracking_uri()}

    def start(self, run: Run, ids: Mapping[str, Any], grouping: Grouping, resumed: bool) -> dict[str, Any]:
        from accelerate.tracking import MLflowTracker

        mlflow = importlib.import_module("mlflow")
        mlflow.set_tracking_uri(ids["tracking_uri"])
        self.client = mlflow.tracking.MlflowClient(ids["tracking_uri"])
        name = os.environ.get("MLFLOW_EXPERIMENT_NAME") or grouping.project or grouping.group or DEFAULT_PROJECT
        _experiment(self.client, name)
        tags = {**grouping.tags, **({"study": grouping.group} if grouping.group else {})}
        self._started(MLflowTracker(name, run_id=ids.get("run_id"), tags=tags, run_name=grouping.name))
        if "run_id" not in ids:  # a string as it is, any other value as JSON
            flat = flatten(run.config.to_dict(), keep_empty=True).items()
            self.tracker.store_init_configuration({k: v if isinstance(v, str) else json.dumps(v) for k, v in flat})
        self.run_id = self.tracker.active_run.info.run_id
        return {**ids, "run_id": self.run_id}

    def holds(self) -> Holds:
        names = self.client.get_run(self.run_id).data.metrics
        held = {(k, m.step) for k in names for m in self.client.get_metric_history(self.run_id, k)}
        return lambda name, step: (name, step) in held

    def finish(self, completed: bool) -> None:
        importlib.import_module("mlflow").end_run("FINISHED" if completed else "KILLED")  # accelerate's: FINISHED


def _experiment(client: Any, name: str) -> None:
    """Make MLflow's experiment `name` unless it exists. Kept beside accelerate's MLflowTracker, which makes it too:
    two runs of a study, in two workers, may both find none and make it, and there the second to make it takes
    the first's, where accelerate's start fails."""
    refused = importlib.import_module("mlflow").exceptions.MlflowException
    if client.get_experiment_by_name(name) is None:
        try:
            client.create_experiment(name)
        except refused:
            if client.get_experiment_by_name(name) is None:
                raise


class Trackio(SinkKind):
    """A trackio run in trackio's local store (TRACKIO_DIR, by default ~/.cache/huggingface/trackio; `trackio show`
    opens it), project --tracking-project, else "mixit", grouped by study; continued by its name (resume="allow").
    trackio has no tags; its config holds the task, variant and seed. What trackio prints goes to stderr. What it
    holds: its store's rows of the run (trackio's SQLiteStorage.get_logs, which its dashboard reads)."""

    name = "trackio"

    @staticmethod
    def check(run: Run | None, held: Held) -> None:
        """trackio's store writable: where the imported trackio keeps it (it reads TRACKIO_DIR when imported)."""
        store = getattr(importlib.import_module("trackio.utils"), "TRACKIO_DIR", None)
        if store is not None:
            check_writable(Path(store), "trackio keeps its store there; set TRACKIO_DIR to a writable directory")

    def identify(self, held: Held, grouping: Grouping) -> dict[str, Any]:
        return dict(held) if held else {"project": grouping.project or DEFAULT_PROJECT, "name": grouping.name}

    def start(self, run: Run, ids: Mapping[str, Any], grouping: Grouping, resumed: bool) -> dict[str, Any]:
        from accelerate.tracking import TrackioTracker

        self.ids = dict(ids)
        tracker = TrackioTracker(
            ids["project"], name=ids["name"], group=grouping.group, config=run.config.to_dict(),
            resume="allow" if resumed else "never", embed=False, auto_log_cpu=False, auto_log_gpu=False,
        )  # fmt: skip
        with contextlib.redirect_stdout(sys.stderr):
            self._started(tracker)
        return self.ids

    def holds(self) -> Holds:
        rows = importlib.import_module("trackio.sqlite_storage").SQLiteStorage.get_logs(
            self.ids["project"], self.ids["name"]
        )
        held = {(k, row["step"]) for row in rows for k in row if k not in ("step", "timestamp")}
        return lambda name, step: (name, step) in held

    def finish(self, completed: bool) -> None:
        """trackio's own finish, not accelerate's (the run's): that one leaves the run trackio's current run, which
        trackio finishes again as the process exits, printing on stdout."""
        with contextlib.redirect_stdout(sys.stderr):
            importlib.import_module("trackio").finish()


KINDS: dict[str, type[SinkKind]] = {kind.name: kind for kind in (TensorBoard, Wandb, Mlflow, Trackio)}


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


# -- the feed: metrics.jsonl's records, projected onto the sinks --------------------------------------


class Feed:
    """A run's sinks in one session, fed from metrics.jsonl's records: each is sent every point it does not hold
    (module docstring), then the summary. A failing sink is warned about once and dropped (`_guard`).

        feed = Feed.open(run, ("tensorboard",), grouping, run.metrics())
        feed.write(event)          # after metrics.jsonl got it
        feed.close(summary)        # the summary (None: the run stopped before it) and the end of the session
    """

    def __init__(self) -> None:
        self.sinks: dict[str, tuple[SinkKind, Holds]] = {}
        self.failed: list[str] = []

    @classmethod
    def open(cls, run: Run, sinks: Sequence[Sink], grouping: Grouping, kept: Sequence[Mapping[str, Any]]) -> Feed:
        """Open `sinks` for `run`, whose metrics.jsonl holds the events `kept`, and send each what it lacks of them.
        The caller holds the run's lock."""
        importlib.import_module("accelerate").PartialState()  # accelerate's trackers log through its process state
        feed, state = cls(), tracking_state(run)
        for name in sinks:
            kind, held = KINDS[name](), state.get(name)
            state[name] = kind.identify(held, grouping)
            write_json(tracking_path(run), state)  # before the sink holds anything of the run
            ids = feed._guard(name, kind.start, run, state[name], grouping, held is not None)
            if ids is None:
                continue
            if ids != state[name]:
                state[name] = ids
                write_json(tracking_path(run), state)
            holds = feed._guard(name, kind.holds)
            if holds is not None:
                feed.sinks[name] = (kind, holds)
        for event in kept:
            feed.write(event)
        return feed

    def write(self, event: Mapping[str, Any]) -> None:
        """Send the points of `event` (metrics.jsonl has it) that each sink does not hold."""
        step = int(event["step"])
        for name, (kind, holds) in list(self.sinks.items()):
            values = {k: v for k, v in points(event).items() if not holds(k, step)}
            if values:
                self._guard(name, kind.log, step, values)

    def close(self, summary: Mapping[str, Any] | None) -> None:
        """Send `summary` (None: the session stopped before the run was done) and end the session in every sink."""
        for name, (kind, holds) in list(self.sinks.items()):
            if summary is not None:
                step = int(summary.get("convergence", {}).get("steps_trained") or summary.get("steps") or 0)
                values = {k: v for k, v in summary_points(summary).items() if not holds(k, step)}
                self._guard(name, kind.summary, step, values)
            if name in self.sinks:  # not dropped by a failure just now
                self._guard(name, kind.finish, summary is not None)
        self.sinks.clear()

    def _guard(self, name: str, call: Callable[..., Any], *args: Any) -> Any:
        """`call(*args)`'s result (True for None), or None if it raised: then warn once on stderr and drop sink
        `name`."""
        try:
            result = call(*args)
        except Exception as e:  # any failure of a sink's library (network, disk, its own bugs) is the sink's
            message = " ".join(str(e).split()) or type(e).__name__
            print(
                f"mixit: warning: the {name} logger failed ({type(e).__name__}: {message[:300]}); nothing more goes "
                f"to it in this session (metrics.jsonl holds every event; the next session sends it what it lacks)",
                file=sys.stderr,
                flush=True,
            )
            self.sinks.pop(name, None)
            self.failed.append(name)
            return None
        return True if result is None else result


def feeder(
    run_dir: str | Path,
    cfg: RunConfig,
    logger: Sequence[str],
    resume: bool,
    naming: Naming,
    grouping: Grouping | None,
) -> Callable[[Run, Sequence[Mapping[str, Any]]], Feed] | None:
    """What `train` asks of tracking, checked before any work: the sinks of the session (`logger`, and on resume
    those the run remembers), refused in one line if one cannot work or if `naming` names runs no sink receives;
    None if there are none, else how to open the feed of the locked run once metrics.jsonl holds the events
    kept. `grouping`: how the sinks name the run (default `run_grouping`)."""
    sinks = check_sinks(run_sinks(logger, run_dir) if resume else logger, run_dir=run_dir if resume else None)
    naming.check_sent(sinks)
    if not sinks:
        return None
    grouped = grouping or run_grouping(run_dir, cfg, naming)
    return lambda run, kept: Feed.open(run, sinks, grouped, kept)


# -- export-logs ----------------------------------------------------------------------------


def check_export(run: Run, sinks: Sequence[Sink]) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
    """Refuse to export `run` to `sinks` before anything is written: if a sink cannot write the run
    (`check_sinks`), if its metrics.jsonl, summary.json or tracking.json is damaged, or if another process holds
    the run. Returns its events and summary, as read here."""
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
    """Send `run`'s `events` and `summary` (as `check_export` read them) to `sinks`, each what it lacks of them, as
    training with them would have: for runs trained without, or a sink left short. Returns the sinks that failed
    (each warned about on stderr)."""
    run.acquire()
    try:
        feed = Feed.open(run, sinks, grouping, events)
        feed.close(summary)
    finally:
        run.release()
    return feed.failed
