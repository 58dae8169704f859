"""`mixit <command>`: train, eval, sample, analyze, signal, bench, reproduce, report, export, list.

This module only parses and dispatches. jsonargparse generates every option
from the one place it is declared, with its type, default and docstring: the
parameters of the library function a command calls, and for ``mixit train``
the fields of `RunConfig`, `ModelConfig` and `TrainConfig` and a task's Config.
It parses each value by its type hint (it is argparse underneath, so a bad
value is an exception we print on one line; see docs/design.md,
"Configuration", for why it was chosen over tyro). Four generic rules:

- a parameter whose type is a dataclass (`BenchOptions`, say) contributes that
  dataclass's fields as the command's flags, by field name, and `call` builds
  the dataclass from them;
- a parameter typed as a Callable is a library hook (a progress callback), not
  a flag; the command's ``cmd_*`` function supplies it;
- options with both ``task`` and ``task_params`` take ``-p KEY=VALUE``
  (repeatable) instead of ``--task_params``, each value parsed by the type of
  its field in the chosen task's Config (`task_params`);
- a parameter typed as a mapping (`ReproduceOptions.slurm`, a ``dict``) takes
  ``--NAME KEY=VALUE``, repeatable, and is given to the library as a dict of
  strings for it to check and type: a key given twice collects its values into
  a list, in order, and ``KEY.NAME=VALUE`` sets NAME in a dict under KEY
  (`key_values`).

Spellings: jsonargparse names an option by its path (``--model.d_model``,
``--data_seed``) and reads a bool or a list only as a value (``--compile
true``, ``--depths [2,4]``). `Parser.add_spellings` adds, to each option it
generated, its name alone with dashes (``--d-model``, ``--data-seed``); for a
bool, the option alone for true (``--compile``) and ``--no-compile`` for
false; for a list, comma-separated values (``--depths 2,4``, or one: ``--depths
8``). --help names types and defaults in the same words (``int or null``, ``one
of hf or hub``, ``default: true``; `HelpFormatter`), and every help text is a
sentence (tests/test_help.py).

Bad input (an unknown task, a value out of range, a run directory holding
another run, a corrupt checkpoint) is refused before any work with one line on
stderr naming the problem and what is allowed, and exit status 2; a value of
the wrong type is said from the option's declared type, in the words of
mixit's own checks (``train.steps: expected an integer, got 'ten'``: `describe`).
"""

from __future__ import annotations

import argparse
import collections.abc
import dataclasses
import inspect
import json
import sys
import textwrap
import time
import types
import typing
import warnings
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any, Literal, NoReturn, get_args, get_origin

import docstring_parser
from jsonargparse import ArgumentError, ArgumentParser, DefaultHelpFormatter, set_parsing_settings

from mixit.analysis.report import analyze_run
from mixit.analysis.signal import format_signal, signal_command
from mixit.bench import bench_command, format_profiles, format_table
from mixit.catalogue import catalogue_text
from mixit.config import ModelConfig, TrainConfig, field_docs, field_hints, type_name
from mixit.distributed import BadEnvironment, Dist, env_world, refusal_said
from mixit.errors import UsageError, show_warning
from mixit.experiment import DEFAULT_TASK, TASK_DECIDES, RunConfig, merge, resolve
from mixit.export import export_run
from mixit.generate import sample_run
from mixit.plugins import load_plugins
from mixit.run import Run, load_request
from mixit.runtime import tune_allocator
from mixit.study import export_logs, report, reproduce
from mixit.tasks import TASKS
from mixit.training.evaluate import evaluate_run
from mixit.training.loop import train
from mixit.version import __version__

# The docstring under each dataclass field is its --help text.
set_parsing_settings(docstring_parse_attribute_docstrings=True)

# -- generating options ----------------------------------------------------------------


def hints_of(target: Any) -> dict[str, Any]:
    """The type of each field of dataclass `target`, or of each parameter of function `target`."""
    if dataclasses.is_dataclass(target):
        return field_hints(target)  # type: ignore[arg-type]
    return {k: v for k, v in typing.get_type_hints(target).items() if k != "return"}


def _alternatives(hint: Any) -> tuple[Any, ...]:
    """The types a hint allows besides None: (int,) for `int | None`."""
    if get_origin(hint) in (typing.Union, types.UnionType):
        return tuple(a for a in get_args(hint) if a is not type(None))
    return (hint,)


