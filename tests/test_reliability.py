"""Reliability (docs/reliability.md): bad input refused with one line and exit
status 2 before any work, whatever the command; run directories safe under
crashes and concurrent processes; caches where they are documented."""

import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from mixit import ModelConfig, Run, TrainConfig, run_config, train
from mixit.cli import main
from mixit.core.config import field_hints
from mixit.core.experiment import TASK_DECIDES
from text_fixtures import sentiment_rows, write_jsonl, write_text_corpus

TINY = [
    "--task",
    "addition",
    "-p",
    "n_digits=2",
    "--d-model",
    "16",
    "--n-heads",
    "2",
    "--n-layers",
    "1",
    "--steps",
    "6",
    "--batch-size",
    "8",
    "--test-size",
    "20",
    "--no-progress",
]
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}


def snapshot(root: Path) -> dict[str, tuple[bytes | None, int]]:
    """Every file's bytes, and every file's and directory's modification time, under `root` (itself included):
    a refused command changes none of them, lock files included."""
    return {
        str(p.relative_to(root)): (p.read_bytes() if p.is_file() else None, p.stat().st_mtime_ns)
        for p in [root, *sorted(root.rglob("*"))]
    }


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """One tiny finished run per kind, and a text corpus, shared by the bad-input cases."""
    root = tmp_path_factory.mktemp("fixtures")
    assert main(["train", *TINY, "--out", str(root / "run")]) == 0
    reviews = write_jsonl(root / "reviews.jsonl", sentiment_rows(300))
    assert (
        main(
            [
                "train",
                "--task",
                "sentiment",
                "-p",
                f"dataset={reviews}",
                "-p",
                "vocab=300",
                "--d-model",
                "16",
                "--n-heads",
                "2",
                "--n-layers",
                "1",
                "--steps",
                "2",
                "--no-progress",
                "--out",
                str(root / "cls"),
            ]
        )
        == 0
    )
    write_text_corpus(root / "corpus.txt", n_docs=40)
    return root


def tampered(trained, tmp_path, how):
    """A copy of the trained run, damaged as `how` says."""
    run = tmp_path / "bad"
    shutil.copytree(trained / "run", run)
    ckpt = run / "checkpoints" / "step_0000006"
    if how == "config_dir":
        (run / "config.json").unlink()
        (run / "config.json").mkdir()
    elif how == "config_garbage":
        (run / "config.json").write_text("{not json")
    elif how == "config_no_entry":
        (run / "config.json").write_text('{"mixit_version": "0.2.0"}')
    elif how == "config_bad_type":
        data = json.loads((run / "config.json").read_text())
        data["config"]["model"]["bias"] = "maybe"
        (run / "config.json").write_text(json.dumps(data))
    elif how == "config_unknown_key":
        data = json.loads((run / "config.json").read_text())
        data["config"]["model"]["d_modle"] = 3
        (run / "config.json").write_text(json.dumps(data))
    elif how == "latest_dangling":
        (run / "checkpoints" / "latest").write_text("step_0000099\n")
    elif how == "weights_truncated":
        (ckpt / "model.safetensors").write_bytes((ckpt / "model.safetensors").read_bytes()[:50])
    elif how == "weights_missing":
        (ckpt / "model.safetensors").unlink()
    elif how == "weights_other_model":
        shutil.copy(trained / "cls" / "checkpoints" / "step_0000002" / "model.safetensors", ckpt / "model.safetensors")
    elif how == "no_checkpoint":
        shutil.rmtree(run / "checkpoints")
    elif how == "analysis_file":
        (run / "analysis").write_text("mine")
    elif how == "state_garbage":
        (ckpt / "state.json").write_text("{not json")
    elif how in ("state_step_text", "state_step_other"):
        data = json.loads((ckpt / "state.json").read_text())
        data["step"] = "6" if how == "state_step_text" else 1000000000000
        (ckpt / "state.json").write_text(json.dumps(data))
    elif how == "metrics_step_text":
        lines = (run / "metrics.jsonl").read_text().splitlines()
        lines[1] = json.dumps({**json.loads(lines[1]), "step": "x"})
        (run / "metrics.jsonl").write_text("\n".join(lines) + "\n")
        (run / "summary.json").unlink()
    elif how == "metrics_middle_garbage":
        lines = (run / "metrics.jsonl").read_text().splitlines()
        lines.insert(2, "garbage{")
        (run / "metrics.jsonl").write_text("\n".join(lines) + "\n")
        (run / "summary.json").unlink()
    return run


