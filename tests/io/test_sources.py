"""Sources against the real thing: a TCP socket, files on disk, the generator as a Spark source."""

from __future__ import annotations

import itertools
import json
import os
import re
import socket
import time
from datetime import datetime, timezone

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sparkstate.errors import ConfigError
from sparkstate.synthetic import generator_source
from sparkstate.synthetic import (
    EVENT_SCHEMA,
    Event,
    StreamConfig,
    reference_sessions,
    serve_events,
    stream_records,
)
from sparkstate.io.sources import ACCEPTED, Source, SourceSpec, kafka_package, open_source, parse_source

_names = itertools.count()

REASON_OF_KIND = {
    "broken_json": {"not valid JSON"},
    "missing_key": {"missing field user_id"},
    "null_key": {"field user_id is null"},
    "wrong_type": {
        "field event_time: expected timestamp, got 'not a time'",
        "field is_last: expected boolean, got 'maybe'",
    },
}


def drain(*frames, trigger=None, checkpoint=None):
    """Run streaming DataFrames (side by side) until their input is processed.

    Returns ``(rows, batch sizes)`` of one frame, or a list of those for several. Rows go to a
    memory table, or with a ``checkpoint`` (which the memory sink cannot restart from) through
    ``foreachBatch``.
    """
    outs = []
    for df in frames:
        rows: list = []
        if checkpoint is None:
            name = f"drain_{next(_names)}"
            writer = df.writeStream.format("memory").queryName(name)
        else:
            name = None
            writer = df.writeStream.foreachBatch(lambda batch, _, rows=rows: rows.extend(batch.collect()))
            writer = writer.option("checkpointLocation", str(checkpoint))
        if trigger is not None:
            writer = writer.trigger(**trigger)
        outs.append((rows, name, writer.start(), df.sparkSession))
    results = []
    try:
        for rows, name, query, session in outs:
            if trigger and trigger.get("availableNow"):
                query.awaitTermination(120)
            else:
                query.processAllAvailable()
            if name is not None:
                rows.extend(session.sql(f"select * from {name}").collect())
            results.append((rows, [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]))
    finally:
        for _, _, query, _ in outs:
            query.stop()
    return results[0] if len(frames) == 1 else results


def utc(row_time: datetime) -> datetime:
    return row_time.replace(tzinfo=timezone.utc)  # the test session's time zone is UTC


def as_event(row) -> Event:
    return Event(row.user_id, utc(row.event_time), row.data, row.is_last)


def ordered(events) -> list[Event]:
    return sorted(events, key=lambda e: (e.event_time, e.user_id, e.data, e.is_last))


# --- specs -----------------------------------------------------------------------------------------

@pytest.mark.parametrize(
    "text, expected",
    [
        ("files:/data/in", ("files", "files:/data/in")),
        ("socket:9999", ("socket", "socket:127.0.0.1:9999")),
        ("socket:localhost:7000", ("socket", "socket:localhost:7000")),
        ("socket:[::1]:7000", ("socket", "socket:[::1]:7000")),
        ("kafka:b1:9092,b2:9092/clicks", ("kafka", "kafka:b1:9092,b2:9092/clicks")),
        ("generator", ("generator", "generator")),
        ("GENERATOR:rate=500,users=100,seed=7,late=0.01,malformed=0.01", ("generator", None)),
    ],
)
def test_accepted_specs(text, expected):
    spec = parse_source(text)
    assert isinstance(spec, SourceSpec) and spec.kind == expected[0]
    if expected[1] is not None:
        assert str(spec) == expected[1]


def test_generator_spec_options():
    cfg = parse_source("generator:rate=500,users=100,seed=7,late=0.01,malformed=0.01,events=20").generator
    assert (cfg.rate, cfg.users, cfg.seed, cfg.late_share, cfg.malformed_share, cfg.events) == (500, 100, 7, 0.01, 0.01, 20)
    assert parse_source("generator").generator == StreamConfig()


