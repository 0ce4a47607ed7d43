"""Event-time sessionize does not depend on arrival order or micro-batch boundaries.

Every test feeds events in an order in which no event is at or behind the watermark of the
micro-batch that reads it (Spark's watermark: the latest event time of the earlier batches minus
the delay), and expects exactly the reference sessions of the sorted events
(:func:`sparkstate.synthetic.reference_sessions`), final at the last watermark. Many orders go through
the group function on the no-Spark harness (the same ``run_call`` both engines use); a few go
through real Spark streams on each engine, one of them restarted from its checkpoint mid-stream.
"""

from __future__ import annotations

import random
from dataclasses import replace
from datetime import datetime, timedelta, timezone

import pytest

from sparkstate.engines import DEFAULT_ENGINE, InBandEngine, default_engine
from sparkstate.errors import ConfigError
from sparkstate.group_state import GroupStateTimeout
from sparkstate.synthetic import EVENT_SCHEMA, Event, Session, generate_events, reference_sessions
from sparkstate.pipelines import sessionize
from sparkstate.pipelines.sessionizer import OpenSession, Sessionizer
from sparkstate.testing import GroupStateHarness

import json
import os
import time
from pathlib import Path


class Landing:
    """A directory a file stream reads one file per micro-batch, in the order the files are added:
    modification times go up a second per file (Spark picks the oldest first; files written in
    the same instant would be read in any order, which would break the test's watermark bound)."""

    _base = int(time.time()) - 10_000

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        self.n = 0

    def add(self, rows: list[dict]) -> None:
        name = f"part-{self.n:05d}.json"
        tmp = self.path / f".{name}.tmp"
        tmp.write_text("".join(json.dumps(r, default=lambda o: o.isoformat()) + "\n" for r in rows))
        os.utime(tmp, (self._base + self.n, self._base + self.n))
        tmp.rename(self.path / name)
        self.n += 1

    def stream(self, spark, schema: str):
        return spark.readStream.schema(schema).option("maxFilesPerTrigger", 1).json(str(self.path))

GAP_MS = 60_000
T0 = datetime(2024, 1, 1, tzinfo=timezone.utc)
# the engines of this PySpark minor: 3.5 has only the inband engine (the version matrix runs it there);
# event-time sessionize runs its columnar logic (SessionLogic) on batched and inband, its per-key function on tws
ENGINES = ["tws", "batched", "inband"] if default_engine() == DEFAULT_ENGINE else [default_engine()]


def _ms(t: datetime) -> int:
    return round((t - datetime(1970, 1, 1, tzinfo=timezone.utc)).total_seconds() * 1000)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def disordered(events: list[Event], delay_ms: int, rng: random.Random, batches: int) -> list[list[Event]]:
    """``events`` as micro-batches in an arrival order that keeps every event ahead of the
    watermark of its batch: each event arrives up to ``delay_ms - 1`` after its own time (so
    everything read before it is at most that much later), the batch cuts are random, and the
    order inside a batch is shuffled."""
    arrival = sorted(events, key=lambda e: _ms(e.event_time) + rng.randrange(delay_ms))
    cuts = sorted(rng.sample(range(1, len(arrival)), min(batches, len(arrival)) - 1)) if len(arrival) > 1 else []
    out = [arrival[a:b] for a, b in zip([0, *cuts], [*cuts, len(arrival)])]
    for batch in out:
        rng.shuffle(batch)
    return out


def watermarks(batches: list[list[Event]], delay_ms: int) -> list[int]:
    """Spark's watermark for each batch, then the final one (the no-data batch after the last)."""
    out, seen, wm = [], None, 0
    for batch in [*batches, []]:
        if seen is not None:
            wm = max(wm, seen - delay_ms)
        out.append(wm)
        for e in batch:
            seen = _ms(e.event_time) if seen is None else max(seen, _ms(e.event_time))
    return out


def harness(emit_on_last: bool = False) -> GroupStateHarness:
    func = Sessionizer(GAP_MS, "event", streaming=True, has_timestamp=True, emit_on_last=emit_on_last)
    return GroupStateHarness(func, OpenSession, GroupStateTimeout.EventTimeTimeout, flat=True)