def bad_option_cases():
    """Generated from the dataclasses: a value of the wrong type for every option of mixit train."""
    cases = []
    for group, cls in (("model", ModelConfig), ("train", TrainConfig)):
        for f in dataclasses.fields(cls):
            if group == "model" and f.name in TASK_DECIDES:
                continue
            flag = "--" + f.name.replace("_", "-")
            hint = str(field_hints(cls)[f.name])
            if "float" in hint:
                values = ["nan", "inf", "1e400", "abc"]
            elif "int" in hint:
                values = ["1.5", "abc"]
            elif "bool" in hint:
                values = ["maybe"]
            else:  # names: registries or literals
                values = ["no-such-choice"]
            cases += [(["train", flag, v], f.name) for v in values]
    return cases


HAND_CASES = [
    # train: values in range checks and combinations
    (["train", "--steps", "0"], "steps must be a positive integer"),
    (["train", "--steps", "-5"], "steps must be a positive integer"),
    (["train", "--batch-size", "0"], "batch_size must be a positive integer"),
    (["train", "--lr", "0"], "lr must be > 0"),
    (["train", "--lr", "-1"], "lr must be > 0"),
    (["train", "--weight-decay", "-0.1"], "weight_decay must be >= 0"),
    (["train", "--beta1", "1"], "beta1 and beta2 must be in [0, 1)"),
    (["train", "--beta2", "1.5"], "beta1 and beta2 must be in [0, 1)"),
    (["train", "--min-lr-ratio", "2"], "min_lr_ratio must be in [0, 1]"),
    (["train", "--grad-clip", "-1"], "grad_clip must be >= 0"),
    (["train", "--warmup-steps", "-1"], "warmup_steps must be an integer >= 0"),
    (["train", "--eval-every", "0"], "eval_every must be a positive integer"),
    (["train", "--init-std", "0"], "init_std must be > 0"),
    (["train", "--init-std", "inf"], "init_std"),
    (["train", "--mixing-alpha", "nan"], "mixing_alpha"),
    (["train", "--d-model", "30", "--n-heads", "4"], "n_heads must divide d_model"),
    (["train", "--d-model", "12", "--n-heads", "4"], "RoPE needs an even d_head"),
    (["train", "--n-ctx", "10"], "longer than n_ctx=10"),
    (["train", "--n-ctx", "1000000"], "GiB"),
    (["train", "--d-model", "400000"], "GiB"),
    (["train", "--test-size", "100000000"], "GiB"),
    (["train", "--test-size", "0"], "test_size must be a positive integer"),
    (["train", "--data-seed", "-1"], "data_seed must be an integer in [0, 2^63)"),
    (["train", "--seed", "-3"], "seed must be an integer in [0, 2^63)"),
    (["train", "--seed", "99999999999999999999999"], "seed must be an integer in [0, 2^63)"),
    (["train", "--pad-id", "99"], "pad_id must be null or a token id"),
    (["train", "--skip-scale", "-1"], "skip_scale must be >= 0"),
    (["train", "--branch-scale", "0"], "branch_scale > 0"),
    (["train", "--causal", "false"], "causal=false needs the classifier head"),
    (["train", "--n-classes", "1"], "n_classes must be an integer >= 2"),
    (["train", "--base-width", "0"], "base_width must be a positive integer"),
    (["train", "--variant", "frozen_qk", "--attention", "mixing"], "variant 'frozen_qk' uses softmax attention"),
    (["train", "--variant", "nope"], "unknown variant 'nope'"),
    (["train", "--task", "nope"], "unknown task 'nope'"),
    (["train", "--recipe", "nope"], "unknown recipe 'nope'"),
    (["train", "--device", "tpu"], "unknown device 'tpu'"),
    (["train", "--device", "cuda:x"], "device"),
    (["train", "--resume"], "--resume needs --out RUN_DIR"),
    (["train", "--bogus", "1"], "unrecognized arguments"),
    (["train", "--steps"], "expected one argument"),
    # task parameters
    (["train", "-p", "n_digits"], "-p expects KEY=VALUE"),
    (["train", "-p", "=5"], "-p expects KEY=VALUE"),
    (["train", "-p", "digits=3"], "unknown parameter 'digits' for task addition"),
    (["train", "-p", "n_digits=many"], "task parameter n_digits must be int"),
    (["train", "-p", "n_digits=0"], "n_digits must be an integer in [1, 18]"),
    (["train", "-p", "n_digits=19"], "n_digits must be an integer in [1, 18]"),
    (["train", "-p", "n_digits=1"], "nearly every example drawn for the training batch is held out"),
    (["train", "-p", "reference_mask=maybe"], "task parameter reference_mask must be bool"),
    (["train", "--task", "modular_addition", "-p", "p=1"], "p must be an integer >= 2"),
    (["train", "--task", "modular_addition", "-p", "p=10000000"], "GiB"),
    (["train", "--task", "modular_addition", "-p", "train_fraction=1"], "train_fraction must be in (0, 1)"),
    (["train", "--task", "modular_addition", "-p", "train_fraction=nan"], "train_fraction"),
    (["train", "--task", "memorization", "-p", "n=1000000"], "GiB"),
    (["train", "--task", "memorization", "-p", "n=1"], "n must be an integer >= 2"),
    (["train", "--task", "memorization", "-p", "fraction=0"], "fraction must be in (0, 1]"),
    (["train", "--task", "dyck", "-p", "max_pairs=0"], "max_pairs must be an integer >= 1"),
    (["train", "--task", "retrieval", "-p", "vocab=63"], "vocab must be an even integer"),
    (["train", "--task", "retrieval", "-p", "max_pairs=30", "-p", "vocab=100"], "vocab must be an even integer >= 120"),
    (["train", "--task", "induction", "-p", "k=0"], "k must be an integer >= 1"),
    (["train", "--task", "induction", "-p", "alphabet=1"], "alphabet must be an integer >= 2"),
    (["train", "--task", "induction", "-p", "length=1"], "length must be an integer >= 2"),
    (["train", "--task", "lm", "-p", "corpus=nope"], "unknown corpus"),
    (["train", "--task", "lm", "-p", "corpus=/"], "files"),
    (["train", "--task", "lm", "-p", "corpus=/proc"], "special filesystem"),
    (["train", "--task", "lm", "-p", "length=1"], "length must be an integer >= 2"),
    (["train", "--task", "lm", "-p", "max_documents=-1"], "max_documents must be >= 0"),
    (["train", "--task", "lm", "-p", "tokenizer=/no/such/tokenizer.json"], "tokenizer"),
    (["train", "--task", "sentiment", "-p", "dataset=nope"], "unknown"),
    (["train", "--task", "sentiment", "-p", "length=0"], "length must be an integer >= 1"),
    (
        ["train", "--task", "sentiment", "--pooling", "max"],
        "model.pooling: expected one of last or mean",
    ),
    # output paths
    (["train", "--out", "/proc/mixit-run"], "is not writable"),
    (["train", "--out", "/etc/hostname/run"], "is not a directory"),
    (["signal", "--out", "/proc/mixit-signal"], "is not writable"),
    (["bench", "--out", "/proc/mixit.json"], "is not writable"),
    # list
    (["list", "--json", "maybe"], "json"),
    (["frobnicate"], "invalid choice: 'frobnicate'"),
    # eval, sample, analyze on a missing directory
    (["eval", "does/not/exist"], "run directory does/not/exist does not exist"),
    (["sample", "does/not/exist"], "run directory does/not/exist does not exist"),
    (["analyze", "does/not/exist"], "run directory does/not/exist does not exist"),
    (["eval"], "run_dir"),
    # signal
    (["signal", "--variants", "standard,nope"], "unknown variant 'nope'"),
    (["signal", "--depths", "0,2"], "depths must be a non-empty list of positive integers"),
    (["signal", "--depths", "2,x"], "depths: expected comma-separated list of int"),
    (["signal", "--seeds", "0"], "seeds must be a positive integer"),
    (["signal", "--d-model", "30", "--n-heads", "4"], "n_heads must divide d_model"),
    (["signal", "--n-ctx", "1"], "n_ctx must be an integer >= 2"),
    (["signal", "--n-ctx", "100000", "--depths", "32"], "GiB"),
    (["signal", "--mixing-sink", "maybe"], "mixing_sink"),
    # bench
    (["bench", "--variants", "nope"], "unknown variant"),
    (["bench", "--vocab-size", "0"], "vocab_size must be a positive integer"),
    (["bench", "--seq-len", "0"], "seq_len must be a positive integer"),
    (["bench", "--batch-size", "0"], "batch_size must be a positive integer"),
    (["bench", "--dtype", "fp8"], "unknown dtype 'fp8'"),
    (["bench", "--dtype", "bf16", "--device", "cpu"], "bf16"),
    (["bench", "--warmup", "0"], "warmup must be an integer >= 1"),
    (["bench", "--repeats", "0"], "repeats must be an integer >= 1"),
    (["bench", "-p", "n_digits=3"], "-p/--task-param needs --task"),
    (["bench", "--task", "nope"], "unknown task 'nope'"),
    (["bench", "--d-model", "200000"], "GiB"),
    (["bench", "--device", "gpu"], "unknown device 'gpu'"),
]

