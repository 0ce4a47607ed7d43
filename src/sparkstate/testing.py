"""Unit-test a state function without Spark: :class:`GroupStateHarness`.

The harness keeps state in memory and moves time by hand, and it decides timeouts and expiry
with the same code as the Spark engines (:mod:`sparkstate.engines.rules`: ``run_call``, ``due_keys``,
``initial_timeout``). State goes
through the same codec as on Spark, so a value that cannot be stored fails here too, and
mutating a state object without calling ``update`` is lost here as it is on Spark.

>>> import sparkstate as ss
>>> def count(key, values, state):
...     if state.hasTimedOut:                    # no update, no new timeout: the state goes away
...         return (key, state.get, "expired")
...     n = (state.getOption or 0) + sum(1 for _ in values)
...     state.update(n)
...     state.setTimeoutDuration("1 minute")
...     return (key, n, "open")
>>> h = ss.testing.GroupStateHarness(count, state_type=int,
...                                  timeout=ss.GroupStateTimeout.ProcessingTimeTimeout)
>>> h.feed("u1", ["a", "b"])
[('u1', 2, 'open')]
>>> h.advance_processing_time("30 seconds")
[]
>>> h.advance_processing_time("31 seconds")
[('u1', 2, 'expired')]
>>> h.peek_state("u1") is None
True
>>> h.advance_processing_time(-1)
Traceback (most recent call last):
...
ValueError: processing time cannot move backwards: it is 61000 ms, asked for 60999 ms
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Container, Iterable, Mapping

from .durations import Duration, Instant, instant_ms, to_ms
from .errors import ConfigError, StateTypeError
from .engines.rules import due_keys, initial_timeout, run_call
from .group_state import NO_WATERMARK, GroupFunc, GroupState, GroupStateTimeout
from .types import Codec

__all__ = ["BatchStateHarness", "GroupStateHarness", "ManualClock"]


class ManualClock:
    """A clock that moves only when told to, and never backwards."""

    def __init__(self, start_ms: int = 0) -> None:
        self.now_ms = start_ms

    def set(self, ms: int, what: str = "processing time") -> None:
        if ms < self.now_ms:
            raise ValueError(f"{what} cannot move backwards: it is {self.now_ms} ms, asked for {ms} ms")
        self.now_ms = ms


@dataclass
class _Slot:
    encoded: Any
    exists: bool
    timeout_ms: int | None


class GroupStateHarness:
    """Run a ``map_groups_with_state`` function on in-memory state with a manual clock.

    Arguments are those of :func:`sparkstate.map_groups_with_state` that make sense without
    Spark. ``start_time_ms`` is the initial processing time; the watermark starts at 0 with
    ``EventTimeTimeout``, as in Spark's first batch.
    """

    def __init__(
        self,
        func: GroupFunc,
        state_type: Any = None,
        timeout: GroupStateTimeout | str = GroupStateTimeout.NoTimeout,
        keep_expired_state: bool = False,
        flat: bool = False,
        *,
        start_time_ms: int = 0,
    ) -> None:
        if not callable(func):
            raise ConfigError(
                f"GroupStateHarness: expected a function (key, values, state) -> output, got {func!r}"
            )
        self.func = func
        self.timeout = GroupStateTimeout.parse(timeout)
        self.keep_expired_state = keep_expired_state
        self.flat = flat
        self._codec = Codec.of(state_type) if state_type is not None else None
        self._clock = ManualClock(start_time_ms)
        self._event_time = self.timeout is GroupStateTimeout.EventTimeTimeout
        self._watermark = ManualClock(0)
        self._slots: dict[Any, _Slot] = {}

    # -- time ---------------------------------------------------------------------------------
    @property
    def processing_time_ms(self) -> int:
        return self._clock.now_ms

    @property
    def watermark_ms(self) -> int:
        return self._watermark.now_ms if self._event_time else NO_WATERMARK

    def advance_processing_time(self, duration: Duration) -> list:
        """Move processing time forward by ``duration``; return the outputs of timeouts that fired."""
        ms = to_ms(duration, "advance_processing_time")
        self._clock.set(self._clock.now_ms + ms)
        if self.timeout is GroupStateTimeout.ProcessingTimeTimeout:
            return self._fire(self._clock.now_ms)
        return []

    def advance_watermark(self, watermark: Instant) -> list:
        """Set the event-time watermark (epoch ms or datetime); return the outputs of timeouts that fired."""
        self._watermark.set(instant_ms(watermark, "advance_watermark"), "the watermark")
        if self._event_time:
            return self._fire(self._watermark.now_ms)
        return []

    # -- data ---------------------------------------------------------------------------------
    def feed(self, key: Any, values: Iterable[Any]) -> list:
        """Call the function for ``key`` with new ``values``; return what it output."""
        return self._call(key, iter(list(values)), timed_out=False)

    def run_batch(
        self,
        data: Mapping[Any, Iterable[Any]],
        *,
        processing_time: Instant | None = None,
        watermark: Instant | None = None,
    ) -> list:
        """Run one micro-batch as Spark does; return its outputs.

        The clocks move first (to the batch's processing time and watermark, if given), then
        every key in ``data`` is called with its values, then every other key whose timeout
        has passed gets its timeout call. A key with data in the batch does not time out in it.
        """
        if processing_time is not None:
            self._clock.set(instant_ms(processing_time, "processing_time"))
        if watermark is not None:
            self._watermark.set(instant_ms(watermark, "watermark"), "the watermark")
        outputs: list = []
        for key, values in data.items():
            outputs.extend(self.feed(key, values))
        now = self._watermark.now_ms if self._event_time else self._clock.now_ms
        if self.timeout is not GroupStateTimeout.NoTimeout:
            outputs.extend(self._fire(now, skip=set(data)))
        return outputs

    def set_state(self, key: Any, value: Any, timeout_ms: int | None = None) -> None:
        """Seed the state of a key, as ``initial_state`` does on Spark (a query without timeouts
        keeps no ``timeout_ms``)."""
        self._slots[key] = _Slot(self._encode(value), True,
                                 initial_timeout(self.timeout, timeout_ms, None, self._clock.now_ms))

    def peek_state(self, key: Any) -> Any:
        """The state of ``key``, or ``None``."""
        slot = self._slots.get(key)
        return self._decode(slot.encoded) if slot and slot.exists else None

    def peek_timeout_ms(self, key: Any) -> int | None:
        """The pending timeout of ``key`` (epoch ms), or ``None``."""
        slot = self._slots.get(key)
        return slot.timeout_ms if slot else None

    def keys(self) -> list:
        """Keys that have state or a pending timeout."""
        return list(self._slots)

    # -- internals ----------------------------------------------------------------------------
    def _encode(self, value: Any) -> Any:
        return self._codec.encode(value) if self._codec else value

    def _decode(self, encoded: Any) -> Any:
        return self._codec.decode(encoded) if self._codec else encoded

    def _fire(self, now_ms: int, skip: Container[Any] = ()) -> list:
        due = due_keys(((k, s.timeout_ms, None) for k, s in self._slots.items()), now_ms, skip)
        outputs: list = []
        for key, _ in due:
            outputs.extend(self._call(key, iter(()), timed_out=True))
        return outputs

    def _call(self, key: Any, values: Any, timed_out: bool) -> list:
        slot = self._slots.get(key)
        state = GroupState(
            self.timeout,
            value=self._decode(slot.encoded) if slot and slot.exists else None,
            exists=bool(slot and slot.exists),
            has_timed_out=timed_out,
            batch_time_ms=self._clock.now_ms,
            watermark_ms=self.watermark_ms,
            has_watermark=self._event_time,
        )
        outcome = run_call(
            self.func, key, values, state, flat=self.flat,
            old_timeout_ms=slot.timeout_ms if slot else None,
            keep_expired_state=self.keep_expired_state,
        )
        if outcome.write:
            if outcome.delete:
                self._slots.pop(key, None)
            else:
                try:
                    encoded = self._encode(outcome.value) if outcome.exists else None
                except StateTypeError as exc:
                    raise StateTypeError(
                        f"GroupStateHarness: the state of key {key!r} cannot be stored: {exc}"
                    ) from None
                self._slots[key] = _Slot(encoded, outcome.exists, outcome.timeout_ms)
        return outcome.outputs


class BatchStateHarness:
    """Run a ``map_batches_with_state`` function on in-memory state with a manual clock.

    Each :meth:`run_batch` is one call of the function, as one bucket of the engine would make
    it: ``batch.rows`` holds the rows given (a key's rows together, in the order given),
    ``batch.state`` the keys with rows, then the other keys whose timeout is due. The rules that
    build ``batch.state`` and apply the returned :class:`~sparkstate.StateUpdate` are the
    engine's own (:class:`sparkstate.engines.batch_rules.BatchRules`). ``output_type`` (a dataclass or
    ``StructType``), when given, checks the outputs as the engine does.

    >>> import pandas as pd, sparkstate as ss
    >>> from dataclasses import dataclass
    >>> @dataclass
    ... class WordCount:
    ...     word: str
    ...     value: int
    >>> def count(batch):
    ...     n = batch.rows.groupby("word").size().rename("n").reset_index()
    ...     s = batch.state.merge(n, on="word", how="left")
    ...     s["value"] = s["value"].fillna(0) + s["n"].fillna(0)
    ...     s["timeout_ms"] = batch.processing_time_ms + 60_000
    ...     live = s[~s["timed_out"]]
    ...     return ss.StateUpdate(state=live[["word", "value", "timeout_ms"]], output=s[["word", "value"]])
    >>> h = ss.testing.BatchStateHarness(count, key="word", state_type=int, output_type=WordCount,
    ...                                  timeout=ss.GroupStateTimeout.ProcessingTimeTimeout)
    >>> h.run_batch(pd.DataFrame({"word": ["a", "b", "a"]})).values.tolist()
    [['a', 2], ['b', 1]]
    >>> h.advance_processing_time("61 seconds").values.tolist()   # both timed out: removed
    [['a', 2], ['b', 1]]
    >>> h.keys()
    []
    """

    def __init__(
        self,
        func: Any,
        key: str | list[str],
        state_type: Any,
        timeout: GroupStateTimeout | str = GroupStateTimeout.NoTimeout,
        output_type: Any = None,
        *,
        start_time_ms: int = 0,
    ) -> None:
        from .types import parse_schema

        if not callable(func):
            raise ConfigError(f"BatchStateHarness: expected a function (batch) -> ss.StateUpdate, got {func!r}")
        self.func = func
        self.key_columns = (key,) if isinstance(key, str) else tuple(key)
        self.timeout = GroupStateTimeout.parse(timeout)
        self._codec = Codec.of(state_type)
        self._output = None if output_type is None else parse_schema(output_type, "output_type")
        self._clock = ManualClock(start_time_ms)
        self._event_time = self.timeout is GroupStateTimeout.EventTimeTimeout
        self._watermark = ManualClock(0)
        self._entries: dict[Any, list] = {}  # key -> [state columns or None, timeout_ms]
        self._rules: Any = None
        self._no_rows: Any = None

    # -- time ---------------------------------------------------------------------------------
    def advance_processing_time(self, duration: Duration) -> Any:
        """Move processing time forward; run the call of the keys whose timeout is due (if any)."""
        self._clock.set(self._clock.now_ms + to_ms(duration, "advance_processing_time"))
        return self.run_batch(None)

    def advance_watermark(self, watermark: Instant) -> Any:
        """Set the watermark (epoch ms or datetime); run the call of the keys whose timeout is due."""
        self._watermark.set(instant_ms(watermark, "advance_watermark"), "the watermark")
        return self.run_batch(None)

    # -- data ---------------------------------------------------------------------------------
    def run_batch(self, rows: Any, *, processing_time: Instant | None = None, watermark: Instant | None = None) -> Any:
        """One micro-batch: move the clocks (if given), call the function once with ``rows`` (a
        pandas DataFrame, a list of dicts, or None) and the due keys; return its output frame
        (empty when it output nothing or was not called)."""
        import numpy as np
        import pandas as pd

        if processing_time is not None:
            self._clock.set(instant_ms(processing_time, "processing_time"))
        if watermark is not None:
            self._watermark.set(instant_ms(watermark, "watermark"), "the watermark")
        frame = None if rows is None else (rows if isinstance(rows, pd.DataFrame) else pd.DataFrame(rows))
        keys: list = []
        key_index = np.zeros(0, np.int64)
        if frame is not None and len(frame):
            frame, keys, key_index = self._grouped(frame)
            self._no_rows = frame.iloc[:0]
        n_input = len(keys)
        if self.timeout is not GroupStateTimeout.NoTimeout:
            now = self._watermark.now_ms if self._event_time else self._clock.now_ms
            keys += [k for k, _ in due_keys(((k, e[1], None) for k, e in self._entries.items()), now, set(keys))]
        empty = pd.DataFrame(columns=list(self._output.names) if self._output is not None else [])
        if not keys:
            return empty
        rules = self._rules_for(frame, keys[0])
        if frame is None or not len(frame):  # the columns (and dtypes) of the rows seen last
            frame = self._no_rows if self._no_rows is not None else pd.DataFrame(columns=list(self.key_columns))
        wm = self._watermark.now_ms if self._event_time else NO_WATERMARK
        from .engines.batch_rules import NO_ENTRY

        output, writes = rules.call(frame, keys, [self._entries.get(k, NO_ENTRY) for k in keys], n_input,
                                    self._clock.now_ms, wm, self._event_time, key_index)
        for k, w in writes.items():
            if w is None:
                self._entries.pop(k, None)
            else:
                self._entries[k] = [w[0], w[1]]
        if output is None:
            return empty
        if self._output is not None:  # typed as Spark would type it
            import pyarrow as pa

            arrays = [pa.Array.from_pandas(output[c], type=t) for c, t in zip(rules.output_names, rules.output_arrow)]
            return pa.table(arrays, names=rules.output_names).to_pandas()
        return output.reset_index(drop=True)

    def set_state(self, key: Any, value: Any, timeout_ms: int | None = None) -> None:
        """Seed the state of a key, as ``initial_state`` does on Spark."""
        try:
            cols = self._codec.encode_columns(value)
        except StateTypeError as exc:
            raise StateTypeError(f"BatchStateHarness: the state of key {key!r} cannot be stored: {exc}") from None
        self._entries[key] = [cols, initial_timeout(self.timeout, timeout_ms, None, self._clock.now_ms)]

    def peek_state(self, key: Any) -> Any:
        """The state of ``key`` (decoded to ``state_type``), or ``None``."""
        e = self._entries.get(key)
        return None if e is None or e[0] is None else self._codec.decode_columns(e[0])

    def peek_timeout_ms(self, key: Any) -> int | None:
        """The pending timeout of ``key`` (epoch ms), or ``None``."""
        e = self._entries.get(key)
        return None if e is None else e[1]

    def keys(self) -> list:
        """Keys that have state or a pending timeout."""
        return list(self._entries)

    # -- internals ----------------------------------------------------------------------------
    def _rules_for(self, frame: Any, some_key: Any) -> Any:
        if self._rules is None:
            import pyarrow as pa
            from pyspark.sql.pandas.types import from_arrow_type

            from .engines.batch_rules import BatchRules

            if frame is not None:
                types = [pa.Array.from_pandas(frame[c]).type for c in self.key_columns]
            else:
                parts = (some_key,) if len(self.key_columns) == 1 else tuple(some_key)
                types = [pa.array([v]).type for v in parts]
            self._rules = BatchRules("BatchStateHarness", self.func, self.key_columns,
                                     [from_arrow_type(t) for t in types], self._codec, self.timeout, self._output)
        return self._rules

    def _grouped(self, frame: Any) -> tuple[Any, list, Any]:
        """The rows with each key's rows together (first seen first, order kept), the keys, and
        each row's key position."""
        import numpy as np

        missing = [c for c in self.key_columns if c not in frame.columns]
        if missing:
            raise ConfigError(f"BatchStateHarness: the rows lack the key column(s) {', '.join(missing)}")
        rules = self._rules_for(frame, None)
        row_keys = rules._keys_of(frame, "rows")
        ids: dict = {}
        gid = np.fromiter((ids.setdefault(k, len(ids)) for k in row_keys), np.int64, len(row_keys))
        order = np.argsort(gid, kind="stable")
        return frame.iloc[order].reset_index(drop=True), list(ids), gid[order]
