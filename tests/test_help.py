"""`mixit --help` and `mixit COMMAND --help` read well: every help text is a sentence, and types and defaults
are spelled as a user types them, not as Python prints them.

The checks walk each parser's actions (every option, every subcommand line), so an option added to any
command later is checked too, and each command is its own test case, so a failure names the command."""

import argparse
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

import pytest

from mixit.cli import COMMANDS, build_parser
from mixit.core.config import help_type
from mixit.core.tasks import TASKS
from mixit.flags import Parser, fill, help_default

TOP = "mixit"  # the test case of `mixit --help` itself

UNREADABLE = ("<class", "typing.", "NoneType", "Optional[", "Union[", "Literal[", "collections.abc", "ForwardRef")
"""Spellings of a type that Python prints and a user need not read."""

PYTHON_VALUES = re.compile(r"\((?:[^()]*, )?type: [^()]*\|[^()]*\)|default: (?:True|False|\(|\[(?!\])|\)|,)")
"""A union spelled with `|`, or a default printed as a Python bool, tuple or list or as nothing, in an option's
(type: ..., default: ...) note."""


def parser_of(command):
    parser = build_parser()
    return parser if command == TOP else parser._subcommands_action._name_parser_map[command]


def help_texts(parser):
    """(what, text) for the help of each action of `parser`, subcommand lines included; text is None where an
    action has no help."""
    formatter = parser._get_formatter()
    for action in parser._actions:
        if action.help == argparse.SUPPRESS:
            continue
        name = "/".join(action.option_strings) or action.dest
        if isinstance(action, argparse._HelpAction):  # jsonargparse capitalises argparse's own text
            yield name, formatter._get_help_string(action)
            continue
        yield name, action.help
        for choice in getattr(action, "_choices_actions", ()):  # the commands' lines in `mixit --help`
            yield f"{choice.dest} (its line in `mixit --help`)", choice.help


def not_a_sentence(text):
    """Why `text` is no sentence, or None: it must start with a capital letter (or a `code name`), end with a
    full stop, and have more than one word."""
    if not text or not text.strip():
        return "there is none"
    text = text.strip()
    if not (text[0].isupper() or text[0] == "`"):
        return "it does not start with a capital letter or a `code name`"
    if not text.endswith("."):
        return "it does not end with a full stop"
    if len(text.split()) < 2:
        return "it is one word"
    return None


COMMAND_NAMES = [TOP, *COMMANDS]


@pytest.mark.parametrize("command", COMMAND_NAMES)
def test_every_help_text_is_a_sentence(command):
    parser = parser_of(command)
    problems = [
        f"{what}: {why}: {text!r}"
        for what, text in [("the description", parser.description), *help_texts(parser)]
        if (why := not_a_sentence(text)) is not None
    ]
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("command", COMMAND_NAMES)
def test_types_and_defaults_are_readable(command):
    text = " ".join(parser_of(command).format_help().split())  # on one line: a note may wrap anywhere
    found = [text[max(i - 60, 0) : i + 40] for i in (text.find(s) for s in UNREADABLE) if i >= 0]
    assert not found + PYTHON_VALUES.findall(text), "\n".join(found + PYTHON_VALUES.findall(text))


@pytest.mark.parametrize("task", TASKS.names())
def test_task_parameters_read_well(task):
    # Their docstrings are what `mixit list` says of each, and the help of such a parser.
    parser = Parser()
    parser.add_options(TASKS.get(task).Config, partial=True)
    problems = [f"{what}: {why}: {text!r}" for what, text in help_texts(parser) if (why := not_a_sentence(text))]
    assert not problems, "\n".join(problems)
    line = next(line for line in parser_of("train").epilog.splitlines() if line.startswith(f"  {task}: "))
    assert not re.search(r"=(True|False|None)?(,|$)", line), line  # values as typed: true, false, ""


@pytest.mark.parametrize(
    ("hint", "name"),
    [
        (int, "int"),
        (Path, "Path"),
        (bool, "bool"),
        (int | None, "int or null"),
        (Path | None, "Path or null"),
        (Literal["hf", "hub"], "one of hf or hub"),
        (Literal["a", "b", "c"] | None, "one of a, b, c or null"),
        (Sequence[int], "comma-separated list of int"),
        (tuple[str, ...] | None, "comma-separated list of str or null"),
        (list[Literal["tensorboard", "wandb"]], "comma-separated list, each one of tensorboard or wandb"),
        (dict[str, str], "mapping of str to str"),
    ],
)
def test_a_type_is_named_in_the_words_of_the_command_line(hint, name):
    assert help_type(hint) == name


def test_a_default_is_shown_as_it_is_typed():
    assert [help_default(v) for v in (True, False, ("a", "b"), [2, 4], (), "", None, 0.5)] == [
        "true",
        "false",
        "a,b",
        "2,4",
        "[]",
        '""',
        None,
        0.5,
    ]


def test_the_checks_catch_a_fragment_and_a_python_type():
    parser = build_parser()._subcommands_action._name_parser_map["eval"]
    action = parser._option_string_actions["--device"]
    assert not_a_sentence(action.help) is None
    for fragment in ("auto, cpu, cuda or cuda:N.", "Auto, cpu, cuda or cuda:N", "Device."):
        action.help = fragment
        assert any(not_a_sentence(text) for _, text in help_texts(parser))
    assert PYTHON_VALUES.search("(type: int | null, default: null)")
    assert PYTHON_VALUES.search("(type: str, default: ('standard', 'mixit'))")
    assert PYTHON_VALUES.search("(type: comma-separated list of str, default: )")
    assert not PYTHON_VALUES.search("(type: int or null, default: null) a | b (x)")


def test_a_description_is_filled_between_words_never_inside_an_option_name(monkeypatch):
    monkeypatch.setenv("COLUMNS", "16")  # argparse's width, and fill's: 14 columns
    lines = fill("use --over-time here, then --d-model").splitlines()
    assert lines == ["use", "--over-time", "here, then", "--d-model"]  # not "use --over-" and "time here,"
