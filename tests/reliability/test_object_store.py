"""sessionize with its checkpoint and outputs on s3a://, on a real S3-compatible server (S3Proxy on loopback).

``sparkstate run sessionize`` (generator source, event time) keeps its checkpoint, its Delta
output and its Parquet dead letters on ``s3a://``; the S3A jars and the server's settings,
credentials included, reach it only through ``spark-defaults.conf`` (``SPARK_CONF_DIR``).

- A driver kill (SIGKILL of the whole job) and a restart: the output is exact against the
  generator's reference; the state tools read that checkpoint; its export starts a new query on
  ``s3a://`` (``--initial-state``); a job of another pipeline, engine or time mode is refused
  there before anything is written; the secret is in no log line, metrics line or command line.
- An outage of the store during a state commit (issue 26): the server is paused for 30 s
  (SIGSTOP/SIGCONT, see ``tests/io/s3.py``: the objects stay, as they do in a real outage);
  the job fails with one line or rides through; its restart is exact, no batch lost.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pyarrow.dataset as ds
import pyarrow.fs as pafs
import pytest

import sparkstate as ss
from benchmarks.soak import open_users_at
from sparkstate import fs
from sparkstate.errors import StateSchemaError
from sparkstate.io import connectors
from sparkstate.io.delta import committed_version, read_delta
from sparkstate.io.sources import parse_source
from sparkstate.jobs import JobConfig, run_pipeline
from sparkstate.synthetic import Session, reference_sessions, stream_records
from tests.io.s3 import s3_bucket, s3_server  # noqa: F401  (fixtures)
from tests.reliability.crash import MID_COMMIT, NONE, WRITTEN, CrashingJob, PlannedKill, SinkProbe, cli

pytestmark = pytest.mark.reliability

GAP = "1 minute"
USERS = 30
EVENTS = 600
SOURCE = f"generator:rate=0,events={EVENTS},users={USERS},seed=11,malformed=0.03"
BATCH = 300  # records per micro-batch: 2 batches (each costs minutes on a loaded 2-core machine)
RUN_TIMEOUT_S = 1200.0
TEST_TIMEOUT_S = 2400


class S3Checkpoint:
    """The query's logs in the checkpoint on the server (``offsets/N``, ``commits/N``), looked at with pyarrow."""

    def __init__(self, server, uri: str) -> None:
        self.fs = server.arrow()
        self.uri = uri
        self.key = uri.removeprefix("s3a://").rstrip("/")

    def _numbers(self, sub: str) -> list[int]:
        infos = self.fs.get_file_info(pafs.FileSelector(f"{self.key}/{sub}", allow_not_found=True))
        return sorted(int(i.base_name) for i in infos if i.base_name.isdigit())

    def _exists(self, sub: str) -> bool:
        return self.fs.get_file_info(f"{self.key}/{sub}").type != pafs.FileType.NotFound

    def planned(self, n: int) -> bool:
        return self._exists(f"offsets/{n}")

    def committed(self, n: int) -> bool:
        return self._exists(f"commits/{n}")

    def last_planned(self) -> int | None:
        got = self._numbers("offsets")
        return got[-1] if got else None

    def last_committed(self) -> int | None:
        got = self._numbers("commits")
        return got[-1] if got else None

    def read(self, sub: str) -> str:
        with self.fs.open_input_stream(f"{self.key}/{sub}") as f:
            return f.read().decode()

    def end_and_watermark(self, n: int) -> tuple[int, int]:
        """The generator's end index and the watermark of batch ``n`` (its offset log)."""
        lines = [line for line in self.read(f"offsets/{n}").splitlines() if line.strip()]
        return int(json.loads(lines[2])["index"]), int(json.loads(lines[1])["batchWatermarkMs"])

    def state_files(self, version: int) -> int:
        """State files of store version ``version`` (``version``.delta / .changelog / .zip), all partitions."""
        infos = self.fs.get_file_info(pafs.FileSelector(f"{self.key}/state", allow_not_found=True, recursive=True))
        return sum(1 for i in infos if i.type == pafs.FileType.File and i.base_name.split(".")[0] == str(version))


