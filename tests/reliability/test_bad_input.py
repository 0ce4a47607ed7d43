"""Bad input, end to end through ``sparkstate run``: every record ends up somewhere, with a reason.

Each test runs the real job (``sparkstate run`` in this process, or as a process of its own where
Spark's log must be searched) on real files, Parquet/JSON sinks and a real PostgreSQL server:

- malformed records (broken JSON, not an object, missing/null key, wrong types, a huge record)
  -> dead letters with their reasons; sessions + open sessions + dead letters = records read;
- events older than the watermark -> dead letters ("late: ..."), counted per batch; Spark drops
  none of them (``numRowsDroppedByWatermark`` 0), where a plain query drops them silently;
- one producer's clock a year ahead: without a guard the watermark jumps, every other user's
  session closes and their later events are late (all counted, none lost); with
  ``--max-future-skew`` the far-future event is a dead letter and nothing else changes;
- a state function that raises: the job stops with one line naming the key and the exception;
  a restart with the fixed function on the same checkpoint loses and repeats nothing;
- a checkpoint of another pipeline, or state that no longer fits: refused before anything is
  written (checkpoint and sink byte-for-byte unchanged);
- security basics: sockets and Spark's ports on localhost; a PostgreSQL password from a file
  never reaches Spark's log, the output, the metrics file, the checkpoint or an error message.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
from collections import Counter
from datetime import datetime, timedelta, timezone
from pathlib import Path
from urllib.parse import quote

import pytest
from pyspark.sql.streaming import StreamingQueryListener

import sparkstate as ss
from sparkstate.cli import main
from sparkstate.engines import DEFAULT_ENGINE
from sparkstate.errors import StateSchemaError, explain
from sparkstate.synthetic import Event, Session, generate_events, reference_sessions
from sparkstate.io.sinks import start_sink
from sparkstate.jobs import JOB_PIPELINES, JobConfig, JobPipeline, run_pipeline
from sparkstate.pipelines.sessionize import iso_ms

from tests.io.pg import postgres_server  # noqa: F401  (session-scoped fixture)
from tests.streams import source_scans

pytestmark = pytest.mark.reliability

GAP = "1 minute"
SCRIPT = Path(sys.executable).with_name("sparkstate")
FIGURES: dict[str, dict] = {}  # printed at the end of each test (pytest -s), for docs/reliability.md


# --- helpers -----------------------------------------------------------------------------------

def _write_files(directory: Path, chunks: list[list[str]]) -> list[Path]:
    """One JSON-lines file per chunk, in order, modification times a second apart (read in order)."""
    directory.mkdir(parents=True, exist_ok=True)
    base = int(time.time()) - len(chunks) - 1
    paths = []
    for i, lines in enumerate(chunks):
        path = directory / f"part-{i:05d}.json"
        tmp = directory / f".{path.name}.tmp"
        tmp.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
        os.utime(tmp, (base + i, base + i))
        tmp.rename(path)
        paths.append(path)
    return paths


def _run(capsys, *args: str) -> tuple[int, str, str]:
    code = main(["run", *args, "--no-progress"])
    printed = capsys.readouterr()
    return code, printed.out, printed.err


def _metrics(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _sessions(spark, path: Path) -> list[Session]:
    return sorted((Session.from_row(r) for r in spark.read.parquet(str(path)).collect()),
                  key=lambda s: (s.user_id, s.session_start))


def _dead(spark, path: Path) -> list:
    return spark.read.parquet(str(path)).collect() if path.exists() else []


def _utc(iso: str) -> datetime:
    return datetime.strptime(iso, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=timezone.utc)


def _batch_of_file(ck: Path) -> dict[str, int]:
    """Which micro-batch read which input file (the file source's log in the checkpoint)."""
    out = {}
    for entry in (ck / "sources" / "0").iterdir():
        if entry.name.isdigit():
            for line in entry.read_text().splitlines()[1:]:
                out[Path(json.loads(line)["path"].removeprefix("file://")).name] = int(entry.name)
    return out


def _open_events(events: list[Event], written: list[Session]) -> int:
    """Events of the reference sessions not written (still open in state at the end)."""
    still_open = Counter(reference_sessions(events, GAP)) - Counter(written)
    return sum(s.event_count * n for s, n in still_open.items())


def _tree(path: Path) -> dict[str, tuple[int, int]]:
    """Every file under ``path`` with its size and modification time (CLI log files left out)."""
    if not path.exists():
        return {}
    return {str(p.relative_to(path)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in sorted(path.rglob("*")) if p.is_file() and p.name != "spark.log"}


def _report(name: str, **figures) -> None:
    FIGURES[name] = figures
    print(f"\nbad input figures [{name}]: {json.dumps(figures, default=str)}")


def _session_args(src: Path, out: Path, ck: Path, metrics: Path, *extra: str) -> list[str]:
    """``sparkstate run sessionize`` on ``src`` (one file per micro-batch unless ``extra`` says otherwise)."""
    if not any(e.startswith("maxFilesPerTrigger") for e in extra):
        extra = ("--option", "maxFilesPerTrigger=1", *extra)
    return ["sessionize", "--source", f"files:{src}", "--format", "json", "--sink", f"parquet:{out}",
            "--checkpoint", str(ck), "--gap", GAP, "--time-mode", "event", "--watermark", "0 seconds",
            "--once", "--metrics", str(metrics), "--trigger", "200 milliseconds", *extra]


# --- 1. malformed records -----------------------------------------------------------------------

T = "2024-01-01T00:00:01.000Z"
MALFORMED = [  # (line, reason) -- the reasons are the parse step's contract (io/parse.py)
    ('{"user_id": "user-000", "event_time": "' + T + '", "data": "/x"', "not valid JSON"),
    ("[1, 2, 3]", "not a JSON object"),
    ('"just a string"', "not a JSON object"),
    ('{"event_time": "' + T + '", "data": "/y", "is_last": false}', "missing field user_id"),
    ('{"user_id": null, "event_time": "' + T + '", "data": "/z", "is_last": false}', "field user_id is null"),
    ('{"user_id": "user-001", "event_time": "yesterday", "data": "/w", "is_last": false}',
     "field event_time: expected timestamp, got 'yesterday'"),
    ('{"user_id": "user-001", "event_time": "' + T + '", "data": "/v", "is_last": "maybe"}',
     "field is_last: expected boolean, got 'maybe'"),
    ('{"user_id": "user-003", "event_time": null, "data": "/u", "is_last": false}', "field event_time is null"),
    ('{"user_id": "user-003", "event_time": "' + T + '", "data": "/u"}', "missing field is_last"),
    ("{}", "missing field user_id; missing field event_time; missing field data; missing field is_last"),
    # a time Spark holds and Python cannot: refused by the parse, and never handed to Python
    ('{"user_id": "user-001", "event_time": "0000-01-01T00:00:00Z", "data": "/t", "is_last": false}',
     "field event_time: timestamp out of range (years 1 to 9999), got '0000-01-01T00:00:00Z'"),
]
HUGE = json.dumps({"user_id": "user-002", "event_time": T, "data": "x" * 1_200_000, "is_last": False})


def _batch_time(ck: Path, batch: int) -> datetime:
    """A micro-batch's time, as Spark's offset log records it."""
    meta = json.loads((ck / "offsets" / str(batch)).read_text().splitlines()[1])
    ms = meta["batchTimestampMs"]
    return datetime.fromtimestamp(ms // 1000, timezone.utc) + timedelta(milliseconds=ms % 1000)


def test_malformed_records_become_dead_letters_with_their_reasons(spark, tmp_path, capsys):
    events = generate_events(150, users=5, seed=31)
    good = [e.to_json() for e in events]
    bad = [line for line, _ in MALFORMED] + [HUGE]
    # Bad records among the good ones, and blank lines (not records, as in Spark's JSON reader).
    _write_files(tmp_path / "in", [good[:75], good[75:110] + bad[:5] + ["", "   "], good[110:] + bad[5:]])
    out, ck, metrics = tmp_path / "out", tmp_path / "ck", tmp_path / "m.jsonl"
    code, _, err = _run(capsys, *_session_args(tmp_path / "in", out, ck, metrics, "--option", "maxFilesPerTrigger=1"))
    assert code == 0, err

    dead = _dead(spark, out / "_deadletter")
    expected = Counter(MALFORMED) + Counter({(HUGE, f"record is {len(HUGE)} bytes, over the limit of 1000000"
                                                    " bytes (max_record_bytes)"): 1})
    got = Counter((HUGE if r.raw.endswith("... [truncated]") else r.raw, r.reason) for r in dead)
    assert got == expected
    huge = next(r for r in dead if r.reason.startswith("record is"))
    assert huge.raw == HUGE[:1024] + "... [truncated]"  # the dead letter keeps the head of a huge record
    assert all(r.source.endswith(".json") and r.received_at is not None for r in dead)
    # received_at is its micro-batch's time, as Spark's offset log records it (the same on a replay).
    batch = _batch_of_file(ck)
    assert {r.received_at.astimezone(timezone.utc) for r in dead} == {_batch_time(ck, batch[n]) for n in ("part-00001.json", "part-00002.json")}
    assert all(r.received_at.astimezone(timezone.utc) == _batch_time(ck, batch[Path(r.source).name]) for r in dead)

    lines = _metrics(metrics)
    written = _sessions(spark, out)
    final = _utc(lines[-1]["watermark"])
    assert written == reference_sessions(events, GAP, watermark=final)
    in_sessions = sum(s.event_count for s in written)
    records = len(good) + len(bad)
    # Every record read is in exactly one place: a written session, a session still open, a dead letter.
    assert in_sessions + _open_events(events, written) + len(dead) == records == sum(m["rows_in"] for m in lines)
    assert sum(m["dead_letters"] for m in lines) == len(bad) == lines[-1]["dead_letters_total"]
    assert sum(m["late"] for m in lines) == 0
    _report("malformed", records=records, good=len(good), dead_lettered=len(dead), in_sessions=in_sessions,
            still_open=_open_events(events, written), lost=records - in_sessions - _open_events(events, written)
            - len(dead), reasons=len(set(expected)))


def test_event_time_refuses_malformed_records_in_its_one_read_of_the_input(spark, tmp_path, capsys):
    """An event-time sessionize job gives the pipeline every record, with the parse's reason, and
    the pipeline refuses the malformed ones: the query reads each input file once. A
    processing-time job reads the dead letters beside the pipeline (a second read). The dead
    letters are the same either way, byte for byte: a huge record's head, invalid UTF-8 replaced
    in ``raw`` and exact in ``raw_bytes``, also in a late event (the pipeline carries the record's
    bytes: as a string, Python could not take them)."""
    events = generate_events(80, users=4, seed=13)
    broken = b'\xff\xfe{"user_id": "user-000", oops'
    late = Event("user-009", events[0].event_time - timedelta(hours=1), "/cafX").to_json().encode().replace(
        b"/cafX", b"/caf\xe9")  # a byte that is not UTF-8, in a record that parses
    lines = [e.to_json().encode() for e in events[:40]] + [m.encode() for m, _ in MALFORMED] + [HUGE.encode(), broken]
    (tmp_path / "in").mkdir()
    for i, chunk in enumerate((lines, [e.to_json().encode() for e in events[40:]] + [late])):
        path = tmp_path / "in" / f"part-{i:05d}.json"
        path.write_bytes(b"".join(line + b"\n" for line in chunk))
        os.utime(path, (time.time() - 10 + i, time.time() - 10 + i))
    dead, scans = {}, {}
    for mode in ("event", "processing"):
        out, ck = tmp_path / mode / "out", tmp_path / mode / "ck"
        code, _, err = _run(capsys, "sessionize", "--source", f"files:{tmp_path / 'in'}", "--format", "json",
                            "--sink", f"parquet:{out}", "--checkpoint", str(ck), "--time-mode", mode, "--once",
                            "--option", "maxFilesPerTrigger=1", "--trigger", "200 milliseconds")
        assert code == 0, err
        scans[mode] = source_scans(ck)
        dead[mode] = Counter((r.raw, bytes(r.raw_bytes), r.reason, Path(r.source).name)
                             for r in _dead(spark, out / "_deadletter"))
    assert scans == {"event": {1}, "processing": {2}}
    # processing time has no late events: the late one joined a session there
    late_letters = [k for k in dead["event"] if k[2].startswith("late: ")]
    assert len(late_letters) == 1 and dead["event"][late_letters[0]] == 1
    assert late_letters[0][:2] == (late.decode("utf-8", "replace"), late) and late_letters[0][3] == "part-00001.json"
    del dead["event"][late_letters[0]]
    assert dead["event"] == dead["processing"]
    assert sum(dead["event"].values()) == len(MALFORMED) + 2
    assert Counter(reason for (_, _, reason, _), n in dead["event"].items() for _ in range(n)) == Counter(
        [reason for _, reason in MALFORMED] + ["not valid JSON",
                                               f"record is {len(HUGE)} bytes, over the limit of 1000000 bytes"
                                               " (max_record_bytes)"])
    got = {reason: (raw, data) for raw, data, reason, _ in dead["event"]}
    assert got["not valid JSON"] in {(m, m.encode()) for m, r in MALFORMED if r == "not valid JSON"} | {
        ("\ufffd\ufffd" + broken[2:].decode(), broken)}
    assert ("\ufffd\ufffd" + broken[2:].decode(), broken, "not valid JSON", "part-00000.json") in dead["event"]
    huge = next(v for k, v in got.items() if k.startswith("record is"))
    assert huge == (HUGE[:1024] + "... [truncated]", HUGE.encode())
    # The standard tools read them back: valid text in raw, the exact bytes in raw_bytes.
    import pandas as pd
    import pyarrow.parquet as pq

    frame = pd.read_parquet(tmp_path / "event" / "out" / "_deadletter")
    table = pq.read_table(tmp_path / "event" / "out" / "_deadletter")
    assert len(frame) == table.num_rows == len(MALFORMED) + 3
    assert broken in set(frame["raw_bytes"]) and late in set(table.column("raw_bytes").to_pylist())
    assert late.decode("utf-8", "replace") in set(frame["raw"])


def test_a_checkpoint_of_a_query_that_read_its_input_twice_goes_on_reading_it_twice(spark, tmp_path, capsys,
                                                                                     monkeypatch):
    """Jobs before 2026-11-28 read the dead letters beside the pipeline (a second scan of the
    source), and Spark refuses a query that scans its source another number of times than its
    checkpoint's. Such a checkpoint (two sources in its offset log) goes on with two scans; a new
    one has one. The sessions are the reference's, every malformed record a dead letter."""
    from dataclasses import replace

    events = generate_events(120, users=4, seed=19)
    bad = [line for line, _ in MALFORMED]
    _write_files(tmp_path / "in", [[e.to_json() for e in events[:60]] + bad[:5]])
    out, ck, metrics = tmp_path / "out", tmp_path / "ck", tmp_path / "m.jsonl"
    sessionize = JOB_PIPELINES["sessionize"]
    assert sessionize.refusals is not None
    with monkeypatch.context() as m:  # the job as it was: the pipeline does not take the malformed records
        m.setitem(JOB_PIPELINES, "sessionize", replace(sessionize, refusals=replace(sessionize.refusals,
                                                                                     malformed=None)))
        code, _, err = _run(capsys, *_session_args(tmp_path / "in", out, ck, metrics))
        assert code == 0, err
    assert source_scans(ck) == {2}
    _write_files(tmp_path / "in2", [[e.to_json() for e in events[60:]] + bad[5:]])
    for f in (tmp_path / "in2").iterdir():
        f.rename(tmp_path / "in" / f"part-1{f.name}")
    code, _, err = _run(capsys, *_session_args(tmp_path / "in", out, ck, metrics))
    assert code == 0, err
    assert source_scans(ck) == {2}
    lines = _metrics(metrics)
    assert _sessions(spark, out) == reference_sessions(events, GAP, watermark=_utc(lines[-1]["watermark"]))
    assert Counter((r.raw, r.reason) for r in _dead(spark, out / "_deadletter")) == Counter(MALFORMED)

    fresh = tmp_path / "fresh"
    code, _, err = _run(capsys, *_session_args(tmp_path / "in", fresh / "out", fresh / "ck", fresh / "m.jsonl"))
    assert code == 0, err
    assert source_scans(fresh / "ck") == {1}
    assert _sessions(spark, fresh / "out") == _sessions(spark, out)


def _update_lines(pipeline: str, events: list[Event]) -> tuple[list[bytes], list[bytes]]:
    """The good records of an update-mode pipeline made of ``events``, and malformed ones of every kind
    (broken JSON and bytes, not an object, a missing or null key, a wrong type, a huge record)."""
    key = {"running-count": "word", "first-last-activity": "user", "visited-pages": "user_id"}[pipeline]
    row = {"running-count": lambda e: {"word": e.user_id},
           "first-last-activity": lambda e: {"user": e.user_id, "timestamp": iso_ms(e.event_time),
                                             "activity": e.data},
           "visited-pages": lambda e: {"user_id": e.user_id, "page": e.data}}[pipeline]
    good = [json.dumps(row(e)).encode() for e in events]
    sample = row(events[0])
    bad = [b'{"' + key.encode() + b'": "user-000", ', b"[1, 2, 3]", b"{}", json.dumps({**sample, key: None}).encode(),
           json.dumps({k: v for k, v in sample.items() if k != key}).encode(), b'\xff\xfe{"' + key.encode() + b'": oops',
           json.dumps({**sample, "x": "y" * 1_100_000}).encode()]
    if pipeline == "first-last-activity":
        bad.append(json.dumps({**sample, "timestamp": "yesterday"}).encode())
        bad.append(json.dumps({**sample, "timestamp": "0000-01-01T00:00:00Z"}).encode())  # out of Python's range
    return good, bad


@pytest.mark.parametrize("pipeline", ["running-count", "first-last-activity", "visited-pages"])
def test_update_mode_jobs_refuse_malformed_records_in_their_one_read_of_the_input(spark, tmp_path, capsys,
                                                                                 monkeypatch, pipeline):
    """The update-mode pipelines refuse the malformed records themselves, as event-time sessionize
    does: a new job's query reads each input file once. A checkpoint of a job that read the dead
    letters beside the pipeline (two scans) goes on so. Both give the same output rows and the same
    dead letters, byte for byte, each malformed record once; a key whose records in a batch are all
    malformed (the first record's key, broken into every kind) gets no row of output for them."""
    from dataclasses import replace

    events = generate_events(60, users=4, seed=23)
    good, bad = _update_lines(pipeline, events)
    chunks = [good[:30] + bad[:4], good[30:] + bad[4:]]
    for i, chunk in enumerate(chunks):
        _write_files(tmp_path / f"in{i}", [[]])  # the directories; each file written below, bytes as they are
        (tmp_path / f"in{i}" / "part-00000.json").write_bytes(b"".join(line + b"\n" for line in chunk))

    def job(ck: Path, out: Path, src: Path) -> set[int]:
        code, _, err = _run(capsys, pipeline, "--source", f"files:{src}", "--format", "json", "--sink",
                            f"parquet:{out}", "--checkpoint", str(ck), "--once", "--option", "maxFilesPerTrigger=1",
                            "--trigger", "200 milliseconds")
        assert code == 0, err
        return source_scans(ck)

    both = tmp_path / "both"
    both.mkdir()
    for i in range(2):
        os.link(tmp_path / f"in{i}" / "part-00000.json", both / f"part-{i:05d}.json")
        os.utime(both / f"part-{i:05d}.json", (time.time() - 10 + i, time.time() - 10 + i))
    # the job as it was: the pipeline does not take the malformed records, the query reads them beside it
    twice, once = tmp_path / "twice", tmp_path / "once"
    declared = JOB_PIPELINES[pipeline]
    assert declared.refusals is not None
    with monkeypatch.context() as m:
        m.setitem(JOB_PIPELINES, pipeline, replace(declared, refusals=replace(declared.refusals, malformed=None)))
        assert job(twice / "ck", twice / "out", tmp_path / "in0") == {2}
    os.link(tmp_path / "in1" / "part-00000.json", tmp_path / "in0" / "part-00001.json")
    assert job(twice / "ck", twice / "out", tmp_path / "in0") == {2}  # this sparkstate, on that checkpoint
    assert job(once / "ck", once / "out", both) == {1}

    def rows(out: Path) -> Counter:
        return Counter(tuple(tuple(v) if isinstance(v, list) else v for v in r)
                       for r in spark.read.parquet(str(out)).collect())

    def letters(out: Path) -> Counter:
        return Counter((r.raw, bytes(r.raw_bytes), r.reason) for r in _dead(spark, out / "_deadletter"))

    assert rows(once / "out") == rows(twice / "out")
    assert sum(rows(once / "out").values()) > 0 and all(None not in r for r in rows(once / "out"))
    assert letters(once / "out") == letters(twice / "out")
    assert Counter(data for _, data, _ in letters(once / "out").elements()) == Counter(bad)
    assert all(reason for (_, _, reason) in letters(once / "out"))
    if pipeline == "running-count":  # every good word counted, none of the malformed ones
        final: dict = {}
        for r in sorted(spark.read.parquet(str(once / "out")).collect(), key=lambda r: r["count"]):
            final[r["word"]] = r["count"]
        assert final == Counter(e.user_id for e in events)


class _GeneratedCode(StreamingQueryListener):
    """The generated code of each micro-batch of a running query, with the batch's time (ms)."""

    def __init__(self, spark) -> None:
        self.session = spark  # (PySpark 3.5's listener has a read-only ``spark``)
        self.batches: list[tuple[int, str]] = []

    def onQueryStarted(self, event) -> None:
        pass

    def onQueryProgress(self, event) -> None:
        query = self.session.streams.get(str(event.progress.id))
        if query is None:  # ended before this report arrived
            return
        execution = query._jsq.streamingQuery().lastExecution()  # the newest batch's plan, with its time
        stages = execution.debug().codegenToSeq()
        code = "\n".join(stages.apply(i)._2() for i in range(stages.size()))
        self.batches.append((execution.offsetSeqMetadata().batchTimestampMs(), code))

    def onQueryIdle(self, event) -> None:
        pass

    def onQueryTerminated(self, event) -> None:
        pass


def test_dead_letters_keep_the_batch_time_out_of_the_generated_code(spark, tmp_path, capsys):
    """Both kinds of dead letter carry their batch's time (``received_at``). Spark writes a
    literal into the generated code as a number, and compiles a stage again when its code
    changes: with the batch's time in it, every batch (5-40 ms a stage, on the driver and again
    in a task). The job's stages do not hold it, and the dead letters still have it."""
    events = generate_events(200, users=5, seed=3)
    chunks = []
    for i in range(4):  # each file: good events, a malformed record, and (after the first) a late event
        lines = [e.to_json() for e in events[i * 50:(i + 1) * 50]] + [MALFORMED[i][0]]
        if i:
            old = events[i * 50 - 30]
            lines.append(Event(old.user_id, old.event_time - timedelta(hours=1), f"/late-{i}").to_json())
        chunks.append(lines)
    _write_files(tmp_path / "in", chunks)
    out, ck, metrics = tmp_path / "out", tmp_path / "ck", tmp_path / "m.jsonl"
    listener = _GeneratedCode(spark)
    spark.streams.addListener(listener)
    try:
        code, _, err = _run(capsys, *_session_args(tmp_path / "in", out, ck, metrics))
    finally:
        spark.streams.removeListener(listener)
    assert code == 0, err

    assert listener.batches, "no micro-batch's plan was seen while the query ran"
    for ms, generated in listener.batches:
        assert "GeneratedIteratorForCodegenStage" in generated
        assert f"{ms * 1000}L" not in generated  # the batch's time in microseconds, as a literal
    lines = _metrics(metrics)
    assert sorted((m["dead_letters"], m["late"]) for m in lines if m["dead_letters"]) == [(1, 0)] + [(2, 1)] * 3
    dead = _dead(spark, out / "_deadletter")
    assert len(dead) == 7 and sum(r.reason.startswith("late: ") for r in dead) == 3
    batch = _batch_of_file(ck)
    assert all(r.received_at.astimezone(timezone.utc) == _batch_time(ck, batch[Path(r.source).name]) for r in dead)


# --- 2. late events -----------------------------------------------------------------------------

def test_late_events_are_counted_and_routed_not_dropped(spark, tmp_path, capsys):
    events = generate_events(180, users=6, seed=42)
    last = max(e.event_time for e in events[:120])  # the watermark when the 3rd file is read (0 s delay)
    tie = Event("user-000", last, "/tie")  # at the watermark: late, as Spark counts it (event time <= watermark)
    late = [tie, Event("user-001", last - timedelta(milliseconds=1), "/late-by-1ms"),
            Event("user-002", last - timedelta(hours=1), "/late-by-1h"),
            Event("user-005", events[0].event_time, "/as-old-as-the-first-event", True)]
    after = Event("user-003", last + timedelta(seconds=10), "/after")
    chunks = [[e.to_json() for e in events[i:i + 60]] for i in (0, 60)]
    chunks.append([e.to_json() for e in late] + [after.to_json()]
                  + [e.to_json() for e in events[120:]])
    paths = _write_files(tmp_path / "in", chunks)
    out, ck, metrics = tmp_path / "out", tmp_path / "ck", tmp_path / "m.jsonl"
    code, _, err = _run(capsys, *_session_args(tmp_path / "in", out, ck, metrics))
    assert code == 0, err

    lines = _metrics(metrics)
    batch = _batch_of_file(ck)[paths[2].name]
    watermark = lines[batch]["watermark"]
    assert lines[batch]["batch_id"] == batch and _utc(watermark) == last
    dead = _dead(spark, out / "_deadletter")
    assert sorted((r.raw, r.reason) for r in dead) == sorted(
        (e.to_json(), f"late: event_time {iso_ms(e.event_time)} is {'at' if e is tie else 'older than'} the watermark"
                      f" {watermark}") for e in late)
    assert all(r.source.startswith("file:") and r.source.endswith(str(paths[2])) for r in dead)  # where it came from
    # Counted per batch; Spark itself dropped nothing.
    assert [m["late"] for m in lines] == [len(late) if m["batch_id"] == batch else 0 for m in lines]
    assert sum(m["dead_letters"] for m in lines) == len(late)
    assert all(m["rows_dropped_by_watermark"] == 0 for m in lines)
    # The sessions are exactly those of the events that were not late (a late event reopens nothing).
    accepted = events + [after]
    written = _sessions(spark, out)
    assert written == reference_sessions(accepted, GAP, watermark=_utc(lines[-1]["watermark"]))
    in_sessions = sum(s.event_count for s in written)
    records = len(accepted) + len(late)
    assert in_sessions + _open_events(accepted, written) + len(dead) == records == sum(m["rows_in"] for m in lines)

    # The same files through a plain sessionize query (late="drop"): Spark drops late rows by the
    # previous batch's watermark, silently; only its progress metric shows them.
    plain = (ss.pipelines.sessionize(
        spark.readStream.schema("user_id string, event_time timestamp, data string, is_last boolean")
        .option("maxFilesPerTrigger", 1).json(str(tmp_path / "in")), gap=GAP, watermark="0 seconds")
        .writeStream.format("noop").option("checkpointLocation", str(tmp_path / "ck_plain")).start())
    try:
        plain.processAllAvailable()
        # (PySpark 3.5 gives the reports as dicts)
        reports = [p if isinstance(p, dict) else json.loads(p.json) for p in plain.recentProgress]
        dropped = sum(o["numRowsDroppedByWatermark"] for p in reports for o in p["stateOperators"])
    finally:
        plain.stop()
    previous = _utc(lines[batch - 1]["watermark"])
    assert dropped == sum(e.event_time <= previous for e in late) >= 1
    _report("late", records=records, late_injected=len(late), dead_lettered=len(dead),
            late_counted_in_metrics=sum(m["late"] for m in lines), spark_dropped=0,
            spark_dropped_without_routing=dropped, in_sessions=in_sessions, lost=0)


# --- 3. clock skew -------------------------------------------------------------------------------

def test_a_producer_clock_far_ahead_and_the_max_future_skew_guard(spark, tmp_path, capsys):
    events = generate_events(150, users=5, seed=7)
    ahead = Event("user-skew", datetime.now(timezone.utc).replace(microsecond=0) + timedelta(days=365), "/from-2027")
    chunks = [[e.to_json() for e in events[:100]] + [ahead.to_json()], [e.to_json() for e in events[100:]]]
    paths = _write_files(tmp_path / "in", chunks)

    # Without a guard: the watermark jumps a year ahead. Every open session of the other users
    # closes (by timeout) and all their later events are late: counted dead letters, none lost.
    out, ck, metrics = tmp_path / "out", tmp_path / "ck", tmp_path / "m.jsonl"
    code, _, err = _run(capsys, *_session_args(tmp_path / "in", out, ck, metrics))
    assert code == 0, err
    lines = _metrics(metrics)
    second = _batch_of_file(ck)[paths[1].name]
    assert _utc(lines[second]["watermark"]) == ahead.event_time
    dead = _dead(spark, out / "_deadletter")
    assert sorted(r.raw for r in dead) == sorted(e.to_json() for e in events[100:])
    assert {r.reason.split(" is older than the watermark ")[1] for r in dead} == {iso_ms(ahead.event_time)}
    written = _sessions(spark, out)
    assert written == [s for s in reference_sessions(events[:100], GAP) if s.user_id != "user-skew"]
    assert all(m["rows_dropped_by_watermark"] == 0 for m in lines)
    unguarded = {"records": len(events) + 1, "dead_lettered_late": len(dead),
                 "sessions_closed_early": sum(s not in reference_sessions(events, GAP) for s in written),
                 "watermark_after": lines[-1]["watermark"],
                 "lost": len(events) + 1 - sum(s.event_count for s in written) - len(dead) - 1}
    assert unguarded["lost"] == 0  # the year-ahead event is the one left open, in state

    # With --max-future-skew: the far-future event is a dead letter; nothing else changes.
    out2, ck2, metrics2 = tmp_path / "out2", tmp_path / "ck2", tmp_path / "m2.jsonl"
    code, _, err = _run(capsys, *_session_args(tmp_path / "in", out2, ck2, metrics2, "--max-future-skew", "1 hour"))
    assert code == 0, err
    lines = _metrics(metrics2)
    dead = _dead(spark, out2 / "_deadletter")
    assert [r.raw for r in dead] == [ahead.to_json()]
    assert re.fullmatch(rf"future: event_time {re.escape(iso_ms(ahead.event_time))} is more than 1 hour ahead of"
                        r" the processing time 20\d\d-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", dead[0].reason), dead[0].reason
    final = _utc(lines[-1]["watermark"])
    assert final == max(e.event_time for e in events)
    written = _sessions(spark, out2)
    assert written == reference_sessions(events, GAP, watermark=final)
    assert sum(m["dead_letters"] for m in lines) == 1 and sum(m["late"] for m in lines) == 0
    in_sessions = sum(s.event_count for s in written)
    assert in_sessions + _open_events(events, written) + 1 == len(events) + 1 == sum(m["rows_in"] for m in lines)
    _report("clock_skew", unguarded=unguarded, guarded={
        "records": len(events) + 1, "dead_lettered_future": 1, "watermark_after": lines[-1]["watermark"],
        "sessions_equal_reference": True, "lost": 0})


# --- 4. a state function that raises -------------------------------------------------------------

def count_v1(word, rows, state):
    n = sum(1 for _ in rows)
    if word == "poison":
        raise ValueError(f"cannot count {word!r}")
    total = (state.getOption or 0) + n
    state.update(total)
    return (word, total)


def count_v2(word, rows, state):  # the fix
    total = (state.getOption or 0) + sum(1 for _ in rows)
    state.update(total)
    return (word, total)


def _counting(func) -> JobPipeline:
    def build(events, cfg, spark):
        return ss.map_groups_with_state(events.select("word"), key="word", func=func, state_type=int,
                                        output_type="word string, count long", checkpoint=cfg.checkpoint,
                                        engine=cfg.engine or DEFAULT_ENGINE)
    return JobPipeline("running-count", "word string", "update", build, "counts emitted")


WORDS = [["spark", "state", "spark"], ["state", "poison", "spark", "poison"], ["state"]]


def test_a_failing_function_stops_with_one_line_and_a_fixed_restart_loses_nothing(spark, tmp_path, capsys,
                                                                                  monkeypatch):
    _write_files(tmp_path / "in", [[json.dumps({"word": w}) for w in ws] for ws in WORDS])
    out, ck = tmp_path / "out", tmp_path / "ck"
    args = ["running-count", "--source", f"files:{tmp_path / 'in'}", "--sink", f"json:{out}", "--checkpoint",
            str(ck), "--option", "maxFilesPerTrigger=1", "--once", "--metrics", str(tmp_path / "m.jsonl"),
            "--trigger", "200 milliseconds"]

    monkeypatch.setitem(JOB_PIPELINES, "running-count", _counting(count_v1))
    code, _, err = _run(capsys, *args)
    assert code == 1
    message = err.strip()
    assert message == ("sparkstate: error: the query stopped with an error: UserFunctionError: the state function"
                       " 'count_v1' raised ValueError: cannot count 'poison' (key 'poison'). Fix the function and"
                       " restart the query on the same checkpoint: the failed batch is processed again.")
    assert sorted(p.name for p in out.glob("batch_id=*")) == ["batch_id=0"]  # batch 1 failed, nothing of it written

    # (The CLI prints run_pipeline's JobFailedError as it is.) A query of your own: Spark's exception
    # is dozens of lines of tracebacks and plan; explain() condenses it to the same sentence.
    lib = tmp_path / "lib"
    _write_files(lib / "in", [[json.dumps({"word": "poison"})]])
    query = start_sink(_counting(count_v1).build(spark.readStream.schema("word string").json(str(lib / "in")),
                                                 JobConfig("running-count", source="files:x"), spark),
                       f"json:{lib / 'out'}", checkpoint=lib / "ck", output_mode="update")
    with pytest.raises(Exception) as raw:
        query.awaitTermination(120)
    assert len(str(raw.value).splitlines()) > 30 and str(raw.value).count("Traceback (most recent call last)") >= 2
    assert explain(raw.value) == ("UserFunctionError: the state function 'count_v1' raised ValueError: cannot count"
                                  " 'poison' (key 'poison'). Fix the function and restart the query on the same"
                                  " checkpoint: the failed batch is processed again.")

    # The fix, on the same checkpoint: the failed batch runs again, then the rest; nothing lost or doubled.
    monkeypatch.setitem(JOB_PIPELINES, "running-count", _counting(count_v2))
    code, _, err = _run(capsys, *args)
    assert code == 0, err
    rows = spark.read.json(str(out)).collect()
    assert sorted(p.name for p in out.glob("batch_id=*")) == ["batch_id=0", "batch_id=1", "batch_id=2"]
    final: dict[str, int] = {}
    for r in sorted(rows, key=lambda r: r.batch_id):
        assert r["count"] == final.get(r.word, 0) + sum(w == r.word for w in WORDS[r.batch_id])
        final[r.word] = r["count"]
    assert final == dict(Counter(w for ws in WORDS for w in ws))
    _report("user_function", records=sum(map(len, WORDS)), failed_runs=2, restarts=1,
            counted=sum(final.values()), lost=sum(map(len, WORDS)) - sum(final.values()), duplicated=0,
            error_lines=len(message.splitlines()))


# --- 5. someone else's checkpoint ----------------------------------------------------------------

def _counting_text(events, cfg, spark):  # running-count with its state changed from a number to text
    def count(word, rows, state):
        state.update(str(int(state.getOption or 0) + sum(1 for _ in rows)))
        return (word, int(state.get))
    return ss.map_groups_with_state(events.select("word"), key="word", func=count, state_type=str,
                                    output_type="word string, count long", checkpoint=cfg.checkpoint,
                                    engine=cfg.engine or DEFAULT_ENGINE)


def test_a_checkpoint_of_another_pipeline_or_state_that_no_longer_fits_is_refused_before_any_write(
        spark, tmp_path, capsys, monkeypatch):
    _write_files(tmp_path / "in", [[json.dumps({"word": w}) for w in ("a", "b", "a")]])
    ck, counts = tmp_path / "ck", tmp_path / "counts"
    code, _, err = _run(capsys, "running-count", "--source", f"files:{tmp_path / 'in'}", "--sink", f"json:{counts}",
                        "--checkpoint", str(ck), "--once")
    assert code == 0, err
    before, counts_before = _tree(ck), _tree(counts)
    assert json.loads((ck / "_sparkstate_job.json").read_text()) == {"pipeline": "running-count"}

    # Another pipeline on this checkpoint.
    sessions = tmp_path / "sessions"
    code, _, err = _run(capsys, "sessionize", "--source", f"files:{tmp_path / 'in'}", "--sink", f"parquet:{sessions}",
                        "--checkpoint", str(ck), "--once")
    assert code == 2
    assert err.strip() == (f"sparkstate: error: run: the checkpoint {ck} belongs to a running-count job, and this job"
                           " runs sessionize: its state and source offsets are not this pipeline's. Nothing was"
                           " written. Use a new --checkpoint for sessionize (or run running-count on this one).")
    assert _tree(ck) == before and not sessions.exists()

    # The same pipeline, but its state type changed incompatibly (a number became text).
    monkeypatch.setitem(JOB_PIPELINES, "running-count",
                        JobPipeline("running-count", "word string", "update", _counting_text, "counts emitted"))
    code, _, err = _run(capsys, "running-count", "--source", f"files:{tmp_path / 'in'}", "--sink", f"json:{counts}",
                        "--checkpoint", str(ck), "--once")
    assert code == 2
    assert err.startswith(f"sparkstate: error: the state in checkpoint {ck} does not fit this query's state type")
    assert "value: type changed (bigint -> string)" in err and "Traceback" not in err
    assert _tree(ck) == before and _tree(counts) == counts_before

    # A sessionize checkpoint in event time, restarted in processing time (the marker alone decides).
    other = tmp_path / "ck_event"
    other.mkdir()
    (other / "_sparkstate_job.json").write_text('{"pipeline": "sessionize", "time_mode": "event"}\n')
    code, _, err = _run(capsys, "sessionize", "--source", f"files:{tmp_path / 'in'}", "--sink", f"parquet:{sessions}",
                        "--checkpoint", str(other), "--time-mode", "processing", "--once")
    assert code == 2 and "holds event-time sessionize state, and this job runs in processing time" in err
    assert not sessions.exists() and [p.name for p in other.iterdir()] == ["_sparkstate_job.json"]
    with pytest.raises(StateSchemaError, match="belongs to a running-count job"):
        run_pipeline(spark, JobConfig("sessionize", source=f"files:{tmp_path / 'in'}", sink=f"parquet:{sessions}",
                                      checkpoint=str(ck), once=True))
    assert _tree(ck) == before and not sessions.exists()
    _report("foreign_checkpoint", refusals=4, files_changed=0)


# --- 6. security basics ----------------------------------------------------------------------------

def _listening(pid: int | None = None) -> list[tuple[str, int]]:
    """(address, port) of the listening TCP sockets of process ``pid`` (all processes: None)."""
    inodes = None
    if pid is not None:
        inodes = set()
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    found = []
    for table, size in (("/proc/net/tcp", 4), ("/proc/net/tcp6", 16)):
        for line in Path(table).read_text().splitlines()[1:]:
            cols = line.split()
            if cols[3] != "0A" or (inodes is not None and cols[9] not in inodes):  # 0A: LISTEN
                continue
            hex_addr, hex_port = cols[1].split(":")
            raw = bytes.fromhex(hex_addr)
            words = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
            family = socket.AF_INET if size == 4 else socket.AF_INET6
            found.append((socket.inet_ntop(family, words), int(hex_port, 16)))
    return found


def _loopback(addr: str) -> bool:
    return addr.startswith("127.") or addr in ("::1", "::ffff:127.0.0.1") or addr.startswith("::ffff:127.")


def test_sockets_listen_on_localhost_by_default(spark, tmp_path):
    from sparkstate.synthetic import StreamConfig, serve_events
    from sparkstate.io.sources import parse_source

    assert parse_source("socket:9999").host == "127.0.0.1"  # a socket source connects to localhost
    with serve_events(StreamConfig(users=1, events=3, rate=0), hold=False) as server:
        assert [a for a, p in _listening() if p == server.port] == ["127.0.0.1"]

    # `sparkstate generate --socket`: the port it serves on is bound to the loopback interface only.
    proc = subprocess.Popen([str(SCRIPT), "generate", "--socket", "0", "--events", "10", "--users", "1"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp_path,
                            env={**os.environ, "COLUMNS": "400"})
    try:
        line = proc.stdout.readline()
        port = int(re.search(r" on 127\.0\.0\.1:(\d+);", line).group(1))
        assert {a for a, p in _listening(proc.pid) if p == port} == {"127.0.0.1"}, line
    finally:
        proc.terminate()
        proc.wait(timeout=30)

    # Spark in local mode (ss.spark_session): its driver and block manager ports too.
    jvm_pid = spark._jvm.java.lang.ProcessHandle.current().pid()
    ports = _listening(jvm_pid)
    assert ports and all(_loopback(a) for a, _ in ports), ports


def test_postgres_password_from_a_file_is_shown_nowhere(spark, tmp_path, postgres_server, capsys):
    password = postgres_server.password
    events = generate_events(40, users=3, seed=9)
    _write_files(tmp_path / "in", [[e.to_json() for e in events] + ["{broken"]])
    secret = tmp_path / "pg.secret"
    secret.write_text(password + "\n")
    secret.chmod(0o600)
    table = "secure_sessions"
    postgres_server.execute(f"DROP TABLE IF EXISTS {table}")
    postgres_server.execute(f"DROP TABLE IF EXISTS {table}_dead")
    ck, metrics, log = tmp_path / "ck", tmp_path / "m.jsonl", tmp_path / "spark.log"
    url = postgres_server.url_without_password
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PG", "SPARKSTATE_"))}
    env.update(SPARKSTATE_PG_PASSWORD_FILE=str(secret), COLUMNS="400",  # the password comes from this file only
               SPARKSTATE_SINK=f"postgres:{url}/{table}", SPARKSTATE_DEADLETTER=f"postgres:{url}/{table}_dead")
    # A real `sparkstate run` of its own: Spark's JVM and Python workers write into --spark-log.
    done = subprocess.run(
        [str(SCRIPT), "run", "sessionize", "--source", f"files:{tmp_path / 'in'}", "--format", "json",
         "--checkpoint", str(ck), "--gap", GAP, "--watermark", "0 seconds", "--once", "--metrics", str(metrics),
         "--spark-log", str(log), "--trigger", "200 milliseconds", "--no-progress"],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    # The password was used: the rows are in PostgreSQL.
    assert postgres_server.query(f"SELECT count(*) FROM {table}")[0][0] > 0
    assert postgres_server.query(f"SELECT reason FROM {table}_dead") == [("not valid JSON",)]
    places = {"stdout": done.stdout, "stderr": done.stderr, "spark log": log.read_text(errors="replace"),
              "metrics": metrics.read_text()}
    places.update({f"checkpoint {p.relative_to(ck)}": p.read_bytes().decode("utf-8", "replace")
                   for p in ck.rglob("*") if p.is_file()})
    assert "Python worker" in places["spark log"]  # Spark's and its workers' output went there
    assert [where for where, text in places.items() if password in text] == []
    assert f"Output: postgres:{url}/{table}" in done.stdout

    # (The password from libpq's PGPASSWORD: tests/reliability/test_driver_crash.py runs the CLI so, and
    # tests/io/test_postgres.py checks the writer.)
    # Errors: a wrong password, and one with unencoded : / @ (an unreadable URL): no piece of either is shown.
    wrong = "Wr0ng-" + password[::-1]
    host = url.split("@", 1)[1]
    for given, why in ((quote(wrong, safe=""), "password authentication failed"), (wrong, "unreadable URL")):
        code, out, err = _run(capsys, "sessionize", "--source", f"files:{tmp_path / 'in'}", "--sink",
                              f"postgres:postgresql://{postgres_server.user}:{given}@{host}/{table}_x",
                              "--deadletter", f"json:{tmp_path / 'dead_x'}", "--checkpoint", str(tmp_path / "ck_x"),
                              "--once")
        assert code == 2 and why in err and "***@" in err, err
        shown = out + err
        assert not [wrong[i:i + 6] for i in range(len(wrong) - 5) if wrong[i:i + 6] in shown], err
        assert password not in shown and given not in shown
    _report("security", places_searched=len(places), password_found_in=0, error_cases=2, sockets_checked=3)