RUN_CASES = [
    # (command built from the run directory, damage, message)
    (["eval", "{run}", "--batch-size", "0"], None, "batch_size must be a positive integer"),
    (["eval", "{run}", "--batch-size", "100000000"], None, "GiB"),
    (["eval", "{run}", "--device", "tpu"], None, "unknown device"),
    (["eval", "{run}"], "config_dir", "is a directory"),
    (["eval", "{run}"], "config_garbage", "config.json is corrupt"),
    (["eval", "{run}"], "config_no_entry", "no 'config' entry"),
    (["eval", "{run}"], "config_bad_type", "bias must be bool, got 'maybe'"),
    (["eval", "{run}"], "config_unknown_key", "unknown model option(s) d_modle"),
    (["eval", "{run}"], "latest_dangling", "which does not exist: the checkpoint is corrupt"),
    (["eval", "{run}"], "weights_truncated", "corrupt or unreadable"),
    (["eval", "{run}"], "weights_missing", "is missing"),
    (["eval", "{run}"], "weights_other_model", "does not match the model"),
    (["eval", "{run}"], "no_checkpoint", "has no checkpoint yet"),
    (["analyze", "{run}"], "analysis_file", "is not a directory"),
    (["analyze", "{run}", "--example", "-1"], None, "example must be in"),
    (["analyze", "{run}", "--example", "100000"], None, "example must be in"),
    (["analyze", "{run}", "--tokens", "1,2,99"], None, "out-of-range ids [99]"),
    (["analyze", "{run}", "--tokens", "1,x"], None, "tokens: expected comma-separated list of int"),
    (["analyze", "{run}", "--batch", "0"], None, "batch must be a positive integer"),
    (["sample", "{run}"], None, "sampling needs a language-model run"),
    (["sample", "{run}", "--temperature", "nan"], None, "temperature"),
    (["sample", "{run}", "--temperature", "-1"], None, "temperature must be a finite number >= 0"),
    (["sample", "{run}", "--top-k", "-1"], None, "top_k must be >= 0"),
    (["sample", "{run}", "--num-samples", "0"], None, "num_samples must be an integer in [1, 10,000]"),
    (["sample", "{run}", "--num-samples", "100000000"], None, "num_samples must be an integer in [1, 10,000]"),
    (["sample", "{run}", "--max-new-tokens", "0"], None, "max_new_tokens must be an integer in [1, 100,000]"),
    (["sample", "{run}", "--max-new-tokens", "1000000000"], None, "max_new_tokens must be an integer"),
    (["train", "--resume", "--out", "{run}", "--lr", "0.5"], None, "holds a different run"),
    (["train", "--resume", "--out", "{run}"], "config_bad_type", "bias must be bool"),
    (["train", "--resume", "--out", "{run}"], "metrics_middle_garbage", "metrics.jsonl is corrupt at line 3"),
    (["train", "--resume", "--out", "{run}"], "metrics_step_text", "metrics.jsonl is corrupt at line 2"),
    (["train", "--resume", "--out", "{run}"], "state_garbage", "state.json is corrupt"),
    (["train", "--resume", "--out", "{run}"], "state_step_text", "corrupt state.json (step '6'"),
    (["train", "--resume", "--out", "{run}"], "state_step_other", "corrupt state.json (step 1000000000000"),
    (["train", "--resume", "--out", "{run}"], "weights_truncated", "corrupt or unreadable"),
    (["train", "--out", "{run}", *TINY], None, "already holds a run"),
    (["train", "--config", "{run}/config.json", "--out", "{run}"], None, "already holds a run"),
    (["train", "--config", "{run}"], "config_bad_type", "bias must be bool"),
    (["train", "--resume", "--out", "{run}/checkpoints"], None, "holds no mixit run"),
]