class S3DeltaProbe(SinkProbe):
    """The Delta sink on the server: batch N is in the table when the query's transaction is >= N."""

    name = "delta"

    def __init__(self, table: str, ck: S3Checkpoint, options: dict[str, str]) -> None:
        self.table, self.ck, self.options = table, ck, options

    def state(self, n: int) -> str:
        try:
            query_id = json.loads(self.ck.read("metadata"))["id"]
        except (OSError, ValueError, KeyError):
            return NONE
        done = committed_version(self.table, f"sparkstate:{query_id}", self.options)
        return WRITTEN if done is not None and done >= n else NONE


@dataclasses.dataclass
class S3Job:
    bucket: str
    job: CrashingJob
    ck: S3Checkpoint
    tmp: Path

    @property
    def root(self) -> str:
        return f"s3a://{self.bucket}"


def _s3_job(tmp_path: Path, server, bucket: str, extra_settings: dict[str, str] | None = None) -> S3Job:
    if not connectors.fetched("hadoop-aws"):
        pytest.fail("the S3A jars are not fetched: run `make s3`")
    root = f"s3a://{bucket}"
    conf = server.spark_defaults(tmp_path / "conf", {
        "spark.jars": ",".join(connectors.jars("hadoop-aws")),
        **{f"spark.hadoop.{k}": v for k, v in (extra_settings or {}).items()},
    })
    ck = S3Checkpoint(server, f"{root}/ck")
    options = {k: v for k, v in (fs.storage_options(f"{root}/sessions") or {}).items()}
    probe = S3DeltaProbe(f"{root}/sessions", ck, options)
    args = cli("run", "sessionize", "--source", SOURCE, "--sink", f"delta:{root}/sessions",
               "--deadletter", f"parquet:{root}/dead", "--checkpoint", ck.uri, "--gap", GAP,
               "--time-mode", "event", "--watermark", "0 seconds", "--trigger", "500 milliseconds",
               "--max-batch-records", str(BATCH), "--once", "--no-progress",
               "--metrics", str(tmp_path / "metrics.jsonl"), "--spark-log", str(tmp_path / "spark.log"))
    assert server.secret_key not in " ".join(args)
    job = CrashingJob(args, ck, probe, tmp_path / "job.log", tmp_path, {"SPARK_CONF_DIR": str(conf)})  # type: ignore[arg-type]
    return S3Job(bucket, job, ck, tmp_path)


def _assert_exact(spark, j: S3Job) -> dict:
    """What readers of the Delta table and the dead letters see, against the generator's reference."""
    last = j.ck.last_committed()
    end, watermark = j.ck.end_and_watermark(last)
    records = stream_records(parse_source(SOURCE).generator, 0, end)
    assert end == EVENTS, f"the job stopped at record {end}"
    events = [r.event for r in records if r.is_valid]
    assert watermark == int(max(e.event_time for e in events).timestamp() * 1000)
    expected = Counter(reference_sessions(events, GAP, watermark=watermark))
    options = fs.storage_options(f"{j.root}/sessions", spark)
    got = Counter(Session.from_row(r) for r in read_delta(f"{j.root}/sessions", options).to_pylist())
    dead = Counter(r.raw for r in spark.read.parquet(f"{j.root}/dead").collect())
    bad = Counter(r.line for r in records if not r.is_valid)
    # pyarrow and pandas read the dead letters on the store as Spark does (no file of the killed attempt).
    key = f"{j.root.removeprefix('s3a://')}/dead"
    assert Counter(ds.dataset(key, filesystem=j.ck.fs).to_table().column("raw").to_pylist()) == dead
    assert Counter(pd.read_parquet(key, filesystem=j.ck.fs)["raw"]) == dead
    figures = {"sessions_expected": sum(expected.values()), "sessions_written": sum(got.values()),
               "lost": sum((expected - got).values()), "extra": sum((got - expected).values()),
               "dead_letters": sum(dead.values()), "malformed": sum(bad.values()), "last_batch": last,
               "run_seconds": j.job.seconds}
    print(f"\nobject store figures: {figures}")
    assert figures["lost"] == 0 and figures["extra"] == 0, figures
    assert dead == bad and figures["malformed"] > 10 and figures["sessions_expected"] > 50, figures
    return {"end": end, "watermark": watermark}


