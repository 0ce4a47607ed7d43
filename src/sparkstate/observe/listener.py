"""A StreamingQueryListener that records every micro-batch of a job's queries.

Each progress report of a watched query becomes a :class:`~sparkstate.observe.metrics.BatchMetrics`:
appended as one JSON line to the metrics file (when one is given), added to the running
:class:`~sparkstate.observe.metrics.RunTotals`, and passed to ``on_batch`` (a progress display).
Reports of other queries of the session are ignored. Spark calls listeners on its listener
thread, after the batch; :meth:`MetricsListener.wait_for` lets a caller wait until a batch has
been recorded.

>>> import json, tempfile, os
>>> path = os.path.join(tempfile.mkdtemp(), "metrics.jsonl")
>>> listener = MetricsListener(path)
>>> listener.record({"id": "q1", "batchId": 0, "numInputRows": 3}, "output")
>>> listener.close()
>>> json.loads(open(path).read())["rows_in"]
3
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from pathlib import Path
from typing import Any, Callable, Mapping

from pyspark.sql.streaming import StreamingQueryListener

try:
    from pyspark.sql.streaming.listener import JStreamingQueryListener, QueryProgressEvent, StreamingQueryProgress
except ImportError:  # pragma: no cover - a PySpark without them hands events its own way
    JStreamingQueryListener = object  # type: ignore[assignment,misc]

from .metrics import BatchMetrics, Role, RunTotals, batch_metrics

log = logging.getLogger("sparkstate.observe")

# Reports kept for queries not watched yet: a query's first batches, before watch() names it.
_EARLY_QUERIES = 16
_EARLY_REPORTS = 20

OnBatch = Callable[[BatchMetrics, RunTotals], None]


class JsonProgressListener(StreamingQueryListener):
    """A ``StreamingQueryListener`` whose progress events are read from the report's JSON.

    PySpark hands a listener on a local JVM each progress report copied field by field, one call
    into the JVM per field and per state operator, source and observed metric: 180 ms of the two
    processes' CPU for every batch of every query (measured on two cores, a report with two
    observed metrics). Here the report comes over as its JSON in one call (1 ms) and becomes the
    same ``StreamingQueryProgress`` Spark Connect clients get (``StreamingQueryProgress.fromJson``).
    The other events, rare, come as PySpark makes them. On Spark Connect nothing changes.
    """

    @property
    def _jlistener(self) -> Any:
        if JStreamingQueryListener is object:  # pragma: no cover
            return super()._jlistener
        if "_jlistenerobj" not in self.__dict__:
            from pyspark import SparkContext

            jvm: Any = SparkContext._jvm  # the listener is registered on a classic session only
            self._jlistenerobj = jvm.PythonStreamingQueryListenerWrapper(_JsonEvents(self))
        return self._jlistenerobj


class _JsonEvents(JStreamingQueryListener):  # type: ignore[misc,valid-type]
    """The Python object the JVM calls (PySpark's, whose ``pylistener`` and ``Java`` interface it
    keeps): progress from its JSON."""

    def onQueryProgress(self, jevent: Any) -> None:
        try:
            event = QueryProgressEvent(StreamingQueryProgress.fromJson(json.loads(jevent.progress().json())))
        except Exception:  # a report this PySpark cannot read from JSON: field by field, as PySpark does
            event = QueryProgressEvent.fromJObject(jevent)
        self.pylistener.onQueryProgress(event)


class MetricsListener(JsonProgressListener):
    """Records the batches of the queries it :meth:`watch` es; see the module docstring.

    ``path``: the metrics file (JSON lines, appended to; ``None``: no file). ``on_batch``:
    called with each batch's metrics and the totals after it; an exception it raises is logged,
    never passed to Spark.

    Reports that arrive for a query before :meth:`watch` names it (a fast first batch) are
    kept, and recorded when it is named. ``counted``: the output's counts of a batch as the job
    took them (``JobTee.counted_of``), for reports without them (see
    :func:`~sparkstate.observe.metrics.batch_metrics`).
    """

    def __init__(self, path: str | os.PathLike | None = None, on_batch: OnBatch | None = None,
                 counted: Callable[[int], Mapping[str, int] | None] | None = None) -> None:
        self.path = Path(path) if path is not None else None
        self.on_batch = on_batch
        self.counted = counted
        self.totals = RunTotals()
        self.batches: list[BatchMetrics] = []
        self._roles: dict[str, Role] = {}
        self._early: dict[str, list[dict]] = {}
        self._seen: dict[str, int] = {}
        self._cond = threading.Condition()
        self._file = None
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = open(self.path, "a", encoding="utf-8")

    # -- wiring -------------------------------------------------------------------------------
    def watch(self, query: Any, role: Role = "output") -> None:
        """Record the batches of ``query`` (a ``StreamingQuery``) as ``role``."""
        qid = str(query.id)
        with self._cond:
            self._roles[qid] = role
            early = self._early.pop(qid, [])
        for progress in early:
            self.record(progress, role)

    def wait_for(self, query: Any, batch_id: int | None, timeout_s: float = 10.0) -> bool:
        """Wait until batch ``batch_id`` of ``query`` has been recorded; ``False`` on timeout."""
        if batch_id is None:
            return True
        qid = str(query.id)
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while self._seen.get(qid, -1) < batch_id:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
        return True

    def close(self) -> None:
        """Close the metrics file (the listener records nothing more to it)."""
        with self._cond:
            if self._file is not None:
                self._file.close()
                self._file = None

    # -- recording ----------------------------------------------------------------------------
    def record(self, progress: Mapping[str, Any], role: Role) -> None:
        """Record one progress report (a dict of ``StreamingQueryProgress.json``) as ``role``."""
        counted = None
        if self.counted is not None and role == "output":
            counted = self.counted(int(progress.get("batchId", -1)))
        with self._cond:
            m = batch_metrics(progress, role, self.totals.dead_letters, counted)
            self.totals = self.totals.add(m)
            self.batches.append(m)
            if self._file is not None:
                self._file.write(json.dumps(m.to_dict(), separators=(",", ":")) + "\n")
                self._file.flush()
            qid = str(progress.get("id"))
            self._seen[qid] = max(self._seen.get(qid, -1), m.batch_id)
            totals = self.totals
            self._cond.notify_all()
        if self.on_batch is not None:
            try:
                self.on_batch(m, totals)
            except Exception:  # a display must never break the query
                log.exception("sparkstate: the on_batch callback failed (batch %s)", m.batch_id)

    # -- StreamingQueryListener ---------------------------------------------------------------
    def onQueryStarted(self, event: Any) -> None:
        pass

    def onQueryProgress(self, event: Any) -> None:
        try:
            progress = json.loads(event.progress.json)
        except Exception:
            log.exception("sparkstate: could not read a progress report")
            return
        qid = str(progress.get("id"))
        with self._cond:
            role = self._roles.get(qid)
            if role is None:  # not (yet) watched: keep a few reports of a few queries
                if qid not in self._early and len(self._early) >= _EARLY_QUERIES:
                    self._early.pop(next(iter(self._early)))
                early = self._early.setdefault(qid, [])
                if len(early) < _EARLY_REPORTS:
                    early.append(progress)
                return
        self.record(progress, role)

    def onQueryIdle(self, event: Any) -> None:
        pass

    def onQueryTerminated(self, event: Any) -> None:
        pass


class _Anchor(StreamingQueryListener):
    """A listener that does nothing, kept on a Spark Connect session for its whole life (see
    :func:`remove_listener`)."""

    def onQueryStarted(self, event: Any) -> None:
        pass

    def onQueryProgress(self, event: Any) -> None:
        pass

    def onQueryIdle(self, event: Any) -> None:
        pass

    def onQueryTerminated(self, event: Any) -> None:
        pass


_anchored: set[str] = set()


def add_listener(spark: Any, listener: StreamingQueryListener) -> None:
    """``spark.streams.addListener(listener)``; on a Spark Connect session, with an anchor first.

    PySpark's Connect client stops its event thread when the last listener is removed, and
    joins it while holding the lock that thread needs to deliver an event: a removal that meets
    an arriving event hangs for good. A no-op listener added once per session keeps
    :func:`remove_listener` from ever removing the last one.
    """
    from ..spark import is_connect

    if is_connect(spark) and spark.session_id not in _anchored:
        spark.streams.addListener(_Anchor())
        _anchored.add(spark.session_id)
    spark.streams.addListener(listener)


def remove_listener(spark: Any, listener: StreamingQueryListener) -> None:
    """``spark.streams.removeListener(listener)`` (one added by :func:`add_listener`)."""
    spark.streams.removeListener(listener)


__all__ = ["JsonProgressListener", "MetricsListener", "OnBatch", "add_listener", "remove_listener"]
