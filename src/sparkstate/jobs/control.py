"""Ending streaming queries well: "caught up" detection, and stopping between micro-batches.

``processAllAvailable()`` never returns for a query with processing-time timers (Spark runs a
no-data batch at every trigger), and ``trigger(availableNow=True)`` never ends for one. So a
job that must "process what is there, then stop" watches each query instead
(:func:`is_caught_up`): it is done when its last trigger found no new data in the source, seen
either in the status between triggers (``isDataAvailable`` false) or in the last progress
report (a batch whose sources' start and end offsets are equal). That trigger ran the no-data
batch Spark needed, if any: in event time the batch with the final watermark, which fired
every timer due by it. Processing-time timers that are not due yet are not waited for: they
stay in the checkpoint's state, and a restart continues them.

Stopping a query inside a batch interrupts its state-store commit (a stack trace in Spark's
log; the batch is redone on restart): :func:`stop_after_current_batch` lets the running batch
commit first, and then the no-data batch that batch made owed (the timeouts its watermark made
due), which Spark starts at its next trigger.
"""

from __future__ import annotations

import json
import logging
import time
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Callable, Iterator, Sequence

from ..errors import JobFailedError, explain, from_spark

if TYPE_CHECKING:
    from pyspark.sql.streaming import StreamingQuery

log = logging.getLogger("sparkstate.jobs")

#: How Spark's status messages begin before a query's first trigger.
STARTING_PREFIX = "Initializing"
#: Spark's status message after a trigger that asked the sources and planned no batch.
WAITING_FOR_DATA = "Waiting for data to arrive"


#: What the OS says, through Java or Python, when a write finds its filesystem full.
DISK_FULL = ("No space left on device", "Disk quota exceeded")


def failure(query: "StreamingQuery", what: str = "query") -> JobFailedError | None:
    """The error of a query that stopped on one, else ``None``.

    A full disk gets a line of its own: Spark reports it as a bare ``IOException`` from whatever
    was writing (the checkpoint's logs or state, a file sink, Spark's local directory).

    >>> class Failed:
    ...     isActive = False
    ...     def exception(self):
    ...         return ("[STREAM_FAILED] Query [id = 1] terminated with exception:"
    ...                 " java.io.IOException: No space left on device")
    >>> print(failure(Failed()))  # doctest: +NORMALIZE_WHITESPACE
    the query stopped: No space left on device: a disk it writes to is full (its checkpoint, a sink, or Spark's
    local directory). Free space and run the job again: it goes on from its last committed batch.
    """
    if query.isActive:
        return None
    exc = query.exception()
    if exc is None:
        return None
    text = str(exc)
    full = next((m for m in DISK_FULL if m in text), None)
    if full is not None:
        return JobFailedError(f"the {what} stopped: {full}: a disk it writes to is full (its checkpoint, a sink,"
                              " or Spark's local directory). Free space and run the job again: it goes on from its last"
                              " committed batch.")
    return JobFailedError(f"the {what} stopped with an error: {explain(exc)}")


def _no_data_batch(progress: Any) -> bool:
    """Whether a progress report is of a batch that found no new data in any source."""
    try:
        report = progress if isinstance(progress, dict) else json.loads(progress.json)  # PySpark 3.5: a dict
    except Exception:
        return False
    sources = report.get("sources") or []
    return bool(sources) and all(
        s.get("startOffset") is not None and s.get("startOffset") == s.get("endOffset") for s in sources
    )


def is_caught_up(query: "StreamingQuery", after_batch: int | None = None) -> bool:
    """Whether ``query`` has processed everything its source had (see the module docstring).

    Either the query is between triggers and its last trigger found no new data (Spark sets
    ``isDataAvailable`` when it asks the source), or its last batch read no new offsets: a
    no-data batch, which a query with processing-time timers runs at every trigger, so that
    its batches may follow each other without a gap to observe. Either way, the no-data batch
    Spark needed after the input (the final watermark's, firing the timers due by it) has run.
    A stopped query is caught up (there is nothing more it will do).

    ``after_batch``: a batch the query runs first without asking its sources (the no-data
    batch a stop left owed, :func:`sparkstate.owed_batch.queue_owed_batch`): it says nothing of
    the input, so only a later batch, or a trigger that asked the sources and planned none,
    counts.
    """
    if not query.isActive:
        return True
    status: dict[str, Any] = query.status
    last = query.lastProgress
    past = after_batch is None or (last is not None and last["batchId"] > after_batch)
    message = str(status.get("message", ""))
    if not status.get("isTriggerActive") and not status.get("isDataAvailable") \
            and not message.startswith(STARTING_PREFIX) and (past or message == WAITING_FOR_DATA):
        return True
    return past and last is not None and _no_data_batch(last)


def _last_batch(query: "StreamingQuery") -> int | None:
    last = query.lastProgress
    return None if last is None else last["batchId"]  # a dict on PySpark 3.5, dict-like on 4.x


