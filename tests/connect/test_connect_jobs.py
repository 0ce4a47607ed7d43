"""Jobs over Spark Connect: ``sparkstate run``/``state`` with ``--remote`` (and from the
variable), every sink and dead-letter sink, and a client killed mid-run, against a real server."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path

import pandas as pd
import pyarrow.dataset as ds
import pytest

from sparkstate.jobs import JobConfig, run_pipeline
from sparkstate.synthetic import Session, generate_events, read_events, reference_sessions, write_events
from tests.io.pg import postgres_server  # noqa: F401  (a session-scoped fixture)
from tests.pipelines.test_sessionize_order import Landing
from tests.streams import source_scans

GAP = "1 minute"
MALFORMED = '{"user_id": "user-000", "event_time": "2024-01-01T00:00:01.000Z", "data": "/x"\n'


def cli(*args: str, env: dict | None = None) -> str:
    """``sparkstate ARGS`` in a process of its own (a client that starts no Spark); its output."""
    done = subprocess.run([sys.executable, "-m", "sparkstate.cli", *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return done.stdout


def _final_watermark(metrics: Path) -> datetime:
    last = [json.loads(line) for line in metrics.read_text().splitlines()][-1]["watermark"]
    return datetime.fromisoformat(last.replace("Z", "+00:00")).astimezone(timezone.utc)


def test_run_and_state_with_remote_restarted_exactly(spark, connect_url, tmp_path):
    events = generate_events(300, users=6, seed=22)
    files = write_events(events, tmp_path / "in", files=3)
    later = files[2:]
    for f in later:  # held back until the restart
        f.rename(tmp_path / f.name)
    (tmp_path / "in" / "part-00009.json").write_text(MALFORMED)
    out, ck, metrics = tmp_path / "out", tmp_path / "ck", tmp_path / "metrics.jsonl"
    args = ["run", "sessionize", "--source", f"files:{tmp_path / 'in'}", "--format", "json",
            "--sink", f"parquet:{out}", "--checkpoint", str(ck), "--gap", GAP, "--time-mode", "event",
            "--watermark", "0 seconds", "--once", "--metrics", str(metrics), "--no-progress"]
    assert "caught up (--once)" in cli(*args, "--remote", connect_url)
    for f in later:
        (tmp_path / f.name).rename(tmp_path / "in" / f.name)
    cli(*args, env={"SPARKSTATE_REMOTE": connect_url})  # the restart names the server by the variable
    assert not (ck / "spark.log").exists()  # no Spark was started on this side

    written = Counter(Session.from_row(r) for r in spark.read.parquet(str(out)).collect())
    final = _final_watermark(metrics)
    expected = Counter(reference_sessions(read_events(files), GAP, watermark=final))
    assert written == expected and sum(written.values()) > 20
    assert sorted(p.name for p in out.iterdir() if p.name.startswith("batch_id="))  # over Connect: a directory per batch
    # Staged beside the server and moved into place: pandas and pyarrow read the same rows.
    assert len(pd.read_parquet(out)) == len(ds.dataset(out, partitioning="hive").to_table()) == sum(written.values())
    assert (out / "_sparkstate_tmp").is_dir() and [p for p in (out / "_sparkstate_tmp").rglob("*") if p.is_file()] == []
    dead = spark.read.parquet(str(out / "_deadletter")).collect()
    assert [(r.reason, r.raw) for r in dead] == [("not valid JSON", MALFORMED.rstrip("\n"))]

    still_open = set(reference_sessions(read_events(files), GAP)) - set(expected)
    shown = [json.loads(line) for line in cli("state", "show", str(ck), "--json", "--limit", "0",
                                               "--remote", connect_url).splitlines()]
    assert len(shown) == len({s.user_id for s in still_open}) > 0
    assert f"keys: {len(shown)}" in cli("state", "stats", str(ck), env={"SPARKSTATE_REMOTE": connect_url})


def test_a_two_read_checkpoint_on_a_store_only_the_server_reaches_goes_on_reading_twice(spark, tmp_path,
                                                                                       monkeypatch, caplog):
    """A checkpoint of a job that read its input twice (every job before 2026-11-28), on a store
    the client cannot reach (here a viewfs:// mount of the server's Hadoop; a dbfs:/ or hdfs://
    path from a laptop): the server reads its offset log for the client, and the job goes on with
    two reads. Before, the client took it for a new checkpoint, planned one read, and Spark
    stopped the query ("There are [2] sources in the checkpoint offsets"). A new checkpoint there
    gets one read. Sessions and dead letters are the reference's. The job marker is the server's to
    write and read there: another pipeline on the checkpoint is refused."""
    from dataclasses import replace

    from sparkstate import fs
    from sparkstate.errors import StateSchemaError
    from sparkstate.jobs.marker import check_checkpoint
    from sparkstate.jobs.pipelines import JOB_PIPELINES
    from tests.connect.server import server_only

    def run(ck: Path, out: Path, metrics: Path) -> None:
        result = run_pipeline(spark, JobConfig(
            "sessionize", source=f"files:{tmp_path / 'in'}", format="json", sink=f"parquet:{out}",
            checkpoint=server_only(ck), gap=GAP, time_mode="event", watermark="0 seconds", once=True,
            metrics=str(metrics), trigger="200 milliseconds"))
        assert result.batches > 0

    with pytest.raises(fs.FsUnavailable):  # the client has no way to the store
        fs.exists(server_only(tmp_path), spark)
    events = generate_events(200, users=5, seed=31)
    files = write_events(events, tmp_path / "in", files=2)
    later = files[1].rename(tmp_path / files[1].name)
    (tmp_path / "in" / "part-00008.json").write_text(MALFORMED)
    sessionize = JOB_PIPELINES["sessionize"]
    assert sessionize.refusals is not None
    out, ck, metrics = tmp_path / "out", tmp_path / "ck", tmp_path / "metrics.jsonl"
    with monkeypatch.context() as m:  # the job as it was: the pipeline does not take the malformed records
        m.setitem(JOB_PIPELINES, "sessionize", replace(sessionize, refusals=replace(sessionize.refusals,
                                                                                     malformed=None)))
        run(ck, out, metrics)
    assert source_scans(ck) == {2}
    later.rename(files[1])
    (tmp_path / "in" / "part-00009.json").write_text(MALFORMED)
    run(ck, out, metrics)
    assert source_scans(ck) == {2}
    expected = Counter(reference_sessions(read_events(files), GAP, watermark=_final_watermark(metrics)))
    assert Counter(Session.from_row(r) for r in spark.read.parquet(str(out)).collect()) == expected
    assert sum(expected.values()) > 10
    dead = spark.read.parquet(str(out / "_deadletter")).collect()
    assert [(r.reason, r.raw) for r in dead] == [("not valid JSON", MALFORMED.rstrip("\n"))] * 2

    fresh = tmp_path / "fresh"
    run(fresh / "ck", fresh / "out", fresh / "metrics.jsonl")
    assert source_scans(fresh / "ck") == {1}
    expected = Counter(reference_sessions(read_events(files), GAP, watermark=_final_watermark(fresh / "metrics.jsonl")))
    assert Counter(Session.from_row(r) for r in spark.read.parquet(str(fresh / "out")).collect()) == expected
    assert len(spark.read.parquet(str(fresh / "out" / "_deadletter")).collect()) == 2

    # The job marker, written and read by the server there: another pipeline, or sessionize in the
    # other time mode, is refused before anything is written.
    ((marker,),) = [list((fresh / "ck" / "sparkstate-job").glob("part-*"))]
    assert json.loads(marker.read_text()) == {"pipeline": "sessionize", "time_mode": "event"}
    for other, refused in ((dict(pipeline="running-count"), "belongs to a sessionize job"),
                           (dict(pipeline="sessionize", gap=GAP, time_mode="processing"), "holds event-time sessionize state")):
        with pytest.raises(StateSchemaError, match=refused):
            run_pipeline(spark, JobConfig(**other, source=f"files:{tmp_path / 'in'}", format="json",
                                          sink=f"parquet:{tmp_path / 'other'}", checkpoint=server_only(fresh / "ck"),
                                          once=True))
    assert not (tmp_path / "other").exists()
    # A checkpoint whose marker a job that reached the store directly wrote: not seen through the
    # server, and the job says so.
    (fresh / "ck" / "sparkstate-job").rename(tmp_path / "served-marker")
    (fresh / "ck" / "_sparkstate_job.json").write_text('{"pipeline": "sessionize", "time_mode": "event"}\n')
    with caplog.at_level(logging.WARNING, logger="sparkstate.jobs"):
        check_checkpoint(JobConfig("running-count", source=f"files:{tmp_path / 'in'}", format="json",
                                   sink=f"parquet:{tmp_path / 'other'}", checkpoint=server_only(fresh / "ck")), spark)
    assert "the job marker of" in caplog.text and "was not checked" in caplog.text


def _counts(words: list[str]) -> dict[str, int]:
    return dict(Counter(words))


def _last_counts(rows) -> dict[str, int]:
    best: dict[str, int] = {}
    for word, n in rows:
        best[word] = max(best.get(word, 0), n)
    return best


@pytest.mark.timeout(900)
def test_every_sink_and_dead_letter_sink(spark, tmp_path, postgres_server, kafka_broker):  # noqa: F811
    import psycopg

    from sparkstate.io.delta import read_delta

    words = ["a", "b", "a", "c", "a", "b", "d"]
    landing = Landing(tmp_path / "in")
    landing.add([{"word": w} for w in words[:4]])
    landing.add([{"word": w} for w in words[4:]])
    (tmp_path / "in" / "zz-bad.json").write_text('{"word": 7\n')
    want = _counts(words)
    pg = postgres_server.url
    topic = f"counts-{os.getpid()}"
    kafka_broker.create_topic(topic, 1)
    runs = {
        "json": (f"json:{tmp_path / 'o_json'}", f"delta:{tmp_path / 'd_delta'}"),
        "delta": (f"delta:{tmp_path / 'o_delta'}", f"postgres:{pg}/dead_letters"),
        "postgres": (f"postgres:{pg}/word_counts", f"json:{tmp_path / 'd_json'}"),
        "kafka": (f"kafka:{kafka_broker.bootstrap}/{topic}", f"parquet:{tmp_path / 'd_parquet'}"),
    }
    for name, (sink, dead) in runs.items():
        result = run_pipeline(spark, JobConfig("running-count", source=f"files:{tmp_path / 'in'}", format="json",
                                               sink=sink, deadletter=dead, checkpoint=str(tmp_path / f"ck_{name}"),
                                               once=True, trigger="200 milliseconds"))
        assert result.dead_letters == 1, name

    assert _last_counts((r.word, r["count"]) for r in spark.read.json(str(tmp_path / "o_json")).collect()) == want
    assert _last_counts(zip(*[read_delta(str(tmp_path / "o_delta")).column(c).to_pylist()
                              for c in ("word", "count")])) == want
    with psycopg.connect(pg) as conn:
        assert _last_counts(conn.execute("SELECT word, count FROM word_counts").fetchall()) == want
        assert [r[0] for r in conn.execute("SELECT reason FROM dead_letters").fetchall()] == [
            "not valid JSON"]
    messages = kafka_broker.consume_all(topic)
    assert _last_counts((json.loads(m.value())["word"], json.loads(m.value())["count"]) for m in messages) == want
    assert all(dict(m.headers())["sparkstate.query_id"] for m in messages)  # read from the checkpoint
    for dead in ("d_json",):
        assert [r.reason for r in spark.read.json(str(tmp_path / dead)).collect()] == ["not valid JSON"]
    assert [r.reason for r in spark.read.parquet(str(tmp_path / "d_parquet")).collect()] == ["not valid JSON"]
    assert read_delta(str(tmp_path / "d_delta")).column("reason").to_pylist() == ["not valid JSON"]


def test_the_memory_sink_is_refused_in_one_line(spark, tmp_path):
    from sparkstate.errors import ConfigError

    (tmp_path / "in").mkdir()
    with pytest.raises(ConfigError, match="over Spark Connect each batch is written on the server; use parquet:DIR"):
        run_pipeline(spark, JobConfig("running-count", source=f"files:{tmp_path / 'in'}", format="json",
                                      sink="memory:counts", deadletter=f"json:{tmp_path / 'dead'}",
                                      checkpoint=str(tmp_path / 'ck'), once=True))


def test_a_client_killed_mid_run_is_taken_over_by_its_restart(spark, connect_url, tmp_path):
    """A killed client leaves its query running in the server. A second client of the checkpoint
    is refused while the first lives; once it is killed, the restart stops the run it left and
    goes on from the checkpoint, exactly."""
    landing = Landing(tmp_path / "in")
    words = [f"w{i % 5}" for i in range(40)]
    for i in range(0, 20, 5):
        landing.add([{"word": w} for w in words[i:i + 5]])
    out, ck = tmp_path / "out", tmp_path / "ck"
    args = [sys.executable, "-m", "sparkstate.cli", "run", "running-count", "--source", f"files:{landing.path}",
            "--format", "json", "--sink", f"parquet:{out}", "--checkpoint", str(ck), "--trigger", "300 milliseconds",
            "--remote", connect_url, "--no-progress"]
    client = subprocess.Popen([*args, "--option", "maxFilesPerTrigger=1"], stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        while not (ck / "commits" / "1").exists():  # two micro-batches committed: the job is mid-run
            assert client.poll() is None, client.stderr.read().decode()[-2000:]
            assert time.monotonic() < deadline, "the job committed no second batch in 240 s"
            time.sleep(0.2)
        second = subprocess.run([*args, "--once"], capture_output=True, text=True, timeout=600)
        assert second.returncode == 1 and client.poll() is None, second.stderr[-3000:]
        errors = [line for line in second.stderr.splitlines() if line.startswith("sparkstate: error")]
        assert len(errors) == 1 and f"is in use: process {client.pid} on this machine runs this job" in errors[0]
        assert "Traceback" not in second.stderr
        os.killpg(client.pid, signal.SIGKILL)
        client.wait(30)
    finally:
        if client.poll() is None:
            os.killpg(client.pid, signal.SIGKILL)
    for i in range(20, 40, 5):  # more input while no client runs
        landing.add([{"word": w} for w in words[i:i + 5]])
    done = subprocess.run([*args, "--once"], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"a run of this job whose client is gone (process {client.pid}) was still running" in done.stderr
    assert "Failed to remove the listener" not in done.stderr  # PySpark's noise at exit: not shown
    rows = spark.read.parquet(str(out)).collect()
    assert _last_counts((r.word, r["count"]) for r in rows) == _counts(words)
    per_batch = Counter((r.batch_id, r.word) for r in rows)
    assert set(per_batch.values()) == {1}  # no batch written twice


def test_a_query_whose_python_process_does_not_connect_back_is_started_again(spark, connect_server_proc, tmp_path):
    """Over Connect the server starts a Python process for each foreachBatch query, and Spark gives
    it a fixed 10 s to connect back: a busy server fails the start. sparkstate starts it again."""
    landing = Landing(tmp_path / "in")
    words = [f"w{i % 3}" for i in range(12)]
    landing.add([{"word": w} for w in words[:6]])
    out, ck = tmp_path / "out", tmp_path / "ck"
    args = [sys.executable, "-m", "sparkstate.cli", "run", "running-count", "--source", f"files:{landing.path}",
            "--format", "json", "--sink", f"parquet:{out}", "--checkpoint", str(ck), "--once",
            "--remote", connect_server_proc.url, "--no-progress"]

    connect_server_proc.python.refuse(3)  # every attempt: one line, and nothing written
    failed = subprocess.run(args, capture_output=True, text=True, timeout=600)
    assert failed.returncode == 1 and connect_server_proc.python.left() == 0, failed.stderr[-3000:]
    errors = [line for line in failed.stderr.splitlines() if line.startswith("sparkstate: error")]
    assert errors == ["sparkstate: error: run running-count did not start: 3 times Spark's Python process for it"
                      " did not connect back within Spark's fixed 10 s; the machine running Spark (or its Connect"
                      " server) is too busy, or its Python cannot start (spark.pyspark.python, PYSPARK_PYTHON)"]
    assert "Traceback" not in failed.stderr and not (ck / "commits").exists()

    landing.add([{"word": w} for w in words[6:]])
    connect_server_proc.python.refuse(1)  # the first attempt fails, the second runs
    done = subprocess.run(args, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and connect_server_proc.python.left() == 0, done.stderr[-3000:]
    assert "starting it again (attempt 2 of 3)" in done.stderr
    rows = spark.read.parquet(str(out)).collect()
    assert _last_counts((r.word, r["count"]) for r in rows) == _counts(words)
    assert set(Counter((r.batch_id, r.word) for r in rows).values()) == {1}
