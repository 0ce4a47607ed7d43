"""Kill a ``sparkstate run`` driver with SIGKILL at chosen points of a micro-batch, and restart it.

A job runs as its own process group (the JVM and Spark's Python workers are its descendants).
Every process of a job carries a tag in its environment, so after a kill nothing of it can
hide, reparented or not: :meth:`JobProcess.kill` sends SIGKILL to the group and then to every
process that still carries the tag, and waits until none is left.

Where a kill lands is read from disk after the kill, when nothing moves any more
(:func:`classify`): the checkpoint's ``offsets/N`` (batch N planned) and ``commits/N`` (batch N
done), and the sink's own record of batch N (``SinkProbe``). That gives three kill points:

- ``between batches``: every planned batch is committed;
- ``mid-batch``: ``offsets/N`` is there, the sink holds nothing of batch N;
- ``mid-commit``: the sink holds batch N (being written, or committed) but ``commits/N`` is
  not written: on restart Spark runs batch N again and the sink must recognise it.

The plan (which kill point to aim at, in which batch, after what delay) comes from a seeded RNG,
so a failing run can be repeated; the exact instant of a kill depends on the machine.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

#: Environment variable that marks every process of a job (the driver, its JVM, Python workers).
TAG_VAR = "SPARKSTATE_CRASH_TEST_TAG"

BETWEEN, MID_BATCH, MID_COMMIT = "between batches", "mid-batch", "mid-commit"
KILL_POINTS = (MID_BATCH, MID_COMMIT, BETWEEN)


# --- processes -----------------------------------------------------------------------------

def tagged_processes(tag: str) -> list[int]:
    """Pids of live processes whose environment holds ``TAG_VAR=tag`` (zombies excluded)."""
    needle = f"{TAG_VAR}={tag}".encode()
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/environ", "rb") as f:
                env = f.read()
            with open(f"/proc/{entry.name}/stat", "rb") as f:
                state = f.read().rsplit(b")", 1)[1].split()[0]
        except OSError:  # gone, or not ours to read
            continue
        if state != b"Z" and needle in env.split(b"\0"):
            found.append(int(entry.name))
    return found


class JobProcess:
    """One ``sparkstate run`` subprocess in a process group of its own, tagged for clean-up."""

    def __init__(self, args: Sequence[str], log: Path, tag: str, cwd: Path, env: dict[str, str] | None = None) -> None:
        self.tag = tag
        self.log = log
        env = dict(os.environ, **(env or {}), **{TAG_VAR: tag})
        with open(log, "ab") as out:
            out.write(f"\n=== {' '.join(args)}\n".encode())
            out.flush()
            self.proc = subprocess.Popen(list(args), stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         env=env, cwd=cwd, start_new_session=True)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def running(self) -> bool:
        return self.proc.poll() is None

    def kill(self, timeout_s: float = 30.0) -> None:
        """SIGKILL the group and every tagged straggler; return when none of them is left."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        deadline = time.monotonic() + timeout_s
        while True:
            left = [p for p in tagged_processes(self.tag) if p != os.getpid()]
            for p in left:  # Spark's Python worker daemon puts itself in a group of its own
                try:
                    os.kill(p, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            if self.proc.poll() is None:
                try:
                    self.proc.wait(0.05)
                except subprocess.TimeoutExpired:
                    pass
            if not left and self.proc.poll() is not None:
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"processes of the job still alive {timeout_s} s after SIGKILL: {left}")
            time.sleep(0.05)

    def tail(self, lines: int = 40) -> str:
        text = self.log.read_text(errors="replace").splitlines()
        return "\n".join(text[-lines:])


# --- what is on disk -----------------------------------------------------------------------

def _numbers(directory: Path) -> list[int]:
    try:
        return sorted(int(n) for n in os.listdir(directory) if n.isdigit())
    except FileNotFoundError:
        return []


