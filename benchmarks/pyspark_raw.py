"""The raw-PySpark contenders: written directly against pyspark, no sparkstate.

Each is the minimal program a PySpark user would write: a ``transformWithState`` processor
(Row API) with one ValueState (PySpark 4.1 and later), and ``applyInPandasWithState`` functions
(3.4 and later: the user's alternative on 3.5). Workers unpickle these by reference, so
``benchmarks`` must be importable there (the runner puts the project root on ``PYTHONPATH``
before Spark starts).

The sessionizers share :func:`split_final`, the semantics of ``sparkstate.pipelines.sessionize``:

>>> events = [(0, False, "a"), (50_000, True, "b"), (60_000, False, "c"), (200_000, False, "d")]
>>> final, rest = split_final(events, watermark=130_000, gap_ms=60_000)
>>> [(s.times, s.closed) for s in final], [(s.times, s.closed) for s in rest]
([([0, 50000], True), ([60000], False)], [([200000], False)])
>>> final_at(rest[0], 60_000)
260000
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Iterator

import pandas as pd
from pyspark.sql import Row

try:
    from pyspark.sql.streaming import StatefulProcessor
except ImportError:  # PySpark before 4.1 has no transformWithState: its contenders are left out (contenders.py)
    StatefulProcessor = object  # type: ignore[assignment,misc]

COUNT_OUTPUT = "user string, count long"
COUNT_STATE = "count long"
SESSION_STATE = "times array<long>, lasts array<boolean>, events array<string>, timer_ms long"
#: The applyInPandasWithState sessionizer's state: the pending events, pickled (its timeout is
#: Spark's own). Not as arrays: PySpark 4.3's worker cannot read an array in that state's schema
#: (``KeyError: 'elementType'``), and one program runs on every minor.
PANDAS_SESSION_STATE = "pending binary"


class TwsCounter(StatefulProcessor):
    """Running count: one ``count`` ValueState per key, one output row per key and batch."""

    def init(self, handle: Any) -> None:
        self.count = handle.getValueState("count", COUNT_STATE)

    def handleInputRows(self, key: Any, rows: Iterator[Row], timerValues: Any) -> Iterator[Row]:
        n = 0
        for _ in rows:
            n += 1
        current = self.count.get()
        total = n + (current[0] if current is not None else 0)
        self.count.update((total,))
        yield Row(user=key[0], count=total)

    def handleInitialState(self, key: Any, initialState: Row, timerValues: Any) -> None:
        self.count.update((initialState["count"],))

    def close(self) -> None:
        pass


def pandas_count(key: tuple, frames: Iterator[pd.DataFrame], state: Any) -> Iterator[pd.DataFrame]:
    """Running count with ``applyInPandasWithState`` (state: ``count long``)."""
    n = 0
    for frame in frames:
        n += len(frame)
    total = n + (state.get[0] if state.exists else 0)
    state.update((total,))
    yield pd.DataFrame({"user": [key[0]], "count": [total]})


def _ms(t: datetime) -> int:
    # PySpark hands timestamps over as naive local-time or aware datetimes; .timestamp() reads both.
    return round(t.timestamp() * 1000)


def _utc(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc)


#: One event of a key: (epoch ms, is_last, data).
Event = tuple[int, bool, "str | None"]


@dataclass
class Session:
    """Consecutive events of one key: their times and data, and whether a flag closed it."""

    times: list[int]
    data: list
    closed: bool


def final_at(s: Session, gap_ms: int) -> int:
    """The session is final once the watermark is past this: end - 1 (closed by a flag), else end + gap."""
    return s.times[-1] - 1 if s.closed else s.times[-1] + gap_ms


def split_final(events: list[Event], watermark: int, gap_ms: int,
                emit_on_last: bool = False) -> tuple[list[Session], list[Session]]:
    """A key's events (stored and new) as (final sessions, open sessions), each in time order.

    Sorted by time, an unflagged event before a flagged one at equal times, then by data (null
    first); split after a flag or where the next event is more than ``gap_ms`` later. A session
    is final when the watermark is past :func:`final_at` (with ``emit_on_last``, one closed by a
    flag at once: sessionize's ``emit_on_last=True``). Without ``emit_on_last`` the final
    sessions are the leading ones: a later session ends later.
    """
    events = sorted(events, key=lambda e: (e[0], e[1], e[2] is not None, e[2] or ""))
    sessions: list[Session] = []
    prev_t, prev_last = 0, True
    for t, last, d in events:
        if prev_last or t - prev_t > gap_ms:
            sessions.append(Session([], [], False))
        s = sessions[-1]
        s.times.append(t)
        s.data.append(d)
        s.closed = bool(last)
        prev_t, prev_last = t, last
    final, rest = [], []
    for s in sessions:
        (final if (s.closed and emit_on_last) or final_at(s, gap_ms) < watermark else rest).append(s)
    return final, rest


def _flatten(rest: list[Session]) -> tuple[list[int], list[bool], list]:
    """Open sessions as the state's flat lists (times, lasts, data)."""
    times: list[int] = []
    lasts: list[bool] = []
    data: list = []
    for s in rest:
        times += s.times
        data += s.data
        lasts += [False] * (len(s.times) - 1) + [s.closed]
    return times, lasts, data


class TwsSessionizer(StatefulProcessor):
    """Event-time sessionization with the semantics of ``sparkstate.pipelines.sessionize``.

    Input rows: ``(user_id, event_time, data, is_last)`` with a watermark. A key's pending events
    (every open session's, as flat lists) are one ValueState; each call runs :func:`split_final`
    on them and the new ones, emits the final sessions and keeps the rest, with a timer for the
    first of them: transformWithState fires a timer once the watermark reaches it, GroupState
    strictly after, so the timer is registered 1 ms after :func:`final_at`.
    """

    def __init__(self, gap_ms: int, emit_on_last: bool = False) -> None:
        self.gap_ms = gap_ms
        #: A session closed by a flag is emitted in the batch that reads the flag (sessionize's
        #: ``emit_on_last=True``), not when the watermark reaches it.
        self.emit_on_last = emit_on_last

    def init(self, handle: Any) -> None:
        self.handle = handle
        self.session = handle.getValueState("session", SESSION_STATE)

    @staticmethod
    def _row(key: Any, s: Session) -> Row:
        return Row(user_id=key, session_start=_utc(s.times[0]), session_end=_utc(s.times[-1]),
                   event_count=len(s.data), events=s.data, closed_by="last_event" if s.closed else "timeout")

    def _run(self, k: Any, new: list, watermark: int, fired: bool = False) -> Iterator[Row]:
        stored = self.session.get()
        timer = None
        events = new
        if stored is not None:
            events = list(zip(stored[0], stored[1], stored[2])) + new
            timer = None if fired else stored[3]  # a timer that fired is gone
        final, rest = split_final(events, watermark, self.gap_ms, self.emit_on_last)
        out = [self._row(k, s) for s in final]
        if not rest:
            if stored is not None:
                self.session.clear()
                if timer is not None:
                    self.handle.deleteTimer(timer)
            return iter(out)
        due = final_at(rest[0], self.gap_ms) + 1
        if due != timer:
            if timer is not None:
                self.handle.deleteTimer(timer)
            self.handle.registerTimer(due)
        self.session.update((*_flatten(rest), due))
        return iter(out)

    def handleInputRows(self, key: Any, rows: Iterator[Row], timerValues: Any) -> Iterator[Row]:
        new = [(_ms(r[1]), bool(r[3]), r[2]) for r in rows]
        return self._run(key[0], new, timerValues.getCurrentWatermarkInMs())

    def handleExpiredTimer(self, key: Any, timerValues: Any, expiredTimerInfo: Any) -> Iterator[Row]:
        stored = self.session.get()
        if stored is None:
            return iter(())
        return self._run(key[0], [], timerValues.getCurrentWatermarkInMs(), fired=True)

    def close(self) -> None:
        pass


def _epoch_ms(times: pd.Series) -> list[int]:
    """A timestamp column as epoch milliseconds (PySpark hands it over naive, in the session's
    time zone: UTC here; an aware column's values are UTC)."""
    return times.values.astype("datetime64[ms]").astype("int64").tolist()


class PandasSessionizer:
    """The same sessionizer with ``applyInPandasWithState`` (event-time timeout, append): the
    pending events, as (times, lasts, data) lists, are the state (:data:`PANDAS_SESSION_STATE`), the timeout is Spark's
    ``setTimeoutTimestamp`` at :func:`final_at` of the first open session (GroupState fires it
    once the watermark is past it). Called with the key's frames, or with none when it timed out."""

    def __init__(self, gap_ms: int, emit_on_last: bool = False) -> None:
        self.gap_ms = gap_ms
        self.emit_on_last = emit_on_last  # a session closed by a flag is final at once (TwsSessionizer's)

    def __call__(self, key: tuple, frames: Iterator[pd.DataFrame], state: Any) -> Iterator[pd.DataFrame]:
        events: list = []
        if state.exists:
            times, lasts, data = pickle.loads(state.get[0])
            events = list(zip(times, lasts, data))
        for f in frames:
            if f.empty:  # a key whose timeout fired comes with no rows
                continue
            events += zip(_epoch_ms(f["event_time"]), f["is_last"].tolist(), f["data"].tolist())
        final, rest = split_final(events, state.getCurrentWatermarkMs(), self.gap_ms, self.emit_on_last)
        if rest:
            state.update((pickle.dumps(_flatten(rest)),))
            state.setTimeoutTimestamp(final_at(rest[0], self.gap_ms))
        elif state.exists:
            state.remove()
        if final:
            yield pd.DataFrame({
                "user_id": [key[0]] * len(final),
                "session_start": [pd.Timestamp(s.times[0], unit="ms", tz="UTC") for s in final],
                "session_end": [pd.Timestamp(s.times[-1], unit="ms", tz="UTC") for s in final],
                "event_count": [len(s.data) for s in final],
                "events": [s.data for s in final],
                "closed_by": ["last_event" if s.closed else "timeout" for s in final],
            })
