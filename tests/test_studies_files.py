"""The study files beside the records under docs/results: each is read and planned by the package's own loading
(`load_study_file`, `planned_runs`; nothing is trained), so a file that an option's rename or a grammar change
makes unreadable fails here rather than for the reader who reruns the record. Where a record keeps the runs it
made (config.json of mixit 0.2.0 or later, or a study.json), its study files plan exactly those run ids."""

import json
from pathlib import Path

import pytest

from mixit import RunConfig
from mixit.study import planned_runs
from mixit.study.spec import load_study_file, run_id

RESULTS = Path(__file__).resolve().parents[1] / "docs" / "results"
STUDY_FILES = sorted(p for suffix in ("toml", "yaml", "yml") for p in RESULTS.rglob(f"*.{suffix}"))


def test_the_records_have_study_files():
    """The glob finds them: the 20 of the records made by shell loops and the 4 written as study files."""
    assert len(STUDY_FILES) >= 24
    assert {p.parent.name for p in STUDY_FILES} >= {"analysis", "foundation", "foundation-faithful", "text"}


@pytest.mark.parametrize("path", STUDY_FILES, ids=lambda p: str(p.relative_to(RESULTS)))
def test_a_study_file_beside_a_record_loads_and_plans(path):
    assert planned_runs(load_study_file(path))  # every run resolved, or the file is refused naming its cell


def test_study_names_are_unique():
    """Two files of one name would share their default directory, runs/study-NAME."""
    names = [load_study_file(p).name for p in STUDY_FILES]
    assert len(names) == len(set(names)), sorted(n for n in names if names.count(n) > 1)


def recorded_ids(record: Path) -> set[str]:
    """The run ids a record keeps: the runs of its study.json files, and the configs of its run directories that
    this version reads (mixit 0.2.0 or later wrote them; docs/versioning.md)."""
    ids = set()
    for study_json in record.rglob("study.json"):
        ids |= {run["id"] for run in json.loads(study_json.read_text())["runs"]}
    for config in record.rglob("config.json"):
        data = json.loads(config.read_text())
        if tuple(map(int, data["mixit_version"].split("."))) >= (0, 2, 0):
            ids.add(run_id(RunConfig.from_dict(data["config"])))
    return ids


def test_the_study_files_of_a_record_plan_the_runs_it_keeps():
    records = sorted({p.parent for p in STUDY_FILES})
    checked = []
    for record in records:
        kept = recorded_ids(record)
        if not kept:  # the record's runs were made by mixit 0.1.0, whose configs this version does not read
            continue
        files = [path for path in STUDY_FILES if path.parent == record]
        planned = {p.id for path in files for p in planned_runs(load_study_file(path))}
        assert planned == kept, record.name
        checked.append(record.name)
    assert {"foundation-faithful", "gpu-table4", "gpu-depth", "gpu-table4-epochs"} <= set(checked)
