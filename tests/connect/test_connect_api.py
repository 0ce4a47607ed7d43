"""sparkstate's API on a Spark Connect session: the operators with a restart, event-time
sessionize on shuffled input, the vectorized API and the state tools, against a real server.

Outputs go to Parquet through :func:`sparkstate.io.start_sink` and are read back through the
server: over Connect a ``foreachBatch`` function runs on the server, not in this process.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import datetime, timezone

import numpy as np
import pytest

import sparkstate as ss
from sparkstate.errors import ConfigError
from sparkstate.io.sinks import start_sink
from sparkstate.spark import ROCKSDB_PROVIDER, check_connect_settings, is_connect
from sparkstate.synthetic import EVENT_SCHEMA, Session, generate_events, reference_sessions
from tests.pipelines.test_sessionize_order import (
    Landing, _ms, _rows, crafted, disordered, ordered, watermarks,
)


def test_spark_session_gives_a_connect_session_with_what_keyed_state_needs(spark, connect_url):
    assert is_connect(spark)
    assert spark.conf.get("spark.sql.streaming.stateStore.providerClass") == ROCKSDB_PROVIDER
    assert spark.conf.get("spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled") == "true"
    assert spark.conf.get("spark.sql.streaming.stateStore.rocksdb.maxMemoryUsageMB") == "64"
    # a session whose state store is not RocksDB is named, with the server's --conf to fix it
    other = spark.newSession()
    other.conf.set("spark.sql.streaming.stateStore.providerClass",
                   "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider")
    with pytest.raises(ConfigError, match=r"start the server with --conf spark\.sql\.streaming\.stateStore"
                                          r"\.providerClass=org\.apache\.spark\..*RocksDBStateStoreProvider"):
        check_connect_settings(other, connect_url)


@dataclass
class Tally:
    n: int
    words: list[str]


def tally(user, rows, state):
    old = state.get if state.exists else Tally(0, [])
    new = Tally(old.n + sum(1 for _ in rows), old.words)
    state.update(new)
    return (user, new.n)


def _rows_of(spark, path) -> list:
    return spark.read.parquet(str(path)).collect()


def test_map_groups_with_state_restarts_exactly_once(spark, tmp_path):
    landing = Landing(tmp_path / "in")
    landing.add([{"user": f"u{i % 3}", "word": "w"} for i in range(7)])

    def run() -> None:
        stream = landing.stream(spark, "user string, word string")
        out = ss.map_groups_with_state(stream, key="user", func=tally, state_type=Tally,
                                       output_type="user string, n long", checkpoint=tmp_path / "ck")
        q = start_sink(out, f"parquet:{tmp_path / 'out'}", tmp_path / "ck", output_mode="update")
        try:
            q.processAllAvailable()
        finally:
            q.stop()

    run()
    landing.add([{"user": "u1", "word": "w"}, {"user": "u3", "word": "w"}])
    run()  # restarted on the same checkpoint
    rows = _rows_of(spark, tmp_path / "out")
    last = {}
    for r in sorted(rows, key=lambda r: r.batch_id):
        last[r.user] = r.n
    assert last == {"u0": 3, "u1": 3, "u2": 2, "u3": 1}
    assert sorted((r.batch_id, r.user, r.n) for r in rows) == [
        (0, "u0", 3), (0, "u1", 2), (0, "u2", 2), (1, "u1", 3), (1, "u3", 1)]
    state = {r.user: r.n for r in ss.state.read(spark, tmp_path / "ck").collect()}
    assert state == last and ss.state.keys(spark, tmp_path / "ck") == 4


def test_event_time_sessionize_on_shuffled_input_restarted_mid_stream(spark, tmp_path):
    delay_ms = 150_000
    events = generate_events(70, users=3, seed=21, last_share=0.4) + crafted()
    batches = disordered(events, delay_ms, random.Random(7), batches=6)
    wms = watermarks(batches, delay_ms)
    landing = Landing(tmp_path / "in")

    def run() -> str:
        stream = landing.stream(spark, EVENT_SCHEMA)
        out = ss.pipelines.sessionize(stream, gap="1 minute", watermark=f"{delay_ms} milliseconds",
                                      checkpoint=tmp_path / "ck")
        q = start_sink(out, f"parquet:{tmp_path / 'out'}", tmp_path / "ck")  # append: Spark's own file sink
        try:
            q.processAllAvailable()
            return q.lastProgress["eventTime"]["watermark"]
        finally:
            q.stop()

    for b in batches[:3]:
        landing.add(_rows(b))
    run()
    assert ss.state.keys(spark, tmp_path / "ck") > 0
    for b in batches[3:]:
        landing.add(_rows(b))
    final = datetime.strptime(run(), "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=timezone.utc)
    assert _ms(final) == wms[-1]
    got = [Session.from_row(r) for r in _rows_of(spark, tmp_path / "out")]
    expected = reference_sessions(events, "1 minute", watermark=final)
    assert ordered(got) == ordered(expected) and len(got) >= 15
    assert (tmp_path / "out" / "_spark_metadata").is_dir()  # the layout a classic session writes


def count_batch(batch):
    s = batch.state[["word", "value"]]
    s = s.assign(value=s["value"].fillna(0) + np.bincount(batch.key_index, minlength=len(s)))
    return ss.StateUpdate(state=s, output=s.rename(columns={"value": "count"}))


def test_the_vectorized_api_and_the_state_tools_and_initial_state(spark, tmp_path):
    landing = Landing(tmp_path / "in")
    words = ["a", "b", "a", "c", "a", "b"]
    landing.add([{"word": w} for w in words])
    stream = landing.stream(spark, "word string")
    out = ss.map_batches_with_state(stream, key="word", func=count_batch, state_type=int,
                                    output_type="word string, count long")
    q = start_sink(out, f"parquet:{tmp_path / 'out'}", tmp_path / "ck", output_mode="update")
    try:
        q.processAllAvailable()
    finally:
        q.stop()
    assert sorted((r.word, r["count"]) for r in _rows_of(spark, tmp_path / "out")) == [("a", 3), ("b", 2), ("c", 1)]

    # the state tools, through the server
    assert sorted(tuple(r) for r in ss.state.read(spark, tmp_path / "ck").select("word", "value").collect()) == [
        ("a", 3), ("b", 2), ("c", 1)]
    stats = ss.state.stats(spark, tmp_path / "ck")
    assert stats.keys == 3 and stats.committed_batches == [0] and stats.operator["engine"] == "batched"
    assert ss.state.engine_of(spark, tmp_path / "ck") == "batched"
    assert ss.state.export(spark, tmp_path / "ck", tmp_path / "state.parquet") == 3

    # the export starts a new query (a per-key operator) as its initial state
    landing2 = Landing(tmp_path / "in2")
    landing2.add([{"word": "a"}, {"word": "d"}])

    def count(word, rows, state):
        n = (state.getOption or 0) + sum(1 for _ in rows)
        state.update(n)
        return (word, n)

    out2 = ss.map_groups_with_state(landing2.stream(spark, "word string"), key="word", func=count, state_type=int,
                                    output_type="word string, count long",
                                    initial_state=spark.read.parquet(str(tmp_path / "state.parquet")))
    q = start_sink(out2, f"parquet:{tmp_path / 'out2'}", tmp_path / "ck2", output_mode="update")
    try:
        q.processAllAvailable()
    finally:
        q.stop()
    assert sorted((r.word, r["count"]) for r in _rows_of(spark, tmp_path / "out2")) == [("a", 4), ("d", 1)]
    assert ss.state.keys(spark, tmp_path / "ck2") == 4


def test_sessions_per_window_in_the_same_query(spark, tmp_path):
    events = generate_events(80, users=4, seed=5, last_share=0.3)
    landing = Landing(tmp_path / "in")
    for b in disordered(events, 30_000, random.Random(3), batches=4):
        landing.add(_rows(b))
    sessions = ss.pipelines.sessionize(landing.stream(spark, EVENT_SCHEMA), gap="1 minute",
                                       watermark="30 seconds", event_time_column="final_time")
    hourly = ss.pipelines.sessions_per_window(sessions, "10 minutes")
    q = start_sink(hourly, f"parquet:{tmp_path / 'out'}", tmp_path / "ck")
    try:
        q.processAllAvailable()
        final = datetime.strptime(q.lastProgress["eventTime"]["watermark"],
                                  "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=timezone.utc)
    finally:
        q.stop()
    got = {r.window.start.replace(tzinfo=timezone.utc) if r.window.start.tzinfo is None else r.window.start: r.sessions
           for r in _rows_of(spark, tmp_path / "out")}
    expected: dict = {}
    for s in reference_sessions(events, "1 minute", watermark=final):
        end = s.session_end
        start = end.replace(minute=end.minute - end.minute % 10, second=0, microsecond=0)
        expected[start] = expected.get(start, 0) + 1
    # a window is written once the watermark is past its end + gap: the last ones are still open
    assert got and all(got[w] == expected[w] for w in got)
    assert sum(got.values()) <= sum(expected.values())
