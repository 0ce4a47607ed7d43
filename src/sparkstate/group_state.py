"""The per-key state handles a user's function gets: :class:`GroupState` (``map_groups_with_state``
and the operators on it), :class:`State` (``map_with_state``), and :class:`GroupStateTimeout`.

What the engines and the harness do with a handle after a call (keep, write or delete a key's
row; which keys time out, and when) is :mod:`sparkstate.engines.rules`.

>>> s = GroupState(GroupStateTimeout.ProcessingTimeTimeout, batch_time_ms=1_000)
>>> s.exists
False
>>> s.update(3); s.setTimeoutDuration("1 minute")
>>> s.get, s.timeout_ms
(3, 61000)
"""

from __future__ import annotations

import enum
from typing import Any, Callable, Iterator

from .durations import Duration, Instant, instant_ms, positive_ms, to_ms, utc
from .errors import ConfigError, StateNotFoundError, TimeoutConfigError


class GroupStateTimeout(str, enum.Enum):
    """How keys of a query time out. Compares equal to the plain strings PySpark uses."""

    NoTimeout = "NoTimeout"
    ProcessingTimeTimeout = "ProcessingTimeTimeout"
    EventTimeTimeout = "EventTimeTimeout"

    def __str__(self) -> str:
        return self.value

    @classmethod
    def parse(cls, value: Any) -> "GroupStateTimeout":
        if isinstance(value, cls):
            return value
        if value is None:
            return cls.NoTimeout
        for member in cls:
            if isinstance(value, str) and value.lower() == member.value.lower():
                return member
        raise TimeoutConfigError(
            f"timeout: expected one of {', '.join(m.value for m in cls)} (ss.GroupStateTimeout.…), got {value!r}"
        )


NO_WATERMARK = -1


class StateArgumentError(ConfigError):
    """A bad argument to a state method, or a bad timeout in a ``StateUpdate``: a
    :class:`~sparkstate.ConfigError` (so a ``ValueError``), told apart from the user's own errors
    so that :func:`sparkstate.engines.rules.run_call` passes it on (naming the key) instead of wrapping it."""


#: Why a timeout cannot be set now (:func:`timeout_refusal`).
NO_TIMEOUT, NOT_AFTER_PROCESSING_TIME, BEFORE_WATERMARK = "no timeout", "not after processing time", "before watermark"


def timeout_refusal(conf: "GroupStateTimeout", timeout_ms: int, processing_ms: int, watermark_ms: int) -> str | None:
    """The one rule for a timeout a user's function sets (``GroupState``'s setters and a
    ``StateUpdate``'s ``timeout_ms`` alike): ``None`` when it may be set, else why not.

    A query without timeouts takes none; a processing-time timeout must be later than the batch's
    processing time; an event-time one may not be earlier than the watermark (``NO_WATERMARK``:
    none yet). Each API words the refusal for its own call.

    >>> timeout_refusal(GroupStateTimeout.EventTimeTimeout, 5, 0, 10)
    'before watermark'
    >>> timeout_refusal(GroupStateTimeout.ProcessingTimeTimeout, 1_001, 1_000, NO_WATERMARK) is None
    True
    """
    if conf is GroupStateTimeout.NoTimeout:
        return NO_TIMEOUT
    if conf is GroupStateTimeout.ProcessingTimeTimeout and timeout_ms <= processing_ms:
        return NOT_AFTER_PROCESSING_TIME
    if conf is GroupStateTimeout.EventTimeTimeout and watermark_ms != NO_WATERMARK and timeout_ms < watermark_ms:
        return BEFORE_WATERMARK
    return None


def _checked(convert: Callable[..., int], *args: Any) -> int:
    try:
        return convert(*args)
    except ValueError as exc:
        raise StateArgumentError(str(exc)) from None


