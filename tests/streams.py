"""Drive real Spark streams from tests: a JSON landing directory in, a collecting sink out.

``processAllAvailable()`` never returns for a query with processing-time timers (it runs a
no-data batch at every trigger), so :class:`StreamRun` waits on progress events instead:
"every row written so far has been through a finished batch".
"""

from __future__ import annotations

import datetime as dt
import itertools
import json
import os
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any, Callable, Iterable

from pyspark.sql import DataFrame, Row, SparkSession
from sparkstate.engines.inband.seeds import SEED_DIR
from sparkstate.observe.listener import JsonProgressListener

_counter = itertools.count()


class _Progress(JsonProgressListener):
    def __init__(self) -> None:
        self.rows: dict[str, int] = {}
        self.batches: dict[str, int] = {}
        self.lock = threading.Lock()

    def onQueryStarted(self, event: Any) -> None:
        pass

    def onQueryProgress(self, event: Any) -> None:
        p = event.progress
        with self.lock:
            run = str(p.runId)  # a restarted query keeps its id but gets a new runId
            # the rows the query read, but not the seeds of an initial state on the inband engine
            # (sparkstate.engines.inband.seeds: a file source of their own, read in batch 0)
            rows = sum(s.numInputRows for s in p.sources if SEED_DIR not in s.description)
            self.rows[run] = self.rows.get(run, 0) + rows
            self.batches[run] = self.batches.get(run, 0) + 1

    def onQueryIdle(self, event: Any) -> None:
        pass

    def onQueryTerminated(self, event: Any) -> None:
        pass


_listener: _Progress | None = None


def progress_listener(spark: SparkSession) -> _Progress:
    global _listener
    if _listener is None:
        _listener = _Progress()
        spark.streams.addListener(_listener)
    return _listener


def _default(o: Any) -> Any:
    if isinstance(o, datetime):
        return o.isoformat()
    raise TypeError(type(o).__name__)


_last_mtime_ms = 0


