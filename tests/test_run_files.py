"""`Run` owns its directory: no other module names a run directory's files (but the two that own a part of
it: `mixit.core.checkpoint` its checkpoints, `mixit.tracking` its tracking.json), and the questions others ask of a
run (its state, its summary, its analysis) are answered by `Run`."""

import ast
import os
import stat
import sys
from pathlib import Path

import numpy as np
import pytest

from mixit import Run, run_config, train
from mixit.core.run import FIGURES
from mixit.errors import UsageError
from mixit.export import export_run

SRC = Path(__file__).resolve().parents[1] / "src" / "mixit"

CHECKPOINT_FILES = {"latest", "state.json", "model.safetensors", "optimizer.safetensors"}
"""The names inside a run's checkpoints/ directory (`mixit.core.checkpoint`'s docstring)."""

TRACKING_FILES = {"tracking.json"}
"""What the tracking sinks hold of a run (`mixit.tracking`)."""

RUN_FILES = (
    {
        "config.json",
        "metrics.jsonl",
        "summary.json",
        "tokenizer.json",
        "checkpoints",
        ".lock",
        "analysis",
        "head_scores.json",
        "head_scores.png",
        "attention.npz",
        "attention.png",
        "fixed_patterns.npz",
        "fixed_patterns.png",
        "signal.json",
        "retrieval_by_pairs.json",
        "over_time.json",
        "over_time.png",
        "summary.md",
    }
    | CHECKPOINT_FILES
    | TRACKING_FILES
)
"""The names in a run directory (`mixit.core.run`'s docstring)."""

OWNERS = {
    "core/run.py": RUN_FILES - CHECKPOINT_FILES - TRACKING_FILES,
    "core/checkpoint.py": CHECKPOINT_FILES,
    "tracking.py": TRACKING_FILES,
}
"""The modules that own a part of the run directory, each with the names it alone spells."""

ELSEWHERE = {
    ("files.py", ".lock"): "DirectoryLock's own file: it locks study directories too, and files.py sits below run.py",
    ("core/text/tokenizer.py", "tokenizer.json"): "a task's own artifact, named by the task (tasks sit below run.py)",
    ("analysis/signal.py", "signal.json"): "the output of `mixit signal`, a directory of its own, not a run's",
    ("study/executors.py", "signal.json"): "a study's signal sweeps are `mixit signal` outputs (`extra_result`)",
    ("core/training/loop.py", "latest"): "a value of `train`'s keep_checkpoints (keep only the newest checkpoint)",
    ("study/executors.py", "latest"): "`train`'s keep_checkpoints for a run that is not analysed",
    ("export.py", "model.safetensors"): "an export's weights, the name transformers and huggingface_hub read there",
}
"""(module, name) pairs that name something else that happens to share a run file's name, and why."""


def named_files(path: Path) -> set[str]:
    """The run directory's names that `path` spells as a string literal (an f-string's parts included)."""
    tree = ast.parse(path.read_text())
    return {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and n.value in RUN_FILES}


def test_no_module_but_run_names_a_run_directorys_files():
    offenders = []
    for path in sorted(SRC.rglob("*.py")):
        module = path.relative_to(SRC).as_posix()
        for name in sorted(named_files(path) - OWNERS.get(module, set())):
            if (module, name) not in ELSEWHERE:
                offenders.append(f"src/mixit/{module} names {name!r}: ask `mixit.core.run.Run` instead")
    assert not offenders, "\n".join(offenders)


def test_the_check_sees_names_in_fstrings_and_calls(tmp_path):
    source = tmp_path / "m.py"
    source.write_text('p = run_dir / "summary.json"\nq = f"{run_dir}/analysis/{x}"\nr = open("analysis")\n')
    assert named_files(source) == {"summary.json", "analysis"}


def tiny_cfg():
    return run_config("addition", "standard", {"n_digits": 2}, d_model=16, n_heads=2, n_layers=1, steps=2)


def test_state_goes_absent_started_done(tmp_path):
    run = Run(tmp_path / "r")
    assert run.state() == "absent" and run.summary() is None
    created = Run.create(tmp_path / "r", tiny_cfg())
    created.release()
    assert run.state() == "started"
    created.write_summary({"test": {"token_acc": 0.5}})
    assert run.state() == "done"
    assert Run.open(tmp_path / "r").summary() == {"test": {"token_acc": 0.5}}


