"""map_batches_with_state: its rules on the harness (no Spark), and the same functions on real Spark
(exact against the harness, event time on shuffled orders, restart, state tools, bad returns)."""

from __future__ import annotations

import random
import time
from dataclasses import dataclass

import numpy as np
import pandas as pd
import pytest
from pyspark.sql import functions as F

import sparkstate as ss
from sparkstate.errors import ConfigError, StateTypeError, TimeoutConfigError, UserFunctionError, explain
from tests.engines.test_engines import EXPECTED, GAP_MS, SCRIPT, wait_watermark
from tests.streams import LandingDir, StreamRun, progress_listener

PT = ss.GroupStateTimeout.ProcessingTimeTimeout
ET = ss.GroupStateTimeout.EventTimeTimeout


# --- the functions under test -------------------------------------------------------------------

def running_count(batch):
    n = batch.rows.groupby("word", sort=False).size().rename("n").reset_index()
    s = batch.state.merge(n, on="word")
    s["value"] = s["value"].fillna(0) + s["n"]
    return ss.StateUpdate(state=s[["word", "value"]], output=s.rename(columns={"value": "count"})[["word", "count"]])


IDLE_MS = 3000


def sum_per_user(batch):
    """Per-user sum; a user idle for IDLE_MS is emitted as expired and dropped."""
    add = batch.rows.groupby("user", sort=False)["amount"].sum().rename("add").reset_index()
    s = batch.state.merge(add, on="user", how="left")
    total = s["value"].fillna(0) + s["add"].fillna(0)
    expired = s["timed_out"].to_numpy()
    out = pd.DataFrame({"user": s["user"], "kind": np.where(expired, "expired", "sum"), "total": total,
                        "pt": batch.processing_time_ms})
    live = ~expired
    state = pd.DataFrame({"user": s["user"][live], "value": total[live],
                          "timeout_ms": batch.processing_time_ms + IDLE_MS})
    return ss.StateUpdate(state=state, output=out)  # expired users: not set again, so removed


@dataclass
class Tally:
    n: int = 0


def tally(batch):
    """test_engines' event-time tally (timeout: the key's latest event + GAP_MS), over columns."""
    r = batch.rows.groupby("key", sort=False).agg(cnt=("t", "size"), tmax=("t", "max")).reset_index()
    s = batch.state.merge(r, on="key", how="left")
    n = (s["n"].fillna(0) + s["cnt"].fillna(0)).astype("int64")
    data = ~s["timed_out"].to_numpy()
    out = pd.DataFrame({"key": s["key"], "kind": np.where(data, "data", "timeout"), "n": n})
    state = pd.DataFrame({"key": s["key"][data], "n": n[data], "timeout_ms": s["tmax"][data] + GAP_MS})
    return ss.StateUpdate(state=state, output=out)


def rows_of(frame) -> list:
    return sorted(tuple(x.item() if hasattr(x, "item") else x for x in r) for r in frame.itertuples(index=False))


# --- the rules, on the harness -----------------------------------------------------------------

def test_harness_running_count():
    h = ss.testing.BatchStateHarness(running_count, key="word", state_type=int)
    assert rows_of(h.run_batch(pd.DataFrame({"word": ["a", "b", "a"]}))) == [("a", 2), ("b", 1)]
    assert rows_of(h.run_batch([{"word": "a"}])) == [("a", 3)]
    assert (h.peek_state("a"), h.peek_state("b"), h.peek_timeout_ms("a")) == (3, 1, None)


def test_harness_idle_timeout_rules():
    h = ss.testing.BatchStateHarness(sum_per_user, key="user", state_type=float, timeout=PT)
    out = h.run_batch(pd.DataFrame({"user": ["a", "b"], "amount": [1.0, 2.0]}), processing_time=1000)
    assert rows_of(out) == [("a", "sum", 1.0, 1000), ("b", "sum", 2.0, 1000)]
    assert h.peek_timeout_ms("a") == 1000 + IDLE_MS
    h.run_batch(pd.DataFrame({"user": ["a"], "amount": [3.0]}), processing_time=2000)
    assert rows_of(h.advance_processing_time(2000)) == []   # clock 4000: b is due at 4000, not yet past it
    assert rows_of(h.advance_processing_time(1)) == [("b", "expired", 2.0, 4001)]
    assert h.keys() == ["a"] and h.peek_state("a") == 4.0
    assert rows_of(h.advance_processing_time(1000)) == [("a", "expired", 4.0, 5001)]
    assert h.keys() == []