def _assert_no_secret(server, j: S3Job) -> None:
    for name in ("job.log", "spark.log", "metrics.jsonl"):
        text = (j.tmp / name).read_text(errors="replace")
        assert text, f"{name} is empty"
        assert server.secret_key not in text, f"the secret key is in {name}"


def _other_engine() -> str | None:
    from sparkstate.engines import DEFAULT_ENGINE, ENGINES

    others = sorted(set(ENGINES) - {DEFAULT_ENGINE})
    return others[0] if others else None


@pytest.mark.timeout(TEST_TIMEOUT_S)
def test_sessionize_on_s3a_survives_a_driver_kill_and_its_tools_work_there(spark, s3_server, s3_bucket, tmp_path):
    started = time.monotonic()
    j = _s3_job(tmp_path, s3_server, s3_bucket)
    # Killed once Delta holds batch N and commits/N is not written yet (else at the next point it can):
    # the restart runs batch N again, and the sink must skip it.
    kill = j.job.run_and_kill(PlannedKill(MID_COMMIT, skip=0, wait_for=WRITTEN), RUN_TIMEOUT_S)
    assert kill is not None, f"the job ended before it was killed; its log ends:\n{j.job.log.read_text()[-3000:]}"
    assert j.job.leftovers() == []
    assert j.job.run_to_end(RUN_TIMEOUT_S) == 0, j.job.log.read_text()[-3000:]
    print(f"\nkilled at {kill.point} of batch {kill.batch} (sink: {kill.sink_state})")
    at = _assert_exact(spark, j)
    _assert_no_secret(s3_server, j)

    # The state tools on the s3a checkpoint (in this process's session: the same code as `sparkstate state`).
    ck = j.ck.uri
    in_state = {r.user_id: r for r in ss.state.read(spark, ck).collect()}
    want = open_users_at(SimpleNamespace(source=SOURCE, gap=GAP, users=USERS), [(at["end"], at["watermark"])])[0]
    assert set(in_state) == want and ss.state.keys(spark, ck) == len(want)
    stats = ss.state.stats(spark, ck)
    assert stats.keys == len(want) and stats.bytes_on_disk > 0 and stats.committed_batches[-1] == j.ck.last_committed()
    assert 0 < sum(p.bytes_on_disk for p in stats.partitions) <= stats.bytes_on_disk  # (+ the operator's metadata)
    assert ss.state.export(spark, ck, f"{j.root}/export") == len(want)

    # The refusals: another pipeline, another time mode, another engine, on the s3a checkpoint.
    offsets_before = j.ck._numbers("offsets")
    base = dict(source=SOURCE, sink=f"delta:{j.root}/other", checkpoint=ck, deadletter=f"parquet:{j.root}/d2", once=True)
    with pytest.raises(StateSchemaError, match="belongs to a sessionize job"):
        run_pipeline(spark, JobConfig("running-count", **base))
    with pytest.raises(StateSchemaError, match="time"):
        run_pipeline(spark, JobConfig("sessionize", gap=GAP, time_mode="processing", **base))
    other = _other_engine()
    if other is not None:
        with pytest.raises(StateSchemaError, match="engine"):
            run_pipeline(spark, JobConfig("sessionize", gap=GAP, watermark="0 seconds", engine=other, **base))
    assert j.ck._numbers("offsets") == offsets_before and not fs.exists(f"{j.root}/other", spark)

    # export -> --initial-state of a new query, all on s3a: one event of the first user at the
    # stream's start (before every state's deadline), and the exported state is in the new checkpoint.
    new_ck = f"{j.root}/ck2"
    first = parse_source(SOURCE).generator
    one = f"generator:rate=0,events=1,users={USERS},seed={first.seed}"
    run_pipeline(spark, JobConfig("sessionize", source=one, sink=f"parquet:{j.root}/out2", checkpoint=new_ck,
                                  gap=GAP, time_mode="event", watermark="0 seconds", initial_state=f"{j.root}/export",
                                  once=True))
    (event,) = [r.event for r in stream_records(parse_source(one).generator, 0, 1)]
    after = {r.user_id: r for r in ss.state.read(spark, new_ck).collect()}
    assert set(after) == set(in_state) | {event.user_id}
    assert all(after[u] == in_state[u] for u in in_state if u != event.user_id)
    print(f"object store test: {time.monotonic() - started:.0f} s")


