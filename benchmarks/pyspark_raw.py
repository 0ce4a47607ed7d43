"""The raw-PySpark contenders: written directly against pyspark, no sparkstate.

Each is the minimal program a PySpark user would write: a ``transformWithState`` processor
(Row API) with one ValueState, and an ``applyInPandasWithState`` function. Workers unpickle
these by reference, so ``benchmarks`` must be importable there (the runner puts the project
root on ``PYTHONPATH`` before Spark starts).
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any, Iterator

import pandas as pd
from pyspark.sql import Row
from pyspark.sql.streaming import StatefulProcessor

COUNT_OUTPUT = "user string, count long"
COUNT_STATE = "count long"
SESSION_STATE = "times array<long>, lasts array<boolean>, events array<string>, timer_ms long"


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


class TwsSessionizer(StatefulProcessor):
    """Event-time sessionization with the semantics of ``sparkstate.pipelines.sessionize``.

    Input rows: ``(user_id, event_time, data, is_last)`` with a watermark. A key's pending events
    (every open session's, as flat lists) are one ValueState; each call sorts them with the new
    ones (time, unflagged before flagged, data), splits them after a flag or where the next event
    is more than ``gap`` later, emits the leading sessions that are final (the watermark at or past
    the end of one closed by a flag, past end + gap otherwise) and keeps the rest, with a timer for the
    first of them: transformWithState fires a timer once the watermark reaches it, GroupState
    strictly after, so the timer is registered 1 ms later.
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
    def _row(key: Any, times: list, events: list, closed: bool) -> Row:
        return Row(user_id=key, session_start=_utc(times[0]), session_end=_utc(times[-1]), event_count=len(events),
                   events=events, closed_by="last_event" if closed else "timeout")

    def _run(self, k: Any, new: list, watermark: int, fired: bool = False) -> Iterator[Row]:
        stored = self.session.get()
        timer = None
        events = new
        if stored is not None:
            events = list(zip(stored[0], stored[1], stored[2])) + new
            timer = None if fired else stored[3]  # a timer that fired is gone
        events.sort(key=lambda e: (e[0], e[1], e[2] is not None, e[2] or ""))
        sessions: list = []
        times: list = []
        data: list = []
        prev_t, prev_last = 0, True
        for t, last, d in events:
            if prev_last or t - prev_t > self.gap_ms:
                if times:
                    sessions.append((times, data, prev_last))
                times, data = [], []
            times.append(t)
            data.append(d)
            prev_t, prev_last = t, last
        if times:
            sessions.append((times, data, prev_last))
        # Final sessions are emitted, the others kept (without emit_on_last the final ones are
        # the leading ones: a later session ends later).
        out, rest = [], []
        for times, data, closed in sessions:
            if (closed and self.emit_on_last) or (times[-1] - 1 if closed else times[-1] + self.gap_ms) < watermark:
                out.append(self._row(k, times, data, closed))
            else:
                rest.append((times, data, closed))
        if not rest:
            if stored is not None:
                self.session.clear()
                if timer is not None:
                    self.handle.deleteTimer(timer)
            return iter(out)
        times, data, closed = rest[0]
        due = (times[-1] - 1 if closed else times[-1] + self.gap_ms) + 1
        if due != timer:
            if timer is not None:
                self.handle.deleteTimer(timer)
            self.handle.registerTimer(due)
        flat_t, flat_l, flat_d = [], [], []
        for times, data, closed in rest:
            flat_t += times
            flat_d += data
            flat_l += [False] * (len(times) - 1) + [closed]
        self.session.update((flat_t, flat_l, flat_d, due))
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
