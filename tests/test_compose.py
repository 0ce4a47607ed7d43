"""sparkstate operators and Spark's own stateful operators in one query, on the session defaults,
each query restarted once from its checkpoint; rows inside a micro-batch in shuffled order."""

from __future__ import annotations

import random
from collections import Counter
from datetime import datetime, timedelta, timezone

import pytest
from pyspark.sql import functions as F

import sparkstate as ss
from sparkstate.io import EVENT_SCHEMA, Event, generate_events, reference_sessions
from tests.conftest import ENCODING_KEY
from tests.pipelines.test_sessionize_order import Landing, _ms, _rows, disordered, watermarks
from tests.streams import LandingDir, StreamRun

ENGINES = ["tws", "batched"]


@pytest.fixture(params=ENGINES)
def engine(request):
    return request.param


def test_session_defaults_leave_spark_encoding_alone(spark):
    assert ENCODING_KEY not in ss.spark.default_config()
    assert spark.conf.get(ENCODING_KEY, "unsaferow") == "unsaferow"


def _count_rows(key, rows, state):
    n = (state.getOption or 0) + sum(1 for _ in rows)
    state.update(n)
    return (key, n)


def test_operator_after_drop_duplicates_within_watermark(spark, tmp_path, engine):
    # each click is sent twice, the copy one or two files later (well inside the 10-minute delay)
    t0 = datetime(2024, 1, 1, tzinfo=timezone.utc).timestamp()
    clicks = [{"user": f"u{i % 5}", "id": f"c{i}", "t": t0 + i} for i in range(60)]
    files: list[list] = [[] for _ in range(8)]
    for i, c in enumerate(clicks):
        files[i // 10].append(c)
        files[i // 10 + 1 + i % 2].append(dict(c))
    rng = random.Random(5)
    for f in files:
        rng.shuffle(f)
    land = LandingDir(tmp_path / "in")

    def query():
        src = (land.stream(spark, "user string, id string, t double")
               .withColumn("ts", F.col("t").cast("timestamp")).withWatermark("ts", "10 minutes")
               .dropDuplicatesWithinWatermark(["id"]))
        return ss.map_groups_with_state(src, key="user", func=_count_rows, state_type=int,
                                        output_type="user string, n long", engine=engine)

    last: dict = {}
    ck = tmp_path / "ck"
    for half, already in ((files[:4], 0), (files[4:], sum(len(f) for f in files[:4]))):
        with StreamRun(spark, query(), ck, landing=land, already_read=already) as run:
            for f in half:
                land.add(f)
                run.wait_input()
            for r in run.rows:
                last[r.user] = max(last.get(r.user, 0), r.n)
    assert last == dict(Counter(c["user"] for c in clicks))  # every click once: 12 per user


def test_stream_static_join_feeds_an_operator(spark, tmp_path, engine):
    countries = spark.createDataFrame([(f"u{i}", "fr" if i % 3 else "de") for i in range(9)], "user string, country string")
    rng = random.Random(7)
    files = [[{"user": f"u{rng.randrange(10)}", "page": f"p{j}"} for j in range(25)] for _ in range(4)]
    land = LandingDir(tmp_path / "in")

    def query():
        clicks = land.stream(spark, "user string, page string").join(countries, "user")  # u9: no country
        return ss.map_groups_with_state(clicks, key="country", func=_count_rows, state_type=int,
                                        output_type="country string, n long", engine=engine)

    last: dict = {}
    ck = tmp_path / "ck"
    for half, already in ((files[:2], 0), (files[2:], 50)):
        with StreamRun(spark, query(), ck, landing=land, already_read=already) as run:
            for f in half:
                land.add(f)
                run.wait_input()
            for r in run.rows:
                last[r.country] = max(last.get(r.country, 0), r.n)
    country = {f"u{i}": "fr" if i % 3 else "de" for i in range(9)}
    want = Counter(country[c["user"]] for f in files for c in f if c["user"] in country)
    assert last == dict(want) and sum(want.values()) < 100  # u9 had clicks, and no country


def test_other_streaming_aggregations_in_the_session_keep_working(spark, tmp_path):
    land = LandingDir(tmp_path / "in")
    land.add([{"user": "a"}, {"user": "b"}, {"user": "a"}])
    ours = ss.map_groups_with_state(land.stream(spark, "user string"), key="user", func=_count_rows,
                                    state_type=int, output_type="user string, n long")
    theirs = land.stream(spark, "user string").groupBy("user").count()
    with StreamRun(spark, ours, tmp_path / "ck1", landing=land) as r1, \
            StreamRun(spark, theirs, tmp_path / "ck2", landing=land, output_mode="complete") as r2:
        r1.wait_input()
        r2.wait_input()
        r2.wait_for(lambda _: bool(r2.batches)
                    and sorted((r.user, r["count"]) for r in r2.batches[-1]) == [("a", 2), ("b", 1)])
        assert sorted(tuple(r) for r in r1.rows) == [("a", 2), ("b", 1)]


def test_event_time_column_is_checked_when_defined(spark, tmp_path):
    land = LandingDir(tmp_path / "in")
    src = land.stream(spark, "user string, t timestamp")

    def define(df, column, output="user string, t timestamp, n long"):
        return ss.map_groups_with_state(df, key="user", func=_count_rows, state_type=int, output_type=output,
                                        event_time_column=column)

    with pytest.raises(ss.ConfigError, match="event_time_column 'nope' is not an output column"):
        define(src.withWatermark("t", "1 minute"), "nope")
    with pytest.raises(ss.ConfigError, match="event_time_column 'n' must be a timestamp column, it is bigint"):
        define(src.withWatermark("t", "1 minute"), "n")
    with pytest.raises(ss.ConfigError, match="the input has none"):
        define(src, "t")


HOUR_MS = 3_600_000


def _hour(t: datetime) -> int:
    return _ms(t) // HOUR_MS * HOUR_MS


def _epoch_ms(t: datetime) -> int:  # Spark hands naive local datetimes to Python
    return round(t.timestamp() * 1000)


def test_sessions_counted_per_hour_of_their_end_in_one_query(spark, tmp_path, engine):
    """sessionize -> an append-mode count per hour of session_end, one query, restarted once:
    each hour comes out once, with exactly the reference's sessions that end in it."""
    gap_ms, delay_ms = 600_000, 1_200_000
    t0 = datetime(2024, 1, 1, tzinfo=timezone.utc)
    events = generate_events(70, users=4, seed=11, gap="10 minutes", last_share=0.4) + [
        # ends 1 ms before 01:00 and is final only after 01:10: the 00:00 hour must wait for it
        Event("edge", t0 + timedelta(minutes=50), "a"), Event("edge", t0 + timedelta(hours=1, milliseconds=-1), "b"),
        # closed by a flag exactly at 01:00: the 01:00 hour
        Event("flag", t0 + timedelta(minutes=59), "a"), Event("flag", t0 + timedelta(hours=1), "b", is_last=True),
    ]
    batches = disordered(events, delay_ms, random.Random(10), batches=5)
    wms = watermarks(batches, delay_ms)
    land = Landing(tmp_path / "in")

    def query():
        sessions = ss.pipelines.sessionize(land.stream(spark, EVENT_SCHEMA), gap="10 minutes",
                                           watermark=f"{delay_ms} milliseconds", engine=engine,
                                           event_time_column="final_time")
        return ss.pipelines.sessions_per_window(sessions, "1 hour", F.count(F.lit(1)).alias("sessions"),
                                                F.sum("event_count").alias("events"))

    got: list = []
    wm_text = ""
    for half in (batches[:3], batches[3:]):
        for b in half:
            land.add(_rows(b))
        q = (query().writeStream.outputMode("append").option("checkpointLocation", str(tmp_path / "ck"))
             .foreachBatch(lambda df, _: got.extend(df.collect())).start())
        try:
            q.processAllAvailable()  # idle once the last watermark advance has fired
            wm_text = q.lastProgress["eventTime"]["watermark"]
        finally:
            q.stop()
    final_wm = _ms(datetime.strptime(wm_text, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=timezone.utc))
    assert final_wm == wms[-1]

    sessions = reference_sessions(events, "10 minutes")
    # an hour is written once the watermark is past its end + gap: every session ending in it is final
    hours = {h for h in map(lambda s: _hour(s.session_end), sessions) if h + HOUR_MS + gap_ms + 1 <= final_wm}
    want = {h: (sum(1 for s in sessions if _hour(s.session_end) == h),
                sum(s.event_count for s in sessions if _hour(s.session_end) == h)) for h in hours}
    seen = [(_epoch_ms(r.window.start), _epoch_ms(r.window.end), r.sessions, r.events) for r in got]
    assert sorted(seen) == sorted((h, h + HOUR_MS, *want[h]) for h in hours)
    assert len(hours) >= 3 and _hour(t0) in hours
    # what makes it hard happened: at some batch an hour had ended (by the watermark) while a
    # session ending in it was not final yet, and that session was counted in its hour
    assert any(_hour(s.session_end) + HOUR_MS <= wm <= _ms(s.session_end) + gap_ms
               for s in sessions if _hour(s.session_end) in hours for wm in wms)


def test_session_windows_are_checked_when_defined(spark, tmp_path):
    clicks = LandingDir(tmp_path / "in").stream(spark, EVENT_SCHEMA)
    sessionize = ss.pipelines.sessionize
    with pytest.raises(ss.ConfigError, match="event_time_column .* needs time_mode='event'"):
        sessionize(clicks, time_mode="processing", event_time_column="final_time")
    with pytest.raises(ss.ConfigError, match="'session_end' is not a free name"):
        sessionize(clicks, event_time_column="session_end")
    with pytest.raises(ss.ConfigError,
                       match=r"no session event-time column; build it with sessionize\(\.\.\., event_time_column="):
        ss.pipelines.sessions_per_window(sessionize(clicks), "1 hour")
    sessions = sessionize(clicks, event_time_column="final_time")
    with pytest.raises(ss.ConfigError, match="slide .* must not be longer than window"):
        ss.pipelines.sessions_per_window(sessions, "1 hour", slide="2 hours")
    with pytest.raises(ss.ConfigError, match="by column 'country' is not in the input"):
        ss.pipelines.sessions_per_window(sessions, "1 hour", by="country")
    hourly = ss.pipelines.sessions_per_window(sessions, "1 hour", slide="30 minutes", by="user_id")
    assert hourly.isStreaming and hourly.columns == ["window", "user_id", "sessions"]


def test_stream_stream_join_feeds_an_operator(spark, tmp_path):
    """Clicks joined with their ad's impression (within 10 minutes after it), counted per user by
    an operator, in one append-mode query restarted once; a click may arrive before its impression.
    On the operators' default engine only (the join's output reaches both engines as any input does)."""
    t0 = datetime(2024, 1, 1, tzinfo=timezone.utc).timestamp()
    rng = random.Random(9)
    imps = [{"ad": f"a{i}", "it": t0 + 180 * i} for i in range(12)]
    clicks = [{"user": f"u{rng.randrange(4)}", "ad": f"a{i}", "t": t0 + 180 * i + rng.choice([0, 120, 600, 601, 900])}
              for i in range(12) for _ in range(3)]
    imp_files = [imps[0:4], imps[4:8], imps[8:10], imps[10:12]]
    click_files = [[c for c in clicks if int(c["ad"][1:]) < 2],       # a2, a3: clicks a file after their impressions
                   [c for c in clicks if 2 <= int(c["ad"][1:]) < 9],  # a8: clicks a file before the impression
                   [c for c in clicks if 9 <= int(c["ad"][1:]) < 11],
                   [c for c in clicks if int(c["ad"][1:]) >= 11]]
    for f in click_files:
        rng.shuffle(f)
    imp_land, click_land = Landing(tmp_path / "imps"), Landing(tmp_path / "clicks")

    def query():
        i = (imp_land.stream(spark, "ad string, it double").withColumn("it", F.col("it").cast("timestamp"))
             .withWatermark("it", "1 hour"))
        c = (click_land.stream(spark, "user string, ad string, t double").withColumn("t", F.col("t").cast("timestamp"))
             .withWatermark("t", "1 hour").withColumnRenamed("ad", "click_ad"))
        joined = c.join(i, F.expr("click_ad = ad AND t >= it AND t <= it + INTERVAL 10 MINUTES"))
        return ss.map_groups_with_state(joined.select("user", "t"), key="user", func=_count_rows, state_type=int,
                                        output_type="user string, n long", output_mode="append")

    last: dict = {}

    def keep(df, _):
        for r in df.collect():
            last[r.user] = max(last.get(r.user, 0), r.n)

    for files in ((0, 1), (2, 3)):
        for k in files:
            imp_land.add(imp_files[k])
            click_land.add(click_files[k])
        q = (query().writeStream.outputMode("append").option("checkpointLocation", str(tmp_path / "ck"))
             .foreachBatch(keep).start())
        try:
            q.processAllAvailable()
        finally:
            q.stop()
    want = Counter(c["user"] for c in clicks if c["t"] - imps[int(c["ad"][1:])]["it"] <= 600)
    assert last == dict(want) and 0 < sum(want.values()) < len(clicks)