def is_hook(hint: Any) -> bool:
    """Whether a parameter of type `hint` is a library hook (a Callable), which is no flag."""
    return any(get_origin(a) is collections.abc.Callable for a in _alternatives(hint))


def is_mapping(hint: Any) -> bool:
    """Whether an option of type `hint` takes KEY=VALUE items (module docstring)."""
    return any(a is dict or get_origin(a) in (dict, collections.abc.Mapping) for a in _alternatives(hint))


def is_list(hint: Any) -> bool:
    """Whether an option of type `hint` takes a list (comma-separated on the command line)."""
    return any(get_origin(a) in (list, tuple, collections.abc.Sequence) for a in _alternatives(hint))


def comma_list(text: str) -> str:
    """The argparse type of a list option: ``2,4`` becomes ``[2,4]``, which jsonargparse then parses and checks
    against the option's type hint (it reads a list only in brackets)."""
    return text if text.lstrip().startswith("[") else f"[{text}]"


def help_type(hint: Any) -> str:
    """A type hint as --help names it, in the words of the command line: "int", "Path", "int or null", "one of a,
    b or c", "comma-separated list of int", "comma-separated list, each one of a or b" (jsonargparse prints
    Python's spellings: ``Literal['a', 'b']``, ``int | None``, ``<class 'Path'>``)."""
    origin, args = get_origin(hint), get_args(hint)
    if origin is Literal:
        return "one of " + alternatives([str(a) for a in args])
    if origin in (typing.Union, types.UnionType):
        values = [a for a in args if a is not type(None)]
        null = ["null"] if len(values) < len(args) else []
        if len(values) == 1 and get_origin(values[0]) is Literal:
            return "one of " + alternatives([*(str(a) for a in get_args(values[0])), *null])
        return alternatives([*(help_type(a) for a in values), *null])
    if origin in (list, tuple, collections.abc.Sequence):
        item = help_type(args[0]) if args else "str"
        return "comma-separated list" + (", each " if item.startswith("one of ") else " of ") + item
    if origin in (dict, collections.abc.Mapping):
        return f"mapping of {help_type(args[0])} to {help_type(args[1])}" if args else "mapping"
    return getattr(hint, "__name__", None) or str(hint).replace("typing.", "")


def alternatives(names: Sequence[str]) -> str:
    """``a, b or c``."""
    return " or ".join(names) if len(names) < 3 else ", ".join(names[:-1]) + " or " + names[-1]


