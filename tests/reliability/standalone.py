"""A Spark standalone cluster for the tests and the scale-out benchmark: a master and workers of
one core each, started as separate processes on 127.0.0.1 with the ``spark-class`` script the
pyspark wheel ships (SPARK_HOME = the pyspark package), and the process-tree tools that stop
everything it started (JVMs, executors, their Python workers) and name anything left running.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections import defaultdict
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator, TypeVar

import pyspark
import pytest

from tests.conftest import TEST_JIT

SPARK_HOME = Path(pyspark.__file__).resolve().parent
SPARK_CLASS = SPARK_HOME / "bin" / "spark-class"
SPARK_SUBMIT = SPARK_HOME / "bin" / "spark-submit"
SCRIPT = Path(sys.executable).with_name("sparkstate")
HOST = "127.0.0.1"
WORKERS = 2
EXECUTOR = "org.apache.spark.executor.CoarseGrainedExecutorBackend"

T = TypeVar("T")


# --- processes -------------------------------------------------------------------------------

def proc_table() -> dict[int, int]:
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


def descendants(roots: list[int]) -> set[int]:
    """``roots`` and every process below them."""
    children = defaultdict(list)
    for pid, ppid in proc_table().items():
        children[ppid].append(pid)
    seen: set[int] = set()
    stack = list(roots)
    while stack:
        pid = stack.pop()
        if pid not in seen:
            seen.add(pid)
            stack.extend(children.get(pid, ()))
    return seen


def cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


def signal_all(pids: set[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def stop_tree(roots: list[int]) -> None:
    """Freeze the trees under ``roots`` (so nothing new is spawned), then SIGKILL every process in them.

    Python workers of an executor move to process groups of their own (pyspark's daemon), so
    killing the roots' process groups alone would miss them; the tree does not.
    """
    frozen: set[int] = set()
    while True:
        tree = descendants(roots) - frozen
        if not tree:
            break
        signal_all(tree, signal.SIGSTOP)
        frozen |= tree
    signal_all(frozen, signal.SIGKILL)
    for root in roots:  # and whatever else is in the roots' own process groups
        try:
            os.killpg(root, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def running_in(directory: Path) -> list[int]:
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


def tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return f"({path} not written)"


def wait_for(what: str, check: Callable[[], T | None], timeout: float, watch: dict[str, tuple[subprocess.Popen, Path]]) -> T:
    """Poll ``check`` until it returns something other than None/False; fail if a watched process ends first."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value is not None and value is not False:
            return value
        for name, (proc, log) in watch.items():
            if proc.poll() is not None:
                pytest.fail(f"{name} exited with {proc.returncode} while waiting for {what}:\n{tail(log)}")
        if time.monotonic() > deadline:
            logs = "\n".join(f"--- {name}:\n{tail(log, 15)}" for name, (_, log) in watch.items())
            pytest.fail(f"no {what} after {timeout:.0f} s\n{logs}")
        time.sleep(0.1)


def spawn(cmd: list[str], log: Path, env: dict[str, str], cwd: Path) -> subprocess.Popen:
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
    workers: int = WORKERS
    procs: dict[str, tuple[subprocess.Popen, Path]] = field(default_factory=dict)

    @property
    def worker_pids(self) -> list[int]:
        return [self.procs[f"worker {i}"][0].pid for i in range(self.workers)]

    def executors(self) -> dict[int, int]:
        """Running executor JVMs: pid -> index of the worker that started it."""
        out = {}
        for i, worker in enumerate(self.worker_pids):
            for pid in descendants([worker]) - {worker}:
                if EXECUTOR in cmdline(pid):
                    out[pid] = i
        return out

    def state(self) -> dict:
        with urllib.request.urlopen(f"{self.ui}/json/", timeout=10) as resp:
            return json.load(resp)


def cluster_env(root: Path) -> dict[str, str]:
    # Nothing from the calling environment that points Spark or Python elsewhere (the test
    # suite's PYTHONPATH included: executors find sparkstate only where they are meant to).
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SPARK", "PYSPARK", "SPARKSTATE_")) and k not in ("PYTHONPATH", "PYTHONHOME")}
    conf = root / "conf"
    conf.mkdir(exist_ok=True)  # no spark-defaults.conf / spark-env.sh from elsewhere
    # Its executors compile with C1 only, as every JVM of the suite (tests/conftest.py).
    (conf / "spark-defaults.conf").write_text(f"spark.executor.extraJavaOptions {TEST_JIT}\n")
    env.update({
        "SPARK_HOME": str(SPARK_HOME),
        "SPARK_CONF_DIR": str(conf),
        "SPARK_LOCAL_IP": HOST,
        "SPARK_LOCAL_HOSTNAME": HOST,
        "SPARK_DAEMON_MEMORY": "256m",  # master and worker JVMs
        "SPARK_DAEMON_JAVA_OPTS": TEST_JIT,  # as every JVM of the suite (tests/conftest.py)
        "SPARK_SUBMIT_OPTS": TEST_JIT,  # the drivers started with this environment
        "SPARK_MASTER_OPTS": "-Dspark.master.rest.enabled=false",  # no fixed REST port (6066)
        "PYSPARK_PYTHON": sys.executable,  # executors' Python workers: this venv's (sparkstate installed)
        "PYSPARK_DRIVER_PYTHON": sys.executable,
    })
    return env


def start(root: Path, workers: int = WORKERS) -> Cluster:
    cluster = Cluster(root, cluster_env(root), workers=workers)
    log = root / "master.log"
    cluster.procs["master"] = (spawn([SPARK_CLASS, "org.apache.spark.deploy.master.Master", "--host", HOST,
                                       "--port", "0", "--webui-port", "0"], log, cluster.env, root), log)

    def master_ready() -> tuple[str, str] | None:
        text = log.read_text(errors="replace")
        url = re.search(r"Starting Spark master at (spark://\S+)", text)
        ui = re.search(r"Bound MasterWebUI to \S+, and started at (http://\S+)", text)
        return (url.group(1), ui.group(1)) if url and ui else None

    cluster.url, cluster.ui = wait_for("master", master_ready, 120, cluster.procs)
    for i in range(workers):
        work = root / f"worker{i}"
        work.mkdir()
        wlog = root / f"worker{i}.log"
        cluster.procs[f"worker {i}"] = (spawn(
            [SPARK_CLASS, "org.apache.spark.deploy.worker.Worker", "--host", HOST, "--port", "0", "--webui-port", "0",
             "--cores", "1", "--memory", "1g", "--work-dir", work, cluster.url], wlog, cluster.env, work), wlog)
    wait_for(f"{workers} registered workers", lambda: cluster.state()["aliveworkers"] == workers, 120, cluster.procs)
    return cluster


@contextmanager
def running_cluster(root: Path, workers: int = WORKERS) -> Iterator[Cluster]:
    """A standalone cluster under ``root`` (a master, ``workers`` workers of one core each); every
    process it started is stopped on the way out, and any left running is named."""
    started: list[int] = []
    c = None
    try:
        c = start(root, workers)
        started = [p.pid for p, _ in c.procs.values()]
        yield c
    finally:
        if c is not None:
            started = [p.pid for p, _ in c.procs.values()]
        stop_tree(started)
        if c is not None:
            for proc, _ in c.procs.values():
                proc.wait(timeout=30)
        left = running_in(root)  # e.g. a Python worker of the killed executor
        signal_all(set(left), signal.SIGKILL)
        # A SIGKILLed JVM takes a moment to go on a loaded machine: wait for that, bounded.
        deadline = time.monotonic() + 60
        alive = [p for p in left if process_state(p) not in ("Z", "gone")]
        while alive and time.monotonic() < deadline:
            time.sleep(0.2)
            alive = [p for p in alive if process_state(p) not in ("Z", "gone")]
        assert not alive, f"processes left running after the cluster stopped: " \
            f"{[(p, process_state(p), ' '.join(cmdline(p))[:200]) for p in alive]}"


def process_state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"

