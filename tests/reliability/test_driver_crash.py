"""Driver crashes: ``sparkstate run sessionize`` SIGKILLed mid-batch, mid-commit and between batches.

Each test writes the generator's records (a few malformed) as files, runs the event-time
sessionization job as a subprocess reading one file per micro-batch, kills the driver's whole
process group at points drawn from a seeded RNG (see ``crash.py``), restarts it on the same
checkpoint each time, and at the end compares what a reader of the sink sees with the
generator's reference sessions (``test_cli`` shows an uninterrupted run writes exactly those)
as multisets: no session lost, none duplicated, none invented; every malformed record is a
dead letter exactly once.
"""

from __future__ import annotations

import os
import time
from collections import Counter
from pathlib import Path

import pytest

from sparkstate.synthetic import Session, StreamConfig, reference_sessions, stream_records
from sparkstate.jobs.generate import generate_files
from tests.io.pg import postgres_server  # noqa: F401
from tests.reliability.crash import (
    KILL_POINTS, MID_BATCH, MID_COMMIT, WRITING, WRITTEN, Checkpoint, CrashingJob, DeltaProbe, ParquetProbe,
    PostgresProbe, SinkProbe, cli, plan_kills,
)

pytestmark = pytest.mark.reliability

# SPARKSTATE_CRASH_SEED repeats another plan of kills; SPARKSTATE_CRASH_EXTRA_KILLS adds random ones.
SEED = int(os.environ.get("SPARKSTATE_CRASH_SEED", "5"))
EXTRA_KILLS = int(os.environ.get("SPARKSTATE_CRASH_EXTRA_KILLS", "0"))
GAP = "1 minute"
FILES = 8
DATA = StreamConfig(users=20, seed=SEED, events=800, rate=0, malformed_share=0.03)
RUN_TIMEOUT_S = 300.0  # one run; a few seconds on an idle machine, minutes on a crowded one
# A run with the Kafka source also connects to the broker and runs one more Python worker per scan.
KAFKA_RUN_TIMEOUT_S = 600.0
# A whole test: a few restarts, each starting a JVM (pytest's default 600 s is short on a crowded machine).
CRASH_TEST_TIMEOUT_S = 1800


def _engines() -> list[str | None]:
    """The engines `sparkstate run --engine` accepts, the default first."""
    from sparkstate.engines import DEFAULT_ENGINE, ENGINES, NO_TWS_ENGINE

    # "inband" (PySpark 3.5's engine) is left out: each engine here costs minutes of restarts; its
    # restart on a checkpoint is tested in tests/engines/test_engines.py and the version matrix
    return [DEFAULT_ENGINE] + sorted(set(ENGINES) - {DEFAULT_ENGINE, NO_TWS_ENGINE})


# Every restart costs a JVM and Python workers (15-20 s on two idle cores), so the matrix is
# sparse. The sinks' exactly-once bookkeeping does not depend on the engine or the source, and an
# engine's recovery does not depend on the sink: every engine with files into Parquet, the default
# engine with Kafka into PostgreSQL and into Delta. Each test kills mid-batch and mid-commit; the
# default engine's Parquet test also between batches.
PARQUET_ENGINES = _engines()
ESSENTIAL = (MID_BATCH, MID_COMMIT)


def _engine_args(engine: str | None) -> list[str]:
    return [] if engine is None else ["--engine", engine]


@pytest.fixture
def clicks(tmp_path: Path):
    """The input files, and the records in them."""
    written = generate_files(tmp_path / "in", DATA, files=FILES)
    assert written.records == DATA.events and len(written.paths) == FILES
    return tmp_path / "in", stream_records(DATA)


def _job(tmp_path: Path, source: Path | str, sink: str, probe: SinkProbe, engine: str | None, *,
         deadletter: str | None = None, env: dict[str, str] | None = None) -> CrashingJob:
    ck = tmp_path / "ck"
    if isinstance(source, str):  # a kafka: topic, read 200 offsets per micro-batch
        reading = ["--source", source, "--option", "startingOffsets=earliest", "--option", "maxOffsetsPerTrigger=200"]
    else:
        reading = ["--source", f"files:{source}", "--option", "maxFilesPerTrigger=1"]
    args = cli(
        "run", "sessionize", *reading[:2], "--format", "json", "--sink", sink,
        "--checkpoint", str(ck), "--gap", GAP, "--time-mode", "event", "--watermark", "0 seconds",
        "--trigger", "500 milliseconds", *reading[2:], "--once", "--no-progress",
        *(["--deadletter", deadletter] if deadletter else []), *_engine_args(engine),
    )
    return CrashingJob(args, Checkpoint(ck), probe, tmp_path / "job.log", tmp_path, env or {})