@pytest.mark.parametrize(
    "text, message",
    [
        ("ftp://host/x", "expected one of generator"),
        ("", "expected one of generator"),
        ("file:/data", "did you mean files:/data?"),
        ("files:", "files: needs what follows the colon"),
        ("socket:host", "socket: give PORT or HOST:PORT"),
        ("socket:host:http", "the port must be a number from 1 to 65535, got 'http'"),
        ("socket:70000", "the port must be a number from 1 to 65535, got '70000'"),
        ("kafka:localhost:9092", "kafka: give BROKERS/TOPIC"),
        ("kafka:nohostport/t", "Kafka brokers are host:port"),
        ("generator:rate", "generator options are key=value pairs"),
        ("generator:speed=3", "generator: unknown option 'speed'; accepted: users, seed, rate"),
        ("generator:users=0", "generator: users must be >= 1, got 0"),
        ("generator:rate=0", "rate=0 (as fast as Spark reads) needs a total"),
        ("generator:rate=fast", "generator: option rate expects a number, got 'fast'"),
    ],
)
def test_bad_specs_name_the_accepted_forms(text, message):
    with pytest.raises(ConfigError, match=re.escape(message)) as info:
        parse_source(text)
    if "expected one of" in message or "did you mean" in message or "give" in message:
        assert all(form in str(info.value) for form in ACCEPTED)


def test_bad_format_and_options_are_config_errors(spark, tmp_path):
    with pytest.raises(ConfigError, match="format must be one of json, csv, parquet, got 'xml'"):
        open_source(spark, f"files:{tmp_path}", fmt="xml")
    with pytest.raises(ConfigError, match="parquet is read from files:DIR only"):
        open_source(spark, "socket:9999", fmt="parquet")
    with pytest.raises(ConfigError, match="unknown generator option.*maxFilesPerTrigger"):
        open_source(spark, "generator:events=5", options={"maxFilesPerTrigger": 1})


# --- files -----------------------------------------------------------------------------------------

def _good(user: str, second: int, last: bool = False) -> str:
    return Event(user, datetime(2024, 1, 1, 0, 0, second, tzinfo=timezone.utc), f"/p{second}", last).to_json()


def test_json_files_one_per_batch_with_dead_letters(spark, tmp_path):
    landing = tmp_path / "in"
    landing.mkdir()
    files = {
        "part-0.json": [_good("u1", 1), "{broken", _good("u2", 2), "", json.dumps({"event_time": "2024-01-01T00:00:03Z"})],
        "part-1.json": [_good("u1", 4, True), json.dumps({"user_id": "u3", "event_time": "later", "data": "x", "is_last": False})],
    }
    for i, (name, lines) in enumerate(files.items()):
        (landing / name).write_text("\n".join(lines) + "\n")
        os.utime(landing / name, (1_700_000_000 + i, 1_700_000_000 + i))  # read in this order
    src = open_source(spark, f"files:{landing}", fmt="json", options={"maxFilesPerTrigger": 1},
                      required=("user_id", "event_time"))
    assert isinstance(src, Source) and src.fmt == "json"
    (events, batches), (dead, _) = drain(src.events, src.dead_letters)
    assert batches == [5, 2]  # one file per micro-batch (Spark counts its lines, the blank one too)
    assert sorted((e.user_id, e.event_time.second, e.is_last) for e in events) == [
        ("u1", 1, False), ("u1", 4, True), ("u2", 2, False)]
    by_reason = {d.reason: d for d in dead}
    assert set(by_reason) == {"not valid JSON", "missing field user_id",
                              "field event_time: expected timestamp, got 'later'"}
    assert by_reason["not valid JSON"].raw == "{broken"
    assert by_reason["not valid JSON"].source == (landing / "part-0.json").as_uri().replace("file:///", "file:/")
    total = sum(1 for lines in files.values() for text in lines if text.strip())
    assert len(events) + len(dead) == total


