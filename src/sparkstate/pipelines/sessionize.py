"""Sessionization: group each key's events into sessions that end on a flag or after a gap.

Built on :func:`sparkstate.operators.flat_map_groups_with_state`; the open sessions of a key are
its state, and a finished session is emitted exactly once, as one output row. In event time the
sessions do not depend on arrival order or micro-batch boundaries (within the watermark).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Iterable, Literal, Sequence

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
from ..engines import Engine
from ..engines.base import WATERMARK_DELAY_KEY
from ..engines.base import has_watermark
from ..operators import flat_map_groups_with_state
from ._columns import check_column, require_dataframe

TimeMode = Literal["event", "processing"]
TIME_MODES = ("event", "processing")
Late = Literal["drop", "emit"]
LATE_MODES = ("drop", "emit")

#: The output column (``late="emit"``) holding a record sessionize refused, with its reason; null
#: on session rows. Its fields: ``reason``, then the input's timestamp, data and last-flag
#: columns (by their names), then the ``carry`` columns.
REJECTED = "rejected"
#: How the reason of a row refused as late (at or behind the watermark) begins.
LATE_PREFIX = "late:"
# Internal columns of the operator's input.
_REJECT = "_sparkstate_reject"
_WATERMARK_TIME = "_sparkstate_watermark_time"
_WATERMARK = "_sparkstate_watermark"
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
#: Metadata of sessionize's ``event_time_column``: how far (ms) it lies after ``session_end``.
END_OFFSET_KEY = "sparkstate.sessionEndOffsetMs"


def iso_ms(t: datetime | int) -> str:
    """An instant (UTC ``datetime`` or epoch ms) as ``2024-01-01T00:05:00.000Z``, as Spark shows watermarks.

    >>> iso_ms(1704067500000)
    '2024-01-01T00:05:00.000Z'
    """
    d = utc(t) if isinstance(t, int) else _as_utc(t)
    frac = f"{d.microsecond // 1000:03d}" if d.microsecond % 1000 == 0 else f"{d.microsecond:06d}"
    return d.strftime("%Y-%m-%dT%H:%M:%S.") + frac + "Z"


def _as_utc(t: datetime) -> datetime:
    # Rows reach the function with UTC-aware datetimes; a naive one is taken as UTC.
    return t.replace(tzinfo=timezone.utc) if t.tzinfo is None else t.astimezone(timezone.utc)


def _epoch_us(t: datetime) -> int:
    delta = _as_utc(t) - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


_EPOCH_NAIVE = datetime(1970, 1, 1)


def _floor_ms(t: datetime) -> int:
    """Epoch ms of an event time, truncated (a naive datetime is taken as UTC)."""
    d = t - (_EPOCH if t.tzinfo is not None else _EPOCH_NAIVE)
    return (d.days * 86_400 + d.seconds) * 1000 + d.microseconds // 1000


@dataclass
class OpenSession:
    """The state of one key: its open sessions, one after another in event-time order.

    ``events`` holds the data of every open event, session after session; ``times`` each one's
    time (epoch ms; event time only); ``sizes`` how many of them each open session has, and
    ``closed`` whether it ends with a last-flag event (then it only waits for the watermark to
    pass its end). ``start_ms``/``end_ms`` are the first and last of those times. In processing
    time a key has one session and ``times``, ``sizes`` and ``closed`` stay empty.

    A state written by an earlier sparkstate (one session, no ``times``) reads back with the
    three lists empty; event-time sessionize takes it as one session and spreads its events'
    times evenly between its start and end (they were not stored).
    """

    start_ms: int | None = None
    end_ms: int | None = None
    events: list[str] = field(default_factory=list)
    times: list[int] = field(default_factory=list)
    sizes: list[int] = field(default_factory=list)
    closed: list[bool] = field(default_factory=list)

    def add(self, t_ms: int | None, data: str | None) -> None:
        """Append an event (processing time: arrival order)."""
        if t_ms is not None:
            self.start_ms = t_ms if self.start_ms is None else min(self.start_ms, t_ms)
            self.end_ms = t_ms if self.end_ms is None else max(self.end_ms, t_ms)
        self.events.append(data)

    def sessions(self) -> list[tuple[list[int], list, bool]]:
        """The open sessions as ``(times, events, closed)``."""
        events = self.events or []
        n = len(events)
        times = self.times or []
        if len(times) != n:  # written before times were stored: spread them over the session
            start = self.start_ms if self.start_ms is not None else (self.end_ms or 0)
            end = self.end_ms if self.end_ms is not None else start
            times = [start] if n == 1 else [start + (end - start) * i // (n - 1) for i in range(n)]
        sizes = self.sizes or [n]
        closed = self.closed or [False] * len(sizes)
        out = []
        pos = 0
        for size, c in zip(sizes, closed):
            out.append((times[pos:pos + size], events[pos:pos + size], bool(c)))
            pos += size
        return out

    def pending(self) -> list[tuple[int, bool, str | None]]:
        """Every event of the open sessions as ``(time, last, data)``, in session order."""
        events = self.events or []
        n = len(events)
        times = self.times
        sizes = self.sizes
        if not sizes or not times or len(times) != n:
            return [(t, c and i == len(ts) - 1, d) for ts, ds, c in self.sessions()
                    for i, (t, d) in enumerate(zip(ts, ds))]
        lasts = [False] * n
        pos = 0
        for size, c in zip(sizes, self.closed or ()):
            pos += size
            if c:
                lasts[pos - 1] = True
        return list(zip(times, lasts, events))


def _event_order(e: tuple[int, bool, str | None]) -> tuple:
    return (e[0], e[1], e[2] is not None, e[2] or "")


class _Sessionizer:
    """The group function (picklable: holds plain settings only).

    Values are rows ``(key, timestamp, data, last_flag)``, as :func:`sessionize` selects them;
    with ``emit`` (``late="emit"``) then the reject reason (``None`` unless ``max_future_skew``
    refused the row), the ``n_carry`` carried columns, and the (null) watermark column.
    """

    def __init__(self, gap_ms: int, time_mode: TimeMode, streaming: bool, has_timestamp: bool,
                 emit: bool = False, n_carry: int = 0, emit_on_last: bool = False,
                 time_column: bool = False) -> None:
        self.gap_ms = gap_ms
        self.time_mode = time_mode
        self.streaming = streaming
        self.has_timestamp = has_timestamp
        self.emit = emit
        self.n_carry = n_carry
        self.emit_on_last = emit_on_last
        self.time_column = time_column
        self.__name__ = "sessionize"

    def _row(self, key: Any, s: OpenSession, closed_by: str) -> tuple:
        start = None if s.start_ms is None else utc(s.start_ms)
        end = None if s.end_ms is None else utc(s.end_ms)
        row = (key, start, end, len(s.events), s.events, closed_by)
        return row + (None,) if self.emit else row

    def _session_row(self, key: Any, times: list[int], data: list, closed: bool) -> tuple:
        row = (key, utc(times[0]), utc(times[-1]), len(data), data, "last_event" if closed else "timeout")
        if self.time_column:
            # end + gap + 1 ms is after the previous micro-batch's watermark W, as Spark requires of
            # an event-time column: a session is emitted in the first batch where it is final, so
            # either its last event was read in this batch (then it is not behind W), or it was
            # open after the previous batch, whose timers fired every session final at W: then
            # end + gap >= W (closed by the gap) or end > W (closed by a flag).
            row += (utc(times[-1] + self.gap_ms + 1),)
        return row + (None,) if self.emit else row

    def _rejected(self, key: Any, r: Any, reason: str) -> tuple:
        record = (reason, r[1], r[2], bool(r[3])) + tuple(r[5: 5 + self.n_carry])
        return (key, None, None, None, None, None) + ((None,) if self.time_column else ()) + (record,)

    def _refused(self, r: Any, watermark_ms: int) -> str | None:
        """Why a row cannot join a session (``late="emit"``), or ``None``."""
        if r[4] is not None:  # max_future_skew, decided in SQL before the watermark saw the row
            return r[4]
        t = r[1]
        if t is None:
            return "event_time is null"
        if self.streaming:
            # Late as Spark counts it, at or behind the watermark; to the millisecond, as sessions are.
            ms = _floor_ms(t)
            if ms < watermark_ms:
                return f"{LATE_PREFIX} event_time {iso_ms(t)} is older than the watermark {iso_ms(watermark_ms)}"
            if ms == watermark_ms:
                return f"{LATE_PREFIX} event_time {iso_ms(t)} is at the watermark {iso_ms(watermark_ms)}"
        return None

    def __call__(self, key: Any, rows: Iterable[Any], state: GroupState) -> list[tuple]:
        if self.time_mode == "event":
            return self._event_time(key, rows, state)
        if state.hasTimedOut:
            finished = state.get
            state.remove()
            return [self._row(key, finished, "timeout")]
        return self._processing_time(key, rows, state)

    def _event_time(self, key: Any, rows: Iterable[Any], state: GroupState) -> list[tuple]:
        out: list[tuple] = []
        watermark_ms = state.getCurrentWatermarkMs() if self.streaming else -1
        if self.emit:
            # Route what cannot join a session (late, too far ahead, no time) to the output,
            # before anything touches the state.
            kept = []
            for r in rows:
                reason = self._refused(r, watermark_ms)
                if reason is None:
                    kept.append(r)
                else:
                    out.append(self._rejected(key, r, reason))
            rows = kept
        # (unpacked, not indexed: a Row's [] is a Python-level method, three calls per event)
        events = [(_floor_ms(t), bool(last), d) for _k, t, d, last, *_rest in rows]
        stored: OpenSession | None = state.getOption
        if stored is not None:
            pending = stored.pending()
            pending.extend(events)
            events = pending
        # The key's events in one order whatever their arrival: time, an unflagged event before a
        # flagged one at the same time, then data (null first).
        try:
            events.sort()
        except TypeError:  # null data beside non-null data at the same time and flag
            events.sort(key=_event_order)
        # Split into sessions: after a flagged event, or where the next event is more than gap later.
        gap = self.gap_ms
        sessions: list[tuple[list[int], list, bool]] = []
        times: list[int] = []
        data: list = []
        prev_t = 0
        prev_last = True
        for t, last, d in events:
            if prev_last or t - prev_t > gap:
                if times:
                    sessions.append((times, data, prev_last))
                times, data = [], []
            times.append(t)
            data.append(d)
            prev_t, prev_last = t, last
        if times:
            sessions.append((times, data, prev_last))
        # Emit what is final: no event that is not late (later than the watermark) can still join,
        # split or extend it: the watermark has reached its end (closed by a flag) or passed its
        # end + gap. Final sessions are a prefix: every earlier session ends before that. As a
        # GroupState timeout: final once the watermark is past end - 1 / end + gap.
        i = 0
        if not self.streaming:  # a static input is complete: the watermark is past every session
            i = len(sessions)
        else:
            for times, data, closed in sessions:
                if (times[-1] - 1 if closed else times[-1] + gap) >= watermark_ms:
                    break
                i += 1
        for times, data, closed in sessions[:i]:
            out.append(self._session_row(key, times, data, closed))
        rest = sessions[i:]
        if self.emit_on_last and rest:
            # Opt-in: a flag ends a session at once (assumes events arrive in event-time order).
            for times, data, closed in rest:
                if closed:
                    out.append(self._session_row(key, times, data, closed))
            rest = [s for s in rest if not s[2]]
        if not rest:
            if state.exists:
                state.remove()
            return out
        if len(rest) == 1:
            times, data, closed = rest[0]
            state.update(OpenSession(times[0], times[-1], data, times, [len(times)], [closed]))
        else:
            all_t: list[int] = []
            all_d: list = []
            for times, data, _ in rest:
                all_t += times
                all_d += data
            state.update(OpenSession(all_t[0], all_t[-1], all_d, all_t, [len(t) for t, _, _ in rest],
                                     [c for _, _, c in rest]))
        # The earliest open session is the first to become final.
        times, _, closed = rest[0]
        state.setTimeoutTimestamp(times[-1] - 1 if closed else times[-1] + gap)
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
    engine: str | Engine | None = None,
    late: Late = "drop",
    max_future_skew: Duration | None = None,
    carry: Sequence[str] = (),
    checkpoint: str | os.PathLike | None = None,
    emit_on_last: bool = False,
    initial_state: DataFrame | None = None,
    event_time_column: str | None = None,
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
                                          max_future_skew, emit_on_last, event_time_column)
    df = _operator_input(events, key, timestamp, data, last_flag, mode, emit, carry, skew_ms, max_future_skew,
                         watermark_ms)
    return flat_map_groups_with_state(
        df,
        key=key,
        func=_Sessionizer(gap_ms, mode, events.isStreaming, timestamp is not None, emit, len(carry),
                          bool(emit_on_last), event_time_column is not None),
        state_type=OpenSession,
        output_type=_output_type(events, key, timestamp, data, last_flag, emit, carry, event_time_column, gap_ms),
        timeout=GroupStateTimeout.EventTimeTimeout if mode == "event" else GroupStateTimeout.ProcessingTimeTimeout,
        initial_state=initial_state,
        output_mode="append",
        engine=engine,
        checkpoint=checkpoint,
        event_time_column=event_time_column,
    )


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
    return mode, gap_ms, watermark_ms


def _check_columns(events: DataFrame, key: str, timestamp: str | None, data: str, last_flag: str | None,
                   mode: TimeMode, late: Any, carry: Sequence[str] | str, max_future_skew: Duration | None,
                   emit_on_last: bool, event_time_column: str | None) -> tuple[bool, list[str], int | None]:
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
    carry = [carry] if isinstance(carry, str) else list(carry)
    if carry and not emit:
        raise ConfigError("sessionize: carry= copies columns into refused rows, which only late='emit' outputs")
    taken = {key, timestamp, data, last_flag}
    for c in carry:
        _check_column(events, c, "carry")
        if c in taken or c == "reason":
            raise ConfigError(f"sessionize: carry column {c!r} is already a column sessionize uses; name others")
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
    return emit, carry, skew_ms


def _operator_input(events: DataFrame, key: str, timestamp: str | None, data: str, last_flag: str | None,
                    mode: TimeMode, emit: bool, carry: list[str], skew_ms: int | None,
                    max_future_skew: Duration | None, watermark_ms: int) -> DataFrame:
    """The rows the group function gets: ``(key, timestamp, data, last_flag)``, then with ``emit`` the
    reject reason, the carried columns and the (null) column carrying the watermark."""
    df = events
    ts = F.col(timestamp) if timestamp is not None else None
    reject = F.lit(None).cast("string")
    if skew_ms is not None:
        fmt = "yyyy-MM-dd'T'HH:mm:ss.SSSXXX"
        now = F.current_timestamp()  # in a stream: the micro-batch's time, the same again on a replay
        reject = F.when(ts > now + F.expr(f"INTERVAL {skew_ms} MILLISECONDS"), F.concat(
            F.lit("future: event_time "), F.date_format(ts, fmt),
            F.lit(f" is more than {max_future_skew} ahead of the processing time "), F.date_format(now, fmt)))
        df = df.withColumn(_REJECT, reject)
        reject = F.col(_REJECT)
    delay_ms = watermark_ms
    if mode == "event":
        if df.isStreaming and not has_watermark(df):
            if skew_ms is not None:  # the watermark follows only the rows that may join sessions
                df = df.withColumn(_WATERMARK_TIME, F.when(reject.isNull(), ts))
                df = df.withWatermark(_WATERMARK_TIME, f"{watermark_ms} milliseconds")
            else:
                df = df.withWatermark(timestamp, f"{watermark_ms} milliseconds")
        else:
            delay_ms = next((int(f.metadata[WATERMARK_DELAY_KEY]) for f in df.schema.fields
                             if WATERMARK_DELAY_KEY in (f.metadata or {})), watermark_ms)
        if not emit:
            df = df.where(ts.isNotNull())
    cols = [
        F.col(key),
        ts if ts is not None else F.lit(None).cast("timestamp").alias("_sparkstate_ts"),
        F.col(data).cast("string"),
        F.coalesce(F.col(last_flag), F.lit(False)) if last_flag is not None else F.lit(False),
    ]
    if emit:
        # Spark drops input rows at or behind the watermark inside the stateful operator when a
        # column of the operator's input carries the watermark (its metadata). So no column
        # carries it, except one that is always null (never "older" than anything): the operator
        # still runs in event time on the watermark the plan computes, and the function sees every row.
        names = [key, timestamp or "_sparkstate_ts", data, last_flag or "_sparkstate_last"]
        cols = [c.alias(n, metadata={}) for c, n in zip(cols, names)]
        cols.append(reject.alias(_REJECT, metadata={}))
        cols += [F.col(c).alias(c, metadata={}) for c in carry]
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
        record = [StructField("reason", StringType(), True),
                  StructField(timestamp or "event_time", TimestampType(), True),
                  StructField(data, StringType(), True),
                  StructField(last_flag or "is_last", BooleanType(), True)]
        record += [StructField(c, events.schema[c].dataType, True) for c in carry]
        fields.append(StructField(REJECTED, StructType(record), True))
    if event_time_column is not None:
        fields.insert(6, StructField(event_time_column, TimestampType(), True,
                                     metadata={END_OFFSET_KEY: gap_ms + 1}))
    return StructType(fields)


__all__ = ["LATE_MODES", "LATE_PREFIX", "Late", "OpenSession", "REJECTED", "TimeMode", "iso_ms", "sessionize"]
