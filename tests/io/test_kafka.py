"""Kafka for real: the ``kafka:`` source and sink against a single-node broker (tests/conftest.py's ``kafka_broker``).

The broker is started once per test session from the jars ``make kafka`` fetched; Spark's Kafka
connector (:mod:`sparkstate.io.connectors` decides its coordinates) is on the test session's
classpath through ``spark.jars``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
import zlib
from collections import Counter
from pathlib import Path

import pytest

from sparkstate.synthetic import Session, StreamConfig, reference_sessions, stream_records
from sparkstate.jobs import JobConfig, run_pipeline

GAP = "1 minute"
WATERMARK = "10 minutes"
DATA = StreamConfig(users=12, seed=11, events=360, rate=0, malformed_share=0.05)
PARTITIONS = 3


def _topic(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _partition_of(record) -> int:
    """Three producers, each owning the users that hash to its partition (a user's events stay in order)."""
    user = record.event.user_id or ""
    return zlib.crc32(user.encode()) % PARTITIONS


def produce_clicks(broker, topic: str, records) -> dict[str, tuple[int, int]]:
    """Each partition's records by its own producer, in record order; returns line -> (partition, offset)
    of the malformed ones. Partitions then interleave in event time as the reader consumes them."""
    broker.create_topic(topic, PARTITIONS)
    malformed: dict[str, tuple[int, int]] = {}
    for p in range(PARTITIONS):
        mine = [r for r in records if _partition_of(r) == p]
        where = broker.produce(topic, [(r.event.user_id or None, r.line) for r in mine], partition=p)
        malformed.update({r.line: w for r, w in zip(mine, where) if not r.is_valid})
    return malformed


def _sessions(spark, path: Path) -> list[Session]:
    return [Session.from_row(r) for r in spark.read.parquet(str(path)).collect()]


@pytest.mark.timeout(900)
def test_sessionize_reads_a_three_partition_topic_exactly(kafka_spark, kafka_broker, tmp_path):
    """`run sessionize` on a 3-partition topic, in several micro-batches (maxOffsetsPerTrigger): the
    reference sessions exactly, and every malformed message a dead letter naming topic/partition@offset."""
    spark = kafka_spark
    records = stream_records(DATA)
    topic = _topic("clicks")
    malformed = produce_clicks(kafka_broker, topic, records)
    assert len(malformed) >= 10
    out = tmp_path / "sessions"
    result = run_pipeline(spark, JobConfig(
        "sessionize", source=f"kafka:{kafka_broker.bootstrap}/{topic}", sink=f"parquet:{out}",
        checkpoint=str(tmp_path / "ck"), gap=GAP, watermark=WATERMARK, trigger="200 milliseconds", once=True,
        options={"startingOffsets": "earliest", "maxOffsetsPerTrigger": "100", "failOnDataLoss": "true"}))
    assert result.input_rows == DATA.events  # records read, malformed ones included
    assert result.dead_letters == len(malformed)
    assert result.batches >= 4  # 360 offsets, 100 per trigger
    assert result.late_events == 0
    events = [r.event for r in records if r.is_valid]
    final_ms = int(max(e.event_time for e in events).timestamp() * 1000) - 10 * 60 * 1000
    expected = Counter(reference_sessions(events, GAP, watermark=final_ms))
    got = Counter(_sessions(spark, out))
    assert got == expected
    assert sum(expected.values()) > 40

    dead = spark.read.parquet(str(out / "_deadletter")).collect()
    assert Counter(r.raw for r in dead) == Counter(list(malformed))
    for r in dead:
        p, off = malformed[r.raw]
        assert r.source == f"kafka:{topic}/{p}@{off}"
        assert r.reason


def test_kafka_records_expose_key_partition_offset_timestamp(kafka_spark, kafka_broker):
    from sparkstate.io.sources import kafka_records

    a, b = _topic("ra"), _topic("rb")
    kafka_broker.create_topic(a, 1)
    kafka_broker.create_topic(b, 2)
    kafka_broker.produce(a, [("k1", "v1"), ("k2", "v2")])
    kafka_broker.produce(b, [("k3", "v3")], partition=1)
    stream = kafka_records(kafka_spark, f"kafka:{kafka_broker.bootstrap}/{a},{b}", {"startingOffsets": "earliest"})
    name = f"records_{uuid.uuid4().hex[:6]}"
    q = stream.writeStream.format("memory").queryName(name).start()
    try:
        q.processAllAvailable()
    finally:
        q.stop()
    rows = sorted(kafka_spark.table(name).collect(), key=lambda r: r.key)
    assert [(r.key, r.value, r.topic, r.partition, r.offset, r._where) for r in rows] == [
        ("k1", "v1", a, 0, 0, f"kafka:{a}/0@0"), ("k2", "v2", a, 0, 1, f"kafka:{a}/0@1"),
        ("k3", "v3", b, 1, 0, f"kafka:{b}/1@0")]
    assert all(r.timestamp is not None for r in rows)


@pytest.mark.timeout(900)
def test_kafka_sink_round_trip_equals_the_parquet_sink(kafka_spark, kafka_broker, tmp_path):
    """The same input through the Kafka sink and the Parquet sink: the topic, read back and
    de-duplicated by record id, holds exactly the Parquet sink's rows; keys are the user ids."""
    from sparkstate.io.kafka import BATCH_ID_HEADER, QUERY_ID_HEADER, RECORD_ID_HEADER, dedupe, headers_of
    from sparkstate.jobs.generate import generate_files

    spark = kafka_spark
    data = StreamConfig(users=8, seed=4, events=240, rate=0)
    generate_files(tmp_path / "in", data, files=3)
    common = dict(source=f"files:{tmp_path / 'in'}", format="json", gap=GAP, watermark="0 seconds",
                  trigger="200 milliseconds", once=True, options={"maxFilesPerTrigger": "1"})
    run_pipeline(spark, JobConfig("sessionize", sink=f"parquet:{tmp_path / 'pq'}", checkpoint=str(tmp_path / "ck1"),
                                  **common))
    out_topic = _topic("sessions-out")
    kafka_broker.create_topic(out_topic, 2)
    run_pipeline(spark, JobConfig("sessionize", sink=f"kafka:{kafka_broker.bootstrap}/{out_topic}",
                                  deadletter=f"json:{tmp_path / 'dead'}", checkpoint=str(tmp_path / "ck2"), **common))

    parquet_rows = _sessions(spark, tmp_path / "pq")
    messages = kafka_broker.consume_all(out_topic)
    kept = dedupe(messages)
    assert len(kept) == len(messages)  # no crash, no repeats
    for m in kept:
        h = headers_of(m.headers())
        assert h[QUERY_ID_HEADER] and h[BATCH_ID_HEADER].isdigit() and len(h[RECORD_ID_HEADER]) == 64
        assert json.loads(m.value())["user_id"] == m.key().decode()
    schema = spark.read.parquet(str(tmp_path / "pq")).schema
    values = spark.createDataFrame([(m.value().decode(),) for m in kept], "v string")
    from pyspark.sql import functions as F

    parsed = values.select(F.from_json("v", schema).alias("r")).select("r.*").collect()
    assert Counter(Session.from_row(r) for r in parsed) == Counter(parquet_rows)
    assert len(parquet_rows) > 20


def test_a_replayed_batch_to_kafka_carries_the_same_record_ids(kafka_spark, kafka_broker):
    """At-least-once, and how a consumer drops the repeat: the same batch sent twice (a replay)
    gives messages with the same record ids, so dedupe keeps one copy."""
    from sparkstate.io.kafka import KafkaBatchWriter, dedupe

    topic = _topic("replay")
    kafka_broker.create_topic(topic, 1)
    writer = KafkaBatchWriter(kafka_broker.bootstrap, topic)
    batch = kafka_spark.createDataFrame([("u1", 3), ("u2", 5)], "user_id string, n long")
    writer(batch, 7)
    writer(batch, 7)  # Spark runs the batch again after a crash before its commit log
    writer(batch, 8)  # the same rows in another batch are other records
    messages = kafka_broker.consume_all(topic)
    assert len(messages) == 6
    assert sorted((m.key().decode(), json.loads(m.value())["n"]) for m in dedupe(messages)) == [
        ("u1", 3), ("u1", 3), ("u2", 5), ("u2", 5)]


def test_without_the_connector_run_names_the_package(tmp_path):
    """`sparkstate run` with a kafka: source, no --packages and no fetched jars: one sentence naming
    the coordinates to add (and `make kafka`), no stack trace."""
    from sparkstate.io.connectors import kafka_coordinates

    env = {"SPARKSTATE_CACHE": str(tmp_path / "empty-cache"), "PATH": "/usr/bin:/bin",
           "PYSPARK_PYTHON": sys.executable}
    res = subprocess.run([sys.executable, "-m", "sparkstate.cli", "run", "running-count", "--source",
                          "kafka:127.0.0.1:9/words", "--sink", "console", "--once", "--no-progress",
                          "--spark-log", str(tmp_path / "spark.log")],
                         capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)
    assert res.returncode != 0
    assert "Traceback" not in res.stderr
    assert f"--packages {kafka_coordinates()}" in res.stderr
    assert "make kafka" in res.stderr


def test_the_demo_through_kafka_matches_the_reference(kafka_spark, kafka_broker, tmp_path):
    """`sparkstate demo --kafka`'s job: the generated events through a topic, the same check."""
    from sparkstate.demo import run_demo

    r = run_demo(kafka_spark, tmp_path / "demo", events=90, users=4, files=3, kafka=kafka_broker)
    assert r.input_events == 90 and r.batches >= 3
    assert r.matches_reference, r.mismatches
    assert r.sessions_written > 5


@pytest.mark.timeout(900)
def test_state_moves_from_topic_a_to_topic_b(kafka_spark, kafka_broker, tmp_path):
    """Seed 002's move: visited-pages on topic A, its state exported, a new query on topic B starting
    from that state (--initial-state): the two runs' output together equals one uninterrupted run's
    over A then B (a topic C holding A's messages and then B's)."""
    from sparkstate.cli import main

    spark = kafka_spark
    rng_pages = [f"page{i}" for i in range(7)]
    visits = [(f"u{(i * 7) % 5}", rng_pages[(i * 3) % 7]) for i in range(60)]
    first, second = visits[:35], visits[35:]
    a, b, c = _topic("visits-a"), _topic("visits-b"), _topic("visits-c")
    for t in (a, b, c):
        kafka_broker.create_topic(t, 1)
    line = lambda v: json.dumps({"user_id": v[0], "page": v[1]})  # noqa: E731
    kafka_broker.produce(a, [line(v) for v in first])
    kafka_broker.produce(b, [line(v) for v in second])
    kafka_broker.produce(c, [line(v) for v in visits])

    def run(topic: str, name: str, initial: Path | None = None) -> list[tuple[str, tuple[str, ...]]]:
        run_pipeline(spark, JobConfig(
            "visited-pages", source=f"kafka:{kafka_broker.bootstrap}/{topic}", sink=f"parquet:{tmp_path / name}",
            checkpoint=str(tmp_path / f"ck-{name}"), once=True, trigger="200 milliseconds",
            initial_state=None if initial is None else str(initial),
            options={"startingOffsets": "earliest", "maxOffsetsPerTrigger": "20"}))
        return [(r.user_id, tuple(r.visited_pages)) for r in spark.read.parquet(str(tmp_path / name)).collect()]

    on_a = run(a, "out-a")
    assert main(["state", "export", str(tmp_path / "ck-out-a"), str(tmp_path / "state.parquet")]) == 0
    on_b = run(b, "out-b", tmp_path / "state.parquet")
    uninterrupted = run(c, "out-c")
    assert len(uninterrupted) == len(visits)
    assert Counter(on_a + on_b) == Counter(uninterrupted)
    # each user's last list holds all of the user's visits, in order
    for user in {u for u, _ in visits}:
        assert max((p for u, p in on_b if u == user), key=len) == tuple(p for u, p in visits if u == user)


def test_a_job_without_dead_letters_sends_to_kafka_from_the_batch_itself(kafka_spark, kafka_broker, tmp_path):
    """A Parquet source has no dead letters and the running count refuses nothing, so the job's
    output goes to Kafka from the one Spark job that runs each batch (nothing persisted, nothing
    counted first): every key's last message carries its exact total, across batches, and the
    job's metrics still count what was read and written."""
    from sparkstate.io.kafka import dedupe

    words = ["b", "a", "c", "a", "b", "a", "d", "a", "c", "b", "e", "a"]
    for i in range(3):  # three files, three batches (maxFilesPerTrigger 1)
        kafka_spark.createDataFrame([(w,) for w in words[i * 4:(i + 1) * 4]], "word string") \
            .coalesce(1).write.parquet(str(tmp_path / "in" / f"part{i}"))
    files = tmp_path / "flat"
    files.mkdir()
    for i, f in enumerate(sorted((tmp_path / "in").glob("part*/*.parquet"))):
        f.rename(files / f"{i}.parquet")
    topic = _topic("counts-out")
    kafka_broker.create_topic(topic, 1)
    result = run_pipeline(kafka_spark, JobConfig(
        "running-count", source=f"files:{files}", format="parquet", sink=f"kafka:{kafka_broker.bootstrap}/{topic}",
        checkpoint=str(tmp_path / "ck"), trigger="200 milliseconds", once=True, options={"maxFilesPerTrigger": "1"}))
    messages = dedupe(kafka_broker.consume_all(topic))
    last: dict[str, int] = {}
    for m in messages:  # one partition: in the order sent
        last[m.key().decode()] = json.loads(m.value())["count"]
    assert last == dict(Counter(words))
    assert result.input_rows == len(words)
    assert result.output_rows == len(messages)


def test_kafka_in_and_out_runs_one_spark_job_per_batch_without_dead_letters(kafka_spark, kafka_broker, tmp_path):
    """Kafka in, Kafka out, dead letters to files: a batch without dead letters is run, sent and
    counted by ONE Spark job (the count is an observation of the Kafka write, not a job of its
    own); a batch with a malformed record writes its dead letter from the same execution, and
    every count is exact."""
    from sparkstate.io.kafka import dedupe

    source, out = _topic("one-job-in"), _topic("one-job-out")
    kafka_broker.create_topic(source, 1)
    kafka_broker.create_topic(out, 1)
    words = ["a", "b", "a", "c", "b", "a"]
    kafka_broker.produce(source, [json.dumps({"word": w}) for w in words])
    runs: dict[str, list] = {}

    def run(deadletter: str) -> object:
        return run_pipeline(kafka_spark, JobConfig(
            "running-count", source=f"kafka:{kafka_broker.bootstrap}/{source}",
            sink=f"kafka:{kafka_broker.bootstrap}/{out}", deadletter=f"json:{deadletter}",
            checkpoint=str(tmp_path / "ck"), trigger="0 seconds", once=True,
            options={"startingOffsets": "earliest", "maxOffsetsPerTrigger": "2"}),
            on_batch=lambda m, _t: runs.setdefault(m.run_id, []).append(m))

    def jobs_of(run_id: str) -> int:
        return len(kafka_spark.sparkContext.statusTracker().getJobIdsForGroup(run_id))

    first = run(str(tmp_path / "dead"))
    (run_id, batches), = runs.items()
    assert first.input_rows == 6 and first.dead_letters == 0 and len(batches) == 3  # 2 offsets per batch
    assert jobs_of(run_id) == len(batches)

    kafka_broker.produce(source, ['{"word": "a"}', "not json"])
    second = run(str(tmp_path / "dead"))
    assert second.input_rows == 2 and second.dead_letters == 1 and second.output_rows == 1
    dead = kafka_spark.read.json(str(tmp_path / "dead")).collect()
    assert [r.raw for r in dead] == ["not json"]
    last: dict[str, int] = {}
    for m in dedupe(kafka_broker.consume_all(out)):
        last[m.key().decode()] = json.loads(m.value())["count"]
    assert last == dict(Counter(words + ["a"]))


def test_the_kafka_source_asks_the_broker_for_short_fetch_waits(kafka_spark):
    """The consumer setting that decides how long a micro-batch's read of a short offset range
    waits (docs/performance.md, Latency): sparkstate's default reaches Spark's Kafka source, and
    a value given in the options replaces it."""
    from sparkstate.io.sources import KAFKA_CONSUMER_DEFAULTS, kafka_records

    (name, value), = KAFKA_CONSUMER_DEFAULTS.items()
    plan = kafka_records(kafka_spark, "kafka:127.0.0.1:9/t")._jdf.queryExecution().logical().toString()
    assert f"{name}={value}," in plan or f"{name}={value}]" in plan
    given = kafka_records(kafka_spark, "kafka:127.0.0.1:9/t", {name: "300"})._jdf.queryExecution().logical().toString()
    assert f"{name}=300" in given and f"{name}={value}," not in given and f"{name}={value}]" not in given


@pytest.mark.timeout(900)
def test_output_and_dead_letters_to_kafka_go_out_in_one_streaming_write(kafka_spark, kafka_broker, tmp_path):
    """Kafka in, sessions and dead letters both to Kafka on the same broker: the query writes
    straight to Kafka, each row to its topic, one Spark job a batch even with dead letters in
    every batch. The sessions are exactly the reference sessions of the events not refused, in
    whatever order the three partitions interleave; every malformed message and every late event
    is a dead letter; the headers carry the query's id, the batch's time as the offset log keeps
    it (the same on a replay) and a record id a consumer can recompute."""
    import hashlib
    from datetime import datetime

    from sparkstate.engines import runtime
    from sparkstate.io.kafka import (BATCH_ID_HEADER, BATCH_TIME_HEADER, QUERY_ID_HEADER, RECORD_ID_HEADER, dedupe,
                                     headers_of)

    # PySpark 3.5 reports no observations of a batch without input: there the job counts its
    # batches itself in foreachBatch, and its messages name a batch by its id.
    straight = runtime.has(runtime.OBSERVED_WITHOUT_INPUT)

    spark = kafka_spark
    records = stream_records(DATA)
    source, out, dead_topic = _topic("direct-in"), _topic("direct-out"), _topic("direct-dead")
    malformed = produce_clicks(kafka_broker, source, records)
    valid = [r for r in records if r.is_valid]
    late_line = valid[0].line  # the first event again, at the end: older than any later watermark
    kafka_broker.produce(source, [(valid[0].event.user_id, late_line)], partition=_partition_of(valid[0]))
    for t in (out, dead_topic):
        kafka_broker.create_topic(t, 2)
    runs: dict[str, list] = {}
    result = run_pipeline(spark, JobConfig(
        "sessionize", source=f"kafka:{kafka_broker.bootstrap}/{source}", sink=f"kafka:{kafka_broker.bootstrap}/{out}",
        deadletter=f"kafka:{kafka_broker.bootstrap}/{dead_topic}", checkpoint=str(tmp_path / "ck"), gap=GAP,
        watermark="0 seconds", trigger="0 seconds", once=True,
        options={"startingOffsets": "earliest", "maxOffsetsPerTrigger": "100"}),
        on_batch=lambda m, _t: runs.setdefault(m.run_id, []).append(m))
    (run_id, batches), = runs.items()
    jobs = len(spark.sparkContext.statusTracker().getJobIdsForGroup(run_id))
    assert len(batches) >= 4 and (jobs == len(batches) if straight else jobs > len(batches))

    dead = [(m, json.loads(m.value())) for m in dedupe(kafka_broker.consume_all(dead_topic))]
    late = [d for _, d in dead if d["reason"].startswith("late")]
    assert Counter(d["raw"] for _, d in dead if not d["reason"].startswith("late")) == Counter(list(malformed))
    assert late_line in [d["raw"] for d in late]
    for m, d in dead:
        assert m.key().decode() == d["source"] and d["source"].startswith(f"kafka:{source}/")
    assert result.input_rows == DATA.events + 1
    assert result.dead_letters == len(dead) and result.late_events == len(late)

    # The sessions: those of every event that was not refused as late.
    line_event = {r.line: r.event for r in valid}
    accepted = Counter([r.line for r in valid] + [late_line]) - Counter(d["raw"] for d in late)
    final_ms = int(datetime.fromisoformat(result.final_watermark.replace("Z", "+00:00")).timestamp() * 1000)
    expected = Counter(reference_sessions([line_event[line] for line in accepted.elements()], GAP,
                                          watermark=final_ms))
    messages = dedupe(kafka_broker.consume_all(out))
    schema = "user_id string, session_start timestamp, session_end timestamp, event_count long, " \
             "events array<string>, closed_by string"
    from pyspark.sql import functions as F

    values = spark.createDataFrame([(m.value().decode(),) for m in messages], "v string")
    parsed = values.select(F.from_json("v", schema).alias("r")).select("r.*").collect()
    assert Counter(Session.from_row(r) for r in parsed) == expected and sum(expected.values()) > 40
    assert result.output_rows == len(messages)

    # Headers: the query id, the batch (its time, as the offset log keeps it, or its id), and a
    # record id anyone can recompute.
    logs = {int(p.name): json.loads(p.read_text().splitlines()[1])["batchTimestampMs"]
            for p in (tmp_path / "ck" / "offsets").iterdir() if p.name.isdigit()}
    header = BATCH_TIME_HEADER if straight else BATCH_ID_HEADER
    for m in [*messages, *(m for m, _ in dead)]:
        h = headers_of(m.headers())
        assert h[QUERY_ID_HEADER] == result.query_id
        assert (int(h[header]) // 1000 in logs.values()) if straight else (int(h[header]) in logs)
        text = "\0".join([h[header], m.key().decode(), m.value().decode()])
        assert h[RECORD_ID_HEADER] == hashlib.sha256(text.encode()).hexdigest()
