"""The typed configuration: strict checks, every option on the command line,
requests and their resolution, config files and the replay of a run."""

import dataclasses
import json
import math
import re
from typing import Literal, get_args, get_origin

import pytest

from mixit import ModelConfig, RunConfig, TrainConfig, resolve, run_config, train
from mixit.cli import main, train_parser
from mixit.core.config import Config, DataConfig, field_docs, field_hints, typed
from mixit.core.experiment import TASK_DECIDES, flat_options, nest
from mixit.core.run import load_request
from mixit.core.tasks import TASKS
from mixit.errors import UsageError

TINY = {"d_model": 32, "n_heads": 2, "n_layers": 1, "steps": 4, "batch_size": 8, "test_size": 20}


def printed_config(capsys, *args):
    """The resolved config `mixit train ... --print-config` prints."""
    assert main(["train", *args, "--print-config"]) == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out)


# -- the dataclasses ------------------------------------------------------------------------


def test_every_option_has_a_docstring():
    for cls in (ModelConfig, TrainConfig, DataConfig, RunConfig, *(t.Config for _, t in TASKS.items())):
        docs = field_docs(cls)
        assert set(docs) == {f.name for f in dataclasses.fields(cls)}, cls
        assert all(doc and "\n" not in doc for doc in docs.values()), cls


@pytest.mark.parametrize(
    "cls, kwargs, message",
    [
        (TrainConfig, {"lr": "abc"}, "lr must be float, got 'abc'"),
        (TrainConfig, {"lr": math.inf}, "lr must be float, got inf"),
        (TrainConfig, {"lr": math.nan}, "lr must be float, got nan"),
        (TrainConfig, {"steps": 1.5}, "steps must be int, got 1.5"),
        (TrainConfig, {"steps": True}, "steps must be int, got True"),
        (TrainConfig, {"warmup_steps": "ten"}, "warmup_steps must be int or null, got 'ten'"),
        (ModelConfig, {"bias": "maybe"}, "bias must be bool, got 'maybe'"),
        (ModelConfig, {"init_std": None}, "init_std must be float, got None"),
        (ModelConfig, {"causal": 1}, "causal must be bool, got 1"),
        (ModelConfig, {"head": "regression"}, "head must be one of lm or classifier, got 'regression'"),
        (ModelConfig, {"attention": "linear"}, "unknown attention kind 'linear'; allowed: softmax, mixing"),
        (ModelConfig, {"activation": "relu"}, "unknown activation 'relu'; allowed: silu, shaped_leaky_relu"),
    ],
)
def test_values_are_checked_strictly_at_construction(cls, kwargs, message):
    base = {"vocab_size": 16, "n_ctx": 8} if cls is ModelConfig else {}
    with pytest.raises(UsageError, match=f"^{re.escape(message)}"):
        cls(**base, **kwargs)


def test_only_a_rotary_attention_kind_needs_an_even_d_head():
    """The RoPE check reads the kind's declared `rotary`: softmax refuses d_head 3, every other kind builds."""
    from mixit.core.models import ATTENTION, Transformer

    shape = {"vocab_size": 16, "n_ctx": 8, "d_model": 12, "n_heads": 4}  # d_head 3
    assert [name for name in ATTENTION if ATTENTION.get(name).rotary] == ["softmax"]
    with pytest.raises(UsageError, match=r"^RoPE needs an even d_head, got d_model/n_heads = 3$"):
        ModelConfig(**shape)
    for name in ATTENTION:
        if name != "softmax":
            Transformer(ModelConfig(**shape, attention=name))  # builds: nothing splits its d_head in two


def test_values_are_read_as_the_command_line_reads_them():
    """One type system, jsonargparse's: a value in a file or a dict is read as the same text on the command line
    would be (a string "10" for an int is 10, "false" for a bool false), an int for a float becomes a float."""
    tc = TrainConfig(steps="10", lr=1, warmup_steps=None)
    assert (tc.steps, tc.lr, tc.warmup_steps) == (10, 1.0, 1) and isinstance(tc.lr, float)
    assert ModelConfig(vocab_size=16, n_ctx=8, bias="false").bias is False
    assert typed("x", tuple[int, ...], [2, 4]) == (2, 4) and typed("x", int | None, None) is None
    with pytest.raises(UsageError, match=r"^x must be int, got True$"):  # a bool is not an int
        typed("x", int, True)