def _keep_all(batch):
    """Sets nothing, removes nothing."""
    return ss.StateUpdate(output=None)


def test_unmentioned_keys_keep_state_and_timeout_and_timed_out_ones_go():
    h = ss.testing.BatchStateHarness(_keep_all, key="k", state_type=int, timeout=PT)
    h.set_state("a", 1, timeout_ms=500)
    h.set_state("b", 2, timeout_ms=5000)
    h.run_batch(pd.DataFrame({"k": ["a", "b"]}), processing_time=1000)   # a has rows: no timeout call
    assert (h.peek_state("a"), h.peek_timeout_ms("a"), h.peek_state("b")) == (1, 500, 2)
    h.run_batch(None, processing_time=1001)                              # a times out, not set: removed
    assert h.keys() == ["b"]


def _set_without_timeout_column(batch):
    s = batch.state.copy()
    s["value"] = s["value"].fillna(0) + 1
    return ss.StateUpdate(state=s[["k", "value"]])


def test_a_set_key_without_timeout_column_keeps_its_timeout_unless_it_fired():
    h = ss.testing.BatchStateHarness(_set_without_timeout_column, key="k", state_type=int, timeout=PT)
    h.set_state("a", 1, timeout_ms=500)
    h.set_state("b", 1, timeout_ms=700)
    h.run_batch(pd.DataFrame({"k": ["a"]}), processing_time=600)     # a: rows; b: not due
    assert (h.peek_state("a"), h.peek_timeout_ms("a")) == (2, 500)
    h.run_batch(None, processing_time=800)                            # both due: set again, timeout gone
    assert [(h.peek_state(k), h.peek_timeout_ms(k)) for k in "ab"] == [(3, None), (2, None)]


def test_event_time_harness_on_shuffled_orders():
    for seed in range(5):
        rnd = random.Random(seed)
        h = ss.testing.BatchStateHarness(tally, key="key", state_type=Tally, timeout=ET)
        out, wm = [], 0
        for batch in SCRIPT:
            rows = [{"key": k, "t": t} for k, t in batch]
            rnd.shuffle(rows)
            out += rows_of(h.run_batch(rows, watermark=wm))
            wm = max(wm, max(t for _, t in batch))
            out += rows_of(h.advance_watermark(wm))
        assert sorted(out) == sorted(EXPECTED[False]), seed


def _returning(update):
    def f(batch):
        return update(batch)
    f.__name__ = "bad"
    return f


BAD = [
    (lambda b: 3, StateTypeError, "must return ss.StateUpdate"),
    (lambda b: ss.StateUpdate(state=b.state[["k"]]), StateTypeError, "missing value"),
    (lambda b: ss.StateUpdate(state=b.state.assign(valu=1)[["k", "value", "valu"]].fillna(0)), StateTypeError,
     "unexpected valu"),
    (lambda b: ss.StateUpdate(state=b.state.assign(value="x")[["k", "value"]]), StateTypeError,
     "column 'value' must hold the state field's type"),
    (lambda b: ss.StateUpdate(state=b.state.assign(value=1)[["k", "value"]], remove=["a"]), ConfigError,
     "both in StateUpdate.state and in StateUpdate.remove"),
    (lambda b: ss.StateUpdate(remove=["zz"]), ConfigError, "names key 'zz', which is not in batch.state"),
    (lambda b: ss.StateUpdate(state=pd.DataFrame({"k": ["a", "a"], "value": [1, 2]})), ConfigError,
     "more than one row for key 'a'"),
    (lambda b: ss.StateUpdate(state=pd.DataFrame({"k": ["a"], "value": [None]})), StateTypeError,
     "None cannot be stored"),
    (lambda b: ss.StateUpdate(state=pd.DataFrame({"k": ["a"], "value": [1], "timeout_ms": [5]})),
     TimeoutConfigError, "the query has no timeout"),
    (lambda b: ss.StateUpdate(output=pd.DataFrame({"k": ["a"]})), StateTypeError, "missing n"),
    (lambda b: ss.StateUpdate(output=pd.DataFrame({"k": ["a"], "n": ["x"]})), StateTypeError,
     "column 'n' must hold output_type's type"),
    (lambda b: 1 / 0, UserFunctionError, "raised ZeroDivisionError"),
]


