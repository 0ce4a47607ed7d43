"""A stop placed exactly between a data micro-batch and the no-data batch Spark owes after it.

After a batch that moves the watermark, Spark runs one more batch, without new data, that fires
the timeouts the new watermark made due; with processing-time timeouts it runs one at every
trigger. A job stopped in between (a crash, Ctrl-C, the end of a ``--once`` run) used to restart
without it: the due sessions waited for new input, forever for ``--once``.

The stop is placed exactly by running the first ``sparkstate run --once`` with Spark's no-data
batches turned off (``spark.sql.streaming.noDataMicroBatches.enabled``): it reads every file or
offset in data batches and ends with the last data batch committed and its no-data batch not
planned, the checkpoint a kill or a Ctrl-C at that moment leaves (``offsets/N`` and
``commits/N``, no ``offsets/N+1``; checked). The second run, on the same checkpoint with no new
input, must write every session due by the last watermark, once. The Ctrl-C test sends a real
SIGINT to the CLI during the data batch and checks that the owed batch ran before the query
stopped; the kill test SIGKILLs a ``sparkstate run`` process at that moment. Every other run is
``sparkstate run`` in this process, on the tests' Spark session (no JVM started for it).
"""

from __future__ import annotations

import os
import signal
import threading
import time
import uuid
from collections import Counter
from pathlib import Path

import pytest

import sparkstate as ss
from sparkstate.cli import main
from sparkstate.jobs import owed_batch
from sparkstate.jobs.generate import generate_files
from sparkstate.owed_batch import NO_DATA_BATCHES
from sparkstate.synthetic import Session, StreamConfig, reference_sessions, stream_records
from tests.reliability.crash import Checkpoint, JobProcess, cli

pytestmark = pytest.mark.reliability

GAP = "1 minute"
DATA = StreamConfig(users=12, seed=11, events=240, rate=0, malformed_share=0.0)
EVENT_TIME = ("--time-mode", "event", "--watermark", "0 seconds")
RUN_TIMEOUT_S = 300.0  # a few seconds on an idle machine, minutes on a crowded one


def _no_data_batches(spark, enabled: bool) -> None:
    spark.conf.set(NO_DATA_BATCHES, str(enabled).lower())


def _run(capsys, source: list[str], out: Path, ck: Path, *extra: str, once: bool = True, gap: str = GAP) -> str:
    args = ["run", "sessionize", *source[:2], "--format", "json", "--sink", f"parquet:{out}", "--checkpoint", str(ck),
            "--gap", gap, *source[2:], *extra, "--no-progress"]
    assert main(args + (["--once"] if once else [])) == 0, capsys.readouterr().err
    return capsys.readouterr().out


def _written(spark, out: Path) -> Counter:
    """The sessions in the Parquet sink ``out``, as Spark reads them (none before a first data file)."""
    if not any(p.name.endswith(".parquet") and not p.relative_to(out).parts[0].startswith("_")
               for p in out.rglob("part-*")):  # (_deadletter, _spark_metadata: not the sessions)
        return Counter()
    return Counter(Session.from_row(r) for r in spark.read.parquet(str(out)).collect())


def _stopped_before_the_owed_batch(spark, capsys, source: list[str], out: Path, ck: Path) -> int:
    """The first run, ended with its last data batch committed and the no-data batch after it not run;
    the id of that batch."""
    _no_data_batches(spark, False)
    try:
        _run(capsys, source, out, ck, *EVENT_TIME)
    finally:
        _no_data_batches(spark, True)
    log = Checkpoint(ck)
    last = log.last_committed()
    assert last is not None and log.last_planned() == last  # stopped between batches
    owed = owed_batch(ck, spark)
    assert owed is not None and owed.batch_id == last + 1 and owed.because == "watermark"
    assert owed.watermark_ms > log.watermark_ms(last)  # the last batch moved the watermark
    return owed.batch_id


