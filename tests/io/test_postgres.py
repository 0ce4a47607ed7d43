"""The postgres sink against a real PostgreSQL server (tests/io/pg.py starts one)."""

from __future__ import annotations

import logging
import sys
import threading
from datetime import date, datetime, timedelta, timezone
from decimal import Decimal

import pytest
from pyspark.sql import types as T

from sparkstate.errors import SinkError
from sparkstate.io.postgres import PROGRESS_TABLE, PostgresBatchWriter, parse_postgres_url, pg_type
from sparkstate.io.sinks import parse_sink, start_sink
from tests.io.replay import drop_last_commit
from tests.streams import LandingDir

SCHEMA = "user_id string, n long, pages array<string>, at timestamp"


@pytest.mark.parametrize("spark_type, pg", [
    (T.BooleanType(), "boolean"), (T.ByteType(), "smallint"), (T.ShortType(), "smallint"),
    (T.IntegerType(), "integer"), (T.LongType(), "bigint"), (T.FloatType(), "real"),
    (T.DoubleType(), "double precision"), (T.DecimalType(12, 3), "numeric(12,3)"), (T.StringType(), "text"),
    (T.BinaryType(), "bytea"), (T.DateType(), "date"), (T.TimestampType(), "timestamptz"),
    (T.TimestampNTZType(), "timestamp"), (T.DayTimeIntervalType(), "interval"),
    (T.ArrayType(T.StringType()), "text[]"), (T.ArrayType(T.LongType()), "bigint[]"),
    (T.ArrayType(T.TimestampType()), "timestamptz[]"), (T.ArrayType(T.ArrayType(T.LongType())), "jsonb"),
    (T.ArrayType(T.StructType([T.StructField("a", T.LongType())])), "jsonb"),
    (T.StructType([T.StructField("a", T.LongType())]), "jsonb"), (T.MapType(T.StringType(), T.LongType()), "jsonb"),
])
def test_type_mapping(spark_type, pg):
    assert pg_type(spark_type) == pg


def test_unsupported_type_is_named():
    with pytest.raises(SinkError, match=r"postgres sink: no PostgreSQL type for Spark type interval year to month;"
                                        r" cast the column to a supported type"):
        pg_type(T.YearMonthIntervalType())


def _table(server, name: str) -> str:
    return f"{server.url}/{name}"


def _writer(server, table: str, sink_id: str | None = None) -> PostgresBatchWriter:
    # The progress table is shared by every sink in the schema: each test uses sink ids of its own.
    return PostgresBatchWriter(parse_postgres_url(_table(server, table)), sink_id=sink_id or f"test-{table}")


