"""`mixit <command>`: train, eval, sample, analyze, signal, bench, reproduce, report, list.

This module only parses and dispatches. Every option is generated from the
one place it is declared: a field of `ModelConfig`, `TrainConfig`,
`RunConfig` or a task's Config (``mixit train``), or a parameter of the
library function a command calls (the others), with its type, default and
docstring. jsonargparse parses the values by their type hints (it is
argparse underneath, so a bad value is an exception we can print on one
line; see docs/design.md, "Configuration", for why it was chosen over tyro).

Spelling: a model option is ``--model.d_model`` (its path in config.json)
or ``--d-model``; a training option ``--train.lr`` or ``--lr``; other options
``--data-seed`` or ``--data_seed``. A bool option given alone means true
(``--compile``), ``--no-compile`` false. Lists are comma-separated.

Bad input (an unknown task, a value out of range, a run directory holding
another run, a corrupt checkpoint) is refused before any work with one line on
stderr naming the problem and what is allowed, and exit status 2.
"""

from __future__ import annotations

import argparse
import collections.abc
import dataclasses
import inspect
import json
import re
import sys
import time
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, NoReturn, get_args, get_origin

import docstring_parser
from jsonargparse import ArgumentParser, DefaultHelpFormatter

from mixit.analysis.report import analyze_run
from mixit.analysis.signal import format_signal, signal_command
from mixit.bench import bench_command, format_profiles, format_table
from mixit.catalogue import catalogue_text
from mixit.config import ModelConfig, TrainConfig, field_docs, field_hints
from mixit.distributed import env_world
from mixit.errors import UsageError
from mixit.experiment import DERIVED, RunConfig, as_request, load_request, merge, resolve
from mixit.generate import sample_run
from mixit.run import Run
from mixit.runtime import tune_allocator
from mixit.study import report, reproduce
from mixit.tasks import TASKS
from mixit.training.evaluate import evaluate_run
from mixit.training.loop import train
from mixit.version import __version__

# -- generating options ----------------------------------------------------------------


@dataclasses.dataclass
class Option:
    name: str
    hint: Any
    default: Any  # inspect.Parameter.empty: required
    doc: str


def options_of(target: Any, skip: Sequence[str] = ()) -> list[Option]:
    """The options a dataclass (its fields) or a function (its parameters) declares, with their docs."""
    if dataclasses.is_dataclass(target):
        hints, docs = field_hints(target), field_docs(target)  # type: ignore[arg-type]
        out = []
        for f in dataclasses.fields(target):
            default = (
                f.default
                if f.default is not dataclasses.MISSING
                else f.default_factory()
                if f.default_factory is not dataclasses.MISSING
                else inspect.Parameter.empty
            )
            out.append(Option(f.name, hints[f.name], default, docs.get(f.name, "")))
        return [o for o in out if o.name not in skip]
    hints = typing.get_type_hints(target)
    docs = {
        p.arg_name: " ".join((p.description or "").split()) for p in docstring_parser.parse_from_object(target).params
    }
    return [
        Option(name, hints[name], param.default, docs.get(name, ""))
        for name, param in inspect.signature(target).parameters.items()
        if name not in skip
    ]


class CommaList:
    """argparse type: comma-separated values of one item type -> tuple."""

    def __init__(self, item: type):
        self.item = item

    def __call__(self, text: Any) -> tuple[Any, ...]:
        if isinstance(text, (list, tuple)):  # jsonargparse re-checks a parsed value
            return tuple(self.item(v) for v in text)
        try:
            return tuple(self.item(v.strip()) for v in str(text).strip("()[] ").split(",") if v.strip())
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {self!r}, got {text!r}") from None

    def __repr__(self) -> str:
        return {int: "comma-separated integers", str: "comma-separated names"}.get(
            self.item, f"comma-separated {self.item.__name__}s"
        )


def _arg_type(hint: Any) -> Any:
    """The argparse type of a hint: comma lists for sequences, else the hint itself (jsonargparse parses it)."""
    options = (
        [a for a in get_args(hint) if a is not type(None)]
        if get_origin(hint) in (typing.Union, types.UnionType)
        else [hint]
    )
    if len(options) == 1 and get_origin(options[0]) in (tuple, list, collections.abc.Sequence):
        return CommaList(get_args(options[0])[0])
    return hint


