"""Faults around the job: the Kafka broker killed and started again, PostgreSQL crashing in the
middle of a batch write, the checkpoint's disk filling up.

Each test runs the event-time sessionization job (:func:`sparkstate.jobs.run_pipeline`, what
``sparkstate run sessionize`` calls) on the generator's records, breaks something the job
depends on at a moment read from disk or from the server (a committed batch in the checkpoint,
a write waiting on a lock), repairs it, and runs the job again on the same checkpoint when the
fault stopped it. Whatever the job did meanwhile (rode through, or stopped with one line), the
end result must be the generator's reference sessions exactly: none lost, none twice, and every
malformed record a dead letter exactly once.

The jobs run in the tests' own SparkSession, in a thread, so the test can watch the checkpoint
while the job runs (a child process per run would cost a JVM start each time).
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
import threading
import time
import uuid
import zipfile
from collections import Counter
from pathlib import Path

import pytest

from sparkstate.errors import JobFailedError
from sparkstate.jobs import JobConfig, run_pipeline
from sparkstate.jobs.generate import generate_files
from sparkstate.synthetic import Session, StreamConfig, reference_sessions, stream_records
from tests.io.pg import postgres_server  # noqa: F401
from tests.reliability.crash import Checkpoint

pytestmark = pytest.mark.reliability

GAP = "1 minute"
DATA = StreamConfig(users=20, seed=26, events=800, rate=0, malformed_share=0.03)
FILES = 8
TEST_TIMEOUT_S = 1500
WAIT_S = 600.0  # for one condition, on a crowded machine


def _wait(what: str, cond, timeout_s: float = WAIT_S, poll_s: float = 0.02, jobs=()) -> None:
    """Poll ``cond`` until true; fail naming ``what`` after ``timeout_s`` (or when one of ``jobs`` ends)."""
    deadline = time.monotonic() + timeout_s
    while not cond():
        for job in jobs:
            if not job.alive():
                raise AssertionError(f"the job ended ({job.error!r}) before: {what}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for: {what}")
        time.sleep(poll_s)


class JobThread:
    """``run_pipeline(spark, config)`` in a thread: its result, or the exception it raised."""

    def __init__(self, spark, config: JobConfig) -> None:
        self.result = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(spark, config), daemon=True)
        self.thread.start()

    def _run(self, spark, config: JobConfig) -> None:
        try:
            self.result = run_pipeline(spark, config)
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            self.error = exc

    def alive(self) -> bool:
        return self.thread.is_alive()

    def join(self, timeout_s: float = WAIT_S) -> None:
        self.thread.join(timeout_s)
        assert not self.thread.is_alive(), f"the job did not end within {timeout_s:.0f} s"


def _one_line_failure(job: JobThread) -> str:
    """The job stopped on the fault: with a JobFailedError whose message is one line (what the CLI prints)."""
    assert isinstance(job.error, JobFailedError), f"not a one-line job failure: {job.error!r}"
    text = str(job.error)
    assert "\n" not in text and "Traceback" not in text and len(text) <= 700, text
    return text


def _expected(records, final_ms: int) -> Counter:
    events = [r.event for r in records if r.is_valid]
    assert final_ms == int(max(e.event_time for e in events).timestamp() * 1000)
    return Counter(reference_sessions(events, GAP, watermark=final_ms))


def _assert_exact(records, ck: Checkpoint, written: list[Session], dead_raw: list[str]) -> int:
    """What the sink holds is the reference (final watermark from the checkpoint) and the dead letters
    are the malformed records, each exactly once; returns the number of sessions."""
    expected = _expected(records, ck.watermark_ms(ck.last_planned()))
    got = Counter(written)
    lost, extra = expected - got, got - expected
    assert not lost and not extra, (f"lost {sum(lost.values())} sessions, {sum(extra.values())} extra:"
                                    f" {list(lost)[:2]} {list(extra)[:2]}")
    assert Counter(dead_raw) == Counter(r.line for r in records if not r.is_valid)
    return sum(expected.values())


def _config(source: str, sink: str, ck: Path, **kw) -> JobConfig:
    return JobConfig("sessionize", source=source, sink=sink, checkpoint=str(ck), format="json", gap=GAP,
                     time_mode="event", watermark="0 seconds", trigger="200 milliseconds", once=True, **kw)


def _pg_rows(server, table: str) -> list[Session]:
    names = ("user_id", "session_start", "session_end", "event_count", "events", "closed_by")
    rows = server.query(f"SELECT {', '.join(names)} FROM {table}")
    return [Session.from_row(dict(zip(names, r))) for r in rows]


def _pg_batches_once(server, table: str) -> None:
    """Every batch id of the table's sink is in the progress table once, with the row count the table holds."""
    got = server.query("SELECT count(*), count(DISTINCT batch_id), coalesce(sum(row_count), 0)"
                       " FROM sparkstate_sink_batches WHERE sink_id LIKE %s", (f"{table}@%",))[0]
    assert got[0] == got[1] and got[0] > 0
    assert got[2] == server.query(f"SELECT count(*) FROM {table}")[0][0]


