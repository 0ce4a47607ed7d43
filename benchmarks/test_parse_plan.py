"""benchmarks.parse_plan: the frame it plans is the parse, and its command line times each schema."""

from __future__ import annotations

import json

import pytest

from benchmarks.parse_plan import main, parsed


def test_the_planned_frame_is_the_parse_with_its_dead_letters() -> None:
    import sparkstate as ss

    (row,) = [json.loads(r.out) for r in parsed(ss.spark_session(), "a int").collect()]
    assert row.pop("received_at")
    assert row == {"raw": "{}", "raw_bytes": "e30=", "reason": "missing field a", "source": "here"}


def test_command_line_times_each_schema_and_its_baseline(capsys: pytest.CaptureFixture) -> None:
    assert main(["--schema", "a int", "--schema", "b string, c timestamp", "--repeats", "3", "--warmup", "1"]) == 0
    lines = capsys.readouterr().out.splitlines()[1:]
    assert [(line.split()[0], line.split()[-3]) for line in lines] == [
        ("a", "parse_json"), ("a", "from_json"), ("b", "parse_json"), ("b", "from_json")]
    assert all(float(line.split()[-1]) > 0 for line in lines)
