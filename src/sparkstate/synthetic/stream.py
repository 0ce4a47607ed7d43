"""The synthetic clickstream as an endless, seeded stream of raw JSON lines (late and malformed ones too).

An endless sequence of *rounds*, each one :func:`~sparkstate.synthetic.generator.generate_events`
call of ``8 * users`` events on its own derived seed, the rounds far enough apart in event time
that no session spans two. Some records are made late (``event_time`` moved ``late_by`` back) or
malformed (broken JSON, a missing or null ``user_id``, a wrong type); record ``i`` depends only
on the configuration and ``i``, so any slice can be computed on its own (Spark's generator
source computes each partition so).

>>> cfg = StreamConfig(users=3, seed=7, malformed_share=0.2, events=40)
>>> records = stream_records(cfg)
>>> records == stream_records(cfg) and stream_records(cfg, 10, 20) == records[10:20]
True
>>> sorted({r.kind for r in records})
['broken_json', 'missing_key', 'null_key', 'ok', 'wrong_type']

With ``cycle="daily"`` a round holds only the users active at its time of day (a share of
``users`` between ``trough`` at 04:00 UTC and all of them at 16:00), so rounds differ in size;
with ``churn=N`` the population moves on by ``N`` users a day (day ``d``'s users are
``d * N`` to ``d * N + users - 1``), so months of event time meet many more users than are
ever active at once. Record ``i`` is still a function of the configuration and ``i`` alone.

>>> day = StreamConfig(users=100, seed=7, cycle="daily", trough=0.1, churn=10, events=20_000)
>>> [len(active_users(day, r)) for r in (0, 5, 10, 15, 20, 25)]  # rounds at 0:23, 4:18, 8:13, ... UTC
[29, 10, 35, 79, 100, 78]
>>> stream_records(day, 12_000, 12_010) == stream_records(day)[12_000:12_010]
True
"""


from __future__ import annotations

import bisect
import hashlib
import json
import math
import random
import threading
from dataclasses import asdict, dataclass, fields, replace
from datetime import datetime, timedelta
from typing import Any, Iterable, Iterator, Literal, Mapping

from ..durations import Duration, Instant, instant_ms, positive_ms
from ..errors import ConfigError
from .generator import DEFAULT_START, Event, generate_events
from .line_server import LineServer, serve_lines

RecordKind = Literal["ok", "late", "broken_json", "missing_key", "null_key", "wrong_type"]
#: The kinds of malformed records, in the order the generator picks from.
MALFORMED_KINDS: tuple[RecordKind, ...] = ("broken_json", "missing_key", "null_key", "wrong_type")
#: Events per user in one round of the stream (a round is one :func:`generate_events` call).
ROUND_EVENTS_PER_USER = 8

# Short names accepted in "generator:rate=500,users=100,..." specs and in source options.
_ALIASES = {
    "last": "last_share",
    "late": "late_share",
    "malformed": "malformed_share",
    "session": "max_session_events",
}
#: Event time in a day, and the hour of the quietest and the busiest moment of the daily cycle (UTC).
DAY_MS = 86_400_000
QUIET_HOUR = 4
CYCLES = ("daily",)


