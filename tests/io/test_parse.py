"""Parsing raw records into typed rows or dead letters: every record lands in exactly one output."""

from __future__ import annotations

import json
from datetime import datetime

import pytest

from sparkstate.errors import ConfigError
from sparkstate.io.parse import (
    DEAD_LETTER_SCHEMA,
    RAW_PREVIEW_CHARS,
    parse_csv,
    parse_json,
    required_fields,
    to_struct,
)

SCHEMA = "user_id string, event_time timestamp, data string, is_last boolean, n bigint"
GOOD = {"user_id": "u1", "event_time": "2024-01-01T00:00:05.123Z", "data": "/home", "is_last": False, "n": 3}


def line(**changes):
    rec = {**GOOD, **changes}
    return json.dumps({k: v for k, v in rec.items() if v is not ...})


# Each input line with the reason it must get (None: a good record).
CASES = [
    (line(), None),
    (line(user_id="u2", n=None, data=None), None),  # optional fields may be null
    (line(extra={"ignored": True}), None),  # fields outside the schema are ignored
    (line(data={"nested": [1, 2]}), None),  # a string field takes any JSON value as text
    (json.dumps({"user_id": "u3", "event_time": "2024-01-01T00:00:06Z"}), None),  # optional fields missing
    ('{"user_id": "u1", "event_time": ', "not valid JSON"),
    ("definitely not json", "not valid JSON"),
    ("[1, 2, 3]", "not a JSON object"),
    ("42", "not a JSON object"),
    (line(user_id=...), "missing field user_id"),
    (line(user_id=None), "field user_id is null"),
    (line(event_time="abc"), "field event_time: expected timestamp, got 'abc'"),
    (line(n="abc"), "field n: expected bigint, got 'abc'"),
    (line(n=7.5), "field n: expected bigint, got '7.5'"),
    (line(is_last="maybe"), "field is_last: expected boolean, got 'maybe'"),
    ("{}", "missing field user_id; missing field event_time"),
    (line(user_id=None, event_time="x" * 100, n="z"),
     "field user_id is null; field event_time: expected timestamp, got '" + "x" * 60 + "...'; "
     "field n: expected bigint, got 'z'"),
    # Spark holds years outside 1 to 9999, which Python and pandas cannot.
    (line(event_time="10000-01-01T00:00:00Z", is_last="no"),
     "field event_time: timestamp out of range (years 1 to 9999), got '10000-01-01T00:00:00Z'; "
     "field is_last: expected boolean, got 'no'"),
]


def test_every_record_lands_in_exactly_one_output_with_its_reason(spark):
    huge = line(data="x" * 2_000_000)
    lines = [c[0] for c in CASES] + [huge, "", "   "]
    raw = spark.createDataFrame([(i, v) for i, v in enumerate(lines)], "i int, value string")
    parsed = parse_json(raw, SCHEMA, required=("user_id", "event_time"), source=raw["i"].cast("string"))

    events = parsed.events.collect()
    dead = {int(r.source): r for r in parsed.dead_letters.collect()}
    assert parsed.events.columns == ["user_id", "event_time", "data", "is_last", "n"]
    assert parsed.dead_letters.schema.simpleString() == "struct<raw:string,raw_bytes:binary,reason:string,source:string,received_at:timestamp>"
    assert DEAD_LETTER_SCHEMA == "raw string, raw_bytes binary, reason string, source string, received_at timestamp"

    # Blank lines are not records; every other line is in exactly one output.
    good = [i for i, (_, why) in enumerate(CASES) if why is None]
    assert len(events) == len(good)
    assert len(events) + len(dead) == len(lines) - 2
    for i, (text, why) in enumerate(CASES):
        if why is None:
            assert i not in dead
        else:
            assert dead[i].reason == why, text
            assert dead[i].raw == text
    big = dead[len(CASES)]
    assert big.reason == f"record is {len(huge)} bytes, over the limit of 1000000 bytes (max_record_bytes)"
    assert big.raw == huge[:RAW_PREVIEW_CHARS] + "... [truncated]"
    assert all(isinstance(r.received_at, datetime) for r in dead.values())

    # The good records are typed.
    first = next(r for r in events if r.user_id == "u1" and r.data == "/home")
    assert (first.event_time, first.is_last, first.n) == (datetime(2024, 1, 1, 0, 0, 5, 123000), False, 3)
    assert sorted(r.user_id for r in events) == ["u1", "u1", "u1", "u2", "u3"]
    assert next(r for r in events if r.data and "nested" in r.data).data == '{"nested":[1,2]}'

    # The checked frame both outputs are filtered from.
    assert parsed.checked.columns[-3:] == ["_sparkstate_raw", "_sparkstate_reason", "_sparkstate_source"]