@pytest.mark.parametrize("update, error, message", BAD)
def test_bad_returns_are_clear_errors(update, error, message):
    from pyspark.sql.types import LongType, StringType, StructField, StructType

    out = StructType([StructField("k", StringType()), StructField("n", LongType())])
    h = ss.testing.BatchStateHarness(_returning(update), key="k", state_type=int, output_type=out)
    with pytest.raises(error, match=message):
        h.run_batch(pd.DataFrame({"k": ["a", "b"]}))


def test_timeouts_behind_the_clock_are_refused():
    def late(batch):
        return ss.StateUpdate(state=batch.state.assign(value=1, timeout_ms=batch.processing_time_ms)[
            ["k", "value", "timeout_ms"]])
    h = ss.testing.BatchStateHarness(late, key="k", state_type=int, timeout=PT, start_time_ms=100)
    with pytest.raises(ConfigError, match="timeout_ms 100 of key 'a' is not later than the batch's processing time"):
        h.run_batch([{"k": "a"}])


# --- on Spark ----------------------------------------------------------------------------------

def test_definition_errors(spark):
    df = spark.createDataFrame([("a", 1)], "k string, value long")
    with pytest.raises(ConfigError, match="clash with batch.state"):
        ss.map_batches_with_state(df, key="k", func=running_count, state_type=_Clash,
                                  output_type="k string")
    with pytest.raises(ConfigError, match="batched engine's layout only"):
        ss.map_batches_with_state(df, key="k", func=running_count, state_type=int, output_type="k string",
                                  engine="tws")


@dataclass
class _Clash:
    timed_out: bool = False


def test_a_bad_return_on_spark_is_one_clear_line(spark):
    df = spark.createDataFrame([("a",), ("b",)], "word string")

    def extra(batch):
        return ss.StateUpdate(state=batch.state.assign(value=1, oops=2)[["word", "value", "oops"]])
    out = ss.map_batches_with_state(df, key="word", func=extra, state_type=int, output_type="word string",
                                    engine=ss.BatchedEngine(buckets=1, pack=False))  # one Python stage: fails sooner
    with pytest.raises(Exception) as info:
        out.collect()
    assert explain(info.value).startswith("StateTypeError: map_batches_with_state: StateUpdate.state must have"), \
        explain(info.value)
    assert "unexpected oops" in explain(info.value)


def test_event_time_on_spark_equals_the_harness_on_a_shuffled_order(spark, tmp_path):
    rnd = random.Random(7)
    batches = [[{"key": k, "t": t} for k, t in b] for b in SCRIPT]
    for b in batches:
        rnd.shuffle(b)
    land = LandingDir(tmp_path / "in")
    land.add(batches[0])
    events = (land.stream(spark, "key string, t long").withColumn("event_time", F.timestamp_millis("t"))
              .withWatermark("event_time", "0 seconds"))
    out = ss.map_batches_with_state(events, key="key", func=tally, state_type=Tally, timeout=ET,
                                    output_type="key string, kind string, n long",
                                    engine=ss.BatchedEngine(buckets=3, leaf_rows=2))
    with StreamRun(spark, out, tmp_path / "ck", landing=land) as run:
        wm = 0
        for i, batch in enumerate(batches):
            if i:
                land.add(batch)
            run.wait_input()
            wm = max(wm, max(r["t"] for r in batch))
            wait_watermark(run, wm)
        got = sorted(tuple(r) for r in run.rows)
    assert got == sorted(EXPECTED[False])