def run_harness(batches: list[list[Event]], delay_ms: int, h: GroupStateHarness | None = None
                ) -> tuple[list[Session], int, GroupStateHarness]:
    """Run ``batches`` as micro-batches, then the final no-data batch; the sessions and final watermark."""
    h = h or harness()
    wms = watermarks(batches, delay_ms)
    rows = []
    for batch, wm in zip(batches, wms):
        by_key: dict[str, list] = {}
        for e in batch:
            assert _ms(e.event_time) > wm, "the test's order put an event behind the watermark"
            by_key.setdefault(e.user_id, []).append((e.user_id, e.event_time, e.data, e.is_last))
        rows += h.run_batch(by_key, watermark=wm)
    rows += h.run_batch({}, watermark=wms[-1])
    return [_session(r) for r in rows], wms[-1], h


def _session(r: tuple) -> Session:
    return Session(r[0], r[1], r[2], r[3], tuple(r[4]), r[5])


def ordered(sessions) -> list[Session]:
    return sorted(sessions, key=lambda s: (s.user_id, s.session_start, s.session_end, s.events))


def open_in_state(h: GroupStateHarness) -> list[tuple[str, int, int, tuple]]:
    out = []
    for k in h.keys():
        st = h.peek_state(k)
        if st is not None:
            for times, data, _ in st.sessions():
                out.append((k, times[0], times[-1], tuple(data)))
    return sorted(out)


def as_open(sessions) -> list[tuple[str, int, int, tuple]]:
    return sorted((s.user_id, _ms(s.session_start), _ms(s.session_end), s.events) for s in sessions)


# --- many orders on the harness -----------------------------------------------------------------

def crafted() -> list[Event]:
    """One user with every case by name, beside generated users."""
    return [
        # bridge-merge: b falls between a and c, which are more than gap apart
        Event("crafted", at(0), "a"), Event("crafted", at(50), "b"), Event("crafted", at(100), "c"),
        # a flag, then an earlier event of the same session, then a flagged one inside it
        Event("crafted", at(300), "d"), Event("crafted", at(320), "e"), Event("crafted", at(340), "f", True),
        Event("crafted", at(330), "g", True),
        # equal times: an unflagged event before a flagged one, then by data
        Event("crafted", at(500), "z", True), Event("crafted", at(500), "y"), Event("crafted", at(500), "x", True),
        # one long session (55 s steps over 20 minutes)
        *[Event("crafted", at(700 + 55 * i), f"long{i:02d}") for i in range(22)],
    ]


@pytest.mark.parametrize("delay_s", [10, 45, 200])
def test_every_order_and_batch_split_within_the_watermark_gives_the_reference(delay_s):
    events = generate_events(90, users=4, seed=3, last_share=0.4) + crafted()
    delay_ms = delay_s * 1000
    expected_all = reference_sessions(events, "1 minute")
    for seed in range(120):
        rng = random.Random(seed)
        batches = disordered(events, delay_ms, rng, batches=rng.randint(1, 25))
        got, final_wm, h = run_harness(batches, delay_ms)
        expected = ordered(reference_sessions(events, "1 minute", watermark=final_wm))
        assert ordered(got) == expected, f"order seed {seed}"
        assert len(set(got)) == len(got)  # each session once
        # the rest is exactly what is still open, in the state
        assert open_in_state(h) == as_open(set(expected_all) - set(expected)), f"order seed {seed}"


def test_the_orders_exercise_what_they_should():
    """Disorder the size of the watermark delay makes the merges happen (not only ordered input)."""
    events = crafted()
    rng = random.Random(1)
    seen_bridge = False
    for _ in range(50):
        batches = disordered(events, 200_000, rng, batches=20)
        first = [e.data for b in batches for e in b]
        if first.index("b") > max(first.index("a"), first.index("c")):
            seen_bridge = True
    assert seen_bridge


