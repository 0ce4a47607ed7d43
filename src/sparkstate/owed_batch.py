"""The micro-batch a stopped query still owes, written into Spark's offset log so that its restart runs it.

After a micro-batch that moved the watermark, Spark runs one more, with no new data, to fire the
event-time timers the new watermark made due (and evict what it expired); a query with a
processing-time operator runs one at every trigger, to fire the timers the clock made due. Spark
decides this from the batch it has just run (its last execution's ``shouldRunAnotherBatch``). A
query that stops in between (Ctrl-C between two triggers, a crash, a ``--once`` run that ended)
restarts without a last execution, and then Spark plans a batch only when a source has new data:
the due timers wait for the next input, however long, and forever for a ``--once`` run on a
source with nothing new.

What Spark keeps in the checkpoint is enough to tell and to mend it. ``offsets/N`` holds batch
N's plan: the source offsets it read up to and its metadata (``batchWatermarkMs``, the watermark
it ran with; ``batchTimestampMs``, its processing time; the settings the query keeps);
``commits/N`` says N is done and holds ``nextBatchWatermarkMs``, the watermark of the batch
after it. When the last planned batch N is committed and either the next watermark is ahead of
N's or the query has a processing-time operator (its state metadata's time mode), Spark owes
batch N+1 (:func:`owed_batch`). :func:`queue_owed_batch` writes ``offsets/N+1`` as Spark would
have written it at its next trigger: N's source offsets (nothing new to read), N's metadata with
the watermark raised to the next one and the batch's time set to now. On start, Spark finds a
planned batch that is not committed and runs it first, as it runs a batch a crash interrupted;
it then has a last execution and goes on as usual. Checkpoints of any release carry these logs,
so nothing else about them changes.

A query started by :func:`sparkstate.jobs.run_pipeline` (``sparkstate run``) or
:func:`sparkstate.io.start_sink` gets this before it starts; a query you start yourself needs
one call before ``start()``::

    from sparkstate.jobs import queue_owed_batch

    queue_owed_batch(spark, CHECKPOINT)
    query = out.writeStream.option("checkpointLocation", CHECKPOINT)....start()

Never while a query runs on the checkpoint: it plans its batches itself, and two writers of one
offset log make Spark stop the query (:func:`queue_owed_batch` refuses when a query of this
session runs on it).
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from . import fs
from .engines.checkpoint import operators, stored_query_id
from .errors import ConfigError
from .paths import absolute_path
from .spark import is_connect

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger("sparkstate.owed_batch")

#: Offset log versions whose layout is known here: a version line, a metadata line, then one line
#: per source (``v2``: ``sourceId:offset``). Only the metadata line is rewritten.
OFFSET_LOG_VERSIONS = ("v1", "v2")

#: Spark's setting that turns its no-data micro-batches off; when it is off, nothing is owed.
NO_DATA_BATCHES = "spark.sql.streaming.noDataMicroBatches.enabled"

#: The time mode Spark records (state metadata) for an operator with processing-time timers.
PROCESSING_TIME = "ProcessingTime"

OwedBecause = Literal["watermark", "processing_time"]


@dataclass(frozen=True)
class OwedBatch:
    """The no-data micro-batch ``batch_id`` a query owes after its committed batch ``batch_id - 1``.

    ``watermark_ms``: the watermark it runs with; ``because``: ``"watermark"`` (the batch before
    moved the watermark: event-time timers may be due) or ``"processing_time"`` (an operator with
    processing-time timers, which Spark runs a batch for at every trigger).
    """

    batch_id: int
    watermark_ms: int
    because: OwedBecause


def _latest(root: str, log_dir: str, spark: "SparkSession | None") -> int | None:
    ids = [int(n) for n in fs.list_names(fs.join(root, log_dir), spark) if n.isdigit()]
    return max(ids) if ids else None


def _entry(path: str, spark: "SparkSession | None") -> tuple[list[str], dict]:
    """A log entry's lines and its metadata (the JSON of its second line)."""
    return _parsed(path, fs.read_text(path, spark))