def test_csv_files_with_header(spark, tmp_path):
    landing = tmp_path / "csv"
    landing.mkdir()
    (landing / "a.csv").write_text(
        "user_id,event_time,data,is_last\n"
        "u1,2024-01-01T00:00:01Z,/home,false\n"
        'u2,2024-01-01T00:00:02Z,"/search,q",true\n'
        "u3,yesterday,/x,false\n"
        "u4,2024-01-01T00:00:04Z\n"
        ",2024-01-01T00:00:05Z,/y,false\n"
    )
    src = open_source(spark, f"files:{landing}")  # format guessed from the .csv files
    assert src.fmt == "csv"
    (events, _), (dead, _) = drain(src.events, src.dead_letters)
    assert sorted((e.user_id, e.data, e.is_last) for e in events) == [("u1", "/home", False), ("u2", "/search,q", True)]
    assert sorted((d.raw, d.reason) for d in dead) == [
        (",2024-01-01T00:00:05Z,/y,false", "field user_id is empty"),
        ("u3,yesterday,/x,false", "field event_time: expected timestamp, got 'yesterday'"),
        ("u4,2024-01-01T00:00:04Z", "not valid CSV: expected 4 fields (user_id, event_time, data, is_last)"),
    ]


def test_parquet_files_pass_typed_rows_and_have_no_dead_letters(spark, tmp_path):
    landing = tmp_path / "pq"
    landing.mkdir()
    t0 = datetime(2024, 1, 1, tzinfo=timezone.utc)
    table = pa.table({
        "user_id": ["u1", "u2"],
        "event_time": pa.array([t0, t0], pa.timestamp("us", tz="UTC")),
        "data": ["/a", "/b"],
        "is_last": [False, True],
        "other": [1, 2],
    })
    pq.write_table(table, landing / "part-0.parquet")
    src = open_source(spark, f"files:{landing}", fmt="parquet")
    assert src.dead_letters is None and src.events.columns == ["user_id", "event_time", "data", "is_last"]
    events, _ = drain(src.events)
    assert sorted((e.user_id, utc(e.event_time), e.is_last) for e in events) == [("u1", t0, False), ("u2", t0, True)]


def test_a_missing_directory_is_named(spark, tmp_path):
    missing = tmp_path / "nope"
    for fmt in ("json", "csv", "parquet"):
        with pytest.raises(ConfigError, match=f"the directory {missing} does not exist. Create it"):
            open_source(spark, f"files:{missing}", fmt=fmt)


# --- socket ----------------------------------------------------------------------------------------

def _wait_rows(spark, tables: dict[str, int], timeout: float = 60.0) -> dict[str, list]:
    deadline = time.monotonic() + timeout
    while True:
        counts = {t: spark.sql(f"select count(*) from {t}").first()[0] for t in tables}
        if all(counts[t] >= n for t, n in tables.items()) or time.monotonic() > deadline:
            return {t: spark.sql(f"select * from {t}").collect() for t in tables}
        time.sleep(0.5)


def test_socket_every_record_arrives_in_one_output(spark):
    cfg = StreamConfig(users=4, seed=11, events=200, malformed_share=0.15, late_share=0.05)
    records = stream_records(cfg)
    valid = [r for r in records if r.is_valid]
    with serve_events(records) as server:  # a real TCP server on localhost, a free port
        src = open_source(spark, f"socket:{server.port}", required=("user_id", "event_time"))
        assert str(src.spec) == f"socket:127.0.0.1:{server.port}"
        names = {"events": f"sock_ev_{next(_names)}", "dead": f"sock_dl_{next(_names)}"}
        queries = [src.events.writeStream.format("memory").queryName(names["events"]).start(),
                   src.dead_letters.writeStream.format("memory").queryName(names["dead"]).start()]
        try:
            got = _wait_rows(spark, {names["events"]: len(valid), names["dead"]: len(records) - len(valid)})
        finally:
            for q in queries:
                q.stop()
        assert server.connections == 2  # one per query; each got every line
    events, dead = got[names["events"]], got[names["dead"]]
    assert ordered(as_event(r) for r in events) == ordered(r.event for r in valid)
    assert sorted(d.raw for d in dead) == sorted(r.line for r in records if not r.is_valid)
    assert {d.source for d in dead} == {f"socket:127.0.0.1:{server.port}"}
    kinds = {r.line: r.kind for r in records}
    assert all(d.reason in REASON_OF_KIND[kinds[d.raw]] for d in dead)


def test_line_server_serves_each_client_all_lines_paced():
    lines = [_good("u", s) for s in range(5)]
    with serve_events(lines, host="localhost", rate=50, hold=False) as server:
        started = time.monotonic()
        for _ in range(2):
            with socket.create_connection(("localhost", server.port), timeout=5) as conn:
                assert conn.makefile().read().splitlines() == lines
        assert time.monotonic() - started >= 2 * 4 / 50  # 5 lines at 50/s: at least 80 ms each
        assert server.connections == 2 and server.lines_sent == 10