def _is_bool(hint: Any) -> bool:
    return hint is bool


def add_options(parser: ArgumentParser, options: list[Option], prefix: str = "", show_defaults: bool = True) -> None:
    """Add `options` to `parser`: ``--{prefix}{name}`` plus its short spellings (module docstring)."""
    for opt in options:
        dashed = opt.name.replace("_", "-")
        required_positional = opt.default is inspect.Parameter.empty and not prefix
        if required_positional:
            parser.add_argument(opt.name, type=_arg_type(opt.hint), help=opt.doc)
            continue
        flags = [f"--{dashed}", f"--{opt.name}"] if not prefix else [f"--{prefix}{opt.name}", f"--{dashed}"]
        flags = list(dict.fromkeys(flags))
        kwargs: dict[str, Any] = {"type": _arg_type(opt.hint), "help": opt.doc, "dest": prefix + opt.name}
        if show_defaults and opt.default is not inspect.Parameter.empty:
            kwargs["default"] = list(opt.default) if isinstance(opt.default, tuple) else opt.default
        if _is_bool(opt.hint):
            kwargs.update(nargs="?", const=True)
        parser.add_argument(*flags, **kwargs)
        if _is_bool(opt.hint):
            parser.add_argument(
                f"--no-{dashed}",
                dest=prefix + opt.name,
                action="store_const",
                const=False,
                help=f"same as --{dashed} false",
            )


class RawEpilogFormatter(argparse.RawDescriptionHelpFormatter, DefaultHelpFormatter):
    """jsonargparse's help layout, with the description and epilog kept as written."""


class Parser(ArgumentParser):
    """jsonargparse's parser, raising on errors (printed on one line by `main`)."""

    def __init__(self, **kwargs: Any):
        super().__init__(exit_on_error=False, print_config=None, formatter_class=RawEpilogFormatter, **kwargs)


# -- mixit train ------------------------------------------------------------------------

TRAIN_OPTIONS = [o for o in options_of(train, skip=("cfg", "run_dir", "on_step"))]
RUN_OPTIONS = options_of(RunConfig, skip=("model", "train", "task_params"))


def add_task_param(parser: ArgumentParser, help: str) -> None:
    """``-p KEY=VALUE``, repeatable: task parameters, parsed by `task_params` once the task is known."""
    parser.add_argument("-p", "--task-param", action="append", type=str, metavar="KEY=VALUE", help=help)


def train_parser() -> Parser:
    epilog = "task parameters (-p KEY=VALUE):\n" + "\n".join(
        f"  {name}: " + ", ".join(f"{k}={v}" for k, v in cls.Config().to_dict().items()) for name, cls in TASKS.items()
    )
    p = Parser(
        description="Train a model on a task under a variant, into a run directory. Each task sets its own "
        "default steps, batch size and learning rate (`mixit list`); the defaults shown here "
        "apply where it does not.",
        epilog=epilog,
    )
    p.add_argument(
        "--config",
        type=Path,
        help="a config file (YAML, TOML or JSON with keys task, variant, task_params, model, train, "
        "data_seed, test_size, val_size), or a run's config.json or directory, replayed; flags override it",
    )
    run_options = [dataclasses.replace(o, default="addition") if o.name == "task" else o for o in RUN_OPTIONS]
    add_options(p, run_options, show_defaults=True)
    add_task_param(p, "a task parameter, typed by the task's own parameter class (repeatable; see `mixit list`)")
    add_options(p, [o for o in options_of(ModelConfig) if o.name not in DERIVED["model"]], prefix="model.")
    add_options(p, options_of(TrainConfig), prefix="train.")
    p.add_argument("--out", type=Path, help="run directory (default: runs/<task>-<variant>-<time>)")
    add_options(p, TRAIN_OPTIONS)
    p.add_argument(
        "--print-config", action="store_true", help="print the resolved config as JSON and exit without training"
    )
    return p


