"""What sessionize runs per key on the workers: a key's open sessions (:class:`OpenSession`, the
state) and the group function (:class:`Sessionizer`) that adds a micro-batch's events to them
and emits each session once it is final, in event time or in processing time.

:func:`sparkstate.pipelines.sessionize` builds the query around it (the checks, the operator's
input and output type); the harnesses can drive it without Spark.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Iterable, Literal, NamedTuple

from ..durations import instant_ms, utc
from ..group_state import GroupState

TimeMode = Literal["event", "processing"]
#: How the reason of a row refused as late (at or behind the watermark) begins.
LATE_PREFIX = "late:"
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


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
        self.events.append(data)  # type: ignore[arg-type]  # a null data is kept as null (arrays hold nulls)

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


class SessionRow(NamedTuple):
    """One row of sessionize's operator input, field by field in column order: the one
    declaration of that layout (:func:`~sparkstate.pipelines.sessionize` selects the columns in
    this order; both sessionizers read them by these names).

    ``reason`` (``late="emit"`` only): why SQL already refused the row (``max_future_skew``), else
    ``None``. ``carry``: the carried columns' values (``late="emit"``), which the input holds
    as the columns after ``reason``; then (event time on a stream) the always-null watermark column.
    """

    key: Any
    time: datetime | None
    data: str | None
    last: bool
    reason: str | None = None
    carry: tuple = ()

    @classmethod
    def of(cls, row: Any, n_carry: int) -> "SessionRow":
        """The record of an input row as an engine hands it (a ``Row`` of the operator input)."""
        if len(row) <= REASON:
            return cls(*row[:REASON])
        return cls(row[KEY], row[TIME], row[DATA], row[LAST], row[REASON], tuple(row[CARRY: CARRY + n_carry]))


#: Each field's column in the operator input (the carried columns start at ``CARRY``).
KEY, TIME, DATA, LAST, REASON, CARRY = range(len(SessionRow._fields))


def _event_order(e: tuple[int, bool, str | None]) -> tuple:
    return (e[0], e[1], e[2] is not None, e[2] or "")


class Sessionizer:
    """The group function (picklable: holds plain settings only).

    Values are rows laid out as :class:`SessionRow` (key, timestamp, data, last flag; with
    ``emit`` (``late="emit"``) then the reject reason, the ``n_carry`` carried columns and the
    (null) watermark column), as :func:`sessionize` selects them. Event-time sessionize on a
    stream runs the same rules over a bucket of keys at a time where the engine groups keys
    (:class:`~.columnar_sessionizer.SessionLogic`, the plan's bucket logic).
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
        row: tuple = (key, utc(times[0]), utc(times[-1]), len(data), data, "last_event" if closed else "timeout")
        if self.time_column:
            # end + gap + 1 ms is after the previous micro-batch's watermark W, as Spark requires of
            # an event-time column: a session is emitted in the first batch where it is final, so
            # either its last event was read in this batch (then it is not behind W), or it was
            # open after the previous batch, whose timers fired every session final at W: then
            # end + gap >= W (closed by the gap) or end > W (closed by a flag).
            row += (utc(times[-1] + self.gap_ms + 1),)
        return row + (None,) if self.emit else row

    def rejected_row(self, key: Any, row: SessionRow, reason: str) -> tuple:
        """The output row of an input row refused with ``reason`` (``late="emit"``): null session
        columns and the ``rejected`` record (reason, time, data, flag, the carried columns)."""
        record = (reason, row.time, row.data, bool(row.last)) + tuple(row.carry)
        return (key, None, None, None, None, None) + ((None,) if self.time_column else ()) + (record,)

    def refusal(self, row: SessionRow, watermark_ms: int) -> str | None:
        """Why a row cannot join a session (``late="emit"``), or ``None``."""
        if row.reason is not None:  # max_future_skew, decided in SQL before the watermark saw the row
            return row.reason
        t = row.time
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
                row = SessionRow.of(r, self.n_carry)
                reason = self.refusal(row, watermark_ms)
                if reason is None:
                    kept.append(r)
                else:
                    out.append(self.rejected_row(key, row, reason))
            rows = kept
        # SessionRow's fields, unpacked rather than indexed (a Row's [] is a Python-level method,
        # three calls per event)
        events = [(_floor_ms(t), bool(last), d) for _key, t, d, last, *_rest in rows]
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
            for times, _data, closed in sessions:
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
        for _key, t, d, last, *_rest in rows:  # SessionRow's fields, in arrival order
            if current is None:
                current = OpenSession()
            if not self.has_timestamp:
                t_ms: int | None = now_ms
            else:
                t_ms = None if t is None else instant_ms(t)
            current.add(t_ms, d)
            if last:
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