def _final_times(batches: list[list[Event]], wms: list[int], emit_on_last: bool = False) -> list[tuple[int, int]]:
    """Run ``batches`` (then the no-data batch) with ``event_time_column``: per output row, its
    column's time (epoch ms) and the watermark of the batch before the one that emitted it."""
    func = Sessionizer(GAP_MS, "event", streaming=True, has_timestamp=True, emit_on_last=emit_on_last,
                        time_column=True)
    h = GroupStateHarness(func, OpenSession, GroupStateTimeout.EventTimeTimeout, flat=True)
    out, previous = [], 0
    for batch, wm in zip([*batches, []], wms):
        by_key: dict[str, list] = {}
        for e in batch:
            by_key.setdefault(e.user_id, []).append((e.user_id, e.event_time, e.data, e.is_last))
        for row in h.run_batch(by_key, watermark=wm):
            assert _ms(row[6]) == _ms(row[2]) + GAP_MS + 1  # session_end + gap + 1 ms
            out.append((_ms(row[6]), previous))
        previous = wm
    return out


@pytest.mark.parametrize("emit_on_last", [False, True])
def test_the_event_time_column_is_after_the_previous_watermark(emit_on_last):
    """What Spark checks of the operator's event-time column (else it fails the query with
    EMITTING_ROWS_OLDER_THAN_WATERMARK_NOT_ALLOWED): every row a micro-batch emits is after the
    watermark of the batch before; in every order within the watermark."""
    events = generate_events(90, users=4, seed=5, last_share=0.4) + crafted()
    for seed in range(80):
        rng = random.Random(seed)
        delay_ms = rng.choice([10_000, 45_000, 200_000])
        batches = disordered(events, delay_ms, rng, batches=rng.randint(1, 25))
        rows = _final_times(batches, watermarks(batches, delay_ms), emit_on_last)
        assert len(rows) > 20 and all(t > previous for t, previous in rows), f"order seed {seed}"


def test_the_event_time_column_needs_its_one_millisecond():
    """A session open at the previous watermark W with end + gap == W (an event at W + 0.5 ms
    could still join it) is final in the next batch: its column, end + gap + 1 ms, is W + 1 ms."""
    batches = [[Event("u", at(0), "a")], [Event("v", at(75), "b")], [Event("v", at(76), "c")]]
    wms = watermarks(batches, 15_000)
    assert wms[2] == _ms(at(60))  # = u's end + gap: not final yet
    assert _final_times(batches, wms)[0] == (_ms(at(60)) + 1, _ms(at(60)))


def test_a_refused_row_has_no_event_time_column_value():
    """late='emit': a refused row comes out with the column null (no session, nothing to window)."""
    func = Sessionizer(GAP_MS, "event", streaming=True, has_timestamp=True, emit=True, time_column=True)
    h = GroupStateHarness(func, OpenSession, GroupStateTimeout.EventTimeTimeout, flat=True)
    h.run_batch({"u": [("u", at(10), "a", False, None, None)]}, watermark=0)
    out = h.run_batch({"u": [("u", at(5), "late", False, None, None)]}, watermark=_ms(at(100)))
    assert [(r[6], r[7][0].split(":")[0]) for r in out if r[7] is not None] == [(None, "late")]
    assert [(r[6], r[7]) for r in out if r[7] is None] == [(at(10 + 60) + timedelta(milliseconds=1), None)]


def test_an_ordered_stream_with_emit_on_last_emits_flags_at_once():
    events = generate_events(120, users=3, seed=8, last_share=0.5)
    batches = [events[i:i + 10] for i in range(0, len(events), 10)]
    got, final_wm, _ = run_harness(batches, 10_000, harness(emit_on_last=True))
    assert ordered(got) == ordered(reference_sessions(events, "1 minute", watermark=final_wm, emit_on_last=True))
    # each flagged session comes out in the batch that reads its flag; by default, once the watermark passes it
    for eager, same_batch in ((True, True), (False, False)):
        h = harness(emit_on_last=eager)
        flagged_in_own_batch = []
        for batch, wm in zip(batches, watermarks(batches, 10_000)):
            by_key: dict[str, list] = {}
            for e in batch:
                by_key.setdefault(e.user_id, []).append((e.user_id, e.event_time, e.data, e.is_last))
            flags = {(e.user_id, e.event_time) for e in batch if e.is_last}
            flagged_in_own_batch += [(r[0], r[2]) in flags for r in h.run_batch(by_key, watermark=wm)
                                     if r[5] == "last_event"]
        assert flagged_in_own_batch and all(x == same_batch for x in flagged_in_own_batch)


# --- the cases by name ---------------------------------------------------------------------------

