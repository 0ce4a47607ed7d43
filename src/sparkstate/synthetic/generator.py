"""A deterministic synthetic clickstream: users' clicks, as events and as JSON-lines files.

Each user has a timeline of sessions. Inside a session consecutive events are at most 90% of
``gap`` apart; a session either ends with an ``is_last`` event (after which the next session
may start at any time) or is followed by a pause longer than ``gap``. So, per user, the
sessions are exactly what :func:`~sparkstate.synthetic.reference.reference_sessions` finds:
sort by ``event_time``, split where consecutive events are more than ``gap`` apart or after an
``is_last`` event.

The same ``seed`` gives the same events, byte for byte.

>>> events = generate_events(40, users=3, seed=7)
>>> len(events), sorted({e.user_id for e in events})
(40, ['user-000', 'user-001', 'user-002'])
>>> events == generate_events(40, users=3, seed=7)
True
>>> from sparkstate.synthetic.reference import reference_sessions
>>> sessions = reference_sessions(events, gap="1 minute")
>>> sum(s.event_count for s in sessions)
40
"""

from __future__ import annotations

import json
import os
import random
import time
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Iterable, Literal, Sequence

from ..durations import Duration, Instant, instant_ms, positive_ms
from ..errors import ConfigError

#: The schema of the generated records, as a DDL string for ``spark.readStream.schema(...)``.
EVENT_SCHEMA = "user_id string, event_time timestamp, data string, is_last boolean"

#: Event times start here unless told otherwise (a fixed instant keeps runs reproducible).
DEFAULT_START = datetime(2024, 1, 1, tzinfo=timezone.utc)

_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_PAGES = ("/home", "/search", "/product", "/reviews", "/cart", "/checkout", "/account", "/help")

ClosedBy = Literal["last_event", "timeout"]


@dataclass(frozen=True)
class Event:
    """One click: who, when (an aware UTC ``datetime``), what page, and whether it ends the session."""

    user_id: str
    event_time: datetime
    data: str
    is_last: bool = False

    def to_json(self) -> str:
        """The record as one JSON line (``event_time`` as ISO 8601 UTC with milliseconds).

        >>> Event("u1", datetime(2024, 1, 1, 0, 0, 5, 123000, tzinfo=timezone.utc), "/home").to_json()
        '{"user_id": "u1", "event_time": "2024-01-01T00:00:05.123Z", "data": "/home", "is_last": false}'
        """
        return json.dumps({
            "user_id": self.user_id,
            "event_time": _iso(self.event_time),
            "data": self.data,
            "is_last": self.is_last,
        })


@dataclass(frozen=True)
class Session:
    """A finished session, in the shape of :func:`sparkstate.pipelines.sessionize`'s output rows.

    Times are aware UTC ``datetime``s; ``events`` is the tuple of the events' ``data``.
    """

    user_id: str
    session_start: datetime
    session_end: datetime
    event_count: int
    events: tuple[str, ...]
    closed_by: ClosedBy

    @classmethod
    def from_row(cls, row: Any, key: str = "user_id") -> "Session":
        """Build from a ``sessionize`` output ``Row`` (Spark hands naive local datetimes to Python).

        >>> from pyspark.sql import Row
        >>> t = datetime(2024, 1, 1, tzinfo=timezone.utc)
        >>> row = Row(user_id="u", session_start=t, session_end=t, event_count=1,
        ...           events=["/home"], closed_by="timeout")
        >>> Session.from_row(row).events
        ('/home',)
        """
        return cls(
            user_id=row[key],
            session_start=_to_utc(row["session_start"]),
            session_end=_to_utc(row["session_end"]),
            event_count=int(row["event_count"]),
            events=tuple(row["events"]),
            closed_by=row["closed_by"],
        )


def _to_utc(value: datetime) -> datetime:
    # A naive datetime from Spark is local time; .timestamp() reads it as such.
    return datetime.fromtimestamp(value.timestamp(), tz=timezone.utc)


def _iso(t: datetime) -> str:
    t = t.astimezone(timezone.utc)
    return t.strftime("%Y-%m-%dT%H:%M:%S.") + f"{t.microsecond // 1000:03d}Z"


def at_ms(ms: int) -> datetime:
    return _EPOCH + timedelta(milliseconds=ms)