def _parsed(path: str, text: str) -> tuple[list[str], dict]:
    lines = text.split("\n")
    try:
        meta = json.loads(lines[1]) if len(lines) > 1 and lines[1].strip() else {}
    except ValueError:
        meta = None
    if not lines[0].startswith("v") or not isinstance(meta, dict):
        raise ConfigError(f"{path}: not a log entry of a Spark streaming query: expected a version line (v1) and"
                          f" a JSON line, got {lines[0][:40]!r} first; point at the checkpoint of a streaming query,"
                          " or move this file away if it was edited by hand")
    return lines, meta


def planned_sources(checkpoint: str | os.PathLike, spark: "SparkSession | None" = None) -> int | None:
    """How many source scans the query of ``checkpoint`` planned its newest micro-batch with (an
    offset per scan, after the metadata line of ``offsets/N``), or ``None`` when it planned none.
    Spark refuses to go on with a query that scans its sources another number of times. Over
    Spark Connect, where this process cannot reach the checkpoint's store, the server reads the log
    (:func:`sparkstate.fs.server_files`).

    >>> import tempfile, os
    >>> ck = tempfile.mkdtemp()
    >>> planned_sources(ck) is None
    True
    >>> os.mkdir(f"{ck}/offsets")
    >>> _ = open(f"{ck}/offsets/0", "w").write('v1\\n{"batchWatermarkMs":0}\\n{"logOffset":0}\\n{"logOffset":0}')
    >>> planned_sources(ck)
    2
    """
    root = absolute_path(checkpoint)
    offsets = fs.join(root, "offsets")
    try:
        if not fs.exists(offsets, spark):
            return None
        planned = _latest(root, "offsets", spark)
        if planned is None:
            return None
        lines, _ = _entry(fs.join(offsets, str(planned)), spark)
    except fs.FsUnavailable:
        if spark is None or not is_connect(spark):
            raise
        # Spark Connect, a store only the server reaches: the server's file source reads the log.
        entries = {int(name): text for name, text in fs.server_files(offsets, spark).items() if name.isdigit()}
        if not entries:
            return None
        planned = max(entries)
        lines, _ = _parsed(fs.join(offsets, str(planned)), entries[planned])
    return len([line for line in lines[2:] if line.strip()])