@dataclass(frozen=True)
class StreamConfig:
    """The generator as a stream: who, how fast, how messy, from which seed.

    - ``users``: number of users (``user-000``, ...); ``seed``: same seed, same records.
    - ``rate``: records per second of wall-clock time when Spark reads the stream (``0``: as
      fast as Spark reads; needs ``events``).
    - ``burst``: records offered at once when the query starts, before ``rate`` paces the rest:
      a source far ahead of the job (a replay, a restart after an outage) whose rate then drops.
      Pacing only: record ``i`` is the same whatever ``rate`` and ``burst``.
    - ``events``: total number of records (``None``: endless).
    - sessions: 1 to ``max_session_events`` events (uniform); inside a session, events at most
      ``0.9 * gap`` apart (uniform); between sessions a pause of 1.5 to 5 ``gap`` (uniform),
      or any pause after a session that ends with an ``is_last`` event (``last_share`` of them).
    - ``late_share``: share of records whose ``event_time`` is moved ``late_by`` back (valid
      records, but behind any sensible watermark).
    - ``malformed_share``: share of records that are malformed, evenly: broken JSON, missing
      ``user_id``, null ``user_id``, wrong type (``event_time`` or ``is_last`` not parseable).
    - ``start``: event times begin here (kept as epoch ms).
    - ``cycle``: ``None`` (every user in every round) or ``"daily"``: the share of users active
      in a round follows the time of day, from ``trough`` at 04:00 UTC up to 1 at 16:00 (a
      cosine); which users are active is drawn per round. ``churn``: with a cycle, users that
      leave (and as many new ones that join) per day of event time.

    >>> StreamConfig.from_options({"rate": "500", "users": "10", "late": "0.01"}).late_share
    0.01
    >>> base = StreamConfig(users=3, seed=2, events=40)
    >>> stream_records(replace(base, rate=5, burst=30)) == stream_records(base)  # pacing only
    True
    >>> StreamConfig(users=0)
    Traceback (most recent call last):
    ...
    sparkstate.errors.ConfigError: generator: users must be >= 1, got 0
    """

    users: int = 50
    seed: int = 0
    rate: float = 100.0
    events: int | None = None
    burst: int = 0
    gap: Duration = "1 minute"
    last_share: float = 0.3
    max_session_events: int = 8
    late_share: float = 0.0
    late_by: Duration = "1 hour"
    malformed_share: float = 0.0
    start: Instant = DEFAULT_START
    cycle: str | None = None
    trough: float = 0.1
    churn: int = 0

    def __post_init__(self) -> None:
        def fail(msg: str) -> None:
            raise ConfigError(f"generator: {msg}")

        if not isinstance(self.users, int) or self.users < 1:
            fail(f"users must be >= 1, got {self.users!r}")
        if not isinstance(self.seed, int):
            fail(f"seed must be a whole number, got {self.seed!r}")
        if not isinstance(self.rate, (int, float)) or self.rate < 0:
            fail(f"rate is records per second and must be >= 0, got {self.rate!r}")
        if self.events is not None and (not isinstance(self.events, int) or self.events < 0):
            fail(f"events must be >= 0 (or None for an endless stream), got {self.events!r}")
        if self.rate == 0 and self.events is None:
            fail("rate=0 (as fast as Spark reads) needs a total: pass events=N, or a rate > 0")
        if not isinstance(self.burst, int) or self.burst < 0:
            fail(f"burst is records offered at the start and must be >= 0, got {self.burst!r}")
        for name in ("last_share", "late_share", "malformed_share"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or not 0.0 <= v <= 1.0:
                fail(f"{name} is a share between 0 and 1, got {v!r}")
        if self.late_share + self.malformed_share > 1.0:
            fail(f"late_share + malformed_share must be <= 1, got {self.late_share} + {self.malformed_share}")
        if not isinstance(self.max_session_events, int) or self.max_session_events < 1:
            fail(f"max_session_events must be >= 1, got {self.max_session_events!r}")
        if self.cycle is not None and self.cycle not in CYCLES:
            fail(f"cycle must be one of {', '.join(CYCLES)} (or unset), got {self.cycle!r}")
        if not isinstance(self.trough, (int, float)) or not 0.0 < self.trough <= 1.0:
            fail(f"trough is the share of users active at the quietest hour, above 0 and at most 1,"
                 f" got {self.trough!r}")
        if not isinstance(self.churn, int) or self.churn < 0:
            fail(f"churn is users replaced per day and must be >= 0, got {self.churn!r}")
        if self.churn and self.cycle is None:
            fail("churn applies to a cycle: pass cycle=daily with it")
        try:
            positive_ms(self.gap, "gap")
            positive_ms(self.late_by, "late_by")
            start_ms = instant_ms(self.start, "start")
        except ValueError as exc:
            fail(str(exc))
        object.__setattr__(self, "start", start_ms)  # one form (epoch ms), so equal configs compare equal

    @property
    def gap_ms(self) -> int:
        return positive_ms(self.gap)

    @property
    def round_size(self) -> int:
        """Records per round (``ROUND_EVENTS_PER_USER * users``; with a ``cycle``, the most a round holds)."""
        return ROUND_EVENTS_PER_USER * self.users

    @property
    def round_span_ms(self) -> int:
        """Event time from one round's start to the next: every user's last event of a round is
        more than ``2 * gap`` before the next round begins, so no session spans two rounds."""
        return (12 + 5 * (ROUND_EVENTS_PER_USER - 1)) * self.gap_ms

    @classmethod
    def keys(cls) -> list[str]:
        """The option names :meth:`from_options` accepts (field names and short aliases)."""
        return [f.name for f in fields(cls)] + sorted(_ALIASES)

    @classmethod
    def from_options(cls, options: Mapping[str, Any], base: "StreamConfig | None" = None) -> "StreamConfig":
        """Build from string options (``"rate": "500"``, ``"late": "0.01"``, ...) over ``base``.

        Keys (case-insensitive) not in :meth:`keys` raise :class:`~sparkstate.errors.ConfigError`.

        >>> StreamConfig.from_options({"seed": "7", "events": "100", "gap": "30 seconds"}).gap
        '30 seconds'
        """
        known = {f.name.lower(): f.name for f in fields(cls)}  # Spark hands options lower-cased
        values: dict[str, Any] = {}
        for raw_key, raw_value in options.items():
            low = str(raw_key).lower()
            key = known.get(_ALIASES.get(low, low))
            if key is None:
                raise ConfigError(
                    f"generator: unknown option {raw_key!r}; accepted: {', '.join(cls.keys())}"
                )
            values[key] = _convert(key, raw_value)
        return replace(base or cls(), **values)

    def to_options(self) -> dict[str, str]:
        """The configuration as string options (what Spark's data source options carry).

        >>> cfg = StreamConfig(users=3, seed=1, events=10)
        >>> StreamConfig.from_options(cfg.to_options()) == cfg
        True
        """
        out = {}
        for k, v in asdict(self).items():
            if v is None:
                continue
            out[k] = str(v)
        return out


def _convert(key: str, value: Any) -> Any:
    if not isinstance(value, str):
        return value
    text = value.strip()
    try:
        if key in ("users", "seed", "max_session_events", "churn", "burst"):
            return int(text)
        if key == "cycle":
            return None if text.lower() in ("", "none", "off") else text.lower()
        if key == "events":
            return None if text.lower() in ("", "none", "inf", "endless") else int(text)
        if key in ("rate", "last_share", "late_share", "malformed_share", "trough"):
            return float(text)
        if key == "start":
            return int(text) if text.lstrip("-").isdigit() else datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ConfigError(f"generator: option {key} expects a number, got {value!r}") from None
    return text if not text.lstrip("-").isdigit() else int(text)  # durations: "1 minute" or ms


@dataclass(frozen=True)
class Record:
    """One record of the generator stream: its position, what kind it is, and the raw line.

    ``event`` is the event the record carries (for ``"late"`` with its moved ``event_time``);
    for a malformed kind it is the event the record was made from, which a reader never sees.
    """

    index: int
    kind: RecordKind
    line: str
    event: Event

    @property
    def is_valid(self) -> bool:
        """True for ``"ok"`` and ``"late"`` records (a parser accepts them)."""
        return self.kind in ("ok", "late")


def _derived_seed(seed: int, *parts: Any) -> int:
    text = "/".join(str(p) for p in (seed, *parts))
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big")


def _malformed_line(event: Event, kind: RecordKind, rng: random.Random) -> str:
    rec: dict[str, Any] = json.loads(event.to_json())
    if kind == "broken_json":
        line = event.to_json()
        return line[: rng.randint(1, len(line) - 2)]  # cut short: never a complete object
    if kind == "missing_key":
        del rec["user_id"]
    elif kind == "null_key":
        rec["user_id"] = None
    elif rng.random() < 0.5:  # wrong_type
        rec["event_time"] = "not a time"
    else:
        rec["is_last"] = "maybe"
    return json.dumps(rec)


def active_share(config: StreamConfig, t_ms: int) -> float:
    """The share of ``config.users`` active at event time ``t_ms`` (1 without a cycle).

    >>> cfg = StreamConfig(cycle="daily", trough=0.2)
    >>> [round(active_share(cfg, h * 3_600_000), 2) for h in (4, 10, 16, 22)]
    [0.2, 0.6, 1.0, 0.6]
    """
    if config.cycle is None:
        return 1.0
    hour = (t_ms % DAY_MS) / 3_600_000
    return config.trough + (1.0 - config.trough) * (1.0 - math.cos(2 * math.pi * (hour - QUIET_HOUR) / 24)) / 2


def active_users(config: StreamConfig, r: int) -> list[int]:
    """The numbers of the users active in round ``r`` (all of ``range(users)`` without a cycle).

    With a cycle: ``round(users * share)`` (at least one) of the day's population, the share at
    the round's middle, drawn on the round's own seed; the population of day ``d`` (counted from
    ``start``) is ``d * churn`` to ``d * churn + users - 1``.
    """
    if config.cycle is None:
        return list(range(config.users))
    begin = instant_ms(config.start) + r * config.round_span_ms
    mid = begin + config.round_span_ms // 2
    n = max(1, min(config.users, round(config.users * active_share(config, mid))))
    first = ((mid - instant_ms(config.start)) // DAY_MS) * config.churn
    rng = random.Random(_derived_seed(config.seed, "active", r))
    return sorted(first + u for u in rng.sample(range(config.users), n))


def user_name(config: StreamConfig, u: int) -> str:
    """The ``user_id`` of user number ``u`` (``user-007``; with a cycle, five digits at least)."""
    width = max(5 if config.cycle is not None else 3, len(str(config.users - 1)))
    return f"user-{u:0{width}d}"


_offsets: dict[StreamConfig, list[int]] = {}
_offsets_lock = threading.Lock()


def _round_offsets(config: StreamConfig, *, index: int = -1, rounds: int = 0) -> list[int]:
    """First record index of rounds 0, 1, ... of a cycle, far enough to cover record ``index``
    and ``rounds`` rounds (plus the end of the last one)."""
    with _offsets_lock:
        offs = _offsets.pop(config, None) or [0]
        while offs[-1] <= index or len(offs) <= rounds:
            offs.append(offs[-1] + ROUND_EVENTS_PER_USER * len(active_users(config, len(offs) - 1)))
        _offsets[config] = offs  # the most recently used last; a few configurations per process at most
        while len(_offsets) > 16:
            del _offsets[next(iter(_offsets))]
        return offs


def _round_at(config: StreamConfig, i: int) -> tuple[int, int, int]:
    """``(round, its first record index, its size)`` of the round holding record ``i``."""
    if config.cycle is None:
        size = config.round_size
        return i // size, (i // size) * size, size
    offs = _round_offsets(config, index=i)
    r = bisect.bisect_right(offs, i) - 1
    return r, offs[r], offs[r + 1] - offs[r]


#: Rounds kept per process, by their records: a reader needs the round its slice starts in and
#: at most the next one, and a round of ``users`` holds 8 x ``users`` records of ~0.5 KB each, so
#: a count of rounds would not bound the memory (16 rounds of 50,000 users held 3 GB per worker).
_ROUNDS_KEPT_RECORDS = 250_000
_rounds: dict[tuple[StreamConfig, int], tuple[Record, ...]] = {}
_rounds_lock = threading.Lock()


def _round(config: StreamConfig, r: int) -> tuple[Record, ...]:
    """The records of round ``r``, from a small cache: the two most recently used rounds, and
    older ones while the cache holds at most :data:`_ROUNDS_KEPT_RECORDS` records."""
    key = (config, r)
    with _rounds_lock:
        block = _rounds.pop(key, None)
    if block is None:
        block = _make_round(config, r)
    with _rounds_lock:
        _rounds[key] = block  # the most recently used last
        held = sum(map(len, _rounds.values()))
        while len(_rounds) > 2 and held > _ROUNDS_KEPT_RECORDS:
            held -= len(_rounds.pop(next(iter(_rounds))))
    return block


def _make_round(config: StreamConfig, r: int) -> tuple[Record, ...]:
    users = active_users(config, r)
    size = ROUND_EVENTS_PER_USER * len(users)
    first = r * size if config.cycle is None else _round_offsets(config, rounds=r + 1)[r]
    events = generate_events(
        size,
        users=len(users),
        seed=_derived_seed(config.seed, "round", r),
        gap=config.gap,
        last_share=config.last_share,
        max_session_events=config.max_session_events,
        start=instant_ms(config.start) + r * config.round_span_ms,
    )
    if config.cycle is not None:  # generate_events names them user-000, ...: the active users' names
        width = max(3, len(str(len(users) - 1)))
        names = {f"user-{j:0{width}d}": user_name(config, u) for j, u in enumerate(users)}
        events = sorted((replace(e, user_id=names[e.user_id]) for e in events),
                        key=lambda e: (e.event_time, e.user_id))
    rng = random.Random(_derived_seed(config.seed, "noise", r))
    late_by = timedelta(milliseconds=positive_ms(config.late_by))
    out = []
    for i, event in enumerate(events):
        x = rng.random()
        if x < config.malformed_share:
            kind = MALFORMED_KINDS[rng.randrange(len(MALFORMED_KINDS))]
            out.append(Record(first + i, kind, _malformed_line(event, kind, rng), event))
        elif x < config.malformed_share + config.late_share:
            late = replace(event, event_time=event.event_time - late_by)
            out.append(Record(first + i, "late", late.to_json(), late))
        else:
            out.append(Record(first + i, "ok", event.to_json(), event))
    return tuple(out)


def iter_records(config: StreamConfig, start: int = 0) -> Iterator[Record]:
    """The generator's records from index ``start`` on, up to ``config.events`` (or endlessly).

    >>> [r.index for r in iter_records(StreamConfig(users=1, events=12), start=9)]
    [9, 10, 11]
    """
    i = max(0, start)
    while config.events is None or i < config.events:
        r, first, size = _round_at(config, i)
        block = _round(config, r)
        stop = size if config.events is None else min(size, config.events - first)
        for rec in block[i - first: stop]:
            yield rec
        i = first + stop


def stream_records(config: StreamConfig, start: int = 0, stop: int | None = None) -> list[Record]:
    """Records ``start`` to ``stop`` (exclusive; default ``config.events``) of the stream.

    The ground truth for a query on the generator source: the records Spark reads between two
    offsets are exactly ``stream_records(config, start, stop)``.

    >>> recs = stream_records(StreamConfig(users=2, seed=3, events=20, late_share=0.5))
    >>> len(recs), {r.kind for r in recs} == {"ok", "late"}
    (20, True)
    """
    end = config.events if stop is None else stop
    if end is None:
        raise ConfigError("stream_records: the stream is endless (events=None); pass stop=N")
    if config.events is not None:
        end = min(end, config.events)
    out: list[Record] = []
    it = iter_records(config, start)
    for rec in it:
        if rec.index >= end:
            break
        out.append(rec)
    return out


def serve_events(
    events: Iterable[Event | Record | str] | StreamConfig,
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    rate: float | None = None,
    hold: bool = True,
) -> LineServer:
    """Serve events as JSON lines on a TCP socket, for ``socket:HOST:PORT`` sources.

    ``events`` is a sequence of :class:`Event` s, :class:`Record` s (their raw line, malformed
    ones included) or ready lines, or a :class:`StreamConfig` (the generator stream, paced at
    its ``rate`` unless ``rate`` is given). Every client gets every line from the first. Binds
    to localhost unless ``host`` says otherwise; ``port=0`` picks a free port. Returns the
    running :class:`~sparkstate.synthetic.line_server.LineServer` (a context manager; ``.port``).

    >>> import socket
    >>> with serve_events(generate_events(3, users=1), hold=False) as server:
    ...     with socket.create_connection(("127.0.0.1", server.port), timeout=5) as conn:
    ...         len(conn.makefile().read().splitlines())
    3
    """
    if isinstance(events, StreamConfig):
        config = events
        pace = rate if rate is not None else (config.rate or None)
        return serve_lines(lambda: (r.line for r in iter_records(config)), host, port, rate=pace, hold=hold)
    lines = [e.line if isinstance(e, Record) else e.to_json() if isinstance(e, Event) else str(e) for e in events]
    return serve_lines(lines, host, port, rate=rate, hold=hold)
