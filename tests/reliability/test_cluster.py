"""Executor loss on a real Spark standalone cluster, and sparkstate shipped to executors by spark-submit.

A master and two workers (one core each) run as separate processes on 127.0.0.1, started with
the ``spark-class`` script the pyspark wheel ships (SPARK_HOME = the pyspark package). Then:

- ``sparkstate run sessionize --master spark://...`` (a subprocess: the driver) reads generator
  records from files, one file per micro-batch; its executors run on the two workers. After the
  first batch is committed, while a later batch is in flight and files remain unread, one
  executor JVM is SIGKILLed. Spark starts a new executor and re-runs the lost tasks; the sessions
  the Parquet sink committed must equal the generator's reference sessions exactly (none lost,
  none twice), and the dead letters must be exactly the malformed records.
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
import urllib.request
import zipfile
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Iterator, TypeVar

import pyarrow.parquet as pq
import pyspark
import pytest

import sparkstate
from sparkstate.synthetic import Session, StreamConfig, reference_sessions, stream_records
from sparkstate.jobs.generate import generate_files
from tests.streams import committed_files

pytestmark = pytest.mark.reliability

SPARK_HOME = Path(pyspark.__file__).resolve().parent
SPARK_CLASS = SPARK_HOME / "bin" / "spark-class"
SPARK_SUBMIT = SPARK_HOME / "bin" / "spark-submit"
SCRIPT = Path(sys.executable).with_name("sparkstate")
HOST = "127.0.0.1"
WORKERS = 2
GAP = "1 minute"
FILES = 4  # one file per micro-batch
EXECUTOR = "org.apache.spark.executor.CoarseGrainedExecutorBackend"

T = TypeVar("T")


# --- processes -------------------------------------------------------------------------------

def _proc_table() -> dict[int, int]:
    """pid -> parent pid of every process (from /proc)."""
    table = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            table[int(entry)] = int(stat.rsplit(")", 1)[1].split()[1])  # "pid (comm) state ppid ..."
    return table


def _descendants(roots: list[int]) -> set[int]:
    """``roots`` and every process below them."""
    children = defaultdict(list)
    for pid, ppid in _proc_table().items():
        children[ppid].append(pid)
    seen: set[int] = set()
    stack = list(roots)
    while stack:
        pid = stack.pop()
        if pid not in seen:
            seen.add(pid)
            stack.extend(children.get(pid, ()))
    return seen


def _cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


def _signal_all(pids: set[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def _stop_tree(roots: list[int]) -> None:
    """Freeze the trees under ``roots`` (so nothing new is spawned), then SIGKILL every process in them.

    Python workers of an executor move to process groups of their own (pyspark's daemon), so
    killing the roots' process groups alone would miss them; the tree does not.
    """
    frozen: set[int] = set()
    while True:
        tree = _descendants(roots) - frozen
        if not tree:
            break
        _signal_all(tree, signal.SIGSTOP)
        frozen |= tree
    _signal_all(frozen, signal.SIGKILL)
    for root in roots:  # and whatever else is in the roots' own process groups
        try:
            os.killpg(root, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def _running_in(directory: Path) -> list[int]:
    """Processes whose working directory is ``directory`` or below (every cluster process's is)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            try:
                cwd = os.readlink(f"/proc/{entry}/cwd")
            except OSError:
                continue
            if cwd == str(directory) or cwd.startswith(str(directory) + os.sep):
                found.append(int(entry))
    return found


def _tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return f"({path} not written)"


def _wait(what: str, check: Callable[[], T | None], timeout: float, watch: dict[str, tuple[subprocess.Popen, Path]]) -> T:
    """Poll ``check`` until it returns something other than None/False; fail if a watched process ends first."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value is not None and value is not False:
            return value
        for name, (proc, log) in watch.items():
            if proc.poll() is not None:
                pytest.fail(f"{name} exited with {proc.returncode} while waiting for {what}:\n{_tail(log)}")
        if time.monotonic() > deadline:
            logs = "\n".join(f"--- {name}:\n{_tail(log, 15)}" for name, (_, log) in watch.items())
            pytest.fail(f"no {what} after {timeout:.0f} s\n{logs}")
        time.sleep(0.1)


def _spawn(cmd: list[str], log: Path, env: dict[str, str], cwd: Path) -> subprocess.Popen:
    with open(log, "ab") as out:  # the child keeps its own descriptor
        return subprocess.Popen([str(c) for c in cmd], stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=env, cwd=cwd, start_new_session=True)


# --- the cluster -----------------------------------------------------------------------------

@dataclass
class Cluster:
    root: Path
    env: dict[str, str]
    url: str = ""
    ui: str = ""
    procs: dict[str, tuple[subprocess.Popen, Path]] = field(default_factory=dict)

    @property
    def worker_pids(self) -> list[int]:
        return [self.procs[f"worker {i}"][0].pid for i in range(WORKERS)]

    def executors(self) -> dict[int, int]:
        """Running executor JVMs: pid -> index of the worker that started it."""
        out = {}
        for i, worker in enumerate(self.worker_pids):
            for pid in _descendants([worker]) - {worker}:
                if EXECUTOR in _cmdline(pid):
                    out[pid] = i
        return out

    def state(self) -> dict:
        with urllib.request.urlopen(f"{self.ui}/json/", timeout=10) as resp:
            return json.load(resp)


def _cluster_env(root: Path) -> dict[str, str]:
    # Nothing from the calling environment that points Spark or Python elsewhere (the test
    # suite's PYTHONPATH included: executors find sparkstate only where they are meant to).
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SPARK", "PYSPARK", "SPARKSTATE_")) and k not in ("PYTHONPATH", "PYTHONHOME")}
    conf = root / "conf"
    conf.mkdir(exist_ok=True)  # empty: no spark-defaults.conf / spark-env.sh from elsewhere
    env.update({
        "SPARK_HOME": str(SPARK_HOME),
        "SPARK_CONF_DIR": str(conf),
        "SPARK_LOCAL_IP": HOST,
        "SPARK_LOCAL_HOSTNAME": HOST,
        "SPARK_DAEMON_MEMORY": "256m",  # master and worker JVMs
        "SPARK_MASTER_OPTS": "-Dspark.master.rest.enabled=false",  # no fixed REST port (6066)
        "PYSPARK_PYTHON": sys.executable,  # executors' Python workers: this venv's (sparkstate installed)
        "PYSPARK_DRIVER_PYTHON": sys.executable,
    })
    return env


def _start(root: Path) -> Cluster:
    cluster = Cluster(root, _cluster_env(root))
    log = root / "master.log"
    cluster.procs["master"] = (_spawn([SPARK_CLASS, "org.apache.spark.deploy.master.Master", "--host", HOST,
                                       "--port", "0", "--webui-port", "0"], log, cluster.env, root), log)

    def master_ready() -> tuple[str, str] | None:
        text = log.read_text(errors="replace")
        url = re.search(r"Starting Spark master at (spark://\S+)", text)
        ui = re.search(r"Bound MasterWebUI to \S+, and started at (http://\S+)", text)
        return (url.group(1), ui.group(1)) if url and ui else None

    cluster.url, cluster.ui = _wait("master", master_ready, 120, cluster.procs)
    for i in range(WORKERS):
        work = root / f"worker{i}"
        work.mkdir()
        wlog = root / f"worker{i}.log"
        cluster.procs[f"worker {i}"] = (_spawn(
            [SPARK_CLASS, "org.apache.spark.deploy.worker.Worker", "--host", HOST, "--port", "0", "--webui-port", "0",
             "--cores", "1", "--memory", "1g", "--work-dir", work, cluster.url], wlog, cluster.env, work), wlog)
    _wait("two registered workers", lambda: cluster.state()["aliveworkers"] == WORKERS, 120, cluster.procs)
    return cluster


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> Iterator[Cluster]:
    root = tmp_path_factory.mktemp("cluster")
    started: list[int] = []
    c = None
    try:
        c = _start(root)
        started = [p.pid for p, _ in c.procs.values()]
        yield c
    finally:
        if c is not None:
            started = [p.pid for p, _ in c.procs.values()]
        _stop_tree(started)
        if c is not None:
            for proc, _ in c.procs.values():
                proc.wait(timeout=30)
        left = _running_in(root)  # e.g. a Python worker of the killed executor
        _signal_all(set(left), signal.SIGKILL)
        assert not [p for p in left if Path(f"/proc/{p}").exists() and _state(p) != "Z"], \
            f"processes left running after the cluster stopped: {left}"


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"


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


# --- the tests -------------------------------------------------------------------------------

def test_executor_killed_mid_stream_sessions_stay_exact(cluster, tmp_path):
    config = StreamConfig(users=20, seed=11, events=1200, rate=0, malformed_share=0.02)
    generated = generate_files(tmp_path / "in", config, files=FILES)
    records = stream_records(config)
    out, ck, metrics = tmp_path / "out", tmp_path / "ck", tmp_path / "metrics.jsonl"
    log = tmp_path / "driver.log"
    started = time.monotonic()
    driver = _spawn([
        SCRIPT, "run", "sessionize", "--master", cluster.url, "--source", f"files:{tmp_path / 'in'}",
        "--format", "json", "--option", "maxFilesPerTrigger=1", "--sink", f"parquet:{out}", "--checkpoint", ck,
        "--gap", GAP, "--time-mode", "event", "--watermark", "0 seconds", "--once", "--metrics", metrics,
        "--no-progress",
    ], log, _driver_env(cluster), tmp_path)
    watch = {**cluster.procs, "driver": (driver, log)}
    try:
        # Both workers run an executor of the job.
        def one_per_worker() -> dict[int, int] | None:
            found = cluster.executors()
            return found if sorted(found.values()) == list(range(WORKERS)) else None

        executors = _wait("an executor on each worker", one_per_worker, 150, watch)

        # Wait for: batch 0 committed, and a later batch planned (offsets/N) but not yet committed.
        def batch_in_flight() -> int | None:
            pending = sorted(_batch_ids(ck / "offsets") - _batch_ids(ck / "commits"))
            return pending[0] if 0 in _batch_ids(ck / "commits") and pending else None

        batch = _wait("micro-batch in flight after the first commit", batch_in_flight, 180, watch)
        victim, worker = min(executors.items(), key=lambda kv: kv[1])  # worker 0's executor
        victim_cmd = _cmdline(victim)
        os.kill(victim, signal.SIGKILL)
        killed_at = time.monotonic()
        mid_batch = not (ck / "commits" / str(batch)).exists()
        assert batch <= FILES - 2, "the kill must leave input unread"

        # Spark replaces the executor (the worker reports its exit, the master starts another) ...
        replacement = _wait("replacement executor", lambda: next(
            (p for p, w in cluster.executors().items() if w == worker and p != victim), None), 120, watch)
        replaced_at = time.monotonic()
        replacement_cmd = _cmdline(replacement)
        # ... re-runs the lost tasks, and the batch in flight commits.
        _wait(f"commit of batch {batch}", lambda: (ck / "commits" / str(batch)).exists(), 180, watch)
        recovered_at = time.monotonic()
        code = driver.wait(timeout=240)
    finally:
        if driver.poll() is None:
            _stop_tree([driver.pid])
            driver.wait(timeout=30)
    finished_at = time.monotonic()
    printed = log.read_text(errors="replace")
    assert code == 0, _tail(log, 60)
    assert "caught up (--once)" in printed and "Traceback" not in printed

    # The kill hit the job: the worker saw its executor die (exit status 137 = SIGKILL), and
    # the driver lost it.
    app, executor_id = _option(victim_cmd, "--app-id"), _option(victim_cmd, "--executor-id")
    worker_log = cluster.procs[f"worker {worker}"][1].read_text(errors="replace")
    assert re.search(rf"Executor {app}/{executor_id} finished with state \w+ message Command exited with code 137", worker_log), \
        _tail(cluster.procs[f"worker {worker}"][1])
    new_id = _option(replacement_cmd, "--executor-id")
    assert f"Lost executor {executor_id} on {HOST}" in (ck / "spark.log").read_text(errors="replace")
    work = cluster.root / f"worker{worker}" / app
    victim_left = _running_in(work / executor_id)  # its Python workers end with it (they read its pipes)
    replacement_tasks = (work / new_id / "stderr").read_text(errors="replace").count("Running task")

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
        "executors_killed": 1,
        "killed_mid_batch": mid_batch,
        "killed_during_batch": batch,
        "files_unread_at_kill": FILES - 1 - batch,
        "replacement_executor": f"{executor_id} -> {new_id}",
        "tasks_run_by_replacement": replacement_tasks,
        "processes_of_killed_executor_left": len(victim_left),
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
        "seconds_to_replacement_executor": round(replaced_at - killed_at, 1),
        "seconds_to_recover": round(recovered_at - killed_at, 1),
        "job_seconds": round(finished_at - started, 1),
    }
    print("\ncluster executor-loss figures: " + json.dumps(figures))


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
    submit = _spawn([SPARK_SUBMIT, "--master", cluster.url, "--py-files", shipped, app, land, tmp_path / "out",
                     tmp_path / "ck"], log, {**env, "PYTHONPATH": str(shipped)}, tmp_path)
    try:
        code = submit.wait(timeout=240)
    finally:
        if submit.poll() is None:
            _stop_tree([submit.pid])
            submit.wait(timeout=30)
    text = log.read_text(errors="replace")
    assert code == 0, _tail(log, 60)
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