def _processing_time(spark: "SparkSession | None", root: str) -> bool:
    """Whether the checkpoint's state metadata records an operator with processing-time timers."""
    if spark is None:
        return False
    try:
        return any(op["time_mode"] == PROCESSING_TIME for op in operators(spark, root))
    except Exception as exc:  # no state, or a Spark that cannot read state metadata: nothing says so
        log.info("%s: no time mode in its state metadata (%s); owed batches are told by the watermark only",
                 root, str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
        return False


def owed_batch(checkpoint: str | os.PathLike, spark: "SparkSession | None" = None, *,
               processing_time: bool | None = None) -> OwedBatch | None:
    """The no-data micro-batch the query of ``checkpoint`` owes and has not planned, else ``None``.

    ``None`` too when nothing is committed yet, or when the last planned batch is not committed
    (Spark runs that one again on start, and what follows it as usual). ``processing_time``: whether
    the query has processing-time timers; ``None`` reads it from the checkpoint's state metadata
    (through ``spark``). On any filesystem Spark reaches (:mod:`sparkstate.fs`).

    >>> import tempfile, os
    >>> ck = tempfile.mkdtemp()
    >>> os.mkdir(f"{ck}/offsets"); os.mkdir(f"{ck}/commits")
    >>> _ = open(f"{ck}/offsets/4", "w").write('v1\\n{"batchWatermarkMs":1000,"batchTimestampMs":5}\\n{"logOffset":4}')
    >>> _ = open(f"{ck}/commits/4", "w").write('v1\\n{"nextBatchWatermarkMs":61000}')
    >>> owed_batch(ck, processing_time=False)
    OwedBatch(batch_id=5, watermark_ms=61000, because='watermark')
    """
    root = absolute_path(checkpoint)
    planned = _latest(root, "offsets", spark)
    if planned is None or _latest(root, "commits", spark) != planned:
        return None
    _, meta = _entry(fs.join(root, "offsets", str(planned)), spark)
    _, commit = _entry(fs.join(root, "commits", str(planned)), spark)
    watermark = int(meta.get("batchWatermarkMs", 0))
    following = int(commit.get("nextBatchWatermarkMs", watermark))
    if following > watermark:
        return OwedBatch(planned + 1, following, "watermark")
    if processing_time is None:
        processing_time = _processing_time(spark, root)
    return OwedBatch(planned + 1, watermark, "processing_time") if processing_time else None


def _query_running_on(spark: "SparkSession", root: str) -> str | None:
    """The name or id of a query of this session that runs on the checkpoint ``root``, else ``None``."""
    try:
        query_id = stored_query_id(spark, root)
    except (OSError, ValueError, KeyError):
        return None
    if query_id is None:
        return None
    for q in spark.streams.active:
        if str(q.id) == query_id:
            return q.name or query_id
    return None


def queue_owed_batch(spark: "SparkSession", checkpoint: str | os.PathLike, *,
                     processing_time: bool | None = None) -> OwedBatch | None:
    """Before a query starts again on ``checkpoint``: plan the no-data micro-batch it owes.

    Writes ``offsets/N+1`` (see the module docstring) when :func:`owed_batch` finds one, so that
    the restarted query runs it first: the event-time timers the last watermark made due, and
    the processing-time timers the clock has, fire without waiting for new input. Returns what
    it planned, or ``None`` (nothing owed, a new checkpoint, Spark's no-data batches turned off in
    the session; with a warning: an offset log of a layout not known here, a checkpoint this
    process cannot reach). Raises
    :class:`~sparkstate.errors.ConfigError` while a query of this session runs on the checkpoint.

    >>> import sparkstate as ss, tempfile
    >>> queue_owed_batch(ss.spark_session(), tempfile.mkdtemp()) is None  # a new checkpoint owes nothing
    True
    """
    root = absolute_path(checkpoint)
    if str(spark.conf.get(NO_DATA_BATCHES, "true")).lower() == "false":
        return None
    try:
        return _queue(spark, root, processing_time)
    except fs.FsUnavailable as exc:  # Spark Connect, a store this process cannot reach
        log.warning("%s: the checkpoint's logs were not read (%s); timeouts its last run left due fire with the"
                    " next input", root, exc)
        return None


def _queue(spark: "SparkSession", root: str, processing_time: bool | None) -> OwedBatch | None:
    running = _query_running_on(spark, root)
    if running is not None:
        raise ConfigError(f"queue_owed_batch: the query {running} is running on {root}; it plans its own batches."
                          " Call this before starting the query, after stopping it")
    owed = owed_batch(root, spark, processing_time=processing_time)
    if owed is None:
        return None
    before = fs.join(root, "offsets", str(owed.batch_id - 1))
    lines, meta = _entry(before, spark)
    if lines[0] not in OFFSET_LOG_VERSIONS:
        log.warning("%s: offset log version %s is not one this release knows (%s); the batch Spark owes after"
                    " batch %d was not planned, and the timers it would fire wait for new input", root, lines[0],
                    ", ".join(OFFSET_LOG_VERSIONS), owed.batch_id - 1)
        return None
    # The batch's processing time: now, as Spark's trigger clock would have given it when planning.
    meta.update(batchWatermarkMs=owed.watermark_ms, batchTimestampMs=int(time.time() * 1000))
    lines[1] = json.dumps(meta, separators=(",", ":"))
    target = fs.join(root, "offsets", str(owed.batch_id))
    if fs.exists(target, spark):  # planned meanwhile: by Spark itself
        return None
    fs.write_text(target, "\n".join(lines), spark)
    log.info("%s: planned batch %d, the no-data batch Spark owes after batch %d (%s; watermark %d ms)", root,
             owed.batch_id, owed.batch_id - 1, "the watermark moved" if owed.because == "watermark"
             else "processing-time timers", owed.watermark_ms)
    return owed


__all__ = ["OwedBatch", "owed_batch", "planned_sources", "queue_owed_batch"]