def _given(ns: Mapping[str, Any], names: Sequence[str]) -> dict[str, Any]:
    return {k: ns[k] for k in names if k in ns}


def train_request(args: Mapping[str, Any]) -> dict[str, Any]:
    """The request that the flags (and --config file) of `mixit train` make."""
    base = load_request(args["config"]) if "config" in args else {}
    flags: dict[str, Any] = _given(args, [o.name for o in RUN_OPTIONS])
    for group in ("model", "train"):
        if group in args:
            flags[group] = dict(args[group])
    request = merge(base, flags)
    if args.get("task_param"):
        request = merge(request, {"task_params": task_params(request.get("task", "addition"), args["task_param"])})
    return request


def task_params(task: str, items: Sequence[str]) -> dict[str, Any]:
    """`-p KEY=VALUE` items, each value parsed by the type of its field in the task's Config."""
    if not isinstance(task, str):
        raise UsageError(f"task must be a string, got {task!r}")
    pairs = []
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"-p expects KEY=VALUE (e.g. n_digits=5), got {item!r}")
        pairs.append((key.strip(), value.strip()))
    config = TASKS.get(task).Config
    options = options_of(config)
    names = [o.name for o in options]
    unknown = [k for k, _ in pairs if k not in names]
    if unknown:
        allowed = ", ".join(f"{k}={v}" for k, v in config().to_dict().items())
        raise UsageError(f"unknown parameter {unknown[0]!r} for task {task}; allowed: {allowed}")
    parser = Parser(prog=f"-p (task {task})")
    add_options(parser, options, show_defaults=False)
    try:
        parsed = parser.parse_args([item for k, v in pairs for item in (f"--{k}", v)], defaults=False)
    except argparse.ArgumentError as e:
        raise UsageError(f"task parameter {_one_line(e)}") from None
    return dict(parsed.as_dict())


def cmd_train(args: Mapping[str, Any]) -> int:
    request = train_request(args)
    session = _given(args, [o.name for o in TRAIN_OPTIONS])
    if session.get("resume"):
        if "out" not in args:
            raise UsageError("--resume needs --out RUN_DIR, the run to continue")
        saved = Run.open(args["out"]).config
        request = merge(as_request(saved), request)
    cfg = resolve(request)
    if args.get("print_config"):
        print(json.dumps(cfg.to_dict(), indent=2))
        return 0
    out = args.get("out") or Path("runs") / f"{cfg.task}-{cfg.variant}-{time.strftime('%Y%m%d-%H%M%S')}"
    summary = train(cfg, out, **session)
    if not env_world().main:
        return 0
    metrics = "  ".join(f"{k} {v:.4f}" for k, v in summary["test"].items() if isinstance(v, float))
    print(
        f"{summary['task']} {summary['variant']}: after {summary['steps']} steps, test {metrics}\n"
        f"run directory: {summary['run_dir']}"
    )
    return 0


# -- the other commands -------------------------------------------------------------------


def cmd_eval(args: Mapping[str, Any]) -> int:
    print(json.dumps(evaluate_run(**args), indent=2))
    return 0


def cmd_sample(args: Mapping[str, Any]) -> int:
    texts = sample_run(**args)
    prompt = args.get("prompt", "")
    for i, text in enumerate(texts):
        if len(texts) > 1:
            print(f"--- sample {i + 1}")
        print(prompt + text)
    return 0


def cmd_analyze(args: Mapping[str, Any]) -> int:
    result = analyze_run(**args)
    print(result["summary"].strip())
    print(f"\nwritten to {result['out_dir']}")
    return 0


def cmd_signal(args: Mapping[str, Any]) -> int:
    result, written = signal_command(**args)
    print(format_signal(result))
    print("written to " + " and ".join(str(p) for p in written))
    return 0


def cmd_bench(args: Mapping[str, Any]) -> int:
    args = dict(args)
    if "task_param" in args:
        if "task" not in args:
            raise UsageError("-p/--task-param needs --task")
        args["task_params"] = task_params(args["task"], args.pop("task_param"))
    result, out = bench_command(progress=lambda message: print(f"... {message}", file=sys.stderr, flush=True), **args)
    print(format_table(result))
    if args.get("profile"):
        print(format_profiles(result))
    print(f"written to {out}")
    return 0