class Checkpoint:
    """The streaming query's own logs: ``offsets/N`` (batch N planned) and ``commits/N`` (done)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def planned(self, n: int) -> bool:
        return (self.path / "offsets" / str(n)).exists()

    def committed(self, n: int) -> bool:
        return (self.path / "commits" / str(n)).exists()

    def last_planned(self) -> int | None:
        got = _numbers(self.path / "offsets")
        return got[-1] if got else None

    def last_committed(self) -> int | None:
        got = _numbers(self.path / "commits")
        return got[-1] if got else None

    def watermark_ms(self, n: int) -> int:
        """``batchWatermarkMs`` recorded for batch ``n``."""
        return int(self._metadata(n)["batchWatermarkMs"])

    def timestamp_ms(self, n: int) -> int:
        """``batchTimestampMs`` (the batch's processing time) recorded for batch ``n``."""
        return int(self._metadata(n)["batchTimestampMs"])

    def _metadata(self, n: int) -> dict:
        lines = (self.path / "offsets" / str(n)).read_text().splitlines()
        return json.loads(lines[1])


NONE, WRITING, WRITTEN = "none", "writing", "written"


class SinkProbe:
    """What a sink holds of batch ``n``: ``none``, ``writing`` (partly, invisible to readers) or ``written``."""

    name = "sink"

    def start_run(self) -> None:
        """Called before each run (remember what is already there)."""

    def state(self, n: int) -> str:
        raise NotImplementedError

    def close(self) -> None:
        pass


class ParquetProbe(SinkProbe):
    """An append-mode file sink: a batch's tasks write under ``DIR/_sparkstate_tmp``, its files are then
    moved into DIR, and ``_spark_metadata/N`` commits them (``writing``: either of the first two)."""

    name = "parquet"

    def __init__(self, out: Path) -> None:
        self.out = out
        self.known: set[str] = set()

    def _parts(self) -> set[str]:
        try:
            return {n for n in os.listdir(self.out) if n.startswith("part-")}
        except FileNotFoundError:
            return set()

    def start_run(self) -> None:
        self.known = self._parts()

    def mark_batch_start(self) -> None:
        self.known = self._parts()

    def state(self, n: int) -> str:
        if (self.out / "_spark_metadata" / str(n)).exists() or (self.out / "_spark_metadata" / f"{n}.compact").exists():
            return WRITTEN
        return WRITING if self._parts() - self.known or self._staged() else NONE

    def _staged(self) -> bool:
        for _, _, names in os.walk(self.out / "_sparkstate_tmp"):
            if any(n.startswith("part-") for n in names):
                return True
        return False

    def committed_files(self) -> set[str]:
        """Names of the part files the sink's log lists (what a reader sees)."""
        files: set[str] = set()
        meta = self.out / "_spark_metadata"
        for p in meta.iterdir() if meta.is_dir() else []:
            if p.name.split(".")[0].isdigit():
                for line in p.read_text().splitlines()[1:]:
                    files.add(Path(json.loads(line)["path"]).name)
        return files

    def orphan_files(self) -> int:
        """Part files of killed attempts: in DIR, but in no committed batch (pandas, pyarrow and DuckDB
        would read them)."""
        return len(self._parts() - self.committed_files())


class PostgresProbe(SinkProbe):
    """The postgres sink: a batch is in the table exactly when its row is in the progress table."""

    name = "postgres"

    def __init__(self, connect: Callable[[], object], table: str) -> None:
        self.conn = connect()
        self.table = table

    def state(self, n: int) -> str:
        got = self.conn.execute(  # type: ignore[attr-defined]
            "SELECT 1 FROM sparkstate_sink_batches WHERE sink_id LIKE %s AND batch_id = %s",
            (f"{self.table}@%", n)).fetchone()
        return WRITTEN if got else NONE

    def close(self) -> None:
        self.conn.close()  # type: ignore[attr-defined]


class DeltaProbe(SinkProbe):
    """The delta sink: batch N is in the table exactly when the table's transaction for the query is >= N."""

    name = "delta"

    def __init__(self, table: Path, checkpoint: Path) -> None:
        self.table = table
        self.checkpoint = checkpoint

    def state(self, n: int) -> str:
        from sparkstate.io.delta import committed_version

        try:
            query_id = json.loads((self.checkpoint / "metadata").read_text())["id"]
        except (OSError, ValueError, KeyError):
            return NONE
        done = committed_version(str(self.table), f"sparkstate:{query_id}")
        return WRITTEN if done is not None and done >= n else NONE


def classify(ck: Checkpoint, sink: SinkProbe) -> tuple[str, int | None, str]:
    """(kill point, batch, sink state of that batch) as the disk shows it after a kill."""
    planned, committed = ck.last_planned(), ck.last_committed()
    if planned is None or planned == committed:
        return BETWEEN, committed, NONE if committed is None else sink.state(committed)
    state = sink.state(planned)
    return (MID_BATCH if state == NONE else MID_COMMIT), planned, state


# --- the plan and the kills ----------------------------------------------------------------

@dataclass(frozen=True)
class PlannedKill:
    """Aim: ``point`` in the ``skip``-th batch this run starts; ``delay_s`` into the batch (mid-batch);
    ``wait_for`` the sink state that triggers a mid-commit kill (``writing`` or ``written``)."""

    point: str
    skip: int
    delay_s: float = 0.0
    wait_for: str = WRITTEN


def plan_kills(seed: int, sink: str, points: Sequence[str] = KILL_POINTS, extra: int = 0,
               wait_for: str | None = None) -> list[PlannedKill]:
    """Each of ``points`` once, plus ``extra`` kill points drawn at random, in a seeded random order.

    A mid-commit kill waits for the sink state ``wait_for`` (default: drawn for a file sink, which
    shows a batch being written before it commits it; ``written`` for postgres).

    >>> [k.point for k in plan_kills(5, "parquet")] == [k.point for k in plan_kills(5, "parquet")]
    True
    >>> sorted(k.point for k in plan_kills(5, "postgres")) == sorted(KILL_POINTS)
    True
    """
    rng = random.Random(f"{seed}/{sink}")
    aims = list(points) + [rng.choice(KILL_POINTS) for _ in range(extra)]
    rng.shuffle(aims)
    out = []
    for point in aims:
        drawn = rng.choice((WRITING, WRITTEN)) if sink == "parquet" else WRITTEN
        out.append(PlannedKill(point, skip=rng.randint(0, 1), delay_s=round(rng.uniform(0.0, 0.4), 3),
                               wait_for=wait_for or drawn))
    return out


@dataclass
class Kill:
    """A kill as it happened: the aim, and where it landed."""

    run: int
    planned: PlannedKill
    point: str
    batch: int | None
    sink_state: str
    seconds_into_run: float


def _trigger(plan: PlannedKill, ck: Checkpoint, sink: SinkProbe, target: int, since: float | None) -> bool:
    """True when the job should die now for ``plan`` aimed at batch ``target``."""
    if plan.point == BETWEEN:
        return ck.committed(target) and not ck.planned(target + 1)
    if not ck.planned(target) or ck.committed(target):
        return False
    state = sink.state(target)
    if plan.point == MID_BATCH:
        return state == NONE and since is not None and time.monotonic() - since >= plan.delay_s
    return state == WRITTEN if plan.wait_for == WRITTEN else state != NONE


@dataclass
class CrashingJob:
    """One job (its command line, checkpoint and sink) run again and again on the same checkpoint.

    Every process of every run carries ``tag`` (see :func:`tagged_processes`); no run starts
    while a process of an earlier one is alive.
    """

    args: Sequence[str]
    checkpoint: Checkpoint
    sink: SinkProbe
    log: Path
    cwd: Path
    env: dict[str, str] = field(default_factory=dict)
    tag: str = field(default_factory=lambda: uuid.uuid4().hex)
    runs: int = 0
    seconds: list[float] = field(default_factory=list)  # wall time of each run

    def _start(self) -> JobProcess:
        self.runs += 1
        return JobProcess(self.args, self.log, self.tag, self.cwd, self.env)

    def run_to_end(self, timeout_s: float) -> int:
        """Run the job until it ends by itself (no kill); its return code."""
        job = self._start()
        started = time.monotonic()
        try:
            job.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"the job did not finish in {timeout_s} s; its log ends:\n{job.tail()}") from None
        finally:
            job.kill()
            self.seconds.append(round(time.monotonic() - started, 1))
        return job.proc.returncode

    def run_and_kill(self, plan: PlannedKill, timeout_s: float, poll_s: float = 0.004) -> Kill | None:
        """Start the job, SIGKILL it as ``plan`` says, return where the kill landed.

        The target is the ``plan.skip``-th batch this run starts. When the moment is missed (the
        batch committed first), the next batch is the target. ``None``: the job ended by itself.
        """
        ck, sink = self.checkpoint, self.sink
        last = ck.last_committed()
        target = (-1 if last is None else last) + 1 + plan.skip
        run = self.runs + 1
        job = self._start()
        started = time.monotonic()
        try:
            sink.start_run()
            since: float | None = None
            while True:
                if time.monotonic() - started > timeout_s:
                    raise AssertionError(f"run {run}: kill point {plan.point!r} not reached in {timeout_s} s (target"
                                         f" batch {target}); the job's log ends:\n{job.tail()}")
                if since is None and ck.planned(target):
                    since = time.monotonic()
                    if isinstance(sink, ParquetProbe):
                        sink.mark_batch_start()
                if _trigger(plan, ck, sink, target, since):
                    job.kill()
                    point, batch, state = classify(ck, sink)
                    return Kill(run, plan, point, batch, state, round(time.monotonic() - started, 1))
                if ck.committed(target) and (plan.point != BETWEEN or ck.planned(target + 1)):
                    target, since = target + 1, None  # missed this batch's window: aim at the next one
                    continue
                if not job.running():
                    if job.proc.returncode != 0:
                        raise AssertionError(f"run {run}: the job failed ({job.proc.returncode}) before it was"
                                             f" killed; its log ends:\n{job.tail()}")
                    return None
                time.sleep(poll_s)
        finally:
            job.kill()
            self.seconds.append(round(time.monotonic() - started, 1))

    def crash_and_restart(self, plan: Sequence[PlannedKill], timeout_s: float, retries: int = 2) -> list[Kill]:
        """Every planned kill, each in a run of its own, then one run to the end (which must succeed).

        A kill that lands elsewhere than aimed (the moment passed between the look at the disk
        and the signal) still counts as a kill; the aim is then tried again, up to ``retries``
        more times.
        """
        kills: list[Kill] = []
        todo = [(p, retries) for p in plan]
        while todo:
            aim, left = todo.pop(0)
            kill = self.run_and_kill(aim, timeout_s)
            if kill is None:
                raise AssertionError(f"the job ended before the planned kill {aim}; it needs more input files")
            kills.append(kill)
            if kill.point != aim.point and left > 0:
                todo.insert(0, (aim, left - 1))
        code = self.run_to_end(timeout_s)
        assert code == 0, f"the last run failed ({code}); see {self.log}"
        return kills

    def leftovers(self) -> list[int]:
        """Processes of any run still alive (must be none)."""
        return tagged_processes(self.tag)


def cli(*args: str) -> list[str]:
    """``sparkstate ARGS`` as this interpreter runs it."""
    return [sys.executable, "-m", "sparkstate.cli", *args]