def test_a_run_config_is_checked_and_written_by_the_same_machinery():
    """RunConfig is a Config: its fields (nested configs, the data options of DataConfig) are typed and checked
    at construction (`typed`), its mapping is read by `from_dict` and written by `to_dict` like any other."""
    cfg = run_config("dyck", "standard", {"max_pairs": 4}, test_size=30)
    assert isinstance(cfg, Config) and cfg.data_config == DataConfig(test_size=30, val_size=30)
    assert list(cfg.to_dict())[:6] == ["task", "variant", "recipe", "task_params", "model", "train"]
    for bad, message in [
        ({"model": 3}, "model must be ModelConfig, got 3"),
        ({"val_size": True}, "val_size must be int or null, got True"),
        ({"test_size": 0}, "test_size must be a positive integer, got 0"),
    ]:
        with pytest.raises(UsageError, match=message):
            dataclasses.replace(cfg, **bad)
    with pytest.raises(UsageError, match=r"unknown model option\(s\) d_modle"):
        RunConfig.from_dict({**cfg.to_dict(), "model": {"d_modle": 3}})


def test_an_integer_is_a_float_and_derived_defaults_are_resolved():
    tc = TrainConfig(steps=500, lr=1)
    assert tc.lr == 1.0 and isinstance(tc.lr, float)
    assert (tc.warmup_steps, tc.eval_every, tc.log_every, tc.checkpoint_every) == (50, 50, 25, 125)
    assert ModelConfig(vocab_size=16, n_ctx=8, d_model=64).d_mlp == 256


def test_flat_names_are_unique_and_cover_every_option():
    model = {f.name for f in dataclasses.fields(ModelConfig)} - set(TASK_DECIDES)
    train_ = {f.name for f in dataclasses.fields(TrainConfig)}
    assert not model & train_
    assert set(flat_options()) == model | train_ | {"data_seed", "test_size", "val_size", "test_seed"}
    assert nest({"d_model": 8, "lr": 0.1, "data_seed": 3}) == {
        "model": {"d_model": 8},
        "train": {"lr": 0.1},
        "data_seed": 3,
    }


# -- the command line is generated from the dataclasses ------------------------------------------


def test_every_option_is_a_flag_with_its_docstring_in_help():
    text = train_parser().format_help()
    for group, cls in (("model", ModelConfig), ("train", TrainConfig)):
        for name, doc in field_docs(cls).items():
            if group == "model" and name in TASK_DECIDES:
                assert f"--{group}.{name}" not in text
                continue
            assert f"--{group}.{name}" in text and f"--{name.replace('_', '-')}" in text, name
            assert doc.split()[0] in text, name