def test_idle_timeout_on_spark_equals_the_harness(spark, tmp_path):
    land = LandingDir(tmp_path / "in")
    land.add([{"user": "a", "amount": 1.0}, {"user": "b", "amount": 2.0}])
    out = ss.map_batches_with_state(land.stream(spark, "user string, amount double"), key="user", func=sum_per_user,
                                    state_type=float, timeout=PT,
                                    output_type="user string, kind string, total double, pt long")
    with StreamRun(spark, out, tmp_path / "ck", landing=land) as run:
        run.wait_input()
        land.add([{"user": "a", "amount": 3.0}])
        run.wait_input()
        run.wait_for(lambda rows: sum(r.kind == "expired" for r in rows) == 2)
        got = [tuple(r) for r in run.rows]
    # the harness, fed at the processing times the Spark batches had (data and timeout batches, in order)
    pts = sorted({pt for _, kind, _, pt in got if kind == "sum"})
    assert len(pts) == 2
    files = {pts[0]: [{"user": "a", "amount": 1.0}, {"user": "b", "amount": 2.0}],
             pts[1]: [{"user": "a", "amount": 3.0}]}
    h = ss.testing.BatchStateHarness(sum_per_user, key="user", state_type=float, timeout=PT)
    want = []
    for pt in sorted({r[3] for r in got}):
        want += rows_of(h.run_batch(files.get(pt), processing_time=pt))
    assert sorted(got) == sorted(want)
    # "a" expires before its second amount only if a batch without "a" ran once it had been idle long
    # enough; a key with new data is never timed out in that batch (as in Spark), however late it comes
    a_expired_first = [pt for u, k, _, pt in got if u == "a" and k == "expired" and pt < pts[1]]
    assert all(pt >= pts[0] + IDLE_MS for pt in a_expired_first)
    assert sorted((u, k, t) for u, k, t, _ in got) == sorted(
        [("a", "sum", 1.0), ("b", "sum", 2.0), ("a", "expired", 1.0), ("b", "expired", 2.0), ("a", "sum", 3.0)]
        if a_expired_first else
        [("a", "sum", 1.0), ("b", "sum", 2.0), ("a", "sum", 4.0), ("b", "expired", 2.0), ("a", "expired", 4.0)])


def _start(out, checkpoint, sink):
    """A query writing each micro-batch to its own directory (a rerun batch overwrites it)."""
    def write(df, batch_id):
        df.write.mode("overwrite").parquet(str(sink / f"batch_id={batch_id}"))
    progress_listener(out.sparkSession)
    return (out.writeStream.outputMode("update").foreachBatch(write).option("checkpointLocation", str(checkpoint))
            .trigger(processingTime="300 milliseconds").start())


def _run_files(spark, query, land, files, timeout=120.0):
    """Add the files one at a time (the file source would not keep the order of files added
    together), each read in a micro-batch of its own; then stop between batches."""
    listener = progress_listener(spark)
    n = 0
    for f in files:
        land.add(f)
        n += len(f)
        deadline = time.time() + timeout
        while listener.rows.get(str(query.runId), 0) < n:
            if not query.isActive:
                raise RuntimeError(f"query stopped: {query.exception()}")
            if time.time() > deadline:
                raise TimeoutError(f"{n} rows not processed in {timeout}s")
            time.sleep(0.1)
    while query.status.get("isTriggerActive"):
        time.sleep(0.02)
    query.stop()


def test_restart_mid_stream_is_exactly_once_and_state_tools_read_it(spark, tmp_path):
    """Initial state, a stop after two batches, a restart on the checkpoint: the outputs equal an
    uninterrupted run's (each batch written once), and ss.state.read gives the totals."""
    rnd = random.Random(3)
    files = [[{"word": f"w{rnd.randrange(40)}"} for _ in range(rnd.randrange(20, 60))] for _ in range(4)]
    land = LandingDir(tmp_path / "in")
    sink, ck = tmp_path / "out", tmp_path / "ck"

    initial = spark.createDataFrame([("w0", 100), ("preloaded", 7)], "word string, value long")

    def query():
        return ss.map_batches_with_state(land.stream(spark, "word string"), key="word", func=running_count,
                                         state_type=int, output_type="word string, count long", initial_state=initial,
                                         engine=ss.BatchedEngine(buckets=4, leaf_rows=4), checkpoint=ck)
    _run_files(spark, _start(query(), ck, sink), land, files[:2])
    _run_files(spark, _start(query(), ck, sink), land, files[2:])
    # the reference: one micro-batch per file, each word's running count after it
    want, totals = [], {"w0": 100, "preloaded": 7}
    for f in files:
        seen = {}
        for r in f:
            totals[r["word"]] = totals.get(r["word"], 0) + 1
            seen[r["word"]] = totals[r["word"]]
        want += [(w, n) for w, n in seen.items()]
    got = spark.read.parquet(str(sink)).select("word", "count").collect()
    assert sorted(tuple(r) for r in got) == sorted(want)
    state = ss.state.read(spark, ck)
    assert state.columns == ["word", "value", "timeout_ms"]
    assert {r.word: r.value for r in state.collect()} == totals