class GroupState:
    """The ``state`` argument of a ``map_groups_with_state`` function, for one key and one call.

    Names follow ``pyspark.sql.streaming.state.GroupState`` (properties ``exists``, ``get``,
    ``getOption``, ``hasTimedOut``; methods for the rest), so functions written for
    ``applyInPandasWithState`` port unchanged.
    """

    __slots__ = (
        "_conf", "_value", "_exists", "_timed_out", "_batch_ms", "_watermark_ms", "_has_watermark",
        "_timeout_ms", "_updated", "_removed", "_timeout_set",
    )

    def __init__(
        self,
        timeout_conf: GroupStateTimeout = GroupStateTimeout.NoTimeout,
        *,
        value: Any = None,
        exists: bool = False,
        has_timed_out: bool = False,
        batch_time_ms: int = 0,
        watermark_ms: int = NO_WATERMARK,
        has_watermark: bool = False,
    ) -> None:
        self._conf = timeout_conf
        self._value = value
        self._exists = exists
        self._timed_out = has_timed_out
        self._batch_ms = batch_time_ms
        self._watermark_ms = watermark_ms
        self._has_watermark = has_watermark
        # As in Spark, the timeout is reset at every call: the function sets it again or it is gone.
        self._timeout_ms: int | None = None
        self._updated = False
        self._removed = False
        self._timeout_set = False

    # -- reading ------------------------------------------------------------------------------
    @property
    def exists(self) -> bool:
        """Whether state exists for this key."""
        return self._exists

    @property
    def get(self) -> Any:
        """The state value; raises :class:`StateNotFoundError` when there is none."""
        if not self._exists:
            raise StateNotFoundError(
                "state.get: this key has no state. Check state.exists first, or use state.getOption"
                " (None when there is no state)."
            )
        return self._value

    @property
    def getOption(self) -> Any:
        """The state value, or ``None`` when there is none."""
        return self._value if self._exists else None

    @property
    def hasTimedOut(self) -> bool:
        """``True`` only inside a call made because this key's timeout fired."""
        return self._timed_out

    # -- writing ------------------------------------------------------------------------------
    def update(self, value: Any) -> None:
        """Set the state. ``None`` is not a state: use :meth:`remove`."""
        if value is None:
            raise StateArgumentError("state.update(None): None cannot be stored as state; call state.remove() instead.")
        self._value = value
        self._exists = True
        self._updated = True
        self._removed = False

    def remove(self) -> None:
        """Remove the state of this key, and its timeout."""
        self._value = None
        self._exists = False
        self._removed = True
        self._updated = False
        self._timeout_ms = None
        self._timeout_set = False

    def setTimeoutDuration(self, duration: Duration) -> None:
        """Time this key out ``duration`` after the current batch's processing time.

        ``duration``: milliseconds, a ``timedelta`` or a string such as ``"1 minute"``.
        Only with ``GroupStateTimeout.ProcessingTimeTimeout``.
        """
        if self._conf is not GroupStateTimeout.ProcessingTimeTimeout:
            raise TimeoutConfigError(
                f"state.setTimeoutDuration needs timeout=GroupStateTimeout.ProcessingTimeTimeout, but this query"
                f" uses {self._conf.value}. Pass timeout=ss.GroupStateTimeout.ProcessingTimeTimeout to the"
                f" operator{', or use state.setTimeoutTimestamp for event time' if self._conf is GroupStateTimeout.EventTimeTimeout else ''}."
            )
        ms = _checked(positive_ms, duration, "state.setTimeoutDuration")
        self._timeout_ms = self._batch_ms + ms
        self._timeout_set = True

    def setTimeoutTimestamp(self, timestamp: Instant, additional: Duration | None = None) -> None:
        """Time this key out when the watermark passes ``timestamp`` (+ ``additional``).

        ``timestamp``: epoch ms or a ``datetime``. Only with ``GroupStateTimeout.EventTimeTimeout``.
        A timestamp earlier than the current watermark raises ``ValueError``.
        """
        if self._conf is not GroupStateTimeout.EventTimeTimeout:
            raise TimeoutConfigError(
                f"state.setTimeoutTimestamp needs timeout=GroupStateTimeout.EventTimeTimeout, but this query"
                f" uses {self._conf.value}. Pass timeout=ss.GroupStateTimeout.EventTimeTimeout (and define a"
                f" watermark with withWatermark){', or use state.setTimeoutDuration for processing time' if self._conf is GroupStateTimeout.ProcessingTimeTimeout else ''}."
            )
        ms = _checked(instant_ms, timestamp, "state.setTimeoutTimestamp")
        if additional is not None:
            extra = _checked(to_ms, additional, "state.setTimeoutTimestamp(additional=…)")
            if extra < 0:
                raise StateArgumentError(
                    f"state.setTimeoutTimestamp(additional=…): expected a duration of 0 or more, got {additional!r}"
                )
            ms += extra
        if timeout_refusal(self._conf, ms, self._batch_ms, self._watermark_ms) == BEFORE_WATERMARK:
            raise StateArgumentError(
                f"Timeout timestamp ({ms}, {utc(ms):%Y-%m-%d %H:%M:%S.%f} UTC) cannot be earlier than the current"
                f" watermark ({self._watermark_ms}, {utc(self._watermark_ms):%Y-%m-%d %H:%M:%S.%f} UTC)."
                " Base the timeout on the watermark, e.g."
                " state.setTimeoutTimestamp(state.getCurrentWatermarkMs() + gap_ms)."
            )
        self._timeout_ms = ms
        self._timeout_set = True

    # -- time ---------------------------------------------------------------------------------
    def getCurrentWatermarkMs(self) -> int:
        """The event-time watermark of this batch, in epoch ms."""
        if not self._has_watermark:
            raise TimeoutConfigError(
                "state.getCurrentWatermarkMs: the query defines no watermark. Call"
                " df.withWatermark(\"event_time\", \"10 seconds\") before the operator."
            )
        return self._watermark_ms

    def getCurrentProcessingTimeMs(self) -> int:
        """The processing time of this batch, in epoch ms."""
        return self._batch_ms

    # -- for the runners (sparkstate.engines.rules) ---------------------------------------------
    @property
    def timeout_conf(self) -> GroupStateTimeout:
        """The query's timeout kind (what ``setTimeoutDuration`` / ``setTimeoutTimestamp`` need)."""
        return self._conf

    @property
    def timeout_ms(self) -> int | None:
        """The timeout set during this call (epoch ms), or ``None``."""
        return self._timeout_ms

    @property
    def changes(self) -> tuple[bool, bool, bool]:
        """What this call did to the handle: (state set, state removed, a timeout set)."""
        return self._updated, self._removed, self._timeout_set

    def begin_call(self, value: Any, exists: bool, timed_out: bool) -> "GroupState":
        """Make this handle the one of another key of the same batch (its clocks and timeout mode
        stay): what a fresh ``GroupState`` for that key would be, without building one per key.
        A handle is valid during its call only, as in Spark."""
        self._value = value
        self._exists = exists
        self._timed_out = timed_out
        self._timeout_ms = None
        self._updated = False
        self._removed = False
        self._timeout_set = False
        return self

    def __repr__(self) -> str:
        shown = repr(self._value) if self._exists else "<none>"
        return f"GroupState({shown}, timeout_ms={self._timeout_ms}, hasTimedOut={self._timed_out})"