def test_analysis_reads_what_it_wrote(tmp_path):
    run = Run(tmp_path)
    analysis = run.analysis
    assert not run.analysed
    assert analysis.head_scores() is None and analysis.signal() is None
    assert analysis.retrieval_by_pairs() is None and analysis.summary() is None and analysis.over_time() is None
    assert all(analysis.figure(f) is None for f in FIGURES)
    analysis.prepare()
    analysis.prepare()  # an analysis again rewrites the files
    scores = {"induction": [[0.25, 0.5]], "icl": None}
    assert analysis.write("head_scores", scores) == tmp_path / "analysis" / "head_scores.json"
    analysis.write("signal", {"trained": {"cosine": [0.1]}, "init": {"cosine": [0.2]}})
    analysis.write("retrieval_by_pairs", {"3": {"accuracy": 1.0, "examples": 4}})
    assert analysis.over_time() is None
    analysis.write("over_time", {"steps": [1, 2, 4]})
    assert analysis.over_time() == {"steps": [1, 2, 4]}
    assert analysis.head_scores() == scores
    assert analysis.signal() == {"trained": {"cosine": [0.1]}, "init": {"cosine": [0.2]}}
    assert analysis.retrieval_by_pairs() == {"3": {"accuracy": 1.0, "examples": 4}}
    assert not run.analysed  # the summary, written last, marks the analysis complete
    analysis.write_summary("# Analysis\n")
    assert run.analysed and analysis.summary() == "# Analysis\n"
    with pytest.raises(ValueError, match="unknown analysis file 'loss'"):
        analysis.write("loss", {})


def test_figures_and_their_arrays(tmp_path):
    analysis = Run(tmp_path).analysis
    analysis.prepare()
    drawn = analysis.figure_path("attention")
    assert analysis.figure("attention") is None
    drawn.write_bytes(b"png")
    assert analysis.figure("attention") == drawn and analysis.figure("head_scores") is None
    saved = analysis.write_arrays("attention", patterns=np.eye(3), tokens=np.arange(3))
    with np.load(saved) as arrays:
        assert arrays["patterns"].tolist() == np.eye(3).tolist() and arrays["tokens"].tolist() == [0, 1, 2]
    with pytest.raises(ValueError, match="unknown analysis figure 'loss'"):
        analysis.figure_path("loss")


def test_analysis_refuses_a_file_in_its_place_and_a_corrupt_file(tmp_path):
    run = Run(tmp_path)
    run.analysis.path.write_text("not a directory")
    with pytest.raises(UsageError, match="exists and is not a directory"):
        run.analysis.prepare()
    run.analysis.path.unlink()
    run.analysis.prepare()
    (run.analysis.path / "signal.json").write_text("[1, 2]")
    with pytest.raises(UsageError, match="not a JSON object"):
        run.analysis.signal()


def test_metrics_frame_is_a_row_per_event_and_a_column_per_number(tmp_path):
    cfg = run_config(
        "addition", "standard", {"n_digits": 2}, d_model=16, n_heads=2, n_layers=1, steps=6, eval_every=3, log_every=2
    )
    train(cfg, tmp_path / "r", progress=False)
    run = Run(tmp_path / "r")
    events, frame = run.metrics(), run.metrics_frame()
    assert frame.columns[:2].tolist() == ["step", "event"]
    assert frame[["step", "event"]].values.tolist() == [[e["step"], e["event"]] for e in events]
    assert frame[frame.event == "eval"].step.tolist() == [0, 3, 6]
    for (_, row), event in zip(frame.iterrows(), events):
        numbers = {k: v for k, v in event.items() if k not in ("step", "event") and type(v) in (int, float)}
        assert row[list(numbers)].tolist() == list(numbers.values())
        assert row.drop(["step", "event", *numbers]).isna().all()  # what other kinds of event hold
    assert {"variant", "frozen", "trainable"}.isdisjoint(frame.columns)  # the freeze report's name and lists


def test_metrics_frame_of_a_run_without_events_or_without_a_run(tmp_path, monkeypatch):
    Run.create(tmp_path / "r", tiny_cfg()).release()  # started: its config, no event yet
    empty = Run(tmp_path / "r").metrics_frame()
    assert empty.columns.tolist() == ["step", "event"] and len(empty) == 0
    with pytest.raises(UsageError, match=r"^\S+nothing holds no mixit run \(no config.json\)$"):
        Run(tmp_path / "nothing").metrics_frame()
    monkeypatch.setitem(sys.modules, "pandas", None)  # how Python sees an environment without pandas
    with pytest.raises(UsageError) as refused:
        Run(tmp_path / "r").metrics_frame()
    assert str(refused.value) == (
        "a DataFrame needs pandas, which is not installed: pip install 'mixit-transformers[notebook]'"
    )


def test_every_file_of_a_run_and_its_exports_has_the_mode_open_gives(tmp_path):
    """Weights included (safetensors writes them 0600 through a temporary file): under umask 022 every file is
    0644, as `open(path, "w")` makes it, so that a group on a cluster reads a run's checkpoints and exports."""
    before = os.umask(0o022)
    try:
        train(tiny_cfg(), tmp_path / "r", progress=False)
        export_run(tmp_path / "r", "hub", tmp_path / "hub")
        export_run(tmp_path / "r", "hf", tmp_path / "hf")
        with open(tmp_path / "plain", "w"):
            pass
    finally:
        os.umask(before)
    assert oct(stat.S_IMODE((tmp_path / "plain").stat().st_mode)) == "0o644"
    files = {p.relative_to(tmp_path).as_posix(): oct(stat.S_IMODE(p.stat().st_mode)) for p in tmp_path.rglob("*")}
    files = {name: mode for name, mode in files.items() if (tmp_path / name).is_file()}
    assert "r/checkpoints/step_0000002/optimizer.safetensors" in files and "hf/model.safetensors" in files
    assert files == dict.fromkeys(files, "0o644")
