"""Versions: run ids that survive a new option, runs written by another mixit version, and the request a
run records."""

import dataclasses
import json
from pathlib import Path

import pytest

from mixit import Run, RunConfig, TrainConfig, UsageError, resolve, run_config, train
from mixit.core.experiment import read_record, record
from mixit.study.spec import run_id
from mixit.version import __version__

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "results"
STUDY = RESULTS / "study-quick-3seeds" / "study.json"
TINY = {"d_model": 16, "n_heads": 2, "n_layers": 1, "steps": 4, "batch_size": 8, "test_size": 16}


def test_the_committed_study_runs_keep_their_ids():
    """Every run of the committed 3-seed quick study (its study.json: each run's id when it was trained, and its
    config) still has that id."""
    runs = json.loads(STUDY.read_text())["runs"]
    assert len(runs) > 100
    for run in runs:
        assert run_id(RunConfig.from_dict(run["config"])) == run["id"]


def test_every_committed_run_record_of_0_2_0_or_later_is_read():
    """The config.json of every run recorded under docs/results (trained at commits from 0.1.0 on) is read by
    this version when 0.2.0 or later wrote it; one 0.1.0 wrote is refused in one line (docs/versioning.md).
    Directories named runs/ are not committed (.gitignore), so a clone has exactly the records counted here."""
    read, refused = 0, 0
    for path in sorted(p for p in RESULTS.rglob("config.json") if "runs" not in p.relative_to(RESULTS).parts):
        data = json.loads(path.read_text())
        if tuple(map(int, data["mixit_version"].split("."))) >= (0, 2, 0):
            assert read_record(data, str(path)).task == data["config"]["task"]
            read += 1
        else:
            with pytest.raises(UsageError, match=r"written by mixit 0\.1\.0 and cannot be read by mixit ") as e:
                read_record(data, str(path))
            assert "\n" not in str(e.value)
            refused += 1
    assert read >= 25 and refused == 36  # records may be added; none by 0.1.0


def with_new_training_option(cfg: RunConfig, value=None) -> RunConfig:
    """`cfg` as a later mixit would resolve it: TrainConfig has gained an option `ema_decay` (default 0.0)."""
    newer = dataclasses.make_dataclass(
        "TrainConfig", [("ema_decay", float, dataclasses.field(default=0.0))], bases=(TrainConfig,)
    )
    options = cfg.train.to_dict() | ({} if value is None else {"ema_decay": value})
    return dataclasses.replace(cfg, train=newer(**options))


def test_an_option_added_with_its_default_keeps_every_id():
    for cfg in (run_config("addition", "mixit", {"n_digits": 3}), run_config("retrieval", d_model=64, lr=0.01)):
        newer = with_new_training_option(cfg)
        assert "ema_decay" in newer.to_dict()["train"]
        assert run_id(newer) == run_id(cfg)
        assert run_id(with_new_training_option(cfg, 0.99)) != run_id(cfg)  # a run that uses it is another run


def written_by(version: str, cfg: RunConfig, drop: tuple[str, ...] = (), add: dict | None = None) -> dict:
    data = record(cfg) | {"mixit_version": version}
    data.pop("request")
    for name in drop:
        del data["config"]["train"][name]
    data["config"]["train"].update(add or {})
    return data


def test_an_older_run_says_what_was_filled_in_from_todays_defaults(capsys):
    cfg = run_config("addition", **TINY)
    data = written_by("0.1.0", cfg, drop=("early_stop", "patience"))
    loaded = read_record(data, "old/config.json")
    assert loaded == cfg
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0
    assert "old/config.json was written by mixit 0.1.0" in err and f"mixit {__version__}'s defaults" in err
    assert "train.early_stop=false" in err and "train.patience=3" in err
    read_record(data, "old/config.json")
    assert capsys.readouterr().err == ""  # once per run and process
    read_record(written_by(__version__, cfg), "same/config.json")
    assert capsys.readouterr().err == ""  # nothing filled in, nothing said


def test_a_run_this_version_cannot_read_is_refused_in_one_line():
    data = written_by("9.0.0", run_config("addition", **TINY), add={"ema_decay": 0.99})
    with pytest.raises(UsageError, match=r"written by mixit 9\.0\.0 and cannot be read by mixit .*ema_decay") as e:
        read_record(data, "new/config.json")
    assert "\n" not in str(e.value)


def test_a_run_records_its_request_and_resume_starts_from_it(tmp_path):
    request = {"task": "addition", "variant": "mixit", "task_params": {"n_digits": 2}, "model": {"d_model": 16}}
    cfg = resolve({**request, "train": {"steps": 4, "batch_size": 8}, "test_size": 16})
    train(cfg, tmp_path / "run", progress=False)
    saved = json.loads((tmp_path / "run" / "config.json").read_text())
    assert saved["request"] == cfg.request and saved["request"]["model"] == {"d_model": 16}
    assert Run.open(tmp_path / "run").request == cfg.request
    assert resolve(Run.open(tmp_path / "run").request) == cfg


def test_a_run_written_before_requests_were_recorded_replays_its_whole_config(tmp_path):
    cfg = run_config("addition", **TINY)
    train(cfg, tmp_path / "run", progress=False)
    path = tmp_path / "run" / "config.json"
    data = json.loads(path.read_text())
    del data["request"]
    path.write_text(json.dumps(data))
    request = Run.open(tmp_path / "run").request
    assert request["model"]["n_ctx"] == cfg.model.n_ctx and resolve(request) == cfg


def test_a_copy_records_the_commit_it_is_told(monkeypatch):
    """A source tree copied to another machine (a GPU machine, a cluster's scratch) may come without its git
    history, or with an older one: MIXIT_COMMIT names its commit. Unset, a checkout's HEAD is recorded, and
    outside a checkout none."""
    import subprocess

    from mixit import version

    monkeypatch.delenv(version.COMMIT_VARIABLE, raising=False)
    assert version.git_commit() is not None  # this checkout
    monkeypatch.setenv(version.COMMIT_VARIABLE, "0123abc")
    assert version.git_commit() == "0123abc"

    def no_git(*args, **kwargs):
        raise FileNotFoundError("git")

    monkeypatch.setattr(subprocess, "run", no_git)
    assert version.git_commit() == "0123abc"
    monkeypatch.delenv(version.COMMIT_VARIABLE)
    assert version.git_commit() is None
