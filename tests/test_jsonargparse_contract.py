"""What mixit relies on jsonargparse for (`mixit.flags`), asserted on jsonargparse itself, so that a release that
changes any of it fails here rather than on a user's command line.

mixit hands each option to jsonargparse's public ``add_argument`` with a type hint as its type, and uses nothing
else of it but ``add_subcommands``, ``parse_args``, ``parse_object`` (`mixit.core.config.typed`), the Namespace they
return and the option and value that a refusal names (`mixit.flags.Parser.refusal`)."""

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

import pytest
from jsonargparse import ArgumentError, ArgumentParser


def parser() -> ArgumentParser:
    p = ArgumentParser(exit_on_error=False, formatter_class=argparse.RawDescriptionHelpFormatter, add_help=False)
    p.add_argument("-h", "--help", action="help", help="Show this help message and exit.")
    p.add_argument("--model.d_model", "--d-model", type=int, help="Model width.")
    p.add_argument("--model.d_mlp", type=int | None)
    p.add_argument("--model.bias", "--bias", type=bool, nargs="?", const=True)
    p.add_argument("--no-bias", dest="model.bias", action="store_const", const=False, default=argparse.SUPPRESS)
    p.add_argument("--kind", type=Literal["a", "b"])
    p.add_argument("--depths", type=Sequence[int])
    p.add_argument("--out", type=Path)
    p.add_argument("--lr", type=float)
    p.add_argument("--slurm", action="append", metavar="KEY=VALUE")
    return p


def parse(*argv: str) -> dict:
    return parser().parse_args(list(argv), defaults=False).as_dict()


def test_a_type_hint_parses_the_value():
    assert parse("--d-model", "64", "--model.d_mlp", "null", "--kind", "b", "--out", "runs/x", "--lr", "1e-3") == {
        "model": {"d_model": 64, "d_mlp": None},  # a dotted name nests
        "kind": "b",
        "out": Path("runs/x"),
        "lr": 0.001,
    }
    assert parse("--model.d_model=8") == {"model": {"d_model": 8}}  # every name of an option, either form


def test_what_is_not_given_is_left_out():
    assert parse() == {}  # parse_args(defaults=False): the library's own defaults apply


def test_a_bool_alone_is_true_and_a_second_action_sets_the_same_key():
    assert parse("--bias") == {"model": {"bias": True}}
    assert parse("--bias", "false") == {"model": {"bias": False}}
    assert parse("--no-bias") == {"model": {"bias": False}}


def test_a_list_is_read_in_brackets_only():
    assert parse("--depths", "[2,4]") == {"depths": [2, 4]}
    with pytest.raises(ArgumentError):  # hence mixit.flags.bracket_lists
        parse("--depths", "2,4")


def test_repeated_key_value_items_are_strings_in_order():
    assert parse("--slurm", "a=1", "--slurm", "b=2") == {"slurm": ["a=1", "b=2"]}


@pytest.mark.parametrize(
    "argv",
    [
        ["--kind", "c"],
        ["--bias", "maybe"],
        ["--lr", "nan"],  # a float is finite
        ["--d-model"],
        ["--bogus", "1"],
    ],
)
def test_a_bad_command_line_raises_argument_error(argv):
    with pytest.raises(ArgumentError):
        parse(*argv)


@pytest.mark.parametrize(
    "argv, key, value",
    [
        (["--d-model", "ten"], "model.d_model", "ten"),
        (["--model.d_mlp", "x"], "model.d_mlp", "x"),
        (["--depths", "[2,x]"], "depths", "x"),
    ],
)
def test_a_refused_value_raises_argument_error_naming_its_options_key(argv, key, value):
    with pytest.raises(ArgumentError) as error:
        parse(*argv)
    text = str(error.value)
    assert text.startswith(f'Parser key "{key}":') and text.splitlines()[-1].endswith(f" value: {value}")


def test_a_dict_value_is_read_as_the_command_line_reads_it():
    """`mixit.core.config.typed`: parse_object reads a value by its type as parse_args reads its text, and takes null
    for an option that is not required."""
    got = parser().parse_object({"model": {"d_model": "8", "bias": "false"}, "lr": 2, "kind": None})
    assert (got.model.d_model, got.model.bias, got.lr, got.kind) == (8, False, 2.0, None)


def test_subcommands_nest_each_commands_options_under_its_name():
    top = ArgumentParser(exit_on_error=False)
    sub = top.add_subcommands(dest="command")
    sub.add_subcommand("train", parser())
    assert top.parse_args(["train", "--d-model", "8"], defaults=False).as_dict() == {
        "command": "train",
        "train": {"model": {"d_model": 8}},
    }
    with pytest.raises(ArgumentError, match="invalid choice"):
        top.parse_args(["frobnicate"])


def test_help_is_argparse_formatters_with_the_help_texts_as_given():
    text = parser().format_help()
    assert "--model.d_model MODEL.D_MODEL, --d-model MODEL.D_MODEL" in text and "Model width." in text
    assert "--bias [{true,false}]" in text and "--kind {a,b}" in text
    assert "type:" not in text and "default:" not in text  # jsonargparse's own notes come from its formatter only