CONFIG_CASES = [
    ("c.yaml", "task: [unclosed\n", "cannot be parsed"),
    ("c.toml", "task = \n", "cannot be parsed"),
    ("c.json", "[1, 2]", "must hold a mapping"),
    ("c.yaml", "model: {bias: maybe}\n", "bias must be bool, got 'maybe'"),
    ("c.yaml", "train: {lr: abc}\n", "lr must be float, got 'abc'"),
    ("c.yaml", "model: {init_std: null}\n", "init_std must be float, got None"),
    ("c.yaml", "task_params: [1]\n", "task_params must be a mapping"),
    ("c.yaml", "model: {causal: 1}\n", "causal must be bool, got 1"),
    ("c.yaml", "tsk: addition\n", "unknown key(s) tsk"),
    ("c.yaml", "task: 5\n", "task must be a string"),
    ("c.yaml", "model: 3\n", "model must be a mapping"),
    ("c.toml", "[model]\nd_modle = 3\n", "unknown model option(s) d_modle"),
    ("c.json", '{"train": {"steps": 1.5}}', "steps must be int, got 1.5"),
    ("c.json", '{"data_seed": "one"}', "data_seed must be int, got 'one'"),
    ("c.json", '{"model": {"vocab_size": 7}}', "vocab_size comes from the task"),
    ("missing.yaml", None, "does not exist"),
]