class State:
    """The ``state`` argument of a ``map_with_state`` function (DStream names: methods only)."""

    __slots__ = ("_g", "_timing_out")

    def __init__(self, group_state: GroupState, timing_out: bool = False) -> None:
        self._g = group_state
        self._timing_out = timing_out

    def exists(self) -> bool:
        """Whether state exists for this key."""
        return self._g.exists

    def get(self) -> Any:
        """The state; raises :class:`StateNotFoundError` when there is none."""
        return self._g.get

    def getOption(self) -> Any:
        """The state, or ``None``."""
        return self._g.getOption

    def update(self, value: Any) -> None:
        """Set the state. Not allowed while the key is timing out (it is removed after the call)."""
        if self._timing_out:
            raise TimeoutConfigError(
                "state.update: this key is timing out and its state is removed after this call;"
                " it cannot be updated. Return the final output instead."
            )
        self._g.update(value)

    def remove(self) -> None:
        """Remove the state of this key."""
        self._g.remove()

    def isTimingOut(self) -> bool:
        """Whether this call is the last one for a key that timed out (``value`` is ``None``)."""
        return self._timing_out

    def __repr__(self) -> str:
        return f"State({self._g.getOption!r}, timingOut={self._timing_out})"


GroupFunc = Callable[[Any, Iterator[Any], GroupState], Any]
