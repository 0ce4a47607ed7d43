"""Sessionization: group each key's events into sessions that end on a flag or after a gap.

Built on :func:`sparkstate.operators.flat_map_groups_with_state`; the open session of a key is
its state, and a finished session is emitted exactly once, as one output row.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Literal

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import (
    ArrayType,
    BooleanType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from ..durations import Duration, instant_ms, positive_ms, to_ms, utc
from ..errors import ConfigError
from ..group_state import GroupState, GroupStateTimeout
from ..operators import flat_map_groups_with_state, has_watermark
from ._columns import check_column, require_dataframe

TimeMode = Literal["event", "processing"]
TIME_MODES = ("event", "processing")


@dataclass
class OpenSession:
    """The state of one key: its session so far (times in epoch ms; ``None`` when unknown)."""

    start_ms: int | None = None
    end_ms: int | None = None
    events: list[str] = field(default_factory=list)

    def add(self, t_ms: int | None, data: str | None) -> None:
        if t_ms is not None:
            self.start_ms = t_ms if self.start_ms is None else min(self.start_ms, t_ms)
            self.end_ms = t_ms if self.end_ms is None else max(self.end_ms, t_ms)
        self.events.append(data)


class _Sessionizer:
    """The group function (picklable: holds plain settings only).

    Values are rows ``(key, timestamp, data, last_flag)``, as :func:`sessionize` selects them.
    """

    def __init__(self, gap_ms: int, time_mode: TimeMode, streaming: bool, has_timestamp: bool) -> None:
        self.gap_ms = gap_ms
        self.time_mode = time_mode
        self.streaming = streaming
        self.has_timestamp = has_timestamp
        self.__name__ = "sessionize"

    @staticmethod
    def _row(key: Any, s: OpenSession, closed_by: str) -> tuple:
        start = None if s.start_ms is None else utc(s.start_ms)
        end = None if s.end_ms is None else utc(s.end_ms)
        return (key, start, end, len(s.events), s.events, closed_by)

    def __call__(self, key: Any, rows: Iterable[Any], state: GroupState) -> list[tuple]:
        if state.hasTimedOut:
            finished = state.get
            state.remove()
            return [self._row(key, finished, "timeout")]
        if self.time_mode == "event":
            return self._event_time(key, rows, state)
        return self._processing_time(key, rows, state)

    def _event_time(self, key: Any, rows: Iterable[Any], state: GroupState) -> list[tuple]:
        # Order this batch's events by event time; at equal times an is_last event goes last.
        events = sorted(((instant_ms(r[1]), r[2], bool(r[3])) for r in rows), key=lambda e: (e[0], e[2]))
        current: OpenSession | None = state.getOption
        out = []
        for t_ms, data, last in events:
            if current is not None and current.end_ms is not None and t_ms - current.end_ms > self.gap_ms:
                out.append(self._row(key, current, "timeout"))
                current = None
            if current is None:
                current = OpenSession()
            current.add(t_ms, data)
            if last:
                out.append(self._row(key, current, "last_event"))
                current = None
        if current is not None and not self.streaming:
            # A static input is complete: the watermark is past every session.
            out.append(self._row(key, current, "timeout"))
            current = None
        if current is None:
            if state.exists:
                state.remove()
        else:
            state.update(current)
            due = current.end_ms + self.gap_ms
            # A late event may leave the session's end behind the watermark: time out next batch.
            state.setTimeoutTimestamp(max(due, state.getCurrentWatermarkMs()))
        return out

    def _processing_time(self, key: Any, rows: Iterable[Any], state: GroupState) -> list[tuple]:
        current: OpenSession | None = state.getOption
        now_ms = state.getCurrentProcessingTimeMs()
        out = []
        for r in rows:  # arrival order
            if current is None:
                current = OpenSession()
            if not self.has_timestamp:
                t_ms: int | None = now_ms
            else:
                t_ms = None if r[1] is None else instant_ms(r[1])
            current.add(t_ms, r[2])
            if r[3]:
                out.append(self._row(key, current, "last_event"))
                current = None
        if current is None:
            if state.exists:
                state.remove()
        elif self.streaming:
            state.update(current)
            state.setTimeoutDuration(self.gap_ms)
        else:
            out.append(self._row(key, current, "timeout"))
            if state.exists:
                state.remove()
        return out


def _check_column(events: DataFrame, name: Any, what: str, allowed: tuple[type, ...] = (), want: str = "") -> None:
    check_column(events, name, what, "sessionize", allowed, want)


def sessionize(
    events: DataFrame,
    key: str = "user_id",
    timestamp: str | None = "event_time",
    gap: Duration = "1 minute",
    last_flag: str | None = "is_last",
    time_mode: TimeMode = "event",
    watermark: Duration = "10 seconds",
    data: str = "data",
) -> DataFrame:
    """One row per finished session of each ``key``: ``key, session_start, session_end,
    event_count, events, closed_by``.

    A session ends at an event whose ``last_flag`` is true (``closed_by="last_event"``) or after
    ``gap`` without events (``closed_by="timeout"``). ``events`` lists the ``data`` column's
    values (as strings); ``session_start``/``session_end`` are the first and last event times.
    Every finished session is emitted exactly once (the operator runs in append mode).

    ``time_mode="event"``: a key's events are ordered by ``timestamp`` and split where
    consecutive events are more than ``gap`` apart; the open session is kept as state and
    times out when the watermark passes its last event + ``gap``. A watermark of ``watermark``
    on ``timestamp`` is applied unless the input already has one. Events of a key are assumed
    to reach the query in event-time order across micro-batches (within a batch any order):
    a session closed by a gap is not reopened; an event older than the open session's last one
    joins the open session; one behind the watermark is dropped by Spark (late data). On a
    static DataFrame the input is complete, so every session is emitted, the last ones with
    ``closed_by="timeout"``. Rows with a null ``timestamp`` are left out.

    ``time_mode="processing"``: events are appended in arrival order, and a session times out
    after ``gap`` of processing time without events of its key; ``timestamp`` may be ``None``
    (the session's times are then the processing times of its first and last batch).

    ``last_flag=None``: sessions end by timeout only.

    >>> import sparkstate as ss
    >>> from datetime import datetime
    >>> spark = ss.spark_session()
    >>> clicks = spark.createDataFrame([
    ...     ("u1", datetime(2024, 1, 1, 12, 0, 0), "/home", False),
    ...     ("u1", datetime(2024, 1, 1, 12, 0, 30), "/cart", True),
    ...     ("u1", datetime(2024, 1, 1, 12, 0, 40), "/home", False),
    ...     ("u1", datetime(2024, 1, 1, 12, 5, 0), "/help", False),
    ... ], "user_id string, event_time timestamp, data string, is_last boolean")
    >>> for s in sessionize(clicks, gap="1 minute").orderBy("session_start").collect():
    ...     print(s.user_id, s.session_start.time(), s.session_end.time(), s.events, s.closed_by)
    u1 12:00:00 12:00:30 ['/home', '/cart'] last_event
    u1 12:00:40 12:00:40 ['/home'] timeout
    u1 12:05:00 12:05:00 ['/help'] timeout
    """
    require_dataframe(events, "sessionize")
    mode = str(time_mode).lower() if isinstance(time_mode, str) else time_mode
    if mode not in TIME_MODES:
        raise ConfigError(f"sessionize: time_mode must be 'event' or 'processing', got {time_mode!r}")
    try:
        gap_ms = positive_ms(gap, "sessionize: gap")
        watermark_ms = to_ms(watermark, "sessionize: watermark")
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    if watermark_ms < 0:
        raise ConfigError(f"sessionize: watermark must be zero or positive, got {watermark!r}")
    _check_column(events, key, "key")
    _check_column(events, data, "data")
    if last_flag is not None:
        _check_column(events, last_flag, "last_flag", (BooleanType,), "boolean")
    if timestamp is None:
        if mode == "event":
            raise ConfigError("sessionize: time_mode='event' needs a timestamp column; pass timestamp=<column name>")
    else:
        _check_column(events, timestamp, "timestamp", (TimestampType,), "timestamp")

    df = events
    if mode == "event":
        if df.isStreaming and not has_watermark(df):
            df = df.withWatermark(timestamp, f"{watermark_ms} milliseconds")
        df = df.where(F.col(timestamp).isNotNull())
    df = df.select(
        F.col(key),
        F.col(timestamp) if timestamp is not None else F.lit(None).cast("timestamp").alias("_sparkstate_ts"),
        F.col(data).cast("string"),
        F.coalesce(F.col(last_flag), F.lit(False)) if last_flag is not None else F.lit(False),
    )
    output = StructType([
        StructField(key, events.schema[key].dataType, True),
        StructField("session_start", TimestampType(), True),
        StructField("session_end", TimestampType(), True),
        StructField("event_count", LongType(), True),
        StructField("events", ArrayType(StringType(), True), True),
        StructField("closed_by", StringType(), True),
    ])
    return flat_map_groups_with_state(
        df,
        key=key,
        func=_Sessionizer(gap_ms, mode, events.isStreaming, timestamp is not None),
        state_type=OpenSession,
        output_type=output,
        timeout=GroupStateTimeout.EventTimeTimeout if mode == "event" else GroupStateTimeout.ProcessingTimeTimeout,
        output_mode="append",
    )


__all__ = ["OpenSession", "TimeMode", "sessionize"]
