"""scripts/study_time.py: where a study's time went, from its runs' summaries and file times."""

import importlib.util
import json
import os
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "study_time.py"
spec = importlib.util.spec_from_file_location("study_time", SCRIPT)
study_time = importlib.util.module_from_spec(spec)
spec.loader.exec_module(study_time)


def test_busy_counts_the_time_every_worker_trained_some_sat_idle_and_none_ran():
    assert study_time.busy([(0.0, 10.0), (5.0, 15.0)], 2) == (15.0, 5.0, 10.0, 0.0)
    assert study_time.busy([(0.0, 10.0), (0.0, 10.0), (10.0, 12.0)], 2) == (12.0, 10.0, 2.0, 0.0)  # a tail of one
    assert study_time.busy([(0.0, 10.0), (0.0, 10.0), (30.0, 40.0)], 2) == (40.0, 10.0, 10.0, 20.0)  # a gap


def test_runs_are_read_by_table_role_and_budget(tmp_path):
    entries = [
        {"id": "a", "labels": [{"table": "table3", "seed": 0}], "role": "final"},
        {"id": "b", "labels": [{"table": "table3", "seed": 0, "budget": 2}], "role": "final"},
        {"id": "c", "labels": [{"table": "search", "cell": "table3", "seed": 1_000_003}], "role": "screen"},
        {"id": "d", "labels": [{"table": "table4", "seed": 0}], "role": "final"},  # not finished: left out
    ]
    (tmp_path / "study.json").write_text(json.dumps({"runs": entries}))
    for i, entry in enumerate(entries[:3]):
        run = tmp_path / "runs" / entry["id"]
        run.mkdir(parents=True)
        (run / "config.json").write_text("{}")
        (run / "summary.json").write_text(json.dumps({"wall_seconds_this_session": 10.0 * (i + 1)}))
        os.utime(run / "config.json", (100.0 * i, 100.0 * i))
        os.utime(run / "summary.json", (100.0 * i + 50, 100.0 * i + 50))
    found = study_time.runs(tmp_path)
    assert [(r["table"], r["role"], r["seconds"]) for r in found] == [
        ("table3", "final", 10.0),
        ("table3", "final 2x", 20.0),
        ("table3", "screen", 30.0),
    ]
    assert found[1]["span"] == (100.0, 150.0)


def test_a_window_counts_the_runs_finished_in_it_and_cuts_every_span_to_it():
    found = [{"span": (0.0, 50.0)}, {"span": (40.0, 120.0)}, {"span": (110.0, 130.0)}, {"span": (200.0, 210.0)}]
    finished, spans = study_time.window(found, 100.0, 150.0)
    assert finished == found[1:3]  # the first ended before the window, the last starts after it
    assert spans == [(100.0, 120.0), (110.0, 130.0)]
    assert study_time.busy(spans, 2) == (30.0, 10.0, 20.0, 0.0)  # a run resumed across a gap: busy in neither gap
    assert study_time.utc("1970-01-01T00:01:40") == 100.0
