"""The tws engine's StatefulProcessor (PySpark's ``transformWithState``, Row API), run per key.

One value-state variable per key holds the state *and* its pending timeout (layout 2, see
:mod:`.layout`), so a key costs one ``get`` and (only when something changed) one ``update`` or
``clear``; timers are touched only when the timeout changes, and are never listed. Which timer
fires a timeout, and when a key is due, are :mod:`sparkstate.group_state`'s rules.

A row written under another state type is re-laid by field name when read, and the decoder
fills defaults.
"""

from __future__ import annotations

import pickle
from typing import Any, Iterator

from .type_tags import tag_fields, type_tag
from ..call_context import Calls, time_mode
from ..rules import Outcome, initial_timeout, is_due, run_call, timer_for
from ..state_fields import relay
from ..base import PICKLE_PROTOCOL, StatePlan
from ..row_values import row_fixer
from ..runtime import StatefulProcessor
from .layout import LEGACY_GUARD_SCHEMA, LEGACY_STATE_VARIABLE, STATE_ROW_SCHEMA, STATE_VARIABLE


class KeyProcessor(StatefulProcessor, Calls):
    """The StatefulProcessor shipped to the workers. Holds only the plan (picklable)."""

    def __init__(self, plan: StatePlan, input_schema: Any = None) -> None:
        self.plan = plan
        self.mode = time_mode(plan)
        self.input_schema = input_schema

    def init(self, handle: Any) -> None:
        plan = self.plan
        self.handle = handle
        ttl = plan.state_ttl_ms if (plan.state_ttl_ms is not None and self.mode == "ProcessingTime") else None
        self.vs = handle.getValueState(STATE_VARIABLE, STATE_ROW_SCHEMA, ttl)
        handle.getValueState(LEGACY_STATE_VARIABLE, LEGACY_GUARD_SCHEMA)  # never read or written
        self.tag = type_tag(plan.state_codec.columns)
        self._relay: dict[str, tuple] = {}
        self.timers = self.mode != "None"
        self.single_key = len(plan.key_columns) == 1
        self.start_task(plan)
        self.fix_row = row_fixer(self.input_schema) if self.input_schema is not None else None

    # -- helpers ------------------------------------------------------------------------------
    def _key(self, key: Any) -> Any:
        return key[0] if self.single_key else tuple(key)

    def _load(self) -> tuple[Any, bool, int | None]:
        stored = self.vs.get()
        if stored is None:
            return None, False, None
        tag, blob, timeout = stored
        if blob is None:
            return None, False, timeout
        cols = pickle.loads(blob)
        if tag != self.tag:
            idx = self._relay.get(tag)
            if idx is None:
                idx = self._relay[tag] = relay(tag_fields(tag), self.codec.fields)
            cols = tuple(None if i is None else cols[i] for i in idx)
        return self.codec.decode_columns(cols), True, timeout

    def _state(self, value: Any, exists: bool, tv: Any, timed_out: bool) -> Any:
        pt, wm = self.times(tv)
        return self.group_state(value, exists, pt, wm, timed_out)

    def _store(self, key: Any, exists: bool, value: Any, timeout_ms: int | None) -> None:
        blob = pickle.dumps(self.encode_state(key, value), PICKLE_PROTOCOL) if exists else None
        self.vs.update((self.tag, blob, timeout_ms))

    def _commit(self, key: Any, outcome: Outcome, old_timeout: int | None, fired: bool, now: int | None) -> list:
        if outcome.write:
            if outcome.delete:
                self.vs.clear()
            else:
                self._store(key, outcome.exists, outcome.value, outcome.timeout_ms)
            new = outcome.timeout_ms
            if self.timers and new != old_timeout:
                if old_timeout is not None and not fired:
                    self.handle.deleteTimer(timer_for(old_timeout))
                if new is not None:
                    self.handle.registerTimer(timer_for(new))
        elif fired and outcome.timeout_ms is not None:
            # The same, already due, timeout was set again in a timeout call: Spark deletes the
            # timer that just fired, so arm one for the next batch, where the key is due again.
            self.handle.registerTimer(timer_for(outcome.timeout_ms, now))
        return self.emit(key, outcome.outputs)

    def emit(self, key: Any, outputs: list) -> list:
        """A call's outputs as the operator yields them: encoded Rows (a pandas frame on 4.0, see
        :mod:`.pandas_processor`)."""
        return self.encode_outputs(key, outputs)

    # -- the transformWithState callbacks ----------------------------------------------------
    def handleInputRows(self, key: Any, rows: Iterator[Any], timerValues: Any) -> Iterator[Any]:
        k = self._key(key)
        value, exists, old_timeout = self._load()
        state = self._state(value, exists, timerValues, False)
        if self.fix_row is not None:
            rows = map(self.fix_row, rows)
        values = map(self.decode_value, rows) if self.decode_value is not None else rows
        outcome = run_call(
            self.plan.func, k, values, state, flat=self.plan.flat,
            old_timeout_ms=old_timeout, keep_expired_state=self.plan.keep_expired_state,
        )
        return iter(self._commit(k, outcome, old_timeout, False, None))

    def handleExpiredTimer(self, key: Any, timerValues: Any, expiredTimerInfo: Any) -> Iterator[Any]:
        value, exists, old_timeout = self._load()
        pt, wm = self.times(timerValues)
        now = self.now(pt, wm)
        if old_timeout is None or not is_due(old_timeout, now):
            return iter(())  # a stale timer (state removed by TTL, or timeout moved): nothing to do
        k = self._key(key)
        state = self._state(value, exists, timerValues, True)
        outcome = run_call(
            self.plan.func, k, iter(()), state, flat=self.plan.flat,
            old_timeout_ms=old_timeout, keep_expired_state=self.plan.keep_expired_state,
        )
        return iter(self._commit(k, outcome, old_timeout, True, now))

    def handleInitialState(self, key: Any, initialState: Any, timerValues: Any) -> None:
        n_keys = len(self.plan.key_columns)
        cols = tuple(initialState[n_keys: n_keys + self.n_state])
        value = self.codec.decode_columns(cols)
        stored = initialState[n_keys + self.n_state] if self.plan.initial_has_timeout else None
        timeout = initial_timeout(self.plan.timeout, stored, self.plan.initial_idle_timeout_ms,
                                  self.times(timerValues)[0])
        k = self._key(key)
        self._store(k, True, value, timeout)
        if self.timers and timeout is not None:
            self.handle.registerTimer(timer_for(timeout))

    def close(self) -> None:
        pass