class LandingDir:
    """A directory a file source reads; each :meth:`add` is one new file (one micro-batch)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        self.rows_written = 0

    def add(self, rows: Iterable[dict]) -> None:
        rows = list(rows)
        name = f"part-{next(_counter):06d}"
        tmp = self.path / f".{name}.tmp"
        tmp.write_text("".join(json.dumps(r, default=_default) + "\n" for r in rows))
        # Strictly increasing modification times (ms, as the file source reads them): files
        # landed in one go are still read in the order they were added.
        global _last_mtime_ms
        _last_mtime_ms = max(int(time.time() * 1000), _last_mtime_ms + 1)
        os.utime(tmp, ns=(_last_mtime_ms * 1_000_000, _last_mtime_ms * 1_000_000))
        tmp.rename(self.path / f"{name}.json")
        self.rows_written += len(rows)

    def stream(self, spark: SparkSession, schema: str) -> DataFrame:
        return spark.readStream.schema(schema).option("maxFilesPerTrigger", 1).json(str(self.path))


class _Stopped(Exception):
    """A batch refused because the test is stopping its query (:meth:`StreamRun.stop`)."""


class StreamRun:
    """A running query whose output batches are collected in :attr:`rows` (driver side)."""

    def __init__(
        self,
        spark: SparkSession,
        out: DataFrame,
        checkpoint: Path,
        *,
        landing: LandingDir | None = None,
        output_mode: str = "update",
        trigger: str = "300 milliseconds",
        already_read: int = 0,
    ) -> None:
        self.spark = spark
        self.landing = landing
        self.rows: list[Row] = []
        self.batches: list[list[Row]] = []
        self._lock = threading.Lock()
        self._listener = progress_listener(spark)
        self._stopping = threading.Event()

        def collect(batch_df: DataFrame, batch_id: int) -> None:
            if self._stopping.is_set():  # see stop(): this batch runs no task, and is not committed
                raise _Stopped(f"batch {batch_id} not run: the test stops the query")
            got = batch_df.collect()
            with self._lock:
                self.batches.append(got)
                self.rows.extend(got)

        self.query = (
            out.writeStream.outputMode(output_mode)
            .foreachBatch(collect)
            .option("checkpointLocation", str(checkpoint))
            .trigger(processingTime=trigger)
            .start()
        )
        # Rows of the landing dir that an earlier run on the same checkpoint already read.
        self._rows_at_start = already_read

    @property
    def input_rows(self) -> int:
        return self._listener.rows.get(str(self.query.runId), 0)

    def wait_input(self, n: int | None = None, timeout: float = 120.0) -> None:
        """Wait until ``n`` input rows (default: all rows in the landing dir) went through batches."""
        want = n if n is not None else (self.landing.rows_written - self._rows_at_start if self.landing else 0)
        deadline = time.time() + timeout
        while self.input_rows < want:
            self._check_alive()
            if time.time() > deadline:
                raise TimeoutError(f"only {self.input_rows} of {want} input rows processed after {timeout}s")
            time.sleep(0.1)

    def wait_for(self, predicate: Callable[[list[Row]], bool], timeout: float = 120.0) -> None:
        """Wait until ``predicate(self.rows)`` holds."""
        deadline = time.time() + timeout
        while True:
            with self._lock:
                if predicate(list(self.rows)):
                    return
            self._check_alive()
            if time.time() > deadline:
                raise TimeoutError(f"condition not met after {timeout}s; rows so far: {self.rows}")
            time.sleep(0.1)

    def wait_batches(self, k: int, timeout: float = 60.0) -> None:
        """Wait until ``k`` more batches (with or without data) have finished."""
        start = self._listener.batches.get(str(self.query.runId), 0)
        deadline = time.time() + timeout
        while self._listener.batches.get(str(self.query.runId), 0) < start + k:
            self._check_alive()
            if time.time() > deadline:
                raise TimeoutError(f"{k} batches did not finish in {timeout}s")
            time.sleep(0.05)

    def data_batch_times_ms(self) -> list[int]:
        """The trigger time (epoch ms: the batch's processing time, which processing-time timeouts
        and state TTL are measured with) of each finished batch that read rows, in order."""
        return [int(dt.datetime.fromisoformat(p["timestamp"].replace("Z", "+00:00")).timestamp() * 1000)
                for p in self.query.recentProgress if p["numInputRows"] > 0]

    def _check_alive(self) -> None:
        if not self.query.isActive:
            exc = self.query.exception()
            if exc is not None:
                raise exc
            raise RuntimeError("the query stopped")

    def stop(self) -> None:
        """Stop between batches, never while a batch's tasks run.

        A stop during a batch interrupts its tasks; on PySpark 3.5 that can kill the JVM (a task's
        writer thread still reading state through a RocksDB iterator the interrupted task closed:
        SIGSEGV), and elsewhere it logs an interrupted-commit trace. A query with processing-time
        timers runs no-data batches back to back, with no gap to stop in. So the next batch is
        refused at its start, before its job (it is not committed: a restart runs it), and the
        query is stopped once no batch runs.
        """
        self._stopping.set()
        deadline = time.time() + 60
        while self.query.isActive and self.query.status.get("isTriggerActive") and time.time() < deadline:
            time.sleep(0.02)
        if self.query.isActive:
            self.query.stop()

    def __enter__(self) -> "StreamRun":
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.query.isActive:
            self.stop()


def failure(run: StreamRun, timeout: float = 60.0) -> str:
    """Wait for the query to fail; return the failure's text."""
    try:
        run.query.awaitTermination(timeout)
    except Exception as exc:  # StreamingQueryException
        return str(exc)
    raise AssertionError("the query did not fail")


def source_scans(checkpoint: Path) -> set[int]:
    """How many times each planned micro-batch of ``checkpoint`` scans its input: the sources its
    offset-log entry lists (a query that reads its input twice holds two sources of it)."""
    entries = [p.read_text().splitlines()[2:] for p in (Path(checkpoint) / "offsets").iterdir() if p.name.isdigit()]
    assert entries, f"no micro-batch was planned in {checkpoint}"
    return {len(lines) for lines in entries}


def committed_files(directory: Path) -> dict[int, list[str]]:
    """The files each micro-batch committed to a Spark file sink at ``directory`` (its _spark_metadata log)."""
    from urllib.parse import urlparse

    batches = {}
    for entry in (Path(directory) / "_spark_metadata").iterdir():
        if entry.name.isdigit():
            lines = entry.read_text().splitlines()[1:]  # the first line is the log's version
            batches[int(entry.name)] = [urlparse(json.loads(line)["path"]).path for line in lines]
    return batches