def generate_events(
    events: int = 2000,
    users: int = 50,
    seed: int = 0,
    *,
    gap: Duration = "1 minute",
    last_share: float = 0.3,
    max_session_events: int = 8,
    start: Instant = DEFAULT_START,
) -> list[Event]:
    """``events`` clicks of ``users`` users, sorted by ``event_time`` (then ``user_id``).

    ``gap`` is the session gap the data is shaped for; ``last_share`` the share of sessions
    that end with an ``is_last`` event; sessions have 1 to ``max_session_events`` events.
    Users start at random offsets within ``10 * gap`` of ``start``.

    >>> [e.user_id for e in generate_events(4, users=2, seed=1)]
    ['user-000', 'user-000', 'user-001', 'user-001']
    """
    if events < 0 or users < 1:
        raise ConfigError(f"generate_events: expected events >= 0 and users >= 1, got events={events}, users={users}")
    if not 0.0 <= last_share <= 1.0:
        raise ConfigError(f"generate_events: last_share is a share between 0 and 1, got {last_share!r}")
    if max_session_events < 1:
        raise ConfigError(f"generate_events: max_session_events must be >= 1, got {max_session_events!r}")
    gap_ms = positive_ms(gap, "generate_events: gap")
    start_ms = instant_ms(start, "generate_events: start")
    rng = random.Random(seed)
    small = max(1, gap_ms // 20)
    out: list[tuple[int, str, str, bool]] = []
    width = max(3, len(str(users - 1)))
    for u in range(users):
        user = f"user-{u:0{width}d}"
        quota = events // users + (1 if u < events % users else 0)
        t = start_ms + rng.randrange(0, 10 * gap_ms)
        while quota > 0:
            size = min(quota, rng.randint(1, max_session_events))
            ends_with_last = rng.random() < last_share
            for i in range(size):
                if i:
                    t += rng.randint(small, gap_ms * 9 // 10)  # inside a session: within the gap
                out.append((t, user, rng.choice(_PAGES), ends_with_last and i == size - 1))
            quota -= size
            if ends_with_last:  # the next session may start any time after an is_last event
                t += rng.randint(small, 3 * gap_ms)
            else:  # a pause longer than the gap ends the session
                t += rng.randint(gap_ms * 3 // 2, 5 * gap_ms)
    out.sort(key=lambda r: (r[0], r[1]))
    return [Event(user, at_ms(ms), data, last) for ms, user, data, last in out]


def write_events(events: Sequence[Event], directory: str | os.PathLike, files: int = 10) -> list[Path]:
    """Write ``events`` as JSON lines into ``files`` files in ``directory`` (created if needed).

    Events are split in their order into consecutive, nearly equal parts, one file each
    (``part-00000.json``, ...). A file stream with ``maxFilesPerTrigger=1`` reads one file per
    micro-batch, in that order: file modification times increase by one second per file, and
    each file appears atomically (written under a hidden name, then renamed). Existing files
    are never overwritten.

    >>> import tempfile
    >>> d = tempfile.mkdtemp()
    >>> paths = write_events(generate_events(10, users=2), d, files=3)
    >>> [p.name for p in paths], [len(p.read_text().splitlines()) for p in paths]
    (['part-00000.json', 'part-00001.json', 'part-00002.json'], [4, 3, 3])
    """
    return write_lines_in_order([e.to_json() for e in events], directory, files, "write_events")


def write_lines_in_order(lines: list[str], directory: str | os.PathLike, files: int, who: str) -> list[Path]:
    """Split ``lines`` over ``files`` new files ``part-NNNNN.json`` that a file stream reads in order.

    Each file is written under a hidden name and renamed (a stream never sees half a file), and
    modification times go up a second per file. Existing files are never overwritten.
    """
    if files < 1:
        raise ConfigError(f"{who}: files must be >= 1, got {files!r}")
    target = Path(directory)
    target.mkdir(parents=True, exist_ok=True)
    names = [target / f"part-{i:05d}.json" for i in range(files)]
    clash = [p.name for p in names if p.exists()]
    if clash:
        raise ConfigError(
            f"{who}: {target} already holds {', '.join(clash[:3])}{' ...' if len(clash) > 3 else ''};"
            " write into an empty directory (a file stream would skip files it has already read)"
        )
    base = int(time.time()) - files
    per, extra = divmod(len(lines), files)
    pos = 0
    for i, path in enumerate(names):
        n = per + (1 if i < extra else 0)
        chunk = lines[pos: pos + n]
        pos += n
        tmp = target / f".{path.name}.tmp"
        tmp.write_text("".join(line + "\n" for line in chunk), encoding="utf-8")
        os.utime(tmp, (base + i, base + i))
        tmp.rename(path)
    return names


def read_events(paths: Iterable[str | os.PathLike]) -> list[Event]:
    """Read events written by :func:`write_events` back (in file order).

    >>> import tempfile
    >>> events = generate_events(5, users=2)
    >>> read_events(write_events(events, tempfile.mkdtemp(), files=2)) == events
    True
    """
    out = []
    for path in paths:
        for line in Path(path).read_text(encoding="utf-8").splitlines():
            rec = json.loads(line)
            when = datetime.strptime(rec["event_time"], "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=timezone.utc)
            out.append(Event(rec["user_id"], when, rec["data"], bool(rec["is_last"])))
    return out


__all__ = ["DEFAULT_START", "EVENT_SCHEMA", "ClosedBy", "Event", "Session", "generate_events", "read_events",
           "write_events", "write_lines_in_order"]