# --- 1. the Kafka broker is killed and started again -----------------------------------------

@pytest.mark.timeout(TEST_TIMEOUT_S)
def test_kafka_broker_killed_mid_run_into_delta_and_postgres(kafka_spark, kafka_broker, postgres_server, tmp_path):
    """Two jobs read one topic, 50 offsets per micro-batch: one into Delta, one into PostgreSQL. Once
    both have committed a batch, the broker gets SIGKILL and is started again on its log directory
    (about 30 s). Each job rides through the outage or stops with one line (and is run again); the
    Delta table and the PostgreSQL table then hold the reference sessions exactly."""
    from sparkstate.io.delta import read_delta

    spark = kafka_spark
    records = stream_records(DATA)
    topic = f"fault-clicks-{uuid.uuid4().hex[:8]}"
    kafka_broker.create_topic(topic, 1)
    kafka_broker.produce(topic, [r.line for r in records])
    source = f"kafka:{kafka_broker.bootstrap}/{topic}"
    options = {"startingOffsets": "earliest", "maxOffsetsPerTrigger": "50", "failOnDataLoss": "true"}
    table = "fault_kafka_sessions"
    postgres_server.execute(f"DROP TABLE IF EXISTS {table}")
    configs = {
        "delta": _config(source, f"delta:{tmp_path / 'sessions'}", tmp_path / "ck-delta", options=options,
                         query_name="fault_kafka_delta"),
        "postgres": _config(source, f"postgres:{postgres_server.url}/{table}", tmp_path / "ck-pg",
                            deadletter=f"parquet:{tmp_path / 'dead-pg'}", options=options, query_name="fault_kafka_pg"),
    }
    cks = {name: Checkpoint(Path(c.checkpoint)) for name, c in configs.items()}
    jobs = {name: JobThread(spark, c) for name, c in configs.items()}
    _wait("both jobs committing batch 1", lambda: all(ck.committed(1) for ck in cks.values()),
          jobs=jobs.values())
    kafka_broker.kill()
    killed_at = {name: ck.last_committed() for name, ck in cks.items()}
    outage = time.monotonic()
    kafka_broker.restart()
    kafka_broker.wait_for_leaders(topic)
    outage = time.monotonic() - outage
    during = {name: ck.last_committed() for name, ck in cks.items()}  # batches that committed while it was down
    did = {}
    for name, job in jobs.items():
        job.join()
        if job.error is None:
            did[name] = "rode through"
            continue
        did[name] = f"stopped: {_one_line_failure(job)}"
        again = JobThread(spark, configs[name])  # the restart, on the same checkpoint
        again.join()
        assert again.error is None, f"{name}: the restart failed: {again.error}"
    print(f"\nbroker outage {outage:.0f} s; killed after batches {killed_at}, last committed when it was back"
          f" {during}; the jobs: {did}")
    assert all(n < 15 for n in killed_at.values())  # 800 offsets, 50 a batch: killed mid-run

    delta_rows = read_delta(str(tmp_path / "sessions")).to_pylist()
    delta_dead = read_delta(str(tmp_path / "sessions" / "_deadletter")).to_pylist()
    sessions = _assert_exact(records, cks["delta"], [Session.from_row(r) for r in delta_rows],
                             [r["raw"] for r in delta_dead])
    assert sessions > 100
    dead = spark.read.parquet(str(tmp_path / "dead-pg")).collect()
    assert _assert_exact(records, cks["postgres"], _pg_rows(postgres_server, table), [r.raw for r in dead]) == sessions
    _pg_batches_once(postgres_server, table)
    print(f"{sessions} sessions exact in Delta and in PostgreSQL; {len(dead)} dead letters each")


