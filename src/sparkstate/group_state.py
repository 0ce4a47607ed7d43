"""The per-key state handle and the rules that decide timeouts, timers and expiry.

This module is the one place where the semantics live: both engines and the no-Spark harness
(:mod:`sparkstate.testing`) run a key through :func:`run_call` and act on the :class:`Outcome`
it returns (``Outcome.delete``: the key's stored row goes), ask :func:`due_keys` which keys time
out and in what order, :func:`timer_for` which transformWithState timer fires a timeout, and
:func:`initial_timeout` what timeout a key loaded from initial state has; so they cannot drift
apart.

>>> s = GroupState(GroupStateTimeout.ProcessingTimeTimeout, batch_time_ms=1_000)
>>> s.exists
False
>>> s.update(3); s.setTimeoutDuration("1 minute")
>>> s.get, s.timeout_ms
(3, 61000)
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, Callable, Container, Iterable, Iterator

from .durations import Duration, Instant, instant_ms, positive_ms, to_ms, utc
from .errors import ConfigError, StateNotFoundError, TimeoutConfigError, UserFunctionError


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
    so that :func:`run_call` passes it on (naming the key) instead of wrapping it."""


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

    # -- for the runners ----------------------------------------------------------------------
    @property
    def timeout_ms(self) -> int | None:
        """The timeout set during this call (epoch ms), or ``None``."""
        return self._timeout_ms

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


@dataclass(frozen=True)
class Outcome:
    """What a call did to a key's state, decided by :func:`run_call`.

    ``write``: the stored row must change (value, existence or timeout).
    ``exists`` / ``value``: the state after the call. ``timeout_ms``: the pending timeout.
    ``delete``: the write removes the key's stored row (no state and no pending timeout left);
    derived from the fields before it, so left out of comparisons.
    """

    outputs: list
    write: bool
    exists: bool
    value: Any
    timeout_ms: int | None
    delete: bool = field(default=False, compare=False)


GroupFunc = Callable[[Any, Iterator[Any], GroupState], Any]


def run_call(
    func: GroupFunc,
    key: Any,
    values: Iterator[Any],
    state: GroupState,
    *,
    flat: bool,
    old_timeout_ms: int | None,
    keep_expired_state: bool,
) -> Outcome:
    """Call ``func`` for one key and decide what happens to its state.

    The rules (docs/api.md, `GroupState`): the timeout is whatever the call set; after a timeout call
    that neither updated the state nor set a new timeout, the state is removed unless
    ``keep_expired_state``.
    """
    try:
        result = func(key, values, state)
        if flat:
            outputs = [] if result is None else list(result)
        else:
            outputs = [] if result is None else [result]
    except Exception as exc:
        raise call_error(func, key, exc) from exc
    verdict = settle(state, old_timeout_ms, keep_expired_state)
    return Outcome(outputs, verdict != KEEP, state._exists, state._value, state._timeout_ms, verdict == DELETE)


#: What :func:`settle` decides for a key's stored row after a call.
KEEP, WRITE, DELETE = 0, 1, 2


def settle(state: GroupState, old_timeout_ms: int | None, keep_expired_state: bool) -> int:
    """After a call: ``KEEP`` (the stored row stays as it is), ``WRITE`` (store ``state``'s value,
    existence and ``timeout_ms``) or ``DELETE`` (no state and no pending timeout left: the row goes).

    The timeout is whatever the call set; after a timeout call that neither updated the state nor
    set a new timeout, the state is removed unless ``keep_expired_state``. The engines' lean loops
    call this directly (no :class:`Outcome` per key); :func:`run_call` wraps it.
    """
    if state._timed_out and not keep_expired_state and not state._updated and not state._timeout_set:
        if state._exists:
            state.remove()
    timeout_ms = state._timeout_ms
    if not (state._updated or state._removed or timeout_ms != old_timeout_ms):
        return KEEP
    return DELETE if not state._exists and timeout_ms is None else WRITE