def _check_restart(spark, capsys, source, out: Path, ck: Path, events) -> dict:
    owed_id = _stopped_before_the_owed_batch(spark, capsys, source, out, ck)
    log = Checkpoint(ck)
    final_ms = owed_batch(ck, spark).watermark_ms
    expected = Counter(reference_sessions(events, GAP, watermark=final_ms))
    before = _written(spark, out)
    assert before - expected == Counter()  # nothing wrong so far ...
    missing = sum((expected - before).values())
    assert missing > 0  # ... and sessions final by the last watermark not written: the stop left them due

    summary = _run(capsys, source, out, ck, *EVENT_TIME)  # --once, nothing new to read
    got = _written(spark, out)
    assert log.last_committed() == owed_id and log.watermark_ms(owed_id) == final_ms
    assert got == expected, (f"lost {list((expected - got).elements())[:3]},"
                             f" duplicated or invented {list((got - expected).elements())[:3]}")
    assert owed_batch(ck, spark) is None
    figures = {"sessions": sum(expected.values()), "due_at_the_stop": missing, "owed_batch": owed_id}
    print(f"\nstop between batches: {figures}\n{summary}")
    return figures


def test_a_once_run_writes_the_sessions_a_stop_left_due_files(spark, tmp_path, capsys):
    written = generate_files(tmp_path / "in", DATA, files=4)
    events = [r.event for r in stream_records(DATA) if r.is_valid]
    assert written.records == DATA.events
    source = ["--source", f"files:{tmp_path / 'in'}", "--option", "maxFilesPerTrigger=1"]
    _check_restart(spark, capsys, source, tmp_path / "out", tmp_path / "ck", events)


def test_a_once_run_writes_the_sessions_a_stop_left_due_kafka(kafka_spark, kafka_broker, tmp_path, capsys):
    records = stream_records(DATA)
    topic = f"owed-{time.monotonic_ns()}"
    kafka_broker.create_topic(topic, 1)
    kafka_broker.produce(topic, [r.line for r in records])
    source = ["--source", f"kafka:{kafka_broker.bootstrap}/{topic}", "--option", "startingOffsets=earliest",
              "--option", "maxOffsetsPerTrigger=80"]
    _check_restart(kafka_spark, capsys, source, tmp_path / "out", tmp_path / "ck",
                   [r.event for r in records if r.is_valid])


def test_a_once_run_fires_processing_time_timeouts_the_clock_made_due(spark, tmp_path, capsys):
    """Processing time: sessions close ``gap`` of processing time after their last event. The first run
    reads everything and stops; the second, once the gap has passed, closes every open session."""
    gap_s = 2
    written = generate_files(tmp_path / "in", DATA, files=2)
    assert written.records == DATA.events
    source = ["--source", f"files:{tmp_path / 'in'}", "--option", "maxFilesPerTrigger=1"]
    out, ck = tmp_path / "out", tmp_path / "ck"
    mode = ["--time-mode", "processing"]
    _no_data_batches(spark, False)
    try:
        _run(capsys, source, out, ck, *mode, gap=f"{gap_s} seconds")
    finally:
        _no_data_batches(spark, True)
    log = Checkpoint(ck)
    last = log.last_committed()
    assert last is not None and log.last_planned() == last
    owed = owed_batch(ck, spark)  # told by the checkpoint's state metadata: a processing-time operator
    assert owed is not None and owed.because == "processing_time" and owed.batch_id == last + 1
    first = _written(spark, out)
    events = Counter(r.event.data for r in stream_records(DATA) if r.is_valid)
    assert sum(s.event_count for s in first.elements()) < sum(events.values())  # sessions left open
    # The second run's batch time must be gap_s past the last batch's (when the open sessions were last fed).
    while time.time() * 1000 <= log.timestamp_ms(last) + gap_s * 1000:
        time.sleep(0.1)

    _run(capsys, source, out, ck, *mode, gap=f"{gap_s} seconds")
    got = _written(spark, out)
    assert log.last_committed() > last  # batches with no new data (one at every trigger in processing time)
    new = got - first
    assert new and all(s.closed_by == "timeout" for s in new.elements())
    # Every event in exactly one session: every session closed, none twice.
    assert Counter(d for s in got.elements() for d in s.events) == events
    assert ss.state.keys(spark, str(ck)) == 0


