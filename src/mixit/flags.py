"""The options of `mixit`'s commands, generated from typed declarations and parsed by jsonargparse.

Every option is declared once, as a dataclass field or a function parameter with a type hint, a default and a
docstring; `Parser.add_options` turns each into one jsonargparse ``add_argument`` typed by the hint, and `call` maps
the parsed options back onto the function. What mixit adds (two names, ``--compile``/``--no-compile``, comma lists,
--help in the command line's words, one-line refusals) and why: docs/design.md, "Configuration".
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

from jsonargparse import ArgumentError, ArgumentParser, Namespace

from mixit.core.config import field_docs, field_hints, help_type, parsed_doc, short_doc, typed
from mixit.core.tasks import TASKS
from mixit.errors import UsageError, one_line

REQUIRED: Any = dataclasses.MISSING  # the default of an option that has none


@dataclasses.dataclass(frozen=True)
class Option:
    """One option: where its value goes (``model.d_model``), its type, its help text and its default."""

    dest: str
    hint: Any
    doc: str
    default: Any = REQUIRED


def hints_of(target: Any) -> dict[str, Any]:
    """The type of each field of dataclass `target`, or of each parameter of function `target`."""
    if dataclasses.is_dataclass(target):
        return field_hints(target)  # type: ignore[arg-type]
    return {k: v for k, v in typing.get_type_hints(target).items() if k != "return"}


def options_of(target: Any, prefix: str = "") -> list[Option]:
    """An `Option` for each field of dataclass `target` or parameter of function `target` (documented in its Args)."""
    if dataclasses.is_dataclass(target):
        docs = field_docs(target)  # type: ignore[arg-type]
        defaults = {
            f.name: f.default if f.default_factory is dataclasses.MISSING else f.default_factory()
            for f in dataclasses.fields(target)
        }
    else:
        docs = {p.arg_name: " ".join((p.description or "").split()) for p in reversed(parsed_doc(target).params)}
        params = inspect.signature(target).parameters.items()
        defaults = {n: REQUIRED if p.default is p.empty else p.default for n, p in params}
    return [Option(prefix + n, hint, docs.get(n, ""), defaults[n]) for n, hint in hints_of(target).items()]


def kind(hint: Any) -> Literal["hook", "mapping", "list"] | None:
    """What a parameter of type `hint` (or one of its union's members) takes unless a plain value: nothing (a
    library hook), KEY=VALUE items, or a list."""
    union = get_origin(hint) in (typing.Union, types.UnionType)
    origins = {get_origin(a) or a for a in (get_args(hint) if union else (hint,))}
    if collections.abc.Callable in origins:
        return "hook"
    if origins & {dict, collections.abc.Mapping}:
        return "mapping"
    return "list" if origins & {list, tuple, collections.abc.Sequence} else None


def help_default(value: Any) -> Any:
    """A default as typed on the command line: true/false, a list comma-separated (empty: ``[]``), ``""``."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (list, tuple)):
        return ",".join(str(help_default(v)) for v in value) or "[]"
    return '""' if value == "" else value


def help_text(option: Option) -> str:
    """An option's docstring, then its type and default (``%`` doubled for argparse)."""
    shown = "null" if option.default is None else help_default(option.default)
    end = "." if option.default is REQUIRED else f"; default: {shown}."
    return f"{option.doc} Type: {help_type(option.hint)}{end}".replace("%", "%%")


def fill(text: str | None) -> str | None:
    """`text` filled to the terminal, breaking between words only (never inside ``--over-time``); an indented
    line starts a paragraph of its own, its continuation indented further."""
    if text is None:
        return None
    width = shutil.get_terminal_size().columns - 2  # argparse's width
    lines: list[str] = []
    for paragraph in re.sub(r"(?<=\S)\n(?=\S)", " ", text.strip("\n")).splitlines():
        lead = paragraph[: len(paragraph) - len(paragraph.lstrip())]
        more = lead + "    " * bool(lead)
        wrapped = textwrap.wrap(
            " ".join(paragraph.split()), width, initial_indent=lead, subsequent_indent=more, break_on_hyphens=False
        )
        lines += wrapped or [""]
    return "\n".join(lines)


def bracket_lists(argv: Sequence[str], lists: collections.abc.Container[str]) -> list[str]:
    """`argv` with the value of each option named in `lists` bracketed (``--depths 2,4`` -> ``--depths [2,4]``),
    which jsonargparse then reads and checks by the option's type."""

    def bracketed(text: str) -> str:
        return text if text.lstrip().startswith("[") else f"[{text}]"

    out = list(argv)
    for i, word in enumerate(argv):
        name, eq, value = word.partition("=")
        if eq and name in lists:
            out[i] = f"{name}={bracketed(value)}"
        elif word in lists and i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            out[i + 1] = bracketed(argv[i + 1])
    return out