def test_serve_events_streams_the_generator_config():
    cfg = StreamConfig(users=3, seed=2, events=30, rate=0, malformed_share=0.2)
    with serve_events(cfg, hold=False) as server:
        with socket.create_connection((server.host, server.port), timeout=5) as conn:
            assert conn.makefile().read().splitlines() == [r.line for r in stream_records(cfg)]


def test_line_server_refuses_a_taken_port_and_a_bad_rate():
    with serve_events([]) as server:
        with pytest.raises(ConfigError, match=f"serve_lines: cannot listen on 127.0.0.1:{server.port}"):
            serve_events([], port=server.port)
    with pytest.raises(ConfigError, match="rate is lines per second and must be > 0"):
        serve_events([], rate=0)


# --- the generator ---------------------------------------------------------------------------------

def test_generator_stream_equals_its_pure_python_records(spark, tmp_path):
    spec = "generator:events=360,users=5,seed=3,malformed=0.1,late=0.05,rate=0"
    cfg = parse_source(spec).generator
    records = stream_records(cfg)
    src = open_source(spark, spec, options={"maxEventsPerTrigger": 200})
    assert src.events.columns == ["user_id", "event_time", "data", "is_last"]
    (events, batches), (dead, _) = drain(src.events, src.dead_letters)
    assert batches == [200, 160]
    assert ordered(as_event(r) for r in events) == ordered(r.event for r in records if r.is_valid)
    by_offset = {int(d.source.split("@")[1]): d for d in dead}
    bad = [r for r in records if not r.is_valid]
    assert sorted(by_offset) == [r.index for r in bad] and len(events) + len(dead) == 360
    for r in bad:
        assert by_offset[r.index].raw == r.line and by_offset[r.index].reason in REASON_OF_KIND[r.kind]
    assert {r.kind for r in bad} == set(REASON_OF_KIND)


    # No session spans two rounds of the stream: the reference sessions are those of each round.
    ok = [r.event for r in records if r.kind == "ok"]
    size = cfg.round_size
    per_round = [s for k in range(0, 360, size)
                 for s in reference_sessions([r.event for r in records[k:k + size] if r.kind == "ok"], cfg.gap)]
    assert sorted(reference_sessions(ok, cfg.gap), key=str) == sorted(per_round, key=str)


def test_generator_keeps_few_rounds_in_memory_and_regenerates_the_same_records(monkeypatch):
    """A reader holds the rounds it needs, not the stream's history (16 rounds of 50,000 users
    once held 3 GB per worker); a round generated again after eviction is the same records."""
    from sparkstate.synthetic import stream

    cfg = StreamConfig(users=20, seed=9, late_share=0.1, malformed_share=0.05)
    size = cfg.round_size
    first = stream_records(cfg, 0, 13 * size)  # the whole run with the default budget
    monkeypatch.setattr(stream, "_ROUNDS_KEPT_RECORDS", 3 * size)
    monkeypatch.setattr(stream, "_rounds", {})
    held = []
    for r in range(12):  # slices across round edges, as micro-batches read them
        a, b = r * size + size // 2, (r + 1) * size + size // 2
        assert stream_records(cfg, a, b) == first[a:b]
        held.append(sum(map(len, stream._rounds.values())))
    assert max(held) <= 3 * size and len(stream._rounds) <= 3
    assert stream_records(cfg, 0, 13 * size) == first  # round 0 was evicted long ago: made again, equal
    monkeypatch.setattr(stream, "_ROUNDS_KEPT_RECORDS", 0)
    assert stream_records(cfg, size - 3, size + 3) == first[size - 3:size + 3]
    assert len(stream._rounds) == 2  # the two rounds a slice spans are kept, whatever the budget


