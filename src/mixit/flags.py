"""The options of `mixit`'s commands, generated from typed declarations, on jsonargparse as shipped.

Every option is declared once: a dataclass field or a library function's
parameter, with its type hint, default and docstring (`options_of`). `Parser`
hands each one to jsonargparse as an ordinary ``add_argument`` whose type is
the hint, so jsonargparse parses and checks the value; what mixit adds is said
on that same call, through argparse's public options (docs/design.md,
"Configuration", says why each differs from jsonargparse's own):

- names: the option's path, as jsonargparse spells it (``--model.d_model``,
  ``--data_seed``), and its name alone with dashes (``--d-model``,
  ``--data-seed``); a name in two groups keeps its path only;
- a bool option alone means true (``--compile``), and ``--no-compile`` false;
- a list is comma-separated (``--depths 2,4``, or one: ``--depths 8``):
  jsonargparse reads a list only in brackets, so `Parser.parse_args` brackets
  a list option's value first (`bracket_lists`);
- --help says each option's type and default in the words of the command line
  (``Type: int or null; default: null.``: `help_type`, `help_default`) in its
  help text, printed by argparse's RawDescriptionHelpFormatter, descriptions
  filled here (`fill`): jsonargparse's formatter spells them as Python does
  (``Optional[int]``, ``default: False``);
- a value of the wrong type is refused in one line naming the option, the
  value and the type as --help names it (``train.steps: expected int, got
  'ten'``: `Parser.refusal`), from the option and value that jsonargparse's
  own error names.

What a command's options parse to goes back to the declaration that made
them (`call` calls a library function with them). Four generic rules:

- a parameter typed as a dataclass (`BenchOptions`, say) gives that
  dataclass's fields as options, by name, and is built from them;
- a parameter typed as a Callable is a library hook (a progress callback), no
  option: the caller of `call` supplies it;
- ``task`` beside ``task_params`` takes ``-p KEY=VALUE`` (repeatable) for the
  latter, each value read by the type of its field in the task's Config
  (`task_params`, with `mixit.config.typed`);
- a parameter typed as a mapping (`ReproduceOptions.slurm`) takes ``--NAME
  KEY=VALUE``, repeatable, given to the library as a dict of strings for it to
  check and type (`key_values`).
"""

from __future__ import annotations

import argparse
import collections.abc
import dataclasses
import inspect
import re
import shutil
import sys
import textwrap
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, get_args, get_origin

import docstring_parser
from jsonargparse import ArgumentError, ArgumentParser, Namespace

from mixit.config import field_docs, field_hints, help_type, short_doc, typed
from mixit.errors import UsageError
from mixit.tasks import TASKS

REQUIRED: Any = dataclasses.MISSING
"""The default of an option that has none."""


@dataclasses.dataclass(frozen=True)
class Option:
    """One option, as its declaration says."""

    dest: str
    """Where its value goes: ``model.d_model``, ``steps``."""
    hint: Any
    """Its type."""
    doc: str
    """Its help text, one or more sentences."""
    default: Any = REQUIRED
    """Its default, as --help shows it."""


def hints_of(target: Any) -> dict[str, Any]:
    """The type of each field of dataclass `target`, or of each parameter of function `target`."""
    if dataclasses.is_dataclass(target):
        return field_hints(target)  # type: ignore[arg-type]
    return {k: v for k, v in typing.get_type_hints(target).items() if k != "return"}


def options_of(target: Any, nested_key: str | None = None) -> list[Option]:
    """An `Option` for each field of dataclass `target` (its docstring the field's), or each parameter of function
    `target` (its docstring the function's Args), under `nested_key` (``model``) if given."""
    prefix = f"{nested_key}." if nested_key else ""
    if dataclasses.is_dataclass(target):
        docs = field_docs(target)  # type: ignore[arg-type]
        fields = dataclasses.fields(target)
        defaults = {
            f.name: f.default if f.default_factory is dataclasses.MISSING else f.default_factory() for f in fields
        }
    else:
        args = docstring_parser.parse(inspect.getdoc(target) or "").params
        docs = {p.arg_name: " ".join((p.description or "").split()) for p in reversed(args)}  # the first, if twice
        params = inspect.signature(target).parameters
        defaults = {n: REQUIRED if p.default is p.empty else p.default for n, p in params.items()}
    return [Option(prefix + name, hint, docs.get(name, ""), defaults[name]) for name, hint in hints_of(target).items()]


def kind(hint: Any) -> Literal["hook", "mapping", "list"] | None:
    """What a parameter of type `hint` (or of one of the types its union allows) takes, unless a plain value: a
    library hook (a Callable), which is no option; KEY=VALUE items (`key_values`); a list, comma-separated."""
    allowed = get_args(hint) if get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
    origins = {get_origin(a) for a in allowed}
    if collections.abc.Callable in origins:
        return "hook"
    if dict in allowed or origins & {dict, collections.abc.Mapping}:
        return "mapping"
    return "list" if origins & {list, tuple, collections.abc.Sequence} else None


