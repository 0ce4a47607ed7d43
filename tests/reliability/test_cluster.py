"""Executor and worker loss on a real Spark standalone cluster, and sparkstate shipped to executors by spark-submit.

A master and two workers (one core each) run as separate processes on 127.0.0.1, started with
the ``spark-class`` script the pyspark wheel ships (SPARK_HOME = the pyspark package). Then:

- ``sparkstate run sessionize --master spark://...`` (a subprocess: the driver) reads generator
  records from files, one file per micro-batch; its executors run on the two workers. One run
  goes through four faults in sequence (an executor SIGKILLed mid-batch, a second one in a row,
  one during a RocksDB snapshot upload, a whole Worker JVM), each at a moment read from the
  checkpoint, the process tree or the executors' logs. Spark starts new executors and re-runs
  the lost tasks; the sessions the Parquet sink committed must equal the generator's reference
  sessions exactly (none lost, none twice), and the dead letters must be exactly the malformed
  records.
- ``spark-submit --py-files sparkstate.zip`` runs a sparkstate job on the same cluster with a
  Python that does not have sparkstate installed (the way docs/cluster.md describes).

Every process the cluster starts (JVMs, executors, their Python workers) is killed at the end,
also when a test fails; a final sweep finds anything left running in the test's directories.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import sysconfig
import time
import zipfile
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterator

import pyarrow.parquet as pq
import pytest

import sparkstate
from sparkstate.synthetic import Session, StreamConfig, reference_sessions, stream_records
from sparkstate.jobs.generate import generate_files
from tests.reliability.standalone import (HOST, SCRIPT, SPARK_CLASS, SPARK_SUBMIT, WORKERS, Cluster,
                                          cmdline, process_state, running_cluster, running_in, spawn, stop_tree,
                                          tail, wait_for)
from tests.streams import committed_files

pytestmark = pytest.mark.reliability


GAP = "1 minute"



@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> Iterator[Cluster]:
    with running_cluster(tmp_path_factory.mktemp("cluster")) as c:
        yield c



def _driver_env(cluster: Cluster, **extra: str) -> dict[str, str]:
    return {**cluster.env, **extra}


# --- reading what a file sink committed -------------------------------------------------------

def _rows(paths: list[str]) -> list[dict]:
    return [row for p in paths for row in pq.read_table(p).to_pylist()]


def _utc(value: datetime) -> datetime:
    # Spark writes Parquet timestamps as INT96 by default, which pyarrow reads as naive UTC.
    return value.replace(tzinfo=timezone.utc) if value.tzinfo is None else value.astimezone(timezone.utc)


def _session(row: dict) -> Session:
    return Session(row["user_id"], _utc(row["session_start"]), _utc(row["session_end"]), int(row["event_count"]),
                   tuple(row["events"]), row["closed_by"])


def _batch_ids(directory: Path) -> set[int]:
    try:
        return {int(p.name) for p in directory.iterdir() if p.name.isdigit()}
    except FileNotFoundError:
        return set()


def _iso_utc(text: str) -> datetime:
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=timezone.utc)


def _option(cmd: list[str], name: str) -> str:
    return cmd[cmd.index(name) + 1]


# --- faults ----------------------------------------------------------------------------------

#: The state settings of the fault run: a snapshot of every version (Spark's default is every 10)
#: and a maintenance round every second (default 60 s), so that snapshot uploads, which Spark
#: does in its executors' maintenance thread, happen at every batch and one can be hit.
SNAPSHOT_EVERY_BATCH = {
    "spark.sql.streaming.stateStore.minDeltasForSnapshot": "1",
    "spark.sql.streaming.stateStore.maintenanceInterval": "1s",
}
#: The line a RocksDB state store's file manager logs when it begins uploading a snapshot, and
#: the one when the snapshot's zip is in place (Spark 4.3, INFO).
UPLOAD_BEGINS = re.compile(rb"operatorId=(\d+), partitionId=(\d+), storeName=[^\]]*\], queryRunId=[^\]]*\]: "
                           rb"Saving RocksDB files to DFS for version (\d+)\b")
UPLOAD_DONE = "Saved checkpoint file for version {version} "


@dataclass
class Fault:
    """One fault injected into the run, and what was true when it hit."""

    kind: str
    victim: str
    batch: int | None
    mid_batch: bool
    detail: dict = field(default_factory=dict)
    at: float = field(default_factory=time.monotonic)


def _kill(pid: int) -> None:
    os.kill(pid, signal.SIGKILL)


def _gone(pid: int) -> bool:
    return process_state(pid) in ("gone", "Z")


def _stderr_path(cluster: Cluster, pid: int, worker: int) -> Path | None:
    """An executor's stderr file: its worker copies it to ``WORK_DIR/APP_ID/EXECUTOR_ID/stderr``."""
    cmd, worker_cmd = cmdline(pid), [str(a) for a in cluster.procs[f"worker {worker}"][0].args]
    if "--app-id" not in cmd or "--work-dir" not in worker_cmd:
        return None
    return Path(_option(worker_cmd, "--work-dir")) / _option(cmd, "--app-id") / _option(cmd, "--executor-id") / "stderr"


