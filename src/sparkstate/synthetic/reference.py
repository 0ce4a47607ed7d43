"""The ground truth of sessionization: the sessions in a set of events, computed directly (no Spark).

The definition event-time :func:`sparkstate.pipelines.sessionize` is checked against.

>>> from sparkstate.synthetic.generator import generate_events
>>> len(reference_sessions(generate_events(20, users=2))) > 0
True
"""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime, timedelta, timezone  # noqa: F401  (datetime, timezone: the doctests)
from typing import Iterable

from ..durations import Duration, Instant, instant_ms, positive_ms
from .generator import ClosedBy, Event, Session, at_ms

def reference_sessions(
    events: Iterable[Event], gap: Duration = "1 minute", watermark: Instant | None = None,
    *, emit_on_last: bool = False,
) -> list[Session]:
    """The event-time sessions in ``events``, computed directly (no Spark), sorted by user and start.

    Per user: sort by ``event_time``, at equal times an event with ``is_last`` false before one
    with it true, then by ``data``; split where consecutive events are more than ``gap`` apart
    (the earlier session is closed by ``"timeout"``) and after each ``is_last`` event
    (``"last_event"``). This order is total, so the sessions do not depend on the order of
    ``events``.

    ``watermark`` (epoch ms or a datetime): only the sessions that are final at that watermark,
    as event-time ``sessionize`` emits them: a ``"timeout"`` session once ``end + gap <
    watermark``, a ``"last_event"`` one once ``end <= watermark`` (always, with
    ``emit_on_last``). Without it the input is taken as complete and every session is returned.

    >>> t0 = datetime(2024, 1, 1, tzinfo=timezone.utc)
    >>> evs = [Event("u", t0, "a"), Event("u", t0 + timedelta(seconds=30), "b", is_last=True),
    ...        Event("u", t0 + timedelta(seconds=40), "c"), Event("u", t0 + timedelta(minutes=5), "d")]
    >>> [(s.events, s.closed_by) for s in reference_sessions(evs, gap="1 minute")]
    [(('a', 'b'), 'last_event'), (('c',), 'timeout'), (('d',), 'timeout')]
    >>> len(reference_sessions(evs, gap="1 minute", watermark=t0 + timedelta(minutes=6)))  # 'd' still open
    2
    >>> len(reference_sessions(evs, gap="1 minute", watermark=t0 + timedelta(minutes=7)))
    3
    >>> len(reference_sessions(evs, gap="1 minute", watermark=t0 + timedelta(seconds=29)))  # not yet at 'b'
    0
    """
    gap_td = timedelta(milliseconds=positive_ms(gap, "reference_sessions: gap"))
    until = None if watermark is None else at_ms(instant_ms(watermark, "reference_sessions: watermark"))
    by_user: dict[str, list[Event]] = defaultdict(list)
    for e in events:
        by_user[e.user_id].append(e)
    out: list[Session] = []
    for user, evs in by_user.items():
        evs.sort(key=lambda e: (e.event_time, e.is_last, e.data is not None, e.data or ""))
        sessions: list[Session] = []
        current: list[Event] = []
        for e in evs:
            if current and e.event_time - current[-1].event_time > gap_td:
                sessions.append(_session(user, current, "timeout"))
                current = []
            current.append(e)
            if e.is_last:
                sessions.append(_session(user, current, "last_event"))
                current = []
        if current:
            sessions.append(_session(user, current, "timeout"))
        for s in sessions:
            if until is None or (s.session_end + gap_td < until if s.closed_by == "timeout"
                                 else emit_on_last or s.session_end <= until):
                out.append(s)
    out.sort(key=lambda s: (s.user_id, s.session_start))
    return out


def _session(user: str, evs: list[Event], closed_by: ClosedBy) -> Session:
    return Session(user, evs[0].event_time, evs[-1].event_time, len(evs), tuple(e.data for e in evs), closed_by)


__all__ = ["reference_sessions"]