def _crash_and_restart(job: CrashingJob, sink_name: str, points: tuple[str, ...],
                       wait_for: str | None = None, run_timeout_s: float = RUN_TIMEOUT_S) -> list:
    """The seeded plan of kills (each of ``points`` once), then a run to the end; no process left behind."""
    plan = plan_kills(SEED, sink_name, points, extra=EXTRA_KILLS, wait_for=wait_for)
    try:
        kills = job.crash_and_restart(plan, run_timeout_s)
    finally:
        leftovers = job.leftovers()
        assert leftovers == [], f"processes of the job outlived it: {leftovers}"
    landed = Counter(k.point for k in kills)
    assert all(landed[p] for p in points), f"kill points not all hit: {kills}"
    return kills


def _compare(job: CrashingJob, records, written: list[Session], dead_raw: list[str], kills: list) -> dict:
    events = [r.event for r in records if r.is_valid]
    # The final watermark is the latest event time (0 s delay), recorded with the last batch.
    final_ms = job.checkpoint.watermark_ms(job.checkpoint.last_planned())
    assert final_ms == int(max(e.event_time for e in events).timestamp() * 1000)
    expected = Counter(reference_sessions(events, GAP, watermark=final_ms))
    got = Counter(written)
    lost = expected - got
    extra = got - expected
    duplicated = sum(n for s, n in extra.items() if s in expected)
    invented = sum(n for s, n in extra.items() if s not in expected)
    bad = Counter(r.line for r in records if not r.is_valid)
    dead = Counter(dead_raw)
    figures = {
        "kills": len(kills), "kill_points": dict(Counter(k.point for k in kills)),
        "kills_detail": [(k.run, k.point, k.batch, k.sink_state) for k in kills], "runs": job.runs,
        "run_seconds": job.seconds,
        "records": len(records), "records_checked": sum(s.event_count * n for s, n in got.items()) + sum(dead.values()),
        "sessions_expected": sum(expected.values()), "sessions_written": sum(got.values()),
        "lost": sum(lost.values()), "duplicated": duplicated, "invented": invented,
        "dead_letters_expected": sum(bad.values()), "dead_letters_lost": sum((bad - dead).values()),
        "dead_letters_duplicated": sum((dead - bad).values()),
    }
    print(f"\ndriver crash figures: {figures}")
    assert sum(lost.values()) == 0, f"sessions lost: {sorted(lost.elements(), key=str)[:5]}; {figures}"
    assert duplicated == 0 and invented == 0, f"sessions duplicated/invented: {list(extra.elements())[:5]}; {figures}"
    assert dead == bad, f"dead letters differ from the malformed records: {figures}"
    return figures


@pytest.mark.timeout(CRASH_TEST_TIMEOUT_S)
@pytest.mark.parametrize("engine", PARQUET_ENGINES)
def test_parquet_sink_survives_driver_kills(spark, tmp_path, clicks, engine):
    started = time.monotonic()
    source, records = clicks
    out = tmp_path / "sessions"
    probe = ParquetProbe(out)
    job = _job(tmp_path, source, f"parquet:{out}", probe, engine)
    # The default engine's mid-commit kill comes after _spark_metadata/N (the restart's replay must be
    # skipped), another engine's while part files are being written (the restart must delete them).
    default = engine == PARQUET_ENGINES[0]
    kills = _crash_and_restart(job, "parquet", KILL_POINTS if default else ESSENTIAL,
                               wait_for=WRITTEN if default else WRITING)

    # What a reader sees: Spark reads the files the sink's log lists, not the attempts it killed.
    written = [Session.from_row(r) for r in spark.read.parquet(str(out)).collect()]
    dead_raw = [r.raw for r in spark.read.parquet(str(out / "_deadletter")).collect()]
    figures = _compare(job, records, written, dead_raw, kills)
    orphans = probe.orphan_files()
    print(f"part files of killed attempts left: {orphans}; {time.monotonic() - started:.0f} s")
    assert figures["sessions_expected"] > 100
    assert orphans == 0  # what a killed attempt wrote is deleted before its batch is redone