def _pending_batch(ck: Path) -> int | None:
    """The oldest micro-batch planned (offsets/N) but not committed, once batch 0 has committed."""
    pending = sorted(_batch_ids(ck / "offsets") - _batch_ids(ck / "commits"))
    return pending[0] if 0 in _batch_ids(ck / "commits") and pending else None


def _kill_during_snapshot_upload(cluster: Cluster, ck: Path, watch: dict, timeout: float
                                 ) -> tuple[Fault, int, list[str]]:
    """SIGKILL an executor while its maintenance thread uploads a RocksDB snapshot.

    The executors' logs are followed; when one logs that it begins saving version N (N >= 2:
    version 1's snapshot is uploaded by the task itself) of a state partition, it is frozen
    (SIGSTOP) at once, and killed if its log has not reached the end of that upload and the
    snapshot's ``N.zip`` is not in the checkpoint; otherwise it is let go (SIGCONT) and the next
    upload is tried. So the kill is known to have hit the upload, whatever the timing.
    Returns the fault, the executor's pid and its command line.
    """
    paths: dict[int, Path] = {}
    offsets: dict[int, int] = {}
    for pid, worker in cluster.executors().items():  # what they logged before does not count
        path = _stderr_path(cluster, pid, worker)
        if path is not None:
            paths[pid], offsets[pid] = path, path.stat().st_size if path.exists() else 0
    tried = 0
    deadline = time.monotonic() + timeout
    next_scan = 0.0
    while time.monotonic() < deadline:
        if time.monotonic() >= next_scan:  # the processes twice a second, the logs every few ms
            next_scan = time.monotonic() + 0.5
            for name, (proc, log) in watch.items():
                if proc.poll() is not None:
                    pytest.fail(f"{name} exited with {proc.returncode} while waiting for a snapshot upload:\n{tail(log)}")
            live = cluster.executors()
            for pid, worker in live.items():
                path = paths.get(pid) or _stderr_path(cluster, pid, worker)
                if path is not None:
                    paths[pid] = path
            for pid in set(paths) - set(live):
                del paths[pid]
        for pid, path in list(paths.items()):
            try:
                with open(path, "rb") as f:
                    f.seek(offsets.get(pid, 0))
                    chunk = f.read()
            except OSError:
                continue
            whole = chunk[: chunk.rfind(b"\n") + 1]  # whole lines only
            base = offsets.get(pid, 0)
            offsets[pid] = base + len(whole)
            starts = [m for m in UPLOAD_BEGINS.finditer(whole) if int(m.group(3)) >= 2]
            if not starts:
                continue
            m = starts[-1]
            cmd = cmdline(pid)
            os.kill(pid, signal.SIGSTOP)
            tried += 1
            operator, partition, version = m.group(1).decode(), m.group(2).decode(), int(m.group(3))
            with open(path, "rb") as f:
                f.seek(base + m.end())
                after = f.read()
            part_dir = ck / "state" / operator / partition
            if UPLOAD_DONE.format(version=version).encode() in after or (part_dir / f"{version}.zip").exists():
                os.kill(pid, signal.SIGCONT)  # too late for this one: the next upload
                continue
            temp = list(part_dir.glob(f".{version}.zip.*.tmp"))
            batch = _pending_batch(ck)
            _kill(pid)
            return Fault("executor killed during a snapshot upload", f"pid {pid}", batch, batch is not None, {
                "state_partition": f"{operator}/{partition}", "snapshot_version": version,
                "zip_written": False, "zip_temp_file_present": bool(temp), "uploads_seen": tried}), pid, cmd
        time.sleep(0.005)
    pytest.fail(f"no snapshot upload caught within {timeout:.0f} s ({tried} seen, each finished before it was frozen)")


# --- the tests -------------------------------------------------------------------------------

