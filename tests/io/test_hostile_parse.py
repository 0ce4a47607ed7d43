"""The documented fate of each hostile record (docs/jobs.md "Dead letters and hostile bytes"), and the
dead-letter contract on many Hypothesis-drawn records, through the parser on static frames (fast)."""

from __future__ import annotations

import pytest
from pyspark.sql import functions as F

from sparkstate.io.parse import parse_csv, parse_json
from tests.io.hostile import KAFKA, draw

SCHEMA = "word string, n bigint, x double, t timestamp"


def _frame(spark, values):
    rows = [(i, v) for i, v in enumerate(values)]
    return spark.createDataFrame(rows, "i int, b binary").select(
        F.col("b").cast("string").alias("value"), F.concat(F.lit("row@"), F.col("i").cast("string")).alias("where"))


def _parse(spark, values, schema=SCHEMA, **kw):
    p = parse_json(_frame(spark, values), schema, source=F.col("where"), required=["word"], **kw)
    good = {r["where"]: r for r in p.checked.where(F.col("_sparkstate_reason").isNull())
            .select(F.col("_sparkstate_source").alias("where"), *[F.col(c) for c in ("word", "n", "x", "t")
                                                                 if c in p.events.columns]).toArrow().to_pylist()}
    dead = {r["source"]: r for r in p.dead_letters.toArrow().to_pylist()}
    return good, dead


CASES = [
    (b'\xef\xbb\xbf{"word": "a"}', "dead", "not valid JSON"),
    (b'\xff\xfe{"word": "a"}', "dead", "not valid JSON"),
    (b'{"word": "a\xffb"}', "good", "a\ufffdb"),
    (b'{"word": "a', "dead", "not valid JSON"),
    (b"[1]", "dead", "not a JSON object"),
    (b'{"word": "a\\u0000b"}', "good", "a\x00b"),
    (b'{"word": "\\ud800"}', "good", "?"),
    (b'{"word": "a", "word": "b"}', "good", "b"),
    (b'{\r\n"word":\r\n"c"\r\n}', "good", "c"),
    (b'{"word": "a", "n": 1e400}', "dead", "field n"),
    (b'{"word": "a", "n": 123456789012345678901234567890}', "dead", "field n"),
    (b'{"word": "a", "x": NaN}', "good", "a"),  # a double holds NaN and Infinity
    (b'{"word": "b", "x": -Infinity}', "good", "b"),
    (b'{"word": [1, {"a": 2}]}', "good", '[1,{"a":2}]'),
    (b'{"word": "a", "t": "0000-01-01T00:00:00Z"}', "dead", "field t"),
    (b'{"word": "a", "t": "10000-01-01T00:00:00Z"}', "dead", "field t"),
]


def test_each_hostile_record_has_its_documented_fate(spark):
    good, dead = _parse(spark, [c[0] for c in CASES])
    for i, (value, fate, what) in enumerate(CASES):
        where = f"row@{i}"
        assert (where in good) != (where in dead), value
        if fate == "good":
            assert where in good and good[where]["word"] == what, (value, good.get(where), dead.get(where))
        else:
            assert where in dead and dead[where]["reason"].startswith(what), (value, dead.get(where))
            assert dead[where]["raw_bytes"] == value
            assert dead[where]["raw"] == value.decode("utf-8", "replace")


def test_hypothesis_records_keep_the_dead_letter_contract(spark):
    """Many drawn records (and oversized ones): each in exactly one output; dead letters valid text + exact bytes."""
    records = draw(KAFKA, n=max(200, 3 * len(draw(KAFKA))))
    values = [h.value for h in records] + [b'{"word": "' + b"\xff" * 3000 + b'"}']
    good, dead = _parse(spark, values, schema="word string", max_record_bytes=2048)
    assert len(good) + len(dead) == len(values)
    for i, value in enumerate(values):
        where = f"row@{i}"
        h = records[i] if i < len(records) else None
        if h is not None and h.expect == "good":
            assert where in good and good[where]["word"] == h.word, (h, dead.get(where))
        if h is not None and h.expect == "dead" or value is None or len(value) > 2048:
            assert where in dead, (value, good.get(where))
        if where in dead:
            r = dead[where]
            assert r["reason"]
            assert r["raw_bytes"] == value
            text = None if value is None else value.decode("utf-8", "replace")
            assert r["raw"] == (text if value is None or len(value) <= 2048 else text[:1024] + "... [truncated]")
    assert dead[f"row@{len(values) - 1}"]["reason"] == "record is 3012 bytes, over the limit of 2048 bytes" \
                                                    " (max_record_bytes)"