def _postgres_crash_run(spark, tmp_path, postgres_server, source: str, records, table: str):
    """The kill plan for a job (default engine) from the Kafka ``source`` into the postgres ``table``
    (dead letters as Parquet), then the rows written, the dead letters and :func:`_compare`'s figures."""
    postgres_server.execute(f"DROP TABLE IF EXISTS {table}")
    probe = PostgresProbe(postgres_server.connect, table)
    dead_dir = tmp_path / "dead"
    job = _job(tmp_path, source, f"postgres:{postgres_server.url_without_password}/{table}", probe, None,
               deadletter=f"parquet:{dead_dir}", env={"PGPASSWORD": postgres_server.password})
    try:
        kills = _crash_and_restart(job, "kafka-postgres", ESSENTIAL, run_timeout_s=KAFKA_RUN_TIMEOUT_S)
    finally:
        probe.close()
    rows = postgres_server.query(
        f"SELECT user_id, session_start, session_end, event_count, events, closed_by FROM {table}")
    names = ("user_id", "session_start", "session_end", "event_count", "events", "closed_by")
    written = [Session.from_row(dict(zip(names, r))) for r in rows]
    dead = spark.read.parquet(str(dead_dir)).collect()
    return rows, dead, _compare(job, records, written, [r.raw for r in dead], kills)


@pytest.fixture
def kafka_clicks(kafka_broker):
    """The generator's records (a few malformed) in a one-partition topic, in record order, as the
    files hold them; the kill plan then meets the same input as with the files source."""
    records = stream_records(DATA)
    topic = f"crash-clicks-{time.monotonic_ns()}"
    kafka_broker.create_topic(topic, 1)
    kafka_broker.produce(topic, [r.line for r in records])
    return f"kafka:{kafka_broker.bootstrap}/{topic}", records


@pytest.mark.timeout(CRASH_TEST_TIMEOUT_S)
def test_kafka_source_into_postgres_survives_driver_kills(spark, tmp_path, kafka_clicks, postgres_server):
    """The Kafka source's offsets in the checkpoint + the postgres sink's batch ids: exactly once."""
    source, records = kafka_clicks
    table = "crash_kafka_sessions"
    rows, dead, figures = _postgres_crash_run(spark, tmp_path, postgres_server, source, records, table)
    topic = source.rpartition("/")[2]
    assert all(r.source.startswith(f"kafka:{topic}/0@") for r in dead)  # where each came from
    batches = postgres_server.query(
        "SELECT count(*), coalesce(sum(row_count), 0) FROM sparkstate_sink_batches WHERE sink_id LIKE %s",
        (f"{table}@%",))[0]
    assert batches[1] == len(rows)  # every row came with its batch's progress row, in one transaction
    assert figures["sessions_expected"] > 100


@pytest.mark.timeout(CRASH_TEST_TIMEOUT_S)
def test_kafka_source_into_delta_survives_driver_kills(spark, tmp_path, kafka_clicks):
    """The Kafka source into the Delta sink (rows and batch id in one Delta commit): exactly once;
    dead letters in the default delta:PATH/_deadletter table."""
    from sparkstate.io.delta import read_delta

    source, records = kafka_clicks
    out = tmp_path / "sessions"
    probe = DeltaProbe(out, tmp_path / "ck")
    job = _job(tmp_path, source, f"delta:{out}", probe, None)
    kills = _crash_and_restart(job, "kafka-delta", ESSENTIAL, run_timeout_s=KAFKA_RUN_TIMEOUT_S)
    written = [Session.from_row(r) for r in read_delta(str(out)).to_pylist()]
    dead_raw = [r["raw"] for r in read_delta(str(out / "_deadletter")).to_pylist()]
    figures = _compare(job, records, written, dead_raw, kills)
    assert figures["sessions_expected"] > 100


def test_update_mode_file_sink_replays_a_stateful_batch(spark, tmp_path):
    """A crash after the sink wrote batch N but before Spark logged its commit, simulated: the restart
    re-runs batch N, the sink skips it, and the state stores still commit it (Spark fails a
    foreachBatch query whose stateful batch did not run on every partition)."""
    from sparkstate.io.sinks import start_sink
    from sparkstate.pipelines import running_count
    from tests.io.replay import drop_last_commit
    from tests.streams import LandingDir

    landing, out, ck = LandingDir(tmp_path / "in"), tmp_path / "counts", tmp_path / "ck"

    def run() -> None:
        query = start_sink(running_count(landing.stream(spark, "word string")), f"parquet:{out}", checkpoint=ck,
                           output_mode="update")
        try:
            query.processAllAvailable()
        finally:
            query.stop()
        assert query.exception() is None

    landing.add([{"word": w} for w in "abca"])
    run()
    replayed = drop_last_commit(ck)
    landing.add([{"word": w} for w in "ab"])
    run()
    rows = sorted((r.batch_id, r.word, r["count"]) for r in spark.read.parquet(str(out)).collect())
    assert rows == [(replayed, "a", 2), (replayed, "b", 1), (replayed, "c", 1), (replayed + 1, "a", 3),
                    (replayed + 1, "b", 2)]