FILES = 8  # one file per micro-batch
#: The longest wait for the job's next step: a bound, not a pause (at a load of 15 on 2 cores the
#: first micro-batch on the cluster took over 3 minutes).
PROGRESS_S = 480


@pytest.mark.timeout(4 * PROGRESS_S)
def test_executor_and_worker_losses_in_one_run_sessions_stay_exact(cluster, tmp_path):
    """One job on the cluster, four faults in sequence; the output must be exact at the end.

    1. an executor SIGKILLed mid-batch (after batch 0 committed);
    2. as soon as that worker has started a replacement, the other worker's executor SIGKILLed:
       two executors lost in a row, the job briefly without any;
    3. an executor SIGKILLed while its maintenance thread uploads a RocksDB snapshot;
    4. a whole Worker JVM SIGKILLed mid-batch (its executor ends with it); a new worker joins.
    """
    config = StreamConfig(users=20, seed=11, events=2400, rate=0, malformed_share=0.02)
    generated = generate_files(tmp_path / "in", config, files=FILES)
    records = stream_records(config)
    out, ck, metrics = tmp_path / "out", tmp_path / "ck", tmp_path / "metrics.jsonl"
    conf = tmp_path / "conf"
    conf.mkdir()
    # Two state partitions per one-core worker: on a cluster the session keeps Spark's 200 (it sets
    # its local-mode defaults in local mode only), which cost this run 201 tasks per stage and two
    # thirds of its time on a 2-core machine, and test no more of the recovery than 4 do.
    settings = {**SNAPSHOT_EVERY_BATCH, "spark.sql.shuffle.partitions": "4"}
    (conf / "spark-defaults.conf").write_text("".join(f"{k} {v}\n" for k, v in settings.items()))
    log = tmp_path / "driver.log"
    started = time.monotonic()
    driver = spawn([
        SCRIPT, "run", "sessionize", "--master", cluster.url, "--source", f"files:{tmp_path / 'in'}",
        "--format", "json", "--option", "maxFilesPerTrigger=1", "--sink", f"parquet:{out}", "--checkpoint", ck,
        "--gap", GAP, "--time-mode", "event", "--watermark", "0 seconds", "--once", "--metrics", metrics,
        "--no-progress",
    ], log, _driver_env(cluster, SPARK_CONF_DIR=str(conf)), tmp_path)
    watch = {**cluster.procs, "driver": (driver, log)}
    faults: list[Fault] = []
    killed_executors: list[tuple[int, list[str], int]] = []  # pid, cmdline, worker
    try:
        def one_per_worker() -> dict[int, int] | None:
            found = cluster.executors()
            return found if sorted(found.values()) == list(range(WORKERS)) else None

        def replaced(dead: set[int]) -> dict[int, int] | None:
            found = one_per_worker()
            return found if found and not set(found) & dead else None

        executors = wait_for("an executor on each worker", one_per_worker, PROGRESS_S, watch)

        # 1. An executor, mid-batch.
        batch = wait_for("micro-batch in flight after the first commit", lambda: _pending_batch(ck), PROGRESS_S, watch)
        first = next(p for p, w in executors.items() if w == 0)
        killed_executors.append((first, cmdline(first), 0))
        _kill(first)
        faults.append(Fault("executor killed mid-batch", f"pid {first} (worker 0)", batch,
                            not (ck / "commits" / str(batch)).exists()))

        # 2. Its worker starts a replacement; at that moment the other worker's executor goes too.
        wait_for("replacement executor on worker 0", lambda: next(
            (p for p, w in cluster.executors().items() if w == 0 and p != first), None), PROGRESS_S, watch)
        second = next(p for p, w in executors.items() if w == 1)
        in_flight = _pending_batch(ck)
        killed_executors.append((second, cmdline(second), 1))
        _kill(second)
        faults.append(Fault("second executor killed in a row", f"pid {second} (worker 1)", in_flight,
                            in_flight is not None, {"seconds_after_first_kill": round(time.monotonic() - faults[0].at, 1),
                                                    "same_batch_as_first": in_flight == batch}))
        wait_for("executors on both workers again", lambda: replaced({first, second}), PROGRESS_S, watch)
        wait_for(f"commit of batch {batch}", lambda: (ck / "commits" / str(batch)).exists(), PROGRESS_S, watch)
        faults[0].detail["seconds_to_commit"] = faults[1].detail["seconds_to_commit"] = round(
            time.monotonic() - faults[0].at, 1)

        # 3. An executor in the middle of a snapshot upload (its maintenance thread).
        before = cluster.executors()
        fault, pid, cmd = _kill_during_snapshot_upload(cluster, ck, watch, PROGRESS_S)
        worker = before.get(pid, -1)
        fault.victim += f" (worker {worker})"
        killed_executors.append((pid, cmd, worker))
        faults.append(fault)
        wait_for("an executor on each worker after the upload kill", lambda: replaced({pid}), PROGRESS_S, watch)

        # 4. A whole worker: the Worker JVM, mid-batch. Its executor notices and exits; a new
        # worker process joins the cluster in its place.
        def busy_on_worker0() -> int | None:  # its executor has run a task: it is working for the job
            pid = next((p for p, w in cluster.executors().items() if w == 0), None)
            path = None if pid is None else _stderr_path(cluster, pid, 0)
            try:
                return pid if path is not None and b"Running task" in path.read_bytes() else None
            except OSError:
                return None

        doomed = wait_for("worker 0's executor running tasks", busy_on_worker0, PROGRESS_S, watch)
        killed_executors.append((doomed, cmdline(doomed), 0))
        in_flight = wait_for("micro-batch in flight", lambda: _pending_batch(ck), PROGRESS_S, watch)
        old_worker, old_log = cluster.procs.pop("worker 0")
        watch.pop("worker 0")
        _kill(old_worker.pid)
        faults.append(Fault("Worker JVM killed", f"pid {old_worker.pid} (worker 0)", in_flight,
                            not (ck / "commits" / str(in_flight)).exists(),
                            {"files_unread": FILES - 1 - in_flight}))
        assert in_flight <= FILES - 2, "the worker kill must leave input unread"
        old_worker.wait(timeout=30)
        wait_for("the lost worker's executor to end", lambda: _gone(doomed), PROGRESS_S, watch)
        faults[-1].detail["seconds_until_its_executor_ended"] = round(time.monotonic() - faults[-1].at, 1)
        work = cluster.root / "worker0-restarted"
        work.mkdir()
        wlog = cluster.root / "worker0-restarted.log"
        cluster.procs["worker 0"] = (spawn(
            [SPARK_CLASS, "org.apache.spark.deploy.worker.Worker", "--host", HOST, "--port", "0", "--webui-port", "0",
             "--cores", "1", "--memory", "1g", "--work-dir", work, cluster.url], wlog, cluster.env, work), wlog)
        watch["worker 0"] = cluster.procs["worker 0"]
        wait_for(f"commit of batch {in_flight}", lambda: (ck / "commits" / str(in_flight)).exists(), PROGRESS_S, watch)
        faults[-1].detail["seconds_to_commit"] = round(time.monotonic() - faults[-1].at, 1)
        code = driver.wait(timeout=2 * PROGRESS_S)
        wait_for("two alive workers", lambda: cluster.state()["aliveworkers"] == WORKERS, PROGRESS_S, cluster.procs)
    finally:
        if driver.poll() is None:
            stop_tree([driver.pid])
            driver.wait(timeout=30)
    finished_at = time.monotonic()
    printed = log.read_text(errors="replace")
    assert code == 0, tail(log, 60)
    assert "caught up (--once)" in printed and "Traceback" not in printed

    # Every kill hit the job: the driver lost each executor, the workers saw the first three die
    # of SIGKILL (exit code 137), and the master lost the killed worker.
    spark_log = (ck / "spark.log").read_text(errors="replace")
    for pid, cmd, worker in killed_executors:
        app, executor_id = _option(cmd, "--app-id"), _option(cmd, "--executor-id")
        assert f"Lost executor {executor_id} on {HOST}" in spark_log, (pid, executor_id)
        # its Python workers ended with it (they read its pipes)
        assert not running_in(cluster.root / f"worker{worker}" / app / executor_id), executor_id
    worker_logs = "".join(cluster.root.joinpath(f"worker{i}.log").read_text(errors="replace") for i in range(WORKERS))
    for pid, cmd, _ in killed_executors[:-1]:  # the last one's worker was killed before it could tell
        app, executor_id = _option(cmd, "--app-id"), _option(cmd, "--executor-id")
        assert re.search(rf"Executor {app}/{executor_id} finished with state \w+ message Command exited with code 137",
                         worker_logs), executor_id
    assert "Removing worker" in (cluster.root / "master.log").read_text(errors="replace")
    assert all(f.batch is not None for f in faults if "upload" not in f.kind), faults  # (maintenance may run between batches)

    # Every record went through exactly one micro-batch (the metrics file: one line per batch).
    lines = [json.loads(line) for line in metrics.read_text().splitlines()]
    output = [m for m in lines if m["query"] == "output"]
    malformed = [r for r in records if not r.is_valid]
    assert [m["batch_id"] for m in output] == list(range(len(output)))
    assert sum(m["rows_in"] for m in output) == len(records) == generated.records
    assert sum(m["dead_letters"] or 0 for m in lines) == len(malformed)

    # The sessions committed are the reference sessions, each exactly once.
    committed = committed_files(out)
    assert sorted(committed) == list(range(len(committed)))
    written = [_session(r) for b in sorted(committed) for r in _rows(committed[b])]
    valid = [r.event for r in records if r.is_valid]
    final_watermark = _iso_utc(output[-1]["watermark"])
    assert final_watermark == max(e.event_time for e in valid)  # watermark delay 0: the last event time
    expected = reference_sessions(valid, GAP, watermark=final_watermark)
    got, want = Counter(written), Counter(expected)
    lost, duplicated = sum((want - got).values()), sum(n - 1 for n in got.values() if n > 1)
    extra = sum((got - want).values())
    assert (lost, duplicated, extra) == (0, 0, 0), f"lost {lost}, duplicated {duplicated}, unexpected {extra}"
    assert sorted(written, key=lambda s: (s.user_id, s.session_start)) == expected
    still_open = set(reference_sessions(valid, GAP)) - set(expected)  # the watermark has not passed them

    # The dead letters are exactly the malformed records, each once.
    dead_rows = [r for paths in committed_files(out / "_deadletter").values() for r in _rows(paths)]
    assert Counter(r["raw"] for r in dead_rows) == Counter(r.line for r in malformed)

    on_disk = {str(p) for p in out.glob("*.parquet")}
    listed = {p for paths in committed.values() for p in paths}
    figures = {
        "faults": [{"kind": f.kind, "victim": f.victim, "batch": f.batch, "mid_batch": f.mid_batch, **f.detail}
                   for f in faults],
        "batches": len(output),
        "records_checked": len(records),
        "valid_events": len(valid),
        "dead_letters": len(dead_rows),
        "sessions_expected": len(expected),
        "sessions_written": len(written),
        "sessions_still_open": len(still_open),
        "lost": lost,
        "duplicated": duplicated,
        "uncommitted_files_ignored": len(on_disk - listed),
        "job_seconds": round(finished_at - started, 1),
    }
    print("\ncluster fault-run figures: " + json.dumps(figures))