# -- --help ----------------------------------------------------------------------------------


def help_default(value: Any) -> Any:
    """A default as --help shows it, as it is typed: true/false, a list comma-separated (an empty one ``[]``), an
    empty string ``""``."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (list, tuple)):
        return ",".join(str(help_default(v)) for v in value) or "[]"
    return '""' if value == "" else value


def help_text(option: Option) -> str:
    """An option's help: its docstring, then its type and default (``Type: int; default: 128.``); a ``%`` doubled,
    since argparse formats a help text with %."""
    shown = "null" if option.default is None else help_default(option.default)
    end = "." if option.default is REQUIRED else f"; default: {shown}."
    return f"{option.doc} Type: {help_type(option.hint)}{end}".replace("%", "%%")


def fill(text: str | None) -> str | None:
    """A description or epilog as --help prints it (argparse's RawDescriptionHelpFormatter prints it as given):
    each paragraph filled to the terminal, lines broken between words only (never inside ``--over-time``), and
    an indented line kept as a paragraph of its own, wrapped under itself, further indented."""
    if text is None:
        return None
    width = shutil.get_terminal_size().columns - 2  # argparse's width
    paragraphs: list[str] = []
    for line in text.strip("\n").splitlines():
        if line[:1].strip() and paragraphs and paragraphs[-1][:1].strip():  # goes on with an unindented line
            paragraphs[-1] += " " + line
        else:
            paragraphs.append(line)
    lines: list[str] = []
    for paragraph in paragraphs:
        lead = paragraph[: len(paragraph) - len(paragraph.lstrip())]
        words = " ".join(paragraph.split())
        lines += textwrap.wrap(
            words, width, initial_indent=lead, subsequent_indent=lead + "    " * bool(lead), break_on_hyphens=False
        )
        lines += [] if words else [""]
    return "\n".join(lines)


# -- parsing ---------------------------------------------------------------------------------


def comma_list(text: str) -> str:
    """A list option's value as jsonargparse reads it: ``2,4`` becomes ``[2,4]``."""
    return text if text.lstrip().startswith("[") else f"[{text}]"


def bracket_lists(argv: Sequence[str], lists: collections.abc.Container[str]) -> list[str]:
    """`argv` with the value of each option named in `lists` bracketed (``--depths 2,4`` -> ``--depths [2,4]``),
    which jsonargparse then parses and checks against the option's type."""
    out = list(argv)
    for i, word in enumerate(argv):
        name, eq, value = word.partition("=")
        if eq and name in lists:
            out[i] = f"{name}={comma_list(value)}"
        elif word in lists and i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            out[i + 1] = comma_list(argv[i + 1])
    return out


class Parser(ArgumentParser):
    """jsonargparse's parser, raising on errors (each on one line), with options generated from declarations
    (`add_options`) and the spellings of the module docstring."""

    def __init__(self, description: str | None = None, epilog: str | None = None, **kwargs: Any):
        super().__init__(
            description=fill(description),
            epilog=fill(epilog),
            exit_on_error=False,
            print_config=None,
            formatter_class=argparse.RawDescriptionHelpFormatter,
            add_help=False,
            **kwargs,
        )
        self.add_argument("-h", "--help", action="help", help="Show this help message and exit.")
        self.spellings: dict[str, Option] = {}
        """Each name of an option that takes a value, and the option."""
        self.commands: dict[str, Parser] = {}
        """The parser of each subcommand, by name."""

    def add_options(
        self,
        target: Any,
        nested_key: str | None = None,
        skip: Sequence[str] = (),
        partial: bool = False,
        shown: Mapping[str, Any] = {},
    ) -> None:
        """Options for the parameters of function `target` or the fields of dataclass `target`, under `nested_key`
        (in a group of its own), by the rules of the module docstring. A required parameter is positional, unless
        `partial` (every option may be left out: a request). `shown`: the default --help shows for an option that
        declares none."""
        options = [
            dataclasses.replace(o, default=shown.get(o.dest, o.default))
            for o in options_of(target, nested_key)
            if o.dest.rpartition(".")[2] not in skip
        ]
        dash_p = {"task", "task_params"} <= {o.dest.rpartition(".")[2] for o in options}
        if dash_p:
            self.add_argument(
                "-p",
                "--task-param",
                action="append",
                metavar="KEY=VALUE",
                help="Set a task parameter, the value read as the type the task declares for it; repeat -p for "
                "several (`mixit list` names each task's parameters and defaults).",
            )
        group = self.add_argument_group(short_doc(target).rstrip(".")) if nested_key else self
        for option in options:
            if kind(option.hint) == "hook" or (dash_p and option.dest == "task_params"):
                continue
            if dataclasses.is_dataclass(option.hint) and not dataclasses.is_dataclass(target):
                self.add_options(option.hint)
            elif kind(option.hint) == "mapping":
                text = option.doc.replace("%", "%%")  # no Type: KEY=VALUE items (module docstring)
                self.add_argument(*self.names(option), action="append", metavar="KEY=VALUE", help=text)
            else:
                self.add_option(option, group, positional=not partial and option.default is REQUIRED)

    def names(self, option: Option) -> list[str]:
        """An option's names: its path, and its name alone with dashes unless another option has it."""
        dashed = "--" + option.dest.rpartition(".")[2].replace("_", "-")
        names = [f"--{option.dest}"]
        return names if dashed in (*names, *self.spellings) else [*names, dashed]

    def add_option(self, option: Option, group: Any = None, positional: bool = False) -> None:
        """Add `option` to `group` (this parser by default), its help text saying its type and default: positional,
        or by its `names`, as a flag too if it is a bool (``--compile``, ``--no-compile``)."""
        group = group or self
        if positional:
            group.add_argument(option.dest, type=option.hint, help=help_text(option))
            return
        names = self.names(option)
        flag = option.hint is bool
        # jsonargparse shows the values of a bool or a Literal ({true,false}); any other option, its name.
        metavar = {} if get_origin(option.hint) is Literal else {"metavar": option.dest.rpartition(".")[2].upper()}
        extra = {"nargs": "?", "const": True} if flag else metavar
        group.add_argument(*names, type=option.hint, help=help_text(option), **extra)
        self.spellings.update(dict.fromkeys(names, option))
        if flag:
            group.add_argument(
                f"--no-{names[-1][2:]}",
                dest=option.dest,
                action="store_const",
                const=False,
                default=argparse.SUPPRESS,
                help=f"Same as {names[-1]} false.",
            )

    def parse_args(self, args: Sequence[str] | None = None, *more: Any, **kwargs: Any) -> Namespace:  # type: ignore[override]
        """jsonargparse's parse of `args`, lists read comma-separated (`bracket_lists`); an error is one line
        (`refusal`)."""
        argv = list(sys.argv[1:] if args is None else args)
        at = next((i + 1 for i, word in enumerate(argv) if word in self.commands), 0)
        parser = self.commands[argv[at - 1]] if at else self
        lists = {name for name, option in parser.spellings.items() if kind(option.hint) == "list"}
        try:
            return super().parse_args([*argv[:at], *bracket_lists(argv[at:], lists)], *more, **kwargs)
        except ArgumentError as error:
            raise ArgumentError(None, parser.refusal(error)) from None

    def refusal(self, error: ArgumentError) -> str:
        """jsonargparse's `error` on one line; a value that its option's type refuses said with the type as --help
        names it (``train.steps: expected int, got 'ten'``), since jsonargparse names it as Python does
        (``<class 'int'>``, and a union's every member on lines of their own)."""
        text = str(error)
        key, value = re.match(r'Parser key "([^"]+)"', text), re.findall(r"(?:Got|Given) value: (.*)", text)
        option = next((o for o in self.spellings.values() if key and o.dest == key[1]), None)
        if option is None or not value:
            return one_line(error)
        return f"{option.dest}: expected {help_type(option.hint)}, got {value[-1]!r}"


# -- reading the options back ---------------------------------------------------------------


def call(function: Callable[..., Any], args: Mapping[str, Any], **hooks: Any) -> Any:
    """`function` called with the parsed options `args` (module docstring): each dataclass parameter built from
    the options of its fields, the others as given; `hooks` are its Callable parameters."""
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
        if name in values and kind(hint) == "mapping" and isinstance(values[name], list):
            values[name] = key_values(name, values[name])
    if "task_params" in names and "task_param" in args:
        values["task_params"] = task_params(values.get("task"), args["task_param"])
    return values


def task_params(task: Any, items: Sequence[str]) -> dict[str, Any]:
    """``-p KEY=VALUE`` items, each value read by the type of its field in the task's Config (`typed`)."""
    if task is None:
        raise UsageError("-p/--task-param needs --task")
    if not isinstance(task, str):
        raise UsageError(f"task must be a string, got {task!r}")
    config = TASKS.get(task).Config
    hints, values = field_hints(config), {}
    for item in items:
        key, sep, value = (part.strip() for part in item.partition("="))
        if not sep or not key:
            raise UsageError(f"-p expects KEY=VALUE (e.g. n_digits=5), got {item!r}")
        if key not in hints:
            allowed = ", ".join(f"{k}={v}" for k, v in config().to_dict().items())
            raise UsageError(f"unknown parameter {key!r} for task {task}; allowed: {allowed}")
        values[key] = typed(f"task parameter {key}", hints[key], value)
    return values


def one_line(error: BaseException) -> str:
    """An argparse/jsonargparse message (which may span lines) on one line."""
    return " ".join(str(error).split())


def key_values(option: str, items: Sequence[str]) -> dict[str, Any]:
    """``--OPTION KEY=VALUE`` items as a dict of strings, for the library to check and type: a key given more than
    once collects its values into a list, in order; ``KEY.NAME=VALUE`` sets NAME in a dict under KEY."""
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