def test_writer_creates_the_table_and_writes_every_type(spark, postgres_server):
    at = datetime(2024, 3, 1, 12, 30, 15, 123456, tzinfo=timezone.utc)
    schema = T.StructType([
        T.StructField("id", T.LongType(), False), T.StructField("ok", T.BooleanType()),
        T.StructField("small", T.ShortType()), T.StructField("i", T.IntegerType()), T.StructField("f", T.FloatType()),
        T.StructField("d", T.DoubleType()), T.StructField("amount", T.DecimalType(10, 2)),
        T.StructField("name", T.StringType()), T.StructField("raw", T.BinaryType()), T.StructField("day", T.DateType()),
        T.StructField("at", T.TimestampType()), T.StructField("local", T.TimestampNTZType()),
        T.StructField("took", T.DayTimeIntervalType()), T.StructField("pages", T.ArrayType(T.StringType())),
        T.StructField("counts", T.ArrayType(T.LongType())),
        T.StructField("meta", T.StructType([T.StructField("k", T.StringType()), T.StructField("when", T.TimestampType())])),
        T.StructField("tags", T.MapType(T.StringType(), T.LongType())),
    ])
    rows = [
        (1, True, 2, 3, 1.5, 2.25, Decimal("12.34"), "a 'quoted', \"odd\" {value}\twith\nlines", b"\x00\x01",
         date(2024, 3, 1), at, datetime(2024, 3, 1, 8, 0), timedelta(minutes=90), ["/home", None, "a,b{c}"],
         [1, 2], {"k": "v", "when": at}, {"x": 1}),
        (2, None, None, None, None, None, None, None, None, None, None, None, None, [], None, None, None),
    ]
    df = spark.createDataFrame(rows, schema)
    writer = _writer(postgres_server, "all_types")
    writer(df, 0)

    got = postgres_server.query("SELECT * FROM all_types ORDER BY id")
    assert got[0] == (1, True, 2, 3, 1.5, 2.25, Decimal("12.34"), "a 'quoted', \"odd\" {value}\twith\nlines",
                      b"\x00\x01", date(2024, 3, 1), at, datetime(2024, 3, 1, 8, 0), timedelta(minutes=90),
                      ["/home", None, "a,b{c}"], [1, 2], {"k": "v", "when": "2024-03-01T12:30:15.123456+00:00"},
                      {"x": 1})
    assert got[1] == (2,) + (None,) * 12 + ([],) + (None,) * 3
    types = dict(postgres_server.query(
        "SELECT column_name, format_type(atttypid, atttypmod) FROM information_schema.columns c"
        " JOIN pg_attribute a ON a.attrelid = 'all_types'::regclass AND a.attname = c.column_name"
        " WHERE c.table_name = 'all_types'"))
    assert types == {
        "id": "bigint", "ok": "boolean", "small": "smallint", "i": "integer", "f": "real", "d": "double precision",
        "amount": "numeric(10,2)", "name": "text", "raw": "bytea", "day": "date", "at": "timestamp with time zone",
        "local": "timestamp without time zone", "took": "interval", "pages": "text[]", "counts": "bigint[]",
        "meta": "jsonb", "tags": "jsonb",
    }
    assert postgres_server.query("SELECT is_nullable FROM information_schema.columns WHERE table_name = 'all_types'"
                                 " AND column_name = 'id'") == [("NO",)]


def test_a_replayed_batch_is_skipped_and_new_batches_are_written(spark, postgres_server, caplog):
    caplog.set_level(logging.DEBUG, logger="sparkstate")
    at = datetime(2024, 1, 1, tzinfo=timezone.utc)
    batch = spark.createDataFrame([("u1", 1, ["/a"], at), ("u2", 2, ["/b", "/c"], at)], SCHEMA)
    writer = _writer(postgres_server, "replays", sink_id="replays@q1")
    writer(batch, 0)
    writer(batch, 0)  # the replay of batch 0: skipped
    assert postgres_server.query("SELECT user_id, n, pages FROM replays ORDER BY n") == [
        ("u1", 1, ["/a"]), ("u2", 2, ["/b", "/c"])]
    assert postgres_server.query(f"SELECT sink_id, batch_id, row_count FROM {PROGRESS_TABLE}"
                                 " WHERE sink_id = 'replays@q1'") == [("replays@q1", 0, 2)]
    assert any("batch 0 of replays@q1 was already committed; skipped (replay)" in m for m in caplog.messages)

    writer(batch, 1)  # the same rows in a new batch are new rows
    writer(spark.createDataFrame([], SCHEMA), 2)  # an empty batch leaves no trace
    assert postgres_server.query("SELECT count(*) FROM replays") == [(4,)]
    assert postgres_server.query(f"SELECT batch_id FROM {PROGRESS_TABLE} WHERE sink_id = 'replays@q1'"
                                 " ORDER BY batch_id") == [(0,), (1,)]
    # Another stream (sink id) into the same table has batch ids of its own.
    _writer(postgres_server, "replays", sink_id="replays@q2")(batch, 0)
    assert postgres_server.query("SELECT count(*) FROM replays") == [(6,)]