def test_generator_restarts_from_its_checkpoint_with_the_same_records(spark, tmp_path):
    spec = "generator:events=120,users=3,seed=5,rate=0"
    first, batches = drain(open_source(spark, spec, options={"maxEventsPerTrigger": 70}).events,
                           trigger={"availableNow": True}, checkpoint=tmp_path / "cp")
    assert batches == [70, 50]
    more = "generator:events=200,users=3,seed=5,rate=0"  # the same stream, longer
    second, batches = drain(open_source(spark, more, options={"partitions": 3}).events,
                            trigger={"availableNow": True}, checkpoint=tmp_path / "cp")
    assert batches == [80]
    # Other batch boundaries and partitioning, across a restart: the records of one run.
    expected = stream_records(parse_source(more).generator)
    assert ordered(map(as_event, first + second)) == ordered(r.event for r in expected)


def test_generator_available_now_on_an_endless_stream_takes_one_second_of_records(spark):
    rows, _ = drain(open_source(spark, "generator:rate=40,users=2,seed=1").events, trigger={"availableNow": True})
    assert ordered(map(as_event, rows)) == ordered(r.event for r in stream_records(StreamConfig(users=2, seed=1), 0, 40))


def test_generator_paces_at_its_rate(monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(generator_source.time, "monotonic", lambda: now[0])
    reader = generator_source.GeneratorDataSource({"rate": "200", "users": "2"}).streamReader(None)
    limit = reader.getDefaultReadLimit()
    assert reader.latestOffset({"index": 0}, limit) == {"index": 0}
    now[0] += 0.5
    assert reader.latestOffset({"index": 0}, limit) == {"index": 100}
    now[0] += 2
    capped = generator_source.GeneratorDataSource(
        {"rate": "200", "users": "2", "events": "300", "maxeventspertrigger": "250"}).streamReader(None)
    capped.latestOffset({"index": 0}, capped.getDefaultReadLimit())
    now[0] += 10
    assert capped.latestOffset({"index": 0}, capped.getDefaultReadLimit()) == {"index": 250}
    assert capped.latestOffset({"index": 250}, capped.getDefaultReadLimit()) == {"index": 300}
    assert [(p.start, p.stop) for p in capped.partitions({"index": 0}, {"index": 5})] == [(0, 3), (3, 5)]


def test_generator_burst_is_there_at_the_start_then_the_rate_paces(monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(generator_source.time, "monotonic", lambda: now[0])
    reader = generator_source.GeneratorDataSource(
        {"rate": "10", "burst": "5000", "users": "2", "maxEventsPerTrigger": "2000"}).streamReader(None)
    limit = reader.getDefaultReadLimit()
    assert reader.latestOffset({"index": 0}, limit) == {"index": 2000}  # far ahead: the batch limit
    assert reader.reportLatestOffset() == {"index": 5000}  # the backlog the metrics show
    now[0] += 3
    assert reader.latestOffset({"index": 4000}, limit) == {"index": 5030}  # the burst, then 10 a second
    with pytest.raises(ConfigError, match="burst is records offered at the start"):
        generator_source.GeneratorDataSource({"burst": "-1"}).streamReader(None)


# --- kafka -----------------------------------------------------------------------------------------

def test_kafka_missing_connector_message_names_the_package(spark):
    """The message a kafka: source gives without the connector (the test session has it, so the
    refusal itself is shown by tests/io/test_kafka.py's `sparkstate run` without the jars)."""
    from sparkstate.io.connectors import kafka_missing

    text = str(kafka_missing(spark.version, "source kafka:localhost:9092/clicks"))
    assert "Spark's Kafka connector is not on the classpath" in text
    assert "org.apache.spark.sql.kafka010.KafkaSourceProvider" in text
    assert f"--packages {kafka_package(spark)}" in text
    assert kafka_package(spark).startswith("org.apache.spark:spark-sql-kafka-0-10_2.13:")


def test_kafka_topic_lists():
    assert parse_source("kafka:h:1/a, b").topics == ("a", "b")
    with pytest.raises(ConfigError, match="Kafka topic names are letters"):
        parse_source("kafka:h:1/a,,b")


def test_default_schema_is_the_clickstream(spark, tmp_path):
    src = open_source(spark, f"files:{tmp_path}")
    assert src.schema.simpleString() == "struct<" + ",".join(
        c.replace(" ", ":") for c in EVENT_SCHEMA.split(", ")) + ">"