def test_spark_submit_ships_sparkstate_as_a_zip(cluster, tmp_path):
    # A Python with pyspark, pandas and pyarrow but without sparkstate, for the driver and the
    # executors: a bare venv whose one .pth file adds this venv's site-packages as a plain path
    # (the editable install's own .pth inside it is then not processed).
    bare = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True, timeout=120)
    python = bare / "bin" / "python"
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    (site / "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    env = _driver_env(cluster, PYSPARK_PYTHON=str(python), PYSPARK_DRIVER_PYTHON=str(python))
    probe = subprocess.run([str(python), "-c", "import pyspark, pandas, pyarrow; import sparkstate"],
                           capture_output=True, text=True, env=env, cwd=tmp_path)
    assert "No module named 'sparkstate'" in probe.stderr

    # The package as a zip with sparkstate/ at its root (the layout of its pure-Python wheel).
    package = Path(sparkstate.__file__).parent
    shipped = tmp_path / "sparkstate.zip"
    with zipfile.ZipFile(shipped, "w") as z:
        for f in sorted(package.rglob("*.py")):
            z.write(f, f.relative_to(package.parent).as_posix())

    land = tmp_path / "in"
    land.mkdir()
    (land / "a.json").write_text('{"word": "spark"}\n{"word": "state"}\n{"word": "spark"}\n')
    app = tmp_path / "job.py"
    app.write_text(
        "import json, os, sys\n"
        "import sparkstate as ss\n"
        "from sparkstate.jobs import JobConfig, run_pipeline\n"
        "spark = ss.spark_session('sparkstate-submit')\n"
        "land, out, ck = sys.argv[1:4]\n"
        "r = run_pipeline(spark, JobConfig('running-count', source='files:' + land, format='json',\n"
        "                                  sink='json:' + out, checkpoint=ck, once=True))\n"
        "where = spark.sparkContext.parallelize(range(4), 4).map(lambda _: os.path.abspath(__import__('sparkstate').__file__))\n"
        "print('RESULT ' + json.dumps({'master': spark.sparkContext.master, 'driver': ss.__file__,\n"
        "      'executors': sorted(set(where.collect())), 'rows_out': r.output_rows}))\n"
        "spark.stop()\n"
    )
    log = tmp_path / "submit.log"
    # --py-files reaches the executors and the application's Python; the driver JVM's own Python
    # helper for transformWithState (it checks the state schema when a query starts) reads only
    # the PYTHONPATH spark-submit was started with.
    # 2 state partitions (Spark's default of 200 outside local mode would run 200 stateful tasks on
    # the two one-core executors: minutes on a loaded machine, and nothing this test is about)
    submit = spawn([SPARK_SUBMIT, "--master", cluster.url, "--conf", "spark.sql.shuffle.partitions=2",
                    "--py-files", shipped, app, land, tmp_path / "out", tmp_path / "ck"],
                   log, {**env, "PYTHONPATH": str(shipped)}, tmp_path)
    try:
        code = submit.wait(timeout=600)  # minutes on a loaded 2-core machine (209 s measured at load 8)
    finally:
        if submit.poll() is None:
            stop_tree([submit.pid])
            submit.wait(timeout=30)
    text = log.read_text(errors="replace")
    assert code == 0, tail(log, 60)
    result = json.loads(next(line for line in text.splitlines() if line.startswith("RESULT "))[len("RESULT "):])
    assert result["master"] == cluster.url
    assert result["driver"].endswith("sparkstate.zip/sparkstate/__init__.py")
    # the executors import the copy Spark shipped into their work directories on the workers
    assert result["executors"] and all(p.startswith(str(cluster.root)) and p.endswith("sparkstate.zip/sparkstate/__init__.py")
                                       for p in result["executors"]), result["executors"]
    assert result["rows_out"] == 2
    counts = sorted((r["word"], r["count"]) for r in map(json.loads, _json_lines(tmp_path / "out" / "batch_id=0")))
    assert counts == [("spark", 2), ("state", 1)]


def _json_lines(directory: Path) -> list[str]:
    return [line for f in sorted(directory.glob("part-*.json")) for line in f.read_text().splitlines() if line]


def test_six_state_partitions_run_six_stateful_tasks_on_both_workers(cluster, tmp_path):
    """A new checkpoint at 6 state partitions (the cluster's spark-defaults.conf) gets the batched
    engine's buckets for 6: every partition's task writes state, on both workers; the counts are exact."""
    from benchmarks.scaleout import stateful_tasks

    land, events, conf = tmp_path / "in", tmp_path / "events", tmp_path / "conf"
    for d in (land, events, conf):
        d.mkdir()
    words = [f"w{i % 300}" for i in range(1200)]
    (land / "a.json").write_text("".join(json.dumps({"word": w}) + "\n" for w in words))
    (conf / "spark-defaults.conf").write_text(
        f"spark.sql.shuffle.partitions 6\nspark.eventLog.enabled true\nspark.eventLog.dir file://{events}\n"
        "spark.eventLog.rolling.enabled false\nspark.eventLog.compress false\n"  # one plain JSON-lines file
        "spark.scheduler.minRegisteredResourcesRatio 1.0\nspark.scheduler.maxRegisteredResourcesWaitingTime 120s\n")
    log = tmp_path / "driver.log"
    driver = spawn([SCRIPT, "run", "running-count", "--master", cluster.url, "--source", f"files:{land}",
                     "--format", "json", "--sink", f"json:{tmp_path / 'out'}", "--checkpoint", tmp_path / "ck",
                     "--once", "--no-progress"], log, _driver_env(cluster, SPARK_CONF_DIR=str(conf)), tmp_path)
    try:
        code = driver.wait(timeout=900)
    finally:
        if driver.poll() is None:
            stop_tree([driver.pid])
            driver.wait(timeout=30)
    assert code == 0, tail(log, 60)
    counts: dict[str, int] = {}
    for f in (tmp_path / "out").rglob("part-*.json"):
        for r in map(json.loads, f.read_text().splitlines()):
            counts[r["word"]] = max(counts.get(r["word"], 0), r["count"])
    assert counts == Counter(words)
    stages = stateful_tasks(events)
    assert [sorted(t["partition"] for t in s["tasks"]) for s in stages] == [list(range(6))], stages
    assert len({t["executor"] for t in stages[0]["tasks"]}) == WORKERS, stages