def feed(h: GroupStateHarness, wm: int, *events: Event) -> list[Session]:
    by_key: dict[str, list] = {}
    for e in events:
        by_key.setdefault(e.user_id, []).append((e.user_id, e.event_time, e.data, e.is_last))
    return [_session(r) for r in h.run_batch(by_key, watermark=wm)]


def brief(sessions) -> list[tuple]:
    return [(s.events, s.closed_by) for s in sessions]


def test_bridge_merge():
    h = harness()
    assert feed(h, 0, Event("u", at(0), "a"), Event("u", at(100), "c")) == []
    assert [tuple(d) for _, d, _ in h.peek_state("u").sessions()] == [("a",), ("c",)]
    assert h.peek_state("u").sizes == [1, 1]
    assert feed(h, _ms(at(10)), Event("u", at(50), "b")) == []
    assert h.peek_state("u").sizes == [3] and h.peek_state("u").events == ["a", "b", "c"]
    assert brief(feed(h, _ms(at(160.001)))) == [(("a", "b", "c"), "timeout")]
    assert h.peek_state("u") is None


def test_backward_extension():
    h = harness()
    feed(h, 0, Event("u", at(100), "b"))
    feed(h, _ms(at(45)), Event("u", at(50), "a"))  # ahead of the watermark, 50 s before b
    st = h.peek_state("u")
    assert (st.start_ms, st.end_ms, st.events, st.times, st.sizes, st.closed) == (
        _ms(at(50)), _ms(at(100)), ["a", "b"], [_ms(at(50)), _ms(at(100))], [2], [False])
    assert h.peek_timeout_ms("u") == _ms(at(160))
    assert feed(h, _ms(at(160))) == []  # the timeout fires strictly after end + gap
    assert brief(feed(h, _ms(at(160)) + 1)) == [(("a", "b"), "timeout")]


def test_last_flag_then_an_earlier_event():
    h = harness()
    assert feed(h, 0, Event("u", at(0), "a"), Event("u", at(30), "c", True)) == []  # waits for the watermark
    assert h.peek_state("u").closed == [True] and h.peek_timeout_ms("u") == _ms(at(30)) - 1
    feed(h, _ms(at(5)), Event("u", at(20), "b"))  # joins the closed session before its flag
    feed(h, _ms(at(6)), Event("u", at(10), "x", True))  # a flag inside it splits it
    assert brief(feed(h, _ms(at(10)) - 1)) == []
    assert brief(feed(h, _ms(at(10)))) == [(("a", "x"), "last_event")]  # the watermark reached x, not c
    assert brief(feed(h, _ms(at(30)))) == [(("b", "c"), "last_event")]
    assert h.peek_state("u") is None


def test_a_session_spanning_many_batches_is_emitted_once():
    h = harness()
    out = []
    for i in range(30):  # one event every 50 s, each batch's watermark 40 s behind
        out += feed(h, max(0, _ms(at(50 * i - 40))), Event("u", at(50 * i), f"e{i}"))
    assert out == []
    out += feed(h, _ms(at(50 * 29 + 60)) + 1)
    assert brief(out) == [(tuple(f"e{i}" for i in range(30)), "timeout")]


def test_equal_times_do_not_depend_on_arrival_order():
    rows = [Event("u", at(0), "p"), Event("u", at(0), "q", True), Event("u", at(0), "n", True)]
    results = set()
    for order in ([0, 1, 2], [2, 1, 0], [1, 0, 2]):
        h = harness()
        feed(h, 0, *[rows[i] for i in order])
        results.add(tuple(brief(feed(h, _ms(at(1))))))
    assert results == {((("p", "n"), "last_event"), (("q",), "last_event"))}
    assert tuple((s.events, s.closed_by) for s in reference_sessions(rows)) == list(results)[0]


