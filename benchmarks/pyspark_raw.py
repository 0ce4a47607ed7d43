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
SESSION_STATE = "start_ms long, end_ms long, events array<string>, timer_ms long"


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

    Input rows: ``(user_id, event_time, data, is_last)`` with a watermark; one ValueState per key
    holds the open session and its timer. A session times out when the watermark passes
    ``max(end + gap, watermark)``: transformWithState fires a timer once the watermark reaches
    it, GroupState strictly after, so the timer is registered 1 ms later.
    """

    def __init__(self, gap_ms: int) -> None:
        self.gap_ms = gap_ms

    def init(self, handle: Any) -> None:
        self.handle = handle
        self.session = handle.getValueState("session", SESSION_STATE)

    @staticmethod
    def _row(key: Any, start: int, end: int, events: list, closed_by: str) -> Row:
        return Row(user_id=key, session_start=_utc(start), session_end=_utc(end), event_count=len(events),
                   events=events, closed_by=closed_by)

    def handleInputRows(self, key: Any, rows: Iterator[Row], timerValues: Any) -> Iterator[Row]:
        k = key[0]
        events = sorted(((_ms(r[1]), r[2], bool(r[3])) for r in rows), key=lambda e: (e[0], e[2]))
        stored = self.session.get()
        timer = None
        current = None
        if stored is not None:
            current = [stored[0], stored[1], list(stored[2])]
            timer = stored[3]
        out = []
        for t, data, last in events:
            if current is not None and t - current[1] > self.gap_ms:
                out.append(self._row(k, current[0], current[1], current[2], "timeout"))
                current = None
            if current is None:
                current = [t, t, []]
            else:
                current[0], current[1] = min(current[0], t), max(current[1], t)
            current[2].append(data)
            if last:
                out.append(self._row(k, current[0], current[1], current[2], "last_event"))
                current = None
        if current is None:
            if stored is not None:
                self.session.clear()
                self.handle.deleteTimer(timer)
        else:
            due = max(current[1] + self.gap_ms, timerValues.getCurrentWatermarkInMs()) + 1
            if due != timer:
                if timer is not None:
                    self.handle.deleteTimer(timer)
                self.handle.registerTimer(due)
            self.session.update((current[0], current[1], current[2], due))
        return iter(out)

    def handleExpiredTimer(self, key: Any, timerValues: Any, expiredTimerInfo: Any) -> Iterator[Row]:
        stored = self.session.get()
        if stored is None:
            return iter(())
        self.session.clear()
        return iter([self._row(key[0], stored[0], stored[1], list(stored[2]), "timeout")])

    def close(self) -> None:
        pass
