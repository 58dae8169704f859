"""`mixit <command>`: train, eval, sample, analyze, signal, bench, litmus, reproduce, report, export, list.

This module only parses and dispatches. Every option is generated from the
one place it is declared, with its type, default and docstring, by
`mixit.flags` (whose docstring gives its rules, spellings and words of --help):
the parameters of the library function a command calls (`command`), and for
``mixit train`` the fields of `RunConfig`, `ModelConfig` and `TrainConfig` and a
task's Config. jsonargparse parses each value by its type hint (see
docs/design.md, "Configuration", for why it was chosen over tyro).

Bad input (an unknown task, a value out of range, a run directory holding
another run, a corrupt checkpoint) is refused before any work with one line on
stderr naming the problem and what is allowed, and exit status 2; a value of
the wrong type is said with the option's type as --help names it
(``train.steps: expected int, got 'ten'``). A fault of
the machine (a full disk, no permission, ...: `mixit.errors.machine_fault`) is
one line too: exit status 2 when a check finds it before any work, 1 once work
is under way, with what continues the work (docs/reliability.md, "Faults of the
machine").
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import shlex
import sys
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any

from jsonargparse import ArgumentError

from mixit.analysis.evaluation import evaluate_run
from mixit.analysis.report import analyze_run
from mixit.analysis.signal import format_signal, signal_command
from mixit.bench import bench_command, format_profiles, format_table
from mixit.catalogue import catalogue_text
from mixit.config import DataConfig, ModelConfig, TrainConfig
from mixit.distributed import BadEnvironment, Dist, env_world, fault_said, refusal_said
from mixit.errors import UsageError, machine_fault, show_warning
from mixit.experiment import DATA_OPTIONS, DEFAULT_TASK, TASK_DECIDES, RunConfig, merge, resolve
from mixit.export import export_run, hub_url
from mixit.flags import Option, Parser, arguments, call, help_default, one_line, task_params
from mixit.generate import sample_run
from mixit.litmus import litmus
from mixit.plugins import load_plugins
from mixit.run import Run, load_request
from mixit.runtime import tune_allocator
from mixit.study import export_logs, report, reproduce
from mixit.tasks import TASKS
from mixit.training.loop import train
from mixit.version import __version__

# -- mixit train ------------------------------------------------------------------------


def train_parser() -> Parser:
    """The flags of ``mixit train``: a request (`RunConfig`'s fields, the model and training options under
    ``model.`` and ``train.``), how to run it (`train`'s own parameters), and --config, --out, --print-config."""
    epilog = (
        "Task parameters (-p KEY=VALUE), with their defaults (`mixit list` says what each one means):\n"
        + "\n".join(
            f"  {name}: " + ", ".join(f"{k}={help_default(v)}" for k, v in cls.Config().to_dict().items())
            for name, cls in TASKS.items()
        )
    )
    p = Parser(
        description="Train a model on a task under a variant, into a run directory. Each task sets its own "
        "default steps, batch size and learning rate (`mixit list`); the defaults shown here "
        "apply where it does not.",
        epilog=epilog,
    )
    config = (
        "Start from a config file (YAML, TOML or JSON with keys task, variant, freeze, recipe, task_params, model, "
        "train, data_seed, test_size, val_size, test_seed, transplant_from, transplant_part), or replay a run's "
        "config.json or run directory; the options given beside it override it."
    )
    p.add_option(Option("config", Path, config, None))
    # The default task is shown in --help; a request without a task gets it from `resolve`.
    p.add_options(RunConfig, skip=("model", "train", *DATA_OPTIONS), partial=True, shown={"task": DEFAULT_TASK})
    p.add_options(DataConfig, partial=True)
    p.add_options(ModelConfig, "model", skip=TASK_DECIDES, partial=True)
    p.add_options(TrainConfig, "train", partial=True)
    out = "The run directory to write, or with --resume to continue; null means runs/<task>-<variant>-<time>."
    p.add_option(Option("out", Path, out, None))
    p.add_options(train, skip=("cfg", "run_dir", "grouping"))  # grouping: a study's, for its runs
    p.add_option(Option("print_config", bool, "Print the resolved config as JSON and exit without training.", False))
    return p


def cmd_train(args: Mapping[str, Any]) -> int:
    """Train the request that the --config file and the flags over it make (task_params from -p)."""
    keys = [f.name for f in dataclasses.fields(RunConfig) if f.name != "task_params"]
    request = merge(load_request(args["config"]) if "config" in args else {}, {k: args[k] for k in keys if k in args})
    if "task_param" in args:
        request = merge(request, {"task_params": task_params(request.get("task", DEFAULT_TASK), args["task_param"])})
    session = arguments(train, args)
    if session.get("resume"):
        if "out" not in args:
            raise UsageError("--resume needs --out RUN_DIR, the run to continue")
        request = merge(Run.open(args["out"]).request, request)
    cfg = resolve(request)
    if args.get("print_config"):
        print(json.dumps(cfg.to_dict(), indent=2))
        return 0
    out = args.get("out") or Path("runs") / f"{cfg.task}-{cfg.variant}-{time.strftime('%Y%m%d-%H%M%S')}"
    try:
        summary = train(cfg, out, **session)
    except KeyboardInterrupt:
        if Run(out).state() == "absent":  # stopped before the run was created: the command again (`Command`)
            raise
        resume = f"mixit train --resume --out {shlex.quote(str(out))}"
        raise Interrupted(f"`{resume}` continues the run from its last checkpoint") from None
    if not env_world().main:
        return 0
    metrics = "  ".join(f"{k} {v:.4f}" for k, v in summary["test"].items() if isinstance(v, float))
    print(
        f"{summary['task']} {summary['variant']}: after {steps_trained(summary)}, last evaluation's test {metrics}\n"
        f"run directory: {summary['run_dir']}"
    )
    return 0


def steps_trained(summary: dict[str, Any]) -> str:
    """How far a run trained, as `mixit train` ends by saying it: the cap, or where early stopping ended it."""
    conv = summary["convergence"]
    if conv["stopped_early"]:
        return f"{conv['steps_trained']} of {summary['steps']} steps (stopped early: {conv['reason']})"
    return f"{summary['steps']} steps"


# -- the other commands -------------------------------------------------------------------


def command_parser(function: Callable[..., Any]) -> Parser:
    """The flags of a command that calls `function`: its parameters (`Parser.add_options`); its description, the
    first paragraph of the function's docstring."""
    parser = Parser(description=(inspect.getdoc(function) or "").split("\n\n")[0])
    parser.add_options(function)
    return parser


def show_samples(texts: Sequence[str], args: Mapping[str, Any]) -> None:
    for i, text in enumerate(texts):
        if len(texts) > 1:
            print(f"--- sample {i + 1}")
        print(args.get("prompt", "") + text)


def show_bench(result: tuple[Any, Path], args: Mapping[str, Any]) -> None:
    print(format_table(result[0]))
    if args.get("profile"):
        print(format_profiles(result[0]))
    print(f"written to {result[1]}")


def show_export(out: Path, args: Mapping[str, Any]) -> None:
    print(f"written to {out}")
    if args.get("push_to_hub"):
        print(f"pushed to {args['push_to_hub']} ({hub_url(args['push_to_hub'])})")


def show_export_logs(result: Mapping[str, Any], args: Mapping[str, Any]) -> None:
    for path in result["runs"]:
        print(f"sent {path} to {', '.join(result['sinks'])}")
    if "tensorboard" in result["sinks"]:
        print(f"open with: tensorboard --logdir {args['directory']}")


class Interrupted(KeyboardInterrupt):
    """A Ctrl-C, with what its user can do next where the command knows it better than `Command.interrupted` (the
    run directory that ``mixit train`` was writing)."""


@dataclasses.dataclass(frozen=True)
class Command:
    """A subcommand of ``mixit``."""

    run: Callable[[Mapping[str, Any]], int]
    """Calls the library with the parsed flags and prints the result; its exit status."""
    parser: Callable[[], Parser]
    """Makes its parser."""
    summary: str
    """Its line in ``mixit --help``."""
    interrupted: str = "run the command again"
    """What its user can do after a Ctrl-C (unless it raises `Interrupted`, which says)."""
    again: str = "run the command again"
    """What continues its work once a fault of the machine (a full disk) is mended, where the fault does not say."""
    writes: str | None = None
    """Its option naming where it writes: a fault of the machine whose error names no file is said of that path."""


def command(
    function: Callable[..., Any],
    summary: str,
    show: Callable[[Any, Mapping[str, Any]], Any] = lambda result, args: print(result),
    hooks: Mapping[str, Any] = {},
    **more: Any,
) -> Command:
    """The command whose options are `function`'s parameters (`command_parser`): it calls `function` with them and
    `hooks` (`call`), and prints the result with `show` (given the options too; print by default). `more`: Command's."""

    def run(args: Mapping[str, Any]) -> int:
        show(call(function, args, **hooks), args)
        return 0

    return Command(run, partial(command_parser, function), summary, **more)


COMMANDS: dict[str, Command] = {
    "train": Command(
        cmd_train,
        train_parser,
        "Train a model on a task under a variant (`mixit list` names the choices).",
        writes="out",
    ),
    "eval": command(
        evaluate_run,
        "Re-evaluate a run's latest checkpoint, or an exported model, on its test set.",
        lambda result, args: print(json.dumps(result, indent=2)),
    ),
    "sample": command(sample_run, "Sample text from a trained language model (task lm).", show_samples),
    "analyze": command(
        analyze_run,
        "Score the heads, draw the attention maps and measure the signal propagation of a trained run.",
        lambda result, args: print(f"{result['summary'].strip()}\n\nwritten to {result['out_dir']}"),
        writes="run_dir",
    ),
    "signal": command(
        signal_command,
        "Measure how alike token representations grow with depth at initialisation (rank collapse).",
        lambda result, args: print(f"{format_signal(result[0])}\nwritten to " + " and ".join(map(str, result[1]))),
        writes="out",
    ),
    "bench": command(
        bench_command,
        "Measure training throughput, memory and MFU of each variant, beside a Hugging Face Llama.",
        show_bench,
        {"progress": lambda message: print(f"... {message}", file=sys.stderr, flush=True)},
        writes="out",
    ),
    "litmus": command(
        litmus,
        "Ask whether a task needs input-dependent attention: the standard model, MixiT and a pattern transplant, "
        "seed by seed, with the gap and its interval.",
        lambda result, args: print(f"{result['text']}\nwritten to {result['out']}"),
        {"say": lambda message: print(f"... {message}", file=sys.stderr, flush=True)},
        interrupted="the same command again resumes the litmus, each run from its last checkpoint",
        again="the same command again resumes the litmus, each run from its last checkpoint",
        writes="out",
    ),
    "reproduce": command(
        reproduce,
        "Run the paper's comparison (or a study file of your own) and write its report.",
        lambda result, args: print(result.get("listing") or result["text"]),
        interrupted="the same command again resumes the study, each run from its last checkpoint",
        again="the same command again resumes the study, each run from its last checkpoint "
        "(with --retry-failed, the runs that failed too)",
        writes="out",
    ),
    "report": command(
        report,
        "Write the report of a study from the runs that have finished.",
        lambda result, args: print(result["text"]),
        writes="study_dir",
    ),
    "export": command(
        export_run,
        "Write a run's model as a Hugging Face directory: a transformers Llama (--to hf) or one for "
        "Transformer.from_pretrained (--to hub).",
        show_export,
        writes="out",
    ),
    "export-logs": command(
        export_logs,
        "Send the logs of a run trained without a tracking sink, or of every run of a study, to TensorBoard, "
        "W&B, MLflow or trackio.",
        show_export_logs,
        writes="directory",
    ),
    "list": command(catalogue_text, "List the tasks with their parameters, the variants and the recipes."),
}


def build_parser() -> Parser:
    parser = Parser(
        prog="mixit",
        description="Train, evaluate and analyse transformers with some of their parts frozen (the paper's "
        "variants), to learn which trainable parts do which jobs.",
    )
    parser.add_argument(
        "--version", action="version", version=f"mixit {__version__}", help="Print the version and exit."
    )
    sub = parser.add_subcommands(
        dest="command",
        title="commands",
        description="Each command takes options of its own: `mixit COMMAND --help` lists them.",
        help="The command to run.",
    )
    for name, command in COMMANDS.items():
        parser.commands[name] = command.parser()
        sub.add_subcommand(name, parser.commands[name], help=command.summary)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """`mixit ARGS`: its exit status. mixit's own warnings are said in one line each (`show_warning`)."""
    with warnings.catch_warnings():
        warnings.showwarning = partial(show_warning, warnings.showwarning)
        return run_command(argv)


def run_command(argv: Sequence[str] | None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    command = args[0] if args and args[0] in COMMANDS else None
    prog = f"mixit {command}" if command else "mixit"
    try:
        world = env_world()
    except BadEnvironment as e:
        if command == "train":  # said by every process: there may be no rank 0 to say it
            return refuse(f"mixit train: error: {e}", Dist())
        world = Dist()  # the other commands run in one process, which reads no distributed variables
    try:
        load_plugins()  # before the parsers are built: a plugin's task is a choice of --task, and in --help
    except UsageError as e:
        return refuse(f"{prog}: error: {e}", world)
    parser = build_parser()
    try:
        parsed = parser.parse_args(args, defaults=False).as_dict()
    except SystemExit as e:  # --help and --version
        return int(e.code or 0)
    except ArgumentError as e:
        return refuse(f"{prog}: error: {one_line(e)}", world)
    command = parsed["command"]
    options = dict(parsed.get(command) or {})
    tune_allocator()
    try:
        return COMMANDS[command].run(options)
    except BadEnvironment as e:  # this process's own environment (its LOCAL_RANK names no GPU, say): all say it
        return refuse(f"mixit {command}: error: {e}", Dist())
    except UsageError as e:
        return refuse(f"mixit {command}: error: {e}", world)
    except Exception as e:  # a fault of the machine met once work was under way; anything else is raised again
        return say_fault(command, e, options, world)
    except KeyboardInterrupt as e:
        what = str(e) if isinstance(e, Interrupted) else COMMANDS[command].interrupted
        print(f"mixit {command}: interrupted; {what}", file=sys.stderr)
        return 130


def say_fault(command: str, error: Exception, options: Mapping[str, Any], world: Dist) -> int:
    """Exit status 1 for a fault of the machine met during work (`mixit.errors.machine_fault`): one line, said by
    the process that met it, naming where the command writes (`Command.writes`) if the error names no file, and
    what continues the work. Under torchrun a process whose collectives failed because another stopped on a fault
    leaves without a word (`fault_said`). Any other error is raised again: its traceback is what finds a bug."""
    writes, again = COMMANDS[command].writes, COMMANDS[command].again
    fault = machine_fault(error, options.get(writes) if writes else None, again)
    if fault is not None:
        print(f"mixit {command}: error: {fault}", file=sys.stderr, flush=True)
    if fault_said(world, said=fault is not None):
        return 1
    raise error


def refuse(message: str, world: Dist) -> int:
    """Exit status 2 for a refusal, `message` printed by rank 0 alone: under torchrun every process refuses, one
    says why, and the others exit once it has (`refusal_said`)."""
    if world.main:
        print(message, file=sys.stderr, flush=True)
    refusal_said(world)
    return 2


if __name__ == "__main__":
    sys.exit(main())