def help_default(value: Any) -> Any:
    """A default as --help shows it, as it is typed: true/false, a list comma-separated (an empty one ``[]``), an
    empty string ``""`` (jsonargparse prints Python's ``False``, ``('a', 'b')``, ``()`` and nothing)."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (list, tuple)):
        return ",".join(str(help_default(v)) for v in value) or "[]"
    return '""' if value == "" else value


class HelpFormatter(DefaultHelpFormatter):
    """jsonargparse's help layout, with each option's type and default in the words of the command line
    (`help_type`, `help_default`), lines broken between words only (never inside ``--over-time``), and a
    description or epilog filled to the terminal except its indented lines, kept as listed."""

    def _split_lines(self, text: str, width: int) -> list[str]:
        return textwrap.wrap(" ".join(text.split()), width, break_on_hyphens=False)

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        paragraphs: list[str] = []
        for line in text.strip("\n").splitlines():
            if line[:1].strip() and paragraphs and paragraphs[-1][:1].strip():  # goes on with an unindented line
                paragraphs[-1] += " " + line
            else:
                paragraphs.append(line)
        lines: list[str] = []
        for paragraph in paragraphs:  # an indented one wraps under itself, further indented
            lead = indent + paragraph[: len(paragraph) - len(paragraph.lstrip())]
            hanging = lead + "    " if lead != indent else lead
            words = " ".join(paragraph.split())
            lines += textwrap.wrap(words, width, initial_indent=lead, subsequent_indent=hanging, break_on_hyphens=False)
            lines += [] if words else [""]
        return "\n".join(lines)

    def _get_type_str(self, action: argparse.Action) -> str | None:
        hint = getattr(action, "_typehint", None)  # jsonargparse's options; ours (--config, --out) have a type
        if hint is None and isinstance(action.type, type):
            hint = action.type
        return super()._get_type_str(action) if hint is None else help_type(hint)

    def _get_help_string(self, action: argparse.Action) -> str:
        if isinstance(action, argparse._AppendAction) and action.default is None:  # -p KEY=VALUE: none given
            return action.help or ""
        return super()._get_help_string(action)

    def _expand_help(self, action: argparse.Action) -> str:
        default = action.default
        action.default = help_default(default)
        try:
            return super()._expand_help(action)
        finally:
            action.default = default


class Parser(ArgumentParser):
    """jsonargparse's parser, raising on errors (printed on one line by `main`), with the generic rules and the
    short spellings of the module docstring."""

    def __init__(self, **kwargs: Any):
        super().__init__(exit_on_error=False, print_config=None, formatter_class=HelpFormatter, **kwargs)

    def add_options(
        self, target: Any, nested_key: str | None = None, skip: Sequence[str] = (), partial: bool = False
    ) -> None:
        """Flags for the parameters of function `target` or the fields of dataclass `target`, generated by
        jsonargparse under `nested_key`, with the generic rules and spellings of the module docstring. A
        required parameter is positional, unless `partial` (every option may be left out: a request)."""
        hints = hints_of(target)
        skipped: set[str | int] = {*skip, *(name for name, hint in hints.items() if is_hook(hint))}
        if {"task", "task_params"} <= hints.keys():
            skipped.add("task_params")
            self.add_argument(
                "-p",
                "--task-param",
                action="append",
                metavar="KEY=VALUE",
                help="Set a task parameter, the value read as the type the task declares for it; repeat -p for "
                "several (`mixit list` names each task's parameters and defaults).",
            )
        mappings = [name for name, hint in hints.items() if name not in skipped and is_mapping(hint)]
        skipped.update(mappings)
        if not dataclasses.is_dataclass(target):
            for name, hint in hints.items():
                if name not in skipped and dataclasses.is_dataclass(hint):
                    self.add_options(hint)
                    skipped.add(name)
        add = self.add_class_arguments if dataclasses.is_dataclass(target) else self.add_function_arguments
        for dest in add(target, nested_key, as_group=nested_key is not None, as_positional=not partial, skip=skipped):
            self.add_spellings(dest, hints[dest.rpartition(".")[2]], required=not partial)
        group_file = self._option_string_actions.get(f"--{nested_key}") if nested_key else None  # --model FILE
        if group_file is not None:
            group_file.help = f"A YAML or JSON file, or string, of {nested_key} options; a flag after it overrides it."
        for name in mappings:
            dashed = f"--{name.replace('_', '-')}"
            names = [dashed] if dashed == f"--{name}" else [f"--{name}", dashed]
            self.add_argument(*names, dest=name, action="append", metavar="KEY=VALUE", help=doc(target, name))

    def add_spellings(self, dest: str, hint: Any, required: bool = True) -> None:
        """Give the option at `dest` (``--model.d_model``) the spellings of the module docstring. An alias is
        registered as argparse registers the names of an option declared with several (`_option_string_actions`);
        argparse applies a `type` to the string before the action (jsonargparse's) checks the value."""
        action = self._option_string_actions.get(f"--{dest}")
        if action is None:  # a positional argument
            return
        action.required = action.required and required
        group, _, name = dest.rpartition(".")
        dashed = name.replace("_", "-")
        if f"--{dashed}" not in self._option_string_actions:  # a name in two groups keeps its long form only
            action.option_strings = [*action.option_strings, f"--{dashed}"]
            self._option_string_actions[f"--{dashed}"] = action
        if hint is bool:
            action.nargs, action.const = "?", True
            (self.groups or {}).get(group, self).add_argument(
                f"--no-{dashed}",
                dest=dest,
                action="store_const",
                const=False,
                default=argparse.SUPPRESS,
                help=f"Same as --{dashed} false.",
            )
        elif is_list(hint):
            action.type = comma_list


def call(function: Callable[..., Any], args: Mapping[str, Any], **hooks: Any) -> Any:
    """`function` called with the parsed flags `args` (module docstring): each dataclass parameter built from the
    flags of its fields, the others as given; `hooks` are its Callable parameters."""
    kwargs = arguments(function, args)
    for name, hint in hints_of(function).items():
        if dataclasses.is_dataclass(hint):
            kwargs[name] = hint(**arguments(hint, args))  # type: ignore[operator]
    return function(**kwargs, **hooks)


def arguments(target: Any, args: Mapping[str, Any]) -> dict[str, Any]:
    """The values given in `args` for the parameters or fields of `target`, task_params from ``-p``."""
    names = hints_of(target)
    values = {k: args[k] for k in names if k in args}
    for name, hint in names.items():
        if name in values and is_mapping(hint) and isinstance(values[name], list):
            values[name] = key_values(name, values[name])
    if "task_params" in names and "task_param" in args:
        values["task_params"] = task_params(values.get("task"), args["task_param"])
    return values


def doc(target: Any, name: str) -> str:
    """The docstring of field `name` of dataclass `target`, or of parameter `name` of function `target` (its Args)."""
    if dataclasses.is_dataclass(target):
        return field_docs(target).get(name, "")  # type: ignore[arg-type]
    params = docstring_parser.parse(inspect.getdoc(target) or "").params
    return next((" ".join((p.description or "").split()) for p in params if p.arg_name == name), "")


def key_values(option: str, items: Sequence[str]) -> dict[str, Any]:
    """``--OPTION KEY=VALUE`` items as a dict of strings (module docstring): a key given more than once collects its
    values into a list, in order; ``KEY.NAME=VALUE`` sets NAME in a dict under KEY."""
    values: dict[str, Any] = {}
    for item in items:
        key, sep, value = (part.strip() for part in item.partition("="))
        head, dot, name = key.partition(".")
        if not sep or not head or (dot and not name):
            raise UsageError(f"--{option.replace('_', '-')} expects KEY=VALUE (repeatable), got {item!r}")
        where, last = (values.setdefault(head, {}), name) if dot else (values, head)
        if not isinstance(where, dict) or isinstance(where.get(last), dict):
            raise UsageError(f"--{option.replace('_', '-')} {head} is given both as {head}=VALUE and {head}.NAME=VALUE")
        old = where.get(last)
        where[last] = value if old is None else [*(old if isinstance(old, list) else [old]), value]
    return values


def task_params(task: Any, items: Sequence[str]) -> dict[str, Any]:
    """``-p KEY=VALUE`` items, each value parsed by the type of its field in the task's Config."""
    if task is None:
        raise UsageError("-p/--task-param needs --task")
    if not isinstance(task, str):
        raise UsageError(f"task must be a string, got {task!r}")
    config = TASKS.get(task).Config
    argv = []
    for item in items:
        key, sep, value = (part.strip() for part in item.partition("="))
        if not sep or not key:
            raise UsageError(f"-p expects KEY=VALUE (e.g. n_digits=5), got {item!r}")
        if key not in field_hints(config):
            allowed = ", ".join(f"{k}={v}" for k, v in config().to_dict().items())
            raise UsageError(f"unknown parameter {key!r} for task {task}; allowed: {allowed}")
        argv.append(f"--{key}={value}")
    parser = Parser()
    parser.add_options(config, partial=True)
    try:
        return dict(parser.parse_args(argv, defaults=False).as_dict())
    except ArgumentError as e:
        raise UsageError(f"task parameter {describe(e, parser)}") from None


def one_line(error: BaseException) -> str:
    """An argparse/jsonargparse message (which may span lines) on one line."""
    return " ".join(str(error).split())


def describe(error: BaseException, parser: argparse.ArgumentParser) -> str:
    """A parse error of `parser` on one line. A value of the wrong type is said in the words of mixit's own
    checks, from the option's declared type (``train.steps: expected an integer, got 'ten'``): jsonargparse names
    the option and ends with the value, but spells the type as Python does (``<class 'int'>``, a list of a
    union's subtypes)."""
    text = str(error)
    key = text.partition('Parser key "')[2].partition('"')[0]
    action = parser._option_string_actions.get(f"--{key}") if key else None
    hint = getattr(action, "_typehint", None)
    if hint is None or "value: " not in text:
        return one_line(error)
    return f"{key}: expected {type_name(hint)}, got {text.rpartition('value: ')[2].strip()!r}"


# -- mixit train ------------------------------------------------------------------------

REQUEST_KEYS = [f.name for f in dataclasses.fields(RunConfig) if f.name != "task_params"]
"""The keys of a request that flags set directly (task_params comes from -p)."""


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
    p.add_argument(
        "--config",
        type=Path,
        help="Start from a config file (YAML, TOML or JSON with keys task, variant, task_params, model, train, "
        "data_seed, test_size, val_size, test_seed), or replay a run's config.json or run directory; the flags "
        "given beside it override it.",
    )
    p.add_options(RunConfig, skip=("model", "train"), partial=True)
    p.set_defaults(task=DEFAULT_TASK)  # shown in --help; a request without a task gets it from `resolve`
    p.add_options(ModelConfig, "model", skip=TASK_DECIDES, partial=True)
    p.add_options(TrainConfig, "train", partial=True)
    p.add_argument(
        "--out",
        type=Path,
        help="The run directory to write, or with --resume to continue; null means runs/<task>-<variant>-<time>.",
    )
    p.add_options(train, skip=("cfg", "run_dir", "grouping"))  # grouping: a study's, for its runs
    p.add_argument(
        "--print_config", type=bool, default=False, help="Print the resolved config as JSON and exit without training."
    )
    p.add_spellings("print_config", bool)
    return p


def train_request(args: Mapping[str, Any]) -> dict[str, Any]:
    """The request that the flags (and --config file) of `mixit train` make."""
    base = load_request(args["config"]) if "config" in args else {}
    request = merge(base, {k: args[k] for k in REQUEST_KEYS if k in args})
    if "task_param" in args:
        request = merge(request, {"task_params": task_params(request.get("task", DEFAULT_TASK), args["task_param"])})
    return request


def cmd_train(args: Mapping[str, Any]) -> int:
    request = train_request(args)
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


def command_parser(function: Callable[..., Any]) -> Parser:
    """The flags of a command that calls `function`: its parameters (`Parser.add_options`); its description, the
    first paragraph of the function's docstring."""
    parser = Parser(description=(inspect.getdoc(function) or "").split("\n\n")[0])
    parser.add_options(function)
    return parser


def cmd_eval(args: Mapping[str, Any]) -> int:
    print(json.dumps(call(evaluate_run, args), indent=2))
    return 0


def cmd_sample(args: Mapping[str, Any]) -> int:
    texts = call(sample_run, args)
    prompt = args.get("prompt", "")
    for i, text in enumerate(texts):
        if len(texts) > 1:
            print(f"--- sample {i + 1}")
        print(prompt + text)
    return 0


def cmd_analyze(args: Mapping[str, Any]) -> int:
    result = call(analyze_run, args)
    print(result["summary"].strip())
    print(f"\nwritten to {result['out_dir']}")
    return 0


def cmd_signal(args: Mapping[str, Any]) -> int:
    result, written = call(signal_command, args)
    print(format_signal(result))
    print("written to " + " and ".join(str(p) for p in written))
    return 0


def cmd_bench(args: Mapping[str, Any]) -> int:
    result, out = call(
        bench_command, args, progress=lambda message: print(f"... {message}", file=sys.stderr, flush=True)
    )
    print(format_table(result))
    if args.get("profile"):
        print(format_profiles(result))
    print(f"written to {out}")
    return 0


def cmd_reproduce(args: Mapping[str, Any]) -> int:
    result = call(reproduce, args)
    print(result.get("listing") or result["text"])
    return 0


def cmd_report(args: Mapping[str, Any]) -> int:
    print(call(report, args)["text"])
    return 0


def cmd_export(args: Mapping[str, Any]) -> int:
    print(f"written to {call(export_run, args)}")
    return 0


def cmd_export_logs(args: Mapping[str, Any]) -> int:
    result = call(export_logs, args)
    for path in result["runs"]:
        print(f"sent {path} to {', '.join(result['sinks'])}")
    if "tensorboard" in result["sinks"]:
        print(f"open with: tensorboard --logdir {args['directory']}")
    return 0


def cmd_list(args: Mapping[str, Any]) -> int:
    print(call(catalogue_text, args))
    return 0


@dataclasses.dataclass(frozen=True)
class Command:
    """A subcommand of ``mixit``."""

    run: Callable[[Mapping[str, Any]], int]
    """Its cmd_* function: calls the library with the parsed flags and prints the result."""
    parser: Callable[[], Parser]
    """Makes its parser."""
    summary: str
    """Its line in ``mixit --help``."""
    interrupted: str = "a run continues from its last checkpoint with --resume --out RUN_DIR"
    """What its user can do after a Ctrl-C."""


COMMANDS: dict[str, Command] = {
    "train": Command(
        cmd_train, train_parser, "Train a model on a task under a variant (`mixit list` names the choices)."
    ),
    "eval": Command(
        cmd_eval, partial(command_parser, evaluate_run), "Re-evaluate a run's latest checkpoint on its test set."
    ),
    "sample": Command(
        cmd_sample, partial(command_parser, sample_run), "Sample text from a trained language model (task lm)."
    ),
    "analyze": Command(
        cmd_analyze,
        partial(command_parser, analyze_run),
        "Score the heads, draw the attention maps and measure the signal propagation of a trained run.",
    ),
    "signal": Command(
        cmd_signal,
        partial(command_parser, signal_command),
        "Measure how alike token representations grow with depth at initialisation (rank collapse).",
    ),
    "bench": Command(
        cmd_bench,
        partial(command_parser, bench_command),
        "Measure training throughput, memory and MFU of each variant, beside a Hugging Face Llama.",
    ),
    "reproduce": Command(
        cmd_reproduce,
        partial(command_parser, reproduce),
        "Run the paper's comparison (or a study file of your own) and write its report.",
        "the same command again resumes the study, each run from its last checkpoint",
    ),
    "report": Command(
        cmd_report, partial(command_parser, report), "Write the report of a study from the runs that have finished."
    ),
    "export": Command(
        cmd_export,
        partial(command_parser, export_run),
        "Write a run's model as a Hugging Face directory: a transformers Llama (--to hf) or one for "
        "Transformer.from_pretrained (--to hub).",
    ),
    "export-logs": Command(
        cmd_export_logs,
        partial(command_parser, export_logs),
        "Send the logs of a run trained without a tracking sink, or of every run of a study, to TensorBoard, "
        "W&B, MLflow or trackio.",
    ),
    "list": Command(
        cmd_list,
        partial(command_parser, catalogue_text),
        "List the tasks with their parameters, the variants and the recipes.",
    ),
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
        sub.add_subcommand(name, command.parser(), help=command.summary)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """`mixit ARGS`: its exit status. mixit's own warnings are said in one line each (`show_warning`)."""
    with warnings.catch_warnings():
        warnings.showwarning = partial(show_warning, warnings.showwarning)
        return run_command(argv)


def run_command(argv: Sequence[str] | None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    command = args[0] if args and args[0] in COMMANDS else None
    try:
        world = env_world()
    except BadEnvironment as e:
        if command == "train":  # said by every process: there may be no rank 0 to say it
            print(f"mixit train: error: {e}", file=sys.stderr)
            return 2
        world = Dist()  # the other commands run in one process, which reads no distributed variables
    try:
        load_plugins()  # before the parsers are built: a plugin's task is a choice of --task, and in --help
    except UsageError as e:
        return refuse(f"mixit{' ' + command if command else ''}: error: {e}", world)
    parser = build_parser()
    try:
        parsed = parser.parse_args(args, defaults=False).clone(with_meta=False).as_dict()  # no --model FILE path
    except SystemExit as e:  # --help and --version
        return int(e.code or 0)
    except ArgumentError as e:
        where = parser._subcommands_action._name_parser_map[command] if command else parser  # type: ignore[union-attr]
        return refuse(f"mixit{' ' + command if command else ''}: error: {describe(e, where)}", world)
    command = parsed["command"]
    tune_allocator()
    try:
        return COMMANDS[command].run(dict(parsed.get(command) or {}))
    except BadEnvironment as e:  # this process's own environment (its LOCAL_RANK names no GPU, say)
        print(f"mixit {command}: error: {e}", file=sys.stderr)
        return 2
    except UsageError as e:
        return refuse(f"mixit {command}: error: {e}", world)
    except KeyboardInterrupt:
        print(f"mixit {command}: interrupted; {COMMANDS[command].interrupted}", file=sys.stderr)
        return 130


def refuse(message: str, world: Dist) -> int:
    """Exit status 2 for a refusal, `message` printed by rank 0 alone: under torchrun every process refuses, one
    says why, and the others exit once it has (`refusal_said`)."""
    if world.main:
        print(message, file=sys.stderr, flush=True)
    refusal_said(world)
    return 2


def _entry() -> NoReturn:
    sys.exit(main())


if __name__ == "__main__":
    _entry()
