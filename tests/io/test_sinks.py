"""Sink specs, and the console, memory, parquet and json sinks on real Spark streams."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from sparkstate.errors import ConfigError
from sparkstate.io.sinks import ACCEPTED_FORMS, SinkSpec, parse_sink, start_sink
from tests.io.replay import drop_last_commit
from tests.streams import LandingDir

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = "user_id string, n long"


# --- parsing ---------------------------------------------------------------------------------

@pytest.mark.parametrize("text, expected", [
    ("console", SinkSpec("console")),
    ("  CONSOLE ", SinkSpec("console")),
    ("memory", SinkSpec("memory")),
    ("memory:sessions_1", SinkSpec("memory", name="sessions_1")),
    ("parquet:/data/out", SinkSpec("parquet", path="/data/out")),
    ("parquet:relative/dir", SinkSpec("parquet", path="relative/dir")),
    ("json:/data/out/", SinkSpec("json", path="/data/out/")),
    ("json:s3a://bucket/prefix", SinkSpec("json", path="s3a://bucket/prefix")),
    ("postgres:postgresql://app@db.local:5433/shop/sessions",
     SinkSpec("postgres", url="postgresql://app@db.local:5433/shop", table="sessions")),
    ("postgres:postgres://db/shop/analytics.sessions?sslmode=require",
     SinkSpec("postgres", url="postgres://db/shop?sslmode=require", table="analytics.sessions")),
    ("postgres:postgresql:///shop/sessions", SinkSpec("postgres", url="postgresql:///shop", table="sessions")),
])
def test_parse_each_kind(text, expected):
    spec = parse_sink(text)
    assert spec == expected
    assert parse_sink(str(spec)) == spec  # str() is a spec again


def test_postgres_password_is_kept_but_never_shown():
    spec = parse_sink("postgres:postgresql://app:p%40ss%3Aw0rd@db:5432/shop/sessions")
    assert spec.password == "p@ss:w0rd"
    assert spec.url == "postgresql://app@db:5432/shop"
    for shown in (str(spec), repr(spec), repr(spec.postgres_target)):
        assert "p@ss" not in shown and "p%40ss" not in shown
    assert str(spec) == "postgres:postgresql://app:***@db:5432/shop/sessions"
    # Same target without the password compares equal (the password is not part of identity).
    assert spec == parse_sink("postgres:postgresql://app@db:5432/shop/sessions")


def test_deadletter_defaults():
    assert parse_sink("parquet:/out").deadletter_default == "/out/_deadletter"
    assert parse_sink("json:out/").deadletter_default == "out/_deadletter"
    assert parse_sink("parquet:/out").deadletter_sink == SinkSpec("parquet", path="/out/_deadletter")
    for text in ("console", "memory", "memory:x", "postgres:postgresql://h/db/t"):
        assert parse_sink(text).deadletter_default is None
        assert parse_sink(text).deadletter_sink is None


@pytest.mark.parametrize("text, message", [
    ("", "sink: empty spec; expected one of: "),
    ("   ", "sink: empty spec"),
    ("ftp:localhost:9092/t", "sink: unknown sink 'ftp' in 'ftp:localhost:9092/t'"),
    ("kafka:localhost:9092", "'kafka' needs the brokers and one topic"),
    ("kafka:localhost:9092/a,b", "'kafka' needs the brokers and one topic"),
    ("kafka:nohost/t", "Kafka brokers are host:port"),
    ("delta:", "'delta' needs the table's directory"),
    ("/tmp/out", "unknown sink '/tmp/out'"),
    ("console:wide", "'console' takes no argument in 'console:wide'"),
    ("memory:my-table", "the memory sink's NAME must be a table name (letters, digits, _), got 'my-table'"),
    ("memory:", "the memory sink's NAME must be a table name"),
    ("parquet:", "'parquet' needs an output directory, as parquet:DIR"),
    ("json:  ", "'json' needs an output directory, as json:DIR"),
    ("postgres:", "'postgres' needs a URL with the table"),
    ("postgres:mysql://h/db/t", "postgres sink: the URL must start with postgresql://"),
    ("postgres:h:5432/db/t", "the URL must start with postgresql://"),
    ("postgres:postgresql://h/db", "the path must be /DATABASE/TABLE"),
    ("postgres:postgresql://h/db/", "the path must be /DATABASE/TABLE"),
    ("postgres:postgresql://h/db/s/t", "the path must be /DATABASE/TABLE"),
    ("postgres:postgresql://h/db/1table", "the table '1table' must be NAME or SCHEMA.NAME"),
    ("postgres:postgresql://h/db/a.b.c", "the table 'a.b.c' must be NAME or SCHEMA.NAME"),
    ("postgres:postgresql://h/db/t;drop", "the table 't;drop' must be NAME or SCHEMA.NAME"),
    ("postgres:postgresql://h:port/db/t", "postgres sink: unreadable URL"),
    ("postgres:postgresql://h/db/t#frag", "unexpected '#' fragment"),
])
def test_bad_specs_name_the_accepted_forms(text, message):
    with pytest.raises(ConfigError) as err:
        parse_sink(text)
    assert message in str(err.value)
    assert "postgresql://[USER[:PASSWORD]@]HOST[:PORT]/DATABASE/[SCHEMA.]TABLE" in str(err.value)
    if not text.startswith("postgres:") or text == "postgres:":
        assert ACCEPTED_FORMS in str(err.value)


def test_bad_postgres_spec_does_not_echo_the_password():
    with pytest.raises(ConfigError) as err:
        parse_sink("postgres:postgresql://app:hunter2@db/shop")  # no table
    assert "hunter2" not in str(err.value)
    assert "postgresql://app:***@db/shop" in str(err.value)


def test_non_string_spec_and_hand_built_specs():
    with pytest.raises(ConfigError, match=r"sink: expected a spec string \(console \| memory .*\), got int"):
        parse_sink(42)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="SinkSpec: kind must be one of console, parquet, json, postgres, memory,"
                                          " delta, kafka, got 'ftp'"):
        SinkSpec("ftp")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="SinkSpec: a kafka sink needs url="):
        SinkSpec("kafka")
    with pytest.raises(ConfigError, match=r"SinkSpec: a parquet sink needs path=\.\.\."):
        SinkSpec("parquet")
    with pytest.raises(ConfigError, match="SinkSpec: a postgres sink needs table="):
        SinkSpec("postgres", url="postgresql://h/db")


# --- start_sink: refused before anything starts ---------------------------------------------------

@pytest.fixture
def stream(spark, tmp_path):
    landing = LandingDir(tmp_path / "in")
    return landing.stream(spark, SCHEMA)


def test_start_sink_refuses_bad_arguments(spark, stream, tmp_path):
    static = spark.createDataFrame([("u", 1)], SCHEMA)
    with pytest.raises(ConfigError, match=r"start_sink\(console\): expected a streaming DataFrame"
                                          r" \(spark.readStream...\), got a static DataFrame; write it with df.write"):
        start_sink(static, parse_sink("console"))
    with pytest.raises(ConfigError, match=r"output_mode must be 'append' or 'update', got 'complete'"):
        start_sink(stream, "console", output_mode="complete")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"start_sink\(parquet:/x\): a parquet sink needs checkpoint=DIR"):
        start_sink(stream, parse_sink("parquet:/x"))
    with pytest.raises(ConfigError, match=r"a postgres sink needs checkpoint=DIR"):
        start_sink(stream, parse_sink("postgres:postgresql://h/db/t"))
    with pytest.raises(ConfigError, match=r"trigger: expected a duration such as '1 minute'.*got 'soon'"):
        start_sink(stream, "console", trigger="soon")
    with pytest.raises(ConfigError, match=r"trigger: expected a positive duration"):
        start_sink(stream, "console", trigger=0)
    with pytest.raises(ConfigError, match=r"the memory sink's table is the query name; got the name 'a' in the"
                                          r" spec and query_name='b'; give one"):
        start_sink(stream, "memory:a", query_name="b")
    assert spark.streams.active == []


def _stream_to(spark, landing: LandingDir, spec: str, ck: Path, **kw):
    query = start_sink(landing.stream(spark, SCHEMA), parse_sink(spec), checkpoint=ck, **kw)
    query.processAllAvailable()
    return query


def test_file_sink_refuses_used_directory_with_new_checkpoint(spark, tmp_path):
    landing = LandingDir(tmp_path / "in")
    landing.add([{"user_id": "u1", "n": 1}])
    out = tmp_path / "out"
    _stream_to(spark, landing, f"parquet:{out}", tmp_path / "ck1").stop()
    with pytest.raises(ConfigError) as err:
        start_sink(landing.stream(spark, SCHEMA), f"parquet:{out}", checkpoint=tmp_path / "ck2")
    assert str(err.value) == (
        f"parquet:{out}: the directory already holds output of another query (batches up to 0) but the checkpoint"
        f" '{tmp_path / 'ck2'}' is new, so the new query's first batches would be skipped as already written; use"
        " an empty output directory, or the checkpoint that wrote it")
    with pytest.raises(ConfigError, match=r"in update mode batches go to .*/batch_id=N, but this directory holds"
                                          r" append-mode output \(_spark_metadata\)"):
        start_sink(landing.stream(spark, SCHEMA), f"parquet:{out}", checkpoint=tmp_path / "ck1", output_mode="update")
    # The checkpoint that wrote it may go on.
    start_sink(landing.stream(spark, SCHEMA), f"parquet:{out}", checkpoint=tmp_path / "ck1").stop()
    # A memory sink cannot recover from a checkpoint: said up front.
    with pytest.raises(ConfigError, match=r"memory sink: the checkpoint .* holds an earlier run, and Spark's memory"
                                          r" sink cannot recover from a checkpoint"):
        start_sink(landing.stream(spark, SCHEMA), "memory:m", checkpoint=tmp_path / "ck1")


# --- file sinks: complete and exactly once across a restart ---------------------------------------

def _rows(n0: int, n: int) -> list[dict]:
    return [{"user_id": f"u{i % 3}", "n": i} for i in range(n0, n0 + n)]


@pytest.mark.parametrize("fmt", ["parquet", "json"])
def test_file_sink_exactly_once_across_a_replayed_batch(spark, tmp_path, fmt):
    landing, out, ck = LandingDir(tmp_path / "in"), tmp_path / "out", tmp_path / "ck"
    for k in range(3):
        landing.add(_rows(10 * k, 4))
    _stream_to(spark, landing, f"{fmt}:{out}", ck).stop()
    assert sorted(r.n for r in spark.read.format(fmt).load(str(out)).collect()) == sorted(
        [i for k in range(3) for i in range(10 * k, 10 * k + 4)])

    replayed = drop_last_commit(ck)  # batch 2 was written, Spark "forgot" it: the restart re-runs it
    landing.add(_rows(100, 5))
    query = _stream_to(spark, landing, f"{fmt}:{out}", ck)
    query.stop()
    # Spark re-ran batch 2 (read its 4 rows again); the file sink found it in _spark_metadata and did not
    # write it again.
    assert [(p["batchId"], p["numInputRows"]) for p in query.recentProgress][:2] == [(replayed, 4), (replayed + 1, 5)]

    back = spark.read.format(fmt).schema(SCHEMA).load(str(out)).collect()
    want = sorted([i for k in range(3) for i in range(10 * k, 10 * k + 4)] + list(range(100, 105)))
    assert sorted(r.n for r in back) == want  # complete, and no duplicates of the replayed batch
    assert {(r.user_id, r.n) for r in back} == {(f"u{i % 3}", i) for i in want}


def test_file_sink_update_mode_writes_one_directory_per_batch_exactly_once(spark, tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="sparkstate")
    landing, out, ck = LandingDir(tmp_path / "in"), tmp_path / "out", tmp_path / "ck"
    landing.add(_rows(0, 3))
    landing.add(_rows(10, 2))
    _stream_to(spark, landing, f"parquet:{out}", ck, output_mode="update").stop()
    assert sorted(p.name for p in out.iterdir() if not p.name.startswith("_")) == ["batch_id=0", "batch_id=1"]

    replayed = drop_last_commit(ck)
    landing.add(_rows(20, 1))
    _stream_to(spark, landing, f"parquet:{out}", ck, output_mode="update").stop()
    assert f"parquet:{out}: batch {replayed} was already written; skipped (replay)" in caplog.messages

    back = spark.read.parquet(str(out)).collect()
    by_batch: dict[int, set[int]] = {}
    for r in back:
        by_batch.setdefault(r.batch_id, set()).add(r.n)
    assert len(back) == 6  # no duplicates
    # One file per batch (two files with the same mtime may be read in either order).
    assert sorted(sorted(ns) for ns in by_batch.values()) == [[0, 1, 2], [10, 11], [20]]
    assert sorted(by_batch) == [0, 1, 2] and by_batch[2] == {20}
    assert list((out / "_sparkstate_tmp").iterdir()) == []  # every batch was moved into place
    with pytest.raises(ConfigError, match=r"this directory holds update-mode output \(batch_id=N directories\)"):
        start_sink(landing.stream(spark, SCHEMA), f"parquet:{out}", checkpoint=ck)


# --- memory and console ---------------------------------------------------------------------------

def test_memory_sink_is_a_queryable_table(spark, tmp_path):
    landing = LandingDir(tmp_path / "in")
    landing.add(_rows(0, 3))
    query = start_sink(landing.stream(spark, SCHEMA), "memory", query_name="sink_test_rows")
    query.processAllAvailable()
    query.stop()
    assert query.name == "sink_test_rows"
    assert sorted(r.n for r in spark.table("sink_test_rows").collect()) == [0, 1, 2]


def test_console_sink_prints_whole_values(tmp_path):
    # The console sink prints from the JVM to the process's stdout: run it in a process of its own.
    landing = LandingDir(tmp_path / "in")
    long_value = "/a/very/long/page/path/that/spark/would/otherwise/cut/at/twenty/characters"
    landing.add([{"user_id": long_value, "n": 7}])
    script = textwrap.dedent(f"""
        import sparkstate as ss
        from sparkstate.io.sinks import start_sink
        spark = ss.spark_session(master="local[1]")
        df = spark.readStream.schema({SCHEMA!r}).json({str(landing.path)!r})
        q = start_sink(df, "console")
        q.processAllAvailable()
        q.stop()
    """)
    env = dict(os.environ, SPARKSTATE_SPARK_LOG_LEVEL="ERROR")
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, env=env,
                         cwd=ROOT)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "Batch: 0" in res.stdout
    assert f"|{long_value}|7  |" in res.stdout
