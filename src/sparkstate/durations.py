"""Durations and instants at the public boundary, turned into milliseconds in one place.

>>> to_ms("1 minute"), to_ms("30 seconds"), to_ms(1500)
(60000, 30000, 1500)
>>> from datetime import timedelta
>>> to_ms(timedelta(seconds=2))
2000
"""

from __future__ import annotations

import re
from datetime import date, datetime, timedelta, timezone
from typing import Union

Duration = Union[int, timedelta, str]
Instant = Union[int, datetime]

_UNITS_MS = {
    "ms": 1, "millisecond": 1, "milli": 1,
    "s": 1000, "sec": 1000, "second": 1000,
    "m": 60_000, "min": 60_000, "minute": 60_000,
    "h": 3_600_000, "hour": 3_600_000,
    "d": 86_400_000, "day": 86_400_000,
    "w": 604_800_000, "week": 604_800_000,
}
_PART = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]+)\s*")


def _unit_ms(unit: str) -> int | None:
    u = unit.lower()
    if u.startswith("interval"):
        return None
    if u in _UNITS_MS:
        return _UNITS_MS[u]
    if u.endswith("s") and u[:-1] in _UNITS_MS:
        return _UNITS_MS[u[:-1]]
    return None


def _parse(text: str, what: str) -> int:
    body = text.strip()
    if body.lower().startswith("interval"):
        body = body[len("interval"):]
    total = 0.0
    pos = 0
    matched = False
    while pos < len(body):
        m = _PART.match(body, pos)
        unit = _unit_ms(m.group(2)) if m else None
        if not m or unit is None:
            raise ValueError(
                f"{what}: expected a duration such as '1 minute', '30 seconds' or '1 hour 30 minutes',"
                f" got {text!r}"
            )
        total += float(m.group(1)) * unit
        pos = m.end()
        matched = True
    if not matched:
        raise ValueError(f"{what}: expected a duration such as '1 minute', got an empty string")
    return int(round(total))


def to_ms(value: Duration, what: str = "duration") -> int:
    """Turn ``value`` (ms ``int``, ``timedelta`` or an interval string) into milliseconds.

    >>> to_ms("1 hour 30 minutes")
    5400000
    """
    if isinstance(value, bool):
        raise ValueError(f"{what}: expected milliseconds, a timedelta or a string like '1 minute', got a bool")
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, timedelta):
        return int(round(value.total_seconds() * 1000))
    if isinstance(value, str):
        return _parse(value, what)
    raise ValueError(
        f"{what}: expected milliseconds (int), a timedelta or a string like '1 minute',"
        f" got {type(value).__name__} {value!r}"
    )


def positive_ms(value: Duration, what: str = "duration") -> int:
    """Like :func:`to_ms`, but zero and negative durations raise ``ValueError``.

    >>> positive_ms("2 seconds")
    2000
    """
    ms = to_ms(value, what)
    if ms <= 0:
        raise ValueError(f"{what}: expected a positive duration, got {value!r} ({ms} ms)")
    return ms


def instant_ms(value: Instant, what: str = "timestamp") -> int:
    """Turn an epoch-ms ``int`` or a ``datetime`` (naive = local time, as Spark) into epoch ms.

    >>> instant_ms(datetime(2024, 1, 1, tzinfo=timezone.utc))
    1704067200000
    """
    if isinstance(value, bool):
        raise ValueError(f"{what}: expected epoch milliseconds or a datetime, got a bool")
    if isinstance(value, int):
        return value
    if isinstance(value, datetime):
        return int(round(value.timestamp() * 1000))
    if isinstance(value, date):
        return instant_ms(datetime(value.year, value.month, value.day), what)
    raise ValueError(
        f"{what}: expected epoch milliseconds (int) or a datetime, got {type(value).__name__} {value!r}"
    )


def ms_to_datetime(ms: int) -> datetime:
    """Epoch ms -> naive local ``datetime``, the form Spark hands to Python for timestamps."""
    return datetime.fromtimestamp(ms / 1000)


def utc(ms: int) -> datetime:
    """Epoch ms -> aware UTC datetime (for messages)."""
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc)
