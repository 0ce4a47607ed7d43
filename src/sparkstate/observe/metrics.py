"""What one micro-batch did, taken from Spark's progress report, and running totals of a job.

Pure functions over the progress JSON (``StreamingQueryProgress.json``), so they can be
tested without Spark. The numbers come from these places of the report:

===========================  ================================================================
field                        from
===========================  ================================================================
``rows_in``                  the records read: the ``rows`` of :data:`INPUT_OBSERVATION` (what
                             the pipeline is given: the good records, or every record when it
                             refuses malformed ones itself) plus the parse dead letters read
                             beside it (a second scan of the source, which doubles
                             ``numInputRows``); else ``numInputRows``
``input_rows_per_s``         ``inputRowsPerSecond`` (``None`` when Spark omits it), scaled to ``rows_in``
``processed_rows_per_s``     ``processedRowsPerSecond``, scaled alike
``batch_duration_ms``        ``batchDuration``
``state_rows``               ``numRowsTotal`` of the state operators: rows of the state store (a row per key for the
                             ``tws`` engine; buckets and leaves of many keys for ``batched``)
``state_memory_bytes``       ``memoryUsedBytes`` of the state operators
``timers_expired``           the operators' custom metric ``numExpiredTimers`` (``None`` if absent)
``rows_out``                 the ``rows`` of the observation :data:`OUTPUT_OBSERVATION`, else the
                             sink's ``numOutputRows`` when Spark knows it (file sinks do not)
``timed_out``                sessionize: sessions of the batch closed by ``"timeout"``
``dead_letters``             the ``rows`` of the observation :data:`DEAD_LETTER_OBSERVATION`
                             (malformed records) plus the ``rejected`` of :data:`OUTPUT_OBSERVATION`
                             (records the pipeline refused, e.g. late events)
``late``                     the ``late`` of :data:`OUTPUT_OBSERVATION`: events refused as
                             older than the watermark (sessionize; ``None`` for other pipelines)
``rows_dropped_by_watermark`` the operators' ``numRowsDroppedByWatermark``: rows Spark dropped
                             as late without the pipeline seeing them (0 for sessionize jobs)
``backlog``                  records the source had beyond this batch's end: the source's
                             ``latestOffset`` minus its ``endOffset`` (the generator: records;
                             Kafka: offsets, summed over partitions); ``None`` for sources that
                             do not report their latest offset (files, socket). A job that keeps
                             up has a backlog near 0; one that falls behind, a growing one
``state_point_reads``        the operators' custom metric ``rocksdbGetCount``: state rows read
                             by key (RocksDB state store only, else ``None``)
``state_bytes_scanned``      ``rocksdbTotalBytesReadThroughIterator``: state bytes read by scans
``state_reads``              how the batch read its state, from the two above: ``"scan"`` when it
                             scanned (the batched engine reads a bucket's leaves in one scan
                             when the batch touches at least half of them), ``"point"`` when it
                             read rows by key only, ``"none"`` when it read nothing
===========================  ================================================================

Measured on PySpark 4.3: ``numExpiredTimers`` stays 0 for Python stateful processors even when
timers fire; ``state_rows_removed`` and (sessionize) ``timed_out`` show timeouts instead.

Nothing secret goes into a record: source and sink descriptions (which may hold connection
URLs) are not copied, and strings are passed through :func:`redact`.

>>> p = {"name": "q", "runId": "r", "batchId": 3, "timestamp": "2024-01-01T00:00:00.000Z",
...      "numInputRows": 10, "inputRowsPerSecond": 5.0, "processedRowsPerSecond": 20.0,
...      "batchDuration": 500, "stateOperators": [{"numRowsTotal": 4, "memoryUsedBytes": 1024,
...      "numRowsUpdated": 4, "numRowsRemoved": 0, "customMetrics": {"numExpiredTimers": 0}}],
...      "observedMetrics": {"sparkstate_output": {"rows": 2}}, "sink": {"numOutputRows": -1}}
>>> m = batch_metrics(p, "output")
>>> m.batch_id, m.rows_in, m.state_rows, m.state_memory_bytes, m.rows_out
(3, 10, 4, 1024, 2)
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, replace
from typing import Any, Literal, Mapping

#: Name of the observation counting a job's output rows (``df.observe(OUTPUT_OBSERVATION, ...)``).
OUTPUT_OBSERVATION = "sparkstate_output"
#: Name of the observation counting the dead letters a job writes.
DEAD_LETTER_OBSERVATION = "sparkstate_dead_letters"
#: Name of the observation counting the good records a job's pipeline receives.
INPUT_OBSERVATION = "sparkstate_input"

Role = Literal["output", "dead_letters"]

# scheme://user:password@host -> scheme://user:***@host ; password=... / secret=... / token=... values
_URL_SECRET = re.compile(r"([A-Za-z][A-Za-z0-9+.\-]*://[^:/@\s]*:)[^@\s]*@")
_KEY_SECRET = re.compile(r"((?:password|passwd|pwd|secret|token|api[_-]?key)\s*[=:]\s*)[^\s&;,'\"]+", re.IGNORECASE)


def redact(text: str) -> str:
    """``text`` with passwords in URLs and ``password=...``-style values replaced by ``***``.

    >>> redact("postgres:postgresql://app:s3cret@db:5432/shop/sessions")
    'postgres:postgresql://app:***@db:5432/shop/sessions'
    >>> redact("jdbc:postgresql://db/shop?user=app&password=s3cret")
    'jdbc:postgresql://db/shop?user=app&password=***'
    """
    return _KEY_SECRET.sub(r"\1***", _URL_SECRET.sub(r"\1***@", text))


@dataclass(frozen=True)
class BatchMetrics:
    """One micro-batch of one query, as written to the metrics file (one JSON line)."""

    time: str | None
    query: Role
    query_name: str | None
    run_id: str | None
    batch_id: int
    rows_in: int
    input_rows_per_s: float | None
    processed_rows_per_s: float | None
    batch_duration_ms: int | None
    state_rows: int | None
    state_rows_updated: int | None
    state_rows_removed: int | None
    state_memory_bytes: int | None
    timers_expired: int | None
    rows_out: int | None
    timed_out: int | None
    dead_letters: int
    dead_letters_total: int
    watermark: str | None
    late: int | None = None
    rows_dropped_by_watermark: int | None = None
    backlog: int | None = None
    state_point_reads: int | None = None
    state_bytes_scanned: int | None = None
    state_reads: str | None = None
    offsets_ms: int | None = None
    planning_ms: int | None = None
    add_batch_ms: int | None = None
    log_commit_ms: int | None = None

    def to_dict(self) -> dict[str, Any]:
        """The record as plain JSON-ready values.

        >>> list(batch_metrics({"batchId": 0, "numInputRows": 0}, "output").to_dict())[:3]
        ['time', 'query', 'query_name']
        """
        return asdict(self)


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value) or math.isinf(value):
        return None
    return round(float(value), 3)


def _sum(ops: list[Mapping[str, Any]], key: str) -> int | None:
    values = [v for v in (op.get(key) for op in ops) if isinstance(v, int)]
    return sum(values) if values else None


def _observed_row(progress: Mapping[str, Any], name: str) -> Mapping[str, Any] | None:
    row = (progress.get("observedMetrics") or {}).get(name)
    return row if isinstance(row, Mapping) else None


def _observed(progress: Mapping[str, Any], name: str, field: str) -> int | None:
    row = _observed_row(progress, name)
    if not isinstance(row, Mapping):
        return None
    value = row.get(field)
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _offset_total(offset: Any) -> int | None:
    """One number for a source offset: the generator's ``{"index": n}``, Kafka's ``{topic: {partition: n}}``
    (summed), a plain number; ``None`` for anything else."""
    if isinstance(offset, str):
        try:
            import json

            offset = json.loads(offset)
        except ValueError:
            return None
    if isinstance(offset, bool):
        return None
    if isinstance(offset, int):
        return offset
    if isinstance(offset, Mapping):
        if set(offset) == {"index"}:
            return _offset_total(offset["index"])
        parts = [_offset_total(v) for v in offset.values()]
        if parts and all(isinstance(v, Mapping) for v in offset.values()) and all(x is not None for x in parts):
            return sum(parts)  # type: ignore[arg-type]
        if parts and all(isinstance(v, int) and not isinstance(v, bool) for v in offset.values()):
            return sum(parts)  # type: ignore[arg-type]
    return None


#: The parts of a batch's time in Spark's progress (``durationMs``) that the metrics keep, each as a
#: field: asking the sources for their offsets and the batch's data, planning the batch, running it
#: (its tasks, the state and the sink's write), and writing its offset and commit logs.
STAGES: dict[str, tuple[str, ...]] = {
    "offsets_ms": ("latestOffset", "getOffset", "getBatch"),
    "planning_ms": ("queryPlanning",),
    "add_batch_ms": ("addBatch",),
    "log_commit_ms": ("walCommit", "commitOffsets"),
}


def stages(progress: Mapping[str, Any]) -> dict[str, int | None]:
    """The batch's time by stage, in milliseconds (:data:`STAGES`; ``None`` where the report has no part of
    a stage: a batch that planned nothing reports only its offsets).

    >>> stages({"durationMs": {"latestOffset": 3, "getBatch": 1, "queryPlanning": 40, "walCommit": 9,
    ...                        "addBatch": 500, "commitOffsets": 8, "triggerExecution": 570}})
    {'offsets_ms': 4, 'planning_ms': 40, 'add_batch_ms': 500, 'log_commit_ms': 17}
    >>> stages({"durationMs": {"latestOffset": 2, "triggerExecution": 2}})["planning_ms"] is None
    True
    """
    parts = progress.get("durationMs") or {}
    out: dict[str, int | None] = {}
    for name, keys in STAGES.items():
        values = [v for v in (parts.get(k) for k in keys) if isinstance(v, int) and not isinstance(v, bool)]
        out[name] = sum(values) if values else None
    return out


def read_path(point_reads: int | None, bytes_scanned: int | None) -> str | None:
    """How a batch read its state: ``"scan"``, ``"point"`` (by key only), ``"none"``, or ``None``
    when the state store reports neither number (a store other than RocksDB).

    >>> read_path(12, 74_000), read_path(50, 0), read_path(0, 0), read_path(None, None)
    ('scan', 'point', 'none', None)
    """
    if point_reads is None and bytes_scanned is None:
        return None
    if bytes_scanned:
        return "scan"
    return "point" if point_reads else "none"


def backlog(progress: Mapping[str, Any]) -> int | None:
    """Records the sources held beyond the batch's end offsets (the largest over the sources: a job
    may read its one source twice, for its records and its dead letters).

    >>> backlog({"sources": [{"endOffset": {"index": 500}, "latestOffset": {"index": 2500}}]})
    2000
    >>> backlog({"sources": [{"endOffset": {"t": {"0": 10, "1": 5}}, "latestOffset": {"t": {"0": 40, "1": 5}}}]})
    30
    >>> backlog({"sources": [{"endOffset": {"logOffset": 3}, "latestOffset": None}]}) is None
    True
    """
    behind = []
    for src in progress.get("sources") or []:
        if not isinstance(src, Mapping):
            continue
        end, latest = _offset_total(src.get("endOffset")), _offset_total(src.get("latestOffset"))
        if end is not None and latest is not None:
            behind.append(max(0, latest - end))
    return max(behind) if behind else None


def batch_metrics(progress: Mapping[str, Any], role: Role, dead_letters_total: int = 0,
                  counted: Mapping[str, int] | None = None) -> BatchMetrics:
    """A :class:`BatchMetrics` from one progress report (a dict of ``StreamingQueryProgress.json``).

    ``role`` says which query of a job reported it: ``"output"`` (the pipeline) or
    ``"dead_letters"``; ``dead_letters_total`` is the job's count so far, before this batch.
    ``counted``: the output's counts as the job took them itself (``rows`` and the pipeline's own,
    :class:`~sparkstate.jobs.tee.JobTee`), read where the report has no :data:`OUTPUT_OBSERVATION`:
    Spark 3.5 reports no observed metrics for a batch without input. Such a batch refuses
    nothing, so its ``late`` and refused counts are 0.

    >>> batch_metrics({"batchId": 4, "numInputRows": 0}, "output", counted={"rows": 3, "timed_out": 3}).late
    0

    >>> m = batch_metrics({"batchId": 1, "numInputRows": 5,
    ...                    "observedMetrics": {"sparkstate_dead_letters": {"rows": 2}}}, "dead_letters", 3)
    >>> m.dead_letters, m.dead_letters_total, m.state_rows
    (2, 5, None)
    """
    ops = [op for op in (progress.get("stateOperators") or []) if isinstance(op, Mapping)]
    custom = [op.get("customMetrics") or {} for op in ops]
    expired = [c["numExpiredTimers"] for c in custom if isinstance(c.get("numExpiredTimers"), int)]
    point_reads = _sum(custom, "rocksdbGetCount")
    scanned = _sum(custom, "rocksdbTotalBytesReadThroughIterator")
    rows_in = int(progress.get("numInputRows") or 0)
    if counted is not None and not _observed_row(progress, OUTPUT_OBSERVATION) and rows_in == 0:
        progress = {**progress, "observedMetrics": {**(progress.get("observedMetrics") or {}),
                                                    OUTPUT_OBSERVATION: {"rejected": 0, "late": 0, **counted}}}
    rows_out = _observed(progress, OUTPUT_OBSERVATION, "rows")
    if rows_out is None:
        sink_rows = (progress.get("sink") or {}).get("numOutputRows")
        rows_out = sink_rows if isinstance(sink_rows, int) and sink_rows >= 0 else None
    malformed = _observed(progress, DEAD_LETTER_OBSERVATION, "rows") or 0
    dead = malformed + (_observed(progress, OUTPUT_OBSERVATION, "rejected") or 0)
    in_rate, done_rate = _number(progress.get("inputRowsPerSecond")), _number(progress.get("processedRowsPerSecond"))
    good = _observed(progress, INPUT_OBSERVATION, "rows")
    if good is not None:
        scale = (good + malformed) / rows_in if rows_in else 0.0
        rows_in = good + malformed
        in_rate = None if in_rate is None else round(in_rate * scale, 3)
        done_rate = None if done_rate is None else round(done_rate * scale, 3)
    name = progress.get("name")
    duration = progress.get("batchDuration")
    if not isinstance(duration, int):
        duration = (progress.get("durationMs") or {}).get("triggerExecution")
    return BatchMetrics(
        time=progress.get("timestamp"),
        query=role,
        query_name=redact(name) if isinstance(name, str) else None,
        run_id=progress.get("runId"),
        batch_id=int(progress.get("batchId", -1)),
        rows_in=rows_in,
        input_rows_per_s=in_rate,
        processed_rows_per_s=done_rate,
        batch_duration_ms=duration if isinstance(duration, int) else None,
        state_rows=_sum(ops, "numRowsTotal"),
        state_rows_updated=_sum(ops, "numRowsUpdated"),
        state_rows_removed=_sum(ops, "numRowsRemoved"),
        state_memory_bytes=_sum(ops, "memoryUsedBytes"),
        timers_expired=sum(expired) if expired else None,
        rows_out=rows_out if role == "output" else dead,
        timed_out=_observed(progress, OUTPUT_OBSERVATION, "timed_out"),
        dead_letters=dead,
        dead_letters_total=dead_letters_total + dead,
        watermark=(progress.get("eventTime") or {}).get("watermark"),
        late=_observed(progress, OUTPUT_OBSERVATION, "late"),
        rows_dropped_by_watermark=_sum(ops, "numRowsDroppedByWatermark"),
        backlog=backlog(progress),
        state_point_reads=point_reads,
        state_bytes_scanned=scanned,
        state_reads=read_path(point_reads, scanned),
        **stages(progress),
    )


@dataclass(frozen=True)
class RunTotals:
    """A job so far: what a progress display shows. Counts are sums over the output query's batches.

    >>> t = RunTotals().add(batch_metrics({"batchId": 0, "numInputRows": 7,
    ...                                    "observedMetrics": {"sparkstate_output": {"rows": 3}}}, "output"))
    >>> t.batches, t.rows_in, t.rows_out
    (1, 7, 3)
    """

    batches: int = 0
    rows_in: int = 0
    rows_out: int | None = None
    timed_out: int | None = None
    dead_letters: int = 0
    state_rows: int | None = None
    state_memory_bytes: int | None = None
    input_rows_per_s: float | None = None
    processed_rows_per_s: float | None = None
    last_batch_id: int | None = None
    last_batch_ms: int | None = None
    watermark: str | None = None
    late: int | None = None
    backlog: int | None = None
    #: the last batch's ``state_reads`` and its two numbers
    state_reads: str | None = None
    state_point_reads: int | None = None
    state_bytes_scanned: int | None = None

    def add(self, m: BatchMetrics) -> "RunTotals":
        """The totals after batch ``m`` (of either query of the job)."""
        if m.query == "dead_letters":
            return replace(self, dead_letters=m.dead_letters_total)

        def plus(total: int | None, value: int | None) -> int | None:
            return total if value is None else (total or 0) + value

        return replace(
            self,
            batches=self.batches + 1,
            rows_in=self.rows_in + m.rows_in,
            rows_out=plus(self.rows_out, m.rows_out),
            timed_out=plus(self.timed_out, m.timed_out),
            dead_letters=m.dead_letters_total,
            late=plus(self.late, m.late),
            state_rows=m.state_rows,
            state_memory_bytes=m.state_memory_bytes,
            input_rows_per_s=m.input_rows_per_s,
            processed_rows_per_s=m.processed_rows_per_s,
            last_batch_id=m.batch_id,
            last_batch_ms=m.batch_duration_ms,
            watermark=m.watermark or self.watermark,
            backlog=m.backlog,
            state_reads=m.state_reads,
            state_point_reads=m.state_point_reads,
            state_bytes_scanned=m.state_bytes_scanned,
        )


__all__ = [
    "BatchMetrics",
    "DEAD_LETTER_OBSERVATION",
    "INPUT_OBSERVATION",
    "OUTPUT_OBSERVATION",
    "Role",
    "RunTotals",
    "backlog",
    "batch_metrics",
    "read_path",
    "redact",
]