def test_max_record_bytes_is_configurable(spark):
    raw = spark.createDataFrame([(line(),), (line(data="y" * 500),)], "value string")
    parsed = parse_json(raw, SCHEMA, max_record_bytes=300)
    assert parsed.events.count() == 1
    assert parsed.dead_letters.first().reason.endswith("over the limit of 300 bytes (max_record_bytes)")
    with pytest.raises(ConfigError, match="max_record_bytes must be a positive whole number, got 0"):
        parse_json(raw, SCHEMA, max_record_bytes=0)


def test_json_options_reach_the_parser(spark):
    raw = spark.createDataFrame([('{"user_id": "u", "t": "01/02/2024 10:00"}',)], "value string")
    parsed = parse_json(raw, "user_id string, t timestamp", options={"timestampFormat": "dd/MM/yyyy HH:mm"})
    assert parsed.events.first().t == datetime(2024, 2, 1, 10, 0)
    default = parse_json(raw, "user_id string, t timestamp")
    assert default.dead_letters.first().reason == "field t: expected timestamp, got '01/02/2024 10:00'"


def test_required_fields_default_to_not_null_columns_else_all():
    assert required_fields(to_struct("id string not null, n bigint"), None) == ("id",)
    assert required_fields(to_struct("a int, b int"), None) == ("a", "b")
    assert required_fields(to_struct("a int, b int"), ()) == ()
    assert required_fields(to_struct("a int, b int"), "b") == ("b",)
    with pytest.raises(ConfigError, match=r"required: 'user' not in the schema; its columns are a, b"):
        required_fields(to_struct("a int, b int"), ["user"])


def test_not_null_columns_are_required_by_default(spark):
    raw = spark.createDataFrame([('{"id": "a"}',), ('{"n": 1}',)], "value string")
    parsed = parse_json(raw, "id string not null, n bigint")
    assert [r.id for r in parsed.events.collect()] == ["a"]
    assert [r.reason for r in parsed.dead_letters.collect()] == ["missing field id"]


def test_bad_schema_and_column_are_config_errors(spark):
    raw = spark.createDataFrame([("{}",)], "value string")
    with pytest.raises(ConfigError, match="schema: cannot parse 'user_id strin g' as a DDL schema"):
        parse_json(raw, "user_id strin g")
    with pytest.raises(ConfigError, match="schema: expected a DDL string"):
        parse_json(raw, 42)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="column 'line' is not in the input; its columns are value"):
        parse_json(raw, "a int", column="line")


def test_csv_lines(spark):
    lines = [
        "u1,2024-01-01T00:00:05Z,/home,false,1",
        'u2,2024-01-01T00:00:06Z,"a,b",true,',
        "u3,abc,/x,false,2",
        "u4,2024-01-01T00:00:05Z,/y,yes,oops",
        ",2024-01-01T00:00:05Z,/y,false,1",
        "u5,2024-01-01T00:00:05Z",
        "u6,2024-01-01T00:00:05Z,/z,false,1,extra",
        '"u7,unterminated',
        "",
        "u8,0000-01-01T00:00:00Z,,,x",
    ]
    raw = spark.createDataFrame([(i, v) for i, v in enumerate(lines)], "i int, value string")
    parsed = parse_csv(raw, SCHEMA, required=["user_id", "event_time"], source=raw["i"].cast("string"))
    events = {r.user_id: r for r in parsed.events.collect()}
    dead = {int(r.source): r.reason for r in parsed.dead_letters.collect()}
    assert sorted(events) == ["u1", "u2"]
    assert events["u2"].data == "a,b" and events["u2"].is_last is True and events["u2"].n is None
    expected_fields = "not valid CSV: expected 5 fields (user_id, event_time, data, is_last, n)"
    assert dead == {
        2: "field event_time: expected timestamp, got 'abc'",
        3: "field is_last: expected boolean, got 'yes'; field n: expected bigint, got 'oops'",
        4: "field user_id is empty",
        5: expected_fields,
        6: expected_fields,
        7: expected_fields,
        9: "field event_time: timestamp out of range (years 1 to 9999), got '0000-01-01T00:00:00Z'; "
           "field n: expected bigint, got 'x'",
    }