def call_error(func: GroupFunc, key: Any, exc: Exception) -> Exception:
    """The error to raise (from ``exc``) when ``func`` raised ``exc`` for ``key``."""
    if isinstance(exc, (TimeoutConfigError, StateNotFoundError)):
        # Misuse of the state API: the message is already the sentence the user needs.
        return type(exc)(f"{exc} (key {key!r})")
    if isinstance(exc, StateArgumentError):
        # A bad argument to a state method: the ValueError the contract names, with the key.
        return ValueError(f"{exc} (key {key!r})")
    name = getattr(func, "__name__", func)
    if isinstance(exc, ModuleNotFoundError):
        # An import run inside the function, on a worker that lacks the module.
        return UserFunctionError(
            f"the state function {name!r} raised {type(exc).__name__}: {exc}"
            f" (key {key!r}): the Python workers cannot import {exc.name!r}. Import it at the top of the"
            " function's module (a module that is not installed then travels with the query), install it"
            " on the workers, or ship it with spark-submit --py-files."
        )
    return UserFunctionError(
        f"the state function {name!r} raised {type(exc).__name__}: {exc}"
        f" (key {key!r}). Fix the function and restart the query on the same checkpoint:"
        " the failed batch is processed again."
    )


def reset_state(state: GroupState, value: Any, exists: bool, timed_out: bool) -> GroupState:
    """Make ``state`` the handle of another key of the same batch (its clocks and timeout mode
    stay): what a fresh ``GroupState`` for that key would be, without building one per key.
    A handle is valid during its call only, as in Spark."""
    state._value = value
    state._exists = exists
    state._timed_out = timed_out
    state._timeout_ms = None
    state._updated = False
    state._removed = False
    state._timeout_set = False
    return state


def is_due(timeout_ms: int, now_ms: int) -> bool:
    """Whether a timeout has passed: strictly before the watermark / processing time, as Spark."""
    return timeout_ms < now_ms


def due_keys(pending: Iterable[tuple[Any, int | None, Any]], now_ms: int, with_rows: Container[Any] = ()) -> list:
    """The keys to call with ``hasTimedOut``, in the order they are called.

    ``pending``: ``(key, timeout_ms, item)`` for each stored key (``timeout_ms`` None when it has
    none). Due are the keys whose timeout :func:`is_due` and that have no new rows in the batch
    (``with_rows``: a key with rows is called for its rows instead, and its timeout is unset).
    Returns their ``(key, item)`` pairs, earliest timeout first, ties in the order given: every
    engine and harness calls timed-out keys in this order.
    """
    due = [(t, k, item) for k, t, item in pending if t is not None and is_due(t, now_ms) and k not in with_rows]
    due.sort(key=lambda d: d[0])  # stable: ties keep the given order
    return [(k, item) for _, k, item in due]


def timer_for(timeout_ms: int, now_ms: int | None = None) -> int:
    """The transformWithState timer (epoch ms) that fires a pending timeout.

    transformWithState fires a timer when the clock reaches it, a GroupState timeout is due
    only once the clock is strictly past it (:func:`is_due`): hence ``timeout + 1``. A timeout
    that is already due (at or behind ``now_ms``, when given) gets the timer of the next batch,
    ``now + 1``.
    """
    if now_ms is not None and timeout_ms <= now_ms:
        return now_ms + 1
    return timeout_ms + 1


def initial_timeout(
    conf: GroupStateTimeout, timeout_ms: int | None, idle_timeout_ms: int | None, processing_time_ms: int
) -> int | None:
    """The pending timeout of a key loaded from initial state.

    Its ``timeout_ms`` column when given; else, with ``idle_timeout_ms`` (``map_with_state``'s
    ``StateSpec.timeout``: such keys are idle from the start), that long after the first batch's
    processing time; never a timeout in a query without timeouts.
    """
    if conf is GroupStateTimeout.NoTimeout:
        return None
    if timeout_ms is None and idle_timeout_ms is not None:
        return processing_time_ms + idle_timeout_ms
    return timeout_ms