class Parser(ArgumentParser):
    """jsonargparse's parser that raises its errors on one line, with options generated from declarations."""

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
        self.spellings: dict[str, Option] = {}  # each name of an option that takes a value, and the option
        self.commands: dict[str, Parser] = {}  # the parser of each subcommand, by name

    def add_options(
        self,
        target: Any,
        nested_key: str | None = None,
        skip: Sequence[str] = (),
        partial: bool = False,
        shown: Mapping[str, Any] = {},
    ) -> None:
        """Options for the parameters or fields of `target`, under `nested_key` in a group of its own if given. A
        required one is positional unless `partial` (a request, where every option may be left out). `shown`: the
        default --help shows for an option that declares none."""
        options = [
            dataclasses.replace(o, default=shown.get(o.dest, o.default))
            for o in options_of(target, f"{nested_key}." if nested_key else "")
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
                text = option.doc.replace("%", "%%")
                self.add_argument(*self.names(option), action="append", metavar="KEY=VALUE", help=text)
            elif not partial and option.default is REQUIRED:
                group.add_argument(option.dest, type=option.hint, help=help_text(option))
            else:
                self.add_option(option, group)

    def names(self, option: Option) -> list[str]:
        """An option's path, and its bare name with dashes unless another option has it."""
        dashed = "--" + option.dest.rpartition(".")[2].replace("_", "-")
        path = f"--{option.dest}"
        return [path] if dashed in (path, *self.spellings) else [path, dashed]

    def add_option(self, option: Option, group: Any = None) -> None:
        """Add `option` to `group` (this parser by default) by its `names`, a bool as a flag too (``--compile``,
        ``--no-compile``)."""
        group, names = group or self, self.names(option)
        if option.hint is bool:
            extra = {"nargs": "?", "const": True}  # jsonargparse shows {true,false} as its metavar
        elif get_origin(option.hint) is Literal:
            extra = {}  # jsonargparse shows the choices
        else:
            extra = {"metavar": option.dest.rpartition(".")[2].upper()}
        group.add_argument(*names, type=option.hint, help=help_text(option), **extra)
        self.spellings.update(dict.fromkeys(names, option))
        if option.hint is bool:
            negative = f"--no-{names[-1][2:]}"
            help = f"Same as {names[-1]} false."
            group.add_argument(
                negative, dest=option.dest, action="store_const", const=False, default=argparse.SUPPRESS, help=help
            )

    def parse_args(self, args: Sequence[str] | None = None, *more: Any, **kwargs: Any) -> Namespace:  # type: ignore[override]
        """jsonargparse's parse of `args`, lists read comma-separated too; an error is one line (`refusal`)."""
        argv = list(sys.argv[1:] if args is None else args)
        at = next((i + 1 for i, word in enumerate(argv) if word in self.commands), 0)
        parser = self.commands[argv[at - 1]] if at else self
        lists = {name for name, option in parser.spellings.items() if kind(option.hint) == "list"}
        try:
            return super().parse_args([*argv[:at], *bracket_lists(argv[at:], lists)], *more, **kwargs)
        except ArgumentError as error:
            raise ArgumentError(None, parser.refusal(error)) from None

    def refusal(self, error: ArgumentError) -> str:
        """jsonargparse's `error` on one line; a value its option's type refuses is said with the type as --help
        names it, since jsonargparse spells it as Python does, a union over several lines."""
        text = str(error)
        key, value = re.match(r'Parser key "([^"]+)"', text), re.findall(r"(?:Got|Given) value: (.*)", text)
        option = next((o for o in self.spellings.values() if key and o.dest == key[1]), None)
        if option is None or not value:
            return one_line(error)
        return f"{option.dest}: expected {help_type(option.hint)}, got {value[-1]!r}"


def call(function: Callable[..., Any], args: Mapping[str, Any], **hooks: Any) -> Any:
    """`function` called with the parsed options `args`, each dataclass parameter built from its fields' options;
    `hooks` are its Callable parameters."""
    kwargs = arguments(function, args)
    for name, hint in hints_of(function).items():
        if dataclasses.is_dataclass(hint):
            kwargs[name] = hint(**arguments(hint, args))  # type: ignore[operator]
    return function(**kwargs, **hooks)


def arguments(target: Any, args: Mapping[str, Any]) -> dict[str, Any]:
    """The values in `args` for the parameters or fields of `target`, KEY=VALUE items as a dict, task_params
    from ``-p``."""
    names = hints_of(target)
    values = {k: args[k] for k in names if k in args}
    for name, hint in names.items():
        if name in values and kind(hint) == "mapping" and isinstance(values[name], list):
            values[name] = key_values(name, values[name])
    if "task_params" in names and "task_param" in args:
        values["task_params"] = task_params(values.get("task"), args["task_param"])
    return values


def task_params(task: Any, items: Sequence[str]) -> dict[str, Any]:
    """``-p KEY=VALUE`` items, each value read by the type of its field in the task's Config."""
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


def key_values(option: str, items: Sequence[str]) -> dict[str, Any]:
    """``--OPTION KEY=VALUE`` items as a dict of strings for the library to check: a key given again collects its
    values into a list; ``KEY.NAME=VALUE`` sets NAME in a dict under KEY."""
    flag = f"--{option.replace('_', '-')}"
    values: dict[str, Any] = {}
    for item in items:
        key, sep, value = (part.strip() for part in item.partition("="))
        head, dot, name = key.partition(".")
        if not sep or not head or (dot and not name):
            raise UsageError(f"{flag} expects KEY=VALUE (repeatable), got {item!r}")
        where, last = (values.setdefault(head, {}), name) if dot else (values, head)
        if not isinstance(where, dict) or isinstance(where.get(last), dict):
            raise UsageError(f"{flag} {head} is given both as {head}=VALUE and {head}.NAME=VALUE")
        old = where.get(last)
        where[last] = value if old is None else [*(old if isinstance(old, list) else [old]), value]
    return values