NON_DEFAULT = {
    # A value other than the default for every option, spelled as on the command line.
    "n_ctx": ("40", 40),
    "d_model": ("48", 48),
    "n_layers": ("3", 3),
    "n_heads": ("3", 3),
    "d_mlp": ("100", 100),
    "attention": ("softmax", "softmax"),
    "bias": ("false", False),
    "rope_base": ("500", 500.0),
    "init_std": ("0.05", 0.05),
    "mixing_alpha": ("0.5", 0.5),
    "mixing_sink": ("off", "off"),
    "mixing_centring": ("reference", "reference"),
    "qk_init": ("paper", "paper"),
    "depth_alpha": ("0.5", 0.5),
    "base_n_layers": ("2", 2),
    "down_base_width": ("64", 64),
    "width_scale_head": ("false", False),
    "width_init": ("fan_in", "fan_in"),
    "skip_scale": ("0.9", 0.9),
    "branch_scale": ("0.8", 0.8),
    "activation": ("shaped_leaky_relu", "shaped_leaky_relu"),
    "leaky_c": ("-2", -2.0),
    "width_scaling": ("true", True),
    "base_width": ("256", 256),
    "seed": ("5", 5),
    "causal": ("true", True),
    "head": ("lm", "lm"),
    "n_classes": ("3", 3),
    "pooling": ("mean", "mean"),
    "pad_id": ("12", 12),
    "steps": ("77", 77),
    "batch_size": ("9", 9),
    "lr": ("0.004", 0.004),
    "weight_decay": ("0.2", 0.2),
    "beta1": ("0.8", 0.8),
    "beta2": ("0.95", 0.95),
    "warmup_steps": ("7", 7),
    "min_lr_ratio": ("0.3", 0.3),
    "schedule": ("linear", "linear"),
    "grad_clip": ("0.5", 0.5),
    "eval_every": ("11", 11),
    "log_every": ("3", 3),
    "checkpoint_every": ("13", 13),
    "eval_batch_size": ("17", 17),
}


def sample_value(hint, default):
    """A value of type `hint` other than `default`, and how the command line spells it."""
    if get_origin(hint) is Literal:
        value = next(a for a in reversed(get_args(hint)) if a != default)
        return str(value), value
    options = [a for a in get_args(hint) if a is not type(None)] or [hint]
    kind = options[0]
    if kind is bool:
        return str(not default).lower(), not default
    if kind is int:
        return ("7", 7) if default != 7 else ("8", 8)
    if kind is float:
        return "0.25", 0.25
    return "something", "something"


@pytest.mark.parametrize("group, cls", [("model", ModelConfig), ("train", TrainConfig)])
def test_every_option_parses_from_both_of_its_flags(group, cls):
    """Generated from the dataclasses: an option added tomorrow is covered too."""
    parser = train_parser()
    for f in dataclasses.fields(cls):
        if group == "model" and f.name in TASK_DECIDES:
            continue
        default = f.default if f.default is not dataclasses.MISSING else None
        text, value = sample_value(field_hints(cls)[f.name], default)
        for flag in (f"--{group}.{f.name}", f"--{f.name.replace('_', '-')}"):
            parsed = parser.parse_args([flag, text], defaults=False).as_dict()
            assert parsed[group][f.name] == value, (flag, parsed)


@pytest.mark.parametrize("spelling", ["dotted", "short"])
def test_options_reach_the_resolved_config(spelling, capsys):
    names = flat_options()
    assert set(NON_DEFAULT) <= set(names)
    args = ["--task", "addition", "-p", "n_digits=3", "--data-seed", "4", "--test-size", "30", "--test-seed", "2"]
    for name, (text, _) in NON_DEFAULT.items():
        flag = f"--{names[name]}.{name}" if spelling == "dotted" else f"--{name.replace('_', '-')}"
        args += [flag, text]
    cfg = printed_config(capsys, *args)
    for name, (_, value) in NON_DEFAULT.items():
        assert cfg[names[name]][name] == value, name
    assert (cfg["data_seed"], cfg["test_size"], cfg["test_seed"], cfg["task_params"]["n_digits"]) == (4, 30, 2, 3)


def test_bool_options_read_like_flags(capsys):
    assert printed_config(capsys, "--no-bias")["model"]["bias"] is False
    assert printed_config(capsys, "--bias")["model"]["bias"] is True
    assert printed_config(capsys, "--width-scaling")["model"]["width_scaling"] is True


def test_help_lists_each_tasks_parameters(capsys):
    assert main(["train", "--help"]) == 0
    out = capsys.readouterr().out
    for name in TASKS:
        assert f"  {name}: " in out
    assert "n_digits=10" in out and "--d-model" in out and "--model.d_model" in out


# -- requests --------------------------------------------------------------------------------