def test_an_event_at_the_watermark_is_late():
    func = Sessionizer(GAP_MS, "event", streaming=True, has_timestamp=True, emit=True)
    h = GroupStateHarness(func, OpenSession, GroupStateTimeout.EventTimeTimeout, flat=True)
    wm = _ms(at(100))
    out = h.run_batch({"u": [("u", at(100), "at", False, None), ("u", at(100.001), "after", False, None),
                             ("u", at(99), "before", False, None)]}, watermark=wm)
    reasons = sorted(r[6][0] for r in out)
    assert reasons == ["late: event_time 2024-01-01T00:01:39.000Z is older than the watermark 2024-01-01T00:01:40.000Z",
                       "late: event_time 2024-01-01T00:01:40.000Z is at the watermark 2024-01-01T00:01:40.000Z"]
    assert h.peek_state("u").events == ["after"]


def test_a_state_of_the_previous_layout_reads_back_and_keeps_its_session():
    """An old checkpoint's state (one session: start, end, events; no times) goes on."""
    h = harness()
    h.set_state("u", OpenSession(_ms(at(0)), _ms(at(100)), ["a", "b", "c"]), _ms(at(160)))
    feed(h, _ms(at(90)), Event("u", at(150), "d"))
    assert h.peek_state("u").times == [_ms(at(0)), _ms(at(50)), _ms(at(100)), _ms(at(150))]
    assert brief(feed(h, _ms(at(210)) + 1)) == [(("a", "b", "c", "d"), "timeout")]


# --- real Spark streams, both engines -----------------------------------------------------------

def _rows(batch: list[Event]) -> list[dict]:
    return [{"user_id": e.user_id, "event_time": e.event_time, "data": e.data, "is_last": e.is_last} for e in batch]


def _collect(spark, out, checkpoint, into: list) -> str:
    def sink(df, batch_id):
        into.extend(_session_row(r) for r in df.collect())

    q = out.writeStream.outputMode("append").foreachBatch(sink).option("checkpointLocation", str(checkpoint)).start()
    try:
        q.processAllAvailable()  # event time: idle once the last watermark advance has fired
        return q.lastProgress["eventTime"]["watermark"]
    finally:
        q.stop()


def _session_row(r) -> Session:
    return Session.from_row(r)


@pytest.mark.parametrize("engine", ENGINES)
def test_shuffled_streams_on_spark_equal_the_reference_and_restart_mid_stream(spark, tmp_path, engine):
    delay_ms = 150_000
    events = generate_events(70, users=3, seed=21, last_share=0.4) + crafted()
    batches = disordered(events, delay_ms, random.Random(5), batches=8)
    wms = watermarks(batches, delay_ms)
    assert all(_ms(e.event_time) > wm for b, wm in zip(batches, wms) for e in b)

    landing = Landing(tmp_path / "in")
    got: list[Session] = []
    for b in batches[:4]:
        landing.add(_rows(b))

    def query():
        stream = landing.stream(spark, EVENT_SCHEMA)
        return sessionize(stream, gap="1 minute", watermark=f"{delay_ms} milliseconds", engine=engine,
                          checkpoint=tmp_path / "ck")

    _collect(spark, query(), tmp_path / "ck", got)
    import sparkstate as ss

    assert ss.state.keys(spark, tmp_path / "ck") > 0  # open sessions wait in the checkpoint
    for b in batches[4:]:
        landing.add(_rows(b))
    wm_text = _collect(spark, query(), tmp_path / "ck", got)  # restarted on the same checkpoint
    final_wm = datetime.strptime(wm_text, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=timezone.utc)
    assert _ms(final_wm) == wms[-1]
    expected = reference_sessions(events, "1 minute", watermark=final_wm)
    assert ordered(got) == ordered(expected)
    assert len(got) >= 15 and {"last_event", "timeout"} <= {s.closed_by for s in got}

    # what is left in the state is exactly the still-open sessions
    stored = ss.state.read(spark, tmp_path / "ck").collect()
    still_open = set(reference_sessions(events, "1 minute")) - set(expected)
    got_open = [(r.user_id, times[0], times[-1], tuple(data)) for r in stored
                for times, data, _ in OpenSession(r.start_ms, r.end_ms, r.events, r.times, r.sizes, r.closed).sessions()]
    assert sorted(got_open) == as_open(still_open) and still_open