def check_refused(args, cwd, message, capsys):
    before = snapshot(cwd)
    code = main(args)
    err = capsys.readouterr().err
    assert code == 2, (args, err)
    assert len(err.strip().splitlines()) == 1, err
    assert "Traceback" not in err and message in err, (message, err)
    assert snapshot(cwd) == before, "a refused command created or changed a file"


@pytest.mark.parametrize("args, message", bad_option_cases() + HAND_CASES)
def test_bad_input_is_refused_with_one_line(args, message, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    check_refused(args, tmp_path, message, capsys)


@pytest.mark.parametrize("args, damage, message", RUN_CASES)
def test_bad_run_directories_are_refused_with_one_line(args, damage, message, trained, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    run = tampered(trained, tmp_path, damage)
    check_refused([a.replace("{run}", str(run)) for a in args], tmp_path, message, capsys)


@pytest.mark.parametrize("name, text, message", CONFIG_CASES)
def test_bad_config_files_are_refused_with_one_line(name, text, message, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    if text is not None:
        (tmp_path / name).write_text(text)
    check_refused(["train", "--config", name, "--out", "out"], tmp_path, message, capsys)


def test_there_are_at_least_150_bad_input_cases():
    assert len(bad_option_cases()) + len(HAND_CASES) + len(RUN_CASES) + len(CONFIG_CASES) >= 150


# -- data ------------------------------------------------------------------------------------------


def test_labels_must_be_integers_and_empty_texts_are_skipped_and_counted(tmp_path, capsys):
    from mixit.core.text.corpora import load_labelled
    from mixit.errors import UsageError

    rows = sentiment_rows(60)
    for value in (0.4, 0.9, 1.7, "x", True):
        path = write_jsonl(tmp_path / f"bad{value}.jsonl", [*rows, {"text": "odd", "label": value}])
        with pytest.raises(UsageError, match="'label' must hold integers"):
            load_labelled(str(path))
    padded = write_jsonl(tmp_path / "gaps.jsonl", [*rows, {"text": "", "label": 1}, {"text": None, "label": 0}])
    with pytest.warns(UserWarning, match="skipped 2 empty text"):
        data = load_labelled(str(padded))
    assert data.info["empty_texts_skipped"] == 2 and "None" not in data.train.texts + data.test.texts
    csv_path = tmp_path / "x.csv"
    csv_path.write_text("text,label\nfine,1\nalso fine,1.0\n" + "".join(f"text {i},0\n" for i in range(200)))
    data = load_labelled(str(csv_path))
    assert sorted(set(data.train.labels + data.test.labels)) == [0, 1]


LABEL_BOUND = "'label' must hold integers in [0, 100,000)"


@pytest.mark.parametrize(
    "name, label",
    [("huge.csv", "1000000000000"), ("huge.jsonl", 10**23), ("text.jsonl", "1e12"), ("negative.jsonl", -1)],
)
def test_labels_are_bounded_before_anything_is_allocated(name, label, tmp_path, monkeypatch, capsys):
    """A label sizes the label counts and the classifier head: one of 10^12 once asked numpy for 7.28 TiB."""
    monkeypatch.chdir(tmp_path)
    rows = [*sentiment_rows(60), {"text": "odd one out", "label": label}]
    if name.endswith(".csv"):
        (tmp_path / name).write_text("text,label\n" + "".join(f"{r['text']},{r['label']}\n" for r in rows))
    else:
        write_jsonl(tmp_path / name, rows)
    check_refused(
        ["train", "--task", "sentiment", "-p", f"dataset={name}", "--steps", "1"], tmp_path, LABEL_BOUND, capsys
    )


def test_a_tokenizer_whose_ids_pass_its_size_is_refused(tmp_path, monkeypatch, capsys):
    """Token ids index the embedding and size the token counts: an id past the vocabulary is refused on loading."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    monkeypatch.chdir(tmp_path)
    tok = Tokenizer(models.WordLevel({"[UNK]": 0, "the": 1, "cat": 2}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    saved = json.loads(tok.to_str())  # the id set in the file: tokenizers would save every id up to it (a minute)
    saved["model"]["vocab"]["cat"] = 4_000_000_000
    (tmp_path / "tok.json").write_text(json.dumps(saved))
    write_text_corpus(tmp_path / "corpus.txt", n_docs=40)
    args = ["train", "--task", "lm", "-p", "corpus=corpus.txt", "-p", "tokenizer=tok.json", "--steps", "1"]
    check_refused(args, tmp_path, "is corrupt: it holds token id 4,000,000,000", capsys)


def test_local_files_and_hub_copies_cache_under_mixit_cache_only(tmp_path, monkeypatch):
    from mixit.core.text.corpora import load_corpus

    cache = tmp_path / "mixit-cache"
    hf_default = tmp_path / "hf-default"
    monkeypatch.setenv("MIXIT_CACHE", str(cache))
    monkeypatch.setenv("HF_DATASETS_CACHE", str(hf_default))
    monkeypatch.setenv("HF_HOME", str(hf_default))
    write_jsonl(tmp_path / "docs.jsonl", [{"text": f"document {i} " * 20} for i in range(30)])
    load_corpus(str(tmp_path / "docs.jsonl"))
    assert any((cache / "hf-datasets").rglob("*.arrow")) and not hf_default.exists()
    shutil.rmtree(cache)
    import pyarrow as pa
    import pyarrow.parquet as pq

    copy = tmp_path / "wikitext" / "wikitext-103-raw-v1"
    copy.mkdir(parents=True)
    for split in ("train", "validation", "test"):
        pq.write_table(
            pa.table({"text": [" = Title = \n", "some text\n"] * 5}), copy / f"{split}-00000-of-00001.parquet"
        )
    load_corpus("wikitext-103", data_dir=str(tmp_path / "wikitext"))
    assert (cache / "hf-datasets").is_dir() and not hf_default.exists()


# -- run directories under crashes and concurrency ------------------------------------------------


def cli(*args):
    return [sys.executable, "-m", "mixit.cli", *args]


SLOW = [
    "--task",
    "addition",
    "-p",
    "n_digits=3",
    "--d-model",
    "32",
    "--n-heads",
    "2",
    "--n-layers",
    "1",
    "--batch-size",
    "64",
    "--test-size",
    "50",
    "--no-progress",
]


def test_two_processes_never_share_a_run_directory(tmp_path, capsys):
    """The holder is a process of its own; the commands it refuses run here (another process all the same)."""
    out = tmp_path / "run"
    first = subprocess.Popen(
        cli("train", *SLOW, "--steps", "100000", "--out", str(out)),
        env=ENV,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.time() + 120
        while not (out / "config.json").exists() and time.time() < deadline:
            time.sleep(0.2)
        assert (out / "config.json").exists(), first.stderr.read() if first.poll() is not None else "no run"
        holder = (out / ".lock").read_text().strip()
        capsys.readouterr()
        for args in (["train", *SLOW, "--steps", "10", "--out", str(out)], ["train", "--resume", "--out", str(out)]):
            code, err = main(args), capsys.readouterr().err
            assert code == 2, err
            assert err.strip().count("\n") == 0
            assert "already holds a run" in err or f"in use by another mixit process (pid {holder})" in err
        code, err = main(["train", "--resume", "--out", str(out)]), capsys.readouterr().err
        assert code == 2 and f"(pid {holder})" in err
    finally:
        first.kill()
        first.wait()
    # Once the holder is gone (killed, so it released nothing itself), the kernel has dropped the lock.
    run = Run.open(out)
    run.acquire()
    run.release()


def test_two_new_runs_racing_into_one_directory_cannot_both_start(tmp_path):
    out = tmp_path / "race"
    procs = [
        subprocess.Popen(
            cli("train", *SLOW, "--steps", "30", "--out", str(out)),
            env=ENV,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    results = [(p.wait(timeout=300), p.stderr.read()) for p in procs]
    codes = sorted(code for code, _ in results)
    assert codes == [0, 2], results
    loser = next(err for code, err in results if code == 2)
    assert "in use by another mixit process" in loser or "already holds a run" in loser
    events = Run.open(out).metrics()
    assert [e["step"] for e in events if e["event"] == "eval"] == [0, 3, 6, 9, 12, 15, 18, 21, 24, 27, 30]


KILL_IN_CHECKPOINT = """
import os, signal, sys
import mixit.core.checkpoint as checkpoint_module
calls = {"n": 0}
original = checkpoint_module.save_file
def dying_save_file(tensors, path):
    original(tensors, path)
    calls["n"] += 1
    if calls["n"] == int(os.environ["MIXIT_TEST_DIE_AT"]):  # after this many checkpoint files, die mid-write
        os.kill(os.getpid(), signal.SIGKILL)
checkpoint_module.save_file = dying_save_file
from mixit.cli import main
sys.exit(main(sys.argv[1:]))
"""


def weights_and_state(run_dir):
    ckpt = Run.open(run_dir).latest_checkpoint()
    return load_file(str(ckpt / "model.safetensors")), load_file(str(ckpt / "optimizer.safetensors"))


def metric_events(run_dir):
    return [{k: v for k, v in e.items() if k != "elapsed_s"} for e in Run.open(run_dir).metrics()]


def test_killed_at_random_points_and_inside_checkpoint_writes_a_run_resumes_to_the_same_result(tmp_path):
    args = ["train", *SLOW, "--steps", "40", "--checkpoint-every", "5", "--eval-every", "5", "--log-every", "5"]
    reference = tmp_path / "whole"  # trained here: only the killed run needs processes of its own
    assert main([*args, "--out", str(reference)]) == 0
    out = tmp_path / "killed"
    rng = torch.Generator().manual_seed(0)
    # Three kills inside a checkpoint write (after its first file, after its second), then kills at random times.
    for die_at in (1, 4, 5):
        proc = subprocess.run(
            [
                sys.executable,
                "-c",
                KILL_IN_CHECKPOINT,
                *args,
                "--out",
                str(out),
                *(["--resume"] if (out / "config.json").exists() else []),
            ],
            env={**ENV, "MIXIT_TEST_DIE_AT": str(die_at)},
            capture_output=True,
            timeout=300,
        )
        assert proc.returncode == -signal.SIGKILL, proc.stderr
    for _ in range(4):
        proc = subprocess.Popen(
            cli(*args, "--out", str(out), "--resume"), env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        time.sleep(2.0 + 3.0 * torch.rand(1, generator=rng).item())
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert main([*args, "--out", str(out), "--resume"]) == 0
    a, b = weights_and_state(reference), weights_and_state(out)
    for x, y in zip(a, b):
        assert x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x)
    assert metric_events(out) == metric_events(reference)
    assert not [p for p in [*out.iterdir(), *(out / "checkpoints").iterdir()] if p.name.endswith(".tmp")]
    assert (
        json.loads((out / "summary.json").read_text())["test"]
        == json.loads((reference / "summary.json").read_text())["test"]
    )


def interrupted_run(path):
    """A tiny run stopped after step 7 of 10 (its last checkpoint at step 5): its config."""
    cfg = run_config(
        "addition",
        "standard",
        {"n_digits": 2},
        d_model=16,
        n_heads=2,
        n_layers=1,
        steps=10,
        batch_size=8,
        test_size=20,
        checkpoint_every=5,
    )

    class Stop(Exception):
        pass

    def stop(step, loss):
        if step == 7:
            raise Stop

    with pytest.raises(Stop):
        train(cfg, path, progress=False, on_step=stop)
    return cfg


def test_a_torn_last_metrics_line_is_tolerated_on_resume(tmp_path, capsys):
    cfg = interrupted_run(tmp_path / "run")
    with open(tmp_path / "run" / "metrics.jsonl", "a") as f:
        f.write('{"step": 8, "event": "tra')  # a process killed while writing a line
    summary = train(cfg, tmp_path / "run", resume=True, progress=False)
    assert summary["steps"] == 10 and "ignoring a torn last line" in capsys.readouterr().err
    steps = [e["step"] for e in Run.open(tmp_path / "run").metrics() if e["event"] == "train"]
    assert steps == sorted(set(steps))
    assert sum(e["event"] == "freeze" for e in Run.open(tmp_path / "run").metrics()) == 1


def test_a_resume_removes_what_killed_writes_left_and_a_refused_one_changes_nothing(tmp_path, monkeypatch, capsys):
    run = tmp_path / "run"
    cfg = interrupted_run(run)
    # What processes killed inside write_text and save_checkpoint leave, and a file of a live `mixit analyze`.
    leftovers = [run / ".metrics.jsonl.4242.tmp", run / ".summary.json.4242.tmp", run / "checkpoints/.latest.4242.tmp"]
    for path in leftovers:
        path.write_text("half")
    (run / "checkpoints" / "step_0000010.tmp").mkdir()
    (run / "checkpoints" / "step_0000010.tmp" / "model.safetensors").write_bytes(b"half")
    (run / "analysis").mkdir()
    (run / "analysis" / ".head_scores.json.4343.tmp").write_text("being written")
    monkeypatch.chdir(tmp_path)
    check_refused(["train", "--resume", "--out", "run", "--lr", "0.5"], tmp_path, "holds a different run", capsys)
    assert train(cfg, run, resume=True, progress=False)["steps"] == 10
    assert not any(path.exists() for path in leftovers)
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["latest", "step_0000010"]
    assert (run / "analysis" / ".head_scores.json.4343.tmp").exists()
    assert (run / ".lock").read_text() == f"{os.getpid()}\n"


def test_checkpoint_pruning_keeps_what_is_not_mixits(tmp_path):
    cfg = run_config(
        "addition",
        "standard",
        {"n_digits": 2},
        d_model=16,
        n_heads=2,
        n_layers=1,
        steps=10,
        batch_size=8,
        test_size=20,
        checkpoint_every=5,
    )

    def keep_a_copy(step, loss):
        if step == 6:  # a user's copy of the step-5 checkpoint, beside mixit's own
            shutil.copytree(
                tmp_path / "run" / "checkpoints" / "step_0000005", tmp_path / "run" / "checkpoints" / "my-copy"
            )

    train(cfg, tmp_path / "run", progress=False, on_step=keep_a_copy)
    names = sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir())
    assert names == ["latest", "my-copy", "step_0000010"]


def test_a_refused_run_leaves_nothing_behind(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["train", "-p", "n_digits=1", "--out", "nd1"]) == 2
    assert main(["train", "--task", "memorization", "-p", "n=1000000", "--out", "mem"]) == 2
    capsys.readouterr()
    assert list(tmp_path.iterdir()) == []


def test_the_training_subpackage_is_importable_beside_the_train_function():
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            "import mixit.core.training.loop, mixit.core.run; import mixit; "
            "print(callable(mixit.train), mixit.core.training.loop.train is mixit.train)",
        ],
        capture_output=True,
        text=True,
        env=ENV,
        timeout=120,
    )
    assert proc.stdout.split() == ["True", "True"], proc.stderr