# --- 3. PostgreSQL crashes in the middle of a batch write -------------------------------------

@pytest.fixture
def clicks(tmp_path: Path):
    written = generate_files(tmp_path / "in", DATA, files=FILES)
    assert written.records == DATA.events
    return tmp_path / "in", stream_records(DATA)


@pytest.mark.timeout(TEST_TIMEOUT_S)
def test_postgres_crash_in_the_middle_of_a_batch_write(spark, clicks, tmp_path):
    """A server of its own. Once a batch is committed, the test locks the table, so the next batch's
    transaction (its batch id already inserted) waits inside its COPY; the server is then killed
    (``pg_ctl stop -m immediate``: no clean shutdown, crash recovery on start). The job stops with
    one line; the server starts again, the job runs again: every batch in the table exactly once."""
    from tests.io.pg import start_server

    server = start_server()
    try:
        source, records = clicks
        table = "fault_pg_sessions"
        ck = Checkpoint(tmp_path / "ck")
        config = _config(f"files:{source}", f"postgres:{server.url}/{table}", ck.path,
                         deadletter=f"parquet:{tmp_path / 'dead'}", options={"maxFilesPerTrigger": "1"})
        job = JobThread(spark, config)
        batches_of = lambda: server.query(  # noqa: E731
            "SELECT count(*) FROM sparkstate_sink_batches WHERE sink_id LIKE %s", (f"{table}@%",))[0][0]
        _wait("a batch in the table", lambda: _has_table(server, "sparkstate_sink_batches") and batches_of() > 0,
              poll_s=0.1, jobs=[job])
        locker = server.connect()
        locker.autocommit = False
        locker.execute(f"LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE")
        waiting = ("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND state = 'active'"
                   " AND query LIKE 'COPY%%'")
        _wait("the job's COPY waiting on the lock", lambda: server.query(waiting)[0][0] > 0, poll_s=0.1,
              jobs=[job])
        in_flight = server.query("SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a USING (pid)"
                                 " WHERE a.query LIKE 'COPY%%' AND l.locktype = 'transactionid'")[0][0]
        assert in_flight > 0  # the batch's transaction holds its id: its batch row is inserted, not committed
        committed_before = batches_of()
        server.crash()
        locker.close()
        job.join()
        line = _one_line_failure(job)
        assert "postgres sink" in line and server.password not in line
        server.start()
        assert batches_of() == committed_before  # crash recovery dropped the batch in flight
        again = JobThread(spark, config)
        again.join()
        assert again.error is None, f"the restart failed: {again.error}"
        print(f"\npostgres crash: {committed_before} batches committed before it; the job: {line}")
        dead = spark.read.parquet(str(tmp_path / "dead")).collect()
        sessions = _assert_exact(records, ck, _pg_rows(server, table), [r.raw for r in dead])
        assert sessions > 100
        _pg_batches_once(server, table)
        print(f"{sessions} sessions exact, {len(dead)} dead letters; {batches_of()} batches committed in all")
    finally:
        server.remove()


def _has_table(server, name: str) -> bool:
    return bool(server.query("SELECT to_regclass(%s) IS NOT NULL", (name,))[0][0])


# --- 4. the checkpoint's disk fills up --------------------------------------------------------

MOUNT_SIZE = "64m"