@pytest.mark.parametrize("engine", ENGINES)
def test_another_shuffled_order_on_spark_equals_the_reference(spark, tmp_path, engine):
    delay_ms = 40_000
    events = generate_events(60, users=4, seed=33, last_share=0.5) + [
        replace(e, user_id="crafted2") for e in crafted()]
    batches = disordered(events, delay_ms, random.Random(11), batches=6)
    landing = Landing(tmp_path / "in")
    for b in batches:
        landing.add(_rows(b))
    got: list[Session] = []
    stream = landing.stream(spark, EVENT_SCHEMA)
    wm_text = _collect(spark, sessionize(stream, gap="1 minute", watermark=f"{delay_ms} milliseconds",
                                         engine=engine), tmp_path / "ck", got)
    final_wm = datetime.strptime(wm_text, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=timezone.utc)
    assert ordered(got) == ordered(reference_sessions(events, "1 minute", watermark=final_wm))


# late="emit" on the default engine with either watermark; on inband too where it is not the default
LATE_EMIT_CASES = [("sessionize", default_engine()), ("user", default_engine())] + (
    [("sessionize", "inband")] if default_engine() != "inband" else [])


@pytest.mark.parametrize(("watermark_by", "engine"), LATE_EMIT_CASES)
def test_a_shuffled_order_with_late_emit_equals_the_reference_and_refuses_the_late(spark, tmp_path, watermark_by,
                                                                                   engine):
    """late='emit' on shuffled input, with sessionize's watermark and with the user's own
    (withWatermark upstream): the sessions are the reference's, and an event behind the watermark
    comes out refused. On Spark 4.0 the operator's input must carry one event-time column only.
    The default engine and inband both run sessionize's columnar logic here."""
    delay_ms = 40_000
    events = generate_events(50, users=3, seed=7, last_share=0.4)
    batches = disordered(events, delay_ms, random.Random(3), batches=5)
    landing = Landing(tmp_path / "in")
    for b in batches:
        landing.add(_rows(b))
    late = Event("late-user", events[0].event_time - timedelta(hours=1), "/late", False)
    stream = landing.stream(spark, EVENT_SCHEMA)
    if watermark_by == "user":
        stream = stream.withWatermark("event_time", f"{delay_ms} milliseconds")
    out = sessionize(stream, gap="1 minute", watermark=f"{delay_ms} milliseconds", late="emit", engine=engine)
    got: list = []
    ck = tmp_path / "ck"

    def sink(df, batch_id):
        got.extend(df.collect())

    q = out.writeStream.outputMode("append").foreachBatch(sink).option("checkpointLocation", str(ck)).start()
    try:
        q.processAllAvailable()
        landing.add(_rows([late]))
        q.processAllAvailable()
        wm_text = q.lastProgress["eventTime"]["watermark"]
    finally:
        q.stop()
    sessions = [_session_row(r) for r in got if r["rejected"] is None]
    refused = [r["rejected"] for r in got if r["rejected"] is not None]
    final_wm = datetime.strptime(wm_text, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=timezone.utc)
    assert ordered(sessions) == ordered(reference_sessions(events, "1 minute", watermark=final_wm))
    assert len(sessions) >= 10
    assert [(r["data"], r["reason"].startswith("late")) for r in refused] == [("/late", True)]


class PerKeyInBand(InBandEngine):
    """The inband engine as released before it ran a plan's bucket logic: the plan's function key
    by key (what wrote the checkpoints of PySpark 3.5 users so far)."""

    def apply(self, df, plan, initial_state):
        return super().apply(df, replace(plan, bucket_logic=None), initial_state)


def test_a_checkpoint_of_the_inband_per_key_path_goes_on_under_its_columnar_logic(spark, tmp_path):
    """Shuffled input, late="emit" (as `sparkstate run` runs it): the first micro-batches through
    the inband engine's per-key path (the released behaviour), the rest, restarted on the same
    checkpoint, through the columnar sessionizer; the sessions are the reference's."""
    delay_ms = 150_000
    events = generate_events(60, users=3, seed=23, last_share=0.4) + crafted()
    batches = disordered(events, delay_ms, random.Random(9), batches=6)
    landing = Landing(tmp_path / "in")
    for b in batches[:3]:
        landing.add(_rows(b))
    ck = tmp_path / "ck"
    got: list[Session] = []

    def query(engine):
        return sessionize(landing.stream(spark, EVENT_SCHEMA), gap="1 minute", watermark=f"{delay_ms} milliseconds",
                          late="emit", engine=engine, checkpoint=ck)

    _collect(spark, query(PerKeyInBand()), ck, got)
    assert len(got) < len(reference_sessions(events, "1 minute"))  # open sessions wait in the checkpoint
    for b in batches[3:]:
        landing.add(_rows(b))
    wm_text = _collect(spark, query("inband"), ck, got)
    final_wm = datetime.strptime(wm_text, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=timezone.utc)
    assert ordered(got) == ordered(reference_sessions(events, "1 minute", watermark=final_wm))
    assert len(got) >= 15 and {"last_event", "timeout"} <= {s.closed_by for s in got}