def cmd_reproduce(args: Mapping[str, Any]) -> int:
    result = reproduce(**args)
    print(result.get("listing") or result["text"])
    return 0


def cmd_report(args: Mapping[str, Any]) -> int:
    print(report(**args)["text"])
    return 0


def cmd_list(args: Mapping[str, Any]) -> int:
    print(catalogue_text(**args))
    return 0


Command = tuple[Callable[[Mapping[str, Any]], int], Callable[..., Any] | None, str]
COMMANDS: dict[str, Command] = {
    "train": (cmd_train, None, "train a model on a task under a variant (see --help; `mixit list` for the choices)"),
    "eval": (cmd_eval, evaluate_run, "re-evaluate a run's latest checkpoint on its test set"),
    "sample": (cmd_sample, sample_run, "sample text from a trained language model (task lm)"),
    "analyze": (cmd_analyze, analyze_run, "head scores, attention maps and signal propagation of a trained run"),
    "signal": (cmd_signal, signal_command, "token similarity against depth at initialisation (rank collapse)"),
    "bench": (cmd_bench, bench_command, "training throughput, memory and MFU per variant, beside HF Llama"),
    "reproduce": (cmd_reproduce, reproduce, "run the paper's comparison (or a study file) and write its report"),
    "report": (cmd_report, report, "write the report of a study from what has finished"),
    "list": (cmd_list, catalogue_text, "list tasks, variants and their parameters"),
}


def build_parser() -> Parser:
    parser = Parser(
        prog="mixit",
        description="Which trainable parts of a transformer do which jobs: train, "
        "evaluate and analyse the paper's variants.",
    )
    parser.add_argument("--version", action="version", version=f"mixit {__version__}")
    sub = parser.add_subcommands(dest="command")
    for name, (_, function, summary) in COMMANDS.items():
        if function is None:
            sub.add_subcommand(name, train_parser(), help=summary)
            continue
        p = Parser(description=docstring_parser.parse_from_object(function).short_description)
        skip = ("progress", "task_params") if name == "bench" else ()
        add_options(p, options_of(function, skip=skip))
        if name == "bench":
            add_task_param(p, "task parameter, repeatable (with --task)")
        sub.add_subcommand(name, p, help=summary)
    return parser


def _one_line(error: BaseException) -> str:
    """An argparse/jsonargparse message on one line, in plain words rather than Python type reprs."""
    text = " ".join(str(error).split())
    text = re.sub(r"<class '(?:[\w.]+\.)?(\w+)'>", r"\1", text)
    text = re.sub(r"typing\.Literal\[(.*?)\]", r"one of \1", text)
    text = re.sub(
        r"Does not validate against any of the Union subtypes Subtypes: \[(.*?)\].*Given value: (.*)$",
        lambda m: f"Expected a {m[1].replace('NoneType', 'null').replace(', ', ' or ')}. Got value: {m[2]}",
        text,
    )
    text = re.sub(r'Parser key "([^"]+)": Expected a (.+?)\. Got value: (.*)$', r"\1: expected \2, got '\3'", text)
    return re.sub(r'Parser key "([^"]+)":', r"\1:", text)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    try:
        parsed = parser.parse_args(args, defaults=False).as_dict()
    except SystemExit as e:  # --help and --version
        return int(e.code or 0)
    except argparse.ArgumentError as e:
        command = args[0] if args and args[0] in COMMANDS else None
        print(f"mixit{' ' + command if command else ''}: error: {_one_line(e)}", file=sys.stderr)
        return 2
    command = parsed["command"]
    tune_allocator()
    try:
        return COMMANDS[command][0](dict(parsed.get(command) or {}))
    except UsageError as e:
        if env_world().main:  # under torchrun every process refuses, and one says why
            print(f"mixit {command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(
            "mixit: interrupted; a run continues from its last checkpoint with --resume --out RUN_DIR", file=sys.stderr
        )
        return 130


def _entry() -> NoReturn:
    sys.exit(main())


if __name__ == "__main__":
    _entry()