@pytest.mark.parametrize("line", [b"a\xff,1", b"\xc0\xaf,2", b"\x00,3", b"\xef\xbb\xbfb,4"])
def test_csv_fields_reach_the_output_as_valid_text(spark, line):
    p = parse_csv(_frame(spark, [line]), "word string, n int")
    rows = p.events.toArrow().to_pylist() + p.dead_letters.toArrow().to_pylist()
    assert len(rows) == 1
    for r in p.dead_letters.toArrow().to_pylist():
        assert r["raw_bytes"] == line and r["reason"]


def test_csv_files_empty_quoted_field_and_nul_have_their_documented_fate(spark, tmp_path):
    """Spark's CSV reader on files: ``""`` is an empty field (a dead letter, not a failed batch); NUL, a BOM
    and surrounding spaces stay in a string field; a line of only NUL is blank (skipped by the reader)."""
    from sparkstate.io.parse import check_csv_tokens, csv_read_options, csv_string_schema, to_struct

    lines = [b'""', b'"a\x00b"', b"\xef\xbb\xbfbom", b" sp ", b"a,b", b"\x00", b"ok"]
    (tmp_path / "in.csv").write_bytes(b"word\n" + b"\n".join(lines) + b"\n")
    struct = to_struct("word string")
    tokens = spark.read.schema(csv_string_schema(struct)).options(header="true", **csv_read_options()).csv(
        str(tmp_path / "in.csv"))
    parsed = check_csv_tokens(tokens, struct, source=F.lit("f"))
    assert sorted(r.word for r in parsed.events.collect()) == sorted(["a\x00b", "\ufeffbom", " sp ", "ok"])
    dead = sorted((r.raw, r.reason) for r in parsed.dead_letters.collect())
    assert dead == [('""', "field word is empty"), ("a,b", "not valid CSV: expected 1 fields (word)")]


def test_csv_records_are_parsed_once_per_step_with_bounded_buffers(spark, tmp_path):
    """The heap regression of the CSV fuzz stream: Spark's optimizer copied each from_csv into every
    filter and column reading it (12 to 123 copies in a plan, each a univocity parser with a 2 MB
    buffer per task). Now a file's records are typed by one from_csv, lines split and typed by two,
    and every CSV parser reads a bounded number of characters at a time."""
    from sparkstate.io.parse import CSV_INPUT_BUFFER_CHARS, check_csv_tokens, csv_read_options, csv_string_schema, to_struct

    (tmp_path / "in.csv").write_bytes(b"word,n,t\na,1,2024-01-01T00:00:00Z\nb,x,2024-01-01T00:00:00Z\nc\n")
    struct = to_struct("word string, n bigint, t timestamp")
    assert int(csv_read_options()["inputBufferSize"]) == CSV_INPUT_BUFFER_CHARS <= 65536
    tokens = spark.read.schema(csv_string_schema(struct)).options(header="true", **csv_read_options()).csv(
        str(tmp_path / "in.csv"))
    files = check_csv_tokens(tokens, struct, source=F.lit("f"))
    lines = parse_csv(spark.createDataFrame([("a,1,2024-01-01T00:00:00Z",), ("b,x,2024-01-01T00:00:00Z",), ("c",)],
                                            "value string"), struct)
    for parsed, parses in ((files, 1), (lines, 2)):
        for frame in (parsed.events, parsed.dead_letters):
            plan = frame._jdf.queryExecution().executedPlan().toString()
            assert plan.count("from_csv(") == parses, plan
            assert plan.count(f"(inputBufferSize,{CSV_INPUT_BUFFER_CHARS})") >= parses
        assert [r.word for r in parsed.events.collect()] == ["a"]
        assert sorted(r.reason for r in parsed.dead_letters.collect()) == [
            "field n: expected bigint, got 'x'", "not valid CSV: expected 3 fields (word, n, t)"]
    # Only strings: the tokens are the values, no typing parse at all.
    only_strings = check_csv_tokens(tokens.select("word", F.lit(None).cast("string").alias("_sparkstate_corrupt")),
                                    "word string", source=F.lit("f"))
    assert "from_csv(" not in only_strings.events._jdf.queryExecution().executedPlan().toString()


def test_json_records_are_parsed_once_per_step(spark):
    """The same for JSON: each record parsed as a string map and typed, once each (were 80 to 150
    from_json copies in a plan of the clickstream schema)."""
    from sparkstate.synthetic.generator import EVENT_SCHEMA

    raw = spark.createDataFrame([('{"user_id": "a", "event_time": "2024-01-01T00:00:00Z", "data": "x", "is_last": false}',),
                                 ("{oops",)], "value string")
    p = parse_json(raw, EVENT_SCHEMA, source="x")
    for frame in (p.events, p.dead_letters):
        plan = frame._jdf.queryExecution().executedPlan().toString()
        assert plan.count("from_json(") == 2, plan
    assert [r.user_id for r in p.events.collect()] == ["a"]
    assert [r.reason for r in p.dead_letters.collect()] == ["not valid JSON"]