@pytest.mark.parametrize("engine", ENGINES)
def test_a_checkpoint_of_the_single_session_layout_restarts(spark, tmp_path, engine):
    """A checkpoint whose state has the previous layout (one session: start, end, events) goes on
    under the new sessionize: the added fields read back as their defaults."""
    from dataclasses import dataclass, field

    from pyspark.sql import functions as F

    import sparkstate as ss

    @dataclass
    class OldSession:  # the state sessionize kept before several open sessions per key
        start_ms: int | None = None
        end_ms: int | None = None
        events: list[str] = field(default_factory=list)

    def old(key, rows, state):
        s = state.getOption or OldSession()
        for r in rows:
            t = _ms(r[1].replace(tzinfo=timezone.utc) if r[1].tzinfo is None else r[1])
            s.start_ms = t if s.start_ms is None else min(s.start_ms, t)
            s.end_ms = t if s.end_ms is None else max(s.end_ms, t)
            s.events.append(r[2])
        state.update(s)
        state.setTimeoutTimestamp(s.end_ms + GAP_MS)
        return []

    landing = Landing(tmp_path / "in")
    landing.add(_rows([Event("u", at(0), "a"), Event("u", at(50), "b"), Event("u", at(100), "c")]))
    stream = landing.stream(spark, EVENT_SCHEMA)
    df = stream.withWatermark("event_time", "10 seconds").select(
        F.col("user_id"), F.col("event_time"), F.col("data").cast("string"), F.coalesce(F.col("is_last"), F.lit(False)))
    schema = sessionize(stream)._jdf.schema().json()  # the output type: sessionize's
    from pyspark.sql.types import StructType
    import json

    before = ss.flat_map_groups_with_state(df, "user_id", old, OldSession, StructType.fromJson(json.loads(schema)),
                                           timeout="EventTimeTimeout", output_mode="append", engine=engine)
    assert _collect(spark, before, tmp_path / "ck", []) is not None
    assert [r.events for r in ss.state.read(spark, tmp_path / "ck").collect()] == [["a", "b", "c"]]

    landing.add(_rows([Event("u", at(140), "d"), Event("v", at(400), "x")]))
    got: list[Session] = []
    _collect(spark, sessionize(landing.stream(spark, EVENT_SCHEMA), watermark="10 seconds", engine=engine,
                               checkpoint=tmp_path / "ck"), tmp_path / "ck", got)
    assert [(s.user_id, s.events, s.closed_by) for s in got] == [("u", ("a", "b", "c", "d"), "timeout")]


@pytest.mark.parametrize("second", ["tws", "inband"])
def test_open_sessions_move_through_export_and_initial_state(spark, tmp_path, second):
    """Open sessions exported from one query (batched engine) start another (tws engine, or
    inband: its seeds, read by the columnar sessionizer)."""
    import sparkstate as ss

    delay_ms = 150_000
    events = generate_events(50, users=3, seed=40, last_share=0.4) + crafted()
    batches = disordered(events, delay_ms, random.Random(8), batches=6)
    got: list[Session] = []
    first, then = Landing(tmp_path / "in1"), Landing(tmp_path / "in2")
    for b in batches[:3]:
        first.add(_rows(b))
    for b in batches[3:]:
        then.add(_rows(b))
    wm = f"{delay_ms} milliseconds"
    _collect(spark, sessionize(first.stream(spark, EVENT_SCHEMA), watermark=wm, engine="batched"), tmp_path / "ck1", got)
    assert ss.state.export(spark, tmp_path / "ck1", tmp_path / "state.parquet") > 0
    initial = spark.read.parquet(str(tmp_path / "state.parquet"))
    assert {"times", "sizes", "closed"} <= set(initial.columns)
    wm_text = _collect(spark, sessionize(then.stream(spark, EVENT_SCHEMA), watermark=wm, engine=second,
                                         initial_state=initial), tmp_path / "ck2", got)
    final_wm = datetime.strptime(wm_text, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=timezone.utc)
    assert ordered(got) == ordered(reference_sessions(events, "1 minute", watermark=final_wm))