def test_layers_of_defaults_task_then_variant_then_request():
    cfg = resolve({"task": "addition", "variant": "mixit", "task_params": {"n_digits": 5}})
    assert (cfg.train.steps, cfg.train.lr, cfg.train.batch_size) == (1000, 3e-3, 128)  # the task's defaults
    assert cfg.model.attention == "mixing"  # the variant's
    assert (cfg.model.vocab_size, cfg.model.n_ctx) == (31, 19)  # the task's alone (n_ctx: the whole example)
    cfg = resolve({"task": "addition", "train": {"steps": 10, "lr": 0.1}, "model": {"n_ctx": 40}})
    assert (cfg.train.steps, cfg.train.lr, cfg.train.eval_every, cfg.model.n_ctx) == (10, 0.1, 1, 40)


@pytest.mark.parametrize(
    "request_, message",
    [
        ({"tsk": "addition"}, r"unknown key\(s\) tsk"),
        ({"model": {"d_modle": 3}}, r"unknown model option\(s\) d_modle"),
        ({"train": {"lr": "abc"}}, "lr must be float, got 'abc'"),
        ({"task_params": [1]}, "task_params must be a mapping"),
        ({"task_params": {"n_digits": "five"}}, "n_digits must be int, got 'five'"),
        ({"model": {"vocab_size": 7}}, "vocab_size comes from the task"),
        ({"variant": "frozen_v"}, "unknown variant 'frozen_v'"),
        ({"data_seed": "one"}, "data_seed must be int, got 'one'"),
        ({"test_seed": 1.5}, "test_seed must be int, got 1.5"),
        ({"test_seed": -1}, r"test_seed must be an integer in \[0, 2\^63\)"),
        ({"model": {"n_ctx": 3}}, "longer than n_ctx=3"),
    ],
)
def test_bad_requests_are_refused(request_, message):
    with pytest.raises(UsageError, match=message):
        resolve(request_)


CONFIGS = [
    run_config("addition", "standard", {"n_digits": 3}),
    run_config("addition", "mixit", {"n_digits": 3}, d_model=64, steps=300, lr=0.01, seed=2, data_seed=5),
    run_config("dyck", "standard", {"max_pairs": 4}, test_seed=3),
    run_config("retrieval", "frozen_qk", {"max_pairs": 4, "vocab": 32}, d_mlp=100, eval_every=7, n_ctx=20),
    run_config("memorization", "random", {"n": 8}, attention="mixing", **ModelConfig.shaped()),
]


@pytest.mark.parametrize("cfg", CONFIGS)
def test_a_config_keeps_its_request_which_resolves_back(cfg):
    assert resolve(cfg.request) == cfg
    assert RunConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg
    built = RunConfig.from_dict(cfg.to_dict())  # field by field: its request spells every option out
    assert built.request["model"]["n_ctx"] == cfg.model.n_ctx and "vocab_size" not in built.request["model"]
    assert resolve(built.request) == cfg


def test_test_seed_reaches_the_task_and_the_run_id():
    from mixit.core.experiment import build_task
    from mixit.study.spec import run_id

    base, other = (
        run_config("dyck", "standard", {"max_pairs": 4}),
        run_config("dyck", "standard", {"max_pairs": 4}, test_seed=3),
    )
    assert other.to_dict()["test_seed"] == 3 and RunConfig.from_dict(other.to_dict()).test_seed == 3
    assert build_task(other).data_config.test_seed == 3 and resolve({"task": "dyck", "test_seed": 3}).test_seed == 3
    assert run_id(other) != run_id(base)
    assert RunConfig.from_dict({k: v for k, v in base.to_dict().items() if k != "test_seed"}) == base  # older records


