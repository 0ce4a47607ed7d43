"""benchmarks.parse_rate: its records are all good ones, and its command line times each limit."""

from __future__ import annotations

import pytest

from benchmarks.parse_plan import WIDE
from benchmarks.parse_rate import LIMIT, main, records


def test_the_generated_records_of_every_type_are_all_events() -> None:
    import sparkstate as ss
    from sparkstate.io.parse import parse_json

    spark = ss.spark_session()
    schema = WIDE + ", d date, i int"
    parsed = parse_json(records(spark, schema, 50), schema)
    assert parsed.events.count() == 50 and parsed.dead_letters.count() == 0
    assert parsed.events.where("f3 IS NULL OR d IS NULL OR f1 IS NULL").count() == 0


def test_command_line_times_each_limit_and_restores_the_session_s(capsys: pytest.CaptureFixture) -> None:
    import sparkstate as ss

    before = ss.spark_session().conf.get(LIMIT)
    assert main(["--schema", "a int, t timestamp", "--records", "2000", "--repeats", "1"]) == 0
    lines = capsys.readouterr().out.splitlines()[1:]
    assert [line.split()[-4:-2] for line in lines] == [["sparkstate", "8000"], ["spark", "65535"]]
    assert all(float(line.split()[-1]) > 0 for line in lines)
    assert ss.spark_session().conf.get(LIMIT) == before