def test_ctrl_c_during_a_data_batch_lets_the_no_data_batch_it_owes_run_too(spark, tmp_path, capsys):
    """A real SIGINT to ``sparkstate run`` (its Ctrl-C handling) while the data batch runs. The query stops
    after that batch and after the no-data batch it made owed, which Spark starts at the next trigger
    (without the wait, it stopped before it, or cut it when the data batch overran the trigger)."""
    generate_files(tmp_path / "in", DATA, files=1)
    events = [r.event for r in stream_records(DATA) if r.is_valid]
    out, ck = tmp_path / "out", tmp_path / "ck"
    log = Checkpoint(ck)
    landed: dict[str, object] = {}

    def interrupt_in_batch_0() -> None:
        deadline = time.monotonic() + RUN_TIMEOUT_S
        while time.monotonic() < deadline and not log.planned(0):
            time.sleep(0.005)
        landed["committed_0"] = log.committed(0)
        os.kill(os.getpid(), signal.SIGINT)

    watcher = threading.Thread(target=interrupt_in_batch_0, daemon=True)
    watcher.start()
    try:
        summary = _run(capsys, ["--source", f"files:{tmp_path / 'in'}"], out, ck, *EVENT_TIME, "--trigger", "5 seconds",
                       once=False)
    finally:
        watcher.join(timeout=RUN_TIMEOUT_S)
    assert landed.get("committed_0") is False, f"the SIGINT did not land in batch 0: {landed}"
    assert "stopped on request" in summary
    # Batch 1 ran before the query stopped: no new data, the watermark batch 0 moved to.
    assert log.committed(1) and not log.planned(2)
    final_ms = log.watermark_ms(1)
    assert final_ms > log.watermark_ms(0)
    expected = Counter(reference_sessions(events, GAP, watermark=final_ms))
    assert _written(spark, out) == expected and sum(expected.values()) > 0
    assert owed_batch(ck, spark) is None


def test_a_driver_killed_between_a_batch_and_its_no_data_batch(spark, tmp_path, capsys):
    """``sparkstate run`` in a process of its own, SIGKILLed (with its JVM and workers) once its data
    batch is committed and before Spark plans the no-data batch (a long trigger keeps that moment
    open); then ``--once`` on the checkpoint."""
    generate_files(tmp_path / "in", DATA, files=1)
    events = [r.event for r in stream_records(DATA) if r.is_valid]
    out, ck = tmp_path / "out", tmp_path / "ck"
    source = ["--source", f"files:{tmp_path / 'in'}"]
    args = cli("run", "sessionize", *source, "--format", "json", "--sink", f"parquet:{out}", "--checkpoint", str(ck),
               "--gap", GAP, *EVENT_TIME, "--trigger", "60 seconds", "--no-progress")
    job = JobProcess(args, tmp_path / "job.log", uuid.uuid4().hex, tmp_path)
    log = Checkpoint(ck)
    try:
        deadline = time.monotonic() + RUN_TIMEOUT_S
        while not log.committed(0):
            assert job.running(), f"the job ended before it was killed:\n{job.tail()}"
            assert time.monotonic() < deadline, f"batch 0 not committed in {RUN_TIMEOUT_S} s:\n{job.tail()}"
            time.sleep(0.005)
    finally:
        job.kill()
    assert log.committed(0) and not log.planned(1)  # killed between the data batch and its no-data batch
    assert _written(spark, out) == Counter()  # batch 0 ran at watermark 0: nothing final yet

    _run(capsys, source, out, ck, *EVENT_TIME)  # --once: nothing new to read
    final_ms = log.watermark_ms(1)
    assert log.committed(1) and final_ms > 0
    expected = Counter(reference_sessions(events, GAP, watermark=final_ms))
    assert _written(spark, out) == expected and sum(expected.values()) > 0
