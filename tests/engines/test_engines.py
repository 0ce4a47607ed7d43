"""Both Spark engines on real Spark: parity with the harness, restarts, evolution, TTL, initial state."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import datetime, timezone

import pytest
from pyspark.sql import functions as F

import sparkstate as ss
from sparkstate.engines import DEFAULT_ENGINE, default_engine
from tests.conftest import checkpoint_encoding
from tests.streams import LandingDir, StreamRun

GAP_MS = 1500

# the engines of this PySpark minor: 3.5 has only the inband engine (the version matrix runs it there)
ENGINES = ["tws", "batched"] if default_engine() == DEFAULT_ENGINE else [default_engine()]
#: initial state on those, and on the inband engine on every minor (it stages the initial state itself)
INITIAL_ENGINES = list(dict.fromkeys(ENGINES + ["inband"]))


@pytest.fixture(params=ENGINES)
def engine(request):
    return request.param


@dataclass
class Tally:
    n: int = 0


def tally(key, values, state):
    if state.hasTimedOut:
        return [(key, "timeout", state.get.n)]
    vals = list(values)
    st = state.getOption or Tally()
    st.n += len(vals)
    state.update(st)
    state.setTimeoutTimestamp(max(v.t for v in vals) + GAP_MS)
    return [(key, "data", st.n)]


# Each batch: records (key, event ms). The watermark (delay 0) trails the max event time, so
# batch N runs at the max event time of batches < N, and every batch moves it forward.
SCRIPT = [
    [("a", 1000), ("b", 1000), ("c", 1000)],
    [("a", 3000), ("b", 2000)],
    [("a", 6000)],
    [("b", 6500), ("c", 6500)],
    [("z", 100_000)],
]

EXPECTED = {
    False: [("a", "data", 1), ("b", "data", 1), ("c", "data", 1), ("a", "data", 2), ("b", "data", 2),
            ("c", "timeout", 1), ("a", "data", 3), ("b", "timeout", 2), ("b", "data", 1), ("c", "data", 1),
            ("z", "data", 1), ("a", "timeout", 3), ("b", "timeout", 1), ("c", "timeout", 1)],
    True: [("a", "data", 1), ("b", "data", 1), ("c", "data", 1), ("a", "data", 2), ("b", "data", 2),
           ("c", "timeout", 1), ("a", "data", 3), ("b", "timeout", 2), ("b", "data", 3), ("c", "data", 2),
           ("z", "data", 1), ("a", "timeout", 3), ("b", "timeout", 3), ("c", "timeout", 2)],
}


@dataclass
class Ev:
    key: str
    t: int


def run_on_harness(keep: bool) -> list:
    h = ss.testing.GroupStateHarness(tally, state_type=Tally, timeout=ss.GroupStateTimeout.EventTimeTimeout,
                                     keep_expired_state=keep, flat=True)
    out, wm = [], 0
    for batch in SCRIPT:
        data: dict = {}
        for k, t in batch:
            data.setdefault(k, []).append(Ev(k, t))
        out += h.run_batch(data, watermark=wm)
        wm = max(wm, max(t for _, t in batch))
        out += h.advance_watermark(wm)  # the no-data batch Spark runs when the watermark moves
    return out


def run_on_spark(spark, tmp_path, keep: bool, engine: str) -> list:
    land = LandingDir(tmp_path / "in")
    land.add([{"key": k, "t": t} for k, t in SCRIPT[0]])
    events = (land.stream(spark, "key string, t long")
              .withColumn("event_time", F.timestamp_millis("t"))
              .withWatermark("event_time", "0 seconds"))
    out = ss.flat_map_groups_with_state(events, engine=engine, key="key", func=tally, state_type=Tally,
                                        output_type="key string, kind string, n long",
                                        timeout=ss.GroupStateTimeout.EventTimeTimeout, keep_expired_state=keep)
    with StreamRun(spark, out, tmp_path / "ck", landing=land) as run:
        wm = 0
        for i, batch in enumerate(SCRIPT):
            if i:
                land.add([{"key": k, "t": t} for k, t in batch])
            run.wait_input()
            wm = max(wm, max(t for _, t in batch))
            wait_watermark(run, wm)
        return [tuple(r) for r in run.rows]


def wait_watermark(run: StreamRun, wm_ms: int, timeout: float = 60) -> None:
    """Wait for the no-data batch that runs with watermark ``wm_ms``."""
    want = datetime.fromtimestamp(wm_ms / 1000, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
    deadline = time.time() + timeout
    while True:
        p = run.query.lastProgress
        if p and p.get("eventTime", {}).get("watermark") == want and p["numInputRows"] == 0:
            return
        run._check_alive()
        if time.time() > deadline:
            raise TimeoutError(f"no batch with watermark {want}; last progress {p}")
        time.sleep(0.05)


@pytest.mark.parametrize("keep", [False, True], ids=["expire", "keep_expired"])
@pytest.mark.parametrize("runner", ["harness"] + ENGINES)
def test_harness_and_engines_agree_on_scripted_scenario(spark, tmp_path, runner, keep):
    got = run_on_harness(keep) if runner == "harness" else run_on_spark(spark, tmp_path, keep, runner)
    assert sorted(got) == sorted(EXPECTED[keep])


# --- restarts -----------------------------------------------------------------------------

def count_words(word, rows, state):
    n = (state.getOption or 0) + sum(1 for _ in rows)
    state.update(n)
    return (word, n)


def test_restart_on_same_checkpoint_continues_state_exactly(spark, tmp_path, engine):
    land = LandingDir(tmp_path / "in")
    ck = tmp_path / "ck"

    def query():
        words = land.stream(spark, "word string")
        return ss.map_groups_with_state(words, engine=engine, key="word", func=count_words, state_type=int,
                                        output_type="word string, n long")

    land.add([{"word": w} for w in "a b a".split()])
    with StreamRun(spark, query(), ck, landing=land) as run:
        run.wait_input()
        land.add([{"word": w} for w in "b c".split()])
        run.wait_input()
        first = sorted(tuple(r) for r in run.rows)
    land.add([{"word": w} for w in "a c c".split()])
    with StreamRun(spark, query(), ck, landing=land, already_read=5) as run:
        run.wait_input()
        second = sorted(tuple(r) for r in run.rows)
    assert first == [("a", 2), ("b", 1), ("b", 2), ("c", 1)]
    # Only the new file was read, and counting went on from the stored state.
    assert second == [("a", 3), ("c", 3)]


@dataclass
class ProfileV1:
    visits: int


@dataclass
class ProfileV2:
    visits: int
    label: str = "new"
    pages: list[str] = field(default_factory=list)


def profile_v1(user, rows, state):
    p = state.getOption or ProfileV1(0)
    p.visits += sum(1 for _ in rows)
    state.update(p)
    return (user, p.visits, "v1", 0)


def profile_v2(user, rows, state):
    p = state.getOption or ProfileV2(0)
    rows = list(rows)
    p.visits += len(rows)
    p.pages = p.pages + [r.page for r in rows]
    state.update(p)
    return (user, p.visits, p.label, len(p.pages))


def test_restart_with_a_defaulted_field_added_keeps_the_old_state(spark, tmp_path, engine, state_encoding):
    land = LandingDir(tmp_path / "in")
    ck = tmp_path / "ck"

    def query(func, state_type):
        clicks = land.stream(spark, "user string, page string")
        return ss.map_groups_with_state(clicks, engine=engine, key="user", func=func, state_type=state_type,
                                        output_type="user string, visits long, label string, pages long")

    land.add([{"user": "u1", "page": "p1"}, {"user": "u1", "page": "p2"}, {"user": "u2", "page": "p1"}])
    with StreamRun(spark, query(profile_v1, ProfileV1), ck, landing=land) as run:
        run.wait_input()
        assert sorted(tuple(r) for r in run.rows) == [("u1", 2, "v1", 0), ("u2", 1, "v1", 0)]
    assert checkpoint_encoding(ck) == state_encoding
    land.add([{"user": "u1", "page": "p3"}, {"user": "u2", "page": "p4"}])
    with StreamRun(spark, query(profile_v2, ProfileV2), ck, landing=land, already_read=3) as run:
        run.wait_input()
        rows = sorted(tuple(r) for r in run.rows)
    # Old visits kept; the new fields read their defaults for the old rows.
    assert rows == [("u1", 3, "new", 1), ("u2", 2, "new", 1)]


# --- state TTL, static input, several key columns ----------------------------------------

def test_state_ttl_drops_state_not_updated_for_that_long(spark, tmp_path):
    engine = "tws"
    ttl_ms, margin_ms = 10_000, 1_000
    land = LandingDir(tmp_path / "in")
    land.add([{"word": "a"}, {"word": "b"}])
    out = ss.map_groups_with_state(land.stream(spark, "word string"), engine=engine, key="word", func=count_words,
                                   state_type=int, output_type="word string, n long", state_ttl="10 seconds")
    with StreamRun(spark, out, tmp_path / "ck", landing=land) as run:
        run.wait_input()
        land.add([{"word": "a"}])
        run.wait_input()
        t1, t2 = run.data_batch_times_ms()
        # Wait (on the clock, not a fixed sleep) until both keys' last update is older than the TTL.
        while time.time() * 1000 < t2 + ttl_ms + margin_ms:
            time.sleep(0.1)
        land.add([{"word": "a"}, {"word": "b"}])
        run.wait_input()
        rows = [tuple(r) for r in run.rows]
        t3 = run.data_batch_times_ms()[2]
    assert t3 - t2 > ttl_ms
    assert sorted(rows[:2]) == [("a", 1), ("b", 1)]
    # "a" again: its state is kept when the second batch came within the TTL (on a busy machine it may not).
    if t2 - t1 < ttl_ms - margin_ms:
        assert rows[2] == ("a", 2)
    elif t2 - t1 > ttl_ms + margin_ms:
        assert rows[2] == ("a", 1)
    # More than 10 s without an update: both keys start again.
    assert sorted(rows[3:]) == [("a", 1), ("b", 1)]


def test_static_dataframe_one_pass(spark, engine):
    df = spark.createDataFrame([("u1", 1), ("u2", 5), ("u1", 2)], "user string, n long")

    def total(user, rows, state):
        state.setTimeoutDuration("1 minute")  # allowed, never fires on a static DataFrame
        s = (state.getOption or 0) + sum(r.n for r in rows)
        state.update(s)
        return (user, s)

    out = ss.map_groups_with_state(df, engine=engine, key="user", func=total, state_type=int, output_type="user string, s long",
                                   timeout=ss.GroupStateTimeout.ProcessingTimeTimeout)
    assert sorted(tuple(r) for r in out.collect()) == [("u1", 3), ("u2", 5)]


def test_several_key_columns_reach_func_as_a_tuple(spark, tmp_path, engine):
    land = LandingDir(tmp_path / "in")
    land.add([{"country": "fr", "city": "paris"}, {"country": "fr", "city": "lyon"},
              {"country": "fr", "city": "paris"}])

    def per_city(key, rows, state):
        country, city = key
        n = (state.getOption or 0) + sum(1 for _ in rows)
        state.update(n)
        return (country, city, n)

    out = ss.map_groups_with_state(land.stream(spark, "country string, city string"), engine=engine, key=["country", "city"],
                                   func=per_city, state_type=int, output_type="country string, city string, n long")
    with StreamRun(spark, out, tmp_path / "ck", landing=land) as run:
        run.wait_input()
        rows = sorted(tuple(r) for r in run.rows)
    assert rows == [("fr", "lyon", 1), ("fr", "paris", 2)]


def test_user_function_error_names_key_and_exception(spark, tmp_path, engine):
    from tests.streams import failure

    land = LandingDir(tmp_path / "in")
    land.add([{"word": "ok"}, {"word": "boom"}])

    def fragile(word, rows, state):
        if word == "boom":
            raise KeyError("no such page")
        return (word, 1)

    out = ss.map_groups_with_state(land.stream(spark, "word string"), engine=engine, key="word", func=fragile, state_type=int,
                                   output_type="word string, n long")
    with StreamRun(spark, out, tmp_path / "ck", landing=land) as run:
        message = failure(run)
    assert "the state function 'fragile' raised KeyError: 'no such page' (key 'boom')" in message


# --- initial state with pending timeouts; every accepted output form ----------------------

@dataclass
class Seen:
    user: str
    count: int
    last_page: str | None = None


def seen_with_expiry(user, rows, state):
    if state.hasTimedOut:
        return (user, state.get.count, "expired")
    s = state.getOption or Seen(user, 0)
    rows = list(rows)
    s.count += len(rows)
    s.last_page = rows[-1].page
    state.update(s)
    state.setTimeoutTimestamp(max(r.t for r in rows) + 1000)
    return (user, s.count, s.last_page)


@pytest.mark.parametrize("engine", INITIAL_ENGINES)
def test_initial_state_with_pending_timeouts_for_map_groups_with_state(spark, tmp_path, engine):
    # The layout of an export: key, the state's fields, timeout_ms (null: no timeout pending).
    initial = spark.createDataFrame(
        [("u1", 10, "old", 5_000), ("u2", 20, None, None), ("u3", 30, "x", 50_000)],
        "user string, count int, last_page string, timeout_ms long",
    )
    land = LandingDir(tmp_path / "in")
    land.add([{"user": "u2", "page": "p", "t": 1000}])
    events = (land.stream(spark, "user string, page string, t long")
              .withColumn("event_time", F.timestamp_millis("t")).withWatermark("event_time", "0 seconds"))
    out = ss.map_groups_with_state(events, engine=engine, key="user", func=seen_with_expiry, state_type=Seen,
                                   output_type="user string, count long, what string",
                                   timeout=ss.GroupStateTimeout.EventTimeTimeout, initial_state=initial)
    with StreamRun(spark, out, tmp_path / "ck", landing=land) as run:
        run.wait_input()
        land.add([{"user": "u2", "page": "q", "t": 6_000}])   # the watermark reaches 6 s afterwards
        run.wait_input()
        land.add([{"user": "u9", "page": "r", "t": 7_000}])
        run.wait_input()
        run.wait_for(lambda rows: ("u1", 10, "expired") in [tuple(r) for r in rows])
        rows = sorted(tuple(r) for r in run.rows)
    # u1's restored timeout (5 s) fired once the watermark passed it; u2 continued from 20;
    # u3's timeout (50 s) is not due; u1 had no data and was never called otherwise.
    assert rows == [("u1", 10, "expired"), ("u2", 21, "p"), ("u2", 22, "q"), ("u9", 1, "r")]


@dataclass
class Out:
    user: str
    n: int


def test_outputs_may_be_dataclasses_dicts_tuples_or_rows(spark, engine):
    from pyspark.sql import Row

    df = spark.createDataFrame([("a",), ("b",), ("c",), ("d",)], "user string")
    forms = {"a": lambda: Out("a", 1), "b": lambda: {"user": "b", "n": 2}, "c": lambda: ("c", 3),
             "d": lambda: Row(user="d", n=4)}

    def emit(user, rows, state):
        return forms[user]()

    out = ss.map_groups_with_state(df, engine=engine, key="user", func=emit, state_type=int, output_type=Out)
    assert sorted(tuple(r) for r in out.collect()) == [("a", 1), ("b", 2), ("c", 3), ("d", 4)]


def test_output_that_does_not_match_output_type_names_key_and_field(spark, engine):
    df = spark.createDataFrame([("a",)], "user string")
    out = ss.map_groups_with_state(df, engine=engine, key="user", func=lambda u, rows, s: {"user": u}, state_type=int,
                                   output_type=Out)
    with pytest.raises(Exception, match=r"an output for key 'a' does not match output_type: output: missing field 'n'"):
        out.collect()


def _dup_counter(key, rows, state):
    n = (state.getOption or 0) + sum(1 for _ in rows)
    state.update(n)
    return (key, n)


def test_the_batched_engine_refuses_duplicate_keys_in_the_initial_state_too(spark, tmp_path):
    # The same rule (sparkstate.engines.batched.initial), met where batched builds its leaves: the
    # query's first batch fails, naming the key, instead of keeping one of the two rows.
    land = LandingDir(tmp_path / "in")
    land.add([{"k": "b", "v": "x"}])
    initial = spark.createDataFrame([("a", 1), ("b", 2), ("a", 3)], "k string, value long")
    out = ss.map_groups_with_state(land.stream(spark, "k string, v string"), key="k", func=_dup_counter, state_type=int,
                                   output_type="k string, n long", engine="batched", initial_state=initial)
    query = (out.writeStream.format("memory").queryName("dup_initial_batched").outputMode("update")
             .option("checkpointLocation", str(tmp_path / "ck")).trigger(availableNow=True).start())
    with pytest.raises(Exception, match=r"initial_state holds key 'a' more than once"):
        query.awaitTermination(600)
    assert spark.sql("SELECT * FROM dup_initial_batched").count() == 0