def wait_until_caught_up(
    queries: Sequence[tuple[str, "StreamingQuery"]], poll_s: float = 0.2, timeout_s: float | None = None,
    after_batch: int | None = None,
) -> bool:
    """Block until every query has been seen caught up (each once: later input is not waited for).

    ``queries`` are ``(what, query)`` pairs (``what`` names the query in errors). Raises
    :class:`JobFailedError` when one fails; returns ``False`` when ``timeout_s`` passes first.
    ``after_batch``: see :func:`is_caught_up`.
    """
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    pending = list(queries)
    while True:
        with _read_from_spark(queries):
            pending = [(what, q) for what, q in pending if not is_caught_up(q, after_batch)]
            for what, q in queries:  # after: a query that failed meanwhile looks caught up (it is stopped)
                err = failure(q, what)
                if err is not None:
                    raise err
        if not pending:
            return True
        if deadline is not None and time.monotonic() > deadline:
            return False
        time.sleep(poll_s)


def wait_until_stopped(queries: Sequence[tuple[str, "StreamingQuery"]], poll_s: float = 0.5) -> None:
    """Block until a query fails (raises :class:`JobFailedError`) or all are stopped.

    Ctrl-C (``KeyboardInterrupt``) ends the wait; the caller stops the queries.
    """
    while True:
        with _read_from_spark(queries):
            for what, q in queries:
                err = failure(q, what)
                if err is not None:
                    raise err
            if not any(q.isActive for _, q in queries):
                return
        time.sleep(poll_s)


@contextmanager
def _read_from_spark(queries: Sequence[tuple[str, "StreamingQuery"]]) -> Iterator[None]:
    """Turn a failed call into Spark (reading a query's status or progress through py4j or Connect) into
    a :class:`JobFailedError`: the error of a query that stopped on one when it can still be read, else
    a line saying the status could not be read."""
    try:
        yield
    except Exception as exc:
        if isinstance(exc, JobFailedError) or not from_spark(exc):
            raise
        for what, q in queries:
            try:
                err = failure(q, what)
            except Exception:  # Spark cannot be asked that either
                err = None
            if err is not None:
                raise err from exc
        names = " and ".join(what for what, _ in queries)
        raise JobFailedError(f"the {names}'s status could not be read from Spark ({explain(exc)}); run the job"
                             " again: it goes on from its last committed batch") from exc


def _wait_for_running_batch(query: "StreamingQuery", deadline: float) -> None:
    """Until the micro-batch running now (if any) has ended, the query stopped, or ``deadline``."""
    if not (query.isActive and query.status.get("isTriggerActive")):
        return
    done = _last_batch(query)
    done = -1 if done is None else done
    while query.isActive and time.monotonic() < deadline:
        if not query.status.get("isTriggerActive"):
            return
        last = _last_batch(query)
        if last is not None and last > done:
            return
        time.sleep(0.02)


def _wait_for_batch(query: "StreamingQuery", batch_id: int, deadline: float) -> bool:
    """Until batch ``batch_id`` has ended (its progress is reported); ``False`` when the query stopped or
    ``deadline`` passed first."""
    while query.isActive and time.monotonic() < deadline:
        last = _last_batch(query)
        if last is not None and last >= batch_id:
            return True
        time.sleep(0.05)
    return False


def stop_after_current_batch(query: "StreamingQuery", wait_s: float = 60.0,
                             owed: Callable[[], int | None] | None = None) -> None:
    """Let a running micro-batch commit, then the no-data batch it made owed, then stop the query.

    Batches of a file stream may follow each other without a gap, so only the batch running
    when this is called is waited for (the next one may have begun when the query stops; the
    checkpoint redoes it on restart). ``owed()``, when given, names the no-data batch Spark owes
    after the last committed one, or ``None`` (see :func:`sparkstate.owed_batch.owed_batch`):
    that batch fires the event-time timers the last batch's watermark made due, and Spark starts
    it at its next trigger, so it is let run and commit too (that one only: while input arrives,
    every batch owes the next). All of it within ``wait_s``; a
    second Ctrl-C (``KeyboardInterrupt``) meanwhile stops the query at once. A batch not run
    then is not lost: a restart runs it first (:func:`sparkstate.owed_batch.queue_owed_batch`).
    """
    deadline = time.monotonic() + wait_s
    try:
        _wait_for_running_batch(query, deadline)
        batch = owed() if owed is not None and query.isActive else None
        if batch is not None:  # one: with input arriving, every batch owes the next
            log.info("stopping after batch %d, the no-data batch that fires the timeouts the last watermark made"
                     " due (Ctrl-C again to stop now; a restart runs it)", batch)
            _wait_for_batch(query, batch, deadline)
    except KeyboardInterrupt:
        log.warning("stopping now; a restart on the checkpoint runs what was not committed")
    query.stop()


__all__ = [
    "STARTING_PREFIX",
    "JobFailedError",
    "failure",
    "is_caught_up",
    "stop_after_current_batch",
    "wait_until_caught_up",
    "wait_until_stopped",
]