def test_the_request_is_what_was_asked_for_and_lets_defaults_follow():
    cfg = run_config("addition", "mixit", {"n_digits": 3}, d_model=64, lr=0.01)
    request = cfg.request
    assert request == {
        "task": "addition",
        "variant": "mixit",
        "recipe": "laptop",
        "task_params": {"n_digits": 3},
        "model": {"d_model": 64},
        "train": {"lr": 0.01},
    }
    assert json.loads(json.dumps(request)) == request
    # Another task: n_ctx and the task's own steps follow it; the changed d_model and lr stay.
    other = resolve({**request, "task": "retrieval", "task_params": {"max_pairs": 4, "vocab": 32}})
    assert (other.model.n_ctx, other.model.vocab_size, other.model.d_model) == (11, 32, 64)
    assert (other.train.lr, other.train.steps) == (0.01, 1000)
    # Another step count: the cadences derived from it follow.
    longer = resolve({**request, "train": {**request["train"], "steps": 5000}})
    assert (longer.train.eval_every, longer.train.warmup_steps) == (500, 100)


# -- config files and replay -------------------------------------------------------------------


def test_yaml_toml_and_json_config_files_with_flags_overriding(tmp_path, capsys):
    files = {
        "c.yaml": "task: retrieval\nvariant: mixit\ntask_params:\n  max_pairs: 4\n  vocab: 32\n"
        "model:\n  d_model: 48\ntrain:\n  lr: 0.02\n",
        "c.toml": 'task = "retrieval"\nvariant = "mixit"\n[task_params]\nmax_pairs = 4\nvocab = 32\n'
        "[model]\nd_model = 48\n[train]\nlr = 0.02\n",
        "c.json": json.dumps(
            {
                "task": "retrieval",
                "variant": "mixit",
                "task_params": {"max_pairs": 4, "vocab": 32},
                "model": {"d_model": 48},
                "train": {"lr": 0.02},
            }
        ),
    }
    for name, text in files.items():
        (tmp_path / name).write_text(text)
        assert load_request(tmp_path / name)["model"] == {"d_model": 48}
        cfg = printed_config(capsys, "--config", str(tmp_path / name), "--lr", "0.5", "-p", "max_pairs=5")
        assert (cfg["task"], cfg["variant"], cfg["model"]["d_model"]) == ("retrieval", "mixit", 48)
        assert (cfg["train"]["lr"], cfg["task_params"]) == (0.5, {"max_pairs": 5, "vocab": 32})


def test_a_run_is_replayed_exactly_and_changed_by_flags(tmp_path, capsys):
    cfg = run_config("addition", "mixit", {"n_digits": 2}, **TINY, lr=0.01, seed=3)
    train(cfg, tmp_path / "run", progress=False)
    for source in (tmp_path / "run" / "config.json", tmp_path / "run"):
        assert printed_config(capsys, "--config", str(source)) == cfg.to_dict()
    changed = printed_config(capsys, "--config", str(tmp_path / "run"), "--seed", "4", "-p", "n_digits=3")
    assert changed["model"]["seed"] == 4 and changed["train"]["lr"] == 0.01
    assert changed["model"]["n_ctx"] == 3 * 3 + 4  # the default n_ctx followed the new task parameters
    # The replayed config trains to the same numbers.
    assert main(["train", "--config", str(tmp_path / "run"), "--out", str(tmp_path / "again"), "--no-progress"]) == 0
    first = json.loads((tmp_path / "run" / "summary.json").read_text())["test"]
    second = json.loads((tmp_path / "again" / "summary.json").read_text())["test"]
    assert first == second


@pytest.mark.parametrize(
    "text, message",
    [
        ('{"model": {"bias": "maybe"}}', "bias must be bool, got 'maybe'"),
        ('{"train": {"lr": "abc"}}', "lr must be float, got 'abc'"),
        ('{"model": {"init_std": null}}', "init_std must be float, got None"),
        ('{"task_params": [1]}', "task_params must be a mapping"),
        ('{"model": {"causal": 1}}', "causal must be bool, got 1"),
        ('{"modle": {}}', r"unknown key\(s\) modle"),
        ("[1, 2]", "must hold a mapping"),
        ("{not json", "cannot be parsed"),
    ],
)
def test_bad_config_files_are_one_line_and_exit_2(tmp_path, capsys, text, message):
    path = tmp_path / "c.json"
    path.write_text(text)
    assert main(["train", "--config", str(path), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert re.search(message, err), err
    assert not (tmp_path / "out").exists()
