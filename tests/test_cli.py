"""The sparkstate command line: help, and the demo end to end (its summary against its Parquet output)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from sparkstate.cli import main

SCRIPT = Path(sys.executable).with_name("sparkstate")


def test_help_runs_from_the_installed_script():
    done = subprocess.run([str(SCRIPT), "--help"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "usage: sparkstate" in done.stdout and "demo" in done.stdout
    done = subprocess.run([str(SCRIPT), "demo", "--help"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "--events" in done.stdout and "--out" in done.stdout


def test_demo_writes_sessions_and_its_summary_matches_them(spark, tmp_path, capsys):
    out = tmp_path / "demo"
    assert main(["demo", "--events", "400", "--users", "8", "--out", str(out), "--seed", "3"]) == 0
    printed = capsys.readouterr().out

    table = pq.read_table(out / "sessions").to_pylist()  # what the Parquet sink committed
    summary = json.loads((out / "summary.json").read_text())
    assert table and summary["sessions_written"] == len(table)
    assert summary["closed_by"] == dict(Counter(r["closed_by"] for r in table))
    assert summary["users_with_sessions"] == len({r["user_id"] for r in table})
    assert summary["events_in_sessions"] == sum(r["event_count"] for r in table)
    assert all(r["event_count"] == len(r["events"]) for r in table)
    assert summary["input_events"] == 400 == summary["events_in_sessions"] + _open_events(out, summary)
    assert summary["matches_reference"] is True and summary["mismatches"] == []
    assert summary["batches"] == summary["input_files"] + 1  # one per file, then the watermark's

    # The printed table shows the same numbers.
    lines = {line.split("│")[1].strip(): line.split("│")[2].strip() for line in printed.splitlines() if line.count("│") >= 3}
    assert lines["sessions written"] == str(len(table))
    assert lines["still open at the end"] == str(summary["open_sessions"])
    for how, n in summary["closed_by"].items():
        assert lines[f"closed by {how}"] == str(n)
    assert lines["equals the reference"] == "yes"
    assert str(out / "sessions") in printed


def _open_events(out: Path, summary: dict) -> int:
    """Events of the sessions the demo reports as still open (from the generator's reference)."""
    from sparkstate.io import read_events, reference_sessions

    events = read_events(sorted((out / "input").glob("part-*.json")))
    finished = set(reference_sessions(events, summary["gap"], watermark=_ms(summary["final_watermark"])))
    still_open = [s for s in reference_sessions(events, summary["gap"]) if s not in finished]
    assert len(still_open) == summary["open_sessions"]
    return sum(s.event_count for s in still_open)


def _ms(iso: str) -> int:
    from datetime import datetime, timezone

    return int(datetime.strptime(iso, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=timezone.utc).timestamp() * 1000)


def test_demo_refuses_a_directory_it_did_not_make(tmp_path, capsys):
    (tmp_path / "mine.txt").write_text("keep me")
    assert main(["demo", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "was not made by `sparkstate demo`" in err and "Traceback" not in err
    assert (tmp_path / "mine.txt").read_text() == "keep me"


def test_bad_numbers_are_refused_by_the_parser(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["demo", "--events", "0"])
    assert exc.value.code == 2
    assert "expected a positive whole number, got '0'" in capsys.readouterr().err
