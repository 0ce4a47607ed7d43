"""sessionize against real local Spark, compared with the generator's reference sessions."""

from __future__ import annotations

import threading
from collections import Counter
from datetime import datetime, timedelta, timezone

import pytest

from sparkstate.errors import ConfigError
from sparkstate.synthetic import EVENT_SCHEMA, Session, generate_events, read_events, reference_sessions, write_events
from sparkstate.pipelines import sessionize

from ..streams import LandingDir, StreamRun

GAP = "1 minute"


class _Batches:
    """A foreachBatch sink keeping each batch's rows under its batch id."""

    def __init__(self) -> None:
        self.by_batch: dict[int, list] = {}
        self.lock = threading.Lock()

    def __call__(self, df, batch_id: int) -> None:
        rows = df.collect()
        with self.lock:
            self.by_batch[batch_id] = rows

    def sessions(self) -> list[Session]:
        return sorted(
            (Session.from_row(r) for rows in self.by_batch.values() for r in rows),
            key=lambda s: (s.user_id, s.session_start),
        )


def _watermark(progress) -> datetime:
    text = progress.eventTime["watermark"]
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=timezone.utc)


def test_event_time_stream_equals_the_reference(spark, tmp_path):
    files = write_events(generate_events(240, users=6, seed=5), tmp_path / "in", files=4)
    events = read_events(files)  # what Spark reads, as the reference sees it
    stream = spark.readStream.schema(EVENT_SCHEMA).option("maxFilesPerTrigger", 1).json(str(tmp_path / "in"))
    sink = _Batches()
    query = (
        sessionize(stream, gap=GAP, watermark="10 seconds")
        .writeStream.outputMode("append")
        .foreachBatch(sink)
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .start()
    )
    try:
        query.processAllAvailable()  # event time: idle once the last watermark advance has fired
        last = query.lastProgress
    finally:
        query.stop()

    final_watermark = _watermark(last)
    expected = reference_sessions(events, GAP, watermark=final_watermark)
    got = sink.sessions()
    assert got == expected  # exactly: same sessions, same events in order, same closed_by, no duplicates

    # The sessions still open are those the reference has not finished by that watermark,
    # and they are all that is left in the state store.
    still_open = set(reference_sessions(events, GAP)) - set(expected)
    import sparkstate as ss

    stored = ss.state.read(spark, tmp_path / "checkpoint").collect()
    assert still_open and len(stored) == len(still_open)
    assert {r.user_id for r in stored} == {s.user_id for s in still_open}

    # The input exercised what it should: sessions closed by is_last and by timeout, several
    # sessions of one user emitted by one micro-batch (batch i reads file i) ...
    assert {"last_event", "timeout"} <= {s.closed_by for s in got}
    file_users = [{e.user_id for e in read_events([f])} for f in files]
    per_batch_user = Counter(
        (batch, r["user_id"]) for batch, rows in sink.by_batch.items() for r in rows if batch < len(files)
    )
    assert max(per_batch_user.values()) >= 2
    # ... and sessions emitted by a timer, in a batch in which their user had no events: sessions
    # closed by a gap, and (once the watermark passed their flag) sessions closed by is_last.
    by_timer = [
        r for batch, rows in sink.by_batch.items() for r in rows
        if batch >= len(files) or r["user_id"] not in file_users[batch]
    ]
    assert {"timeout", "last_event"} <= {r["closed_by"] for r in by_timer}


def test_static_input_is_complete_so_every_session_is_emitted(spark):
    events = generate_events(150, users=4, seed=11)
    df = spark.createDataFrame(
        [(e.user_id, e.event_time, e.data, e.is_last) for e in events], EVENT_SCHEMA
    )
    got = sorted((Session.from_row(r) for r in sessionize(df, gap=GAP).collect()),
                 key=lambda s: (s.user_id, s.session_start))
    assert got == reference_sessions(events, GAP)
    assert max(Counter(s.user_id for s in got).values()) > 5


def test_events_of_a_batch_are_ordered_by_event_time(spark):
    t0 = datetime(2024, 1, 1, 12, 0)
    rows = [  # arrival order is not event-time order
        ("u", t0 + timedelta(seconds=50), "c", True),
        ("u", t0, "a", False),
        ("u", t0 + timedelta(minutes=4), "e", False),  # exactly the gap after d: same session
        ("u", t0 + timedelta(minutes=3), "d", False),
        ("u", t0 + timedelta(seconds=20), "b", False),
        ("u", t0 + timedelta(minutes=5, milliseconds=1), "f", False),  # 1 ms more than the gap after e
    ]
    df = spark.createDataFrame(rows, EVENT_SCHEMA)
    got = [(r.events, r.closed_by, r.event_count) for r in sessionize(df).orderBy("session_start").collect()]
    assert got == [(["a", "b", "c"], "last_event", 3), (["d", "e"], "timeout", 2), (["f"], "timeout", 1)]


def test_processing_time_mode_closes_on_is_last_and_on_idle_keys(spark, tmp_path):
    landing = LandingDir(tmp_path / "in")
    t0 = datetime(2024, 1, 1, tzinfo=timezone.utc)
    stream = landing.stream(spark, EVENT_SCHEMA)
    out = sessionize(stream, gap="2 seconds", time_mode="processing")
    # A trigger interval longer than a no-data batch leaves gaps in which the run can stop cleanly.
    with StreamRun(spark, out, tmp_path / "checkpoint", landing=landing, output_mode="append", trigger="1 second") as run:
        landing.add([
            {"user_id": "a", "event_time": t0, "data": "x", "is_last": False},
            {"user_id": "a", "event_time": t0, "data": "y", "is_last": True},
            {"user_id": "a", "event_time": t0, "data": "z", "is_last": False},
            {"user_id": "b", "event_time": t0, "data": "p", "is_last": False},
        ])
        run.wait_for(lambda rows: len(rows) >= 3, timeout=60)
    got = sorted((r.user_id, r.events, r.closed_by) for r in run.rows)
    assert got == [("a", ["x", "y"], "last_event"), ("a", ["z"], "timeout"), ("b", ["p"], "timeout")]
    assert {Session.from_row(r).session_start for r in run.rows} == {t0}  # times are the events' own


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"key": "user"}, "key column 'user' is not in the input; its columns are user_id, event_time, data, is_last"),
        ({"time_mode": "wall"}, "time_mode must be 'event' or 'processing', got 'wall'"),
        ({"gap": "soon"}, "sessionize: gap: expected a duration such as '1 minute'"),
        ({"gap": 0}, "sessionize: gap: expected a positive duration"),
        ({"watermark": "-5 seconds"}, "sessionize: watermark"),
        ({"timestamp": "data"}, "timestamp column 'data' must be of type timestamp, but it is string"),
        ({"last_flag": "data"}, "last_flag column 'data' must be of type boolean, but it is string"),
        ({"timestamp": None}, "time_mode='event' needs a timestamp column"),
        ({"data": "page"}, "data column 'page' is not in the input"),
    ],
)
def test_bad_arguments_fail_when_defined(spark, kwargs, message):
    df = spark.createDataFrame([], EVENT_SCHEMA)
    with pytest.raises(ConfigError) as err:
        sessionize(df, **kwargs)
    assert message in str(err.value)


def test_an_existing_watermark_is_kept(spark, tmp_path):
    (tmp_path / "in").mkdir()
    stream = spark.readStream.schema(EVENT_SCHEMA).json(str(tmp_path / "in")).withWatermark("event_time", "1 hour")
    plan = sessionize(stream)._jdf.queryExecution().analyzed().toString()
    assert plan.count("EventTimeWatermark") == 1 and "1 hours" in plan