@pytest.mark.parametrize("engine", ENGINES)
def test_rows_refused_by_a_reason_column_join_nothing_and_leave_the_watermark(spark, tmp_path, engine):
    """``reason=`` (as ``sparkstate run`` passes the parse's reasons): shuffled input, with rows
    already refused among the good ones: one of a user in the middle of a session with its flag
    set (it would split the session), one an hour ahead of everything (it would move the
    watermark and time every session out), one without a key or a time. Each comes out refused
    with its own reason; the sessions are the reference's of the good events, and the watermark
    is the good events' alone."""
    delay_ms = 40_000
    events = generate_events(60, users=3, seed=17, last_share=0.3)
    batches = disordered(events, delay_ms, random.Random(5), batches=5)
    newest = max(events, key=lambda e: e.event_time)
    refused = [
        {"user_id": events[10].user_id, "event_time": events[10].event_time + timedelta(milliseconds=1),
         "data": "/split", "is_last": True, "why": "field is_last: expected boolean, got 'yes'"},
        {"user_id": events[0].user_id, "event_time": newest.event_time + timedelta(hours=1), "data": "/ahead",
         "is_last": False, "why": "missing field data"},
        {"user_id": None, "event_time": None, "data": "{oops", "is_last": None, "why": "not valid JSON"},
    ]
    landing = Landing(tmp_path / "in")
    rng = random.Random(11)
    for i, b in enumerate(batches):
        rows = [{**r, "why": None} for r in _rows(b)] + ([refused[i]] if i < len(refused) else [])
        rng.shuffle(rows)
        landing.add(rows)
    stream = landing.stream(spark, EVENT_SCHEMA + ", why string")
    out = sessionize(stream, gap="1 minute", watermark=f"{delay_ms} milliseconds", late="emit", engine=engine,
                     reason="why")
    got: list = []

    def sink(df, batch_id):
        got.extend(df.collect())

    q = out.writeStream.outputMode("append").foreachBatch(sink).option("checkpointLocation",
                                                                       str(tmp_path / "ck")).start()
    try:
        q.processAllAvailable()
        wm_text = q.lastProgress["eventTime"]["watermark"]
    finally:
        q.stop()
    final_wm = datetime.strptime(wm_text, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=timezone.utc)
    assert final_wm == newest.event_time.replace(microsecond=newest.event_time.microsecond // 1000 * 1000) \
        - timedelta(milliseconds=delay_ms)
    sessions = [_session_row(r) for r in got if r["rejected"] is None]
    assert ordered(sessions) == ordered(reference_sessions(events, "1 minute", watermark=final_wm))
    assert len(sessions) >= 8
    assert sorted((r["rejected"]["data"], r["rejected"]["reason"]) for r in got if r["rejected"] is not None) \
        == sorted((r["data"], r["why"]) for r in refused)


def test_a_reason_column_is_checked_when_defined(spark):
    df = spark.createDataFrame([], EVENT_SCHEMA + ", why string, n int")
    for kwargs, message in [
        ({"reason": "why"}, "reason= applies to time_mode='event' with late='emit'"),
        ({"reason": "why", "late": "emit", "time_mode": "processing"}, "reason= applies to time_mode='event'"),
        ({"reason": "n", "late": "emit"}, "reason column 'n' must be of type string, but it is int"),
        ({"reason": "data", "late": "emit"}, "reason column 'data' is already a column sessionize uses"),
        ({"reason": "why", "late": "emit", "carry": ["why"]}, "reason column 'why' is already a column"),
        ({"reason": "nope", "late": "emit"}, "reason column 'nope' is not in the input"),
    ]:
        with pytest.raises(ConfigError) as err:
            sessionize(df, **kwargs)
        assert message in str(err.value), (kwargs, str(err.value))