def test_two_writers_racing_on_one_batch_write_it_once(spark, postgres_server):
    batch = spark.createDataFrame([("u1", 1, ["/a"], None)], SCHEMA)
    arrow, schema = batch.toArrow(), batch.schema
    writer = _writer(postgres_server, "race", sink_id="race")
    writer.prepare(schema)
    start = threading.Barrier(4)
    results: list[int | None] = []

    def attempt() -> None:
        start.wait()
        results.append(writer.write_arrow(arrow, schema, "race", 0))

    threads = [threading.Thread(target=attempt) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sorted(results, key=str) == [1, None, None, None]
    assert postgres_server.query("SELECT count(*) FROM race") == [(1,)]


def test_stream_into_postgres_exactly_once_across_a_replayed_batch(spark, postgres_server, tmp_path, caplog):
    caplog.set_level(logging.DEBUG, logger="sparkstate")
    landing, ck = LandingDir(tmp_path / "in"), tmp_path / "ck"
    base = datetime(2024, 1, 1, tzinfo=timezone.utc)

    def rows(k: int, n: int) -> list[dict]:
        return [{"user_id": f"u{i % 3}", "n": i, "pages": [f"/p{i}"], "at": base + timedelta(seconds=i)}
                for i in range(100 * k, 100 * k + n)]

    for k in range(3):
        landing.add(rows(k, 3))
    spec = parse_sink(f"postgres:{postgres_server.url}/public.events")

    def run():
        q = start_sink(landing.stream(spark, SCHEMA), spec, checkpoint=ck, trigger="200 milliseconds")
        q.processAllAvailable()
        q.stop()
        return q

    first = run()
    sink_id = f"public.events@{first.id}"
    assert postgres_server.query(f"SELECT batch_id, row_count FROM {PROGRESS_TABLE} WHERE sink_id = %s"
                                 " ORDER BY batch_id", (sink_id,)) == [(0, 3), (1, 3), (2, 3)]

    replayed = drop_last_commit(ck)  # as if the driver died after the postgres commit of batch 2
    landing.add(rows(3, 4))
    second = run()
    assert second.id == first.id  # same checkpoint, same query, same sink id
    # Spark re-ran batch 2 in full (3 input rows); the sink found it committed and skipped it.
    assert [(p["batchId"], p["numInputRows"]) for p in second.recentProgress][:2] == [(replayed, 3), (replayed + 1, 4)]
    assert any(f"batch {replayed} of {sink_id} was already committed; skipped (replay)" in m for m in caplog.messages)

    want = sorted((r["user_id"], r["n"], r["pages"], r["at"]) for k, n in ((0, 3), (1, 3), (2, 3), (3, 4))
                  for r in rows(k, n))
    assert sorted(postgres_server.query("SELECT user_id, n, pages, at FROM public.events")) == want
    assert postgres_server.query(f"SELECT batch_id, row_count FROM {PROGRESS_TABLE} WHERE sink_id = %s"
                                 " ORDER BY batch_id", (sink_id,)) == [(0, 3), (1, 3), (2, 3), (3, 4)]
    # The password was used, and shown nowhere.
    assert postgres_server.password not in caplog.text
    assert f"postgresql://{postgres_server.user}:***@" in caplog.text


def test_credentials_from_the_environment_and_a_password_file(spark, postgres_server, tmp_path, monkeypatch):
    batch = spark.createDataFrame([("u1", 1, None, None)], SCHEMA)
    no_password = f"{postgres_server.url_without_password}/creds"
    monkeypatch.setenv("PGPASSWORD", postgres_server.password)
    PostgresBatchWriter(parse_postgres_url(no_password), sink_id="env")(batch, 0)
    monkeypatch.delenv("PGPASSWORD")
    secret = tmp_path / "pw"
    secret.write_text(postgres_server.password + "\n")
    monkeypatch.setenv("SPARKSTATE_PG_PASSWORD_FILE", str(secret))
    PostgresBatchWriter(parse_postgres_url(no_password), sink_id="file")(batch, 0)
    assert postgres_server.query("SELECT count(*) FROM creds") == [(2,)]

    monkeypatch.setenv("SPARKSTATE_PG_PASSWORD_FILE", str(tmp_path / "missing"))
    with pytest.raises(SinkError, match=r"postgres sink: cannot read the password file"
                                        r" SPARKSTATE_PG_PASSWORD_FILE='.*missing': No such file or directory"):
        PostgresBatchWriter(parse_postgres_url(no_password), sink_id="file")(batch, 1)


def test_a_wrong_password_fails_at_start_without_showing_it(spark, postgres_server, tmp_path, caplog):
    caplog.set_level(logging.DEBUG)
    wrong = "Wr0ng-S3cret-" + "x" * 8
    spec = parse_sink(f"postgres:postgresql://{postgres_server.user}:{wrong}@{postgres_server.host}:"
                      f"{postgres_server.port}/{postgres_server.dbname}/events")
    stream = LandingDir(tmp_path / "in").stream(spark, SCHEMA)
    with pytest.raises(SinkError) as err:
        start_sink(stream, spec, checkpoint=tmp_path / "ck")
    text = str(err.value)
    assert text.startswith(f"postgres sink postgresql://{postgres_server.user}:***@127.0.0.1:{postgres_server.port}"
                           f"/{postgres_server.dbname}/events: connecting failed: OperationalError:")
    assert "password authentication failed" in text
    assert wrong not in text and wrong not in repr(err.value) and wrong not in caplog.text
    assert spark.streams.active == []


def test_a_password_changed_while_running_fails_the_query_without_showing_it(spark, postgres_server, tmp_path,
                                                                             caplog):
    caplog.set_level(logging.DEBUG)
    landing = LandingDir(tmp_path / "in")
    landing.add([{"user_id": "u1", "n": 1}])
    spec = parse_sink(f"postgres:{postgres_server.url}/rotated")
    query = start_sink(landing.stream(spark, SCHEMA), spec, checkpoint=tmp_path / "ck")
    query.processAllAvailable()
    with postgres_server.connect() as admin:  # stays logged in while the password changes
        try:
            admin.execute(f"ALTER ROLE {postgres_server.user} PASSWORD 'rotated-elsewhere'")
            landing.add([{"user_id": "u2", "n": 2}])
            with pytest.raises(Exception) as err:
                query.awaitTermination(60)
        finally:
            admin.execute(f"ALTER ROLE {postgres_server.user} PASSWORD '{postgres_server.password}'")
            query.stop()
    text = str(err.value)
    assert "SinkError: postgres sink postgresql://sparkstate:***@" in text
    assert "writing batch 1 failed: OperationalError" in text and "password authentication failed" in text
    assert postgres_server.password not in text and postgres_server.password not in caplog.text
    assert postgres_server.query("SELECT n FROM rotated") == [(1,)]


def test_an_existing_table_must_have_the_streams_columns(spark, postgres_server, tmp_path):
    postgres_server.execute("CREATE TABLE narrow (user_id text, extra int DEFAULT 7)")
    stream = LandingDir(tmp_path / "in").stream(spark, SCHEMA)
    with pytest.raises(SinkError, match=r"the table exists but lacks the columns \['n', 'pages', 'at'\] of the"
                                        r" stream .*; add them \(ALTER TABLE \.\.\. ADD COLUMN\) or write to"
                                        r" another table"):
        start_sink(stream, f"postgres:{postgres_server.url}/narrow", checkpoint=tmp_path / "ck")
    # Extra table columns are fine: they get their defaults.
    postgres_server.execute("CREATE TABLE wide (user_id text, n bigint, pages text[], at timestamptz, extra int DEFAULT 7)")
    _writer(postgres_server, "wide")(spark.createDataFrame([("u", 1, None, None)], SCHEMA), 0)
    assert postgres_server.query("SELECT user_id, extra FROM wide") == [("u", 7)]


def test_missing_psycopg_names_the_extra(spark, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "psycopg", None)  # import psycopg -> ImportError
    stream = LandingDir(tmp_path / "in").stream(spark, SCHEMA)
    with pytest.raises(SinkError, match=r"the postgres sink needs psycopg 3, which is not installed:"
                                        r" pip install 'sparkstate\[postgres\]'"):
        start_sink(stream, "postgres:postgresql://localhost/db/t", checkpoint=tmp_path / "ck")
