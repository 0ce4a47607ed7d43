"""Sessionization: group each key's events into sessions that end on a flag or after a gap.

A ``flat_map_groups_with_state`` query (:func:`sparkstate.compile.compile_plan`); the open sessions of a key are
its state, and a finished session is emitted exactly once, as one output row. In event time the
sessions do not depend on arrival order or micro-batch boundaries (within the watermark).
"""

from __future__ import annotations

import os
from typing import Any, Literal, Sequence, cast

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

from ..durations import Duration, positive_ms, to_ms
from ..errors import ConfigError
from ..group_state import GroupStateTimeout
from ..engines import Engine
from ..engines.base import NULL_WATERMARK_COLUMN, WATERMARK_DELAY_KEY, has_watermark
from ..compile import compile_plan
from .checks import check_column, require_dataframe
from .columnar_sessionizer import SessionLogic
from .refusals import REJECTED, check_carry, check_reason, rejected_field
from .sessionizer import LATE_PREFIX, REASON, OpenSession, SessionRow, Sessionizer, TimeMode, iso_ms

TIME_MODES = ("event", "processing")
Late = Literal["drop", "emit"]
LATE_MODES = ("drop", "emit")

# Internal columns of the operator's input.
_REJECT = "_sparkstate_reject"
_WATERMARK_TIME = "_sparkstate_watermark_time"
_WATERMARK = NULL_WATERMARK_COLUMN
#: The metadata of the operator input's columns in late="emit" mode (none carries the watermark).
_NO_WATERMARK = {"sparkstate.watermark": "dropped"}
#: Metadata of sessionize's ``event_time_column``: how far (ms) it lies after ``session_end``.
END_OFFSET_KEY = "sparkstate.sessionEndOffsetMs"


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
    engine: str | Engine | None = None,
    late: Late = "drop",
    max_future_skew: Duration | None = None,
    carry: Sequence[str] = (),
    checkpoint: str | os.PathLike | None = None,
    emit_on_last: bool = False,
    initial_state: DataFrame | None = None,
    event_time_column: str | None = None,
    reason: str | None = None,
) -> DataFrame:
    """One row per finished session of each ``key``: ``key, session_start, session_end,
    event_count, events, closed_by``.

    A session ends at an event whose ``last_flag`` is true (``closed_by="last_event"``) or after
    ``gap`` without events (``closed_by="timeout"``). ``events`` lists the ``data`` column's
    values (as strings); ``session_start``/``session_end`` are the first and last event times.
    Every finished session is emitted exactly once (the operator runs in append mode).

    ``time_mode="event"``: the sessions do not depend on the order or the micro-batches in which
    the events arrive. A key's sessions are its events sorted by ``timestamp`` (at equal times an
    event whose ``last_flag`` is false before one whose flag is true, then by ``data``, null
    first), split where consecutive events are more than ``gap`` apart and after each flagged
    event: exactly :func:`sparkstate.synthetic.reference_sessions` of the events that were not late.
    An event is late when its time is at or behind the watermark (Spark's rule); the watermark
    is ``watermark`` behind the latest event time seen, applied on ``timestamp`` unless the input
    already has one. A key may hold several open sessions (its state, :class:`OpenSession`): an
    event between two of them within ``gap`` merges them, one before a session extends it
    backwards, a flagged one inside a session splits it. A session is emitted once, when it is
    final: when the watermark is past its last event + ``gap`` (``closed_by="timeout"``), or,
    for a session ending with a flagged event, has reached that event (``closed_by="last_event"``);
    no event that is not late can change it then. So a session closed by a flag comes out once
    the watermark passes it, not in the batch that reads the flag (see ``emit_on_last``).
    Times are taken to the millisecond (truncated), also when ``late="emit"`` decides lateness;
    with ``late="drop"`` Spark decides it, to the microsecond. On a static DataFrame the input is
    complete, so every session is emitted. Rows with a null ``timestamp`` are left out.

    ``emit_on_last=True`` (event time; opt-in, for low latency): a session ending with a
    flagged event is emitted in the micro-batch that reads the flag. This assumes each key's
    events arrive in event-time order: an event that arrives later but belongs before the flag
    no longer joins or splits the emitted session; it goes into the key's open sessions as if
    the emitted one did not exist (so the output then depends on arrival order).

    ``time_mode="processing"``: events are appended in arrival order, and a session times out
    after ``gap`` of processing time without events of its key; ``timestamp`` may be ``None``
    (the session's times are then the processing times of its first and last batch).

    ``last_flag=None``: sessions end by timeout only.

    ``engine``: the engine that runs it (``None``: the one that wrote ``checkpoint``'s state, else the fastest, ``"batched"``).

    ``late="emit"``: nothing is dropped. Rows that cannot join a session come out as rows
    whose column ``rejected`` (null on sessions) holds ``reason`` and the row's timestamp, data
    and last-flag fields (plus the ``carry`` columns, e.g. the raw record); their session
    columns are null. Reasons: ``"late: event_time X is older than the watermark Y"`` (the
    watermark of the micro-batch that reads the row, which is never behind the one Spark drops
    late rows by), ``"future: ..."`` (see ``max_future_skew``), ``"event_time is null"``. Spark
    itself then drops nothing: no column the stateful operator sees carries the watermark, which
    still advances as usual (``numRowsDroppedByWatermark`` stays 0). A session is never reopened
    or extended by a refused row. ``sparkstate run`` uses this and writes the refused rows to
    the dead letters.

    ``max_future_skew`` (event time, ``late="emit"``): a row whose timestamp is more than this
    ahead of the micro-batch's processing time is refused (``"future: event_time X is more than
    D ahead of the processing time Y"``) *before* the watermark sees it. Without it, one producer
    whose clock runs ahead moves the watermark to its future time: every other key's open
    session times out at once and all their later events are late.

    ``reason`` (event time, ``late="emit"``): a string column saying why a row was already
    refused (e.g. by a parser: a missing field, a wrong type), null on a good row. A row with a
    reason comes out refused with that text as its ``reason``: it joins no session, changes no
    state and does not move the watermark; good rows are unaffected. ``sparkstate run`` passes
    the parse's reasons this way, so that its query reads each record once. The watermark is
    then sessionize's own (no ``withWatermark`` on the input).

    ``checkpoint``: the query's checkpoint; when it holds state, the state is checked against
    this pipeline's before the query starts (:class:`~sparkstate.errors.StateSchemaError`). A
    checkpoint of an earlier sparkstate, whose state held one open session per key, restarts:
    that session reads back without its events' times, which are then spread evenly between
    its start and end.

    ``event_time_column`` (event time, streaming): the name of one more output column,
    ``session_end`` + ``gap`` + 1 ms, that carries event time to the stateful operators after
    sessionize in the same query (a windowed aggregation or a stream-stream join in append
    mode). Spark refuses a row whose event time is not after the previous micro-batch's
    watermark; a final session's ``session_end`` may be, this column never is, and it keeps a
    fixed distance to ``session_end``. :func:`sessions_per_window` aggregates sessions per
    window of their ``session_end`` on it (sessions per hour, in one query).

    ``initial_state``: the open sessions to start from, as :func:`sparkstate.state.export`
    writes them from another query's checkpoint (key, :class:`OpenSession` fields, ``timeout_ms``).

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
    mode, gap_ms, watermark_ms = _check_settings(time_mode, gap, watermark)
    emit, carry, skew_ms = _check_columns(events, key, timestamp, data, last_flag, mode, late, carry,
                                          max_future_skew, emit_on_last, event_time_column, reason)
    df = _operator_input(events, key, timestamp, data, last_flag, mode, emit, carry, skew_ms, max_future_skew,
                         watermark_ms, reason)
    func = Sessionizer(gap_ms, mode, events.isStreaming, timestamp is not None, emit, len(carry),
                       bool(emit_on_last), event_time_column is not None)
    output_type = _output_type(events, key, timestamp, data, last_flag, emit, carry, event_time_column, gap_ms)
    # Event time on a stream: the same rules as column operations over a bucket of keys, for an
    # engine that groups keys (the plan's bucket logic; the others call func per key).
    logic = SessionLogic(func, output_type.names) if mode == "event" and events.isStreaming else None
    return compile_plan(
        df,
        operator_name="flat_map_groups_with_state",
        key=key,
        func=func,
        state_type=OpenSession,
        output_type=output_type,
        timeout=GroupStateTimeout.EventTimeTimeout if mode == "event" else GroupStateTimeout.ProcessingTimeTimeout,
        initial_state=initial_state,
        output_mode="append",
        flat=True,
        engine=engine,
        checkpoint=checkpoint,
        event_time_column=event_time_column,
        bucket_logic=logic,
    ).dataframe(df)


def _check_settings(time_mode: Any, gap: Duration, watermark: Duration) -> tuple[TimeMode, int, int]:
    """The time mode, gap and watermark delay (ms), checked."""
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
    return cast(TimeMode, mode), gap_ms, watermark_ms


def _check_columns(events: DataFrame, key: str, timestamp: str | None, data: str, last_flag: str | None,
                   mode: TimeMode, late: Any, carry: Sequence[str] | str, max_future_skew: Duration | None,
                   emit_on_last: bool, event_time_column: str | None,
                   reason: str | None) -> tuple[bool, list[str], int | None]:
    """The columns and the options that depend on them, checked: (emit, carry columns, max future skew ms)."""
    _check_column(events, key, "key")
    _check_column(events, data, "data")
    if last_flag is not None:
        _check_column(events, last_flag, "last_flag", (BooleanType,), "boolean")
    if emit_on_last and mode != "event":
        raise ConfigError("sessionize: emit_on_last applies to time_mode='event' (processing time always emits a"
                          " session at its flagged event)")
    if event_time_column is not None:
        if mode != "event":
            raise ConfigError("sessionize: event_time_column carries event time to the operators after sessionize;"
                              " it needs time_mode='event'")
        taken_out = {key, "session_start", "session_end", "event_count", "events", "closed_by"}
        if late == "emit":
            taken_out.add(REJECTED)
        if not isinstance(event_time_column, str) or not event_time_column or event_time_column in taken_out:
            raise ConfigError(f"sessionize: event_time_column names a new output column; {event_time_column!r} is"
                              f" not a free name (the output has {', '.join(sorted(taken_out))})")
    if timestamp is None:
        if mode == "event":
            raise ConfigError("sessionize: time_mode='event' needs a timestamp column; pass timestamp=<column name>")
    else:
        _check_column(events, timestamp, "timestamp", (TimestampType,), "timestamp")
    if late not in LATE_MODES:
        raise ConfigError(f"sessionize: late must be 'drop' (Spark drops late rows) or 'emit' (they come out with"
                          f" a reason in the column {REJECTED!r}), got {late!r}")
    emit = late == "emit"
    taken = {key, timestamp, data, last_flag}
    carry = check_carry(events, "sessionize", carry, taken)
    if carry and not emit:
        raise ConfigError("sessionize: carry= copies columns into refused rows, which only late='emit' outputs")
    skew_ms = None
    if max_future_skew is not None:
        try:
            skew_ms = positive_ms(max_future_skew, "sessionize: max_future_skew")
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        if mode != "event" or not emit:
            raise ConfigError("sessionize: max_future_skew applies to time_mode='event' with late='emit' (the rows it"
                              " refuses come out with their reason)")
        if events.isStreaming and has_watermark(events):
            raise ConfigError("sessionize: max_future_skew must keep far-future rows out of the watermark, but the input"
                              " already has one; let sessionize define it (pass watermark=..., no withWatermark)")
    if reason is not None:
        check_reason(events, "sessionize", reason, taken | set(carry))
        if mode != "event" or not emit:
            # In processing time a refused row would restart its key's timeout.
            raise ConfigError("sessionize: reason= applies to time_mode='event' with late='emit' (the rows it names"
                              " come out refused, with their reason)")
        if events.isStreaming and has_watermark(events):
            raise ConfigError("sessionize: reason= must keep refused rows out of the watermark, but the input already"
                              " has one; let sessionize define it (pass watermark=..., no withWatermark)")
    return emit, carry, skew_ms


def _operator_input(events: DataFrame, key: str, timestamp: str | None, data: str, last_flag: str | None,
                    mode: TimeMode, emit: bool, carry: list[str], skew_ms: int | None,
                    max_future_skew: Duration | None, watermark_ms: int, reason: str | None) -> DataFrame:
    """The rows the group function gets: ``(key, timestamp, data, last_flag)``, then with ``emit`` the
    reject reason (``reason``'s, else ``max_future_skew``'s), the carried columns and the (null)
    column carrying the watermark."""
    df = events
    ts = F.col(timestamp) if timestamp is not None else None
    given = F.col(reason) if reason is not None else None
    reject = given if given is not None else F.lit(None).cast("string")
    if skew_ms is not None:
        assert ts is not None, "max_future_skew is event time's, which has a timestamp column (checked before)"
        fmt = "yyyy-MM-dd'T'HH:mm:ss.SSSXXX"
        now = F.current_timestamp()  # in a stream: the micro-batch's time, the same again on a replay
        future = F.when(ts > now + F.expr(f"INTERVAL {skew_ms} MILLISECONDS"), F.concat(
            F.lit("future: event_time "), F.date_format(ts, fmt),
            F.lit(f" is more than {max_future_skew} ahead of the processing time "), F.date_format(now, fmt)))
        reject = future if given is None else F.coalesce(given, future)
        df = df.withColumn(_REJECT, reject)
        reject = F.col(_REJECT)
    delay_ms = watermark_ms
    if mode == "event":
        assert timestamp is not None and ts is not None, "event time has a timestamp column (checked before)"
        if df.isStreaming and not has_watermark(df):
            if skew_ms is not None or given is not None:  # the watermark follows only the rows that may join sessions
                df = df.withColumn(_WATERMARK_TIME, F.when(reject.isNull(), ts))
                df = df.withWatermark(_WATERMARK_TIME, f"{watermark_ms} milliseconds")
            else:
                df = df.withWatermark(timestamp, f"{watermark_ms} milliseconds")
        else:
            delay_ms = next((int(f.metadata[WATERMARK_DELAY_KEY]) for f in df.schema.fields
                             if WATERMARK_DELAY_KEY in (f.metadata or {})), watermark_ms)
        if not emit:
            df = df.where(ts.isNotNull())
    fields = {  # the columns of SessionRow's fields, selected in its order
        "key": F.col(key),
        "time": ts if ts is not None else F.lit(None).cast("timestamp").alias("_sparkstate_ts"),
        "data": F.col(data).cast("string"),
        "last": F.coalesce(F.col(last_flag), F.lit(False)) if last_flag is not None else F.lit(False),
    }
    cols = [fields[f] for f in SessionRow._fields[:REASON]]
    if emit:
        # Spark drops input rows at or behind the watermark inside the stateful operator when a
        # column of the operator's input carries the watermark (its metadata). So no column
        # carries it, except one that is always null (never "older" than anything): the operator
        # still runs in event time on the watermark the plan computes, and the function sees every row.
        # The columns' metadata is replaced by a marker, not emptied: Spark 4.0's optimizer drops
        # an alias whose metadata is empty as redundant, and the timestamp's watermark with it.
        names = [key, timestamp or "_sparkstate_ts", data, last_flag or "_sparkstate_last"]
        cols = [c.alias(n, metadata=_NO_WATERMARK) for c, n in zip(cols, names)]
        cols.append(reject.alias(_REJECT, metadata=_NO_WATERMARK))  # SessionRow.reason, then its carry
        cols += [F.col(c).alias(c, metadata=_NO_WATERMARK) for c in carry]
        if mode == "event" and df.isStreaming:
            cols.append(F.lit(None).cast("timestamp").alias(_WATERMARK, metadata={WATERMARK_DELAY_KEY: delay_ms}))
    return df.select(*cols)


def _output_type(events: DataFrame, key: str, timestamp: str | None, data: str, last_flag: str | None,
                 emit: bool, carry: list[str], event_time_column: str | None, gap_ms: int) -> StructType:
    """The sessions' columns, then with ``emit`` the :data:`REJECTED` struct."""
    fields = [
        StructField(key, events.schema[key].dataType, True),
        StructField("session_start", TimestampType(), True),
        StructField("session_end", TimestampType(), True),
        StructField("event_count", LongType(), True),
        StructField("events", ArrayType(StringType(), True), True),
        StructField("closed_by", StringType(), True),
    ]
    if emit:
        fields.append(rejected_field(events, carry, (StructField(timestamp or "event_time", TimestampType(), True),
                                                     StructField(data, StringType(), True),
                                                     StructField(last_flag or "is_last", BooleanType(), True))))
    if event_time_column is not None:
        fields.insert(6, StructField(event_time_column, TimestampType(), True,
                                     metadata={END_OFFSET_KEY: gap_ms + 1}))
    return StructType(fields)


__all__ = ["LATE_MODES", "LATE_PREFIX", "Late", "OpenSession", "REJECTED", "TimeMode", "iso_ms", "sessionize"]