@pytest.fixture
def small_disk(tmp_path: Path):
    """A 64 MB tmpfs of the test's own (root may mount; CI runs as root). Not skipped when it
    cannot be made: the test then fails, saying what was tried."""
    where = tmp_path / "small-disk"
    where.mkdir()
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={MOUNT_SIZE},mode=0755", "tmpfs", str(where)],
                         capture_output=True, text=True)
    if res.returncode != 0:
        pytest.fail(f"the disk-full test needs a small filesystem of its own: `mount -t tmpfs` as uid {os.geteuid()}"
                    f" failed ({res.stderr.strip() or res.returncode}); run the tests as root (CI does) or in a"
                    " container allowed to mount", pytrace=False)
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)


def _fill(disk: Path) -> Path:
    """Write a ballast file until the filesystem is full; return it."""
    ballast = disk / "ballast"
    with open(ballast, "wb", buffering=0) as f:
        for size in (1 << 20, 4096):  # megabytes, then what is left of the last one
            chunk = b"\0" * size
            try:
                while True:
                    f.write(chunk)
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
    return ballast


def _state_files_sound(ck: Path) -> int:
    """Every state file in the checkpoint reads whole (zip archives pass their CRC check) and every
    offset/commit log entry parses; returns how many state files were checked."""
    n = 0
    for p in (ck / "state").rglob("*"):
        if not p.is_file() or p.name.startswith("."):
            continue
        n += 1
        assert p.stat().st_size > 0, f"an empty state file: {p}"
        if p.suffix == ".zip":
            with zipfile.ZipFile(p) as z:
                assert z.testzip() is None, f"a corrupt state snapshot: {p}"
    for log in ("offsets", "commits"):
        for p in (ck / log).iterdir():
            if p.name.isdigit():
                lines = p.read_text().splitlines()
                assert lines and lines[0].startswith("v"), f"a broken {log} entry: {p}"
                for line in lines[1:]:
                    json.loads(line)
    return n


@pytest.mark.timeout(TEST_TIMEOUT_S)
def test_checkpoint_disk_fills_up(spark, clicks, small_disk, tmp_path):
    """The checkpoint on a small filesystem; once batch 1 is committed a ballast file takes every free
    byte. The job stops with one line naming the full disk; the ballast is deleted, the job runs again on
    the same checkpoint: the reference sessions exactly, and every state file reads whole."""
    from sparkstate.state.read import keys

    source, records = clicks
    ck = Checkpoint(small_disk / "ck")
    out = tmp_path / "sessions"
    config = _config(f"files:{source}", f"parquet:{out}", ck.path, options={"maxFilesPerTrigger": "1"})
    ballast = _fill(small_disk)  # full before the first run: it stops with one line, nothing half-written
    with pytest.raises(JobFailedError, match="No space left on device") as before:
        run_pipeline(spark, config)
    assert "\n" not in str(before.value) and not any(ck.path.glob("*.json"))
    ballast.unlink()
    job = JobThread(spark, config)
    _wait("batch 1 committed", lambda: ck.committed(1), jobs=[job])
    ballast = _fill(small_disk)
    job.join()
    line = _one_line_failure(job)
    assert "No space left on device" in line and "disk" in line, line
    stopped_at = ck.last_committed()
    assert stopped_at is not None and stopped_at < FILES - 1
    ballast.unlink()
    again = JobThread(spark, config)
    again.join()
    assert again.error is None, f"the restart failed: {again.error}"
    print(f"\ndisk full: the job stopped after batch {stopped_at}: {line}")
    written = [Session.from_row(r) for r in spark.read.parquet(str(out)).collect()]
    dead = [r.raw for r in spark.read.parquet(str(out / "_deadletter")).collect()]
    sessions = _assert_exact(records, ck, written, dead)
    assert sessions > 100
    checked = _state_files_sound(ck.path)
    assert checked > 0
    assert keys(spark, ck.path) is not None
    print(f"{sessions} sessions exact, {len(dead)} dead letters; {checked} state files read whole")
