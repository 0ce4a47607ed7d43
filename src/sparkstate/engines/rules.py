"""The rules that decide what happens to a key's state after a call, and when a key times out:
the one place these semantics live. Both engines and the no-Spark harnesses
(:mod:`sparkstate.testing`) run a key through :func:`run_call` (or, in a lean loop, call the
function and :func:`settle`) and act on the :class:`Outcome` (``Outcome.delete``: the key's
stored row goes); they ask :func:`due_keys` which keys time out and in what order,
:func:`timer_for` which transformWithState timer fires a timeout, and :func:`initial_timeout`
what timeout a key loaded from initial state has; so they cannot drift apart. The handle itself
(:class:`~sparkstate.group_state.GroupState`) is the user's side.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Container, Iterable, Iterator

from ..errors import StateNotFoundError, TimeoutConfigError, UserFunctionError
from ..group_state import GroupFunc, GroupState, GroupStateTimeout, StateArgumentError


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
    return Outcome(outputs, verdict != KEEP, state.exists, state.getOption, state.timeout_ms, verdict == DELETE)


#: What :func:`settle` decides for a key's stored row after a call.
KEEP, WRITE, DELETE = 0, 1, 2


def settle(state: GroupState, old_timeout_ms: int | None, keep_expired_state: bool) -> int:
    """After a call: ``KEEP`` (the stored row stays as it is), ``WRITE`` (store ``state``'s value,
    existence and ``timeout_ms``) or ``DELETE`` (no state and no pending timeout left: the row goes).

    The timeout is whatever the call set; after a timeout call that neither updated the state nor
    set a new timeout, the state is removed unless ``keep_expired_state``. The engines' lean loops
    call this directly (no :class:`Outcome` per key); :func:`run_call` wraps it.
    """
    updated, removed, timeout_set = state.changes
    if state.hasTimedOut and not keep_expired_state and not updated and not timeout_set:
        if state.exists:
            state.remove()
            removed = True
    timeout_ms = state.timeout_ms
    if not (updated or removed or timeout_ms != old_timeout_ms):
        return KEEP
    return DELETE if not state.exists and timeout_ms is None else WRITE


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