@pytest.mark.timeout(TEST_TIMEOUT_S)
def test_an_object_store_outage_during_a_state_commit_loses_no_batch(spark, s3_server, s3_bucket, tmp_path):
    """S3Proxy paused for 30 s while a batch commits its state, S3A's timeouts lowered to 5 s. Either
    outcome is allowed (the issue: stall, or fail with one line), and the output must be exact after
    it. Measured (load 30): the job stalled through the outage and went on."""
    started = time.monotonic()
    quick = {"fs.s3a.connection.establish.timeout": "5s", "fs.s3a.connection.timeout": "5s",
             "fs.s3a.connection.request.timeout": "5s", "fs.s3a.retry.limit": "1", "fs.s3a.retry.interval": "500ms",
             "fs.s3a.attempts.maximum": "1", "fs.s3a.retry.throttle.limit": "1"}
    j = _s3_job(tmp_path, s3_server, s3_bucket, quick)
    outage_s = 30.0
    run = j.job._start()
    paused_at = None
    try:
        target = 0  # its state commit writes version target+1 of every state store
        deadline = time.monotonic() + RUN_TIMEOUT_S
        while paused_at is None:
            assert time.monotonic() < deadline and run.running(), f"no state commit to interrupt:\n{run.tail()}"
            if j.ck.committed(target):
                target += 1  # this commit went by between two looks: the next one
            elif j.ck.planned(target) and j.ck.state_files(target + 1) > 0:
                s3_server.pause()
                paused_at = time.monotonic()
            else:
                time.sleep(0.01)
        while run.running() and time.monotonic() - paused_at < outage_s:
            time.sleep(0.1)
        held = time.monotonic() - paused_at
        if held < outage_s:
            time.sleep(outage_s - held)  # the job gave up first: the store is still down for the rest
    finally:
        s3_server.resume()
    try:
        run.proc.wait(RUN_TIMEOUT_S)
    finally:
        run.kill()
    code = run.proc.returncode
    log = j.job.log.read_text(errors="replace")
    if code != 0:  # it failed: with one line, no stack trace
        errors = [line for line in log.splitlines() if line.startswith("sparkstate: error:")]
        assert len(errors) == 1 and "Traceback" not in log and "\tat " not in log, log[-3000:]
        print(f"\nthe job failed {time.monotonic() - paused_at:.0f} s into the outage of batch {target}: {errors[0]}")
        assert not j.ck.committed(target)
        assert j.job.run_to_end(RUN_TIMEOUT_S) == 0, log[-3000:]
    else:
        print(f"\nthe job rode through the outage of batch {target}")
    _assert_exact(spark, j)
    _assert_no_secret(s3_server, j)
    print(f"outage test: {time.monotonic() - started:.0f} s")
