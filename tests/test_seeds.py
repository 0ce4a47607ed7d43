"""The seed articles' scenarios, each run on real local Spark with exact expected outputs."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timezone

import pytest

import sparkstate as ss
from sparkstate.engines import default_engine
from tests.streams import LandingDir, StreamRun, failure


def ts(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc).isoformat()


def by_key(rows, key="key", val="text"):
    out = defaultdict(list)
    for r in rows:
        out[r[key]].append(r[val])
    return dict(out)


#: the engines the initial-state seeds run on: this minor's default and the inband engine
INITIAL_ENGINES = list(dict.fromkeys([default_engine(), "inband"]))


# --- seed 002: visited pages per user, with initial state (mapWithState + StateSpec.initialState) ---

@dataclass
class UserVisit:
    user_id: str
    visited_pages: list[str] = field(default_factory=list)


def track_visits(user_id, visit, state):
    pages = state.get().visited_pages if state.exists() else []
    pages = pages + [visit.page]
    state.update(UserVisit(user_id, pages))
    return (user_id, ", ".join(pages))


def test_seed_002_visited_pages_with_initial_state(spark, tmp_path):
    initial = spark.createDataFrame(
        [("a", ["page1", "page2", "page3"]), ("b", ["page4"]), ("c", [])],
        "user_id string, visited_pages array<string>",
    )
    land = LandingDir(tmp_path / "in")
    land.add([{"user_id": "a", "page": "page4"}])
    visits = land.stream(spark, "user_id string, page string")
    spec = ss.StateSpec.function(track_visits).initial_state(initial)
    out = ss.map_with_state(visits, key="user_id", value=None, spec=spec, state_type=UserVisit,
                            output_type="user_id string, pages string")
    with StreamRun(spark, out, tmp_path / "ck", landing=land) as run:
        for user, page in [("b", "page5"), ("b", "page6"), ("a", "page7")]:
            run.wait_input()
            land.add([{"user_id": user, "page": page}])
        run.wait_input()
        got = by_key(run.rows, "user_id", "pages")
    assert got == {
        "a": ["page1, page2, page3, page4", "page1, page2, page3, page4, page7"],
        "b": ["page4, page5", "page4, page5, page6"],
    }


# --- seed 003: event-time expiry of the key that stops receiving data ---

def names_with_expiry(key, rows, state):
    if state.hasTimedOut:
        return (key, f"Expired state for {key}")
    text = (state.getOption or "") + " " + " ".join(r.name for r in rows)
    state.update(text)
    state.setTimeoutTimestamp(state.getCurrentWatermarkMs() + 4000)
    return (key, text)


def test_seed_003_event_time_expiry_of_idle_key(spark, tmp_path):
    land = LandingDir(tmp_path / "in")
    start = 1000
    land.add([{"id": i, "event_time": ts(start), "name": f"test{i}0"} for i in (1, 2, 3)])
    events = land.stream(spark, "id long, event_time timestamp, name string").withWatermark("event_time", "0 seconds")
    out = ss.map_groups_with_state(events, key="id", func=names_with_expiry, state_type=str,
                                   output_type="key long, text string",
                                   timeout=ss.GroupStateTimeout.EventTimeTimeout)
    with StreamRun(spark, out, tmp_path / "ck", landing=land) as run:
        for step in range(1, 6):
            run.wait_input()
            t = start + 2000 * step
            land.add([{"id": 1, "event_time": ts(t), "name": f"test1{step}"},
                      {"id": 3, "event_time": ts(t), "name": f"test3{step}"}])
        run.wait_input()
        run.wait_for(lambda rows: any(r.text.startswith("Expired") for r in rows))
        got = by_key(run.rows)
    # Key 2 got no data after the first batch: its timeout (watermark 0 + 4 s) passed once the
    # watermark reached 5 s, and it expired exactly once. Keys 1 and 3 kept receiving data.
    assert got[2] == [" test20", "Expired state for 2"]
    assert got[1] == [" test10", " test10 test11", " test10 test11 test12", " test10 test11 test12 test13",
                      " test10 test11 test12 test13 test14", " test10 test11 test12 test13 test14 test15"]
    assert got[3] == [t.replace("test1", "test3") for t in got[1]]


def timeout_behind_watermark(key, rows, state):
    rows = list(rows)
    state.update(len(rows))
    # The mistake of seed 003: an expiry shorter than the watermark delay, computed from the
    # event time instead of from the watermark.
    oldest_ms = int(min(r.event_time for r in rows).timestamp() * 1000)
    state.setTimeoutTimestamp(oldest_ms - 120_000)
    return None


def test_seed_003_timeout_earlier_than_watermark_fails_with_both_values(spark, tmp_path):
    land = LandingDir(tmp_path / "in")
    land.add([{"id": 1, "event_time": ts(600_000), "name": "x"}])  # watermark 0: 480 s is fine
    events = land.stream(spark, "id long, event_time timestamp, name string").withWatermark("event_time", "3 minutes")
    out = ss.map_groups_with_state(events, key="id", func=timeout_behind_watermark, state_type=int,
                                   output_type="key long", timeout=ss.GroupStateTimeout.EventTimeTimeout)
    with StreamRun(spark, out, tmp_path / "ck", landing=land) as run:
        run.wait_input()
        # The watermark is now 600 s - 3 min = 420 s; 500 s - 2 min = 380 s is behind it.
        land.add([{"id": 2, "event_time": ts(500_000), "name": "y"}])
        message = failure(run)
    assert "Timeout timestamp (380000" in message
    assert "cannot be earlier than the current watermark (420000" in message
    assert "(key 2)" in message


# --- seed 001: running word count with mapWithState, initial state and a timeout ---

def track_count(word, one, state):
    if state.isTimingOut():
        return (word, state.get(), True)
    total = (state.getOption() or 0) + one
    state.update(total)
    return (word, total, False)


@pytest.mark.parametrize("engine", INITIAL_ENGINES)
def test_seed_001_word_count_map_with_state_initial_state_and_timeout(spark, tmp_path, engine):
    initial = spark.createDataFrame([("dummy", 100), ("source", 32)], "word string, value long")
    land = LandingDir(tmp_path / "in")
    land.add([{"word": w, "count": 1} for w in ["spark", "dummy", "spark"]])
    # The second batch's file is there from the start (one file per batch), so it follows the first
    # batch at once: no key times out in between, unless the first batch itself takes 10 s.
    land.add([{"word": "source", "count": 1}])
    words = land.stream(spark, "word string, count long")
    spec = ss.StateSpec.function(track_count).initial_state(initial).num_partitions(2).timeout("10 seconds")
    out = ss.map_with_state(words, key="word", value="count", spec=spec, state_type=int, engine=engine,
                            output_type="word string, count long, timed_out boolean")
    with StreamRun(spark, out, tmp_path / "ck", landing=land) as run:
        run.wait_input()
        first = [tuple(r) for r in run.rows]
        # No more data: after 10 s of processing time every key times out once.
        run.wait_for(lambda rows: sum(r.timed_out for r in rows) == 3, timeout=60)
        land.add([{"word": "spark", "count": 1}])
        run.wait_input()
        rows = [tuple(r) for r in run.rows]
    # (On a machine slow enough that the first batch takes over 10 s, keys of the first batch
    # already time out in the second: the timeouts are checked once each, wherever they fall.)
    counted = [r for r in first if not r[2]]
    assert sorted(counted) == [("dummy", 101, False), ("source", 33, False), ("spark", 1, False), ("spark", 2, False)]
    assert [r for r in counted if r[0] == "spark"] == [("spark", 1, False), ("spark", 2, False)]
    assert sorted(r for r in rows if r[2]) == [("dummy", 101, True), ("source", 33, True), ("spark", 2, True)]
    assert rows[-1] == ("spark", 1, False)  # the state was removed on timeout: counting starts again


def test_seed_001_initial_state_keys_without_data_time_out_too(spark, tmp_path):
    initial = spark.createDataFrame([("dummy", 100)], "word string, value long")
    land = LandingDir(tmp_path / "in")
    land.add([{"word": "spark", "count": 1}])
    spec = ss.StateSpec.function(track_count).initial_state(initial).timeout("2 seconds")
    out = ss.map_with_state(land.stream(spark, "word string, count long"), key="word", value="count",
                            spec=spec, state_type=int, output_type="word string, count long, timed_out boolean")
    with StreamRun(spark, out, tmp_path / "ck", landing=land) as run:
        run.wait_for(lambda rows: sum(r.timed_out for r in rows) == 2, timeout=60)
        rows = sorted(tuple(r) for r in run.rows)
    assert rows == [("dummy", 100, True), ("spark", 1, False), ("spark", 1, True)]


# --- seed 001: first and last activity per user with updateStateByKey ---

@dataclass
class UserSession:
    user: str
    activity: str
    start: datetime
    end: datetime


def update_user_session(new_events, session):
    for ev in sorted(new_events, key=lambda e: e.timestamp):
        if session is None:
            session = UserSession(ev.user, ev.activity, ev.timestamp, ev.timestamp)
        elif session.activity == ev.activity:
            session.end = max(session.end, ev.timestamp)
            session.start = min(session.start, ev.timestamp)
        elif ev.timestamp > session.end:
            session = UserSession(ev.user, ev.activity, ev.timestamp, ev.timestamp)
    return session


def test_seed_001_first_last_activity_update_state_by_key(spark, tmp_path):
    land = LandingDir(tmp_path / "in")
    t = lambda s: ts(s * 1000)
    land.add([{"user": "u1", "timestamp": t(10), "activity": "browse"},
              {"user": "u1", "timestamp": t(5), "activity": "browse"}])
    events = land.stream(spark, "user string, timestamp timestamp, activity string")
    out = ss.update_state_by_key(events, key="user", value=None, func=update_user_session, state_type=UserSession)
    assert out.columns == ["user", "activity", "start", "end"]
    # the batched engine (the default from PySpark 4.0) visits every key without timers
    every_key_without_timers = ss.engines.default_engine() == "batched"
    with StreamRun(spark, out, tmp_path / "ck", landing=land) as run:
        run.wait_input()
        land.add([{"user": "u2", "timestamp": t(7), "activity": "search"}])
        run.wait_input()
        land.add([{"user": "u1", "timestamp": t(20), "activity": "buy"},
                  {"user": "u1", "timestamp": t(1), "activity": "search"}])  # older, other activity: ignored
        run.wait_input()
        if not every_key_without_timers:
            run.wait_batches(2)
        batches = [sorted((r.user, r.activity, int(r.start.timestamp()), int(r.end.timestamp())) for r in b)
                   for b in run.batches]
    browse, search, buy = ("u1", "browse", 5, 10), ("u2", "search", 7, 7), ("u1", "buy", 20, 20)
    if every_key_without_timers:
        # Every key with state is called (and output) in every micro-batch with input, with or without
        # new events of its own (u2 in the third); micro-batches without input call nothing.
        assert batches == [[browse], [browse, search], [buy, search]]
        return
    # The engines that revisit every key by a 1 ms processing-time timeout (inband, PySpark 3.5's
    # default): every batch, the no-data batches between the data batches too, repeats every key.
    assert batches[0] == [browse]
    with_u2 = next(i for i, b in enumerate(batches) if search in b)
    with_buy = next(i for i, b in enumerate(batches) if buy in b)
    assert all(b == [browse] for b in batches[:with_u2])
    assert all(b == [browse, search] for b in batches[with_u2:with_buy])
    assert all(b == [buy, search] for b in batches[with_buy:])
    assert len(batches) - with_buy >= 3


# --- seed 000: user sessions closed by isLast, or by a 1-minute processing-time timeout ---

@dataclass
class UserEvent:
    id: int
    data: str
    isLast: bool


@dataclass
class UserSessionEvents:
    userEvents: list[UserEvent]


def update_session_events(user_id, events, state):
    if state.hasTimedOut:
        finished = state.get
        state.remove()
        return (user_id, [e.data for e in finished.userEvents], "timeout")
    session = state.getOption
    session = UserSessionEvents((session.userEvents if session else []) + list(events))
    if any(e.isLast for e in session.userEvents):
        state.remove()
        return (user_id, [e.data for e in session.userEvents], "last_event")
    state.update(session)
    state.setTimeoutDuration("1 minute")
    return None


@pytest.mark.slow
def test_seed_000_sessions_closed_by_is_last_and_by_one_minute_timeout(spark, tmp_path):
    land = LandingDir(tmp_path / "in")
    # A first batch of its own (user 9, closed at once) warms the query up: on a loaded machine a
    # query's first batch can take over a minute, longer than the seed's timeout.
    land.add([{"id": 9, "data": "w", "isLast": True}])
    events = land.stream(spark, "id long, data string, isLast boolean")
    out = ss.map_groups_with_state(events, key="id", func=update_session_events, state_type=UserSessionEvents,
                                   value_type=UserEvent, output_type="id long, events array<string>, closed_by string",
                                   timeout=ss.GroupStateTimeout.ProcessingTimeTimeout)
    with StreamRun(spark, out, tmp_path / "ck", landing=land, trigger="1 second") as run:
        run.wait_input()
        # The seed's two files land together: their batches run back to back, so user 2's second
        # event comes well within its minute (a machine too slow for that is detected below).
        land.add([{"id": 1, "data": "a", "isLast": False}, {"id": 2, "data": "x", "isLast": False},
                  {"id": 1, "data": "b", "isLast": True}])
        land.add([{"id": 2, "data": "y", "isLast": False}])
        run.wait_input()
        t0, t1 = run.data_batch_times_ms()[1:3]
        if t1 - t0 >= 59_000:
            pytest.fail(f"the seed's two data batches started {t1 - t0} ms apart: the machine is too slow for its"
                        " 1-minute timeout to stay pending between them")
        assert [tuple(r) for r in run.rows] == [(9, ["w"], "last_event"), (1, ["a", "b"], "last_event")]
        # No new data from here on: the query keeps running batches and user 2 times out.
        run.wait_for(lambda rows: len(rows) == 3, timeout=120)
        waited = datetime.now().timestamp() - t1 / 1000  # since the batch that set the timeout
        run.wait_batches(3)
        rows = [tuple(r) for r in run.rows]
    assert rows[1:] == [(1, ["a", "b"], "last_event"), (2, ["x", "y"], "timeout")]
    assert waited >= 60  # not before its minute of inactivity
